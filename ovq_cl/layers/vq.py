"""VQAttention (Lingle 2023): OVQ's read over a static, globally learned key codebook."""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from ovq_cl.layers.base import Mixer, MixerOptions, elem_size
from ovq_cl.ops.common import l2norm
from ovq_cl.ops.vq import VQState, quantize, vq_attention


@dataclasses.dataclass(frozen=True)
class VQAttentionOptions(MixerOptions):
    """codebook_size: S codes per head; chunk_size: tokens per block; beta_init / learn_beta: the read's
    inverse temperature (stored as log); ema_decay: the codebook's EMA k-means decay; commitment_weight:
    of ``|k - sg(k_hat)|^2``; state_grad: full | detach; recompute_chunks: 0 = off, S = keep the graph of
    1 in S blocks in training and recompute the rest."""

    codebook_size: int = 256
    chunk_size: int = 32
    beta_init: float = 8.0
    learn_beta: bool = True
    ema_decay: float = 0.99
    commitment_weight: float = 1e-4
    state_grad: str = "full"
    recompute_chunks: int = 0

    def __post_init__(self) -> None:
        if self.codebook_size < 1:
            raise ValueError(f"VQAttention: codebook_size must be >= 1, got {self.codebook_size}")
        if self.chunk_size < 1:
            raise ValueError(f"VQAttention: chunk_size must be >= 1, got {self.chunk_size}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"VQAttention: ema_decay must be in [0, 1), got {self.ema_decay}")
        if not self.beta_init > 0:
            raise ValueError(f"VQAttention: beta_init must be > 0, got {self.beta_init}")
        if int(self.recompute_chunks) < 0:
            raise ValueError(f"VQAttention: recompute_chunks must be >= 0 (0 = off), got {self.recompute_chunks}")


class VQAttention(Mixer):
    """Transformer-VQ style attention, sharing OVQ's normalisation, beta and read.

    The codebook [H, S, Dk] (unit rows) is a buffer trained by EMA k-means on the normalised keys
    (decay ``ema_decay``) in training mode, and fixed in eval mode. Keys are quantised with a
    straight-through estimator; the commitment loss ``commitment_weight * |k - sg(k_hat)|^2`` of the
    last call is left in ``self.aux_loss`` for the model's loss. Per lane, only counts and mean
    values per code (plus the previous block as tokens) are kept.
    """

    budget_knob = "codebook_size"
    state_type = VQState
    shared_memory_buffers = ("codebook",)                      # [H, S, Dk]: memory about the keys
    learned_buffers = ("codebook", "ema_counts", "ema_sums")

    Options = VQAttentionOptions

    def __init__(self, d_model: int, n_heads: int, options: Optional[VQAttentionOptions] = None, **overrides) -> None:
        super().__init__(d_model, n_heads, options, **overrides)
        o = self.options
        codebook_size, chunk_size, beta_init, learn_beta = o.codebook_size, o.chunk_size, o.beta_init, o.learn_beta
        ema_decay, commitment_weight, state_grad, recompute_chunks = (
            o.ema_decay, o.commitment_weight, o.state_grad, o.recompute_chunks)
        self.add_qkvo_projections()
        self.log_beta = nn.Parameter(torch.full((n_heads,), math.log(beta_init)), requires_grad=learn_beta)
        codebook = l2norm(torch.randn(n_heads, codebook_size, self.head_dim))
        self.register_buffer("codebook", codebook)
        self.register_buffer("ema_counts", torch.ones(n_heads, codebook_size))
        self.register_buffer("ema_sums", codebook.clone())
        self.chunk_size, self.ema_decay, self.commitment_weight, self.state_grad = chunk_size, ema_decay, commitment_weight, state_grad
        self.recompute_chunks = int(recompute_chunks)
        self.aux_loss: Optional[torch.Tensor] = None
        # data-parallel training: the process group whose ranks sum their batch statistics before the
        # EMA step, so every replica's codebook sees the whole batch (set_process_group)
        self.ema_process_group = None

    def set_process_group(self, group) -> None:
        """The ranks whose batch statistics the EMA step sums (the Mixer hook, called under torchrun)."""
        self.ema_process_group = group

    def __getstate__(self):
        # The last commitment loss is a non-leaf tensor with its autograd graph: it belongs to the last
        # forward, not to the layer. Leaving it out lets the layer be deep-copied (LwF's old model, EMA
        # copies) and pickled; the copy has no pending loss, as after construction.
        state = dict(super().__getstate__())
        state["aux_loss"] = None
        state["ema_process_group"] = None       # a copy is not a replica (process groups do not pickle)
        return state

    def forward(self, x: torch.Tensor, state: Optional[VQState] = None) -> Tuple[torch.Tensor, VQState]:
        """x: [B, T, d_model] -> y [B, T, d_model], state."""
        self.check_input(x, state)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k = l2norm(q), l2norm(k)
        k_hat, codes = quantize(k, self.codebook)
        self.aux_loss = self.commitment_weight * (k - k_hat.detach()).pow(2).sum(-1).mean()
        k_st = k + (k_hat - k).detach()
        o, state = vq_attention(
            q, k_st, v, codes, self.log_beta.exp(), self.codebook, self.chunk_size, self.state_grad, initial_state=state,
            recompute_chunks=self.recompute_chunks,
        )
        if self.training:
            self._ema_update(k.detach(), codes)
        return self.o_proj(o.reshape(B, T, -1)), state

    @torch.no_grad()
    def _ema_update(self, k: torch.Tensor, codes: torch.Tensor) -> None:
        """EMA k-means on the unit sphere: running counts and sums per code, codebook = normalised means."""
        H, S, D = self.codebook.shape
        flat_codes = codes.permute(2, 0, 1).reshape(H, -1)                  # [H, B*T]
        flat_k = k.permute(2, 0, 1, 3).reshape(H, -1, D).to(self.ema_sums.dtype)
        counts = torch.zeros(H, S, device=k.device, dtype=self.ema_counts.dtype).scatter_add_(
            1, flat_codes, torch.ones_like(flat_codes, dtype=self.ema_counts.dtype))
        sums = torch.zeros(H, S, D, device=k.device, dtype=self.ema_sums.dtype).scatter_add_(
            1, flat_codes.unsqueeze(-1).expand(-1, -1, D), flat_k)
        if self.ema_process_group is not None:
            torch.distributed.all_reduce(counts, group=self.ema_process_group)
            torch.distributed.all_reduce(sums, group=self.ema_process_group)
        g = self.ema_decay
        self.ema_counts.mul_(g).add_(counts, alpha=1 - g)
        self.ema_sums.mul_(g).add_(sums, alpha=1 - g)
        # a new tensor, not an in-place write: this forward's graph saved the old codebook
        self.codebook = l2norm(self.ema_sums / self.ema_counts.clamp_min(1e-6).unsqueeze(-1))

    def fact_capacity_bound(self) -> Optional[int]:
        """One fact per code (its running mean of values): ``codebook_size``."""
        return int(self.codebook.shape[1])

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        S, d, L = self.codebook.shape[1], self.head_dim, self.chunk_size
        prev = L if seq_len >= L else 0
        tokens = prev + seq_len % L
        floats = S * (1 + d) + tokens * 2 * d
        return batch_size * self.n_heads * (floats * elem_size(dtype) + tokens * 8)

    def state_stats(self, state: Optional[VQState]) -> Dict[str, float]:
        if state is None:
            return {"active_slots": 0.0}
        return {"active_slots": float((state.counts > 0).sum(-1).float().mean())}
