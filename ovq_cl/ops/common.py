"""Helpers shared by the ops: input checks (shapes and config only, never a device sync)."""
from __future__ import annotations

from typing import Optional

import torch


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, op: str) -> None:
    """Raises ValueError unless q, k are [B, T, H, Dk] and v is [B, T, H, Dv]."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} must be [B, T, H, D] (rank 4), got shape {tuple(t.shape)}")
    if q.shape != k.shape:
        raise ValueError(f"{op}: q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"{op}: v must share [B, T, H] with q, got v {tuple(v.shape)} and q {tuple(q.shape)}"
        )


def check_head_vector(x: torch.Tensor, n_heads: int, name: str, op: str) -> None:
    if x.dim() != 1 or x.shape[0] != n_heads:
        raise ValueError(f"{op}: {name} must be a vector of one value per head, [H] = [{n_heads}], got {tuple(x.shape)}")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """States are kept and accumulated in at least float32."""
    return torch.promote_types(dtype, torch.float32)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def check_state_shape(name: str, t: Optional[torch.Tensor], expected: tuple, op: str) -> None:
    if t is None:
        raise ValueError(f"{op}: initial_state.{name} is missing")
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{op}: initial_state.{name} has shape {tuple(t.shape)}, expected {tuple(expected)}")
