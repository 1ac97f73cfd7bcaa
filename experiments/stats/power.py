"""Power and equivalence for paired comparisons over seeds (statsmodels): the smallest difference a
paired t-test would have found, two one-sided tests (TOST) at a declared margin, their exact power,
and the seeds that power needs. "No difference detected" says what could have been seen with it;
"matches" is read only from an equivalence test at a margin declared before the runs.
"""
from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

import numpy as np


def paired_sd(a: Sequence[Optional[float]], b: Sequence[Optional[float]]) -> float:
    """The sample standard deviation of ``a - b`` over the pairs where both are finite (NaN for fewer
    than 2): the spread a paired test over these pairs works with."""
    d = [x - y for x, y in zip(a, b) if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]
    return statistics.stdev(d) if len(d) >= 2 else math.nan


def detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean difference a two-sided paired t-test over ``n`` pairs at level ``alpha`` finds
    with probability ``power``, when the paired differences have standard deviation ``sd``
    (statsmodels' ``TTestPower``: Cohen's d_z solved for, times ``sd``). What "no difference detected"
    could have seen: a difference smaller than this was likely to be missed. NaN with fewer than 2 pairs
    or an unknown spread; 0 for a spread of 0."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    if sd == 0:
        return 0.0
    from statsmodels.stats.power import TTestPower

    d = TTestPower().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power, alternative="two-sided")
    return float(np.asarray(d).item()) * sd


def equivalence_p(a: Sequence[float], b: Sequence[float], margin: float) -> float:
    """The p of two one-sided paired t-tests (TOST, statsmodels' ``ttost_paired``) that ``a - b`` lies
    inside (-margin, +margin): small when the pairs show equivalence at that margin, the larger of the
    two one-sided p. Pairs with a missing side are dropped; NaN with fewer than 2 pairs or zero spread."""
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]
    if len(pairs) < 2 or not margin > 0:
        return math.nan
    xa, xb = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    if np.std(xa - xb) == 0:
        return math.nan
    from statsmodels.stats.weightstats import ttost_paired

    return float(ttost_paired(xa, xb, -margin, margin)[0])


def equivalence_power(sd: float, n: int, margin: float, alpha: float = 0.05, true_difference: float = 0.0) -> float:
    """The probability that two one-sided paired t-tests at level ``alpha`` (TOST) show equivalence within
    +-``margin`` over ``n`` pairs whose differences are normal with standard deviation ``sd`` and mean
    ``true_difference``. Exact: given the sample SD s, both tests reject when the mean lies in
    (-margin + t s / sqrt(n), margin - t s / sqrt(n)) (t the one-sided critical value), the mean is normal
    and independent of s, and (n - 1) s^2 / sd^2 is chi-square with n - 1 degrees of freedom, over which
    the probability is integrated (scipy)."""
    from scipy import integrate
    from scipy import stats as _stats

    if n < 2 or not (sd > 0 and margin > 0):
        return math.nan
    df = n - 1
    t_crit = _stats.t.ppf(1 - alpha, df)
    root_n = math.sqrt(n)

    def given(q: float) -> float:               # q = (n - 1) s^2 / sd^2
        half = margin - t_crit * sd * math.sqrt(q / df) / root_n
        if half <= 0:
            return 0.0
        z = root_n / sd
        return float(_stats.norm.cdf((half - true_difference) * z) - _stats.norm.cdf((-half - true_difference) * z))

    # the acceptance region is empty past q_max: integrate up to there only
    q_max = df * (margin * root_n / (t_crit * sd)) ** 2
    # and over the chi-square's mass alone (past 1e-12 in each tail): quad would miss a narrow peak far out
    lo, hi = _stats.chi2.ppf(1e-12, df), min(q_max, _stats.chi2.ppf(1 - 1e-12, df))
    if hi <= lo:
        return 0.0
    value, _ = integrate.quad(lambda q: given(q) * _stats.chi2.pdf(q, df), lo, hi, limit=200)
    return min(1.0, max(0.0, float(value)))


def equivalence_seeds(sd: float, margin: float, alpha: float = 0.05, power: float = 0.8,
                      true_difference: float = 0.0, most: int = 1000) -> int:
    """The fewest pairs that give two one-sided tests at ``alpha`` the ``power`` to show equivalence within
    +-``margin`` (:func:`equivalence_power`), when the true difference is ``true_difference`` and the paired
    differences have standard deviation ``sd``; ``most`` + 1 where even ``most`` pairs fall short."""
    def enough(n: int) -> bool:
        return equivalence_power(sd, n, margin, alpha, true_difference) >= power

    if not enough(most):
        return most + 1
    low, high = 1, most                # power grows with n: bisect for the fewest that reach it
    while high - low > 1:
        mid = (low + high) // 2
        if enough(mid):
            high = mid
        else:
            low = mid
    return high
