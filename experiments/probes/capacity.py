"""The capacity probe: recall of N facts bound once and then queried, at a ladder of N
(:mod:`strategies.evaluation.capacity`), from a fresh state, before the stream, with each layer's bound
from its shapes beside it (``Mixer.fact_capacity_bound``). Configured by ``gate.capacity_facts`` (the
ladder; [] = not measured) and ``gate.interference_episodes`` (items a point); needs the stream's
``capacity_probe``."""
from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from experiments.probes.base import Measured, Probe, ProbeContext, check_stream_probe
from strategies.evaluation.capacity import measure_capacity, plot_capacity


class CapacityProbe(Probe):
    name = "capacity"
    keeps_rng = False                  # as before probes were plugins (Probe.keeps_rng)
    table_rank = 20

    def wanted(self, cfg) -> bool:
        return bool(cfg.gate.capacity_facts)

    def check(self, cfg, bench) -> None:
        check_stream_probe(bench, "capacity_probe", "gate.capacity_facts", cfg.stream.name,
                           [(n, 1) for n in cfg.gate.capacity_facts])

    def measure(self, ctx: ProbeContext) -> Measured:
        cfg, bench = ctx.config, ctx.bench
        with ctx.autocast():
            curve = measure_capacity(ctx.model, bench.capacity_probe, cfg.gate.capacity_facts, bench.info.metric,
                                     cfg.gate.interference_episodes, cfg.gate.batch_size, device=ctx.device,
                                     context=bench.info.metric_context)
        held = curve.capacity(cfg.gate.span_level)
        # beside the measurement, what each layer's shapes allow (Mixer.fact_capacity_bound; None: unbounded/unknown)
        bounds = [m.fact_capacity_bound() for m in getattr(ctx.model, "mixers", [])]
        return Measured(
            {"curve": curve.as_dict(), "capacity": held, "level": cfg.gate.span_level, "bound_per_layer": bounds},
            curve.table(), plot_capacity(curve, cfg.label()),
            series=[("capacity", p.score, p.facts) for p in curve.points],
            metrics={"capacity/facts": float(held)} if held is not None else {},
            heading=f"capacity curve ({cfg.label()}), capacity {held}:")

    def tables(self, records: Sequence[Any], baseline: Optional[str] = None) -> List[Tuple[str, str]]:
        table = capacity_table(records)
        return [("Capacity curves (after meta-training, before the stream, from a fresh state: recall of N facts bound "
                 "once and then queried; `docs/measurement.md`):", table)] if table else []


def capacity_points(r) -> List[Dict[str, Any]]:
    """A run's capacity-curve points (each with ``facts`` and ``score``); [] when it measured none."""
    return (r.probe("capacity").get("curve") or {}).get("points") or []


def capacity_of(r) -> Tuple[Optional[int], bool]:
    """A run's capacity (most facts held at skill >= 0.5; None when even the fewest are not) and whether
    it is censored: held at the ladder's top, so the capacity is at least that."""
    C = r.probe("capacity").get("capacity")
    points = capacity_points(r)
    return C, C is not None and bool(points) and C == points[-1]["facts"]


def capacity_cell(r) -> str:
    """'<N' (even the fewest, N, are not held), '>=N' (the ladder's top is held) or the capacity."""
    C, censored = capacity_of(r)
    return f"<{capacity_points(r)[0]['facts']}" if C is None else (f">={C}" if censored else str(C))


def bounds_cell(runs) -> str:
    bounds = runs[0].probe("capacity").get("bound_per_layer") or []
    return ", ".join("unbounded" if b is None else str(b) for b in bounds) or "-"


