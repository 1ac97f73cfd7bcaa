"""Gated DeltaNet layer: the delta rule with a data-dependent decay, state = one [Dk, Dv] matrix per head."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ovq_cl.layers.base import Mixer, MixerOptions, elem_size
from ovq_cl.layers.decay import decay_parameters, log_decay
from ovq_cl.ops.common import l2norm
from ovq_cl.ops.delta import BACKENDS, gated_delta_rule
from ovq_cl.state import MixerState


@dataclasses.dataclass
class DeltaState(MixerState):
    """S: [B, H, Dk, Dv] the fast-weight matrix; seen: tokens absorbed."""

    S: torch.Tensor
    seen: int = 0


@dataclasses.dataclass(frozen=True)
class GatedDeltaNetOptions(MixerOptions):
    """chunk_size: tokens per chunk of the WY form; backend: auto | naive | recurrent | fla; dt_min,
    dt_max: the initial decay step sizes are log-uniform in [dt_min, dt_max] (fla's defaults)."""

    chunk_size: int = 64
    backend: str = "auto"
    dt_min: float = 0.001
    dt_max: float = 0.1
    output_gate: bool = False            # True: o = norm(o) * silu(W_g x) as in fla's layer; False: o = norm(o)

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"GatedDeltaNet: chunk_size must be >= 1, got {self.chunk_size}")
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"GatedDeltaNet: need 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}")
        if self.backend not in BACKENDS:
            raise ValueError(f"GatedDeltaNet: backend must be one of {BACKENDS}, got {self.backend!r}")


class GatedDeltaNet(Mixer):
    """Gated DeltaNet (Yang et al. 2024) as in flash-linear-attention's layer, minus the short
    convolution (the LM's token shift plays that role for every mixer alike).

    q, k are L2-normalised; ``beta = sigmoid(W_b x)``; ``g = -exp(A_log) softplus(W_a x + dt_bias)``
    (Mamba-2 style decay); the output is RMS-normalised per head, and gated by ``silu(W_g x)`` with
    ``output_gate`` (fla's layer; off by default: at head dim 16 on associative recall it kept the layer
    at chance, ``experiments/searches/baseline_choices.py``).
    """

    budget_knob = "head_dim"
    state_type = DeltaState
    Options = GatedDeltaNetOptions

    def __init__(self, d_model: int, n_heads: int, options: Optional[GatedDeltaNetOptions] = None, **overrides) -> None:
        super().__init__(d_model, n_heads, options, **overrides)
        o = self.options
        self.add_qkvo_projections()
        self.g_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False) if o.output_gate else None
        self.b_proj = nn.Linear(d_model, n_heads, bias=True)
        self.a_proj = nn.Linear(d_model, n_heads, bias=False)
        self.o_norm = nn.RMSNorm(self.head_dim)
        self.A_log, self.dt_bias = decay_parameters(n_heads, o.dt_min, o.dt_max)
        self.chunk_size, self.backend = o.chunk_size, o.backend

    def forward(self, x: torch.Tensor, state: Optional[DeltaState] = None) -> Tuple[torch.Tensor, DeltaState]:
        """x: [B, T, d_model] -> y [B, T, d_model], state."""
        self.check_input(x, state)
        B, T, _ = x.shape
        shape = (B, T, self.n_heads, self.head_dim)
        q, k, v = self.project_qkv(x)
        q, k = l2norm(q), l2norm(k)
        beta = torch.sigmoid(self.b_proj(x))                                         # [B, T, H]
        g = log_decay(self.a_proj(x), self.A_log, self.dt_bias)                      # [B, T, H]
        S0 = None if state is None else state.S.detach()
        o, S = gated_delta_rule(q, k, v, g, beta, initial_state=S0, chunk_size=self.chunk_size, backend=self.backend)
        o = self.o_norm(o)
        if self.g_proj is not None:
            o = o * F.silu(self.g_proj(x).view(shape))
        seen = 0 if state is None else state.seen
        return self.o_proj(o.reshape(B, T, -1)), DeltaState(S=S, seen=seen + T)

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        return batch_size * self.n_heads * self.head_dim * self.head_dim * elem_size(dtype)
