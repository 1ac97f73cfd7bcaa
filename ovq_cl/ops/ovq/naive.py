"""OVQ attention, plain PyTorch reference (chunked, and token by token).

Notation (see ``shared/design/ovq-attention.md``): per lane b and head h the state holds a key
dictionary ``D_k`` [N, Dk] (unit rows), a value dictionary ``D_v`` [N, Dv], counts ``c`` [N] and the
keys/values of the unfinished chunk (the pending buffer, fewer than L tokens). Active slots are always
a prefix ``[0, n_active)`` of the dictionary, so every read can slice instead of masking.

A chunk of L queries reads ``softmax([beta Q D_k^T + log c | beta Q K^T (causal)]) [D_v ; V]``; after
the read the chunk is absorbed: growth -> spread-maximising init of the new slots -> hard assignment
of every other key -> one online batch k-means step. All pieces are small pure functions so that
tests can check each one against a known answer.

Chunk boundaries are aligned to tokens absorbed (multiples of L counted from the first token the
state ever saw), which is why one call, several calls split anywhere, and token-by-token decoding
all give the same outputs.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

import torch

from ovq_cl.ops.common import check_head_vector, check_qkv, check_state_shape, compute_dtype, l2norm
from ovq_cl.ops.dictionary import dictionary_chunk_read, scatter_mean_update
from ovq_cl.state import MixerState

GROWTH_KINDS = ("plateau", "linear")
INIT_KINDS = ("spread", "random")
STATE_GRAD_KINDS = ("full", "detach")


@dataclasses.dataclass(frozen=True)
class OVQParams:
    """Hyper-parameters of the OVQ op (everything but the tensors).

    num_slots: N, dictionary size per head.
    chunk_size: L, tokens per chunk (read and absorbed together).
    growth: "plateau" (``min(N, ceil(G(t)))``, ``G(t) = N (1 - (1 + t/alpha)^(-alpha/N))``) or
        "linear" (``min(N, ceil(rate t))``).
    growth_alpha: alpha of the plateau (None -> N, i.e. ``G(t) = N t / (N + t)``).
    growth_rate: slope of the linear growth.
    init: "spread" (keys least similar to the active centroids become new slots) or "random".
    state_grad: "full" (autograd flows through the dictionary within one call) or "detach".
    init_seed: seed of the "random" init; the generator is re-seeded per chunk from (seed, tokens
        absorbed) so that chunked and token-by-token decoding draw the same numbers.
    """

    num_slots: int
    chunk_size: int
    growth: str = "plateau"
    growth_alpha: Optional[float] = None
    growth_rate: float = 1.0
    init: str = "spread"
    state_grad: str = "full"
    init_seed: int = 0

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


@dataclasses.dataclass
class OVQState(MixerState):
    """Per-lane, per-head OVQ memory.

    keys: [B, H, N, Dk] unit-norm key centroids (rows >= n_active are zero).
    values: [B, H, N, Dv] value centroids (running means).
    counts: [B, H, N] keys absorbed by each slot (float; 0 = slot unused).
    pending_keys: [B, H, P, Dk] normalised keys of the unfinished chunk, P < L.
    pending_values: [B, H, P, Dv].
    seen: tokens absorbed into the dictionary (a multiple of L; the same for every lane).
    n_active: active slots, the prefix [0, n_active) (the same for every lane and head).
    """

    keys: torch.Tensor
    values: torch.Tensor
    counts: torch.Tensor
    pending_keys: torch.Tensor
    pending_values: torch.Tensor
    seen: int = 0
    n_active: int = 0

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
    if params.growth == "linear":
        return min(float(n), params.growth_rate * t)
    alpha = float(params.growth_alpha if params.growth_alpha is not None else n)
    return n * (1.0 - (1.0 + t / alpha) ** (-alpha / n))


def growth_target(t: int, params: OVQParams) -> int:
    """Active slots wanted after absorbing t tokens: ``min(N, ceil(G(t)))``."""
    # The tiny slack keeps ceil() from jumping on float noise when G(t) is an exact integer.
    return min(params.num_slots, int(math.ceil(growth_curve(t, params) - 1e-9)))


# ------------------------------------------------------------------------------------- the update

def spread_init_select(k: torch.Tensor, dict_keys: torch.Tensor, m: int) -> torch.Tensor:
    """Indices of the m chunk keys least similar to the active centroids.

    k: [B, H, L, Dk]; dict_keys: [B, H, n, Dk] active centroids (n may be 0: all keys tie).
    ``s_i = max_n k_i . D_k[n]``; the m smallest s_i win, ties broken by position (earliest first).
    Returns [B, H, m] int64.
    """
    if dict_keys.shape[2] == 0:
        s = torch.zeros(k.shape[:3], device=k.device, dtype=k.dtype)
    else:
        s = (k @ dict_keys.transpose(-1, -2)).amax(dim=-1)
    return torch.sort(s, dim=-1, stable=True).indices[..., :m]


def random_init_select(k: torch.Tensor, m: int, seed: int, seen: int) -> torch.Tensor:
    """m distinct chunk positions per lane and head, drawn from a generator seeded by (seed, seen)."""
    gen = torch.Generator(device=k.device)
    gen.manual_seed((seed * 1_000_003 + seen) % (2**63 - 1))
    noise = torch.rand(k.shape[:3], generator=gen, device=k.device)
    return noise.argsort(dim=-1)[..., :m]


def assign_to_slots(k: torch.Tensor, dict_keys: torch.Tensor) -> torch.Tensor:
    """Hard assignment: ``argmax_n k_i . D_k[n]`` (first index on ties). [B, H, L] int64."""
    return (k @ dict_keys.transpose(-1, -2)).argmax(dim=-1)


def kmeans_merge(
    keys: torch.Tensor, values: torch.Tensor, counts: torch.Tensor,
    slot: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One online batch k-means step (a gather and a scatter-add; rows not hit stay bitwise equal).

    keys, values, counts: [B, H, N, Dk], [B, H, N, Dv], [B, H, N].
    slot: [B, H, L] target slot per key; a value of N means "skip this key".
    k, v: [B, H, L, Dk], [B, H, L, Dv].
    ``D_v[n] <- (c_n D_v[n] + sum v_i) / (c_n + m_n)`` (the Newton step on the mixture NLL),
    ``D_k[n] <- normalise(c_n D_k[n] + sum k_i)``, ``c_n <- c_n + m_n``.
    """
    new_values, new_counts, sum_k = scatter_mean_update(values, counts, slot, v, also_sum=k)
    touched = (new_counts > counts).unsqueeze(-1)
    new_keys = torch.where(touched, l2norm(counts.unsqueeze(-1) * keys + sum_k), keys)
    return new_keys, new_values, new_counts


