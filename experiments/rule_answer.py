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

A comparison whose pairs all differ by the same nonzero amount has no t-test ("no t-test"), and the decision
is "undecided" while one has. The decision waits ("pending") until every rule has a comparison on every stream, each with
``answer_seeds`` pairs, and every result file of the study exists; a comparison whose runs come from
different code versions is refused (never pooled), and holds the decision. A rule is the same rule
across streams when its dictionary options agree (the keys that tell a stream's configurations apart,
over all streams, numbers compared as numbers; the dictionary size, set by the budget, is part of the
stream).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from experiments import compare
from experiments.intervals import holm, paired_comparison
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
    versions: int = 1                          # code versions among the comparison's runs
    p_holm: float = math.nan                   # Holm over the stream's rules

    @property
    def good_direction(self) -> bool:
        d = self.comparison.mean_difference
        return not math.isnan(d) and (d > 0) == self.higher and d != 0

    @property
    def untested(self) -> bool:
        """Pairs enough for a test, but every one differs by the same nonzero amount: no t-test is made
        (:func:`experiments.intervals.paired_comparison`), so neither "wins" nor "no difference" is known."""
        c = self.comparison
        return c.n >= 2 and math.isnan(c.p_t) and c.mean_difference != 0

    @property
    def outcome(self) -> str:
        if self.versions > 1:
            return "refused (runs of different code versions)"
        if self.untested:
            return "no t-test (every pair differs by the same amount)"
        if self.comparison.n < 2 or math.isnan(self.p_holm) or self.p_holm >= ALPHA:
            return "no difference"
        return "wins" if self.good_direction else "loses"


def _value_text(v) -> str:
    """A param value as text, numbers as numbers ('32' and '32.0' are one value)."""
    try:
        return repr(float(v))
    except (TypeError, ValueError):
        return str(v)


def rule_cells(streams: Sequence[Tuple[str, List[compare.RunRecord]]], baseline: str) -> List[RuleCell]:
    """Every rule against ``baseline`` on every stream (``[(stream name, its records)]``), Holm within each
    stream over its rules."""
    per_stream = []
    for name, records in streams:
        groups = compare.group_records(records)
        try:
            base_key = compare.find_group(groups, baseline)
        except ValueError:
            continue                                   # the stream has no runs of the baseline yet
        per_stream.append((name, groups, base_key))
    # the rule's identity: the keys that tell configurations apart on some stream (not the code version,
    # which compare adds to split a configuration run by two codes)
    keys = sorted(set().union(*(compare._varying([compare.relevant_params(g[0].params) for g in groups.values()])
                                for _, groups, _ in per_stream)) - {"code_version"}) if per_stream else []

    def identity(run: compare.RunRecord) -> Tuple[Tuple[str, str], ...]:
        params = compare.relevant_params(run.params)
        return tuple((k, _value_text(params.get(k, compare.ABSENT_VALUES.get(k, "None")))) for k in keys)

    cells: List[RuleCell] = []
    for name, groups, base_key in per_stream:
        base_identity = dict(identity(groups[base_key][0]))
        runs = [r for g in groups.values() for r in g]
        current = bool(runs) and all(r.summary_current for r in runs)      # one endpoint for the whole stream
        column = "current:final_average" if current else "final_average"
        mine = []
        for key, pairs in compare.pairs_against(groups, base_key):
            rule = identity(groups[key][0])
            c = paired_comparison([compare._column_value(a, column) for a, _ in pairs],
                                  [compare._column_value(b, column) for _, b in pairs])
            label = ", ".join(f"{compare._short(k)}={v}" for k, v in rule if base_identity.get(k) != v) or key
            versions = len({r.code_version for pair in pairs for r in pair})
            mine.append(RuleCell(name, rule, label, c, higher_is_better(groups[base_key][0].metric), current, versions))
        tested = [c for c in mine if c.versions == 1 and c.comparison.n >= 2 and not math.isnan(c.comparison.p_t)]
        for cell, p in zip(tested, holm([c.comparison.p_t for c in tested])):
            cell.p_holm = p
        cells += mine
    return cells


