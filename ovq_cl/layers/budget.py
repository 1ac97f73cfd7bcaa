"""Sizing a mixer to a state budget: the bytes one layer carries for one lane between calls.

Each mixer names the option a budget sizes (``Mixer.budget_knob``): OVQ's slots N, VQ's codebook
size, the sliding window W, the head width of linear attention, DeltaNet, Gated DeltaNet and the SSM
(which also changes their parameter count: report both). :func:`size_to_budget` returns the options with the largest knob
whose state (float32, measured with the mixer's own ``state_nbytes`` at a long sequence that is a
multiple of its chunk, ``Mixer.sizing_chunk``, so no unfinished chunk is counted) fits the budget. Full attention has no knob:
its KV cache grows with T and is reported at the stream's length, not matched.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ovq_cl.layers import MIXERS, mixer_options

SIZING_CHUNKS = 4096          # the state is measured after this many chunks (or tokens, without chunks)
MAX_KNOB = 1 << 20


def state_bytes(name: str, d_model: int, n_heads: int, options: Any) -> int:
    """Bytes per layer and lane (float32) of mixer ``name`` with ``options``, after a long sequence."""
    spec = MIXERS.get(name)
    mixer = spec.cls(d_model=d_model, n_heads=n_heads, options=mixer_options(name, options))
    seq_len = SIZING_CHUNKS * mixer.sizing_chunk
    return mixer.state_nbytes(seq_len)


def size_to_budget(name: str, d_model: int, n_heads: int, budget: int, options: Any = None):
    """The options of mixer ``name`` with its budget knob as large as ``budget`` bytes allow (unchanged
    options for a mixer without a knob). ValueError if even a knob of 1 does not fit."""
    spec = MIXERS.get(name)
    options = mixer_options(name, options)
    knob: Optional[str] = spec.cls.budget_knob
    if knob is None:
        return options

    def fits(value: int) -> bool:
        return state_bytes(name, d_model, n_heads, dataclasses.replace(options, **{knob: value})) <= budget

    if not fits(1):
        smallest = state_bytes(name, d_model, n_heads, dataclasses.replace(options, **{knob: 1}))
        raise ValueError(f"model.state_budget={budget} B is below the smallest {name} state "
                         f"({smallest} B at {knob}=1)")
    lo = 1
    while lo * 2 <= MAX_KNOB and fits(lo * 2):
        lo *= 2
    hi = min(lo * 2, MAX_KNOB + 1)                      # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return dataclasses.replace(options, **{knob: lo})
