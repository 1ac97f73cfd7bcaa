"""A family of tests adjusted for its number: Holm's step-down method (family-wise error; equal to
statsmodels' ``multipletests``), its bounds over a family some of whose tests are still to come, and
Benjamini-Hochberg (false discovery rate, for reference). Which tests form a family is the caller's
declaration (a verdict's stream family, a claim's, a study's declared answer); the arithmetic is here.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

import numpy as np
from scipy import stats


def holm(pvalues: Sequence[float]) -> list:
    """Holm's step-down adjusted p-values (family-wise error over the family ``pvalues``), in the input
    order. NaN p-values (tests that could not be made) stay NaN and do not count in the family size.
    Equal to statsmodels' ``multipletests(method="holm")`` (tested), written out because it is called for
    every table and family (statsmodels' call costs milliseconds each).

    With the m finite p-values sorted, p_(1) <= ... <= p_(m): adj_(k) = max_{i<=k} min(1, (m - i + 1) p_(i)).
    """
    # drop the untested before sorting: NaN compares false with everything, so a NaN among the keys
    # leaves the sort order undefined (holm([0.03, nan, 0.01]) once gave [0.06, nan, 0.06])
    order = sorted((i for i, p in enumerate(pvalues) if p is not None and not math.isnan(p)),
                   key=lambda i: pvalues[i])
    m = len(order)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def holm_bounds(ranges: Sequence[Tuple[float, float]]) -> Tuple[list, list]:
    """Holm over a family some of whose p-values are not known yet: each test is a range (lo, hi) of the p it
    can have ((p, p) for a test made, (0, 1) for one still to come or with no t-test to make, (1, 1) for
    one that counts but can never be read). Returns the adjusted p-values with every test at its lowest and
    at its highest. Holm's adjusted p is nondecreasing in every p of the family, so whatever the unknowns
    turn out to be, each test's adjusted p lies between the two: a reading the same at both is final."""
    return holm([lo for lo, _ in ranges]), holm([hi for _, hi in ranges])


def benjamini_hochberg(pvalues: Sequence[float]) -> list:
    """Benjamini-Hochberg adjusted p-values (scipy.stats.false_discovery_control), NaN kept in place."""
    idx = [i for i, p in enumerate(pvalues) if p is not None and not math.isnan(p)]
    out = [math.nan] * len(pvalues)
    if idx:
        adjusted = stats.false_discovery_control([pvalues[i] for i in idx], method="bh")
        for i, a in zip(idx, np.atleast_1d(adjusted)):
            out[i] = float(a)
    return out
