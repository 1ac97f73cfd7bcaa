"""The short causal convolution of flash-linear-attention's linear-attention layers (fla's
``ShortConvolution(activation='silu')``): a depthwise conv1d over time, then SiLU, with a carried cache
of the last K-1 inputs so that one call equals split calls equals token-by-token decoding.

Per channel c, with kernel w [C, K] and inputs x_t (x_t = 0 before the first token of a fresh state):

    y_t[c] = silu( sum_{j=0}^{K-1} w[c, j] x_{t-K+1+j}[c] )

Used on the q, k and v projections of the dense-state baselines (option ``short_conv``; 0 = off).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ovq_cl.ops.common import compute_dtype


class ShortConv(nn.Module):
    """Depthwise causal conv1d + SiLU over ``channels`` channels with kernel size ``kernel_size`` (>= 1),
    no bias (fla's default).

    ``y, cache = conv(x, cache=None)``: x [B, T, C] -> y [B, T, C] (x's dtype) and the new cache
    [B, K-1, C], the last K-1 inputs (zeros where the sequence is shorter), kept in at least float32
    like every other state tensor. ``cache`` is the previous call's cache (detached: truncated BPTT
    across calls, as for the mixers' states) or None for a fresh sequence (zero history).
    """

    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__()
        if channels < 1 or kernel_size < 1:
            raise ValueError(f"ShortConv: channels and kernel_size must be >= 1, got {channels}, {kernel_size}")
        self.channels, self.kernel_size = channels, kernel_size
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))   # [C, 1, K]: nn.Conv1d's depthwise layout
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))                # nn.Conv1d's (and so fla's) default init

    def cache_shape(self, batch_size: int) -> Tuple[int, int, int]:
        return (batch_size, self.kernel_size - 1, self.channels)

    def forward(self, x: torch.Tensor, cache: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, C], cache [B, K-1, C] or None -> y [B, T, C], new cache [B, K-1, C]."""
        if x.dim() != 3 or x.shape[-1] != self.channels:
            raise ValueError(f"ShortConv: x must be [B, T, {self.channels}], got {tuple(x.shape)}")
        expected = self.cache_shape(x.shape[0])
        if cache is None:
            past = x.new_zeros(expected)
        elif tuple(cache.shape) != expected:
            raise ValueError(f"ShortConv: cache must be [B, K-1, C] = {expected}, got {tuple(cache.shape)}")
        else:
            past = cache.detach().to(x.dtype)
        xp = torch.cat([past, x], dim=1)                                          # [B, K-1+T, C]
        y = F.conv1d(xp.transpose(1, 2), self.weight, groups=self.channels).transpose(1, 2)
        # a copy, not a view: the state must not keep the whole [B, K-1+T, C] buffer alive
        new_cache = xp[:, xp.shape[1] - (self.kernel_size - 1):].to(compute_dtype(x.dtype), copy=True)
        return F.silu(y), new_cache

    def extra_repr(self) -> str:
        return f"channels={self.channels}, kernel_size={self.kernel_size}"


def check_layer_choices(owner: str, short_conv: Any, output_norm: Any) -> None:
    """One clear ValueError for a bad ``short_conv`` (an int >= 0, the kernel size) or ``output_norm``
    (a bool): the two options every dense-state baseline shares."""
    if isinstance(short_conv, bool) or not isinstance(short_conv, int) or short_conv < 0:
        raise ValueError(f"{owner}: short_conv must be an int >= 0 (kernel size; 0 = off), got {short_conv!r}")
    if not isinstance(output_norm, bool):
        raise ValueError(f"{owner}: output_norm must be True or False, got {output_norm!r}")


def norm_and_gate(o: torch.Tensor, x: torch.Tensor, o_norm: Optional[nn.Module],
                  g_proj: Optional[nn.Module]) -> torch.Tensor:
    """The output of a dense-state mixer before o_proj: o [B, T, H, Dv] RMS-normalised per head when
    ``o_norm`` is set, then gated by ``silu(g_proj(x))`` (x [B, T, d_model]) when ``g_proj`` is set."""
    if o_norm is not None:
        o = o_norm(o)
    if g_proj is not None:
        o = o * F.silu(g_proj(x).view(o.shape))
    return o


def cache_numel(conv: Optional[ShortConv]) -> int:
    """Elements of one lane's cache, (K-1) C; 0 without a conv (for the mixers' ``state_nbytes``)."""
    return 0 if conv is None else (conv.kernel_size - 1) * conv.channels


def short_conv_qkv(
    conv: Optional[ShortConv], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Any, owner: str,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The short convolution on q, k, v (each [B, T, H, D]; v may have its own D) as three separate
    depthwise convs, computed as one conv over their concatenated channels (depthwise: the same thing).

    ``state``: the mixer's incoming state (None = fresh) whose ``conv`` field is the cache
    [B, K-1, H (Dq + Dk + Dv)]. Returns the convolved q, k, v and the new cache (None when ``conv`` is
    None, then q, k, v are returned unchanged). A state whose cache does not fit the mixer (a conv
    state given to a mixer without one, or the reverse) is a ValueError naming ``owner``.
    """
    cache = None if state is None else state.conv
    if conv is None:
        if cache is not None:
            raise ValueError(f"{owner}: the state carries a short-conv cache but short_conv=0")
        return q, k, v, None
    if state is not None and cache is None:
        raise ValueError(f"{owner}: the state has no short-conv cache but short_conv={conv.kernel_size}")
    B, T = q.shape[:2]
    widths = [t.shape[2] * t.shape[3] for t in (q, k, v)]
    y, cache = conv(torch.cat([t.reshape(B, T, -1) for t in (q, k, v)], dim=-1), cache)
    qc, kc, vc = y.split(widths, dim=-1)
    return qc.view(q.shape), kc.view(k.shape), vc.view(v.shape), cache
