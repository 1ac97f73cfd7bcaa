"""Interference curves: does a memory lose a fact to time, or to what is written after it?

The delay-recall curve (:mod:`strategies.evaluation.delay`) fills the gap between a fact and its query
with other facts, so time and interference move together. Here the filler's *kind* is a parameter
(the stream's ``interference_probe(kind, items, n)``; ICR's: ``neutral`` separator tokens, new bindings
of the ``same_region``'s keys or of an ``other_region``'s, or a ``repeat`` of the same facts), each
kind at a ladder of numbers of intervening items with the same tokens per item, measured after
meta-training, in eval mode, each item from a fresh state. A memory that forgets by overwriting falls
on the binding kinds and not on ``neutral``; one whose memory is short falls on every kind but
``repeat``.

Per kind the curve gives its **half point**: the fewest intervening items at which the skill (the
score's distance from chance, as in the learned gate) falls below half of its value with nothing in
between; None when it never does up to the last point (or the memory had no skill to start with).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch.utils.data import Dataset

from strategies.evaluation.gate import ProbePoint, probe_scores


@dataclass
class InterferencePoint(ProbePoint):
    """One point: ``items`` intervening items (``tokens`` tokens) between the facts and their queries."""

    items: int
    tokens: int


@dataclass
class InterferenceCurves:
    """One curve per filler kind, each in increasing ``items``; ``metric`` is the stream's."""

    metric: str
    tokens_per_item: int
    curves: Dict[str, List[InterferencePoint]] = field(default_factory=dict)

    def as_dict(self) -> Dict:
        return {"metric": self.metric, "tokens_per_item": self.tokens_per_item,
                "curves": {k: [asdict(p) for p in v] for k, v in self.curves.items()}}

    @classmethod
    def from_dict(cls, d: Dict) -> "InterferenceCurves":
        return cls(d["metric"], int(d.get("tokens_per_item", 2)),
                   {k: [InterferencePoint(**p) for p in v] for k, v in (d.get("curves") or {}).items()})

    def half_point(self, kind: str) -> Optional[int]:
        """The fewest intervening items at which the skill falls below half its value at 0 items (None:
        never up to the last point, or no skill at 0 to halve)."""
        points = self.curves.get(kind, [])
        if not points or not (points[0].skill > 0):
            return None
        for p in points[1:]:
            if p.skill < points[0].skill / 2:
                return p.items
        return None

    def table(self) -> str:
        """Plain text: one row per number of items, one column per kind (score)."""
        kinds = list(self.curves)
        items = sorted({p.items for v in self.curves.values() for p in v})
        lines = [f"{'items':>6}  {'tokens':>7}  " + "  ".join(f"{k:>12}" for k in kinds)]
        for n in items:
            cells = []
            for k in kinds:
                p = next((p for p in self.curves[k] if p.items == n), None)
                cells.append(f"{p.score:>12.3f}" if p else f"{'':>12}")
            lines.append(f"{n:>6}  {n * self.tokens_per_item:>7}  " + "  ".join(cells))
        lines.append(f"{'half at':>15}  " + "  ".join(
            f"{('> ' + str(self.curves[k][-1].items)) if self.half_point(k) is None else self.half_point(k):>12}"
            for k in kinds))
        return "\n".join(lines)


def item_ladder(max_items: int) -> List[int]:
    """0, 1, 2, 4, ... doubling up to ``max_items`` (included)."""
    if max_items < 0:
        raise ValueError(f"interference curves: max_items must be >= 0, got {max_items}")
    ladder, n = [0], 1
    while n < max_items:
        ladder.append(n)
        n *= 2
    if max_items > 0:
        ladder.append(max_items)
    return ladder


@torch.no_grad()
def measure_interference(model: torch.nn.Module, probe: Callable[[str, int, int], Dataset], kinds: Sequence[str],
                         ladder: Sequence[int], metric: str, tokens_per_item: int = 2, episodes: int = 64,
                         batch_size: int = 32, device="cpu", context: Optional[dict] = None) -> InterferenceCurves:
    """The model's score on ``probe(kind, items, episodes)`` for every kind and number of items."""
    out = InterferenceCurves(metric, tokens_per_item)
    for kind in kinds:
        points = []
        for n in sorted(set(int(n) for n in ladder)):
            points.append(InterferencePoint(items=n, tokens=n * tokens_per_item, **probe_scores(
                model, probe(kind, n, episodes), metric, batch_size, device, context)))
        out.curves[kind] = points
    return out


def plot_interference(curves: InterferenceCurves, title: str = ""):
    """A matplotlib figure: score (±1.96 s.e.) against intervening items, one line per kind, chance dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for kind, points in curves.curves.items():
        x = [max(p.items, 0.5) for p in points]
        ax.errorbar(x, [p.score for p in points],
                    yerr=[1.96 * (p.standard_error if math.isfinite(p.standard_error) else 0.0) for p in points],
                    marker="o", capsize=3, label=kind)
    chance = [p.chance for v in curves.curves.values() for p in v]
    if chance:
        ax.axhline(sum(chance) / len(chance), color="gray", linestyle="--", label="chance")
    ax.set_xscale("log")
    ax.set_xlabel(f"intervening items ({curves.tokens_per_item} tokens each; 0 plotted at 0.5)")
    ax.set_ylabel(curves.metric)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
