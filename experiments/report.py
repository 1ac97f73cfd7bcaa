"""RESULTS.md, generated: every study's tables come from its runs' JSON, never from a hand-edited file.

A study is a folder under ``experiments/studies/`` (its ``study.yaml``, :class:`StudySpec`): its setup
(prose), the commands that produce its runs (``ovq-cl sweep ... --out results``), the JSON files they
write, the baseline for paired tests, the parts of its section, and its findings (prose written after
reading the tables; it quotes them). This module writes the document: the header, the claims, the
verdict table and every study's section (:mod:`experiments.sections`).

    ovq-cl study icr_frozen          # runs the study's commands, then rewrites RESULTS.md
    ovq-cl report                    # rewrites RESULTS.md from the JSON already in results/

A section shows by default: the commands, a summary table (95% CIs over seeds of model and data, the
learned gate, both forgetting definitions, state bytes and parameters), paired tests against the baseline,
the mean result matrix of each configuration with the mean per-cell standard error, the wall time per
run, and the findings.
"""
from __future__ import annotations

import functools
import json
import math
import os
import shlex
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from omegaconf import OmegaConf

from experiments import compare
from experiments.stats.multiple import holm, holm_bounds
from experiments.sections import PROJECT_DIR, _partitions, _raw, section
from experiments.study_specs import StudySpec, all_studies, load_study


#: RESULTS.md's head: how to read the tables (prose, kept beside the studies' prose, not in code)
HEADER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_header.md")


def header() -> str:
    with open(HEADER_FILE) as fh:
        return fh.read()




def unfinished_sweeps(spec, root: str, patterns: Sequence[str] = ()) -> List[str]:
    """The study's declared sweeps whose result file holds fewer runs than the sweep's grid has (not started,
    or some runs still to come): "results/x.json (2 of 6 runs)"; and every declared result file that no
    sweep of the study writes and that does not exist. A file written as runs finish exists long before
    its sweep is done, so whether it exists says too little.

    A sweep command is read by the CLI's own parser (``--grid=...``, defaults for ``--name`` and ``--out``).
    Its runs are counted as distinct ``config_id``s of one code version (the version with the most): a
    record merged twice is one run, and runs of another code version do not finish a sweep they cannot be
    paired with. A file that cannot be read is said, not skipped. A sweep whose missing runs another declared
    sweep makes (a session ended mid-sweep) is finished once those records are merged into its file
    (``ovq-cl merge``), as the pieces of a sweep run in parallel are; and a sweep each of whose runs is in
    one of the study's result files, whichever (a run two sweeps reach is run once, for the first), is
    finished.

    ``patterns`` (:func:`compare.params_match`'s): only sweeps with a run that matches one of them count (a
    table that reads those configurations waits for nothing else); a sweep whose runs cannot be expanded
    here (an unknown config file, an override this code rejects) counts, so nothing is left out unseen."""
    from experiments.arguments import build_parser, parse_args
    from experiments.sweep import parse_grid

    def matters(args) -> bool:
        """Whether a sweep counts here: any, without patterns; else one with a run matching them."""
        return not patterns or _sweep_matches(args, root, patterns)

    out, written = [], set()
    parser = build_parser()
    for command in spec.commands:
        argv = shlex.split(command)
        if argv[:2] != ["ovq-cl", "sweep"]:
            continue
        args = parse_args(parser, argv[1:])
        expected = 1
        for values in parse_grid(args.grid).values():
            expected *= len(values)
        path = os.path.normpath(os.path.join(args.out, args.name + ".json"))
        written.add(path)
        try:
            with open(os.path.join(root, path)) as f:
                records = json.load(f)
        except FileNotFoundError:
            records = []
        except (OSError, ValueError) as e:
            if matters(args):
                out.append(f"{path} (unreadable: {type(e).__name__})")
            continue
        per_version: Dict[str, set] = {}
        for i, d in enumerate(records if isinstance(records, list) else []):
            d = d if isinstance(d, dict) else {}
            per_version.setdefault(str(d.get("code_version")), set()).add(d.get("config_id") or d.get("run_id") or i)
        have = max((len(ids) for ids in per_version.values()), default=0)
        # only an unfinished sweep is expanded to see whether it matters here (expanding builds every config)
        if have < expected and matters(args) and not _held_in_study_files(spec, root, argv[1:]):
            out.append(f"{path} ({have} of {expected} runs)")
    for path in spec.results:
        if os.path.normpath(path) not in written and not os.path.exists(os.path.join(root, path)):
            out.append(f"{path} (not written)")
    return out


