"""A Mamba-2-style SSM layer: per-head data-dependent scalar decay, state = one [Dk, Dv] matrix per head
(plus the short convolution's cache when ``short_conv`` is on)."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch
from torch import nn

from ovq_cl.layers.base import Mixer, MixerOptions, elem_size
from ovq_cl.layers.conv import ShortConv, cache_numel, check_layer_choices, norm_and_gate, short_conv_qkv
from ovq_cl.layers.decay import decay_parameters, log_decay
from ovq_cl.ops.ssm import SSMState, simple_gla_chunked


@dataclasses.dataclass
class SSMMixerState(SSMState):
    """The op's state (S [B, H, Dk, Dv], seen) and conv: [B, K-1, 3 H Dk], the short convolution's
    cache of the last K-1 q, k, v projections (None when ``short_conv`` = 0)."""

    conv: Optional[torch.Tensor] = None


@dataclasses.dataclass(frozen=True)
class SSMOptions(MixerOptions):
    """chunk_size: tokens per chunk; dt_min, dt_max: initial decay step sizes, log-uniform (Mamba's);
    output_gate: o = norm(o) * silu(W_g x) as in Mamba-2;
    short_conv: kernel size of a causal depthwise conv + SiLU on q, k, v (Mamba-2's conv on C, B, x;
    it uses 4; 0 = off); output_norm: per-head RMSNorm of the output (Mamba-2's norm before out_proj)."""

    chunk_size: int = 64
    dt_min: float = 0.001
    # defaults from experiments/studies/baseline_choices/search.py (associative recall, head dim 16, 3 seeds, 300
    # steps): conv 4 + dt_max 0.01: 0.607; conv 4: 0.578; dt_max 0.01: 0.493; neither: 0.283; gate: 0.059
    dt_max: float = 0.01
    output_gate: bool = False
    short_conv: int = 4
    output_norm: bool = True

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"SSM: chunk_size must be >= 1, got {self.chunk_size}")
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"SSM: need 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}")
        check_layer_choices("SSM", self.short_conv, self.output_norm)


class SSMMixer(Mixer):
    """Selective SSM in its simple-GLA form (Mamba-2 with scalar decay per head; Dao & Gu 2024):
    ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``, ``o_t = q_t^T S_t / sqrt(Dk)``, with
    ``g_t = -exp(A_log) softplus(W_a x_t + dt_bias)``; q, k, v optionally through the short
    convolution (``short_conv``); the output is RMS-normalised per head (``output_norm``)."""

    budget_knob = "head_dim"
    state_type = SSMMixerState
    Options = SSMOptions

    def __init__(self, d_model: int, n_heads: int, options: Optional[SSMOptions] = None, **overrides) -> None:
        super().__init__(d_model, n_heads, options, **overrides)
        o = self.options
        # modules are created in a fixed order (projections first, then the options' extras): a seed gives
        # the default layer the same weights whatever extras other configurations switch on
        self.add_qkvo_projections()
        self.g_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False) if o.output_gate else None
        self.a_proj = nn.Linear(d_model, n_heads, bias=False)
        self.o_norm = nn.RMSNorm(self.head_dim) if o.output_norm else None
        self.A_log, self.dt_bias = decay_parameters(n_heads, o.dt_min, o.dt_max)
        self.conv = ShortConv(3 * n_heads * self.head_dim, o.short_conv) if o.short_conv else None

    def forward(self, x: torch.Tensor, state: Optional[SSMMixerState] = None) -> Tuple[torch.Tensor, SSMMixerState]:
        """x: [B, T, d_model] -> y [B, T, d_model], state."""
        self.check_input(x, state)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k, v, cache = short_conv_qkv(self.conv, q, k, v, state, type(self).__name__)
        g = log_decay(self.a_proj(x), self.A_log, self.dt_bias)                       # [B, T, H]
        o, op_state = simple_gla_chunked(q, k, v, g.to(q.dtype), initial_state=state, chunk_size=self.options.chunk_size)
        o = norm_and_gate(o, x, self.o_norm, self.g_proj)
        return self.o_proj(o.reshape(B, T, -1)), SSMMixerState(S=op_state.S, seen=op_state.seen, conv=cache)

    def fact_capacity_bound(self) -> Optional[int]:
        """Its state is head_dim x head_dim per head, written by outer products: about ``head_dim`` keys."""
        return self.head_dim

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        return batch_size * (self.n_heads * self.head_dim * self.head_dim + cache_numel(self.conv)) * elem_size(dtype)
