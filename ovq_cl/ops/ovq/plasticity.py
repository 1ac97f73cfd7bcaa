"""OVQ's dictionary update with the plasticity rules (novelty growth, maintenance when full, count
discount and cap), batched over lanes and heads: the absorb step the chunk loop runs when
``params.plastic`` (:class:`~ovq_cl.ops.ovq.common.OVQParams`). The plain per-lane oracle it is
tested against is :func:`ovq_cl.ops.ovq.naive.absorb_chunk_plastic_naive`.

Per chunk of L keys, for every lane and head (its used slots are the prefix with count > 0, u of them):

1. *Discount*: every used count c <- max(gamma c, 1e-30).
2. *Similarity*: ``best_i = max_n k_i . D_k[n]`` over used slots (-inf when there is none).
3. *Openings*: ``m = min(max(m_sched, m_novel), N - u)`` keys open slots u, u+1, ..: the m least
   similar keys (stable order), where ``m_sched = clamp(target(seen + L) - u, 0, L)`` follows the
   growth schedule (0 for ``growth="novelty"``) and ``m_novel`` counts the keys with ``best < tau``.
   Since novel keys are the least similar ones, this is "the schedule's keys plus every novel key".
4. *Maintenance* (``when_full``), only where the dictionary was full before the chunk (u = N) and
   the least similar key is novel: "merge" merges the two closest centroids i < j (first pair in
   row-major order on ties) into i, count-weighted (``D_k[i] <- normalise(c_i D_k[i] + c_j D_k[j])``,
   ``D_v[i] <- (c_i D_v[i] + c_j D_v[j]) / (c_i + c_j)``, ``c_i <- c_i + c_j``), and slot j takes
   the key; "evict" gives the key the slot of lowest count (first on ties). Count 1, value its own.
5. *Assignment* of every other key to its most similar used centroid after 3-4 (first on ties) and
   one online batch k-means step (``prims.merge``, exactly as without the rules).
6. *Cap*: ``c <- min(c, cap)``.

The rows that open, merge or take a key are written with one-hot matrices ([B, H, L, N] and
[B, H, N, N]), so the update stays differentiable in the keys and values (``state_grad="full"``) and
costs O(L N d) per chunk, the order of the similarity pass itself. The decisions (which key, which
slot) are discrete and read no gradient. The similarity pass runs in PyTorch on every backend (the
unused slots of a lane must be masked, which the Triton max-similarity kernel does not do); the read
and the k-means step use the backend's primitives.
"""
from __future__ import annotations

import dataclasses

import torch

from ovq_cl.ops.common import l2norm
from ovq_cl.ops.ovq.common import OVQParams, OVQState, growth_target

COUNT_FLOOR = 1e-30      # a discounted count never reaches 0, which would mean "unused slot"


def discount_counts(counts: torch.Tensor, gamma: float) -> torch.Tensor:
    """``c <- max(gamma c, 1e-30)`` on used slots (c > 0); unused ones stay 0. counts: [B, H, N]."""
    if gamma == 1.0:
        return counts
    return torch.where(counts > 0, (counts * gamma).clamp_min(COUNT_FLOOR), counts)


def masked_best(k: torch.Tensor, dict_keys: torch.Tensor, used: torch.Tensor):
    """Best similarity of each key to the used centroids and its slot (first index on ties).

    k: [B, H, L, Dk]; dict_keys: [B, H, n, Dk]; used: [B, H, n] bool. Returns best [B, H, L]
    (-inf where a lane has no used slot) and slot [B, H, L] int64 (0 there)."""
    if dict_keys.shape[2] == 0:
        return k.new_full(k.shape[:3], float("-inf")), torch.zeros(k.shape[:3], dtype=torch.int64, device=k.device)
    s = (k @ dict_keys.transpose(-1, -2)).masked_fill(~used.unsqueeze(-2), float("-inf"))
    best, slot = s.max(dim=-1)
    return best, torch.where(torch.isinf(best), torch.zeros_like(slot), slot)


