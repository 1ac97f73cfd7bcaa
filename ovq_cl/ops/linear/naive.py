"""Causal linear attention, the oracle: token by token, ``S_t = S_{t-1} + phi(k_t) v_t^T``,
``o_t = phi(q_t) S_t / (phi(q_t) . z_t + eps)`` as written (``common.py`` for the feature maps)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ovq_cl.ops.linear.common import LinearAttentionState, prepare


def linear_attention_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map_name: str = "elu1",
    normalize: bool = True, scale: float = 1.0, chunk_size: int = 64, eps: float = 1e-6,
    initial_state: Optional[LinearAttentionState] = None, output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[LinearAttentionState]]:
    """Token-by-token recurrence, same signature as the chunked form (chunk_size is unused)."""
    state, fq, fk, vt = prepare(q, k, v, initial_state, feature_map_name, scale)
    S, z = state.S, state.z
    outputs = []
    for t in range(fq.shape[2]):
        kt, vt_, qt = fk[:, :, t], vt[:, :, t], fq[:, :, t]
        S = S + kt.unsqueeze(-1) * vt_.unsqueeze(-2)
        z = z + kt
        o = torch.einsum("bhd,bhde->bhe", qt, S)
        if normalize:
            o = o / ((qt * z).sum(-1, keepdim=True) + eps)
        outputs.append(o)
    o = torch.stack(outputs, dim=2).transpose(1, 2).to(q.dtype)
    final = LinearAttentionState(S=S, z=z, seen=state.seen + fq.shape[2])
    return o, (final if output_final_state else None)
