"""Uncertainty over seeds, with scipy: intervals for one configuration and paired tests between two.

Replicates of a configuration are its runs over seeds (model and data). Two configurations run on the
same seeds are compared *paired*: each seed's difference, so that what the seed changes (the facts,
the initialisation) cancels. Beside the paired t-test (which assumes normal differences) come the
exact Wilcoxon signed-rank test (no such assumption; note that with n pairs its smallest two-sided p
is 2 / 2^n: 0.0625 at n = 5, so 5 seeds can never reach 0.05 without normality) and a bootstrap
percentile interval of the mean difference. A family of tests is adjusted in
:mod:`experiments.stats.multiple`; power and equivalence are :mod:`experiments.stats.power`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
from scipy import stats


def finite(values: Sequence[Optional[float]]) -> np.ndarray:
    """The values that are numbers (None and NaN dropped), as float64."""
    return np.array([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)


@dataclass
class Interval:
    """Mean, sample std, and the two-sided Student-t confidence interval of the mean over n replicates."""

    mean: float
    std: float
    low: float
    high: float
    n: int
    level: float = 0.95

    def format(self, digits: int = 3) -> str:
        """``mean ± std [low, high] (n)``; with n = 1 only the value and (1); with n = 0 ``-``."""
        if self.n == 0:
            return "-"
        if self.n == 1:
            return f"{self.mean:.{digits}f} (1)"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}] ({self.n})"


def mean_interval(values: Sequence[Optional[float]], level: float = 0.95) -> Interval:
    """Student-t interval of the mean (scipy.stats.t); NaN bounds with fewer than 2 values; a zero-width
    interval when all values are equal."""
    x = finite(values)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, math.nan, 0, level)
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, math.nan, math.nan, math.nan, 1, level)
    std = float(x.std(ddof=1))
    if std == 0:
        return Interval(mean, 0.0, mean, mean, n, level)
    low, high = stats.t.interval(level, n - 1, loc=mean, scale=std / math.sqrt(n))
    return Interval(mean, std, float(low), float(high), n, level)


@dataclass
class PairedComparison:
    """``a - b`` over n paired replicates: mean difference and its interval, paired t-test, Wilcoxon
    signed-rank test, and Cohen's d_z (mean difference / std of the differences)."""

    n: int
    mean_difference: float
    low: float
    high: float
    t_statistic: float
    p_t: float
    wilcoxon_statistic: float
    p_wilcoxon: float
    effect_size_dz: float
    boot_low: float = math.nan          # bootstrap percentile interval of the mean difference
    boot_high: float = math.nan


def paired_comparison(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> PairedComparison:
    """Paired comparison of two equally long sequences (replicate k of a pairs with replicate k of b);
    pairs where either value is missing are dropped. Tests are two-sided; NaN where undefined (n < 2,
    or every difference zero for Wilcoxon and d_z; every difference *equal* for the t-test and d_z).

    Equal nonzero differences (which scores on a grid of 1/512 make happen with few seeds) have zero
    variance: the t statistic is infinite and scipy would answer p = 0, a certainty two or three seeds
    cannot give. That test is not made (NaN, so Holm leaves it out of its family); Wilcoxon still is."""
    if len(a) != len(b):
        raise ValueError(f"paired_comparison: {len(a)} values against {len(b)}")
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None and not math.isnan(x) and not math.isnan(y)]
    n = len(pairs)
    if n == 0:
        return PairedComparison(0, *([math.nan] * 8))
    d = np.array([x - y for x, y in pairs], dtype=np.float64)
    ci = mean_interval(d, level)
    if n < 2:
        return PairedComparison(n, ci.mean, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    xa, xb = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    if np.all(d == 0):
        return PairedComparison(n, 0.0, 0.0, 0.0, math.nan, 1.0, math.nan, 1.0, math.nan)
    if np.all(np.abs(d - d[0]) <= 1e-12 * max(1.0, abs(float(d[0])))):
        t_stat, t_p = math.nan, math.nan             # zero variance: no t-test (see the docstring)
    else:
        t = stats.ttest_rel(xa, xb)
        t_stat, t_p = float(t.statistic), float(t.pvalue)
    w_stat, w_p = wilcoxon_test(xa, xb)
    sd = float(d.std(ddof=1))
    low, high = bootstrap_interval(d, level)
    return PairedComparison(n, ci.mean, ci.low, ci.high, t_stat, t_p, w_stat, w_p,
                            ci.mean / sd if math.isfinite(t_stat) else math.nan, low, high)


def wilcoxon_test(a: Sequence[float], b: Sequence[float]) -> Tuple[float, float]:
    """The two-sided Wilcoxon signed-rank test of ``a - b`` (zeros dropped, average ranks for ties):
    (statistic, p) exactly as ``scipy.stats.wilcoxon`` gives them (tested against it on every kind of
    input); (NaN, NaN) where scipy refuses the input.

    Exact when there are no zeros and no ties. With ties or zeros and n <= 13, scipy's own answer is an
    exhaustive sign-flip permutation test, which it computes one flip pattern at a time (2**n rankings:
    a report's few hundred such tests took 40 of its 60 s). Ranks of |d| do not change when signs flip,
    so the same test is made here by ``scipy.stats.permutation_test`` with the statistic vectorized over
    the patterns (the sum of the ranks of the positive differences; a zero has no rank, as scipy drops it).
    Larger samples with ties go to scipy's own normal approximation, as ``method="auto"`` does."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = a - b
    nonzero = d[d != 0]
    exact = len(nonzero) == len(d) and len(np.unique(np.abs(d))) == len(d)
    if exact or len(d) > 13 or len(nonzero) == 0:
        try:
            w = stats.wilcoxon(a, b, method="exact" if exact else "auto")
            return float(w.statistic), float(w.pvalue)
        except ValueError:       # scipy refuses some degenerate inputs
            return math.nan, math.nan
    ranks = np.zeros_like(d)                                 # a zero's rank: none (it is dropped)
    ranks[d != 0] = stats.rankdata(np.abs(nonzero))          # average ranks, as scipy's test uses

    def rank_sum_of_positives(x, axis=-1):
        return np.sum((x > 0) * ranks, axis=axis)

    p = stats.permutation_test((d,), rank_sum_of_positives, permutation_type="samples", vectorized=True,
                               n_resamples=9999, alternative="two-sided", axis=-1).pvalue
    r_plus, r_minus = float(ranks[d > 0].sum()), float(ranks[d < 0].sum())
    return min(r_plus, r_minus), float(p)


#: resamples of the bootstrap interval, and its seed (the same numbers on every run of the report)
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 0


def bootstrap_interval(differences: Sequence[float], level: float = 0.95):
    """The percentile bootstrap interval (scipy.stats.bootstrap) of the mean of ``differences``;
    (NaN, NaN) with fewer than 3 values or when they are all equal (nothing to resample)."""
    d = finite(differences)
    if len(d) < 3 or np.all(d == d[0]):
        return math.nan, math.nan
    res = stats.bootstrap((d,), np.mean, confidence_level=level, n_resamples=BOOTSTRAP_RESAMPLES,
                          method="percentile", rng=np.random.default_rng(BOOTSTRAP_SEED))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
