"""State bytes per layer and lane for every registered mixer at given sequence lengths.

The numbers come from each mixer's ``state_nbytes`` (tested equal to the bytes of a real state), with
each mixer's default options (its ``Options`` dataclass: OVQ N = 256 slots, chunk 32; VQ 256 codes,
chunk 32; SWA window 64), for every registered mixer, user mixers included.
"""
from __future__ import annotations

from typing import List

from ovq_cl.layers import MIXERS, build_mixer


def state_size_table(lengths: List[int], d_model: int = 256, n_heads: int = 4) -> str:
    head = f"{'mixer':>8} " + " ".join(f"{'T=' + str(t):>14}" for t in lengths)
    rows = [f"state bytes per layer and lane, float32, d_model={d_model}, {n_heads} heads", head, "-" * len(head)]
    for name in sorted(MIXERS):
        mixer = build_mixer(name, d_model, n_heads)
        rows.append(f"{name:>8} " + " ".join(f"{mixer.state_nbytes(t):>14,d}" for t in lengths))
    return "\n".join(rows)
