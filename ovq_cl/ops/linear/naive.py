"""Causal linear attention (Katharopoulos et al. 2020), PyTorch reference: chunked and recurrent.

``S_t = S_{t-1} + phi(k_t) v_t^T``, ``z_t = z_{t-1} + phi(k_t)``,
``o_t = phi(q_t) S_t / (phi(q_t) . z_t + eps)`` (the denominator only when ``normalize``).
Every token writes the whole [Dk, Dv] state: the dense update that OVQ is compared against.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ovq_cl.ops.common import check_qkv, check_state_shape, compute_dtype
from ovq_cl.state import MixerState

FEATURE_MAPS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "elu1": lambda x: F.elu(x) + 1.0,
    "relu": F.relu,
    "identity": lambda x: x,
}


@dataclasses.dataclass
class LinearAttentionState(MixerState):
    """S: [B, H, Dk, Dv] sum of phi(k) v^T; z: [B, H, Dk] sum of phi(k); seen: tokens absorbed."""

    S: torch.Tensor
    z: torch.Tensor
    seen: int = 0


def feature_map_names():
    return sorted(FEATURE_MAPS)


def feature_map(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in FEATURE_MAPS:
        raise ValueError(f"linear attention: feature_map must be one of {sorted(FEATURE_MAPS)}, got {name!r}")
    return FEATURE_MAPS[name]


def _prepare(q, k, v, initial_state, fmap, scale):
    check_qkv(q, k, v, "linear_attention")
    bsz, _, heads, dk = q.shape
    dv = v.shape[-1]
    dtype = compute_dtype(q.dtype)
    phi = feature_map(fmap)
    if initial_state is None:
        state = LinearAttentionState(
            S=q.new_zeros(bsz, heads, dk, dv, dtype=dtype), z=q.new_zeros(bsz, heads, dk, dtype=dtype)
        )
    else:
        check_state_shape("S", initial_state.S, (bsz, heads, dk, dv), "linear_attention")
        check_state_shape("z", initial_state.z, (bsz, heads, dk), "linear_attention")
        state = initial_state.detach().to(dtype=dtype)
    fq = phi(q.to(dtype) * scale).transpose(1, 2)
    fk = phi(k.to(dtype)).transpose(1, 2)
    return state, fq, fk, v.to(dtype).transpose(1, 2)


def linear_attention_chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map_name: str = "elu1",
    normalize: bool = True, scale: float = 1.0, chunk_size: int = 64, eps: float = 1e-6,
    initial_state: Optional[LinearAttentionState] = None, output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[LinearAttentionState]]:
    """q, k: [B, T, H, Dk]; v: [B, T, H, Dv]. Returns o [B, T, H, Dv] and the final state."""
    if chunk_size < 1:
        raise ValueError(f"linear_attention: chunk_size must be >= 1, got {chunk_size}")
    state, fq, fk, vt = _prepare(q, k, v, initial_state, feature_map_name, scale)
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


def linear_attention_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map_name: str = "elu1",
    normalize: bool = True, scale: float = 1.0, chunk_size: int = 64, eps: float = 1e-6,
    initial_state: Optional[LinearAttentionState] = None, output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[LinearAttentionState]]:
    """Token-by-token recurrence, same signature as the chunked form (chunk_size is unused)."""
    state, fq, fk, vt = _prepare(q, k, v, initial_state, feature_map_name, scale)
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
