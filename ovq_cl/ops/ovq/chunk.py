"""OVQ attention, chunked, in fast PyTorch: the CPU path, and the loop the Triton kernels plug into.

Notation in :mod:`ovq_cl.ops.ovq.common`. Active slots are a prefix ``[0, n_active)`` of the
dictionary, so every read can slice instead of masking. The plain oracle these are tested against is
:mod:`ovq_cl.ops.ovq.naive`.

A chunk of L queries reads ``softmax([beta Q D_k^T + log c | beta Q K^T (causal)]) [D_v ; V]``; after
the read the chunk is absorbed: growth -> spread-maximising init of the new slots -> hard assignment
of every other key -> one online batch k-means step. All pieces are small pure functions so that
tests can check each one against a known answer.

Chunk boundaries are aligned to tokens absorbed (multiples of L counted from the first token the
state ever saw), which is why one call, several calls split anywhere, and token-by-token decoding
all give the same outputs.

The chunk loop (:func:`ovq_chunk_loop`) takes its per-chunk work from a bundle of primitives
(:class:`OVQPrimitives`: the read, the max / argmax over the dictionary, the k-means merge);
:data:`REFERENCE` is the PyTorch one (this module), ``ovq_cl.ops.ovq.triton.TRITON`` the kernels.
The loop runs once per chunk, batched over lanes and heads, never per token. Without autograd
(inference) the dictionary is copied once per call and then updated in place, touching only the
rows the chunk's keys hit; with autograd every update is functional, so gradients flow through the
state across chunks (``state_grad="full"``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional, Tuple

import torch

from ovq_cl.ops.common import check_head_vector, check_qkv, check_state_shape, compute_dtype, l2norm
from ovq_cl.ops.ovq.common import OVQParams, OVQState, empty_ovq_state, growth_target, random_init_select
from ovq_cl.ops.ovq.plasticity import absorb_chunk_plastic, masked_best
from ovq_cl.ops.ovq.threads import loop_threads
from ovq_cl.ops.recompute import recomputed, segment_runs

# ------------------------------------------------------------------------- per-chunk primitives

def chunk_read(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    dict_keys: torch.Tensor, dict_values: torch.Tensor, log_counts: torch.Tensor,
    beta: torch.Tensor, q_offset: int = 0,
) -> torch.Tensor:
    """The OVQ read, same contract and result as :func:`~ovq_cl.ops.dictionary.dictionary_chunk_read`.

    ``softmax([beta Q D_k^T + log c | beta Q K^T (causal)]) [D_v ; V]``, computed with fewer and
    cheaper passes over the [Lq, n] scores (the CPU cost of the op once the matmuls are counted):
    the scores are kept in base 2 (beta log2(e) scales the Lq queries, not the Lq x n scores, and
    log2 c enters as the bias of the matmul, baddbmm), so the exponential is ``exp2``, about 3x
    cheaper than ``exp`` on CPU; the two blocks share one max and are exponentiated in place, with no
    [Lq, n + Lc] concatenation nor strided slices of it; the two value products accumulate into one
    output (baddbmm). The max is a constant for autograd (the softmax does not depend on it), so the
    gradients are exact.

    q: [B, H, Lq, Dk]; k, v: [B, H, Lc, Dk], [B, H, Lc, Dv]; dict_keys, dict_values: [B, H, n, *];
    log_counts: [B, H, n] (-inf = empty slot); beta: [H]; query i sits at local position q_offset + i.
    Returns [B, H, Lq, Dv].
    """
    bsz, heads, lq, dk = q.shape
    n_local, dv, n = k.shape[2], v.shape[-1], dict_keys.shape[2]
    bh = bsz * heads
    qb = (q * (beta * _LOG2E).view(1, -1, 1, 1).to(q.dtype)).reshape(bh, lq, dk)
    s_loc = torch.bmm(qb, k.reshape(bh, n_local, dk).transpose(-1, -2))
    s_loc = s_loc.masked_fill_(_above_diagonal(lq, n_local, q_offset, q.device), float("-inf"))
    vl = v.reshape(bh, n_local, dv)
    if n == 0:
        top = s_loc.detach().amax(-1, keepdim=True)
        e_loc = s_loc.sub_(top).exp2_()
        return (torch.bmm(e_loc, vl) / e_loc.sum(-1, keepdim=True)).view(bsz, heads, lq, dv)
    s_dict = torch.baddbmm(
        (log_counts * _LOG2E).reshape(bh, 1, n).to(q.dtype), qb, dict_keys.reshape(bh, n, dk).transpose(-1, -2)
    )
    top = torch.maximum(s_dict.detach().amax(-1, keepdim=True), s_loc.detach().amax(-1, keepdim=True))
    e_dict = s_dict.sub_(top).exp2_()
    e_loc = s_loc.sub_(top).exp2_()
    z = e_dict.sum(-1, keepdim=True) + e_loc.sum(-1, keepdim=True)
    o = torch.baddbmm(torch.bmm(e_loc, vl), e_dict, dict_values.reshape(bh, n, dv))
    return (o / z).view(bsz, heads, lq, dv)


_LOG2E = 1.0 / math.log(2.0)


@functools.lru_cache(maxsize=64)
def _above_diagonal(lq: int, n_local: int, q_offset: int, device: torch.device) -> torch.Tensor:
    """[lq, n_local] bool, True where the key is in the future of the query (j > q_offset + i)."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.ones(lq, n_local, dtype=torch.bool, device=device).triu_(1 + q_offset)


