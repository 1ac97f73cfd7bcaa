"""The statistics every reading uses, in one place: the verdict table, the claims and every study's
declared answer call these, and form their own families from them.

- :mod:`experiments.stats.intervals`: a configuration's interval over seeds; a paired comparison of two
  (t-test, exact Wilcoxon, bootstrap interval).
- :mod:`experiments.stats.pairing`: which runs pair (the replicates both ran, within one code version).
- :mod:`experiments.stats.multiple`: Holm over a family (statsmodels), its bounds while some tests are
  still to come, Benjamini-Hochberg.
- :mod:`experiments.stats.power`: the paired SD, the difference a test could have found, equivalence
  (TOST) at a declared margin, its power and the seeds it needs.
- :mod:`experiments.stats.learning`: each experience's skill and whether a run stopped learning.
- :mod:`experiments.stats.reading`: what a difference test may be read as, given who learned (the verdict's
  and the claims' one rule, each in its own words).
"""
