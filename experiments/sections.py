"""A study's section of RESULTS.md: a fixed head (title, setup, commands, runs, code versions), then the
renderers the study's spec lists under ``sections:`` (default :data:`DEFAULT_SECTIONS`), then its findings.

A renderer is a function ``render(ctx: SectionContext, **options) -> List[str]`` (markdown lines); the
framework's are in :data:`RENDERERS`; a study's own (a declared answer, a decision rule, a special table)
live in its folder's ``analysis.py`` as a dict ``SECTIONS = {name: render}``, found by name, so that adding
a study adds a folder and touches no module here. A spec lists a renderer by name, or as
``{name: {option: value}}``; its options are the function's keyword arguments, checked when the spec is
loaded (:func:`experiments.study_specs.load_study`).
"""
from __future__ import annotations

import math
import os
import statistics
import textwrap
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from experiments import compare
from experiments.probes import probe_tables
from experiments.probes.capacity import capacity_paired_table, capacity_points
from experiments.records import load_records
from experiments.stats import pairing
from experiments.plateau import GAIN_SHARE, PLATEAU_GAIN, last_quarter_gains
from experiments.plateau import meta_rows as _meta_rows
from experiments.plateau import steps_to_gain_share as _steps_to_gain_share

if TYPE_CHECKING:       # for annotations only: experiments.study_specs imports this module when it loads a spec
    from experiments.study_specs import StudySpec

PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def _attempts_note(raw: List[Dict[str, Any]]) -> str:
    """" N of them resumed after a stop (...)." where records say they took more than one attempt, and how
    many resumed from a checkpoint that kept no time (``attempts`` null: their earlier time is missing)."""
    resumed = [d["attempts"] for d in raw if "attempts" in d and d["attempts"] is not None and int(d["attempts"]) > 1]
    unknown = sum(1 for d in raw if "attempts" in d and d["attempts"] is None)
    note = ""
    if resumed:
        note += (f" {len(resumed)} of them resumed after a stop ({sum(resumed)} attempts; each attempt's time up to "
                 "the checkpoint the next resumed from is counted).")
    if unknown:
        note += (f" {unknown} resumed from a checkpoint that kept no time: their wall time leaves out the attempts "
                 "before it.")
    return note


def code_versions_line(raw: List[Dict[str, Any]]) -> str:
    """Which code ran a section's runs (``experiments.code_version``), most runs first: runs of
    different code in one table are said, never hidden."""
    counts = Counter(d.get("code_version") or "not recorded" for d in raw)
    listed = ", ".join(f"`{v}` ({n})" if v != "not recorded" else f"not recorded ({n}: runs from before "
                       "results carried their code version)" for v, n in counts.most_common())
    return f"Code versions of these runs: {listed}."


def _raw(spec: StudySpec, root: Optional[str] = None) -> List[dict]:
    """The study's run records (JSON dicts under ``root``, default the project), filtered by ``select``.

    A run listed by two sweeps (a later sweep that reused a finished run of the same identity, e.g. one
    that fills in the runs an interrupted sweep did not reach) counts once: the first record of each
    ``config_id`` and code version is kept, so no seed is paired or averaged twice. The same config run by
    two code versions is two runs here (which one a table reads is ``compare.deduplicated``'s rule, which
    says what it did), not the first file's silently."""
    raw, seen = [], set()
    for rel in spec.results:
        path = os.path.join(root or PROJECT_DIR, rel)
        for d in load_records(path):
            identity = d.get("config_id") or d.get("run_id")
            key = None if identity is None else (identity, d.get("code_version"))
            if key is not None and key in seen:
                continue
            seen.add(key)
            raw.append(d)
    return [d for d in raw if all(d["params"].get(k) in allowed for k, allowed in spec.select.items())]


def _mean_matrix(runs: List[compare.RunRecord], key: str = "R") -> List[List[Optional[float]]]:
    K = len(runs[0].R)
    out = []
    for j in range(K):
        row = []
        for i in range(K):
            values = [r.R[j][i] for r in runs if r.R[j][i] is not None]
            row.append(statistics.fmean(values) if values else None)
        out.append(row)
    return out


def _matrices(records: List[compare.RunRecord], raw: List[dict]) -> str:
    """The mean R per configuration, with the mean per-cell standard error (one run's sampling error)."""
    lines = []
    se_by_label = {d["label"]: d.get("R_se") for d in raw}
    for key, runs in sorted(compare.group_records(records).items()):
        runs = [r for r in runs if r.R]
        if not runs:
            continue
        mean = _mean_matrix(runs)
        ses = [v for r in runs for row in (se_by_label.get(r.label) or []) for v in row if v is not None]
        se = f", mean per-cell s.e. {statistics.fmean(ses):.3f}" if ses else ""
        flag = "" if all(r.learned is not False for r in runs) else "  [NOT LEARNED in some or all runs]"
        lines.append(f"{key}: mean R[j][i] over {len(runs)} runs{se}{flag}")
        lines += ["    " + " ".join("  -  " if v is None else f"{v:.3f}" for v in row) for row in mean]
        lines.append("")
    return "```\n" + "\n".join(lines).rstrip() + "\n```"


def _partitions(records: List[compare.RunRecord], key: Optional[str], default: Optional[str] = None):
    """[(value, records with params[key] == value)] in order of value; [(None, records)] without a key.
    A run without the key is in partition ``default``, or, without a default (e.g. an unsized mixer
    across budgets), in every partition."""
    if not key:
        return [(None, records)]
    if "," in key:                       # several keys: a partition per combination ("-" where a run lacks one)
        keys = [k.strip() for k in key.split(",")]
        def value(r):
            return ", ".join(str(r.params.get(k, "-")) for k in keys)
    else:
        def value(r):
            v = r.params.get(key, default)
            return None if v in (None, "None", "null") else v

    values = sorted({value(r) for r in records if value(r) is not None}, key=_numeric_first)
    return [(v, [r for r in records if value(r) in (None, v)]) for v in values]


def _numeric_first(v: str):
    try:
        return (0, float(v), v)
    except ValueError:
        return (1, 0.0, v)


