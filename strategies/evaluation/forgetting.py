"""Continual-learning summaries of a result matrix, as pure functions (no Avalanche, no torch).

``R[j][i]`` is the score on experience i evaluated right after training on experience j (None where
not measured). ``higher_is_better`` is True for accuracy, False for MSE and bits per byte: then
forgetting and BWT flip sign, so a positive forgetting is always a loss of skill.

Two definitions of forgetting are in use in the literature and they are NOT the same number; every
name here says which one it is (formulas and citations in :data:`DEFINITIONS`, also logged with every
MLflow run):

- ``forgetting_max`` (Chaudhry et al. 2018, "Riemannian Walk"): the best score ever reached on
  experience i before j, minus the score now, ``max_{i <= l < j} R[l][i] - R[j][i]``;
- ``forgetting_learned`` (Avalanche's ``ExperienceForgetting``): the score right after learning i,
  minus the score now, ``R[i][i] - R[j][i]``. Its mean over i is ``-BWT``.

They differ whenever an experience's score improves after it was learned (e.g. a domain recurs):
``forgetting_max >= forgetting_learned`` always.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

Matrix = Sequence[Sequence[Optional[float]]]

DEFINITIONS: Dict[str, str] = {
    "forgetting_max": "mean over i < j of max_{i<=l<j} R[l][i] - R[j][i] (Chaudhry et al. 2018, Riemannian "
                      "Walk, ECCV); best earlier score minus score now; sign flipped for lower-is-better metrics",
    "forgetting_learned": "mean over i < j of R[i][i] - R[j][i] (Avalanche ExperienceForgetting); score right "
                          "after learning minus score now; equals -BWT; sign flipped for lower-is-better metrics",
    "bwt": "mean over i < j of R[j][i] - R[i][i] (Lopez-Paz & Ranzato 2017, GEM); negative = forgetting",
    "final_average": "mean over i <= j of R[j][i] after the last experience j",
    "learning_average": "mean over j of R[j][j]: the score on each experience right after learning it (plasticity)",
}


def _sign(higher_is_better: bool) -> float:
    return 1.0 if higher_is_better else -1.0


def _mean(xs: List[Optional[float]]) -> float:
    """The mean; NaN when empty or when any value is unmeasured (None or NaN): a summary over a matrix
    with a hole is not the summary of the cells that happen to be there."""
    return sum(math.nan if x is None else x for x in xs) / len(xs) if xs else math.nan


def _at(R: Matrix, j: int, i: int) -> float:
    """R[j][i], NaN where it was not measured (None)."""
    v = R[j][i]
    return math.nan if v is None else float(v)


def forgetting_max(R: Matrix, i: int, j: int, higher_is_better: bool = True) -> float:
    """Forgetting of experience i after experience j, max-based (Chaudhry et al. 2018):
    ``max_{i <= l < j} R[l][i] - R[j][i]`` (sign flipped for lower-is-better). NaN if j <= i."""
    if j <= i:
        return math.nan
    s = _sign(higher_is_better)
    earlier = [s * _at(R, l, i) for l in range(i, j)]
    if any(math.isnan(x) for x in earlier):        # max() over a NaN depends on where it stands
        return math.nan
    return max(earlier) - s * _at(R, j, i)


def forgetting_learned(R: Matrix, i: int, j: int, higher_is_better: bool = True) -> float:
    """Forgetting of experience i after experience j, from the score when learned (Avalanche's
    ``ExperienceForgetting``): ``R[i][i] - R[j][i]`` (sign flipped for lower-is-better). NaN if j <= i."""
    if j <= i:
        return math.nan
    return _sign(higher_is_better) * (_at(R, i, i) - _at(R, j, i))


def average_forgetting_max(R: Matrix, j: Optional[int] = None, higher_is_better: bool = True) -> float:
    """Mean of :func:`forgetting_max` over experiences i < j after experience j (default: the last row)."""
    j = len(R) - 1 if j is None else j
    return _mean([forgetting_max(R, i, j, higher_is_better) for i in range(j)])


def average_forgetting_learned(R: Matrix, j: Optional[int] = None, higher_is_better: bool = True) -> float:
    """Mean of :func:`forgetting_learned` over experiences i < j after experience j (default: the last row)."""
    j = len(R) - 1 if j is None else j
    return _mean([forgetting_learned(R, i, j, higher_is_better) for i in range(j)])


def backward_transfer(R: Matrix, j: Optional[int] = None, higher_is_better: bool = True) -> float:
    """BWT (Lopez-Paz & Ranzato 2017): mean over i < j of ``R[j][i] - R[i][i]`` (sign flipped for
    lower-is-better, so a negative BWT is always forgetting)."""
    return -average_forgetting_learned(R, j, higher_is_better)


def learning_accuracy(R: Matrix) -> List[float]:
    """Plasticity: ``R[j][j]``, the score on each experience right after learning it."""
    return [R[j][j] for j in range(len(R))]


def average_score(R: Matrix, j: Optional[int] = None) -> float:
    """Mean of ``R[j][i]`` over i <= j (the final average accuracy when j is the last experience)."""
    j = len(R) - 1 if j is None else j
    return _mean([R[j][i] for i in range(j + 1)])


def forgetting_curve(R: Matrix, tokens_after: Sequence[int]) -> List[Dict[str, float]]:
    """One row per measured (i, j >= i): ``R[j][i]`` against j and against tokens streamed since i.

    tokens_after[j]: tokens streamed (per lane, all layers see the same) when experience j ended.
    """
    rows = []
    for i in range(len(R)):
        for j in range(i, len(R)):
            if R[j][i] is None:
                continue
            rows.append({
                "evaluated_on": i, "trained_on": j, "experiences_since": j - i,
                "tokens_since": tokens_after[j] - tokens_after[i], "score": R[j][i],
            })
    return rows


def summary(R: Matrix, higher_is_better: bool = True) -> Dict[str, float]:
    """The numbers every table shows (see :data:`DEFINITIONS`). With one experience only the scores."""
    out = {"final_average": average_score(R), "learning_average": _mean(learning_accuracy(R))}
    if len(R) > 1:
        out.update({
            "forgetting_max": average_forgetting_max(R, higher_is_better=higher_is_better),
            "forgetting_learned": average_forgetting_learned(R, higher_is_better=higher_is_better),
            "bwt": backward_transfer(R, higher_is_better=higher_is_better),
        })
    return out
