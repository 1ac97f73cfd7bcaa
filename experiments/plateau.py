"""The budget rule's plateau test on meta-training's learning curves (one definition, read by the
meta-training table and by the declared answers of studies that read it, in their folders' analysis.py).

A configuration is at its **plateau** when every seed moved by less than ``PLATEAU_GAIN`` over the last
quarter of its logged steps, in the direction of better; otherwise it is **still improving**, and a
study's budget rule runs it again with more steps.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

#: the plateau rule: the metric moved by less than this over the last quarter of the steps (in the
#: direction of better), fixed before any long-horizon run (issue 29)
PLATEAU_GAIN = 0.01

#: where a learning curve flattens: the first logged step by which a seed has made this share of its gain
GAIN_SHARE = 0.95


def meta_rows(runs: Sequence, column: Optional[str] = None) -> Tuple[List[Tuple[int, List[float]]], str]:
    """The logged meta-training rows shared by ``runs`` (records with ``meta_history``; the steps every run
    logged): [(step, [value per run])] of ``column`` (default: the metric), and the metric."""
    metric = runs[0].metric
    column = column or metric
    by_step: Dict[int, List[float]] = {}
    for r in runs:
        for row in r.meta_history:
            if column in row:
                by_step.setdefault(int(row["step"]), []).append(float(row[column]))
    return [(s, v) for s, v in sorted(by_step.items()) if len(v) == len(runs)], metric


def _sign(metric: str) -> float:
    from strategies.evaluation.metrics import higher_is_better

    return 1.0 if higher_is_better(metric) else -1.0


def last_quarter_gains(runs: Sequence) -> Optional[List[float]]:
    """Per run: the metric's change from the last logged step at or before 3/4 of the steps to the last
    step, in the better direction; None with fewer than two shared logged steps."""
    rows, metric = meta_rows(runs)
    if len(rows) < 2:
        return None
    last_step, last = rows[-1]
    earlier = [r for r in rows if r[0] <= 0.75 * last_step] or rows[:1]
    sign = _sign(metric)
    return [sign * (b - a) for a, b in zip(earlier[-1][1], last)]


def still_improving(runs: Sequence) -> Optional[bool]:
    """True when some seed moved by >= ``PLATEAU_GAIN`` over the last quarter; None without a curve."""
    gains = last_quarter_gains(runs)
    return None if gains is None else max(gains) >= PLATEAU_GAIN


def steps_to_gain_share(rows, sign: float, share: float = GAIN_SHARE) -> List[int]:
    """Per run (the columns of :func:`meta_rows`' rows): the first logged step at which the metric has made
    ``share`` of its change from the first logged step to the last, in the better direction (``sign``);
    the first step where the curve never gained."""
    first, last = rows[0][1], rows[-1][1]
    out = []
    for i in range(len(first)):
        gain = sign * (last[i] - first[i])
        out.append(rows[0][0] if gain <= 0 else
                   next(step for step, values in rows if sign * (values[i] - first[i]) >= share * gain))
    return out
