"""Study 21-confirm's own section: what changed in the verdict since the study it confirms (its spec's
``verdict_changes: {since: NAME}``), the two studies' verdict rows side by side, mixer by mixer."""
from __future__ import annotations

import math
from typing import Dict, List, Optional

from experiments import compare, report
from experiments.report import study_number
from experiments.study_specs import all_studies, load_study, study_names


def changed_table(spec, since: str, root: Optional[str] = None) -> str:
    """What changed in the verdict: the study's verdict rows beside those of the study ``since``, one line
    per mixer (the rows' mixers, whatever their recipe), each side as the verdict table prints it: the
    mean final average of OVQ and the mixer over the row's pairs, OVQ - mixer with its 95% interval and
    pairs, the word and its Holm p in its own family, forgetting's word, and how many runs stopped
    learning. The two studies' runs are never paired with each other (other runs, perhaps other seeds
    and code): a change is read from the two rows side by side, not tested. Every mixer of either study
    has a line; one with no row, a refused row, or several rows (partitions) in a study says so in that
    study's cells."""
    earlier = load_study(since)
    # each study's rows as the verdict table makes them: within its own table (confirmatory or exploratory),
    # whose families and repeated rows are that table's; one computation where both share a table
    pools = {flag: report.verdict_entries([s for s in all_studies() if s.confirmatory == flag], root)
             for flag in {earlier.confirmatory, spec.confirmatory}}

    def by_mixer(title: str) -> Dict[str, list]:
        """mixer -> its rows (a VerdictRow, or the note of a refused one; a repeat of an earlier row left out)."""
        rows: Dict[str, list] = {}
        for e in [e for entries in pools.values() for e in entries]:
            if e.study != title or e.same_as is not None:
                continue
            if e.row is not None:
                rows.setdefault(e.row.other.split(" ")[0], []).append(e.row)
            elif e.note.startswith("refused ("):
                rows.setdefault(e.note[len("refused ("):].split(")", 1)[0].split(" ")[0], []).append(e.note)
        return rows

    before, after = by_mixer(earlier.title), by_mixer(spec.title)
    if not after:
        return ""
    b, a = study_number(earlier.title), study_number(spec.title)

    def mean(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.3f}"

    def cells(rows: Optional[list]) -> List[str]:
        if not rows:
            return ["no row"] + ["-"] * 4
        if len(rows) > 1:
            return [f"{len(rows)} rows (see the verdict table)"] + ["-"] * 4
        r = rows[0]
        if isinstance(r, str):                    # refused: pairs of code versions not declared comparable
            return ["refused (see the verdict table)"] + ["-"] * 4
        p = r.primary
        holm_p = "" if math.isnan(r.p_primary_adjusted) else f" (Holm p {compare._p(r.p_primary_adjusted)})"
        return [f"{mean(r.final_means[0])} / {mean(r.final_means[1])}",
                f"{report._paired_cell(p, r.higher_is_better)} ({p.n if p else 0})" if p is not None else "-",
                f"{r.primary_verdict}{holm_p}", r.verdict, f"{r.stopped[0]} / {r.stopped[1]}"]

    head = ["mixer"] + [f"{side}: {what}" for side in (b, a) for what in (
        "final average, OVQ / mixer", "OVQ - mixer [95% CI] (pairs)", "verdict", "forgetting", "stopped learning, OVQ / mixer")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mixer in sorted(set(before) | set(after)):
        lines.append("| " + " | ".join([mixer] + cells(before.get(mixer)) + cells(after.get(mixer))) + " |")
    return "\n".join(lines)



def render(ctx, since: str) -> List[str]:
    """This study's verdict rows beside those of the study ``since`` (its folder's name)."""
    table = changed_table(ctx.spec, since, ctx.root)
    if not table:
        return []
    earlier = study_number(load_study(since).title)
    return [f"What changed in the verdict: this study's verdict rows beside {earlier}'s, mixer by mixer (the "
            "verdict table's numbers and words, each row in its own family; the two studies' runs are not "
            "paired with each other, so a change is read from the two rows, not tested):", "", table, ""]


def _check(spec, since: str) -> None:
    if not spec.verdict:
        raise ValueError(f"study {spec.name}: section 'verdict_changes' needs verdict rows of its own (verdict:)")
    if since not in study_names():
        raise ValueError(f"study {spec.name}: section 'verdict_changes': since names no study: {since!r}")


render.check = _check
SECTIONS = {"verdict_changes": render}
