"""Causal linear attention layer (chunked form), state = the [Dk, Dv] matrix and its normaliser."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from ovq_cl.layers.base import Mixer, MixerOptions, elem_size
from ovq_cl.ops.linear import LinearAttentionState, feature_map_names, linear_attention_chunked


@dataclasses.dataclass(frozen=True)
class LinearAttentionOptions(MixerOptions):
    """feature_map: "elu1", "relu" or "identity"; normalize: divide by the feature-map normaliser;
    chunk_size: tokens per chunk of the chunked form."""

    feature_map: str = "elu1"
    normalize: bool = True
    chunk_size: int = 64
    query_scale: str = "none"            # none: phi(q) (a scale would cancel when normalised); inside: phi(q / sqrt(d))

    def __post_init__(self) -> None:
        if self.query_scale not in ("inside", "none"):
            raise ValueError(f"LinearAttention: query_scale must be 'inside' or 'none', got {self.query_scale!r}")
        if self.feature_map not in feature_map_names():
            raise ValueError(f"LinearAttention: feature_map must be one of {feature_map_names()}, got {self.feature_map!r}")
        if self.chunk_size < 1:
            raise ValueError(f"LinearAttention: chunk_size must be >= 1, got {self.chunk_size}")


class LinearAttention(Mixer):
    """Linear attention with a configurable feature map ("elu1", "relu", "identity")."""

    budget_knob = "head_dim"
    state_type = LinearAttentionState
    Options = LinearAttentionOptions

    def __init__(self, d_model: int, n_heads: int, options: Optional[LinearAttentionOptions] = None, **overrides) -> None:
        super().__init__(d_model, n_heads, options, **overrides)
        self.add_qkvo_projections()
        o = self.options
        self.feature_map, self.normalize, self.chunk_size = o.feature_map, o.normalize, o.chunk_size

    def forward(
        self, x: torch.Tensor, state: Optional[LinearAttentionState] = None
    ) -> Tuple[torch.Tensor, LinearAttentionState]:
        """x: [B, T, d_model] -> y [B, T, d_model], state."""
        self.check_input(x, state)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        o, state = linear_attention_chunked(
            q, k, v, feature_map_name=self.feature_map, normalize=self.normalize,
            scale=self.head_dim ** -0.5 if self.options.query_scale == "inside" else 1.0,
            chunk_size=self.chunk_size, initial_state=state,
        )
        return self.o_proj(o.reshape(B, T, -1)), state

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        d = self.head_dim
        return batch_size * self.n_heads * (d * d + d) * elem_size(dtype)
