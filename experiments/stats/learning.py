"""Whether a run kept learning: each experience's learning score R[j][j] as skill against its chance,
and the per-experience gate that says a memory *stopped* learning (it passed on experience 0, then fell
below the bar). Stability and plasticity are read together: a win by a memory that stopped taking new
facts is named as such by the verdict and the claims, which both count it here.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence

if TYPE_CHECKING:       # for annotations only: experiments.compare imports this module
    from experiments.compare import RunRecord


def experience_skills(r: "RunRecord") -> List[float]:
    """Skill of each experience's learning score R[j][j] against that experience's chance (the best
    context-free predictor on its own test labels; the stream's pooled chance for a record whose stream
    could not be rebuilt): 0 at chance, 1 perfect; NaN where unknown."""
    from strategies.evaluation.metrics import METRICS, skill

    if not r.R or r.metric not in METRICS:   # a metric this process does not know (its plugin not loaded)
        return []
    if len(r.stream_chances) == len(r.R):
        chances = list(r.stream_chances)
    elif not math.isnan(r.stream_chance):
        chances = [r.stream_chance] * len(r.R)
    else:
        return []
    return [math.nan if r.R[j][j] is None else skill(r.metric, r.R[j][j], chances[j]) for j in range(len(r.R))]


def stopped_learning_at(r: "RunRecord") -> Optional[int]:
    """The per-experience learning gate: the first experience j >= 1 whose learning score is below the
    stream gate's skill threshold after experience 0 passed it (a memory that stopped taking new facts),
    None when every experience passes, or when experience 0 did not (that run did not learn at all,
    which the run's own gates say). A finding shown in the tables, not an exclusion."""
    return _stopped_at(experience_skills(r), r.stream_threshold)


def _stopped_at(skills: List[float], threshold: float) -> Optional[int]:
    """:func:`stopped_learning_at` on a run's per-experience skills, computed once by the caller."""
    if not skills or math.isnan(threshold) or not skills[0] >= threshold:
        return None
    for j, s in enumerate(skills[1:], 1):
        if not s >= threshold:
            return j
    return None


def late_learning(r: "RunRecord") -> float:
    """Plasticity after the first experience: the mean learning score R[j][j] over j >= 1."""
    values = [r.R[j][j] for j in range(1, len(r.R or [])) if r.R[j][j] is not None]
    return statistics.fmean(values) if values else math.nan


@dataclass(frozen=True)
class Stopped:
    """Of a configuration's runs: how many stopped learning (``stopped_learning_at``), of how many whose
    learning could be measured against chance, the earliest experience one stopped at (None when none
    did), how many never learned experience 0, and how many could not be measured."""

    stopped: int
    measured: int
    earliest: Optional[int]
    never: int
    unmeasured: int


def stopped(runs: Sequence["RunRecord"]) -> Stopped:
    """:class:`Stopped` over ``runs`` (each run's skills computed once)."""
    skills = [(experience_skills(r), r.stream_threshold) for r in runs]
    measured = [(s, t) for s, t in skills if any(not math.isnan(x) for x in s) and not math.isnan(t)]
    at = [j for j in (_stopped_at(s, t) for s, t in measured) if j is not None]
    return Stopped(len(at), len(measured), min(at) if at else None, sum(not s[0] >= t for s, t in measured),
                   len(runs) - len(measured))


def stopped_summary(runs: Sequence["RunRecord"]) -> str:
    """``"0/5"``, or ``"3/5 (from exp 1)"``: runs that stopped learning, and the earliest experience.
    A run that never passed the bar on experience 0 cannot stop and is not counted as one that kept
    learning either: ``"0/5 (5 never learned exp 0)"``. A run whose learning scores cannot be read
    against chance (no R matrix or no stream chance, e.g. an MLflow run that logged no R and whose stream
    cannot be rebuilt) is unmeasured, never counted as "did not stop": ``"1/3 (from exp 2; 2 unmeasured)"``, or
    ``"unmeasured"`` when no run is measured."""
    s = stopped(runs)
    if runs and not s.measured:
        return "unmeasured"
    notes = (([f"from exp {s.earliest}"] if s.stopped else []) + ([f"{s.never} never learned exp 0"] if s.never else [])
             + ([f"{s.unmeasured} unmeasured"] if s.unmeasured else []))
    return f"{s.stopped}/{s.measured}" + (f" ({'; '.join(notes)})" if notes else "")
