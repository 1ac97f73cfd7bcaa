"""OVQAttention: projections, heads and output projection around the OVQ op."""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from ovq_cl.layers.base import Mixer, elem_size
from ovq_cl.ops.ovq import OVQParams, OVQState, ovq_attention


class OVQAttention(Mixer):
    """Online vector-quantised attention (Alonso, Figliolia, Millidge 2026).

    No positional encoding (as in the paper); q and k are L2-normalised inside the op and scaled by a
    learnable per-head beta, stored as log. State: :class:`OVQState`, O(N (Dk + Dv)) per head.
    """

    state_type = OVQState

    def __init__(
        self, d_model: int, n_heads: int, head_dim: Optional[int] = None, num_slots: int = 256,
        chunk_size: int = 32, growth: str = "plateau", growth_alpha: Optional[float] = None,
        growth_rate: float = 1.0, init: str = "spread", state_grad: str = "full", beta_init: float = 8.0,
        learn_beta: bool = True, init_seed: int = 0, backend: str = "auto", recompute_chunks: int = 0,
    ) -> None:
        super().__init__(d_model, n_heads, head_dim)
        self.params = OVQParams(
            num_slots=num_slots, chunk_size=chunk_size, growth=growth, growth_alpha=growth_alpha,
            growth_rate=growth_rate, init=init, state_grad=state_grad, init_seed=init_seed,
            recompute_chunks=recompute_chunks,
        )
        if not beta_init > 0:
            raise ValueError(f"OVQAttention: beta_init must be > 0, got {beta_init}")
        self.add_qkvo_projections()
        self.log_beta = nn.Parameter(torch.full((n_heads,), math.log(beta_init)), requires_grad=learn_beta)
        self.backend = backend

    def forward(self, x: torch.Tensor, state: Optional[OVQState] = None) -> Tuple[torch.Tensor, OVQState]:
        """x: [B, T, d_model] -> y [B, T, d_model], state."""
        self.check_input(x, state)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        o, state = ovq_attention(q, k, v, self.log_beta.exp(), self.params, initial_state=state, backend=self.backend)
        return self.o_proj(o.reshape(B, T, -1)), state

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        n, d, L = self.params.num_slots, self.head_dim, self.params.chunk_size
        per_head = n * (2 * d + 1) + (seq_len % L) * 2 * d
        return batch_size * self.n_heads * per_head * elem_size(dtype)

    def state_stats(self, state: Optional[OVQState]) -> Dict[str, float]:
        """Active slots, and the entropy of the counts (nats, averaged over lanes and heads)."""
        if state is None or state.n_active == 0:
            return {"active_slots": 0.0, "count_entropy": 0.0}
        c = state.counts[:, :, : state.n_active]
        p = c / c.sum(-1, keepdim=True)
        entropy = -(p * p.clamp_min(1e-30).log()).sum(-1).mean()
        return {"active_slots": float(state.n_active), "count_entropy": float(entropy)}
