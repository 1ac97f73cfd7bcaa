"""Gated DeltaNet layer: the delta rule with a data-dependent decay, state = one [Dk, Dv] matrix per head
(plus the short convolution's cache when ``short_conv`` is on); DeltaNet: the same without the decay."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch
from torch import nn

from ovq_cl.layers.base import Mixer, MixerOptions, elem_size
from ovq_cl.layers.conv import ShortConv, cache_numel, check_layer_choices, norm_and_gate, short_conv_qkv
from ovq_cl.layers.decay import decay_parameters, log_decay
from ovq_cl.ops.common import compute_dtype, l2norm
from ovq_cl.ops.delta import BACKENDS, gated_delta_rule
from ovq_cl.state import MixerState


@dataclasses.dataclass
class DeltaState(MixerState):
    """S: [B, H, Dk, Dv] the fast-weight matrix; seen: tokens absorbed; conv: [B, K-1, 3 H Dk] the short
    convolution's cache of the last K-1 q, k, v projections (None when ``short_conv`` = 0)."""

    S: torch.Tensor
    seen: int = 0
    conv: Optional[torch.Tensor] = None


@dataclasses.dataclass(frozen=True)
class GatedDeltaNetOptions(MixerOptions):
    """chunk_size: tokens per chunk of the WY form; backend: auto | chunk | naive (the token-by-token oracle) | fla; dt_min,
    dt_max: the initial decay step sizes are log-uniform in [dt_min, dt_max] (fla's are 0.001, 0.1; our
    default dt_max 0.01 starts the decays slower);
    short_conv: kernel size of a causal depthwise conv + SiLU on q, k, v before q, k are L2-normalised
    (fla's layer uses 4; 0 = off); output_norm: per-head RMSNorm of the output (fla's); decay: the
    data-dependent decay g (False: DeltaNet, g = 0 and no decay parameters)."""

    chunk_size: int = 64
    backend: str = "auto"
    dt_min: float = 0.001
    # defaults from experiments/studies/baseline_choices/search.py (associative recall, head dim 16, 3 seeds, 300
    # steps): no gate, dt_max 0.01: 0.836; no gate, fla's dt_max 0.1: 0.570; + conv 0.407; fla's layer
    # (gate + conv): 0.051; gate: 0.082. DeltaNet (decay False): 0.949, + conv 0.743.
    dt_max: float = 0.01
    output_gate: bool = False            # True: o = norm(o) * silu(W_g x) as in fla's layer; False: o = norm(o)
    short_conv: int = 0                  # 0: no convolution; the LM's token shift is the only short mixing
    output_norm: bool = True
    decay: bool = True

    def __post_init__(self) -> None:
        name = type(self).__name__.removesuffix("Options")
        if self.chunk_size < 1:
            raise ValueError(f"{name}: chunk_size must be >= 1, got {self.chunk_size}")
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"{name}: need 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}")
        if self.backend not in BACKENDS:
            raise ValueError(f"{name}: backend must be one of {BACKENDS}, got {self.backend!r}")
        check_layer_choices(name, self.short_conv, self.output_norm)
        if not isinstance(self.decay, bool):
            raise ValueError(f"{name}: decay must be True or False, got {self.decay!r}")


class GatedDeltaNet(Mixer):
    """Gated DeltaNet (Yang et al. 2024) as in flash-linear-attention's layer.

    q, k (after the optional short convolution) are L2-normalised; ``beta = sigmoid(W_b x)``;
    ``g = -exp(A_log) softplus(W_a x + dt_bias)`` (Mamba-2 style decay; g = 0 with ``decay=False``);
    the output is RMS-normalised per head (``output_norm``), and gated by ``silu(W_g x)`` with
    ``output_gate`` (fla's layer; off by default: at head dim 16 on associative recall it kept the layer
    at chance, ``experiments/studies/baseline_choices/search.py``). fla's layer also has ``short_conv=4``; off
    by default here, where the LM's token shift gives every mixer alike a look at the previous token.
    """

    budget_knob = "head_dim"
    state_type = DeltaState
    Options = GatedDeltaNetOptions

    def __init__(self, d_model: int, n_heads: int, options: Optional[GatedDeltaNetOptions] = None, **overrides) -> None:
        super().__init__(d_model, n_heads, options, **overrides)
        o = self.options
        # modules are created in a fixed order (projections first, then the options' extras): a seed gives
        # the default layer the same weights whatever extras other configurations switch on
        self.add_qkvo_projections()
        self.g_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False) if o.output_gate else None
        self.b_proj = nn.Linear(d_model, n_heads, bias=True)
        self.a_proj = nn.Linear(d_model, n_heads, bias=False) if o.decay else None
        self.o_norm = nn.RMSNorm(self.head_dim) if o.output_norm else None
        if o.decay:
            self.A_log, self.dt_bias = decay_parameters(n_heads, o.dt_min, o.dt_max)
        else:
            self.A_log = self.dt_bias = None
        self.conv = ShortConv(3 * n_heads * self.head_dim, o.short_conv) if o.short_conv else None
        self.chunk_size, self.backend = o.chunk_size, o.backend

    def forward(self, x: torch.Tensor, state: Optional[DeltaState] = None) -> Tuple[torch.Tensor, DeltaState]:
        """x: [B, T, d_model] -> y [B, T, d_model], state."""
        self.check_input(x, state)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k, v, cache = short_conv_qkv(self.conv, q, k, v, state, type(self).__name__)
        q, k = l2norm(q), l2norm(k)
        beta = torch.sigmoid(self.b_proj(x))                                         # [B, T, H]
        if self.a_proj is not None:
            g = log_decay(self.a_proj(x), self.A_log, self.dt_bias)                  # [B, T, H]
        else:
            g = x.new_zeros(B, T, self.n_heads, dtype=compute_dtype(x.dtype))       # no decay: the plain delta rule
        S0 = None if state is None else state.S.detach()
        o, S = gated_delta_rule(q, k, v, g, beta, initial_state=S0, chunk_size=self.chunk_size, backend=self.backend)
        o = norm_and_gate(o, x, self.o_norm, self.g_proj)
        seen = 0 if state is None else state.seen
        return self.o_proj(o.reshape(B, T, -1)), DeltaState(S=S, seen=seen + T, conv=cache)

    def fact_capacity_bound(self) -> Optional[int]:
        """A Dk x Dv delta-rule state holds about Dk near-orthogonal keys: ``head_dim``."""
        return self.head_dim

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        return batch_size * (self.n_heads * self.head_dim * self.head_dim + cache_numel(self.conv)) * elem_size(dtype)


@dataclasses.dataclass(frozen=True)
class DeltaNetOptions(GatedDeltaNetOptions):
    """GatedDeltaNet's options with ``decay=False``: DeltaNet (Schlag et al. 2021; Yang et al. 2024's
    parallel form), ``S_t = (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T``. dt_min, dt_max are unused."""

    decay: bool = False


class DeltaNet(GatedDeltaNet):
    """DeltaNet: Gated DeltaNet without the decay (no a_proj, A_log, dt_bias); its state never forgets
    except by the delta rule's own overwrite of the key it writes."""

    Options = DeltaNetOptions