def _held_in_study_files(spec, root: str, argv: Sequence[str]) -> bool:
    """:func:`experiments.held_runs.sweep_held`, False where the sweep cannot be expanded here: an unknown config
    file (OSError), an override or a value this code rejects (ValueError, TypeError, KeyError: omegaconf's
    missing keys), an argument its parser rejects (SystemExit), or a result file that is not a list of run
    records (ValueError). Anything else is a bug in this code and is raised. A spec without pins (``code``)
    is held by records of any code version."""
    from experiments.held_runs import sweep_held

    try:
        return sweep_held(spec, root, argv)
    except (ValueError, TypeError, KeyError, OSError, SystemExit):
        return False


def _sweep_matches(args, root: str, patterns: Sequence[str]) -> bool:
    """Whether some run of a parsed sweep command matches one of ``patterns`` (True when its runs cannot
    be expanded here)."""
    from experiments.sweep import expand, parse_grid
    from experiments.tracking.params import flatten_config

    try:
        configs = expand(os.path.join(root, args.config), args.overrides, parse_grid(args.grid), plugins=getattr(args, "plugin", []))
    except Exception:          # noqa: BLE001 - any failure to expand: counted, never skipped
        return True
    return any(compare.params_match(flatten_config(c), p) for c in configs for p in patterns)


VERDICT_FILE = os.path.join(os.path.dirname(__file__), "verdict.yaml")


def _kb(x: float) -> str:
    return "-" if x != x else (f"{x / 1024:,.0f}K" if x >= 10240 else f"{x:,.0f}")


@dataclass
class VerdictEntry:
    """One row of the verdict table before it is written: where it comes from and its comparison (or,
    for a place without one, the reason), its family, and the earlier row it repeats, if any."""

    stream: str
    family: str
    where: str
    row: Optional[compare.VerdictRow] = None
    note: str = ""
    same_as: Optional[int] = None          # the number of the earlier row with the same runs
    declared_tests: int = 0                # its study's declared tests (confirmatory; 0: none declared)
    study: str = ""                        # its study's title (a family's declared tests are per study)
    configurations: Tuple[list, ...] = ()   # the runs of its two configurations (OVQ baseline's, the other's)


def declared_design(spec: StudySpec) -> Tuple[int, int]:
    """(seeds, tests) a confirmatory study declared in its sweep command: the number of values of its seed
    axis, and of its ``model.layers`` axis (a joint axis led by it too) without OVQ (the verdict compares
    OVQ with every mixer that has no OVQ layer); (0, 0) for an exploratory study or one whose command does
    not say."""
    from experiments.sweep import parse_grid

    if not spec.confirmatory:
        return 0, 0
    seeds = tests = 0
    for command in spec.commands:
        argv = shlex.split(command)
        if argv[:2] != ["ovq-cl", "sweep"]:
            continue
        grid = parse_grid([argv[i + 1] for i, a in enumerate(argv) if a == "--grid"])
        for key, values in grid.items():
            keys = [k.strip() for k in key.split("&")]
            if keys == ["seed"]:
                seeds = max(seeds, len(values))
            elif keys[0] == "model.layers":
                tests = max(tests, sum("ovq" not in compare._layers(v.split("&")[0]) for v in values))
    return seeds, tests


