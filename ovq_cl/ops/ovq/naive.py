"""OVQ attention, the plain oracle: one chunk at a time, every step the textbook formula.

Slow and short on purpose; every other path (:mod:`~ovq_cl.ops.ovq.chunk`, the CPU-fast chunked form;
:mod:`~ovq_cl.ops.ovq.recurrent`, token by token; :mod:`~ovq_cl.ops.ovq.triton`, the kernels) is
tested against it: outputs, every gradient and the final state. For a chunk of L queries Q with the
chunk's keys K and values V (the unfinished chunk of the carried state in front):

    read:   softmax([beta Q D_k^T + log c | beta Q K^T (causal)]) [D_v ; V]
    update: growth to n_target slots; the chunk keys least similar to the active centroids (or random
            ones) open the new slots with count 1; every other key goes to its most similar centroid
            (first index on ties; a new slot is a candidate too); one online batch k-means step.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from ovq_cl.ops.common import l2norm
from ovq_cl.ops.dictionary import dictionary_chunk_read, scatter_mean_update
from ovq_cl.ops.ovq.common import OVQParams, OVQState, empty_ovq_state, growth_target, random_init_select


# ------------------------------------------------------------------- the update, piece by piece

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


def assign_to_slots(k: torch.Tensor, dict_keys: torch.Tensor) -> torch.Tensor:
    """Hard assignment: ``argmax_n k_i . D_k[n]`` (first index on ties). [B, H, L] int64."""
    return (k @ dict_keys.transpose(-1, -2)).argmax(dim=-1)


def kmeans_merge(
    keys: torch.Tensor, values: torch.Tensor, counts: torch.Tensor,
    slot: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One online batch k-means step (rows no key hits stay bitwise equal).

    keys, values, counts: [B, H, N, Dk], [B, H, N, Dv], [B, H, N]; slot: [B, H, L] target slot per
    key (N = skip this key); k, v: [B, H, L, Dk], [B, H, L, Dv].
    ``D_v[n] <- (c_n D_v[n] + sum v_i) / (c_n + m_n)`` (the Newton step on the mixture NLL),
    ``D_k[n] <- normalise(c_n D_k[n] + sum k_i)``, ``c_n <- c_n + m_n``.
    """
    new_values, new_counts, key_sums = scatter_mean_update(values, counts, slot, v, also_sum=k)
    hit = (new_counts > counts).unsqueeze(-1)
    new_keys = torch.where(hit, l2norm(counts.unsqueeze(-1) * keys + key_sums), keys)
    return new_keys, new_values, new_counts


def absorb_chunk_plastic_naive(state: OVQState, k: torch.Tensor, v: torch.Tensor, params: OVQParams) -> OVQState:
    """The dictionary after one full chunk with the plasticity rules, one lane and head at a time, each
    step as written in :mod:`ovq_cl.ops.ovq.plasticity` (the batched form tested against this)."""
    B, H, L, _ = k.shape
    N, tau = params.num_slots, params.novelty_threshold
    keys, values, counts = state.keys.clone(), state.values.clone(), state.counts.clone()
    if params.count_decay != 1.0:
        counts = torch.where(counts > 0, (counts * params.count_decay).clamp_min(1e-30), counts)
    slot = torch.full((B, H, L), N, dtype=torch.int64)
    merges = evictions = 0
    sched = growth_target(state.seen + L, params)
    for b in range(B):
        for h in range(H):
            u = int((counts[b, h] > 0).sum())
            sims = [max((float(k[b, h, i].detach() @ keys[b, h, n].detach()) for n in range(u)), default=float("-inf"))
                    for i in range(L)]
            order = sorted(range(L), key=lambda i: sims[i])             # stable: ties by position
            m = min(max(sched - u, 0), L)
            if tau is not None:
                m = max(m, sum(s < tau for s in sims))
            m = min(m, N - u)
            took = {}
            for r in range(m):                                          # the m least similar keys open slots
                took[order[r]] = u + r
            if params.when_full != "none" and u == N and sims[order[0]] < tau:
                if params.when_full == "evict":
                    free = int(torch.argmin(counts[b, h]))
                    evictions += 1
                else:
                    pair, best = None, float("-inf")
                    for i in range(N):
                        for j in range(i + 1, N):
                            s = float(keys[b, h, i].detach() @ keys[b, h, j].detach())
                            if s > best:
                                pair, best = (i, j), s
                    i, j = pair
                    ci, cj = counts[b, h, i].clone(), counts[b, h, j].clone()
                    ki, kj = keys[b, h, i].clone(), keys[b, h, j].clone()    # copies: the rows are overwritten
                    vi, vj = values[b, h, i].clone(), values[b, h, j].clone()
                    keys[b, h, i] = l2norm(ci * ki + cj * kj)
                    values[b, h, i] = (ci * vi + cj * vj) / (ci + cj)
                    counts[b, h, i] = ci + cj
                    free = j
                    merges += 1
                took[order[0]] = free
            for i, n in took.items():
                keys[b, h, n], values[b, h, n], counts[b, h, n] = k[b, h, i], v[b, h, i], 1.0
            used = int((counts[b, h] > 0).sum())
            for i in range(L):
                if i not in took:
                    slot[b, h, i] = int(torch.argmax(keys[b, h, :used].detach() @ k[b, h, i].detach()))
    n_active = int((counts > 0).sum(-1).max())
    keys, values, counts = kmeans_merge(keys, values, counts, slot, k, v)
    if params.count_cap is not None:
        counts = counts.clamp_max(params.count_cap)
    return dataclasses.replace(state, keys=keys, values=values, counts=counts, seen=state.seen + L, n_active=n_active,
                               merges=state.merges + merges, evictions=state.evictions + evictions)