def capacity_table(records: Sequence[Any]) -> str:
    """One row per configuration with a capacity curve: the score at each number of facts, mean ± std
    [95% CI] over seeds, the capacity per seed (the most facts with skill >= 0.5; '<N' when even the
    fewest, N, fall below; '>=N' when the ladder's top, N, is still held), and the state bytes per layer
    and lane beside it. '' when no run has one."""
    from experiments.compare import bytes_cell, groups_with
    from experiments.stats.intervals import mean_interval

    groups = groups_with(records, lambda r: r.probe("capacity").get("curve"))
    if not groups:
        return ""
    ladder = sorted({p["facts"] for runs in groups.values() for r in runs for p in capacity_points(r)})
    head = ["configuration", "n", *[f"@ {n} facts" for n in ladder], "capacity per seed (facts)",
            "bound per layer (facts)", "state bytes/layer/lane"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups):
        runs = groups[key]
        cells = [key, str(len(runs))]
        for n in ladder:
            scores = [next((p["score"] for p in capacity_points(r) if p["facts"] == n), math.nan) for r in runs]
            cells.append(mean_interval(scores).format() if any(not math.isnan(x) for x in scores) else "-")
        cells += [", ".join(capacity_cell(r) for r in runs), bounds_cell(runs), bytes_cell(runs)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def capacity_paired_table(records: Sequence[Any], pairs: Sequence[Sequence[str]]) -> str:
    """Each declared (configuration, baseline) pair of patterns (``compare.find_group``) at every number of
    facts of the capacity ladder both measured: recall, configuration - baseline, paired over the
    replicates both ran with one code version, with the mean skill of each side; Holm over the whole
    table, the declared family, in which a point without a test counts as p = 1. '' when no run has a
    capacity curve."""
    from experiments.compare import find_group, format_p, groups_with
    from experiments.stats.intervals import paired_comparison
    from experiments.stats.multiple import holm
    from experiments.stats.pairing import pairs_in_one_version

    groups = groups_with(records, capacity_points)
    if not groups:
        return ""

    def point(r, n: int, what: str) -> float:
        return next((float(p[what]) for p in capacity_points(r) if p["facts"] == n and what in p), math.nan)

    rows, notes = [], []
    for pattern, base_pattern in pairs:
        try:
            key, base = find_group(groups, pattern), find_group(groups, base_pattern)
        except ValueError as e:       # no runs of one side yet, or a pattern that matches several
            notes.append(f"{pattern} against {base_pattern}: {str(e).split('; known')[0]}")
            continue
        version, paired, left_out, _ = pairs_in_one_version(groups[key], groups[base])
        if left_out:
            notes.append(f"{key} against {base}: paired within {version} ({left_out} runs of other code versions "
                         "not paired)")
        ladder = sorted({p["facts"] for a, _ in paired for p in capacity_points(a)}
                        & {p["facts"] for _, b in paired for p in capacity_points(b)})
        for n in ladder:
            c = paired_comparison([point(a, n, "score") for a, _ in paired], [point(b, n, "score") for _, b in paired])
            skills = [statistics.fmean(x) if x else math.nan for x in
                      ([v for v in (point(r, n, "skill") for r in side) if not math.isnan(v)]
                       for side in ([a for a, _ in paired], [b for _, b in paired]))]
            rows.append((key, base, n, c, skills))
    adjusted = holm([1.0 if math.isnan(c.p_t) else c.p_t for *_, c, _ in rows]) if rows else []
    lines = ["| configuration | baseline | facts | n pairs | recall, configuration - baseline [95% CI] | mean skill "
             "(configuration / baseline) | paired t p | p Holm |", "|---|---|---|---|---|---|---|---|"]
    for (key, base, n, c, skills), p in zip(rows, adjusted):
        diff = f"{c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}]" if c.n >= 2 else (
            f"{c.mean_difference:+.3f} (1 pair)" if c.n == 1 else "-")
        skill = " / ".join("-" if math.isnan(x) else f"{x:.2f}" for x in skills)
        lines.append(f"| {key} | {base} | {n} | {c.n} | {diff} | {skill} | {format_p(c.p_t)} | {format_p(p)} |")
    return "\n".join(lines + ([""] + [f"Note: {note}." for note in notes] if notes else []))
