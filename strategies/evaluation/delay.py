"""The delay-recall curve: how long does a model's memory keep a fact, before any stream?

Measured after meta-training, in eval mode, each item from a fresh state: the stream's delay probe
(``StreamData.delay_probe``; ICR's: facts, then ``f`` filler episodes, then queries of those facts)
at a ladder of filler lengths, from 0 to the longest delay the stream will test. Each point is a
score with its episode-clustered standard error, chance on the same labels and skill (as in the
learned gate, :mod:`strategies.evaluation.gate`).

The curve answers two questions a forgetting comparison needs:

- **the span**: the shortest measured delay at which accuracy falls below a level (0.5 by default):
  does a mixer forget by overwriting, or because its memory is shorter than the stream asks for?
- **the delay gate**: does the model still recall a single presentation at the *learning delay*
  (one experience's tokens per lane: a fact presented at the start of experience j is tested after
  all of j)? Reported always, a gate only when the config asks (``gate.delay: experience``): facts
  recur within an experience, so a shorter memory can still learn it and then lose it, and that loss
  is forgetting to report, not to hide.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch.utils.data import Dataset

from strategies.evaluation.gate import GateResult, ProbePoint, probe_scores


@dataclass
class DelayPoint(ProbePoint):
    """One point of the curve: ``delay`` tokens (``filler_episodes`` episodes) between the facts and their queries."""

    filler_episodes: int
    delay: int


@dataclass
class DelayCurve:
    """The curve, in increasing delay. ``metric`` is the stream's (accuracy for ICR)."""

    metric: str
    points: List[DelayPoint] = field(default_factory=list)

    def as_dict(self) -> Dict:
        return {"metric": self.metric, "points": [asdict(p) for p in self.points]}

    @classmethod
    def from_dict(cls, d: Dict) -> "DelayCurve":
        return cls(d["metric"], [DelayPoint(**p) for p in d.get("points", [])])

    def at(self, delay: int) -> Optional[DelayPoint]:
        """The point at the smallest measured delay >= ``delay`` (None past the curve's end)."""
        for p in self.points:
            if p.delay >= delay:
                return p
        return None

    def span(self, level: float = 0.5) -> Optional[int]:
        """The smallest measured delay whose skill (against the context-free predictor's chance, as the
        capacity curve's) falls below ``level`` (None: never, up to the last point). Read on the skill, not
        the raw score, so that the level means the same for accuracy, MSE and bits per byte (a raw MSE of
        0.5 is below chance on a stream whose values have variance 0.06)."""
        for p in self.points:
            if not (p.skill >= level):
                return p.delay
        return None

    def table(self) -> str:
        """A plain-text table, one row per point."""
        lines = [f"{'delay (tokens)':>14}  {self.metric:>9}  {'s.e.':>6}  {'chance':>6}  {'skill':>6}"]
        for p in self.points:
            lines.append(f"{p.delay:>14}  {p.score:>9.3f}  {p.standard_error:>6.3f}  {p.chance:>6.3f}  {p.skill:>6.3f}")
        return "\n".join(lines)


def filler_ladder(longest_delay: int, episode_tokens: int) -> List[int]:
    """Filler lengths in episodes: 0, 1, 2, 4, ... doubling until the delay reaches ``longest_delay``
    tokens (the last one reaches it or goes past it by less than a doubling)."""
    if episode_tokens < 1 or longest_delay < 0:
        raise ValueError(f"delay curve: episode_tokens must be >= 1 and longest_delay >= 0, got "
                         f"{episode_tokens}, {longest_delay}")
    ladder, f = [0], 1
    while (ladder[-1] * episode_tokens) < longest_delay:
        ladder.append(f)
        f *= 2
    return ladder


@torch.no_grad()
def measure_delay_curve(model: torch.nn.Module, probe: Callable[[int, int], Dataset], fillers: Sequence[int],
                        episode_tokens: int, metric: str, episodes: int = 64, batch_size: int = 32,
                        device="cpu", context: Optional[dict] = None) -> DelayCurve:
    """The model's score on ``probe(f, episodes)`` for every filler length f (each item from a fresh
    state, eval mode); delay = f * ``episode_tokens``."""
    curve = DelayCurve(metric)
    for f in sorted(set(int(f) for f in fillers)):
        curve.points.append(DelayPoint(filler_episodes=f, delay=f * episode_tokens,
                                       **probe_scores(model, probe(f, episodes), metric, batch_size, device, context)))
    return curve


def delay_gate(curve: DelayCurve, delay: int, min_skill: float) -> GateResult:
    """``learned`` iff the skill at ``delay`` tokens (the first measured point at or past it) is >= ``min_skill``."""
    p = curve.at(delay)
    if p is None:
        return GateResult(math.nan, math.nan, math.nan, math.nan, min_skill, 0, None)
    return GateResult(p.score, p.standard_error, p.chance, p.skill, min_skill, p.episodes,
                      None if math.isnan(p.skill) else bool(p.skill >= min_skill))


def plot_delay_curve(curve: DelayCurve, title: str = "", marks: Optional[Dict[str, int]] = None):
    """A matplotlib figure: score (±1.96 s.e.) against delay in tokens, chance dashed; ``marks``:
    vertical lines at named delays (e.g. the gate's delay, the longest the stream tests)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.2))
    x = [max(p.delay, 1) for p in curve.points]
    y = [p.score for p in curve.points]
    e = [1.96 * (p.standard_error if math.isfinite(p.standard_error) else 0.0) for p in curve.points]
    ax.errorbar(x, y, yerr=e, marker="o", capsize=3, label=curve.metric)
    ax.plot(x, [p.chance for p in curve.points], "--", color="gray", label="chance")
    for name, d in (marks or {}).items():
        ax.axvline(max(d, 1), color="black", linewidth=0.8, linestyle=":")
        ax.annotate(name, (max(d, 1), ax.get_ylim()[1]), fontsize=7, rotation=90, va="top", ha="right")
    ax.set_xscale("log")
    ax.set_xlabel("delay: tokens between the facts and their query (0 plotted at 1)")
    ax.set_ylabel(curve.metric)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