def verdict_entries(specs: List[StudySpec], root: Optional[str] = None) -> List[VerdictEntry]:
    """Every verdict row of every study with ``verdict``, in study order, with:

    - **one row per piece of evidence**: a row whose runs (config ids, both sides) are those of an
      earlier row, or whose result matrices are (runs repeated under a setting that changes no number,
      e.g. the delay probe's size), points to it (``same_as``) and is left out of the multiplicity
      adjustment;
    - **Holm within each family** (the study's ``family``, default its own stream) and endpoint: the
      primary endpoint's p-values adjusted together, the forgetting p-values together; the verdict words
      use the adjusted p.
    """
    entries: List[VerdictEntry] = []
    for spec in specs:
        if not spec.verdict or not spec.baseline:
            continue
        family = spec.family or spec.verdict
        seeds, tests = declared_design(spec)
        records = [compare.record_from_json(d) for d in _raw(spec, root)]
        if not records:
            entries.append(VerdictEntry(spec.verdict, family, "-", note="no runs yet", declared_tests=tests, study=spec.title))
            continue
        for value, subset in _partitions(records, spec.partition, spec.partition_default):
            where = "-" if value is None else _where(spec.partition, value)
            try:
                rows = compare.verdict_rows(subset, spec.baseline)
            except ValueError as e:
                entries.append(VerdictEntry(spec.verdict, family, where, note=f"no OVQ baseline here ({e})"))
                continue
            sides = _row_configurations(subset, spec.baseline, rows)
            for r, configurations in zip(rows, sides):
                r.declared_seeds = seeds
                if len(r.code_versions) > 1:      # pairs made by different code: refused, never pooled
                    entries.append(VerdictEntry(spec.verdict, family, where, note=(
                        f"refused ({r.other}): its pairs were made by code versions {', '.join(sorted(r.code_versions))}: "
                        "a verdict row pairs runs of one code version (rerun the older side with today's code)"),
                        declared_tests=tests, study=spec.title, configurations=configurations))
                else:
                    entries.append(VerdictEntry(spec.verdict, family, where, r, declared_tests=tests, study=spec.title,
                                                configurations=configurations))
    seen: Dict[frozenset, int] = {}
    for n, e in enumerate(entries, 1):
        if e.row is None:
            continue
        keys = [k for k in (e.row.run_ids, e.row.results) if k]
        earlier = [seen[k] for k in keys if k in seen]
        if earlier:
            e.same_as = min(earlier)
        for k in keys:
            seen.setdefault(k, n)
    for family in {e.family for e in entries}:
        members = [e for e in entries if e.family == family]
        counted = [e.row for e in members if e.row is not None and e.same_as is None]
        declared = {e.study: e.declared_tests for e in members if e.declared_tests}
        if not declared:
            # an exploratory family: the tests made (one without a t-test is left out, as Holm leaves it)
            for adjusted, r in zip(holm([r.primary.p_t if r.primary is not None else math.nan for r in counted]), counted):
                r.p_primary_adjusted = adjusted
            forgetting = [r.forgetting.p_t if r.n_pairs >= 2 else math.nan for r in counted]
            for adjusted, r in zip(holm(forgetting), counted):
                r.p_forgetting_adjusted = adjusted
            continue
        # a declared (confirmatory) family: its size is what the studies declared, whatever the data. A
        # test made without a t-test, or refused, counts as p = 1; a row short of its declared seeds, and
        # a declared test with no row yet, have no p yet: at p = 1 (the adjusted p shown) and at p = 0
        # (the low bound), and a word is read only where both agree
        missing = max(0, sum(declared.values()) - sum(1 for e in members if e.same_as is None
                                                          and (e.row is not None or e.note.startswith("refused"))))

        refused = sum(1 for e in members if e.row is None and e.note.startswith("refused"))
        unknown, never = (0.0, 1.0), (1.0, 1.0)

        def primary(r):
            p = 1.0 if r.primary is None or math.isnan(r.primary.p_t) else r.primary.p_t
            return unknown if r.pending else (p, p)
        low, high = holm_bounds([primary(r) for r in counted] + [never] * refused + [unknown] * missing)
        for r, hi, lo in zip(counted, high, low):
            r.p_primary_adjusted, r.p_primary_low = (math.nan, math.nan) if r.pending else (hi, lo)

        # forgetting (secondary): the tests made, as declared in the findings (one without a test is left
        # out: NaN); rows short of their seeds and declared tests with no row yet are still to come
        def forgetting(r):
            p = r.forgetting.p_t if r.n_pairs >= 2 else math.nan
            return unknown if r.pending else (p, p)
        low, high = holm_bounds([forgetting(r) for r in counted] + [unknown] * missing)
        for r, hi, lo in zip(counted, high, low):
            r.p_forgetting_adjusted, r.p_forgetting_low = (math.nan, math.nan) if r.pending else (hi, lo)
    return entries


