"""What a paired difference test may be read as, given who learned: the one rule the verdict table and the
claims table both apply (each says it in its own words), so that a row of one cannot credit what a row of
the other refuses.

A lead is evidence only between two memories that learned the task (each passing its learned gates on
most, more than half, of the paired seeds): over a memory that did not learn, or by one that did not, a
lead is said and not credited; a significant loss counts whoever learned (a memory that loses to a
non-learner has lost); where neither learned, nothing is read; and "no difference" is read only between
two learners.
"""
from __future__ import annotations

#: the readings, in the words :func:`read_difference` returns
NEITHER_LEARNED = "neither learned"
LOSS = "loss"                                   # significant, in the other side's favour: read whoever learned
LEAD = "lead"                                   # significant, ours ahead, both learned: the evidence a claim needs
LEAD_OVER_NON_LEARNER = "lead over a non-learner"
LEAD_NOT_LEARNED = "lead by a non-learner"      # ours ahead, but ours did not learn
NOT_READ_NON_LEARNER = "not read: the other did not learn"
NOT_READ_NOT_LEARNED = "not read: ours did not learn"
NO_DIFFERENCE = "no difference detected"
READINGS = (NEITHER_LEARNED, LOSS, LEAD, LEAD_OVER_NON_LEARNER, LEAD_NOT_LEARNED, NOT_READ_NON_LEARNER,
            NOT_READ_NOT_LEARNED, NO_DIFFERENCE)


def learned_on_most(learned: int, n: int) -> bool:
    """Whether a side learned on most of ``n`` paired seeds (more than half: half is not most)."""
    return n > 0 and 2 * learned > n


def read_difference(significant: bool, better: bool, ours_learned: bool, theirs_learned: bool) -> str:
    """The reading of a paired test (``significant``: its family-adjusted p < 0.05; ``better``: the mean
    difference is in ours' favour) given whether each side learned on most seeds: one of :data:`READINGS`."""
    if not (ours_learned or theirs_learned):
        return NEITHER_LEARNED
    if significant and not better:
        return LOSS
    if significant:
        return LEAD if ours_learned and theirs_learned else LEAD_NOT_LEARNED if theirs_learned else LEAD_OVER_NON_LEARNER
    if not theirs_learned:
        return NOT_READ_NON_LEARNER
    if not ours_learned:
        return NOT_READ_NOT_LEARNED
    return NO_DIFFERENCE