def max_similarity(k: torch.Tensor, dict_keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``max_n k_i . D_k[n]`` and its argmax (first index on ties), one pass over the dictionary.

    k: [B, H, L, Dk]; dict_keys: [B, H, n, Dk] with n >= 1. Returns ([B, H, L], [B, H, L] int64).
    """
    return first_argmax(k @ dict_keys.transpose(-1, -2))


def masked_max_similarity(k: torch.Tensor, dict_keys: torch.Tensor, n_active: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`max_similarity` over the slots ``[0, n_active)`` of the whole dictionary, the others -inf.

    k: [B, H, L, Dk]; dict_keys: [B, H, N, Dk]; n_active: 0-d int64 on the device. Returns (max, first
    argmax), both [B, H, L]; (-inf, 0) where no slot is active."""
    return masked_best(k, dict_keys, _arange(dict_keys.shape[2], k.device) < n_active)


def first_argmax(s: torch.Tensor, block: int = 64) -> Tuple[torch.Tensor, torch.Tensor]:
    """``s.max(-1)`` (values, first index of the max) for a contiguous s [..., n], faster on CPU.

    The indexed max is a slow scalar reduction on CPU; the plain max (amax) is vectorised. So: amax
    over blocks of 64 columns, the indexed max over the n / 64 block maxima (the first block holding
    the max), then the indexed max inside that block; the < 64 leftover columns are compared last
    and win only when strictly larger, which keeps the first index on ties.
    """
    n = s.shape[-1]
    nb = n // block
    if nb == 0 or not s.is_contiguous() or s.is_cuda:
        return s.max(dim=-1)
    lead = s.shape[:-1]
    main = s[..., : nb * block].view(*lead, nb, block)
    best, bi = main.amax(-1).max(dim=-1)
    inside = main.gather(-2, bi.view(*lead, 1, 1).expand(*lead, 1, block)).squeeze(-2).argmax(-1)
    arg = bi * block + inside
    if nb * block < n:
        rest_best, rest_arg = s[..., nb * block:].max(dim=-1)
        later = rest_best > best
        best = torch.where(later, rest_best, best)
        arg = torch.where(later, rest_arg + nb * block, arg)
    return best, arg


def sparse_kmeans_merge(
    keys: torch.Tensor, values: torch.Tensor, counts: torch.Tensor,
    slot: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inplace: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k-means step of :func:`kmeans_merge` touching only the rows the chunk's keys hit.

    Everything is computed per key of the chunk: the [L, L] "same slot" matrix gives each key the
    number m of chunk keys merged into its slot and their sums of keys and values (no N-sized
    buffer); each key gathers its slot's row, computes the new row, and scatter-adds 1/m of the
    change, so duplicates add up to the change once. Cost O(L^2 d + L d), independent of N. With
    ``inplace`` the state tensors are updated in place (no autograd); otherwise new tensors are
    returned (one copy of the state, which autograd needs anyway).
    """
    bsz, heads, n_slots, dk = keys.shape
    merged = slot < n_slots
    idx = torch.where(merged, slot, torch.zeros_like(slot))
    w = merged.to(k.dtype)
    rows = _RowView(keys, values, counts, idx)
    if inplace and rows.flat is not None:
        return _merge_in_place(keys, values, counts, rows.flat, w, k, v)
    same = (idx.unsqueeze(-1) == idx.unsqueeze(-2)).to(k.dtype) * w.unsqueeze(-1) * w.unsqueeze(-2)
    m = same.sum(-1)                                                    # keys of the chunk in my slot (0: skipped)
    c_old, k_old, v_old = rows.gather()
    c_old = c_old.to(k.dtype)
    c = c_old.unsqueeze(-1)
    new_k = l2norm(c * k_old + same @ k)
    new_v = (c * v_old + same @ v) / (c_old + m).clamp_min(1.0).unsqueeze(-1)
    share = (w / m.clamp_min(1.0)).unsqueeze(-1)
    return rows.add((new_k - k_old) * share, (new_v - v_old) * share, w.to(counts.dtype), inplace)


def _merge_in_place(keys, values, counts, flat, w, k, v):
    """:func:`sparse_kmeans_merge` in place on contiguous state tensors, in fewer, cheaper steps: the
    counts first (``c + m`` per key), then every key adds ``(x_i - row) / (c + m)`` to its row (the
    running mean, exact), then the touched key rows are renormalised (each duplicate adds 1/m of the
    change). flat: [B*H*L] row of each key in the [B*H*N, *] views; w: 1 = merge, 0 = skip."""
    dk, dv = keys.shape[-1], values.shape[-1]
    kf, vf, cf = keys.view(-1, dk), values.view(-1, dv), counts.view(-1)
    wf = w.reshape(-1)
    c_old = cf.index_select(0, flat)
    cf.index_add_(0, flat, wf.to(cf.dtype))
    c_new = cf.index_select(0, flat).to(k.dtype)
    step = (wf / c_new.clamp_min(1.0)).unsqueeze(-1)
    k_rows, v_rows = kf.index_select(0, flat), vf.index_select(0, flat)
    vf.index_add_(0, flat, (v.reshape(-1, dv) - v_rows) * step)
    kf.index_add_(0, flat, (k.reshape(-1, dk) - k_rows) * step)
    k_rows = kf.index_select(0, flat)
    share = (wf / (c_new - c_old.to(k.dtype)).clamp_min(1.0)).unsqueeze(-1)
    kf.index_add_(0, flat, (l2norm(k_rows) - k_rows) * share)
    return keys, values, counts


class _RowView:
    """Gathers and scatter-adds rows ``idx`` [B, H, L] of the state's [B, H, N, *] tensors: through a
    flat [B * H * N, *] view (index_select / index_add, much cheaper on CPU) when the tensors are
    contiguous, through gather / scatter_add otherwise."""

    def __init__(self, keys, values, counts, idx):
        self.keys, self.values, self.counts, self.idx = keys, values, counts, idx
        bsz, heads, n_slots, _ = keys.shape
        self.flat = None
        if keys.is_contiguous() and values.is_contiguous() and counts.is_contiguous():
            base = torch.arange(bsz * heads, device=idx.device).view(bsz, heads, 1) * n_slots
            self.flat = (idx + base).reshape(-1)

    def gather(self):
        keys, values, counts, idx = self.keys, self.values, self.counts, self.idx
        shape = idx.shape
        if self.flat is not None:
            f = self.flat
            return (counts.view(-1).index_select(0, f).view(shape),
                    keys.view(-1, keys.shape[-1]).index_select(0, f).view(*shape, -1),
                    values.view(-1, values.shape[-1]).index_select(0, f).view(*shape, -1))
        return (counts.gather(2, idx),
                keys.gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])),
                values.gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, values.shape[-1])))

    def add(self, dk, dv, dc, inplace):
        keys, values, counts, idx = self.keys, self.values, self.counts, self.idx
        if self.flat is not None:
            f = self.flat
            kf, vf, cf = keys.view(-1, keys.shape[-1]), values.view(-1, values.shape[-1]), counts.view(-1)
            dk, dv, dc = dk.reshape(-1, dk.shape[-1]), dv.reshape(-1, dv.shape[-1]), dc.reshape(-1)
            if inplace:
                kf.index_add_(0, f, dk)
                vf.index_add_(0, f, dv)
                cf.index_add_(0, f, dc)
                return keys, values, counts
            return (kf.index_add(0, f, dk).view_as(keys), vf.index_add(0, f, dv).view_as(values),
                    cf.index_add(0, f, dc).view_as(counts))
        ik = idx.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
        iv = idx.unsqueeze(-1).expand(-1, -1, -1, values.shape[-1])
        if inplace:
            return keys.scatter_add_(2, ik, dk), values.scatter_add_(2, iv, dv), counts.scatter_add_(2, idx, dc)
        return keys.scatter_add(2, ik, dk), values.scatter_add(2, iv, dv), counts.scatter_add(2, idx, dc)


@dataclasses.dataclass(frozen=True)
class OVQPrimitives:
    """The per-chunk work of the chunk loop, as swappable functions (the loop itself is shared).

    read: the chunk read, with the contract of :func:`chunk_read` / ``dictionary_chunk_read``.
    max_similarity: ``(k [B, H, L, Dk], dict_keys [B, H, n >= 1, Dk]) -> (max, argmax)`` over the
        dictionary, both [B, H, L] (argmax int64, first index on ties); serves the spread init and
        the assignment.
    merge: the k-means step with the contract of :func:`sparse_kmeans_merge` (``inplace`` flag last).
    masked_max_similarity: the same over the whole dictionary with slots ``>= n_active`` (a 0-d device
        tensor) masked, for the static loop (:func:`masked_max_similarity`); the same kernel as
        ``max_similarity`` where there is one, so both loops take the same decisions.
    """

    name: str
    read: Callable[..., torch.Tensor]
    max_similarity: Callable[[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]
    merge: Callable[..., Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    masked_max_similarity: Callable[..., Tuple[torch.Tensor, torch.Tensor]] = None

    def __post_init__(self) -> None:
        if self.masked_max_similarity is None:
            object.__setattr__(self, "masked_max_similarity", masked_max_similarity)


REFERENCE = OVQPrimitives("reference", chunk_read, max_similarity, sparse_kmeans_merge)


# ------------------------------------------------------------------------------------- the update

def _least_similar(s: torch.Tensor, m: int) -> torch.Tensor:
    """The m positions with the smallest s (ties by position). s: [B, H, L] -> [B, H, m] int64."""
    return torch.sort(s, dim=-1, stable=True).indices[..., :m]


def new_slots(seen: int, n_active: int, n_local: int, params: OVQParams) -> int:
    """Slots the schedule opens when a chunk of ``n_local`` keys is absorbed after ``seen`` tokens with
    ``n_active`` slots: ``clamp(target(seen + n_local) - n_active, 0, n_local)``. A function of token
    counts only (never of the data), so the whole loop's shapes are known before it starts."""
    return max(min(growth_target(seen + n_local, params) - n_active, n_local), 0)


def _absorb(
    state: OVQState, k: torch.Tensor, v: torch.Tensor, params: OVQParams, prims: OVQPrimitives, inplace: bool,
) -> OVQState:
    """:func:`absorb_chunk` on the given primitives; ``inplace`` writes into the state's tensors.

    One pass over the active dictionary (``prims.max_similarity``) serves both the spread init (the
    max) and the assignment (the argmax); the assignment then only compares against the m new slots:
    a new slot wins when strictly closer, which is ``argmax`` over [old | new] with first index on ties.
    With any plasticity rule on, the functional per-lane update of :mod:`~ovq_cl.ops.ovq.plasticity`.
    """
    if params.plastic:
        return absorb_chunk_plastic(state, k, v, params, prims.merge)
    n_slots, n_local = params.num_slots, k.shape[2]
    n_active = state.n_active
    n_new = new_slots(state.seen, n_active, n_local, params)
    keys, values, counts = state.keys, state.values, state.counts
    kd = k.detach()
    if n_active > 0:
        best, slot = prims.max_similarity(kd, keys[:, :, :n_active].detach())
        best = best.to(kd.dtype)
    else:
        best = kd.new_full(kd.shape[:3], float("-inf"))
        slot = torch.zeros(kd.shape[:3], dtype=torch.int64, device=kd.device)
    if n_new > 0:
        if params.init == "spread":
            chosen = _least_similar(best if n_active > 0 else torch.zeros_like(best), n_new)
        else:
            chosen = random_init_select(k, n_new, params.init_seed, state.seen)
        new_k = torch.gather(k, 2, chosen.unsqueeze(-1).expand(-1, -1, -1, k.shape[-1]))
        new_v = torch.gather(v, 2, chosen.unsqueeze(-1).expand(-1, -1, -1, v.shape[-1]))
        hi = n_active + n_new
        if inplace:
            keys[:, :, n_active:hi] = new_k
            values[:, :, n_active:hi] = new_v
            counts[:, :, n_active:hi] = 1.0
        else:
            keys = keys.slice_scatter(new_k, dim=2, start=n_active, end=hi)
            values = values.slice_scatter(new_v, dim=2, start=n_active, end=hi)
            counts = counts.slice_scatter(torch.ones_like(counts[:, :, :n_new]), dim=2, start=n_active, end=hi)
        best_new, arg_new = (kd @ new_k.detach().transpose(-1, -2)).max(dim=-1)
        slot = torch.where(best_new > best, arg_new + n_active, slot)
        slot = slot.scatter(2, chosen, n_slots)                         # new centroids are not merged again
        n_active = hi
    keys, values, counts = prims.merge(keys, values, counts, slot, k, v, inplace)
    return dataclasses.replace(
        state, keys=keys, values=values, counts=counts, seen=state.seen + n_local, n_active=n_active
    )


def absorb_chunk(state: OVQState, k: torch.Tensor, v: torch.Tensor, params: OVQParams) -> OVQState:
    """Absorbs one full chunk into the dictionary: growth, init of new slots, assignment, k-means.

    state: the dictionary before the chunk (its pending buffer is ignored and returned unchanged).
    k: [B, H, Lc, Dk] normalised keys; v: [B, H, Lc, Dv]. The state's tensors are not modified.
    """
    return _absorb(state, k, v, params, REFERENCE, inplace=False)


def _absorb_static(
    state: OVQState, k: torch.Tensor, v: torch.Tensor, params: OVQParams, prims: OVQPrimitives, inplace: bool,
) -> OVQState:
    """:func:`_absorb` with the same shapes in every chunk: the result of the dynamic update, computed
    over the whole dictionary [B, H, N, *] with the inactive slots masked, never over a slice of it.

    The chunk's n_active and n_new (host ints of the schedule) enter only as cached 0-d device tensors,
    so every chunk runs the same kernels on the same shapes (what a captured CUDA graph needs):

    - similarity to every slot, inactive ones -inf (so max and first argmax are the dynamic ones);
    - the new slots' keys in rank order (``order``: least similar first for "spread", the seeded
      permutation for "random"); slot n_active + r takes the key of rank r < n_new, written with a
      ``where`` over the N rows (O(N d) per chunk, the read is O(L N d));
    - the assignment to the new slots: scores against the L keys in rank order, ranks >= n_new -inf.

    The similarity pass is the backend's masked argmax (``prims.masked_max_similarity``: on Triton
    the dynamic path's kernel with the inactive rows masked, so both loops compute the same dot
    products tile by tile and take the same decisions).

    With a plasticity rule on, :func:`~ovq_cl.ops.ovq.plasticity.absorb_chunk_plastic` as in the
    dynamic path (it already works on the whole dictionary, but reads its per-lane used-slot count
    and the maintenance flag back to the host once per chunk).
    """
    if params.plastic:
        return absorb_chunk_plastic(state, k, v, params, prims.merge)
    n_new = new_slots(state.seen, state.n_active, k.shape[2], params)
    order = None if params.init == "spread" else random_init_select(k, k.shape[2], params.init_seed, state.seen)
    keys, values, counts = absorb_static_tensors(
        state.keys, state.values, state.counts, k, v, _scalar(state.n_active, k.device), _scalar(n_new, k.device),
        params, prims, inplace, order)
    return dataclasses.replace(
        state, keys=keys, values=values, counts=counts, seen=state.seen + k.shape[2], n_active=state.n_active + n_new
    )


def absorb_static_tensors(
    keys: torch.Tensor, values: torch.Tensor, counts: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    n_active_t: torch.Tensor, n_new_t: torch.Tensor, params: OVQParams, prims: OVQPrimitives, inplace: bool,
    order: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tensor work of :func:`_absorb_static`, every input a tensor (what a captured graph replays).

    keys, values, counts: [B, H, N, *] before the chunk; k, v: [B, H, L, *]; n_active_t, n_new_t: 0-d
    int64 on the device (active slots before the chunk, slots the schedule opens); order: [B, H, L]
    the chunk positions by rank for the "random" init, None for "spread" (least similar first).
    Returns (keys, values, counts) after the chunk."""
    n_slots, n_local = params.num_slots, k.shape[2]
    dev = k.device
    kd = k.detach()
    slots = _arange(n_slots, dev)                                       # [N]
    active = slots < n_active_t                                         # [N] bool
    best, slot = prims.masked_max_similarity(kd, keys.detach(), n_active_t)   # no active slot: (-inf, 0)
    best = best.to(kd.dtype)
    if order is None:
        order = torch.sort(best, dim=-1, stable=True).indices           # all -inf: positions in order
    ranks = _arange(n_local, dev)                                       # [L]
    opens = ranks < n_new_t                                             # [L] by rank
    # the new rows: slot j in [n_active, n_active + n_new) takes the key of rank j - n_active
    is_new = active.logical_not() & (slots < n_active_t + n_new_t)      # [N]
    src = order.index_select(-1, (slots - n_active_t).clamp(0, n_local - 1))     # [B, H, N] chunk positions
    new_k = k.gather(2, src.unsqueeze(-1).expand(-1, -1, -1, k.shape[-1]))
    new_v = v.gather(2, src.unsqueeze(-1).expand(-1, -1, -1, v.shape[-1]))
    keys = torch.where(is_new.unsqueeze(-1), new_k, keys)
    values = torch.where(is_new.unsqueeze(-1), new_v, values)
    counts = torch.where(is_new, torch.ones_like(counts), counts)
    # every other key: a new slot wins when strictly closer (first index on ties, as [old | new])
    by_rank = kd.gather(2, order.unsqueeze(-1).expand(-1, -1, -1, kd.shape[-1]))
    best_new, arg_new = (kd @ by_rank.transpose(-1, -2)).masked_fill_(~opens, float("-inf")).max(dim=-1)
    slot = torch.where(best_new > best, arg_new + n_active_t, slot)
    taken = torch.zeros_like(order, dtype=torch.bool).scatter_(2, order, opens.expand_as(order))   # by position
    slot = torch.where(taken, torch.full_like(slot, n_slots), slot)     # new centroids are not merged again
    return prims.merge(keys, values, counts, slot, k, v, inplace)


@functools.lru_cache(maxsize=4096)
def _scalar(n: int, device: torch.device) -> torch.Tensor:
    """A cached 0-d int64 tensor holding n on ``device`` (no host-to-device copy per chunk)."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.tensor(n, dtype=torch.int64, device=device)


@functools.lru_cache(maxsize=64)
def _arange(n: int, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():
        return torch.arange(n, device=device)


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
    if _updates_in_place(q, k, v, beta):
        # no autograd: one heads-first copy per tensor, normalised in place (each full-sequence
        # temporary is a fresh allocation, i.e. page faults, once T x H x D passes ~32 MB)
        qn, kn = _heads_first(q, dtype), _heads_first(k, dtype)
        qn.div_(qn.norm(dim=-1, keepdim=True).clamp_min_(1e-6))
        kn.div_(kn.norm(dim=-1, keepdim=True).clamp_min_(1e-6))
    else:
        qn = l2norm(q.to(dtype)).transpose(1, 2).contiguous()
        kn = l2norm(k.to(dtype)).transpose(1, 2).contiguous()
    return state, qn, kn, _heads_first(v, dtype), beta.to(dtype)


def _heads_first(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, T, H, D] -> a new contiguous [B, H, T, D] in ``dtype`` (one pass, never a view of x)."""
    out = torch.empty(x.shape[0], x.shape[2], x.shape[1], x.shape[3], dtype=dtype, device=x.device)
    return out.copy_(x.transpose(1, 2))


def _maybe_detach(state: OVQState, params: OVQParams) -> OVQState:
    return state.detach() if params.state_grad == "detach" else state


def _updates_in_place(*tensors: torch.Tensor) -> bool:
    """True when no autograd graph is being recorded for this call: the dictionary may then be
    updated in place (after one private copy per call), so the update touches only the rows hit."""
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def _under_loop_threads(fn):
    """Runs ``fn(q, ...)`` under the CPU thread policy of :mod:`~ovq_cl.ops.ovq.threads` for q's device."""
    @functools.wraps(fn)
    def wrapper(q, *args, **kwargs):
        with loop_threads(q.device):
            return fn(q, *args, **kwargs)
    return wrapper


@_under_loop_threads
def ovq_chunk_loop(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, params: OVQParams,
    initial_state: Optional[OVQState] = None, output_final_state: bool = True,
    prims: OVQPrimitives = REFERENCE, static: bool = False, block_chunks: int = 0,
    capture: Optional[bool] = None,
) -> Tuple[torch.Tensor, Optional[OVQState]]:
    """The chunked OVQ op on the given per-chunk primitives (see :func:`ovq_attention_chunked`).

    ``static``: every chunk reads and updates the whole dictionary [B, H, N, *] with the inactive
    slots masked (log count -inf), so all full chunks run the same kernels on the same shapes and no
    per-chunk value depends on the data (:func:`_absorb_static`); the result equals the dynamic
    path's, which slices the active prefix (cheaper while the dictionary grows).

    ``block_chunks`` = S > 0 (with ``static``, in inference, schedule growth and "spread" init; see
    :mod:`~ovq_cl.ops.ovq.graphs`): runs of S aligned full chunks go through one block, a CUDA graph
    replay when ``capture`` (default: on CUDA devices), the same steps eagerly otherwise. Anything a
    block cannot take runs as above.

    No loop per token: one iteration per chunk of L tokens, batched over lanes and heads. Without
    autograd (inference, ``torch.no_grad``, or no input requiring grad) the state is copied once per
    call (only if a chunk is absorbed) and then updated in place; with autograd every update is
    functional, so the graph of ``state_grad="full"`` runs through all chunks (with
    ``params.recompute_chunks`` = S, only one chunk in S keeps its part of that graph).

    On CPU the loop runs under the thread policy of :mod:`~ovq_cl.ops.ovq.threads` (single-threaded
    while other processes hold cores: its many small ops would stall at OpenMP barriers); a backward
    pass runs later, under torch's own setting.
    """
    state, qn, kn, vt, beta = _prepare(q, k, v, beta, params, initial_state, "ovq_attention")
    inplace = _updates_in_place(q, k, v, beta)
    n_pending = state.pending_keys.shape[2]
    k_all = torch.cat([state.pending_keys, kn], dim=2) if n_pending else kn
    v_all = torch.cat([state.pending_values, vt], dim=2) if n_pending else vt
    total, L = k_all.shape[2], params.chunk_size
    starts = range(0, total, L)
    # one split per tensor (not a slice per chunk): autograd then joins the chunks' gradients once,
    # where per-chunk slices would each scatter into a zero tensor of the whole sequence (O(T^2))
    k_chunks, v_chunks = k_all.split(L, dim=2), v_all.split(L, dim=2)
    q_chunks = qn.split([min(s + L, total) - max(s, n_pending) for s in starts], dim=2)
    # the output, time-major [B, T, H, Dv] so that the caller's reshape to [B, T, H * Dv] is a view:
    # without autograd each chunk is copied into one buffer (a cat of 1000s of transposed chunks is
    # several times slower); with autograd the chunks are joined by one cat at the end
    out = q.new_empty(q.shape[:3] + (vt.shape[-1],)) if inplace else None
    chunks = [(max(start, n_pending) - start, qc, kc, vc)
              for start, qc, kc, vc in zip(starts, q_chunks, k_chunks, v_chunks)]
    step = functools.partial(_chunk_step, beta=beta, params=params, prims=prims, inplace=inplace, static=static)
    outputs = []
    if inplace:
        if total >= L:                            # a chunk will be absorbed: one private copy, then in place
            state = state.clone()
        q_pos, i = 0, 0
        blocks = _block_runs(chunks, L, block_chunks if static else 0, params, prims, q.device, capture)
        while i < len(chunks):
            if i in blocks:                         # S aligned full chunks x n: replays of one block
                n_c, replay = blocks[i]
                a, b = i * L, (i + n_c) * L          # no pending tokens before an aligned chunk: same positions
                o_seg, state = replay(state, qn[:, :, a - n_pending:b - n_pending], k_all[:, :, a:b], v_all[:, :, a:b], beta)
                out[:, q_pos:q_pos + b - a].copy_(o_seg.transpose(1, 2))
                q_pos, i = q_pos + b - a, i + n_c
                continue
            q_offset, qc, kc, vc = chunks[i]
            o_c, state = step(state, q_offset, qc, kc, vc)
            out[:, q_pos:q_pos + qc.shape[2]].copy_(o_c.transpose(1, 2))
            q_pos, i = q_pos + qc.shape[2], i + 1
    elif params.recompute_chunks:
        outputs, state = _recomputed_loop(state, chunks, beta, params, prims, static)
    else:
        for q_offset, qc, kc, vc in chunks:
            o_c, state = step(state, q_offset, qc, kc, vc)
            outputs.append(o_c)
    if total % L == 0:
        # fresh (empty) tensors: a view of k_all would keep the whole sequence's keys alive with the state
        state = dataclasses.replace(state, pending_keys=k_all.new_empty(k_all.shape[:2] + (0, k_all.shape[3])),
                                    pending_values=v_all.new_empty(v_all.shape[:2] + (0, v_all.shape[3])))
    o = out if out is not None else torch.cat([o_c.transpose(1, 2) for o_c in outputs], dim=1).to(q.dtype)
    return o, (state if output_final_state else None)


def _block_runs(chunks, L: int, block_chunks: int, params: OVQParams, prims: OVQPrimitives, device,
                capture: Optional[bool]):
    """{index of a chunk: (chunks taken, replay)} for the runs of aligned full chunks a graphed block
    of ``block_chunks`` takes (multiples of it); {} when blocks are off or cannot be used here."""
    from ovq_cl.ops.ovq import graphs

    S = int(block_chunks)
    if S <= 0 or not graphs.block_usable(params, grad=False)[0]:
        return {}
    capture = graphs.capture_available(device) if capture is None else bool(capture)
    if capture and not graphs.capture_available(device):
        raise ValueError(f"ovq_attention: CUDA graph capture needs a CUDA device, the inputs are on {device}")
    runs, i = {}, 0
    while i < len(chunks):
        j = i
        while j < len(chunks) and chunks[j][0] == 0 and chunks[j][1].shape[2] == chunks[j][2].shape[2] == L:
            j += 1
        n = (j - i) // S * S
        if n:
            runs[i] = (n, functools.partial(graphs.run_blocks, params=params, prims=prims, n_chunks=S, capture=capture))
        i = max(j, i + 1)
    return runs


def _chunk_step(
    state: OVQState, q_offset: int, qc: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, *,
    beta: torch.Tensor, params: OVQParams, prims: OVQPrimitives, inplace: bool, static: bool = False,
) -> Tuple[torch.Tensor, OVQState]:
    """One chunk: the read of its queries (local positions q_offset ..), then, for a full chunk, its
    absorption into the dictionary; a partial chunk becomes the pending buffer.
    qc: [B, H, Lq, Dk]; kc, vc: [B, H, Lc, *]. Returns (read [B, H, Lq, Dv], state after the chunk).
    ``static``: the read spans all N slots (empty ones have log count -inf, no weight) and the update
    is :func:`_absorb_static`."""
    read_state = _maybe_detach(state, params)
    n = params.num_slots if static else read_state.n_active
    o_c = prims.read(
        qc, kc, vc,
        read_state.keys[:, :, :n], read_state.values[:, :, :n], read_state.counts[:, :, :n].log(),
        beta, q_offset=q_offset,
    )
    if kc.shape[2] < params.chunk_size:                 # a copy: a view would keep the whole sequence alive
        return o_c, dataclasses.replace(state, pending_keys=kc.clone(), pending_values=vc.clone())
    if params.state_grad == "detach":
        kc, vc = kc.detach(), vc.detach()
    absorb = _absorb_static if static else _absorb
    return o_c, absorb(read_state, kc, vc, params, prims, inplace)


def _recomputed_loop(state: OVQState, chunks, beta, params: OVQParams, prims: OVQPrimitives, static: bool = False):
    """The training loop with ``recompute_chunks`` = S: runs of up to S full chunks whose queries
    start at the chunk's first position go through :func:`~ovq_cl.ops.recompute.recomputed`; the
    others (a first chunk continuing pending tokens, a last partial chunk) run as usual.
    Returns (reads, state)."""
    L = params.chunk_size
    step = functools.partial(_chunk_step, beta=beta, params=params, prims=prims, inplace=False, static=static)
    outputs = []
    eligible = [q_offset == 0 and qc.shape[2] == kc.shape[2] == L for q_offset, qc, kc, _ in chunks]
    for i, j, recompute in segment_runs(eligible, int(params.recompute_chunks)):
        if not recompute:                                             # not a plain full chunk: as usual
            o_c, state = step(state, *chunks[i])
            outputs.append(o_c)
            continue
        q_seg, k_seg, v_seg = (torch.cat([c[n] for c in chunks[i:j]], dim=2) for n in (1, 2, 3))
        info: dict = {}
        run = functools.partial(_run_segment, state.seen, state.n_active, state.pending_keys,
                                state.pending_values, params, prims, info, static)
        o_seg, keys, values, counts = recomputed(run, state.keys, state.values, state.counts, beta,
                                                 q_seg, k_seg, v_seg, non_differentiable=(3,))
        state = dataclasses.replace(state, keys=keys, values=values, counts=counts,
                                    seen=info["seen"], n_active=info["n_active"],
                                    merges=state.merges + info["merges"], evictions=state.evictions + info["evictions"])
        outputs.extend(o_seg.split(L, dim=2))
    return outputs, state


def _run_segment(seen, n_active, pending_keys, pending_values, params, prims, info, static,
                 keys, values, counts, beta, q_seg, k_seg, v_seg):
    """Full chunks [B, H, S L, *] from the dictionary (keys, values, counts) after ``seen`` tokens.
    Returns (reads [B, H, S L, Dv], keys, values, counts); ``info`` gets the ints of the new state."""
    state = OVQState(keys=keys, values=values, counts=counts, pending_keys=pending_keys,
                     pending_values=pending_values, seen=seen, n_active=n_active)
    outs = []
    L = params.chunk_size
    for qc, kc, vc in zip(q_seg.split(L, dim=2), k_seg.split(L, dim=2), v_seg.split(L, dim=2)):
        o_c, state = _chunk_step(state, 0, qc, kc, vc, beta=beta, params=params, prims=prims, inplace=False,
                                 static=static)
        outs.append(o_c)
    info["seen"], info["n_active"] = state.seen, state.n_active
    info["merges"], info["evictions"] = state.merges, state.evictions          # made in this segment (it starts at 0)
    return torch.cat(outs, dim=2), state.keys, state.values, state.counts


def ovq_attention_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, params: OVQParams,
    initial_state: Optional[OVQState] = None, output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[OVQState]]:
    """Chunked OVQ attention (the reference the fast kernels are tested against).

    q, k: [B, T, H, Dk] (normalised inside); v: [B, T, H, Dv]; beta: [H] > 0.
    initial_state: the state returned by a previous call (detached here), or None for a fresh one.
    Returns o [B, T, H, Dv] (dtype of q) and the final state (None unless output_final_state).
    """
    return ovq_chunk_loop(q, k, v, beta, params, initial_state, output_final_state, REFERENCE)
