"""Rotary position embedding with a position offset (tokens already seen by the state)."""
from __future__ import annotations

import torch


def apply_rotary(x: torch.Tensor, offset: int, base: float = 10000.0) -> torch.Tensor:
    """x: [B, T, H, D] (D even) -> same shape, rotated by positions offset .. offset + T - 1."""
    T, D = x.shape[1], x.shape[-1]
    if D % 2:
        raise ValueError(f"rotary embedding needs an even head_dim, got {D}")
    inv_freq = base ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    pos = torch.arange(offset, offset + T, device=x.device, dtype=torch.float32)
    angles = torch.outer(pos, inv_freq)                                  # [T, D/2]
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
    return out.to(x.dtype)
