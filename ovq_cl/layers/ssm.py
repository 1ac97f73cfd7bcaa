"""A Mamba-2-style SSM layer: per-head data-dependent scalar decay, state = one [Dk, Dv] matrix per head."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ovq_cl.layers.base import Mixer, MixerOptions, elem_size
from ovq_cl.layers.decay import decay_parameters, log_decay
from ovq_cl.ops.ssm import SSMState, simple_gla_chunked


@dataclasses.dataclass(frozen=True)
class SSMOptions(MixerOptions):
    """chunk_size: tokens per chunk; dt_min, dt_max: initial decay step sizes, log-uniform (Mamba's);
    output_gate: o = norm(o) * silu(W_g x) as in Mamba-2 (off by default, following the Gated DeltaNet
    search in experiments/searches/baseline_choices.py; the SSM's own search is still to run)."""

    chunk_size: int = 64
    dt_min: float = 0.001
    dt_max: float = 0.1
    output_gate: bool = False

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"SSM: chunk_size must be >= 1, got {self.chunk_size}")
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"SSM: need 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}")


class SSMMixer(Mixer):
    """Selective SSM in its simple-GLA form (Mamba-2 with scalar decay per head; Dao & Gu 2024):
    ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``, ``o_t = q_t^T S_t / sqrt(Dk)``, with
    ``g_t = -exp(A_log) softplus(W_a x_t + dt_bias)``; the output is RMS-normalised per head."""

    budget_knob = "head_dim"
    state_type = SSMState
    Options = SSMOptions

    def __init__(self, d_model: int, n_heads: int, options: Optional[SSMOptions] = None, **overrides) -> None:
        super().__init__(d_model, n_heads, options, **overrides)
        o = self.options
        self.add_qkvo_projections()
        self.g_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False) if o.output_gate else None
        self.a_proj = nn.Linear(d_model, n_heads, bias=False)
        self.o_norm = nn.RMSNorm(self.head_dim)
        self.A_log, self.dt_bias = decay_parameters(n_heads, o.dt_min, o.dt_max)

    def forward(self, x: torch.Tensor, state: Optional[SSMState] = None) -> Tuple[torch.Tensor, SSMState]:
        """x: [B, T, d_model] -> y [B, T, d_model], state."""
        self.check_input(x, state)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        g = log_decay(self.a_proj(x), self.A_log, self.dt_bias)                       # [B, T, H]
        o, state = simple_gla_chunked(q, k, v, g.to(q.dtype), initial_state=state, chunk_size=self.options.chunk_size)
        o = self.o_norm(o)
        if self.g_proj is not None:
            o = o * F.silu(self.g_proj(x).view(B, T, self.n_heads, self.head_dim))
        return self.o_proj(o.reshape(B, T, -1)), state

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        return batch_size * self.n_heads * self.head_dim * self.head_dim * elem_size(dtype)
