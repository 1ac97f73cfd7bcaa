"""Causal linear attention (Katharopoulos et al. 2020): what the chunked form (``chunk.py``) and the
recurrent oracle (``naive.py``) share: the feature maps, the state, the inputs prepared.

``S_t = S_{t-1} + phi(k_t) v_t^T``, ``z_t = z_{t-1} + phi(k_t)``,
``o_t = phi(q_t) S_t / (phi(q_t) . z_t + eps)`` (the denominator only when ``normalize``).
Every token writes the whole [F, Dv] state: the dense update that OVQ is compared against. F is the
feature dimension: Dk for the elementwise maps, 1 + Dk + Dk^2 for Based's Taylor map.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict

import torch
import torch.nn.functional as F

from ovq_cl.ops.common import check_qkv, check_state_shape, compute_dtype
from ovq_cl.state import MixerState


def taylor_feature_map(x: torch.Tensor) -> torch.Tensor:
    """Based's second-order Taylor map (Arora et al. 2024), x [..., d] -> [..., 1 + d + d (d + 1) / 2]:
    ``phi(q) . phi(k) = 1 + s + s^2 / 2`` with ``s = q . k / sqrt(d)``: the Taylor expansion of exp(s).

    Written in the paper as ``(1, x / d^(1/4), vec(x x^T) / sqrt(2 d))``; the outer product is symmetric,
    so (as fla's TaylorFeatureMap does) only its d (d + 1) / 2 distinct terms are kept: the squares
    x_i^2 / sqrt(2 d) and the products x_i x_j / sqrt(d) for i < j (each stands for two equal terms).
    Same inner products, half the state: what a matched state budget must count."""
    d = x.shape[-1]
    rows, cols = torch.triu_indices(d, d, device=x.device)
    outer = x[..., rows] * x[..., cols]                                     # [..., d (d + 1) / 2]
    weight = torch.full(rows.shape, d ** -0.5, dtype=x.dtype, device=x.device)
    weight[rows == cols] = (2 * d) ** -0.5
    return torch.cat([torch.ones_like(x[..., :1]), x * d ** -0.25, outer * weight], dim=-1)


FEATURE_MAPS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "elu1": lambda x: F.elu(x) + 1.0,
    "relu": F.relu,
    "identity": lambda x: x,
    "taylor": taylor_feature_map,
}


@dataclasses.dataclass
class LinearAttentionState(MixerState):
    """S: [B, H, F, Dv] sum of phi(k) v^T; z: [B, H, F] sum of phi(k) (F = feature_dim(map, Dk));
    seen: tokens absorbed."""

    S: torch.Tensor
    z: torch.Tensor
    seen: int = 0


def feature_map_names():
    return sorted(FEATURE_MAPS)


def feature_dim(name: str, d: int) -> int:
    """Width F of phi(x) for x of width d: d, or 1 + d + d (d + 1) / 2 for "taylor"."""
    feature_map(name)
    return 1 + d + d * (d + 1) // 2 if name == "taylor" else d


def feature_map(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in FEATURE_MAPS:
        raise ValueError(f"linear attention: feature_map must be one of {sorted(FEATURE_MAPS)}, got {name!r}")
    return FEATURE_MAPS[name]


def prepare(q, k, v, initial_state, fmap, scale):
    check_qkv(q, k, v, "linear_attention")
    bsz, _, heads, dk = q.shape
    dv = v.shape[-1]
    dtype = compute_dtype(q.dtype)
    phi = feature_map(fmap)
    fdim = feature_dim(fmap, dk)                                             # the state's rows
    if initial_state is None:
        state = LinearAttentionState(
            S=q.new_zeros(bsz, heads, fdim, dv, dtype=dtype), z=q.new_zeros(bsz, heads, fdim, dtype=dtype)
        )
    else:
        check_state_shape("S", initial_state.S, (bsz, heads, fdim, dv), "linear_attention")
        check_state_shape("z", initial_state.z, (bsz, heads, fdim), "linear_attention")
        state = initial_state.detach().to(dtype=dtype)
    fq = phi(q.to(dtype) * scale).transpose(1, 2)
    fk = phi(k.to(dtype)).transpose(1, 2)
    return state, fq, fk, v.to(dtype).transpose(1, 2)
