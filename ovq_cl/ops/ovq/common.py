"""What every OVQ path shares: the op's hyper-parameters, its state, and the growth schedule.

Notation (``docs/design.md``, section 4): per lane b and head h the state holds a key dictionary
``D_k`` [N, Dk] (unit rows), a value dictionary ``D_v`` [N, Dv], counts ``c`` [N] and the keys/values
of the unfinished chunk (the pending buffer, fewer than L tokens). Active slots are always a prefix
``[0, n_active)`` of the dictionary.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from ovq_cl.state import MixerState

GROWTH_KINDS = ("plateau", "linear", "novelty")
WHEN_FULL_KINDS = ("none", "merge", "evict")
INIT_KINDS = ("spread", "random")
STATE_GRAD_KINDS = ("full", "detach")


@dataclasses.dataclass(frozen=True)
class OVQParams:
    """Hyper-parameters of the OVQ op (everything but the tensors).

    num_slots: N, dictionary size per head.
    chunk_size: L, tokens per chunk (read and absorbed together).
    growth: "plateau" (``min(N, ceil(G(t)))``, ``G(t) = N (1 - (1 + t/alpha)^(-alpha/N))``),
        "linear" (``min(N, ceil(rate t))``) or "novelty" (no schedule: only novel keys open slots).
    growth_alpha: alpha of the plateau (None -> N, i.e. ``G(t) = N t / (N + t)``).
    growth_rate: slope of the linear growth.
    init: "spread" (keys least similar to the active centroids become new slots) or "random".
    state_grad: "full" (autograd flows through the dictionary within one call) or "detach".
    init_seed: seed of the "random" init; the generator is re-seeded per chunk from (seed, tokens
        absorbed) so that chunked and token-by-token decoding draw the same numbers.
    recompute_chunks: 0 = off; S > 0 = in training, run every S chunks without keeping their graph
        and recompute them in the backward. Each chunk's read keeps the dictionary it read for the
        backward ([B, H, N, D] per chunk), so plain training memory grows by one dictionary per
        chunk; with S it grows by one per S chunks, plus one segment's graph during the backward.
        Same values and gradients, about one more forward of compute. Inference is unaffected.

    Plasticity rules (``docs/design.md``, section 4; all off by default, :mod:`~ovq_cl.ops.ovq.plasticity`):

    novelty_threshold: tau (a cosine in [-1, 1)), or None. A chunk key whose best similarity to the
        used centroids is below tau is *novel* and opens a free slot (DP-means, the small-variance
        limit of the Dirichlet process), in addition to the schedule (plateau, linear) or instead of
        it (``growth="novelty"``, which needs tau). Each lane and head then has its own number of
        used slots. Needs ``init="spread"`` (the keys that open slots are the least similar ones).
    when_full: what a novel key does when the dictionary was already full before its chunk:
        "none" (it is merged into its nearest centroid, as without the rule), "merge" (the two
        closest centroids are merged, count-weighted, keys renormalised, and the freed slot takes
        the key) or "evict" (the slot with the lowest count takes the key: with ``count_decay`` < 1
        the least recently and least used one). One such key per chunk, lane and head (the most
        novel). Needs tau.
    count_decay: gamma in (0, 1]: every used count is multiplied by gamma before each chunk is
        absorbed (exponential forgetting of the sufficient statistics; 1 = off). Counts never reach
        0 (floor 1e-30), so a used slot stays used.
    count_cap: counts are clipped to this after each chunk (>= 1), or None: centroids keep moving
        with a step of at least ``m / (cap + m)``.
    """

    num_slots: int = 256
    chunk_size: int = 32
    growth: str = "plateau"
    growth_alpha: Optional[float] = None
    growth_rate: float = 1.0
    init: str = "spread"
    state_grad: str = "full"
    init_seed: int = 0
    recompute_chunks: int = 0
    novelty_threshold: Optional[float] = None
    when_full: str = "none"
    count_decay: float = 1.0
    count_cap: Optional[float] = None

    @property
    def plastic(self) -> bool:
        """True when any plasticity rule is on (the absorb step then runs per lane and head)."""
        return (self.novelty_threshold is not None or self.when_full != "none" or self.count_decay != 1.0
                or self.count_cap is not None or self.growth == "novelty")

    def __post_init__(self) -> None:
        if int(self.num_slots) < 1:
            raise ValueError(f"OVQ: num_slots (dictionary size N) must be >= 1, got {self.num_slots}")
        if int(self.chunk_size) < 1:
            raise ValueError(f"OVQ: chunk_size (L) must be >= 1, got {self.chunk_size}")
        if self.growth not in GROWTH_KINDS:
            raise ValueError(f"OVQ: growth must be one of {GROWTH_KINDS}, got {self.growth!r}")
        if self.init not in INIT_KINDS:
            raise ValueError(f"OVQ: init must be one of {INIT_KINDS}, got {self.init!r}")
        if self.state_grad not in STATE_GRAD_KINDS:
            raise ValueError(f"OVQ: state_grad must be one of {STATE_GRAD_KINDS}, got {self.state_grad!r}")
        if self.growth_alpha is not None and not self.growth_alpha > 0:
            raise ValueError(f"OVQ: growth_alpha must be > 0, got {self.growth_alpha}")
        if not self.growth_rate > 0:
            raise ValueError(f"OVQ: growth_rate must be > 0, got {self.growth_rate}")
        if int(self.recompute_chunks) < 0:
            raise ValueError(f"OVQ: recompute_chunks must be >= 0 (0 = off), got {self.recompute_chunks}")
        tau = self.novelty_threshold
        if tau is not None and not -1.0 <= float(tau) < 1.0:
            raise ValueError(f"OVQ: novelty_threshold must be a cosine in [-1, 1) or null, got {tau}")
        if self.when_full not in WHEN_FULL_KINDS:
            raise ValueError(f"OVQ: when_full must be one of {WHEN_FULL_KINDS}, got {self.when_full!r}")
        if tau is None and self.growth == "novelty":
            raise ValueError("OVQ: growth 'novelty' needs novelty_threshold (the cosine below which a key opens a slot)")
        if tau is None and self.when_full != "none":
            raise ValueError(f"OVQ: when_full {self.when_full!r} needs novelty_threshold (which keys are novel)")
        if tau is not None and self.init != "spread":
            raise ValueError("OVQ: novelty_threshold needs init 'spread' (novel keys are the least similar ones)")
        if not 0.0 < float(self.count_decay) <= 1.0:
            raise ValueError(f"OVQ: count_decay must be in (0, 1] (1 = off), got {self.count_decay}")
        if self.count_cap is not None and not float(self.count_cap) >= 1.0:
            raise ValueError(f"OVQ: count_cap must be >= 1 or null, got {self.count_cap}")


@dataclasses.dataclass
class OVQState(MixerState):
    """Per-lane, per-head OVQ memory.

    keys: [B, H, N, Dk] unit-norm key centroids (rows >= n_active are zero).
    values: [B, H, N, Dv] value centroids (running means).
    counts: [B, H, N] keys absorbed by each slot (float; 0 = slot unused).
    pending_keys: [B, H, P, Dk] normalised keys of the unfinished chunk, P < L.
    pending_values: [B, H, P, Dv].
    seen: tokens absorbed into the dictionary (a multiple of L; the same for every lane).
    n_active: active slots, the prefix [0, n_active) (the same for every lane and head). With the
        plasticity rules each lane and head uses its own prefix (counts > 0) and n_active is the
        longest; the slots beyond a lane's prefix have count 0 (log count -inf: never read).
    merges, evictions: slots freed by ``when_full`` so far, summed over lanes and heads.
    """

    keys: torch.Tensor
    values: torch.Tensor
    counts: torch.Tensor
    pending_keys: torch.Tensor
    pending_values: torch.Tensor
    seen: int = 0
    n_active: int = 0
    merges: int = 0
    evictions: int = 0

    LANE_REDUCTIONS = {"n_active": "max", "merges": "sum", "evictions": "sum"}

    @property
    def tokens_seen(self) -> int:
        """Tokens absorbed plus tokens pending."""
        return self.seen + self.pending_keys.shape[2]


def empty_ovq_state(
    batch_size: int, n_heads: int, num_slots: int, key_dim: int, value_dim: int,
    device=None, dtype: torch.dtype = torch.float32,
) -> OVQState:
    return OVQState(
        keys=torch.zeros(batch_size, n_heads, num_slots, key_dim, device=device, dtype=dtype),
        values=torch.zeros(batch_size, n_heads, num_slots, value_dim, device=device, dtype=dtype),
        counts=torch.zeros(batch_size, n_heads, num_slots, device=device, dtype=dtype),
        pending_keys=torch.zeros(batch_size, n_heads, 0, key_dim, device=device, dtype=dtype),
        pending_values=torch.zeros(batch_size, n_heads, 0, value_dim, device=device, dtype=dtype),
    )


# ----------------------------------------------------------------------------------------- growth

def growth_curve(t: float, params: OVQParams) -> float:
    """G(t): the (real-valued) number of slots the dictionary should have after t tokens."""
    n = params.num_slots
    if params.growth == "novelty":
        return 0.0
    if params.growth == "linear":
        return min(float(n), params.growth_rate * t)
    alpha = float(params.growth_alpha if params.growth_alpha is not None else n)
    return n * (1.0 - (1.0 + t / alpha) ** (-alpha / n))


def growth_target(t: int, params: OVQParams) -> int:
    """Active slots wanted after absorbing t tokens: ``min(N, ceil(G(t)))`` (0 for "novelty")."""
    if params.growth == "novelty":
        return 0
    # The tiny slack keeps ceil() from jumping on float noise when G(t) is an exact integer.
    return min(params.num_slots, int(math.ceil(growth_curve(t, params) - 1e-9)))


def random_init_select(k: torch.Tensor, m: int, seed: int, seen: int) -> torch.Tensor:
    """m distinct chunk positions per lane and head, drawn from a generator seeded by (seed, seen)."""
    gen = torch.Generator(device=k.device)
    gen.manual_seed((seed * 1_000_003 + seen) % (2**63 - 1))
    noise = torch.rand(k.shape[:3], generator=gen, device=k.device)
    return noise.argsort(dim=-1)[..., :m]
