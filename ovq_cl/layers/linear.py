"""Causal linear attention layer (chunked form), state = the [F, Dv] matrix and its normaliser (F the
feature dimension), plus the short convolution's cache when ``short_conv`` is on."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch
from torch import nn

from ovq_cl.layers.base import Mixer, MixerOptions, elem_size
from ovq_cl.layers.conv import ShortConv, cache_numel, check_layer_choices, norm_and_gate, short_conv_qkv
from ovq_cl.ops.linear import LinearAttentionState, feature_dim, feature_map_names, linear_attention_chunked


@dataclasses.dataclass
class LinearMixerState(LinearAttentionState):
    """The op's state (S [B, H, F, Dv], z [B, H, F], seen) and conv: [B, K-1, 3 H Dk], the short
    convolution's cache of the last K-1 q, k, v projections (None when ``short_conv`` = 0)."""

    conv: Optional[torch.Tensor] = None


@dataclasses.dataclass(frozen=True)
class LinearAttentionOptions(MixerOptions):
    """feature_map: "elu1", "relu", "identity" or "taylor" (Based's 1 + s + s^2/2 kernel, s = q.k/sqrt(d);
    feature dimension 1 + d + d (d + 1) / 2, so the state is about (d + 3) / 2 times larger at the same head_dim);
    normalize: divide by the feature-map normaliser; chunk_size: tokens per chunk of the chunked form;
    short_conv: kernel size of a causal depthwise conv + SiLU on q, k, v (fla's layers use 4; 0 = off);
    output_norm: per-head RMSNorm of the output before o_proj (Based and fla's linear attention
    layer have one)."""

    # defaults from experiments/studies/baseline_choices/search.py (associative recall, head dim 16, 3 seeds,
    # 300 steps): taylor + output_norm 0.999, taylor 0.978, elu1 0.135, elu1 + output_norm 0.217
    feature_map: str = "taylor"          # "taylor" has Based's 1/sqrt(d) built in: keep query_scale "none" with it
    normalize: bool = True
    chunk_size: int = 64
    query_scale: str = "none"            # none: phi(q) (a scale would cancel when normalised); inside: phi(q / sqrt(d))
    short_conv: int = 0                  # 0: no convolution and no convolution cache in the state
    output_norm: bool = True

    def __post_init__(self) -> None:
        if self.query_scale not in ("inside", "none"):
            raise ValueError(f"LinearAttention: query_scale must be 'inside' or 'none', got {self.query_scale!r}")
        if self.feature_map not in feature_map_names():
            raise ValueError(f"LinearAttention: feature_map must be one of {feature_map_names()}, got {self.feature_map!r}")
        if self.chunk_size < 1:
            raise ValueError(f"LinearAttention: chunk_size must be >= 1, got {self.chunk_size}")
        check_layer_choices("LinearAttention", self.short_conv, self.output_norm)


class LinearAttention(Mixer):
    """Linear attention with a configurable feature map ("elu1", "relu", "identity", "taylor"); with
    ``short_conv`` and ``output_norm`` it is fla's LinearAttention / Based layer (minus Based's
    separate, narrower q/k width: here q, k and v share ``head_dim``)."""

    budget_knob = "head_dim"
    state_type = LinearMixerState
    Options = LinearAttentionOptions

    def __init__(self, d_model: int, n_heads: int, options: Optional[LinearAttentionOptions] = None, **overrides) -> None:
        super().__init__(d_model, n_heads, options, **overrides)
        self.add_qkvo_projections()
        o = self.options
        self.feature_map, self.normalize, self.chunk_size = o.feature_map, o.normalize, o.chunk_size
        # created after the projections, so that the default layer draws the same random weights as before
        self.o_norm = nn.RMSNorm(self.head_dim) if o.output_norm else None
        self.conv = ShortConv(3 * n_heads * self.head_dim, o.short_conv) if o.short_conv else None

    def forward(self, x: torch.Tensor, state: Optional[LinearMixerState] = None) -> Tuple[torch.Tensor, LinearMixerState]:
        """x: [B, T, d_model] -> y [B, T, d_model], state."""
        self.check_input(x, state)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k, v, cache = short_conv_qkv(self.conv, q, k, v, state, type(self).__name__)
        o, op_state = linear_attention_chunked(
            q, k, v, feature_map_name=self.feature_map, normalize=self.normalize,
            scale=self.head_dim ** -0.5 if self.options.query_scale == "inside" else 1.0,
            chunk_size=self.chunk_size, initial_state=state,
        )
        o = norm_and_gate(o, x, self.o_norm, None)                                   # [B, T, H, Dv]
        state = LinearMixerState(S=op_state.S, z=op_state.z, seen=op_state.seen, conv=cache)
        return self.o_proj(o.reshape(B, T, -1)), state

    def fact_capacity_bound(self) -> Optional[int]:
        """An f x d outer-product memory recalls about f near-orthogonal keys: f, the feature dimension."""
        return feature_dim(self.feature_map, self.head_dim)

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        d = self.head_dim
        f = feature_dim(self.feature_map, d)
        return batch_size * (self.n_heads * (f * d + f) + cache_numel(self.conv)) * elem_size(dtype)