def _row_configurations(records: List[compare.RunRecord], baseline: str,
                        rows: List[compare.VerdictRow]) -> List[Tuple[list, ...]]:
    """The runs of the two configurations behind each of ``rows`` (``compare.verdict_rows(records,
    baseline)``): the baseline's, and the other's. The other is the group whose runs the row paired (its
    ``run_ids``); a row without pairs takes the group in ``verdict_rows``' order (every group but the
    baseline and OVQ's, sorted); () where neither says."""
    groups = compare.group_records(records)
    base_key = compare.find_group(groups, baseline)
    others = [k for k in sorted(groups) if k != base_key
              and "ovq" not in compare._layers(groups[k][0].params.get("model.layers", ""))]

    def ids(key: str) -> set:
        return {r.config_id or r.label + str(r.replicate) for r in groups[key]}

    out = []
    for i, r in enumerate(rows):
        overlap = {k: len(ids(k) & r.run_ids) for k in others}
        paired = [k for k, n in overlap.items() if n and n == max(overlap.values())]
        key = paired[0] if len(paired) == 1 else (others[i] if not r.run_ids and len(others) == len(rows) else None)
        out.append(() if key is None else (groups[base_key], groups[key]))
    return out


def _rerun_cell(e: VerdictEntry, verification: Dict[str, Dict[str, dict]]) -> str:
    """The verdict table's ``rerun check``: whether both configurations of the row were rerun bit for bit
    (``ovq-cl report --verify``, ``results/verification.json``)."""
    from experiments.rerun_check import configuration_entry, row_state

    if not e.configurations:
        return ""
    return row_state([configuration_entry(verification, e.study, runs) for runs in e.configurations])


def _plus(x: float, what: str) -> str:
    """`` + 58K shared``; '' for nothing."""
    return f" + {_kb(x)} {what}" if x and x == x else ""


def _paired_cell(c, higher_is_better: bool = True, boot: bool = False) -> str:
    if c is None or c.n == 0:
        return "-"
    arrow = "" if higher_is_better else " (lower is better)"
    if c.n < 2 or math.isnan(c.low):
        return f"{c.mean_difference:+.3f}{arrow}"
    text = f"{c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}]"
    if boot and not math.isnan(c.boot_low):
        text += f" boot [{c.boot_low:+.3f}, {c.boot_high:+.3f}]"
    return text + arrow


