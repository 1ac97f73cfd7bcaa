"""Causal linear attention, chunked (PyTorch): the fast form, equal to the recurrent oracle
(``naive.py``) in tests (outputs, gradients, final state)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ovq_cl.ops.linear.common import LinearAttentionState, prepare


def linear_attention_chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map_name: str = "elu1",
    normalize: bool = True, scale: float = 1.0, chunk_size: int = 64, eps: float = 1e-6,
    initial_state: Optional[LinearAttentionState] = None, output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[LinearAttentionState]]:
    """q, k: [B, T, H, Dk]; v: [B, T, H, Dv]. Returns o [B, T, H, Dv] and the final state
    (S [B, H, F, Dv], z [B, H, F], F = feature_dim(feature_map_name, Dk))."""
    if chunk_size < 1:
        raise ValueError(f"linear_attention: chunk_size must be >= 1, got {chunk_size}")
    state, fq, fk, vt = prepare(q, k, v, initial_state, feature_map_name, scale)
    S, z = state.S, state.z
    outputs = []
    # split once: slicing per chunk would make the backward O(T^2 / chunk) (one full-size grad per slice)
    for qc, kc, vc in zip(fq.split(chunk_size, 2), fk.split(chunk_size, 2), vt.split(chunk_size, 2)):
        a = (qc @ kc.transpose(-1, -2)).tril()
        num = a @ vc + qc @ S
        if normalize:
            den = a.sum(-1, keepdim=True) + (qc * z.unsqueeze(2)).sum(-1, keepdim=True)
            num = num / (den + eps)
        outputs.append(num)
        S = S + kc.transpose(-1, -2) @ vc
        z = z + kc.sum(2)
    o = torch.cat(outputs, dim=2).transpose(1, 2).to(q.dtype)
    final = LinearAttentionState(S=S, z=z, seen=state.seen + fq.shape[2])
    return o, (final if output_final_state else None)