def _write_rows(rows: torch.Tensor, onehot: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Rows n with ``onehot[..., i, n] = 1`` replaced by ``src[..., i, :]`` (at most one i per n).
    rows [B, H, N, D]; onehot [B, H, L, N]; src [B, H, L, D]."""
    hit = onehot.sum(-2).unsqueeze(-1)                                  # [B, H, N, 1], 0 or 1
    return rows * (1 - hit) + onehot.transpose(-1, -2) @ src


def absorb_chunk_plastic(state: OVQState, k: torch.Tensor, v: torch.Tensor, params: OVQParams, merge) -> OVQState:
    """The dictionary after one full chunk with the plasticity rules (module docstring).

    state: the dictionary before the chunk (functional: its tensors are not modified);
    k: [B, H, L, Dk] normalised keys; v: [B, H, L, Dv]; merge: the k-means step with the contract of
    :func:`~ovq_cl.ops.ovq.primitives.sparse_kmeans_merge` (called with ``inplace=False``).
    """
    N, L = params.num_slots, k.shape[2]
    keys, values = state.keys, state.values
    counts = discount_counts(state.counts, float(params.count_decay))
    kd = k.detach()
    used_old = counts > 0                                               # [B, H, N], a prefix per lane and head
    u = used_old.sum(-1)                                                # [B, H]
    n_read = state.n_active
    best, _ = masked_best(kd, keys[:, :, :n_read].detach(), used_old[:, :, :n_read])
    order = torch.sort(best, dim=-1, stable=True).indices               # least similar first
    sched = growth_target(state.seen + L, params)
    m = (sched - u).clamp(0, L)
    tau = params.novelty_threshold
    if tau is not None:
        m = torch.maximum(m, (best < tau).sum(-1))
    m = torch.minimum(m, N - u)                                         # [B, H] keys that open slots
    rank = torch.arange(L, device=k.device)
    opens = rank < m.unsqueeze(-1)                                      # [B, H, L] by rank
    target = torch.where(opens, u.unsqueeze(-1) + rank, torch.full_like(opens, N, dtype=torch.int64))
    slot_of_key = torch.full_like(order, N).scatter(2, order, target)  # [B, H, L]: opened slot, or N
    onehot = torch.nn.functional.one_hot(slot_of_key, N + 1)[..., :N].to(k.dtype)
    merges = evictions = 0
    if params.when_full != "none":
        first = order[..., :1]                                          # the most novel key
        act = (u == N) & (best.gather(2, first).squeeze(-1) < tau)      # [B, H]
        if bool(act.any()):
            keys, values, counts, freed = _free_a_slot(keys, values, counts, params.when_full, act)
            kept = slot_of_key.gather(2, first).squeeze(-1)             # elsewhere the key keeps its opening
            slot_of_key = slot_of_key.scatter(2, first, torch.where(act, freed, kept).unsqueeze(-1))
            onehot = torch.nn.functional.one_hot(slot_of_key, N + 1)[..., :N].to(k.dtype)
            n_act = int(act.sum())
            merges, evictions = (n_act, 0) if params.when_full == "merge" else (0, n_act)
    taken = onehot.sum(-2)                                              # [B, H, N] rows given to a key
    keys = _write_rows(keys, onehot, k)
    values = _write_rows(values, onehot, v)
    counts = torch.where(taken > 0, torch.ones_like(counts), counts)
    used = counts > 0
    u_new = used.sum(-1)
    n_active = int(u_new.max()) if u_new.numel() else 0
    _, slot = masked_best(kd, keys[:, :, :n_active].detach(), used[:, :, :n_active])
    slot = torch.where(slot_of_key < N, torch.full_like(slot, N), slot)  # keys that took a slot are not merged again
    keys, values, counts = merge(keys, values, counts, slot, k, v, False)
    if params.count_cap is not None:
        counts = counts.clamp_max(float(params.count_cap))
    return dataclasses.replace(
        state, keys=keys, values=values, counts=counts, seen=state.seen + L, n_active=n_active,
        merges=state.merges + merges, evictions=state.evictions + evictions,
    )


def _free_a_slot(keys, values, counts, rule: str, act: torch.Tensor):
    """Frees one slot per lane and head where ``act`` [B, H] (a full dictionary): "merge" merges the
    two closest centroids into the first, "evict" picks the lowest count. Returns the new (keys,
    values, counts) and the freed slot [B, H] (its row is overwritten by the caller)."""
    N = keys.shape[2]
    if rule == "evict":
        return keys, values, counts, counts.argmin(dim=-1)
    kd = keys.detach()
    s = kd @ kd.transpose(-1, -2)                                       # [B, H, N, N]
    upper = torch.ones(N, N, dtype=torch.bool, device=keys.device).triu_(1)
    flat = s.masked_fill(~upper, float("-inf")).flatten(-2).argmax(dim=-1)   # first pair in row-major order
    i, j = flat // N, flat % N
    ci, cj = counts.gather(2, i.unsqueeze(-1)), counts.gather(2, j.unsqueeze(-1))    # [B, H, 1]
    ki = keys.gather(2, i[..., None, None].expand(-1, -1, 1, keys.shape[-1]))
    kj = keys.gather(2, j[..., None, None].expand(-1, -1, 1, keys.shape[-1]))
    vi = values.gather(2, i[..., None, None].expand(-1, -1, 1, values.shape[-1]))
    vj = values.gather(2, j[..., None, None].expand(-1, -1, 1, values.shape[-1]))
    merged_k = l2norm(ci.unsqueeze(-1) * ki + cj.unsqueeze(-1) * kj)
    merged_v = (ci.unsqueeze(-1) * vi + cj.unsqueeze(-1) * vj) / (ci + cj).unsqueeze(-1)
    hot = (torch.nn.functional.one_hot(i, N).to(keys.dtype) * act.unsqueeze(-1).to(keys.dtype)).unsqueeze(-2)
    keys = _write_rows(keys, hot, merged_k)
    values = _write_rows(values, hot, merged_v)
    counts = torch.where(hot.squeeze(-2) > 0, (ci + cj).expand_as(counts), counts)
    return keys, values, counts, j