def absorb_chunk_naive(state: OVQState, k: torch.Tensor, v: torch.Tensor, params: OVQParams) -> OVQState:
    """The dictionary after one full chunk: k [B, H, L, Dk] (normalised), v [B, H, L, Dv]."""
    if params.plastic:
        return absorb_chunk_plastic_naive(state, k, v, params)
    n_old, L = state.n_active, k.shape[2]
    n_new = max(min(growth_target(state.seen + L, params) - n_old, L), 0)
    keys, values, counts = state.keys, state.values, state.counts
    skip = torch.zeros(k.shape[:3], dtype=torch.bool, device=k.device)
    if n_new > 0:
        if params.init == "spread":
            chosen = spread_init_select(k.detach(), keys[:, :, :n_old].detach(), n_new)
        else:
            chosen = random_init_select(k, n_new, params.init_seed, state.seen)
        keys = keys.slice_scatter(k.gather(2, chosen[..., None].expand(-1, -1, -1, k.shape[-1])), 2,
                                  n_old, n_old + n_new)
        values = values.slice_scatter(v.gather(2, chosen[..., None].expand(-1, -1, -1, v.shape[-1])), 2,
                                      n_old, n_old + n_new)
        counts = counts.slice_scatter(torch.ones_like(counts[:, :, n_old:n_old + n_new]), 2, n_old, n_old + n_new)
        skip = skip.scatter(2, chosen, True)                    # a key that opened a slot is not merged again
    n_active = n_old + n_new
    slot = assign_to_slots(k.detach(), keys[:, :, :n_active].detach()).masked_fill(skip, params.num_slots)
    keys, values, counts = kmeans_merge(keys, values, counts, slot, k, v)
    return dataclasses.replace(state, keys=keys, values=values, counts=counts, seen=state.seen + L, n_active=n_active)


def ovq_attention_naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, params: OVQParams,
    initial_state: Optional[OVQState] = None, output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[OVQState]]:
    """q, k: [B, T, H, Dk] (normalised here); v: [B, T, H, Dv]; beta: [H]. Returns o [B, T, H, Dv] and the
    final state (carried state detached; chunk boundaries aligned to tokens absorbed)."""
    B, T, H, Dk = q.shape
    if initial_state is None:
        state = empty_ovq_state(B, H, params.num_slots, Dk, v.shape[-1], device=q.device, dtype=q.dtype)
    else:
        state = initial_state.detach()
    qh, kh, vh = l2norm(q).transpose(1, 2), l2norm(k).transpose(1, 2), v.transpose(1, 2)   # [B, H, T, D]
    n_pending = state.pending_keys.shape[2]
    keys_all = torch.cat([state.pending_keys, kh], 2)
    values_all = torch.cat([state.pending_values, vh], 2)
    outputs = []
    for start in range(0, n_pending + T, params.chunk_size):
        stop = min(start + params.chunk_size, n_pending + T)
        kc, vc = keys_all[:, :, start:stop], values_all[:, :, start:stop]
        first_query = max(start, n_pending)
        qc = qh[:, :, first_query - n_pending: stop - n_pending]
        read = state.detach() if params.state_grad == "detach" else state
        n = read.n_active
        outputs.append(dictionary_chunk_read(qc, kc, vc, read.keys[:, :, :n], read.values[:, :, :n],
                                             read.counts[:, :, :n].log(), beta, q_offset=first_query - start))
        if stop - start == params.chunk_size:
            if params.state_grad == "detach":
                kc, vc = kc.detach(), vc.detach()
            state = absorb_chunk_naive(read, kc, vc, params)
            kc, vc = kc[:, :, :0], vc[:, :, :0]
        state = dataclasses.replace(state, pending_keys=kc, pending_values=vc)
    o = torch.cat(outputs, 2).transpose(1, 2)
    return o, (state if output_final_state else None)
