"""A selective state-space mixer in its simple-GLA form (Mamba-2's scalar-decay SSM): the references.

Per head, with a data-dependent scalar log-decay ``g_t <= 0``:

    S_t = exp(g_t) S_{t-1} + k_t v_t^T            [Dk, Dv], a dense update of the whole state
    o_t = scale * q_t^T S_t

``simple_gla_recurrent`` is the token-by-token oracle; ``simple_gla_chunked`` the chunked form (within a
chunk, the decays between positions come from the cumulative sum of g). Both are tested against
flash-linear-attention's ``naive_recurrent_simple_gla`` / ``naive_chunk_simple_gla``.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from ovq_cl.ops.common import check_qkv, check_state_shape, compute_dtype
from ovq_cl.state import MixerState


@dataclasses.dataclass
class SSMState(MixerState):
    """S: [B, H, Dk, Dv]; seen: tokens absorbed."""

    S: torch.Tensor
    seen: int = 0


def _prepare(q, k, v, g, initial_state, op):
    check_qkv(q, k, v, op)
    bsz, T, heads, dk = q.shape
    if g.shape != (bsz, T, heads):
        raise ValueError(f"{op}: g must be [B, T, H] = {(bsz, T, heads)}, got {tuple(g.shape)}")
    dtype = compute_dtype(q.dtype)
    if initial_state is None:
        S = q.new_zeros(bsz, heads, dk, v.shape[-1], dtype=dtype)
        seen = 0
    else:
        check_state_shape("S", initial_state.S, (bsz, heads, dk, v.shape[-1]), op)
        S, seen = initial_state.S.detach().to(dtype), initial_state.seen
    return S, seen, *(t.to(dtype).transpose(1, 2) for t in (q, k, v)), g.to(dtype).transpose(1, 2)


def simple_gla_recurrent(q, k, v, g, scale: Optional[float] = None, initial_state: Optional[SSMState] = None,
                         output_final_state: bool = True) -> Tuple[torch.Tensor, Optional[SSMState]]:
    """q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; g: [B, T, H] log-decays. Returns o [B, T, H, Dv], state."""
    S, seen, qh, kh, vh, gh = _prepare(q, k, v, g, initial_state, "simple_gla")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    outputs = []
    for t in range(qh.shape[2]):
        S = gh[:, :, t, None, None].exp() * S + kh[:, :, t, :, None] * vh[:, :, t, None, :]
        outputs.append(scale * torch.einsum("bhd,bhde->bhe", qh[:, :, t], S))
    o = torch.stack(outputs, 2).transpose(1, 2).to(q.dtype)
    return o, (SSMState(S, seen + q.shape[1]) if output_final_state else None)


def simple_gla_chunked(q, k, v, g, scale: Optional[float] = None, initial_state: Optional[SSMState] = None,
                       output_final_state: bool = True, chunk_size: int = 64) -> Tuple[torch.Tensor, Optional[SSMState]]:
    """The same, a chunk of L tokens at a time: intra-chunk attention with decays exp(G_i - G_j) (G the
    cumulative log-decay, j <= i), plus the carried state read with exp(G_i)."""
    if chunk_size < 1:
        raise ValueError(f"simple_gla: chunk_size must be >= 1, got {chunk_size}")
    S, seen, qh, kh, vh, gh = _prepare(q, k, v, g, initial_state, "simple_gla")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    outputs = []
    for qc, kc, vc, gc in zip(qh.split(chunk_size, 2), kh.split(chunk_size, 2), vh.split(chunk_size, 2),
                              gh.split(chunk_size, 2)):
        G = gc.cumsum(-1)                                                    # [B, H, L]
        L = G.shape[-1]
        causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        decay = torch.where(causal, (G[..., :, None] - G[..., None, :]).masked_fill(~causal, 0.0).exp(), 0.0)
        attn = (qc @ kc.transpose(-1, -2)) * decay
        outputs.append(scale * (attn @ vc + (qc * G[..., None].exp()) @ S))
        S = G[..., -1, None, None].exp() * S + (kc * (G[..., -1:] - G).exp()[..., None]).transpose(-1, -2) @ vc
    o = torch.cat(outputs, 2).transpose(1, 2).to(q.dtype)
    return o, (SSMState(S, seen + q.shape[1]) if output_final_state else None)
