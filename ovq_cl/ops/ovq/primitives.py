"""The per-chunk work of the OVQ chunk loop, in fast PyTorch: the read, the max / argmax over the
dictionary, the sparse k-means merge, and the bundle that lets the Triton kernels replace them
(:class:`OVQPrimitives`; :data:`REFERENCE` is this module's). Also the cached index tensors and masks
every fast path shares (:func:`cached_arange`, :func:`cached_scalar`, :func:`above_diagonal`): the
chunk loop, the static update and the captured blocks of :mod:`~ovq_cl.ops.ovq.graphs` must use the
same cached tensors (a captured graph keeps their pointers).

Notation in :mod:`ovq_cl.ops.ovq.common`; the rule in ``docs/design.md``, section 4.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Tuple

import torch

from ovq_cl.ops.common import l2norm
from ovq_cl.ops.ovq.plasticity import masked_best

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
    s_loc = s_loc.masked_fill_(above_diagonal(lq, n_local, q_offset, q.device), float("-inf"))
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
def above_diagonal(lq: int, n_local: int, q_offset: int, device: torch.device) -> torch.Tensor:
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
    return masked_best(k, dict_keys, cached_arange(dict_keys.shape[2], k.device) < n_active)


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


# ------------------------------------------------------------------- cached index tensors

@functools.lru_cache(maxsize=4096)
def cached_scalar(n: int, device: torch.device) -> torch.Tensor:
    """A cached 0-d int64 tensor holding n on ``device`` (no host-to-device copy per chunk)."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.tensor(n, dtype=torch.int64, device=device)


@functools.lru_cache(maxsize=64)
def cached_arange(n: int, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():
        return torch.arange(n, device=device)
