"""Uncertainty over seeds, with scipy: intervals for one configuration, paired tests between two, and
the adjustment of a family of tests for their number.

Replicates of a configuration are its runs over seeds (model and data). Two configurations run on the
same seeds are compared *paired*: each seed's difference, so that what the seed changes (the facts,
the initialisation) cancels. Beside the paired t-test (which assumes normal differences) come the
exact Wilcoxon signed-rank test (no such assumption; note that with n pairs its smallest two-sided p
is 2 / 2^n: 0.0625 at n = 5, so 5 seeds can never reach 0.05 without normality) and a bootstrap
percentile interval of the mean difference. Many tests in one family are adjusted with Holm's
step-down method (family-wise error) and, for reference, Benjamini-Hochberg (false discovery rate).
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


def holm(pvalues: Sequence[float]) -> list:
    """Holm's step-down adjusted p-values (family-wise error over the family ``pvalues``), in the input
    order. NaN p-values (tests that could not be made) stay NaN and do not count in the family size.

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
