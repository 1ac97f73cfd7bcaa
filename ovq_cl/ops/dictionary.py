"""The pieces OVQ and VQ attention share: the read over [dictionary | local keys], and the running means.

Both keep, per lane and head, a dictionary of key vectors with counts and mean values; they differ in
where the key dictionary comes from (learned online per sequence for OVQ, a global codebook trained
by EMA k-means for VQ). The read and the mean update are the same code.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch


def dictionary_chunk_read(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    dict_keys: torch.Tensor, dict_values: torch.Tensor, log_counts: torch.Tensor,
    beta: torch.Tensor, q_offset: int = 0,
) -> torch.Tensor:
    """One softmax over [dictionary | causal chunk], shared by OVQ and VQ attention.

    q: [B, H, Lq, Dk] queries at local positions q_offset .. q_offset + Lq - 1.
    k, v: [B, H, Lc, Dk], [B, H, Lc, Dv] the local keys and values (count 1 each); query i sees
        local positions j <= q_offset + i.
    dict_keys, dict_values: [B, H, n, Dk], [B, H, n, Dv] (n may be 0).
    log_counts: [B, H, n] log of the counts (-inf for an empty slot: it gets no weight).
    beta: [H] inverse temperature.
    Returns [B, H, Lq, Dv].
    """
    b = beta.view(1, -1, 1, 1).to(q.dtype)
    n = dict_keys.shape[2]
    s_loc = b * (q @ k.transpose(-1, -2))
    lq, n_local = q.shape[2], k.shape[2]
    rows = torch.arange(lq, device=q.device).unsqueeze(1) + q_offset
    cols = torch.arange(n_local, device=q.device).unsqueeze(0)
    s_loc = s_loc.masked_fill(cols > rows, float("-inf"))
    if n == 0:
        return torch.softmax(s_loc, dim=-1) @ v
    s_dict = b * (q @ dict_keys.transpose(-1, -2)) + log_counts.unsqueeze(-2)
    p = torch.softmax(torch.cat([s_dict, s_loc], dim=-1), dim=-1)
    return p[..., :n] @ dict_values + p[..., n:] @ v




def scatter_mean_update(
    values: torch.Tensor, counts: torch.Tensor, slot: torch.Tensor, v: torch.Tensor,
    also_sum: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, ...]:
    """Running means per slot: ``D_v[n] <- (c_n D_v[n] + sum_{i: slot_i = n} v_i) / (c_n + m_n)``.

    values: [B, H, N, Dv]; counts: [B, H, N]; slot: [B, H, L] (N = skip); v: [B, H, L, Dv].
    also_sum: optional [B, H, L, Dk] scattered the same way (returned as a third output, [B, H, N, Dk]).
    Rows no key hits stay bitwise equal. Returns (new_values, new_counts[, sums]).
    """
    bsz, heads, n_slots, dv = values.shape
    idx = slot.unsqueeze(-1)
    sum_v = v.new_zeros(bsz, heads, n_slots + 1, dv).scatter_add(2, idx.expand(-1, -1, -1, dv), v)[:, :, :n_slots]
    ones = torch.ones_like(slot, dtype=counts.dtype)
    hits = counts.new_zeros(bsz, heads, n_slots + 1).scatter_add(2, slot, ones)[:, :, :n_slots]
    new_counts = counts + hits
    touched = (hits > 0).unsqueeze(-1)
    new_values = torch.where(
        touched, (counts.unsqueeze(-1) * values + sum_v) / new_counts.unsqueeze(-1).clamp_min(1.0), values
    )
    if also_sum is None:
        return new_values, new_counts
    dk = also_sum.shape[-1]
    sums = also_sum.new_zeros(bsz, heads, n_slots + 1, dk).scatter_add(2, idx.expand(-1, -1, -1, dk), also_sum)
    return new_values, new_counts, sums[:, :, :n_slots]
