"""Causal softmax attention over a KV cache, full or sliding-window (PyTorch SDPA).

The state is the cache itself: the keys/values of every earlier token (full) or of the last
``window - 1`` tokens (sliding window of W tokens, the current one included). Its size grows with T
for full attention, which is what makes it the recall upper bound and the memory lower bound.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ovq_cl.ops.common import check_qkv
from ovq_cl.state import MixerState


@dataclasses.dataclass
class KVCacheState(MixerState):
    """keys: [B, H, P, Dk], values: [B, H, P, Dv] (post-rotary); seen: tokens processed so far."""

    keys: torch.Tensor
    values: torch.Tensor
    seen: int = 0


def _masked_attention(q, k, v, offset: int, window: Optional[int], scale: Optional[float]) -> torch.Tensor:
    """q: [B, H, Tq, D] at key positions offset .. offset + Tq - 1 of k, v: [B, H, S, D]."""
    rows = torch.arange(q.shape[2], device=q.device).unsqueeze(1) + offset
    cols = torch.arange(k.shape[2], device=q.device).unsqueeze(0)
    mask = cols <= rows
    if window is not None:
        mask = mask & (cols > rows - window)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None,
    window: Optional[int] = None, initial_state: Optional[KVCacheState] = None,
    output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[KVCacheState]]:
    """q, k: [B, T, H, Dk]; v: [B, T, H, Dv]. Query t attends to cached and new keys s <= t
    (and s > t - window when a window is set). Returns o [B, T, H, Dv] and the extended cache."""
    check_qkv(q, k, v, "softmax_attention")
    if window is not None and window < 1:
        raise ValueError(f"softmax_attention: window must be >= 1, got {window}")
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    past = 0
    seen = 0
    if initial_state is not None:
        if initial_state.keys.shape[:2] != kt.shape[:2] or initial_state.keys.shape[-1] != kt.shape[-1]:
            raise ValueError(
                f"softmax_attention: cache keys {tuple(initial_state.keys.shape)} do not fit k {tuple(kt.shape)}"
            )
        past = initial_state.keys.shape[2]
        seen = initial_state.seen
        kt = torch.cat([initial_state.keys.detach().to(kt.dtype), kt], dim=2)
        vt = torch.cat([initial_state.values.detach().to(vt.dtype), vt], dim=2)
    T, S = qt.shape[2], kt.shape[2]
    if past == 0 and (window is None or window >= T):
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
    elif window is None:
        o = _masked_attention(qt, kt, vt, past, None, scale)
    else:
        # blocks of `window` queries, each against its own window of keys: O(T W), not O(T S)
        outs = []
        for start in range(0, T, window):
            stop = min(start + window, T)
            k_lo = max(0, past + start - window + 1)
            outs.append(_masked_attention(
                qt[:, :, start:stop], kt[:, :, k_lo:past + stop], vt[:, :, k_lo:past + stop],
                past + start - k_lo, window, scale,
            ))
        o = torch.cat(outs, dim=2)
    final = None
    if output_final_state:
        keep = S if window is None else min(S, window - 1)
        keys, values = kt[:, :, S - keep:], vt[:, :, S - keep:]
        if keep < S:                     # a window's tail: copied, or the state would keep all of kt alive
            keys, values = keys.clone(), values.clone()
        final = KVCacheState(keys=keys, values=values, seen=seen + T)
    return o.transpose(1, 2), final
