"""The OVQ update, fast form: absorbing one full chunk of keys and values into the dictionary.

The rule (``docs/design.md``, section 4): growth (the schedule opens ``new_slots`` slots), init of the
new slots (spread: the chunk keys least similar to the active centroids; or random), hard argmax
assignment of every other key (new slots included), one online batch k-means step. Two forms of the
same function, tested equal to each other and to the oracle (:mod:`ovq_cl.ops.ovq.naive`):

- :func:`absorb` (dynamic): slices the active prefix of the dictionary; shapes change with n_active.
- :func:`absorb_static`: the same result with every chunk on the same shapes (the whole dictionary,
  inactive slots masked), what a captured CUDA graph needs (:mod:`~ovq_cl.ops.ovq.graphs`).

With any plasticity rule on (``params.plastic``), both call
:func:`~ovq_cl.ops.ovq.plasticity.absorb_chunk_plastic`, the per-lane functional update of the rules.
Each takes its similarity and merge from an :class:`~ovq_cl.ops.ovq.primitives.OVQPrimitives`.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from ovq_cl.ops.ovq.common import OVQParams, OVQState, growth_target, random_init_select
from ovq_cl.ops.ovq.plasticity import absorb_chunk_plastic
from ovq_cl.ops.ovq.primitives import REFERENCE, OVQPrimitives, cached_arange, cached_scalar

def _least_similar(s: torch.Tensor, m: int) -> torch.Tensor:
    """The m positions with the smallest s (ties by position). s: [B, H, L] -> [B, H, m] int64."""
    return torch.sort(s, dim=-1, stable=True).indices[..., :m]


def new_slots(seen: int, n_active: int, n_local: int, params: OVQParams) -> int:
    """Slots the schedule opens when a chunk of ``n_local`` keys is absorbed after ``seen`` tokens with
    ``n_active`` slots: ``clamp(target(seen + n_local) - n_active, 0, n_local)``. A function of token
    counts only (never of the data), so the whole loop's shapes are known before it starts."""
    return max(min(growth_target(seen + n_local, params) - n_active, n_local), 0)


def absorb(
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
    return absorb(state, k, v, params, REFERENCE, inplace=False)


def absorb_static(
    state: OVQState, k: torch.Tensor, v: torch.Tensor, params: OVQParams, prims: OVQPrimitives, inplace: bool,
) -> OVQState:
    """:func:`absorb` with the same shapes in every chunk: the result of the dynamic update, computed
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
        state.keys, state.values, state.counts, k, v, cached_scalar(state.n_active, k.device), cached_scalar(n_new, k.device),
        params, prims, inplace, order)
    return dataclasses.replace(
        state, keys=keys, values=values, counts=counts, seen=state.seen + k.shape[2], n_active=state.n_active + n_new
    )


def absorb_static_tensors(
    keys: torch.Tensor, values: torch.Tensor, counts: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    n_active_t: torch.Tensor, n_new_t: torch.Tensor, params: OVQParams, prims: OVQPrimitives, inplace: bool,
    order: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tensor work of :func:`absorb_static`, every input a tensor (what a captured graph replays).

    keys, values, counts: [B, H, N, *] before the chunk; k, v: [B, H, L, *]; n_active_t, n_new_t: 0-d
    int64 on the device (active slots before the chunk, slots the schedule opens); order: [B, H, L]
    the chunk positions by rank for the "random" init, None for "spread" (least similar first).
    Returns (keys, values, counts) after the chunk."""
    n_slots, n_local = params.num_slots, k.shape[2]
    dev = k.device
    kd = k.detach()
    slots = cached_arange(n_slots, dev)                                       # [N]
    active = slots < n_active_t                                         # [N] bool
    best, slot = prims.masked_max_similarity(kd, keys.detach(), n_active_t)   # no active slot: (-inf, 0)
    best = best.to(kd.dtype)
    if order is None:
        order = torch.sort(best, dim=-1, stable=True).indices           # all -inf: positions in order
    ranks = cached_arange(n_local, dev)                                       # [L]
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
