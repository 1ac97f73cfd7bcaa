"""Causal linear attention layer (chunked form), state = the [Dk, Dv] matrix and its normaliser."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ovq_cl.layers.base import Mixer, elem_size
from ovq_cl.ops.linear import LinearAttentionState, feature_map_names, linear_attention_chunked


class LinearAttention(Mixer):
    """Linear attention with a configurable feature map ("elu1", "relu", "identity")."""

    state_type = LinearAttentionState

    def __init__(
        self, d_model: int, n_heads: int, head_dim: Optional[int] = None, feature_map: str = "elu1",
        normalize: bool = True, chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, n_heads, head_dim)
        if feature_map not in feature_map_names():
            raise ValueError(f"LinearAttention: feature_map must be one of {feature_map_names()}, got {feature_map!r}")
        if chunk_size < 1:
            raise ValueError(f"LinearAttention: chunk_size must be >= 1, got {chunk_size}")
        self.add_qkvo_projections()
        self.feature_map, self.normalize, self.chunk_size = feature_map, normalize, chunk_size

    def forward(
        self, x: torch.Tensor, state: Optional[LinearAttentionState] = None
    ) -> Tuple[torch.Tensor, LinearAttentionState]:
        """x: [B, T, d_model] -> y [B, T, d_model], state."""
        self.check_input(x, state)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        o, state = linear_attention_chunked(
            q, k, v, feature_map_name=self.feature_map, normalize=self.normalize,
            scale=self.head_dim ** -0.5, chunk_size=self.chunk_size, initial_state=state,
        )
        return self.o_proj(o.reshape(B, T, -1)), state

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        d = self.head_dim
        return batch_size * self.n_heads * (d * d + d) * elem_size(dtype)
