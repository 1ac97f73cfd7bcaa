"""Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024), the oracle: token by token, as written. Per head,
with S [Dk, Dv], a_t = exp(g_t) in (0, 1] and b_t in [0, 1]:

    S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,      o_t = scale * S_t^T q_t

The update is dense: every token rewrites the whole [Dk, Dv] state. The chunked form is ``chunk.py``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ovq_cl.ops.common import check_qkv, compute_dtype


def check_inputs(q, k, v, g, beta, initial_state, op):
    check_qkv(q, k, v, op)
    B, T, H, Dk = q.shape
    for name, t in (("g", g), ("beta", beta)):
        if tuple(t.shape) != (B, T, H):
            raise ValueError(f"{op}: {name} must be [B, T, H] = {(B, T, H)}, got {tuple(t.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (B, H, Dk, v.shape[-1]):
        raise ValueError(
            f"{op}: initial_state must be [B, H, Dk, Dv] = {(B, H, Dk, v.shape[-1])}, got {tuple(initial_state.shape)}"
        )


def gated_delta_rule_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = True, chunk_size: int = 64,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Token-by-token recurrence; same signature as the chunked form (chunk_size unused)."""
    check_inputs(q, k, v, g, beta, initial_state, "gated_delta_rule")
    dtype = compute_dtype(q.dtype)
    B, T, H, Dk = q.shape
    scale = Dk ** -0.5 if scale is None else scale
    S = q.new_zeros(B, H, Dk, v.shape[-1], dtype=dtype) if initial_state is None else initial_state.to(dtype)
    outputs = []
    for t in range(T):
        qt, kt, vt = q[:, t].to(dtype), k[:, t].to(dtype), v[:, t].to(dtype)   # [B, H, D]
        a, b = g[:, t].to(dtype).exp()[..., None, None], beta[:, t].to(dtype)[..., None]
        S = a * S
        u = b * (vt - torch.einsum("bhkv,bhk->bhv", S, kt))
        S = S + kt.unsqueeze(-1) * u.unsqueeze(-2)
        outputs.append(scale * torch.einsum("bhkv,bhk->bhv", S, qt))
    o = torch.stack(outputs, dim=1).to(q.dtype)
    return o, (S if output_final_state else None)