def absorb_chunk(state: OVQState, k: torch.Tensor, v: torch.Tensor, params: OVQParams) -> OVQState:
    """Absorbs one full chunk into the dictionary: growth, init of new slots, assignment, k-means.

    state: the dictionary before the chunk (its pending buffer is ignored and returned unchanged).
    k: [B, H, Lc, Dk] normalised keys; v: [B, H, Lc, Dv].
    """
    n_slots = params.num_slots
    lc = k.shape[2]
    n_active = state.n_active
    n_new = min(growth_target(state.seen + lc, params) - n_active, lc)
    n_new = max(n_new, 0)
    keys, values, counts = state.keys, state.values, state.counts
    is_new = torch.zeros(k.shape[:3], dtype=torch.bool, device=k.device)
    if n_new > 0:
        if params.init == "spread":
            chosen = spread_init_select(k, keys[:, :, :n_active], n_new)
        else:
            chosen = random_init_select(k, n_new, params.init_seed, state.seen)
        new_k = torch.gather(k, 2, chosen.unsqueeze(-1).expand(-1, -1, -1, k.shape[-1]))
        new_v = torch.gather(v, 2, chosen.unsqueeze(-1).expand(-1, -1, -1, v.shape[-1]))
        hi = n_active + n_new
        keys = torch.cat([keys[:, :, :n_active], new_k, keys[:, :, hi:]], dim=2)
        values = torch.cat([values[:, :, :n_active], new_v, values[:, :, hi:]], dim=2)
        counts = torch.cat([counts[:, :, :n_active], torch.ones_like(counts[:, :, :n_new]), counts[:, :, hi:]], dim=2)
        is_new = is_new.scatter(2, chosen, True)
        n_active = hi
    slot = assign_to_slots(k, keys[:, :, :n_active])
    slot = slot.masked_fill(is_new, n_slots)
    keys, values, counts = kmeans_merge(keys, values, counts, slot, k, v)
    return dataclasses.replace(
        state, keys=keys, values=values, counts=counts, seen=state.seen + lc, n_active=n_active
    )


# ------------------------------------------------------------------------------------ entry points

