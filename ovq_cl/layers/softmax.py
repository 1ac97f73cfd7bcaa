"""Full causal softmax attention (SDPA) whose state is the KV cache."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from ovq_cl.layers.base import Mixer, MixerOptions, elem_size
from ovq_cl.layers.rotary import apply_rotary
from ovq_cl.ops.softmax import KVCacheState, softmax_attention


@dataclasses.dataclass(frozen=True)
class FullAttentionOptions(MixerOptions):
    """rope: rotary positions on q and k (base ``rope_base``)."""

    rope: bool = True
    rope_base: float = 10000.0


@dataclasses.dataclass(frozen=True)
class SlidingWindowOptions(FullAttentionOptions):
    """window: W, the tokens each query sees (itself included); the state keeps the last W - 1."""

    window: int = 64

    def __post_init__(self) -> None:
        if self.window is None or self.window < 1:
            raise ValueError(f"SlidingWindowAttention: window must be >= 1, got {self.window}")


class SoftmaxAttention(Mixer):
    """Causal multi-head attention; ``window=None`` is full attention, an int W a sliding window.

    With ``rope`` the keys are rotated before caching, at positions counted from the first token the
    state saw, so a split sequence gets the same positions as the whole one.
    """

    state_type = KVCacheState
    Options = FullAttentionOptions

    def __init__(self, d_model: int, n_heads: int, options: Optional[FullAttentionOptions] = None, **overrides) -> None:
        super().__init__(d_model, n_heads, options, **overrides)
        self.add_qkvo_projections()
        o = self.options
        self.rope, self.rope_base, self.window = o.rope, o.rope_base, getattr(o, "window", None)

    def forward(self, x: torch.Tensor, state: Optional[KVCacheState] = None) -> Tuple[torch.Tensor, KVCacheState]:
        """x: [B, T, d_model] -> y [B, T, d_model], state (the cache)."""
        self.check_input(x, state)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        if self.rope:
            offset = 0 if state is None else state.seen
            q, k = apply_rotary(q, offset, self.rope_base), apply_rotary(k, offset, self.rope_base)
        o, state = softmax_attention(q, k, v, window=self.window, initial_state=state)
        return self.o_proj(o.reshape(B, T, -1)), state

    def fact_capacity_bound(self) -> Optional[int]:
        """Full attention: none (its cache grows); a window of W tokens: the (W - 1) // 2 bindings of two
        tokens it still sees."""
        return None if self.window is None else (self.window - 1) // 2

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        kept = seq_len if self.window is None else min(seq_len, self.window - 1)
        return batch_size * self.n_heads * kept * 2 * self.head_dim * elem_size(dtype)


class SlidingWindowAttention(SoftmaxAttention):
    """Causal attention over the last ``window`` tokens (the current one included); its state is the
    last ``window - 1`` keys and values, so it stops growing at T = window."""

    Options = SlidingWindowOptions
    budget_knob = "window"
