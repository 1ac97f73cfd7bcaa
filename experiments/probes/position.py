"""The position probe: bits per byte against position (:mod:`strategies.evaluation.position`) of the final
model, one curve per experience's domain, each held-out document read from a fresh state, after the
stream. Configured by ``gate.position_length`` (0 = not measured), ``gate.position_episodes`` and
``gate.position_chunk``; needs the stream's ``position_probe``."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from experiments.probes.base import Measured, Probe, ProbeContext, check_stream_probe
from strategies.evaluation.position import measure_position_curve, plot_position


class PositionProbe(Probe):
    name, phase = "position", "after_stream"
    keeps_rng = False                  # as before probes were plugins (Probe.keeps_rng)
    table_rank = 40

    def wanted(self, cfg) -> bool:
        return bool(cfg.gate.position_length)

    def check(self, cfg, bench) -> None:
        check_stream_probe(bench, "position_probe", "gate.position_length", cfg.stream.name,
                           [(j, cfg.gate.position_length, 1) for j in range(bench.info.n_experiences)])

    def measure(self, ctx: ProbeContext) -> Measured:
        cfg, bench, info = ctx.config, ctx.bench, ctx.bench.info
        names = [getattr(d, "name", str(j)) for j, d in enumerate(getattr(info, "domains", []))] or \
            [str(j) for j in range(info.n_experiences)]
        curves = {}
        with ctx.autocast():
            for j, name in enumerate(names):
                docs = bench.position_probe(j, cfg.gate.position_length, cfg.gate.position_episodes)
                curves[name] = measure_position_curve(ctx.model, docs, cfg.gate.position_length,
                                                      cfg.gate.position_chunk, cfg.gate.batch_size, device=ctx.device)
        table = "\n\n".join(f"{n}:\n{c.table()}" for n, c in curves.items())
        return Measured(
            {"length": cfg.gate.position_length, "curves": {n: c.as_dict() for n, c in curves.items()}},
            table, plot_position(curves, cfg.label()),
            series=[(f"position/{n}", b.bits_per_byte, b.hi) for n, c in curves.items() for b in c.buckets],
            heading=f"position curves ({cfg.label()}), bits per byte against position:")

    def tables(self, records: Sequence[Any], baseline: Optional[str] = None) -> List[Tuple[str, str]]:
        table = position_table(records)
        if not table:
            return []
        out = [("Position curves (after the stream, each held-out document read from a fresh state: bits per byte by "
                "position bucket, mean over seeds; `strategies/evaluation/position.py`):", table)]
        if baseline:
            try:
                paired = position_paired_table(records, baseline)
            except ValueError as e:
                paired = f"(no paired table: {e})"
            out.append(("The longest contexts (last position bucket of each domain), paired against the baseline "
                        "(difference = row - baseline; lower is better):", paired))
        return out


def position_curves(r) -> Dict[str, Any]:
    """A run's position curves ({domain: curve}; {} when it measured none)."""
    return r.probe("position").get("curves") or {}


def last_position_bucket(r, domain: str) -> Optional[Dict[str, Any]]:
    """The last (longest-context) bucket of a run's position curve on ``domain`` (``lo``, ``hi``,
    ``bits_per_byte``); None when it has none."""
    buckets = (position_curves(r).get(domain) or {}).get("buckets") or []
    return buckets[-1] if buckets else None


def position_table(records: Sequence[Any]) -> str:
    """One row per configuration and domain with position curves: bits per byte per position bucket,
    mean ± std [95% CI] over seeds. '' when no run has one."""
    from experiments.compare import groups_with
    from experiments.stats.intervals import mean_interval

    groups = groups_with(records, position_curves)
    if not groups:
        return ""
    edges = sorted({(b["lo"], b["hi"]) for runs in groups.values() for r in runs
                    for c in position_curves(r).values() for b in c["buckets"]})
    head = ["configuration", "domain", "n", *[f"[{lo}, {hi})" for lo, hi in edges]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups):
        runs = groups[key]
        for domain in dict.fromkeys(d for r in runs for d in position_curves(r)):
            have = [r for r in runs if domain in position_curves(r)]
            cells = [key, domain, str(len(have))]
            for lo, hi in edges:
                values = [next((b["bits_per_byte"] for b in position_curves(r)[domain]["buckets"]
                                if (b["lo"], b["hi"]) == (lo, hi)), math.nan) for r in have]
                cells.append(mean_interval(values).format() if any(not math.isnan(v) for v in values) else "-")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def position_paired_table(records: Sequence[Any], baseline: str) -> str:
    """Every configuration against ``baseline`` on the bits per byte of the last position bucket of each
    domain (the longest contexts), paired over the replicates both ran, Holm over the table's rows.
    '' when no run has position curves."""
    from experiments.compare import find_group, format_p, groups_with
    from experiments.stats.intervals import paired_comparison
    from experiments.stats.multiple import holm
    from experiments.stats.pairing import pairs_against

    groups = groups_with(records, position_curves)
    if not groups:
        return ""
    base_key = find_group(groups, baseline)

    def last(r, domain):
        bucket = last_position_bucket(r, domain)
        return bucket["bits_per_byte"] if bucket else math.nan

    domains = list(dict.fromkeys(d for r in groups[base_key] for d in position_curves(r)))
    rows = []
    for key, pairs in pairs_against(groups, base_key):
        for domain in domains:
            bucket = position_curves(groups[base_key][0])[domain]["buckets"][-1]
            c = paired_comparison([last(a, domain) for a, _ in pairs], [last(b, domain) for _, b in pairs])
            rows.append((key, domain, f"[{bucket['lo']}, {bucket['hi']})", c))
    adjusted = holm([c.p_t for *_, c in rows])
    lines = [f"baseline: {base_key}", "", "| configuration - baseline | domain | positions | n pairs | difference "
             "(bits per byte) [95% CI] | paired t p | p Holm | Wilcoxon p |", "|---|---|---|---|---|---|---|---|"]
    for (key, domain, where, c), p in zip(rows, adjusted):
        lines.append(f"| {key} | {domain} | {where} | {c.n} | {c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}] | "
                     f"{format_p(c.p_t)} | {format_p(p)} | {format_p(c.p_wilcoxon)} |")
    return "\n".join(lines)
