"""State bytes per layer and lane for every registered mixer at given sequence lengths, and the sizing of
every mixer to a state budget.

The numbers come from each mixer's ``state_nbytes`` (tested equal to the bytes of a real state), with
each mixer's default options (its ``Options`` dataclass: OVQ N = 256 slots, chunk 32; VQ 256 codes,
chunk 32; SWA window 64), for every registered mixer, user mixers included. With a budget, each mixer
is sized by ``ovq_cl.layers.budget`` (its knob as large as the budget allows) and the table also shows
the knob and the layer's parameters, which the sizing can change (head width).
"""
from __future__ import annotations

from typing import List, Optional

from ovq_cl.layers import MIXERS, build_mixer


def state_size_table(lengths: List[int], d_model: int = 256, n_heads: int = 4, budget: Optional[int] = None) -> str:
    from ovq_cl.layers.budget import size_to_budget

    head = f"{'mixer':>8} " + " ".join(f"{'T=' + str(t):>14}" for t in lengths)
    title = f"state bytes per layer and lane, float32, d_model={d_model}, {n_heads} heads"
    if budget is not None:
        head += f" {'sized':>22} {'parameters':>12}"
        title += f", sized to a budget of {budget:,} B (mixers without a knob grow with T: not matched)"
    rows = [title, head, "-" * len(head)]
    for name in sorted(MIXERS):
        options = None if budget is None else size_to_budget(name, d_model, n_heads, budget)
        mixer = build_mixer(name, d_model, n_heads, options)
        row = f"{name:>8} " + " ".join(f"{mixer.state_nbytes(t):>14,d}" for t in lengths)
        if budget is not None:
            knob = MIXERS.get(name).cls.budget_knob
            sized = "-" if knob is None else f"{knob}={getattr(mixer.options, knob) if knob != 'head_dim' else mixer.head_dim}"
            row += f" {sized:>22} {sum(p.numel() for p in mixer.parameters()):>12,d}"
        rows.append(row)
    return "\n".join(rows)
