"""OVQAttention: projections, heads and output projection around the OVQ op."""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from ovq_cl.layers.base import Mixer, MixerOptions, elem_size
from ovq_cl.ops.ovq import BACKENDS, OVQParams, OVQState, ovq_attention


@dataclasses.dataclass(frozen=True)
class OVQOptions(OVQParams, MixerOptions):
    """The op's hyper-parameters (:class:`OVQParams`: num_slots, chunk_size, growth, growth_alpha,
    growth_rate, init, state_grad, init_seed, recompute_chunks, and the plasticity rules
    novelty_threshold, when_full, count_decay, count_cap) plus the layer's: head_dim, beta_init
    and learn_beta (the per-head inverse temperature, stored as log), backend (auto | naive |
    recurrent | triton). The layer passes these options to the op as its params."""

    beta_init: float = 8.0
    learn_beta: bool = True
    backend: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.beta_init > 0:
            raise ValueError(f"OVQAttention: beta_init must be > 0, got {self.beta_init}")
        if self.backend not in BACKENDS:
            raise ValueError(f"OVQAttention: backend must be one of {BACKENDS}, got {self.backend!r}")


class OVQAttention(Mixer):
    """Online vector-quantised attention (Alonso, Figliolia, Millidge 2026).

    No positional encoding (as in the paper); q and k are L2-normalised inside the op and scaled by a
    learnable per-head beta, stored as log. State: :class:`OVQState`, O(N (Dk + Dv)) per head.
    """

    budget_knob = "num_slots"
    state_type = OVQState
    Options = OVQOptions

    def __init__(self, d_model: int, n_heads: int, options: Optional[OVQOptions] = None, **overrides) -> None:
        super().__init__(d_model, n_heads, options, **overrides)
        self.params: OVQParams = self.options          # the op reads its fields from the options
        self.add_qkvo_projections()
        self.log_beta = nn.Parameter(torch.full((n_heads,), math.log(self.options.beta_init)),
                                     requires_grad=self.options.learn_beta)
        self.backend = self.options.backend

    def data_parallel_problem(self) -> Optional[str]:
        """``init: random`` draws one row of noise per lane of a call, so with the lanes sharded rank r's
        lanes would get the rows of lanes 0.. instead of their own."""
        if self.options.init == "random":
            return ("init 'random' draws its noise per lane of a call, which differs when the lanes are "
                    "sharded; use init 'spread' or one process")
        return None

    def forward(self, x: torch.Tensor, state: Optional[OVQState] = None) -> Tuple[torch.Tensor, OVQState]:
        """x: [B, T, d_model] -> y [B, T, d_model], state."""
        self.check_input(x, state)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        o, state = ovq_attention(q, k, v, self.log_beta.exp(), self.params, initial_state=state, backend=self.backend)
        return self.o_proj(o.reshape(B, T, -1)), state

    def fact_capacity_bound(self) -> Optional[int]:
        """One fact per slot: ``num_slots``."""
        return self.params.num_slots

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        n, d, L = self.params.num_slots, self.head_dim, self.params.chunk_size
        per_head = n * (2 * d + 1) + (seq_len % L) * 2 * d
        return batch_size * self.n_heads * per_head * elem_size(dtype)

    def state_stats(self, state: Optional[OVQState]) -> Dict[str, float]:
        """Used slots (counts > 0, mean over lanes and heads), the entropy of the counts (nats, mean
        over lanes and heads), and the slots the ``when_full`` rule freed since the state began, per
        lane (``merges``, ``evictions``; both 0 without the rule)."""
        if state is None or state.n_active == 0:
            return {"active_slots": 0.0, "count_entropy": 0.0, "merges": 0.0, "evictions": 0.0}
        c = state.counts[:, :, : state.n_active]
        p = c / c.sum(-1, keepdim=True)
        entropy = -(p * p.clamp_min(1e-30).log()).sum(-1).mean()
        lanes = state.counts.shape[0]
        return {"active_slots": float((c > 0).sum(-1).float().mean()), "count_entropy": float(entropy),
                "merges": state.merges / lanes, "evictions": state.evictions / lanes}
