"""Uncertainty over seeds, with scipy: intervals for one configuration, paired tests between two.

Replicates of a configuration are its runs over seeds (model and data). Two configurations run on the
same seeds are compared *paired*: each seed's difference, so that what the seed changes (the facts,
the initialisation) cancels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

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


def paired_comparison(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> PairedComparison:
    """Paired comparison of two equally long sequences (replicate k of a pairs with replicate k of b);
    pairs where either value is missing are dropped. Tests are two-sided; NaN where undefined (n < 2,
    or every difference zero for Wilcoxon and d_z)."""
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
    t = stats.ttest_rel(xa, xb)
    try:
        w = stats.wilcoxon(xa, xb)
        w_stat, w_p = float(w.statistic), float(w.pvalue)
    except ValueError:       # scipy refuses some degenerate inputs
        w_stat, w_p = math.nan, math.nan
    sd = float(d.std(ddof=1))
    return PairedComparison(n, ci.mean, ci.low, ci.high, float(t.statistic), float(t.pvalue), w_stat, w_p,
                            ci.mean / sd if sd > 0 else math.nan)