def _save(fig, path: str, tight: bool = True) -> None:
    """Writes a figure (no software tag in the PNG: the same plot gives the same bytes) and closes it."""
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None}, **({"bbox_inches": "tight"} if tight else {}))
    plt.close(fig)


def _finish(fig, ax, path: str, title: str, legend_size: int) -> None:
    """Grid, legend and title of a one-panel figure, then :func:`_save`."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    ax.set_title(title, fontsize=8)
    _save(fig, path)


def plot_by_state_bytes(records: List[compare.RunRecord], path: str, title: str) -> None:
    """Forgetting (max-based) and learning score against state bytes per layer and lane, one line per
    mixer (model.layers), 95% CIs over seeds; forgetting only from runs that passed every gate, and a
    configuration none of whose runs learned is drawn as an open marker at its learning score only."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.stats.intervals import mean_interval

    by_mixer: Dict[str, list] = {}
    groups = compare.group_records(records)
    # one line per configuration apart from its size: a mixer's groups that differ in more than the
    # budget (and the knob it sets) are told apart by the params that vary among them
    sized = ("state_budget=", ".num_slots=", ".codebook_size=", ".window=", ".head_dim=", "layers=")
    settings = _mixer_settings(groups, ignore=lambda p: any(t in p for t in sized))
    for key, runs in groups.items():
        mixer_name, extra = settings[key]
        mixer = mixer_name + (f" ({', '.join(extra)})" if extra else "")
        sizes = [statistics.fmean(r.state_bytes) for r in runs if r.state_bytes]
        if not sizes:
            continue
        learned = [r for r in runs if r.learned is not False]
        forget = mean_interval([r.summary.get("forgetting_max", float("nan")) for r in learned]) if learned else None
        learn = mean_interval([r.summary.get("learning_average", float("nan")) for r in runs])
        by_mixer.setdefault(mixer, []).append((statistics.fmean(sizes), forget, learn))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    for mixer, pts in sorted(by_mixer.items()):
        pts.sort(key=lambda p: p[0])
        for ax, pick in ((axes[0], 1), (axes[1], 2)):
            shown = [(p[0], p[pick]) for p in pts if p[pick] is not None and p[pick].n]
            if not shown:
                continue
            xs = [x for x, _ in shown]
            ys = [iv.mean for _, iv in shown]
            err = [[iv.mean - iv.low if iv.n > 1 else 0 for _, iv in shown],
                   [iv.high - iv.mean if iv.n > 1 else 0 for _, iv in shown]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=mixer)
    axes[0].set_ylabel("forgetting_max (runs that learned)")
    axes[1].set_ylabel("learning score (mean R[j][j], all runs)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("state bytes per layer and lane")
        ax.grid(alpha=0.3)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    _save(fig, path, tight=False)


def _config_names(groups: Dict[str, list]) -> Dict[str, str]:
    """Short names of configurations: the params that differ among them (key's last part = value)."""
    params = {k: k.parts for k in groups}
    shared = set.intersection(*(set(v) for v in params.values())) if params else set()
    return {k: ", ".join(p.split("=", 1)[0].rsplit(".", 1)[-1] + "=" + p.split("=", 1)[1]
                         for p in v if p not in shared) or k for k, v in params.items()}


def plot_plane(records: List[compare.RunRecord], path: str, title: str,
               partition: Optional[str], partition_default: Optional[str]) -> None:
    """The stability-plasticity plane: learning score (mean R[j][j]) against forgetting_max, one point
    per configuration with 95% CIs over seeds on both axes, one panel per partition value (e.g. state
    budget). Forgetting from runs that learned only; a configuration with no learned run is left out
    of the panel and named in its caption."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.stats.intervals import mean_interval

    from strategies.evaluation.metrics import higher_is_better

    parts = _partitions(records, partition, partition_default)
    fig, axes = plt.subplots(1, len(parts), figsize=(5.2 * len(parts), 4.8), squeeze=False)
    colors, handles = {}, {}               # one colour per configuration across the panels, one legend
    for ax, (value, subset) in zip(axes[0], parts):
        groups = compare.group_records(subset)
        names = _config_names(groups)
        missing, current = [], False
        for key, runs in sorted(groups.items()):
            learned = [r for r in runs if r.learned is not False]
            if not learned:
                missing.append(names[key])
                continue
            # streams whose facts change are scored against the facts in force, as in the verdict
            summaries = [r.summary_current or r.summary for r in learned]
            current = current or any(r.summary_current for r in learned)
            f = mean_interval([m.get("forgetting_max", float("nan")) for m in summaries])
            ell = mean_interval([m.get("learning_average", float("nan")) for m in summaries])
            color = colors.setdefault(names[key], f"C{len(colors) % 10}")
            marker = "os^D"[(len(colors) - 1) // 10 % 4]
            line = ax.errorbar([f.mean], [ell.mean],
                               xerr=[[f.mean - f.low if f.n > 1 else 0], [f.high - f.mean if f.n > 1 else 0]],
                               yerr=[[ell.mean - ell.low if ell.n > 1 else 0], [ell.high - ell.mean if ell.n > 1 else 0]],
                               marker=marker, capsize=3, color=color)
            handles.setdefault(names[key], line)
        metrics = {r.metric for r in subset}
        higher = all(higher_is_better(m) for m in metrics if m != "?")
        ax.set_xlabel("forgetting_max (lower: more stable)")
        ax.set_ylabel(f"learning score, mean R[j][j] ({'higher' if higher else 'lower'}: more plastic)\n"
                      f"{', '.join(sorted(metrics))}", fontsize=8)
        ax.set_title((f"{value}" if value is not None else "") + (" (facts in force)" if current else "") +
                     (f"\nnot learned: {'; '.join(missing)}" if missing else ""), fontsize=8)
        ax.grid(alpha=0.3)
    if handles:
        fig.legend(list(handles.values()), list(handles), fontsize=7, loc="lower center",
                   ncol=min(2, len(handles)), frameon=False)
        fig.subplots_adjust(bottom=0.12 + 0.035 * ((len(handles) + 1) // 2), wspace=0.35)
    fig.suptitle(title + (f"\npanels: {partition}" if partition else ""), fontsize=9)
    _save(fig, path)


def frontier_points(records: List[compare.RunRecord]) -> Dict[str, List[tuple]]:
    """The points of a stability-plasticity frontier: {mixer: [(setting, runs)]}, one point per
    configuration. A mixer is ``model.layers``; its setting is what differs among that mixer's
    configurations (its knob), "default" when it has one configuration."""
    groups = compare.group_records(records)
    settings = _mixer_settings(groups)
    out: Dict[str, List[tuple]] = {}
    for key, runs in sorted(groups.items()):
        mixer, extra = settings[key]
        out.setdefault(mixer, []).append((", ".join(extra) or "default", runs))
    return out


def _mixer_settings(groups: Dict[str, list], ignore=lambda param: False) -> Dict[str, tuple]:
    """{group: (mixer, [short "key=value" of the params that set it apart from the mixer's other
    groups])}: a mixer is ``model.layers`` joined by '+'; params for which ``ignore`` is true are left out."""
    mixer_of = {k: "+".join(compare._layers(runs[0].params.get("model.layers", ""))) or k for k, runs in groups.items()}
    rest = {k: [p for p in k.parts if not ignore(p)] for k in groups}
    out = {}
    for key in groups:
        shared = set.intersection(*(set(rest[k]) for k in groups if mixer_of[k] == mixer_of[key]))
        out[key] = (mixer_of[key], [p.split("=", 1)[0].rsplit(".", 1)[-1] + "=" + p.split("=", 1)[1]
                                    for p in rest[key] if p not in shared])
    return out


def _final_current(runs: List[compare.RunRecord], name: str):
    """Mean and 95% interval over seeds of a final-row score against the facts in force. Every run
    counts, learned or not: a memory that stops learning must show as one (it updates nothing)."""
    from experiments.stats.intervals import mean_interval

    return mean_interval([r.summary_current.get(name, float("nan")) for r in runs])


def _kept_old(r: compare.RunRecord) -> float:
    """The final row's mean score on the experiences before the last (what is still held of them)."""
    if not r.R or len(r.R) < 2:
        return math.nan
    row = [v for v in r.R[-1][:-1] if v is not None]
    return statistics.fmean(row) if row else math.nan


def _learned_later(r: compare.RunRecord) -> float:
    """The mean score of each experience after the first right after it was trained, R[j][j], j >= 1."""
    if not r.R or len(r.R) < 2:
        return math.nan
    diag = [r.R[j][j] for j in range(1, len(r.R)) if r.R[j][j] is not None]
    return statistics.fmean(diag) if diag else math.nan


def frontier_axes(records: List[compare.RunRecord]):
    """The two axes of a frontier, (x name, x of a group, y name, y of a group, higher is better): on a
    stream whose facts change, retained (unchanged old facts) against updated (changed facts answered with
    the new value), from the final row against the facts in force; on any other stream, kept (the final
    row on the experiences before the last) against learned (R[j][j] of every later experience)."""
    from experiments.stats.intervals import mean_interval
    from strategies.evaluation.metrics import higher_is_better

    if any("retained_fraction" in r.summary_current for r in records):
        return ("retained (unchanged old facts)", lambda runs: _final_current(runs, "retained_fraction"),
                "updated (changed facts)", lambda runs: _final_current(runs, "updated_fraction"), True)
    metric = records[0].metric if records else "accuracy"
    return (f"kept (old experiences, final row, {metric})", lambda runs: mean_interval([_kept_old(r) for r in runs]),
            f"learned (later experiences, R[j][j], {metric})",
            lambda runs: mean_interval([_learned_later(r) for r in runs]), higher_is_better(metric))


def plot_frontier(records: List[compare.RunRecord], path: str, title: str) -> None:
    """Each mixer's frontier, one point per setting of its knob with 95% intervals over seeds, the settings
    of one mixer joined by a line (axes: :func:`frontier_axes`). On a stream whose facts change: retention
    of the facts that did not change (x) against the share of changed facts answered with the new value
    (y); elsewhere what is kept of old experiences (x) against how well later ones are learned (y). Up and
    to the right is better on both axes (inverted for a lower-is-better metric); a mixer that keeps old
    facts only by not taking new ones sits low."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_name, x_of, y_name, y_of, higher = frontier_axes(records)
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    for c, (mixer, settings) in enumerate(sorted(frontier_points(records).items())):
        pts = [(s, x_of(runs), y_of(runs)) for s, runs in settings]
        pts = sorted((p for p in pts if p[1].n and p[2].n), key=lambda p: p[1].mean)
        if not pts:
            continue
        xs, ys = [p[1].mean for p in pts], [p[2].mean for p in pts]
        err_x = [[p[1].mean - p[1].low if p[1].n > 1 else 0 for p in pts], [p[1].high - p[1].mean if p[1].n > 1 else 0 for p in pts]]
        err_y = [[p[2].mean - p[2].low if p[2].n > 1 else 0 for p in pts], [p[2].high - p[2].mean if p[2].n > 1 else 0 for p in pts]]
        ax.errorbar(xs, ys, xerr=err_x, yerr=err_y, marker="os^D"[c // 10 % 4], capsize=3, color=f"C{c % 10}", label=mixer)
        for (setting, _, _), x, y in zip(pts, xs, ys):
            if len(pts) > 1:
                ax.annotate(setting, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(x_name + ("" if higher else "  (lower is better: axis inverted)"))
    ax.set_ylabel(y_name + ("" if higher else "  (axis inverted)"))
    if not higher:
        ax.invert_xaxis()
        ax.invert_yaxis()
    _finish(fig, ax, path, title, legend_size=7)


def frontier_table(records: List[compare.RunRecord]) -> str:
    """The frontier's numbers: per mixer and setting, its two axes (:func:`frontier_axes`, 95% CI over
    seeds), the final average (against the facts in force where the stream has them: the primary
    endpoint), how many runs learned, state bytes."""
    from experiments.stats.intervals import mean_interval

    x_name, x_of, y_name, y_of, _ = frontier_axes(records)
    changing = any("retained_fraction" in r.summary_current for r in records)
    final = "final average (facts in force)" if changing else "final average"
    lines = [f"| mixer | setting | n (learned) | {x_name} | {y_name} | {final} | state bytes |",
             "|---|---|---|---|---|---|---|"]
    for mixer, settings in sorted(frontier_points(records).items()):
        for setting, runs in settings:
            average = (_final_current(runs, "final_average") if changing
                       else mean_interval([r.summary.get("final_average", math.nan) for r in runs]))
            cells = [_iv(x_of(runs)), _iv(y_of(runs)), _iv(average)]
            sizes = [statistics.fmean(r.state_bytes) for r in runs if r.state_bytes]
            learned = sum(r.learned is not False for r in runs)
            size = f"{statistics.fmean(sizes):,.0f}" if sizes else "?"
            lines.append(f"| {mixer} | {setting} | {len(runs)} ({learned}) | " + " | ".join(cells) + f" | {size} |")
    return "\n".join(lines)


def below_held_out_gate(runs: Sequence[compare.RunRecord]) -> int:
    """How many of ``runs`` scored a held-out skill below their own held-out gate's bar (``gate.min_skill``);
    a run without either is not counted."""
    def bar(r):
        try:
            return float(r.params.get("gate.min_skill", "nan"))
        except ValueError:
            return math.nan
    return sum(1 for r in runs if r.gate_skill < bar(r))          # False when either is NaN


def meta_training_table(records: List[compare.RunRecord]) -> str:
    """Per configuration: meta-training's steps, its metric on the last logged training batches (mean and
    range over seeds) and the change over the last quarter of the steps, in the better direction, with
    the plateau rule (``PLATEAU_GAIN``): "plateau" when every seed moved by less, else "still improving",
    with how many seeds are below the held-out gate's bar (their skill on held-out items under
    ``gate.min_skill``): a curve can stop moving before it learned anything, and "plateau" alone would read
    as trained to the end; per seed, the step by which it made ``GAIN_SHARE`` of its gain (where the curve
    flattened); the score on held-out items of the same generator after meta-training (the gate's) and
    the training batches' score minus it, in the better direction, per seed (mean, max): a large gap is a mixer that stored the
    meta-training items in its weights instead of learning to store facts in its memory; and, where the
    stream marks them, the metric at the end on the answers recalled from earlier episodes."""
    from strategies.evaluation.metrics import higher_is_better

    from strategies.training.meta import REACH_BUCKETS

    # where runs log it (newer code): the recalled answers' score by reach-back, which the overall one hides
    buckets = [f"_recalled_{low}_{'up' if high is None else high}" for low, high in REACH_BUCKETS]
    by_reach = any(r.metric + buckets[0] in row for r in records for row in r.meta_history)
    reach_head = (" | on recalled answers by reach-back at the end (" + " / ".join(
        f"{low}+" if high is None else f"{low}-{high}" for low, high in REACH_BUCKETS)
        + " episodes, mean)" if by_reach else "")
    lines = ["| configuration | n | steps | metric at the end (mean, min-max) | held-out, the gate's (mean, min-max) | "
             "training minus held-out (mean, max) | change over the last quarter "
             f"(mean, max) | plateau? | {GAIN_SHARE:.0%} of its gain by step (per seed) | on recalled answers at the end "
             f"(mean, min-max){reach_head} |", "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if by_reach else "")]
    for key, runs in sorted(compare.group_records(records).items()):
        rows, metric = _meta_rows(runs)
        if len(rows) < 2:
            continue
        sign = 1.0 if higher_is_better(metric) else -1.0
        last_step, last = rows[-1]
        gains = last_quarter_gains(runs)
        verdict = "plateau" if max(gains) < PLATEAU_GAIN else "still improving"
        below = below_held_out_gate(runs)
        if below:
            verdict += f" ({below} of {len(runs)} below the held-out gate)"
        held = [r.gate_score for r in runs]            # in the order of ``last`` (one value per run)
        if not any(math.isnan(h) for h in held):       # every seed measured the gate
            gaps = [sign * (t - h) for t, h in zip(last, held)]
            held_cell = (f"{statistics.fmean(held):.3f} ({min(held):.3f}-{max(held):.3f}) | "
                         f"{statistics.fmean(gaps):+.3f} ({max(gaps):+.3f})")
        else:
            held_cell = "- | -"
        recalled, _ = _meta_rows(runs, f"{metric}_recalled")
        end = recalled[-1][1] if recalled and recalled[-1][0] == last_step else None
        recalled_cell = f"{statistics.fmean(end):.3f} ({min(end):.3f}-{max(end):.3f})" if end else "-"
        reached = ", ".join(str(step) for step in _steps_to_gain_share(rows, sign))
        reach_cell = ""
        if by_reach:
            cells = []
            for suffix in buckets:
                at_end, _ = _meta_rows(runs, metric + suffix)
                cells.append(f"{statistics.fmean(at_end[-1][1]):.3f}" if at_end and at_end[-1][0] == last_step else "-")
            reach_cell = " / ".join(cells) + " |"
        lines.append(f"| {key} | {len(runs)} | {last_step} | {metric} {statistics.fmean(last):.3f} "
                     f"({min(last):.3f}-{max(last):.3f}) | {held_cell} | {statistics.fmean(gains):+.3f} ({max(gains):+.3f}) | "
                     f"{verdict} | {reached} | {recalled_cell} | {reach_cell}".rstrip())
    return "\n".join(lines) if len(lines) > 2 else ""


def _line_style(c: int) -> Dict[str, str]:
    """The colour and dash of the c-th line of a figure: ten colours, then the next dash style."""
    return {"color": f"C{c % 10}", "ls": ("-", ":", "--")[c // 10 % 3]}


_KNOB_PARAMS = (".num_slots=", ".codebook_size=", ".window=", ".head_dim=")   # set by the budget, named by it


def short_recipe_labels(keys: Sequence[str]) -> Dict[str, str]:
    """{configuration key: a short label}: of the params in which ``keys`` (one mixer's configurations,
    ``compare.group_records`` keys) differ, those a budget sets are left out (the budget names them; not
    the same knob under ``after_meta.``, a treatment), and
    a param whose values split the configurations exactly as an earlier kept one does is left out too
    (e.g. the batch size and step count of a recipe its episode count already names). Kept first: params
    with more distinct values, then the stream's, then meta-training's, then the rest."""
    def budget_set(p):                  # the model's knob; the same knob set after meta-training is a treatment
        return any(t in p for t in _KNOB_PARAMS) and not p.startswith("after_meta.")

    params = {k: dict(p.split("=", 1) for p in k.parts if "=" in p and not budget_set(p)) for k in keys}
    names = sorted({n for ps in params.values() for n in ps})
    varying = [n for n in names if len({params[k].get(n) for k in keys}) > 1]

    def rank(name):
        group = 0 if name.startswith("stream.") else 1 if name.startswith("meta_train.") else 2
        return (-len({params[k].get(name) for k in keys}), group, name)

    kept, partitions = [], []
    for name in sorted(varying, key=rank):
        blocks = {}
        for k in keys:
            blocks.setdefault(params[k].get(name), set()).add(k)
        partition = frozenset(frozenset(b) for b in blocks.values())
        if partition not in partitions:
            kept.append(name)
            partitions.append(partition)
    # a param a run does not list has its absent value (compare.ABSENT_VALUES), else "-"
    return {k: ", ".join(f"{n.rsplit('.', 1)[-1]}={params[k].get(n, compare.ABSENT_VALUES.get(n, '-'))}" for n in kept)
            or "all runs" for k in keys}


def plot_meta_curves(records: List[compare.RunRecord], path: str, title: str) -> None:
    """Meta-training's learning curves, one panel per mixer: the metric on the training batches against the
    step, one line per configuration (mean over seeds, the band their range), labelled by what sets it
    apart (:func:`short_recipe_labels`); where the runs logged it, the metric on the answers recalled from
    earlier episodes (``{metric}_recalled``) dotted in the same colour."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {k: runs for k, runs in sorted(compare.group_records(records).items()) if len(_meta_rows(runs)[0]) > 0}
    if not groups:
        return
    by_mixer: Dict[str, List[str]] = {}
    for key, runs in groups.items():
        by_mixer.setdefault("+".join(compare._layers(runs[0].params.get("model.layers", ""))) or "runs", []).append(key)
    n = len(by_mixer)
    cols = min(n, 3)
    rows_ = -(-n // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(4.6 * cols, 3.9 * rows_), squeeze=False, sharey=True)
    metric = None
    for ax, (mixer, keys) in zip(axes.flat, sorted(by_mixer.items())):
        labels = short_recipe_labels(keys)
        dotted = False
        for c, key in enumerate(keys):
            rows, metric = _meta_rows(groups[key])
            steps = [s for s, _ in rows]
            style = _line_style(c)
            ax.plot(steps, [statistics.fmean(v) for _, v in rows], **style, label=labels[key])
            ax.fill_between(steps, [min(v) for _, v in rows], [max(v) for _, v in rows], color=style["color"], alpha=0.15)
            recalled, _ = _meta_rows(groups[key], f"{metric}_recalled")
            if recalled:
                ax.plot([s for s, _ in recalled], [statistics.fmean(v) for _, v in recalled], color=style["color"],
                        ls=":", lw=1.2)
                dotted = True
        # the dotted line is promised only where one is drawn (runs that logged recalled answers)
        ax.set_title(f"{mixer} (dotted: recalled answers)" if dotted else mixer, fontsize=8)
        ax.set_xlabel("meta-training step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=5.5, loc="lower right")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel(f"{metric} on the training batches\n(mean over seeds, band: range)", fontsize=8)
    fig.suptitle(title, fontsize=9)
    # room between the rows: a row's x label once ran into the next row's panel titles
    fig.tight_layout(rect=(0, 0, 1, 0.97), h_pad=1.2)
    _save(fig, path)


def probe_curve_series(records: List[compare.RunRecord]) -> Dict[str, Dict[str, list]]:
    """The probe curves' points, per panel and configuration: ``{panel: {configuration: [(x, interval)]}}``
    with the mean and 95% interval over seeds at each x. Panels: ``"capacity"`` (x = facts bound once,
    the score at each), ``"interference: KIND"`` (x = intervening items of that kind, the recall of the
    facts before them) and ``"position: DOMAIN"`` (x = the position bucket's upper edge in bytes, its bits
    per byte). A configuration is in a panel when some run measured that curve."""
    from experiments.stats.intervals import mean_interval

    panels: Dict[str, Dict[str, list]] = {}
    for key, runs in sorted(compare.group_records(records).items()):
        points: Dict[str, Dict[float, list]] = {}
        for r in runs:
            for p in capacity_points(r):
                points.setdefault("capacity", {}).setdefault(p["facts"], []).append(float(p["score"]))
            for domain, curve in (r.probe("position").get("curves") or {}).items():
                for b in curve.get("buckets") or []:
                    points.setdefault(f"position: {domain}", {}).setdefault(b["hi"], []).append(float(b["bits_per_byte"]))
            for kind, curve in (r.probe("interference").get("curves") or {}).items():
                for p in curve:
                    points.setdefault(f"interference: {kind}", {}).setdefault(p["items"], []).append(float(p["score"]))
        for panel, by_x in points.items():
            panels.setdefault(panel, {})[key] = [(x, mean_interval(v)) for x, v in sorted(by_x.items())]
    return panels


PANEL_LINES = 8          # a probe panel with more lines than this is split into one panel per mixer


def probe_panels(records: List[compare.RunRecord]) -> List[tuple]:
    """The probe figure's panels: [(curve, mixer or "", {configuration: (label, points)})], from
    :func:`probe_curve_series`. A curve with at most ``PANEL_LINES`` configurations is one panel whose
    lines are named by mixer; one with more is one panel per mixer, its lines named by what sets them
    apart (:func:`short_recipe_labels`)."""
    mixer_of = {k: "+".join(compare._layers(runs[0].params.get("model.layers", ""))) or k
                for k, runs in compare.group_records(records).items()}
    out = []
    for curve, series in sorted(probe_curve_series(records).items()):
        by_mixer: Dict[str, List[str]] = {}
        for key in sorted(series):
            by_mixer.setdefault(mixer_of.get(key, key), []).append(key)
        labels = {}
        for mixer, keys in by_mixer.items():
            short = short_recipe_labels(keys)
            labels.update({k: (mixer if short[k] == "all runs" else f"{mixer}: {short[k]}") for k in keys})
        if len(series) <= PANEL_LINES:
            out.append((curve, "", {k: (labels[k], series[k]) for k in sorted(series)}))
        else:
            for mixer, keys in sorted(by_mixer.items()):
                short = short_recipe_labels(keys)
                out.append((curve, mixer, {k: (short[k], series[k]) for k in keys}))
    return out


def plot_probe_curves(records: List[compare.RunRecord], path: str, title: str) -> bool:
    """The probe curves: capacity (score against the facts bound, i.e. the context length), interference
    (recall against the intervening items, one panel per kind) and position (bits per byte against
    position, one panel per domain); 95% bands over seeds, log-scale x (symmetric-log where x starts at
    0). Panels as :func:`probe_panels` lays them out, one row per curve. False (and nothing written)
    when no run has a curve."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = probe_panels(records)
    if not panels:
        return False
    curves = list(dict.fromkeys(curve for curve, _, _ in panels))
    cols = max(sum(c == curve for c, _, _ in panels) for curve in curves)
    fig, axes = plt.subplots(len(curves), cols, figsize=(4.8 * cols, 3.9 * len(curves)), squeeze=False)
    used = set()
    for curve in curves:
        row = curves.index(curve)
        for col, (_, mixer, series) in enumerate(p for p in panels if p[0] == curve):
            ax = axes[row][col]
            used.add((row, col))
            for c, (key, (label, pts)) in enumerate(series.items()):
                xs = [x for x, _ in pts]
                ax.plot(xs, [iv.mean for _, iv in pts], marker="o", ms=3, **_line_style(c), label=label)
                lows = [iv.low if iv.n > 1 else iv.mean for _, iv in pts]
                highs = [iv.high if iv.n > 1 else iv.mean for _, iv in pts]
                ax.fill_between(xs, lows, highs, color=_line_style(c)["color"], alpha=0.15)
            if min(x for _, (_, pts) in series.items() for x, _ in pts) <= 0:
                ax.set_xscale("symlog", base=2, linthresh=1)
            else:
                ax.set_xscale("log", base=2)
            kind = curve.split(": ", 1)[0]
            ax.set_xlabel({"capacity": "facts bound once, then queried (the context grows with them)",
                           "interference": "items between the facts and their queries"}.get(
                               kind, "position in the document (bucket's upper edge, bytes)"), fontsize=8)
            ax.set_ylabel(f"{records[0].metric} (mean, band: 95% CI)" if kind != "position"
                          else "bits per byte (mean, band: 95% CI; lower is better)", fontsize=8)
            ax.set_title(curve + (f": {mixer}" if mixer else ""), fontsize=8)
            ax.grid(alpha=0.3)
            if kind != "position" and records[0].metric == "accuracy":
                ax.set_ylim(-0.02, 1.02)        # one scale for every recall panel (a band over 2 seeds is wide)
            if not mixer or row == min(r for r, c in used if c == col):
                ax.legend(fontsize=5.5)         # split panels: a column's lines are one mixer's, named once
    for row in range(len(curves)):
        for col in range(cols):
            if (row, col) not in used:
                axes[row][col].axis("off")
    fig.suptitle(textwrap.fill(title, 120), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    _save(fig, path)
    return True


def _iv(iv) -> str:
    if not iv.n:
        return "n/a"
    return f"{iv.mean:.3f}" + (f" [{iv.low:.3f}, {iv.high:.3f}]" if iv.n > 1 else "")


def _cross_version_pairs(records: List[compare.RunRecord], baseline: str) -> str:
    """'CONFIG (k of n), ...': the configurations of a paired table whose pairs with ``baseline`` join runs
    of different code versions ('' when none do, or when the baseline is not found)."""
    groups = compare.group_records(records)
    try:
        base_key = compare.find_group(groups, baseline)
    except ValueError:
        return ""
    out = []
    for key, pairs in pairing.pairs_against(groups, base_key):
        k = sum(pairing.version_of(a) != pairing.version_of(b) for a, b in pairs)
        if k:
            out.append(f"{key} ({k} of {len(pairs)})")
    return ", ".join(out)


def _one_run_per_replicate(records: List[compare.RunRecord]) -> Tuple[List[compare.RunRecord], List[str]]:
    """A section's runs with each replicate of a configuration once, and notes on code versions.

    The same configuration and seeds run by two code versions (``_raw`` keeps both) would count one seed
    twice in a section's means and pairs: the later run is kept (by its end time; else the later file, or
    later in its file)
    and a note says how many were left out. Different seeds of one configuration made by different code
    versions are pooled here, as the sections' findings read them, and a note names each such
    configuration; the verdict and the answer tables never pool versions (``compare.deduplicated``)."""
    latest: Dict[str, int] = {}
    for i, r in enumerate(records):           # the later run: by its end time, then by its place in the lists
        if r.config_id is not None and (r.config_id not in latest or
                                        r.finished_at >= records[latest[r.config_id]].finished_at):
            latest[r.config_id] = i
    kept = [r for i, r in enumerate(records) if r.config_id is None or latest[r.config_id] == i]
    notes = []
    if len(kept) < len(records):
        notes.append(f"{len(records) - len(kept)} run(s) of a configuration and seeds that a later code version ran "
                     "again are left out (the later run is kept)")
    for name, runs in sorted(compare.group_records(kept).items()):
        versions = Counter(r.code_version or "not recorded" for r in runs)
        if len(versions) > 1:
            listed = ", ".join(f"{v} (n={n})" for v, n in sorted(versions.items()))
            notes.append(f"{name}: its seeds were run by {len(versions)} code versions, pooled here ({listed}), and "
                         "this section's paired tables pair them with the baseline's seeds whatever their code; the "
                         "verdict, the claims and the paired capacity table pair within one version only")
    return kept, notes


@dataclass
class SectionContext:
    """What a renderer reads: the study, where its files live, and its runs three ways."""

    spec: StudySpec
    root: str                                  # results are read from, and figures written under, here
    raw: List[dict]                            # the study's records as stored (``_raw``)
    every_run: List[compare.RunRecord]         # every record, of every code version
    records: List[compare.RunRecord]           # one run per replicate (``_one_run_per_replicate``)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)


def summary(ctx: SectionContext) -> List[str]:
    """The summary table (95% intervals, the learned gate, both forgettings, bytes, parameters), then the
    probes' tables (every registered probe's, :mod:`experiments.probes`) where runs measured them."""
    parts = [compare.summary_table(ctx.records), ""]
    for caption, table in probe_tables(ctx.records, ctx.spec.baseline):
        if table:
            parts += [caption, "", table, ""]
    return parts


def capacity_pairs(ctx: SectionContext) -> List[str]:
    """The declared capacity pairs (``capacity_pairs:``), paired at every number of facts, Holm over all."""
    table = capacity_paired_table(ctx.every_run, ctx.spec.capacity_pairs) if ctx.spec.capacity_pairs else ""
    if not table:
        return []
    return ["Capacity curves paired (the declared pairs, each at every number of facts both measured: recall, "
            "configuration - baseline, over the seeds both ran with one code version; Holm over the whole "
            "table):", "", table, ""]


def curves(ctx: SectionContext) -> List[str]:
    """The capacity, interference and position curves (``curves:``, the figure's path)."""
    if ctx.spec.curves and plot_probe_curves(ctx.records, ctx.path(ctx.spec.curves), ctx.spec.title):
        return [f"![probe curves: capacity, interference, position]({ctx.spec.curves})", ""]
    return []


def state_bytes_plot(ctx: SectionContext, path: str) -> List[str]:
    """Forgetting and learning against state bytes, one line per mixer (the figure's ``path``)."""
    plot_by_state_bytes(ctx.records, ctx.path(path), ctx.spec.title)
    return [f"![forgetting and learning against state bytes]({path})", ""]


def plane(ctx: SectionContext) -> List[str]:
    """Learning score against forgetting, per partition (``plane:``, the figure's path)."""
    if not ctx.spec.plane:
        return []
    plot_plane(ctx.records, ctx.path(ctx.spec.plane), ctx.spec.title, ctx.spec.partition, ctx.spec.partition_default)
    return [f"![learning score against forgetting (stability-plasticity plane)]({ctx.spec.plane})", ""]


def frontier(ctx: SectionContext) -> List[str]:
    """Each mixer's frontier over its knob (``frontier:``, the figure's path) and its table."""
    if not ctx.spec.frontier:
        return []
    plot_frontier(ctx.records, ctx.path(ctx.spec.frontier), ctx.spec.title)
    x_name, _, y_name, _, _ = frontier_axes(ctx.records)
    return [f"Each mixer's frontier (its own knob; {x_name} against {y_name}, 95% intervals over seeds, every "
            "run counted, learned or not):", "", frontier_table(ctx.records), "",
            f"![{x_name} against {y_name}]({ctx.spec.frontier})", ""]


def meta_curves(ctx: SectionContext) -> List[str]:
    """Meta-training's learning curves (``meta_curves:``, the figure's path) and the plateau table."""
    if not ctx.spec.meta_curves:
        return []
    plot_meta_curves(ctx.records, ctx.path(ctx.spec.meta_curves), ctx.spec.title)
    return [f"Meta-training's learning curves (the metric on the training batches; plateau: every seed moved "
            f"by less than {PLATEAU_GAIN} over the last quarter of the steps, with how many seeds are below the "
            "held-out gate beside it: a curve can stop before it learned anything; held-out: the gate's score on items "
            "meta-training never drew, from the model `after_meta` made where it changes one):", "",
            meta_training_table(ctx.records),
            "", f"![meta-training learning curves]({ctx.spec.meta_curves})", ""]


def budget_read(ctx: SectionContext, budget_rule: Optional[str]) -> List[compare.RunRecord]:
    """The runs paired tables read: with a declared ``budget_rule`` (a numeric param, e.g.
    ``meta_train.steps``), of configurations that differ only in it, the largest."""
    return compare.read_longest_budget(ctx.records, budget_rule) if budget_rule else ctx.records


def paired(ctx: SectionContext, budget_rule: Optional[str] = None) -> List[str]:
    """Paired tables against ``baseline`` and ``more_baselines``, within each ``partition`` value; with a
    ``budget_rule``, read at the largest budget (and said)."""
    records = budget_read(ctx, budget_rule)
    parts: List[str] = []
    if budget_rule and len(records) < len(ctx.records):
        parts += [f"Budget rule: of configurations that differ only in `{budget_rule}`, the paired tables read "
                  f"the largest ({len(ctx.records) - len(records)} runs of shorter budgets left out of them; each "
                  "configuration is read at its own budget, so a table may pair configurations of different "
                  f"`{budget_rule}`).", ""]
    spec = ctx.spec
    for baseline in ([spec.baseline] if spec.baseline else []) + list(spec.more_baselines):
        for value, subset in _partitions(records, spec.partition, spec.partition_default):
            where = "" if value is None else f", {spec.partition} = {value}"
            try:
                table = compare.paired_table(subset, baseline)
            except ValueError as e:              # e.g. the baseline has no runs at this budget yet
                table = f"(no paired table: {e})"
            parts += [f"Paired against `{baseline}`{where} (same seeds of model and data; difference = row - baseline):",
                      "", table, ""]
            crossing = _cross_version_pairs(subset, baseline)
            if crossing:
                parts += [f"Pairs made across code versions in this table (the verdict table never pairs across versions): {crossing}.", ""]
    return parts


def paired_within(ctx: SectionContext, by: str, baseline: str, budget_rule: Optional[str] = None) -> List[str]:
    """Further paired tables, one per value of the param ``by``, each against the configuration pattern
    ``baseline`` (e.g. each mixer's recipes against its standard recipe)."""
    parts: List[str] = []
    for value, subset in _partitions(budget_read(ctx, budget_rule), by):
        try:
            table = compare.paired_table(subset, baseline)
        except ValueError as e:
            table = f"(no paired table: {e})"
        parts += [f"Paired against `{baseline}`, {by} = {value} (same seeds of model and data; "
                  "difference = row - baseline):", "", table, ""]
    return parts


def matrices(ctx: SectionContext) -> List[str]:
    """The mean result matrix R of each configuration, with its mean per-cell standard error."""
    return [_matrices(ctx.records, ctx.raw), ""]


#: the framework's renderers, by the name a spec lists them with
RENDERERS: Dict[str, Callable[..., List[str]]] = {
    "summary": summary, "capacity_pairs": capacity_pairs, "curves": curves, "state_bytes_plot": state_bytes_plot,
    "plane": plane, "frontier": frontier, "meta_curves": meta_curves, "paired": paired,
    "paired_within": paired_within, "matrices": matrices,
}

#: what a spec without ``sections:`` shows (a renderer whose spec field is unset shows nothing)
DEFAULT_SECTIONS = ("summary", "capacity_pairs", "curves", "plane", "frontier", "meta_curves", "paired", "matrices")


def section(spec: StudySpec, root: Optional[str] = None) -> str:
    """A study's section of RESULTS.md (markdown), from its records under ``root`` (default: the project)."""
    root = root or PROJECT_DIR
    raw = _raw(spec, root)
    every_run = [compare.record_from_json(d) for d in raw]
    parts = [f"## {spec.title}", "", spec.setup.strip(), ""]
    if not spec.commands:          # a section of prose only (limits, withdrawn studies)
        return "\n".join(parts)
    parts += ["```bash", *spec.commands, "```", ""]
    if not every_run and spec.results:
        parts += ["(no runs yet: run the commands above, or `ovq-cl study NAME`)", ""]
        return "\n".join(parts)
    if raw:
        walls = [d.get("wall_seconds") for d in raw if d.get("wall_seconds") is not None]
        if walls:
            parts += [f"{len(raw)} runs, wall time per run {statistics.fmean(walls):.0f} s mean "
                      f"({min(walls):.0f}-{max(walls):.0f} s), {sum(walls) / 3600:.1f} h in all, on this project's "
                      "2-core CPU machine (a run shares its meta-training with runs that meta-train the same: "
                      "those take less)." + _attempts_note(raw), ""]
        parts += [code_versions_line(raw), ""]
    records, version_notes = _one_run_per_replicate(every_run)
    parts += [*(f"Note: {note}." for note in version_notes), *([""] if version_notes else [])]
    ctx = SectionContext(spec=spec, root=root, raw=raw, every_run=every_run, records=records)
    for render, options in study_sections(spec):
        parts += render(ctx, **options)
    if spec.findings.strip():
        parts += ["Findings:", "", spec.findings.strip(), ""]
    return "\n".join(parts)


def _analysis_sections(spec: StudySpec) -> Dict[str, Callable[..., List[str]]]:
    """The renderers of the study's own ``analysis.py`` (its ``SECTIONS``), imported from its file; none
    without one."""
    import importlib.util
    import sys

    path = os.path.join(spec.folder, "analysis.py")
    if not spec.folder or not os.path.exists(path):
        return {}
    own_studies = os.path.join(os.path.dirname(os.path.abspath(__file__)), "studies")
    inside = os.path.dirname(os.path.dirname(os.path.abspath(path))) == own_studies
    # a project study's analysis is the module tests import (experiments.studies.NAME.analysis); one
    # from elsewhere (a user's study folder) gets a name of its own
    if inside:
        module_name = f"experiments.studies.{spec.name}.analysis"
    else:                          # known by its path and content: an edited file is imported again
        import hashlib
        with open(path, "rb") as fh:
            digest = hashlib.sha1(os.path.abspath(path).encode() + fh.read()).hexdigest()[:16]
        module_name = f"_ovq_cl_study_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        if inside:
            import importlib
            module = importlib.import_module(module_name)
        else:
            loader = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[module_name] = module
            loader.loader.exec_module(module)
    sections = getattr(module, "SECTIONS", None)
    if not isinstance(sections, dict):
        raise ValueError(f"study {spec.name}: {path} defines no SECTIONS = {{name: renderer}}")
    return sections


def study_sections(spec: StudySpec) -> List[Tuple[Callable[..., List[str]], Dict[str, Any]]]:
    """The spec's renderers in order, each with its options: ``sections:`` (default
    :data:`DEFAULT_SECTIONS`), a name or ``{name: {options}}`` each, found among the framework's
    :data:`RENDERERS` and the study's own (its ``analysis.py``). Options are the renderer's keyword
    arguments; a missing or unknown one, or an unknown renderer, raises one ValueError naming it. A
    renderer may carry ``check(spec, **options)`` for what its signature cannot say (run here, too)."""
    import inspect

    own = _analysis_sections(spec)
    clash = sorted(set(own) & set(RENDERERS))
    if clash:
        raise ValueError(f"study {spec.name}: its analysis.py redefines the framework's renderers {clash}")
    known = {**RENDERERS, **own}
    out = []
    for entry in (DEFAULT_SECTIONS if spec.sections is None else spec.sections):
        if isinstance(entry, str):
            name, options = entry, {}
        elif isinstance(entry, dict) and len(entry) == 1:
            (name, options), = entry.items()
            options = dict(options or {})
        else:
            raise ValueError(f"study {spec.name}: a section is a renderer's name or {{name: {{options}}}}, got {entry!r}")
        if name not in known:
            raise ValueError(f"study {spec.name}: no section renderer {name!r} (known: {sorted(known)})")
        render = known[name]
        params = list(inspect.signature(render).parameters.values())[1:]       # after the context
        takes = [p.name for p in params]
        unknown = sorted(set(options) - set(takes))
        missing = [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in options]
        if unknown or missing:
            what = "; ".join(([f"unknown option(s) {unknown}"] if unknown else [])
                             + ([f"missing option(s) {missing}"] if missing else []))
            raise ValueError(f"study {spec.name}: section {name!r}: {what} (its options: {takes or 'none'})")
        check = getattr(render, "check", None)
        if check is not None:
            check(spec, **options)
        out.append((render, options))
    return out