def every_stream_p(cells: Sequence[RuleCell], streams: Sequence[str]) -> Dict[tuple, Tuple[float, float]]:
    """Per rule with a comparison on every stream: (the intersection-union p, that p Holm-adjusted over the
    rules). The IUT p is the largest raw stream p when every difference goes the good way, else 1."""
    raw: Dict[tuple, float] = {}
    for rule in dict.fromkeys(c.rule for c in cells):
        mine = [c for c in cells if c.rule == rule]
        if {c.stream for c in mine} != set(streams):
            continue
        raw[rule] = (max(c.comparison.p_t for c in mine) if all(c.good_direction and c.comparison.n >= 2 for c in mine)
                     else 1.0)
    adjusted = holm(list(raw.values())) if raw else []
    return {rule: (p, q) for (rule, p), q in zip(raw.items(), adjusted)}


def decision(cells: Sequence[RuleCell], streams: Sequence[str], seeds: int,
             unwritten: Sequence[str] = ()) -> Tuple[str, Optional[str]]:
    """(the sentence, the rule's label when one wins on every stream, else None). ``unwritten``: the study's
    result files not written yet (streams whose runs have not started, so absent from ``streams``)."""
    rules = list(dict.fromkeys(c.rule for c in cells))
    missing = [s for s in streams if not any(c.stream == s for c in cells)]
    absent = [s for s in streams if s not in missing and {c.rule for c in cells if c.stream == s} != set(rules)]
    short = [c for c in cells if c.comparison.n < seeds]
    mixed = [c for c in cells if c.versions > 1]
    untested = [c for c in cells if c.versions == 1 and c.untested]
    if unwritten or missing or absent or short or mixed:
        why = (f"not written yet: {', '.join(unwritten)}" if unwritten else
               f"no baseline runs yet on {', '.join(missing)}" if missing else
               f"not every rule has runs on {', '.join(absent)}" if absent else
               f"{len(mixed)} comparison(s) pair runs of different code versions" if mixed else
               f"{len(short)} comparison(s) have fewer than {seeds} pairs")
        return f"pending ({why})", None
    if untested:
        # the intersection-union p is the largest stream p: with one stream untested it is unknown, and
        # max() over a NaN would answer by the order of the streams
        return (f"undecided ({len(untested)} comparison(s) have no t-test: every pair differs by the same "
                "amount)"), None
    tests = every_stream_p(cells, streams)
    passed = sorted((q, p, rule) for rule, (p, q) in tests.items() if q < ALPHA)
    if passed:
        q, p, rule = passed[0]
        label = next(c.label for c in cells if c.rule == rule)
        return (f"**{label} wins the primary endpoint on every stream** ({len(streams)}; intersection-union "
                f"p {p:.2g}, Holm over {len(tests)} rules {q:.2g}): a named preset beside the paper's rule", label)
    lines = ["**No rule wins the primary endpoint on every stream** (intersection-union test, Holm over "
             f"{len(tests)} rules: smallest adjusted p {min(q for _, q in tests.values()):.2g}). Which rule to use "
             "where (Holm within each stream):"]
    for s in streams:
        mine = [c for c in cells if c.stream == s]
        wins = sorted((c for c in mine if c.outcome == "wins"), key=lambda c: -abs(c.comparison.mean_difference))
        losses = [c.label for c in mine if c.outcome == "loses"]
        best = (", ".join(f"{c.label} ({c.comparison.mean_difference:+.3f})" for c in wins)
                if wins else "the baseline (no rule beats it)")
        lines.append(f"- {s}: {best}" + (f"; worse than the baseline: {'; '.join(losses)}" if losses else ""))
    return "\n".join(lines), None


def rule_table(streams: Sequence[Tuple[str, List[compare.RunRecord]]], baseline: str, seeds: int,
               unwritten: Sequence[str] = ()) -> str:
    """The declared decision's table (one row per stream and rule) and its sentence."""
    cells = rule_cells(streams, baseline)
    if not cells:
        return ""
    lines = ["| stream | rule (options that differ from the baseline) | n pairs | final average, rule - baseline "
             "[95% CI] | scored against | p Holm (within the stream) | outcome |", "|---|---|---|---|---|---|---|"]
    for c in cells:
        d = c.comparison
        diff = "-" if d.n == 0 else f"{d.mean_difference:+.3f}" + (f" [{d.low:+.3f}, {d.high:+.3f}]" if d.n >= 2 else "")
        lines.append(f"| {c.stream} | {c.label} | {d.n} | {diff} | {'facts in force' if c.current else 'R'} | "
                     f"{compare._p(c.p_holm)} | {c.outcome} |")
    sentence, _ = decision(cells, [name for name, _ in streams], seeds, unwritten)
    return "\n".join(lines + ["", sentence])
