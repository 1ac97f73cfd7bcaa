"""Study 11's declared decision, computed from its records: does one of OVQ's dictionary rules win the primary
endpoint on every stream (then it becomes a named preset beside the paper's ``ovq``), and if not, which rule
to use where?

Applied to a study with ``answer: rule_on_every_stream``; its ``partition`` names the streams (a stream
setting: stream, keys, budget), its ``baseline`` the paper's rule, ``answer_seeds`` the declared seeds per
configuration. Per stream and rule, paired with the baseline over the seeds of model and data both ran:

- the **primary endpoint**: the final average, against the facts in force where the stream's runs were
  scored so (``summary_current``, decided once per stream), else from R; rule minus baseline, 95% t
  interval, paired t p;
- **which rule where**: on each stream, Holm over that stream's rules; a rule **wins** the stream when
  its adjusted p < ``ALPHA`` and the difference goes the metric's good way (higher accuracy, lower bits
  per byte), **loses** when it goes the other way, else **no difference**;
- **a rule on every stream** (the preset): "wins every stream" is an intersection of one-stream
  hypotheses, tested by the intersection-union test: its p is the largest of its raw stream p's when
  every stream's difference goes the good way (else 1); Holm over the rules. A rule that passes is the
  preset (the one with the smallest p when several do).

A comparison whose pairs all differ by the same nonzero amount has no t-test ("no t-test"): its p is
unknown, and every reading that depends on it (its stream's Holm family, the intersection-union test) is
made with it at 0 and at 1 and stated where both agree, else "undecided". A rule's outcome on a stream
waits ("pending") while it, or another rule of the stream's family (every rule seen on any stream), has
fewer than ``answer_seeds`` pairs: Holm's adjusted p moves with the others', so the unread ones are
counted at p = 0 and p = 1 and the outcome is read where both agree. The decision waits until every
rule has a comparison on every stream, each with ``answer_seeds`` pairs, and every result file of the
study exists. Pairs are made within one code version (the version with the most pairs; runs of other
versions are left out and counted, never pooled); a comparison whose seeds are shared with the baseline's
only across versions is refused, and holds the decision. A rule is the same rule
across streams when its dictionary options agree (the keys that tell a stream's configurations apart,
over all streams, numbers compared as numbers; the dictionary size, set by the budget, is part of the
stream).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from experiments import compare
from experiments.stats import pairing
from experiments.stats.intervals import paired_comparison
from experiments.stats.multiple import holm, holm_bounds
from strategies.evaluation.metrics import higher_is_better

ALPHA = 0.05


@dataclass
class RuleCell:
    """One rule on one stream against the baseline there."""

    stream: str
    rule: Tuple[Tuple[str, str], ...]          # its dictionary options (key, value), the same on every stream
    label: str                                 # those options that differ from the baseline's
    comparison: object                         # PairedComparison, rule - baseline, final average
    higher: bool                               # the metric's good direction
    current: bool                              # scored against the facts in force
    seeds: int = 0                             # the declared pairs (0: two are enough)
    refused: bool = False                      # its seeds are shared with the baseline's only across code versions
    left_out: int = 0                          # runs of other code versions than the one paired
    p_holm: float = math.nan                   # Holm over the stream's rules, those not read yet at p = 1
    p_holm_low: float = math.nan               # ... and at p = 0: equal once every rule of the stream is read
    family_pending: bool = False               # some rule of its stream has no complete comparison yet

    @property
    def good_direction(self) -> bool:
        d = self.comparison.mean_difference
        return not math.isnan(d) and (d > 0) == self.higher and d != 0

    @property
    def complete(self) -> bool:
        """Paired within one code version, with every declared pair (each with its endpoint)."""
        return not self.refused and self.comparison.n >= max(2, self.seeds)

    @property
    def untested(self) -> bool:
        """Pairs enough for a test, but every one differs by the same nonzero amount: no t-test is made
        (:func:`experiments.stats.intervals.paired_comparison`), so neither "wins" nor "no difference" is known."""
        c = self.comparison
        return c.n >= 2 and math.isnan(c.p_t) and c.mean_difference != 0

    def _reading(self, p: float) -> str:
        if math.isnan(p) or p >= ALPHA:
            return "no difference"
        return "wins" if self.good_direction else "loses"

    def readings(self) -> List[str]:
        """What the stream's Holm test can still say of this rule: one reading once it and every rule of
        its stream are read; two while its p is unknown (no t-test) or the family's pending rules could
        move its adjusted p (they are counted at p = 0 and at p = 1: Holm's adjusted p moves the same way
        as the others')."""
        if self.untested:
            return ["no difference", "wins" if self.good_direction else "loses"]
        return list(dict.fromkeys([self._reading(self.p_holm_low), self._reading(self.p_holm)]))

    @property
    def outcome(self) -> str:
        if self.refused:
            return "refused (its seeds and the baseline's were run by different code versions)"
        if not self.complete:
            return f"pending ({self.comparison.n} of {max(2, self.seeds)} pairs)"
        if self.untested:
            return "no t-test (every pair differs by the same amount)"
        found = self.readings()
        if len(found) > 1:
            return ("pending (rules of this stream still to be read could move its Holm p)" if self.family_pending
                    else "undecided (a rule of this stream without a t-test could move its Holm p)")
        return found[0]

    def p_range(self) -> Tuple[float, float]:
        """(lowest, highest) its raw p can be: itself when tested; (0, 1) before it is complete or with no
        t-test (unknown)."""
        if not self.complete or self.untested:
            return 0.0, 1.0
        p = self.comparison.p_t
        return (1.0, 1.0) if math.isnan(p) else (p, p)


def _value_text(v) -> str:
    """A param value as text, numbers as numbers ('32' and '32.0' are one value)."""
    try:
        return repr(float(v))
    except (TypeError, ValueError):
        return str(v)


def rule_cells(streams: Sequence[Tuple[str, List[compare.RunRecord]]], baseline: str, seeds: int = 0) -> List[RuleCell]:
    """Every rule against ``baseline`` on every stream (``[(stream name, its records)]``), each paired within
    one code version (:func:`experiments.pairing.pairs_in_one_version`: the version with the most pairs; the
    runs of other versions are left out and counted), Holm within each stream over every rule seen on any
    stream (a rule with no runs on a stream yet, or whose comparison is not complete, has no p yet: the
    adjustment is made with it at p = 1 and at p = 0; a complete comparison with no t-test counts at its
    unknown p's bounds too). ``seeds``: the declared pairs per comparison."""
    per_stream = []
    for name, records in streams:
        groups = compare.group_records(records)
        bases = compare.matching_groups(groups, baseline)
        if not bases:
            continue                                   # the stream has no runs of the baseline yet
        per_stream.append((name, groups, bases))
    # the rule's identity: the keys that tell configurations apart on some stream (not the code version,
    # which compare adds to split a configuration run by two codes)
    keys = sorted(set().union(*(compare._varying([compare.relevant_params(g[0].params) for g in groups.values()])
                                for _, groups, _ in per_stream)) - {"code_version"}) if per_stream else []

    def identity(run: compare.RunRecord) -> Tuple[Tuple[str, str], ...]:
        params = compare.relevant_params(run.params)
        return tuple((k, _value_text(params.get(k, compare.ABSENT_VALUES.get(k, "None")))) for k in keys)

    cells: List[RuleCell] = []
    for name, groups, bases in per_stream:
        by_rule: Dict[tuple, List[compare.RunRecord]] = {}
        for key in sorted(groups):
            for r in groups[key]:
                by_rule.setdefault(identity(r), []).append(r)
        base_ids = {identity(groups[k][0]) for k in bases}
        if len(base_ids) != 1:
            raise ValueError(f"rule_answer: on {name}, {len(base_ids)} configurations match the baseline `{baseline}`, not one")
        (base_id,) = base_ids
        base_identity = dict(base_id)
        runs = [r for g in groups.values() for r in g]
        current = bool(runs) and all(r.summary_current for r in runs)      # one endpoint for the whole stream
        column = "current:final_average" if current else "final_average"

        def measured(a, b):
            return not (math.isnan(compare._column_value(a, column)) or math.isnan(compare._column_value(b, column)))
        for rule, mine in by_rule.items():
            if rule == base_id:
                continue
            version, pairs, left_out, across = pairing.pairs_in_one_version(mine, by_rule[base_id], measured)
            c = paired_comparison([compare._column_value(a, column) for a, _ in pairs],
                                  [compare._column_value(b, column) for _, b in pairs])
            label = ", ".join(f"{compare._short(k)}={v}" for k, v in rule if base_identity.get(k) != v) or str(rule)
            cells.append(RuleCell(name, rule, label, c, higher_is_better(by_rule[base_id][0].metric), current, seeds,
                                  refused=version is None and across, left_out=left_out))
    _adjust_within_streams(cells)
    return cells


def _adjust_within_streams(cells: Sequence[RuleCell]) -> None:
    """Holm within each stream over every rule seen on any stream (module docstring of :func:`rule_cells`)."""
    rules = list(dict.fromkeys(c.rule for c in cells))
    for stream in dict.fromkeys(c.stream for c in cells):
        mine = {c.rule: c for c in cells if c.stream == stream}
        pending = any(rule not in mine or not mine[rule].complete for rule in rules)
        lows, highs = holm_bounds([mine[rule].p_range() if rule in mine else (0.0, 1.0) for rule in rules])
        for rule, low, high in zip(rules, lows, highs):
            cell = mine.get(rule)
            if cell is not None:
                cell.family_pending = pending
                if cell.complete and not cell.untested:
                    cell.p_holm_low, cell.p_holm = low, high


def every_stream_p(cells: Sequence[RuleCell], streams: Sequence[str],
                   bound: str = "high") -> Dict[tuple, Tuple[float, float]]:
    """Per rule with a comparison on every stream: (the intersection-union p, that p Holm-adjusted over the
    rules). The IUT p is the largest raw stream p when every difference goes the good way, else 1. A
    stream with no t-test has an unknown p: ``bound`` "high" reads it as 1, "low" as 0 (the decision is
    read where both agree)."""
    raw: Dict[tuple, float] = {}
    for rule in dict.fromkeys(c.rule for c in cells):
        mine = [c for c in cells if c.rule == rule]
        if {c.stream for c in mine} != set(streams):
            continue
        if all(c.good_direction and c.comparison.n >= 2 for c in mine):
            raw[rule] = max(c.p_range()[1 if bound == "high" else 0] for c in mine)
        else:
            raw[rule] = 1.0
    adjusted = holm(list(raw.values())) if raw else []
    return {rule: (p, q) for (rule, p), q in zip(raw.items(), adjusted)}


def _which_rule_where(cells: Sequence[RuleCell], streams: Sequence[str]) -> List[str]:
    lines = []
    for s in streams:
        mine = [c for c in cells if c.stream == s]
        wins = sorted((c for c in mine if c.outcome == "wins"), key=lambda c: -abs(c.comparison.mean_difference))
        losses = [c.label for c in mine if c.outcome == "loses"]
        open_ = [c.label for c in mine if c.outcome not in ("wins", "loses", "no difference")]
        best = (", ".join(f"{c.label} ({c.comparison.mean_difference:+.3f})" for c in wins)
                if wins else "the baseline (no rule beats it)")
        lines.append(f"- {s}: {best}" + (f"; worse than the baseline: {'; '.join(losses)}" if losses else "")
                     + (f"; not read (no t-test): {'; '.join(open_)}" if open_ else ""))
    return lines


def decision(cells: Sequence[RuleCell], streams: Sequence[str], seeds: int,
             unwritten: Sequence[str] = ()) -> Tuple[str, Optional[str]]:
    """(the sentence, the rule's label when one wins on every stream, else None). ``unwritten``: the study's
    result files not written yet (streams whose runs have not started, so absent from ``streams``).

    Where a comparison has no t-test, its p is unknown: the decision is read with it at 0 and at 1 and
    stated where both give the same one (e.g. a rule whose difference goes the wrong way somewhere has IUT
    p 1 whatever its t-tests), else it is undecided."""
    rules = list(dict.fromkeys(c.rule for c in cells))
    missing = [s for s in streams if not any(c.stream == s for c in cells)]
    absent = [s for s in streams if s not in missing and {c.rule for c in cells if c.stream == s} != set(rules)]
    short = [c for c in cells if not c.refused and c.comparison.n < max(2, seeds)]
    refused = [c for c in cells if c.refused]
    if unwritten or missing or absent or short or refused:
        why = (f"not written yet: {', '.join(unwritten)}" if unwritten else
               f"no baseline runs yet on {', '.join(missing)}" if missing else
               f"not every rule has runs on {', '.join(absent)}" if absent else
               f"{len(refused)} comparison(s) pair runs of different code versions only" if refused else
               f"{len(short)} comparison(s) have fewer than {seeds} pairs")
        return f"pending ({why})", None
    untested = [c for c in cells if c.untested]
    outcomes = []
    for bound in ("low", "high"):
        tests = every_stream_p(cells, streams, bound)
        passed = sorted((q, p, rule) for rule, (p, q) in tests.items() if q < ALPHA)
        outcomes.append((tests, passed))
    (_, passed_low), (tests, passed) = outcomes
    chosen = {rule for _, _, rule in passed_low}, {rule for _, _, rule in passed}
    if chosen[0] != chosen[1] or (len(chosen[1]) > 1 and untested and passed_low[0][2] != passed[0][2]):
        return (f"undecided ({len(untested)} comparison(s) have no t-test: every pair differs by the same "
                "amount, and the decision depends on their p)"), None
    if passed:
        q, p, rule = passed[0]
        label = next(c.label for c in cells if c.rule == rule)
        return (f"**{label} wins the primary endpoint on every stream** ({len(streams)}; intersection-union "
                f"p {p:.2g}, Holm over {len(tests)} rules {q:.2g}): a named preset beside the paper's rule", label)
    lines = ["**No rule wins the primary endpoint on every stream** (intersection-union test, Holm over "
             f"{len(tests)} rules: smallest adjusted p {min(q for _, q in tests.values()):.2g}"
             + (f"; with {len(untested)} comparison(s) without a t-test read at p 0 and at p 1 alike" if untested else "")
             + "). Which rule to use where (Holm within each stream):"]
    return "\n".join(lines + _which_rule_where(cells, streams)), None


def rule_table(streams: Sequence[Tuple[str, List[compare.RunRecord]]], baseline: str, seeds: int,
               unwritten: Sequence[str] = ()) -> str:
    """The declared decision's table (one row per stream and rule) and its sentence."""
    try:
        cells = rule_cells(streams, baseline, seeds)
    except ValueError as e:
        return f"(no decision: {e})"
    if not cells:
        return ""
    lines = ["| stream | rule (options that differ from the baseline) | n pairs | final average, rule - baseline "
             "[95% CI] | scored against | p Holm (within the stream) | outcome |", "|---|---|---|---|---|---|---|"]
    for c in cells:
        d = c.comparison
        diff = "-" if d.n == 0 else f"{d.mean_difference:+.3f}" + (f" [{d.low:+.3f}, {d.high:+.3f}]" if d.n >= 2 else "")
        same = c.p_holm == c.p_holm_low or (math.isnan(c.p_holm) and math.isnan(c.p_holm_low))
        p = compare._p(c.p_holm) if same else f"{compare._p(c.p_holm_low)} to {compare._p(c.p_holm)}"
        left = f" ({c.left_out} runs of other code versions left out)" if c.left_out else ""
        lines.append(f"| {c.stream} | {c.label} | {d.n}{left} | {diff} | {'facts in force' if c.current else 'R'} | "
                     f"{p} | {c.outcome} |")
    sentence, _ = decision(cells, [name for name, _ in streams], seeds, unwritten)
    return "\n".join(lines + ["", sentence])


def render(ctx, seeds: int) -> List[str]:
    """The section's declared decision: every rule against the spec's ``baseline`` on each stream (its
    ``partition``), final average, paired over seeds, with ``seeds`` pairs each (:func:`rule_table`)."""
    from experiments.report import unfinished_sweeps
    from experiments.sections import _partitions

    spec = ctx.spec
    # a stream whose sweep has not started is not in the records at all, and one whose sweep is running
    # has some of its runs: either holds the decision
    missing = unfinished_sweeps(spec, ctx.root)
    # every run, of every code version: each comparison pairs within one version, which a later version's
    # rerun of some seeds must not take away
    table = rule_table(_partitions(ctx.every_run, spec.partition, spec.partition_default), spec.baseline, seeds, missing)
    return ["The declared decision (`rule_on_every_stream`, applied by `experiments/studies/ovq_plasticity/analysis.py`: "
            f"every rule against `{spec.baseline}` on each stream ({spec.partition}), final average, paired over seeds; "
            "which rule where: Holm over each stream's rules; a rule on every stream: the intersection-union "
            "test, Holm over the rules):", "", table or "(no pairs yet)", ""]


def _check(spec, seeds: int) -> None:
    if not (spec.baseline and spec.partition and seeds >= 2):
        raise ValueError(f"study {spec.name}: section 'rule_answer' needs the spec's baseline and partition and seeds >= 2")


render.check = _check
SECTIONS = {"rule_answer": render}
