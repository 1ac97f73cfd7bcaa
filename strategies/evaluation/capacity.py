"""The capacity curve: how many facts does a fresh memory hold at once?

The stream's ``capacity_probe(facts, n)`` (ICR's: ``facts`` distinct keys bound once, then queries of
keys drawn from all of them) is scored at each number of facts, measured after meta-training, in eval
mode, each item from a fresh state. Beside the interference curves (what the memory loses to later
bindings), it says whether a memory forgets before its capacity is used: a memory that holds 64 facts
at once but loses a fact after 32 later bindings overwrites below its capacity.

The curve's **capacity** is the largest measured number of facts at which the skill (the score's
distance from chance, as in the learned gate) is still >= a level (0.5 by default); None when even the
fewest facts fall below it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch.utils.data import Dataset

from strategies.evaluation.gate import ProbePoint, probe_scores


@dataclass
class CapacityPoint(ProbePoint):
    """One point: ``facts`` facts bound once, then queried."""

    facts: int


@dataclass
class CapacityCurve:
    """The curve, in increasing number of facts; ``metric`` is the stream's."""

    metric: str
    points: List[CapacityPoint] = field(default_factory=list)

    def as_dict(self) -> Dict:
        return {"metric": self.metric, "points": [asdict(p) for p in self.points]}

    @classmethod
    def from_dict(cls, d: Dict) -> "CapacityCurve":
        return cls(d["metric"], [CapacityPoint(**p) for p in d.get("points", [])])

    def capacity(self, level: float = 0.5) -> Optional[int]:
        """The largest measured number of facts whose skill is >= ``level``, counting up from the fewest
        and stopping at the first that falls below (None: the fewest already do)."""
        held = None
        for p in self.points:
            if not (p.skill >= level):
                break
            held = p.facts
        return held

    def table(self) -> str:
        lines = [f"{'facts':>6}  {self.metric:>9}  {'s.e.':>6}  {'chance':>6}  {'skill':>6}"]
        for p in self.points:
            lines.append(f"{p.facts:>6}  {p.score:>9.3f}  {p.standard_error:>6.3f}  {p.chance:>6.3f}  {p.skill:>6.3f}")
        return "\n".join(lines)


@torch.no_grad()
def measure_capacity(model: torch.nn.Module, probe: Callable[[int, int], Dataset], ladder: Sequence[int], metric: str,
                     episodes: int = 64, batch_size: int = 32, device="cpu",
                     context: Optional[dict] = None) -> CapacityCurve:
    """The model's score on ``probe(facts, episodes)`` for every number of facts in ``ladder``."""
    curve = CapacityCurve(metric)
    for n in sorted(set(int(n) for n in ladder)):
        curve.points.append(CapacityPoint(facts=n, **probe_scores(model, probe(n, episodes), metric, batch_size,
                                                                  device, context)))
    return curve


def plot_capacity(curve: CapacityCurve, title: str = ""):
    """A matplotlib figure: score (±1.96 s.e.) against the number of facts, chance dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    x = [p.facts for p in curve.points]
    ax.errorbar(x, [p.score for p in curve.points],
                yerr=[1.96 * (p.standard_error if math.isfinite(p.standard_error) else 0.0) for p in curve.points],
                marker="o", capsize=3, label=curve.metric)
    ax.plot(x, [p.chance for p in curve.points], "--", color="gray", label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("facts bound once, then queried")
    ax.set_ylabel(curve.metric)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
