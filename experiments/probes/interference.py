"""The interference probe: recall of facts presented once against the number of items between them and
their queries, by kind of item (:mod:`strategies.evaluation.interference`), from a fresh state, before the
stream. Configured by ``gate.interference`` (the kinds; [] = not measured), ``gate.interference_max_items``
and ``gate.interference_episodes``; needs the stream's ``interference_probe``."""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

from experiments.probes.base import Measured, Probe, ProbeContext, check_stream_probe
from experiments.probes.capacity import bounds_cell, capacity_cell, capacity_of, capacity_points
from strategies.evaluation.interference import item_ladder, measure_interference, plot_interference


class InterferenceProbe(Probe):
    name = "interference"
    keeps_rng = False                  # as before probes were plugins (Probe.keeps_rng)
    table_rank = 30

    def wanted(self, cfg) -> bool:
        return bool(cfg.gate.interference)

    def check(self, cfg, bench) -> None:
        check_stream_probe(bench, "interference_probe", "gate.interference", cfg.stream.name,
                           [(kind, 1, 1) for kind in cfg.gate.interference])

    def measure(self, ctx: ProbeContext) -> Measured:
        cfg, bench = ctx.config, ctx.bench
        with ctx.autocast():
            curves = measure_interference(ctx.model, bench.interference_probe, cfg.gate.interference,
                                          item_ladder(cfg.gate.interference_max_items), bench.info.metric, 2,
                                          cfg.gate.interference_episodes, cfg.gate.batch_size, device=ctx.device,
                                          context=bench.info.metric_context)
        halves = {kind: curves.half_point(kind) for kind in curves.curves}
        return Measured(
            {**curves.as_dict(), "half_items": halves}, curves.table(), plot_interference(curves, cfg.label()),
            series=[(f"interference/{kind}", p.score, p.items) for kind, points in curves.curves.items() for p in points],
            metrics={f"interference/{kind}/half_items": float(n) for kind, n in halves.items() if n is not None},
            heading=f"interference curves ({cfg.label()}), score against intervening items:")

    def tables(self, records: Sequence[Any], baseline: Optional[str] = None) -> List[Tuple[str, str]]:
        return [(caption, table) for caption, table in [
            ("Interference curves (measured after meta-training, before the stream, from a fresh state: recall of facts "
             "presented once against the number of items between them and their queries, by kind of item; "
             "`docs/measurement.md`):", interference_table(records)),
            ("Interference against capacity (other_region: new bindings of another experience's keys; a memory that "
             "halves its recall of P facts after h bindings while it holds C facts at once forgets before its capacity "
             "is used when P + h < C):", before_capacity_table(records))] if table]


def curves_of(r) -> dict:
    """A run's interference curves ({kind: [points]}; {} when it measured none)."""
    return r.probe("interference").get("curves") or {}