def _prepare(q, k, v, beta, params, initial_state, op):
    check_qkv(q, k, v, op)
    bsz, _, heads, dk = q.shape
    dv = v.shape[-1]
    check_head_vector(beta, heads, "beta", op)
    dtype = compute_dtype(q.dtype)
    if initial_state is None:
        state = empty_ovq_state(bsz, heads, params.num_slots, dk, dv, device=q.device, dtype=dtype)
    else:
        n = params.num_slots
        check_state_shape("keys", initial_state.keys, (bsz, heads, n, dk), op)
        check_state_shape("values", initial_state.values, (bsz, heads, n, dv), op)
        check_state_shape("counts", initial_state.counts, (bsz, heads, n), op)
        if initial_state.pending_keys.shape[2] >= params.chunk_size:
            raise ValueError(
                f"{op}: initial_state has {initial_state.pending_keys.shape[2]} pending tokens, "
                f"but chunk_size is {params.chunk_size}"
            )
        state = initial_state.detach().to(dtype=dtype)
    qn = l2norm(q.to(dtype)).transpose(1, 2)
    kn = l2norm(k.to(dtype)).transpose(1, 2)
    vt = v.to(dtype).transpose(1, 2)
    return state, qn, kn, vt, beta.to(dtype)


def _maybe_detach(state: OVQState, params: OVQParams) -> OVQState:
    return state.detach() if params.state_grad == "detach" else state


def ovq_attention_chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, params: OVQParams,
    initial_state: Optional[OVQState] = None, output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[OVQState]]:
    """Chunked OVQ attention (the reference the fast kernels are tested against).

    q, k: [B, T, H, Dk] (normalised inside); v: [B, T, H, Dv]; beta: [H] > 0.
    initial_state: the state returned by a previous call (detached here), or None for a fresh one.
    Returns o [B, T, H, Dv] (dtype of q) and the final state (None unless output_final_state).
    """
    state, qn, kn, vt, beta = _prepare(q, k, v, beta, params, initial_state, "ovq_attention")
    n_pending = state.pending_keys.shape[2]
    k_all = torch.cat([state.pending_keys, kn], dim=2)
    v_all = torch.cat([state.pending_values, vt], dim=2)
    total, L = k_all.shape[2], params.chunk_size
    outputs = []
    for start in range(0, total, L):
        end = min(start + L, total)
        q_start = max(start, n_pending)
        read_state = _maybe_detach(state, params)
        kc, vc = k_all[:, :, start:end], v_all[:, :, start:end]
        n = read_state.n_active
        outputs.append(dictionary_chunk_read(
            qn[:, :, q_start - n_pending:end - n_pending], kc, vc,
            read_state.keys[:, :, :n], read_state.values[:, :, :n], read_state.counts[:, :, :n].log(),
            beta, q_offset=q_start - start,
        ))
        if end - start == L:
            if params.state_grad == "detach":
                kc, vc = kc.detach(), vc.detach()
            state = absorb_chunk(read_state, kc, vc, params)
        else:
            state = dataclasses.replace(state, pending_keys=kc, pending_values=vc)
    if total % L == 0:
        state = dataclasses.replace(state, pending_keys=k_all[:, :, :0], pending_values=v_all[:, :, :0])
    o = torch.cat(outputs, dim=2).transpose(1, 2).to(q.dtype)
    return o, (state if output_final_state else None)


def ovq_attention_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, params: OVQParams,
    initial_state: Optional[OVQState] = None, output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[OVQState]]:
    """Token-by-token OVQ decoding (same signature as the chunked op).

    Each token reads the dictionary plus the pending buffer plus itself; the buffer is absorbed when
    it holds L tokens. An independent code path for the read, used to test the chunked one.
    """
    state, qn, kn, vt, beta = _prepare(q, k, v, beta, params, initial_state, "ovq_attention")
    b = beta.view(1, -1, 1)
    outputs = []
    for t in range(qn.shape[2]):
        pk = torch.cat([state.pending_keys, kn[:, :, t:t + 1]], dim=2)
        pv = torch.cat([state.pending_values, vt[:, :, t:t + 1]], dim=2)
        read_state = _maybe_detach(state, params)
        n = read_state.n_active
        qt = qn[:, :, t]                                                     # [B, H, Dk]
        s_loc = b * torch.einsum("bhd,bhpd->bhp", qt, pk)
        s_dict = b * torch.einsum("bhd,bhnd->bhn", qt, read_state.keys[:, :, :n]) + read_state.counts[:, :, :n].log()
        p = torch.softmax(torch.cat([s_dict, s_loc], dim=-1), dim=-1)
        o = torch.einsum("bhn,bhnd->bhd", p[..., :n], read_state.values[:, :, :n])
        o = o + torch.einsum("bhp,bhpd->bhd", p[..., n:], pv)
        outputs.append(o)
        if pk.shape[2] == params.chunk_size:
            if params.state_grad == "detach":
                pk, pv = pk.detach(), pv.detach()
            state = absorb_chunk(read_state, pk, pv, params)
            state = dataclasses.replace(state, pending_keys=pk[:, :, :0], pending_values=pv[:, :, :0])
        else:
            state = dataclasses.replace(state, pending_keys=pk, pending_values=pv)
    o = torch.stack(outputs, dim=2).transpose(1, 2).to(q.dtype)
    return o, (state if output_final_state else None)