def verdict_table(specs: List[StudySpec], root: Optional[str] = None, prefix: str = "") -> str:
    """The verdict, one row per (study with ``verdict``, partition value, configuration other than the
    study's OVQ baseline), led by the declared primary endpoint (the final average, against the facts in
    force where the stream has them; OVQ - other over every shared seed, t and bootstrap intervals, raw
    and Holm-adjusted p, exact Wilcoxon p), then stability and plasticity side by side: forgetting_max
    (other - OVQ, on seeds where both learned; raw and Holm p), the learning score of the experiences
    after the first (OVQ - other) and how many runs stopped learning at some experience. State bytes
    and parameters of both, and the rerun check of its two configurations (:func:`experiments.rerun_check.row_state`
    of ``results/verification.json``). A row made of the runs of an earlier row says so instead of
    repeating it. Rows are numbered ``{prefix}1``, ``{prefix}2``, ..."""
    from experiments.rerun_check import load_verification

    verification = load_verification(root or PROJECT_DIR)
    head = ["#", "stream (family)", "where", "against", "seeds (both learned)",
            "**final average, OVQ - other** [95% CI]", "p t / Holm", "p Wilcoxon", "**verdict**",
            "forgetting_max, other - OVQ [95% CI]", "p t / Holm", "forgetting", "late learning, OVQ - other",
            "stopped learning, OVQ / other", "bytes per lane OVQ / other (+ shared by all lanes)",
            "params OVQ / other (+ learned buffers)", "rerun check"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, e in enumerate(verdict_entries(specs, root), 1):
        n = f"{prefix}{n}"
        stream = e.stream + (f" ({e.family})" if e.family != e.stream else "") + (" (facts in force)" if e.row is not None and e.row.current else "")
        check = _rerun_cell(e, verification)
        if e.row is None:
            lines.append(f"| {n} | {stream} | {e.where} | | | | | | {e.note} |" + " |" * 7 + f" {check} |")
            continue
        r = e.row
        if e.same_as is not None:
            lines.append(f"| {n} | {stream} | {e.where} | {r.other} | | | | | same runs as row {prefix}{e.same_as} |"
                         + " |" * 7 + f" {check} |")
            continue
        p, f = r.primary, r.forgetting
        fcell = "-" if r.n_pairs == 0 else _paired_cell(f)
        lines.append(
            f"| {n} | {stream} | {e.where} | {r.other} | {p.n if p else 0} ({r.n_pairs}) | "
            f"{_paired_cell(p, r.higher_is_better, boot=True)} | {compare._p(p.p_t)} / {compare._p(r.p_primary_adjusted)} | "
            f"{compare._p(p.p_wilcoxon)} | {r.primary_verdict} | {fcell} | "
            f"{compare._p(f.p_t) if r.n_pairs else '-'} / {compare._p(r.p_forgetting_adjusted)} | {r.verdict} | "
            f"{_paired_cell(r.late_learning, r.higher_is_better)} | {r.stopped[0]} / {r.stopped[1]} | "
            f"{_kb(r.state_bytes[0])}{_plus(r.shared_bytes[0], 'shared')} / {_kb(r.state_bytes[1])}"
            f"{_plus(r.shared_bytes[1], 'shared')} | {_kb(r.parameters[0])}{_plus(r.learned_buffers[0], 'buffers')} / "
            f"{_kb(r.parameters[1])}{_plus(r.learned_buffers[1], 'buffers')} | {check} |")
    return "\n".join(lines)


def _listed(specs: List[StudySpec]) -> str:
    """"sections N, M and K": the numbers of the studies with verdict rows among ``specs``."""
    numbers = [study_number(s.title).split(" ", 1)[1] for s in specs if s.verdict and study_number(s.title) != s.title]
    words = ", ".join(numbers[:-1]) + (" and " if len(numbers) > 1 else "") + numbers[-1] if numbers else ""
    return f"section{'s' if len(numbers) > 1 else ''} {words}"


def study_number(title: str) -> str:
    """``"N. Title"`` -> ``"study N"`` (the title itself where it has no number)."""
    head = title.split(".", 1)[0]
    return f"study {head}" if head.isdigit() else title


def _where(partition: str, value: str) -> str:
    """``"strategy.name, strategy.options.ewc_lambda", "ewc, 100.0"`` -> ``"name=ewc, ewc_lambda=100.0"``
    (a key a run lacks, "-", is left out)."""
    keys = [k.strip().rsplit(".", 1)[-1] for k in partition.split(",")]
    values = compare.split_top_level(value) if len(keys) > 1 else [value]
    return ", ".join(f"{k}={v}" for k, v in zip(keys, values) if v != "-")


def verdict_section(specs: List[StudySpec], root: Optional[str] = None) -> str:
    """The verdict on the claim: the generated table, then the prose of ``experiments/verdict.yaml``
    (written after reading the table)."""
    prose = OmegaConf.load(VERDICT_FILE) if os.path.exists(VERDICT_FILE) else {}
    confirmatory = [s for s in specs if s.confirmatory]
    exploratory = [s for s in specs if not s.confirmatory]
    parts = ["## Verdict: what OVQ holds at the end, and what it forgets", "", str(prose.get("setup", "")).strip(), ""]
    if any(s.verdict for s in confirmatory):
        parts += ["**Confirmatory rows** (declared in their study specs before their runs: one budget per stream "
                  f"family, 10 seeds of model and data, the primary endpoint; {_listed(confirmatory)}; a row short of "
                  "its declared seeds is pending, and each family's Holm adjustment counts every test its study "
                  "declared, one still to come at p = 0 and at p = 1, a word read only where both agree):", "",
                  verdict_table(confirmatory, root, prefix="C"), "",
                  "**Exploratory rows** (every other setting; 5 seeds; endpoint declared after the runs):", ""]
    parts += [verdict_table(exploratory, root, prefix="E" if any(s.verdict for s in confirmatory) else ""), ""]
    if str(prose.get("findings", "")).strip():
        parts += [str(prose["findings"]).strip(), ""]
    return "\n".join(parts)


def write_report(path: Optional[str] = None, root: Optional[str] = None, only: Optional[str] = None) -> str:
    """RESULTS.md: the header, the paper's claims, the verdict table, then an index of the studies, one line
    each (its section's title, its reading, a link); each study's section is a page of its own,
    ``results/studies/NAME.md`` beside RESULTS.md, from the JSON under ``root`` (default: the project).
    ``only``: that study's page alone is written (the claims and the verdict table still read every study),
    as a smoke run writes it: a section draws its figures, and a smoke folder that collects many studies'
    tiny results would draw them all again for each study. Returns RESULTS.md's path."""
    from experiments.claims import awaited_study, claims_section

    path = path or os.path.join(PROJECT_DIR, "RESULTS.md")
    specs = all_studies()
    base = root or PROJECT_DIR
    pages = os.path.join(os.path.dirname(os.path.abspath(path)), STUDY_PAGES)
    os.makedirs(pages, exist_ok=True)
    for spec in specs if only is None else [load_study(only)]:
        with open(os.path.join(pages, f"{spec.name}.md"), "w") as fh:
            fh.write(study_page(spec, root))
    # a claims row that awaits a declared study is "not decided" while any of that study's runs is still to
    # come; the claims, README's findings and the index ask about one study several times: asked once each
    unfinished = functools.lru_cache(maxsize=None)(lambda name: tuple(unfinished_sweeps(awaited_study(name), base)))
    text = (header() + "\n" + claims_section(base, unfinished=unfinished, state=_claim_state(base))
            + "\n" + verdict_section(specs, root) + "\n" + study_index(specs, base, unfinished))
    with open(path, "w") as fh:
        fh.write(text.rstrip() + "\n")
    if os.path.abspath(path) == os.path.abspath(os.path.join(PROJECT_DIR, "RESULTS.md")) and only is None:
        write_findings(base, unfinished=unfinished)
    return path


#: where each study's page is written, relative to RESULTS.md's folder
STUDY_PAGES = os.path.join("results", "studies")


def study_page(spec: StudySpec, root: Optional[str] = None) -> str:
    """A study's page: a line back to the index, then its section (:func:`experiments.sections.section`),
    whose links to files under ``results/`` are made relative to the page."""
    body = section(spec, root).replace("](results/", "](../")
    return (f"[Results](../../RESULTS.md) > {spec.title}\n\n<!-- generated by `ovq-cl report` from "
            f"experiments/studies/{spec.name}/ and its runs; do not edit -->\n\n{body.rstrip()}\n")


def study_index(specs: List[StudySpec], root: str, unfinished: Optional[Callable[[str], Sequence[str]]] = None) -> str:
    """One line per study, in the order of their sections: its title (a link to its page), its reading (the
    spec's ``reading``, written from its findings), and the runs still to come where its sweeps are not done
    (``unfinished(name)``: :func:`unfinished_sweeps` of the study so named, asked here when not given)."""
    lines = ["## The studies", "", "Each study's section (its setup, commands, tables, tests, figures and findings) "
             f"is a page of its own under `{STUDY_PAGES}/`; the line beside it is its reading, written from its "
             "findings.", ""]
    for spec in specs:
        reading = " ".join(spec.reading.split()) or "No reading yet."
        missing = (unfinished(spec.name) if unfinished else unfinished_sweeps(spec, root)) if spec.commands else []
        todo = f" (runs still to come: {'; '.join(missing)})" if missing else ""
        lines.append(f"- [{spec.title}]({STUDY_PAGES}/{spec.name}.md): {reading}{todo}")
    return "\n".join(lines) + "\n"


def write_findings(root: Optional[str] = None, readme: Optional[str] = None,
                   unfinished: Optional[Callable[[str], Sequence[str]]] = None) -> str:
    """README's findings table (``claims.findings_table``) put between its markers, from the runs under
    ``root``; the rest of README untouched. Returns the README's path."""
    from experiments.claims import awaited_study, findings_table, replace_findings

    base = root or PROJECT_DIR
    readme = readme or os.path.join(PROJECT_DIR, "README.md")
    if not os.path.exists(readme):          # a report over a folder with no README (a test's, a copy's)
        return readme
    with open(readme) as fh:
        text = fh.read()
    table = findings_table(base, unfinished=unfinished or (lambda name: unfinished_sweeps(awaited_study(name), base)),
                           state=_claim_state(base))
    with open(readme, "w") as fh:
        fh.write(replace_findings(text, table))
    return readme


def _claim_state(root: str):
    """A claims row -> the rerun check of its configurations (``ovq-cl report --verify``'s records in
    ``results/verification.json``, read by ``experiments.rerun_check``): "verified (...)", "unverified: ...",
    "DIFFERS" or "not checked"."""
    from experiments.claims import configuration_runs
    from experiments.rerun_check import configuration_entry, load_verification, row_state, study_of_file

    verification = load_verification(root)

    def state(claim) -> str:
        groups = configuration_runs(claim, root)
        if not groups:
            return "-"
        studies = [study_of_file(rel) for rel in claim.results]
        return row_state([configuration_entry(verification, studies, runs) for runs in groups])
    return state
