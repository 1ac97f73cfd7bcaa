"""Study 11's declared decision, computed from its records: does one of OVQ's dictionary rules win the primary
endpoint on every stream (then it becomes a named preset beside the paper's ``ovq``), and if not, which rule
to use where?

Applied to a study with ``answer: rule_on_every_stream``; its ``partition`` names the streams (a stream
setting: stream, keys, budget), its ``baseline`` the paper's rule, ``answer_seeds`` the declared seeds per
configuration. Per stream and rule, paired with the baseline over the seeds of model and data both ran:

- the **primary endpoint**: the final average, against the facts in force where the runs were scored so
  (``summary_current``), else from R; rule minus baseline, 95% t interval, paired t p;
- **Holm** over every (stream, rule) comparison of the study, one family;
- a rule **wins** a stream when its adjusted p < ``ALPHA`` and the difference goes the metric's good way
  (higher accuracy, lower bits per byte), **loses** when it goes the other way, else **no difference**.

A rule **wins on every stream** when it wins each of the study's streams. The decision waits ("pending")
until every (stream, rule) comparison has ``answer_seeds`` pairs. A rule is the same rule across streams
when its dictionary options agree (the keys that tell a stream's configurations apart, over all streams;
the dictionary size, set by the budget, is part of the stream).
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
    p_holm: float = math.nan

    @property
    def outcome(self) -> str:
        c = self.comparison
        if c.n < 2 or math.isnan(self.p_holm) or self.p_holm >= ALPHA:
            return "no difference"
        return "wins" if (c.mean_difference > 0) == self.higher else "loses"


def _final(r: compare.RunRecord, current: bool) -> float:
    return float((r.summary_current if current else r.summary).get("final_average", math.nan))


def rule_cells(streams: Sequence[Tuple[str, List[compare.RunRecord]]], baseline: str) -> List[RuleCell]:
    """Every rule against ``baseline`` on every stream (``[(stream name, its records)]``), Holm over all."""
    per_stream = []
    for name, records in streams:
        groups = compare.group_records(records)
        try:
            base_key = compare.find_group(groups, baseline)
        except ValueError:
            continue                                   # the stream has no runs of the baseline yet
        per_stream.append((name, groups, base_key))
    # the rule's identity: the keys that tell configurations apart on some stream
    keys = sorted(set().union(*(compare._varying([compare.relevant_params(g[0].params) for g in groups.values()])
                                for _, groups, _ in per_stream))) if per_stream else []

    def identity(run: compare.RunRecord) -> Tuple[Tuple[str, str], ...]:
        params = compare.relevant_params(run.params)
        return tuple((k, str(params.get(k, compare.ABSENT_VALUES.get(k, "None")))) for k in keys)

    cells: List[RuleCell] = []
    for name, groups, base_key in per_stream:
        base_identity = dict(identity(groups[base_key][0]))
        for key, pairs in compare._pairs_against(groups, base_key):
            rule = identity(groups[key][0])
            current = bool(pairs) and all(a.summary_current and b.summary_current for a, b in pairs)
            c = paired_comparison([_final(a, current) for a, _ in pairs], [_final(b, current) for _, b in pairs])
            label = ", ".join(f"{compare._short(k)}={v}" for k, v in rule if base_identity.get(k) != v) or key
            cells.append(RuleCell(name, rule, label, c, higher_is_better(groups[base_key][0].metric), current))
    tested = [c for c in cells if c.comparison.n >= 2 and not math.isnan(c.comparison.p_t)]
    for cell, p in zip(tested, holm([c.comparison.p_t for c in tested])):
        cell.p_holm = p
    return cells


def decision(cells: Sequence[RuleCell], streams: Sequence[str], seeds: int,
             unwritten: Sequence[str] = ()) -> Tuple[str, Optional[str]]:
    """(the sentence, the rule's label when one wins on every stream, else None). ``unwritten``: the study's
    result files not written yet (streams whose runs have not started, so absent from ``streams``)."""
    missing = [s for s in streams if not any(c.stream == s for c in cells)]
    short = [c for c in cells if c.comparison.n < seeds]
    if unwritten or missing or short:
        why = (f"not written yet: {', '.join(unwritten)}" if unwritten else
               f"no baseline runs yet on {', '.join(missing)}" if missing else
               f"{len(short)} comparison(s) have fewer than {seeds} pairs")
        return f"pending ({why})", None
    rules = list(dict.fromkeys(c.rule for c in cells))
    everywhere = [r for r in rules
                  if all(any(c.rule == r and c.stream == s and c.outcome == "wins" for c in cells) for s in streams)]
    if everywhere:
        label = next(c.label for c in cells if c.rule == everywhere[0])
        return (f"**{label} wins the primary endpoint on every stream** ({len(streams)}): a named preset "
                f"beside the paper's rule", label)
    lines = ["**No rule wins the primary endpoint on every stream.** Which rule to use where:"]
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
             "[95% CI] | scored against | p Holm | outcome |", "|---|---|---|---|---|---|---|"]
    for c in cells:
        d = c.comparison
        diff = "-" if d.n == 0 else f"{d.mean_difference:+.3f}" + (f" [{d.low:+.3f}, {d.high:+.3f}]" if d.n >= 2 else "")
        lines.append(f"| {c.stream} | {c.label} | {d.n} | {diff} | {'facts in force' if c.current else 'R'} | "
                     f"{compare._p(c.p_holm)} | {c.outcome} |")
    sentence, _ = decision(cells, [name for name, _ in streams], seeds, unwritten)
    return "\n".join(lines + ["", sentence])