def interference_table(records: Sequence[Any]) -> str:
    """One row per configuration and filler kind with interference curves: the score at each number of
    intervening items, mean ± std [95% CI] over seeds, and the half point per seed (the fewest items at
    which the skill falls below half its value at 0 items; '>N' when it never does up to N). '' when no
    run has curves."""
    from experiments.compare import groups_with
    from experiments.stats.intervals import mean_interval

    groups = groups_with(records, curves_of)
    if not groups:
        return ""
    ladder = sorted({p["items"] for runs in groups.values() for r in runs
                     for points in curves_of(r).values() for p in points})
    head = ["configuration", "kind", "n", *[f"@ {n} items" for n in ladder], "half point per seed (items)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups):
        runs = groups[key]
        kinds = list(dict.fromkeys(k for r in runs for k in curves_of(r)))
        for kind in kinds:
            have = [r for r in runs if kind in curves_of(r)]
            cells = [key, kind, str(len(have))]
            for n in ladder:
                scores = [next((p["score"] for p in curves_of(r)[kind] if p["items"] == n), math.nan) for r in have]
                cells.append(mean_interval(scores).format() if any(not math.isnan(x) for x in scores) else "-")
            cells.append(", ".join(half_cell(half_point(r, kind), curves_of(r)[kind][-1]["items"]) for r in have))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def half_point(r, kind: str) -> float:
    """A run's ``kind`` interference half point: the items at which recall halved, inf when it never did up
    to the curve's end, NaN when there is no curve or no skill at 0 items to halve (a memory that never
    held the probe's facts is not the most robust one, which "never halves" would say)."""
    points = curves_of(r).get(kind)
    if not points or not (points[0].get("skill", 1.0) > 0):
        return math.nan
    h = (r.probe("interference").get("half_items") or {}).get(kind)
    return math.inf if h is None else float(h)


def half_cell(h: float, last: int) -> str:
    return "n/a (no skill at 0)" if math.isnan(h) else f">{last}" if math.isinf(h) else f"{h:.0f}"


def before_capacity_table(records: Sequence[Any], kind: str = "other_region") -> str:
    """Does a memory lose facts to interference before its capacity is used? One row per configuration
    with both a capacity curve and a ``kind`` interference curve; per seed: the probe's P facts
    (``stream.options.facts_per_episode``), the half point h (intervening bindings at which recall of
    the P facts halves), the capacity C (most facts held at skill >= 0.5, no filler). When P + h < C the
    memory lost half of the facts while it had been shown at most P + h bindings, fewer than it can hold
    at once: it forgets *before* its capacity is used (interference, not a full memory). Both ends are
    censored by their ladders (h: '>N' when it never halves up to N; C: '>=N' when the ladder's top is
    still held) and known only between rungs (h in (previous rung, h], C in [C, next rung)): a seed
    the ladders leave open is counted apart ("unknown"). '' when no run has both."""
    from experiments.compare import bytes_cell, groups_with

    groups = groups_with(records, lambda r: r.probe("capacity").get("curve") and kind in curves_of(r))
    if not groups:
        return ""
    head = ["configuration", "n", f"{kind} half point per seed (bindings)", "capacity per seed (facts)",
            "P + h < C (forgets before capacity)", "bound per layer (facts)", "state bytes/layer/lane"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups):
        runs = groups[key]
        halves, caps, verdicts = [], [], []
        for r in runs:
            P = int(r.params.get("stream.options.facts_per_episode", 8))
            half = half_point(r, kind)
            items = [p["items"] for p in curves_of(r)[kind]]
            C, censored = capacity_of(r)
            facts = [p["facts"] for p in capacity_points(r)]
            halves.append(half_cell(half, items[-1]))
            caps.append(capacity_cell(r))
            h = None if math.isinf(half) else half
            verdicts.append(None if math.isnan(half) else before_capacity(
                P, h, max((n for n in items if h is not None and n < h), default=0), items[-1],
                C, None if censored or C is None else next((n for n in facts if n > C), None)))
        known = [v for v in verdicts if v is not None]
        unknown = sum(v is None and r.probe("capacity").get("capacity") is not None for v, r in zip(verdicts, runs))
        parts = ([f"{sum(known)} of {len(known)} seeds"] if known else []) + \
            ([f"{unknown} seed(s) unknown (beyond the ladders)"] if unknown else [])
        verdict = "; ".join(parts) or "n/a (no capacity)"
        lines.append("| " + " | ".join([key, str(len(runs)), ", ".join(halves), ", ".join(caps), verdict,
                                         bounds_cell(runs), bytes_cell(runs)]) + " |")
    return "\n".join(lines)


def before_capacity(P: int, h: Optional[int], h_prev: int, h_max: int, C: Optional[int],
                    C_next: Optional[int]) -> Optional[bool]:
    """P + h < C (the memory lost half of P facts after h bindings while it holds C at once), read with
    what the ladders leave open: the half point lies in (``h_prev``, h] (the rung before it, where
    recall had not halved yet; beyond ``h_max`` when h is None), the capacity in [C, ``C_next``) (the
    next capacity rung, which failed; None: the ladder's top was held, so C is a lower bound). True when
    it holds at every value the rungs allow, False when it fails at every one, None otherwise (or
    without a capacity)."""
    if C is None:
        return None
    if h is not None and P + h < C:                      # the largest h, the smallest C
        return True
    h_low = (h_max if h is None else h_prev) + 1         # the smallest h, the largest C
    return False if C_next is not None and P + h_low >= C_next - 1 else None
