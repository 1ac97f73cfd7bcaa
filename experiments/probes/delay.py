"""The delay probe: the delay-recall curve (:mod:`strategies.evaluation.delay`) from a fresh state,
before the stream, at a ladder of delays up to the stream's longest (capped by ``gate.delay_max_tokens``);
with ``gate.delay: experience``, recall at the learning delay is a gate. Configured by ``gate.delay_episodes``
(0: not measured) and needs the stream's ``delay_probe``."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from experiments.probes.base import Measured, Probe, ProbeContext, gate_tag
from strategies.evaluation.delay import delay_gate, filler_ladder, measure_delay_curve, plot_delay_curve


def stream_delays(cfg, bench) -> Dict[str, int]:
    """The delays (tokens per lane) the stream tests: ``learning``, one experience's tokens (the most a
    fact waits for its test in the experience that teaches it), and ``longest``, all experiences'."""
    lanes = cfg.strategy.train_mb_size
    # training drops a last partial minibatch (every lane continues its own stream), so an experience
    # streams floor(episodes / lanes) episodes per lane
    per_exp = [len(exp.dataset) // lanes * bench.info.seq_len for exp in bench.train_stream]
    return {"learning": max(per_exp), "longest": sum(per_exp), "episode": bench.info.seq_len}


class DelayProbe(Probe):
    name, artifact = "delay", "delay_curve"
    keeps_rng = False                  # as before probes were plugins (Probe.keeps_rng)
    table_rank = 10

    def wanted(self, cfg) -> bool:
        return cfg.gate.delay_episodes > 0

    # no check(): a stream without a delay probe simply has no curve (as before probes were plugins)

    def measure(self, ctx: ProbeContext) -> Measured:
        cfg, bench = ctx.config, ctx.bench
        probe = getattr(bench, "delay_probe", None)
        if probe is None:
            return Measured({})
        delays = stream_delays(cfg, bench)
        # a long stream's longest delay would need probes as long as the stream: gate.delay_max_tokens caps it
        fillers = filler_ladder(min(delays["longest"], cfg.gate.delay_max_tokens or delays["longest"]),
                                delays["episode"])
        with ctx.autocast():
            curve = measure_delay_curve(ctx.model, probe, fillers, delays["episode"], bench.info.metric,
                                        cfg.gate.delay_episodes, cfg.gate.batch_size, device=ctx.device,
                                        context=bench.info.metric_context)
        required = cfg.resolved_delay_gate()
        d_gate = delay_gate(curve, delays["learning"], cfg.gate.min_skill).as_dict()
        span = curve.span(cfg.gate.span_level)
        out = {"curve": curve.as_dict(), "gate": d_gate, "required": required, "span": span, **delays}
        return Measured(
            out, curve.table(),
            plot_delay_curve(curve, cfg.label(), {"learning delay": delays["learning"], "longest": delays["longest"]}),
            series=[("delay/score", p.score, p.delay) for p in curve.points]
            + [("delay/skill", p.skill, p.delay) for p in curve.points if math.isfinite(p.skill)],
            metrics={"delay_gate/skill": d_gate["skill"], "delay_gate/delay": float(delays["learning"]),
                     **({"delay/span": float(span)} if span is not None else {})},
            tags={"recalls_at_learning_delay": gate_tag(d_gate["learned"]),
                  "delay_gate_required": str(required).lower()},
            heading=f"delay-recall curve ({cfg.label()}), learning delay {delays['learning']} tokens, span "
                    f"{'> ' + str(curve.points[-1].delay) if span is None else span}:")

    def tables(self, records: Sequence[Any], baseline: Optional[str] = None) -> List[Tuple[str, str]]:
        table = delay_table(records)
        return [("Delay-recall curves (measured after meta-training, before the stream, from a fresh state; "
                 "`docs/measurement.md`):", table)] \
            if table else []


def curve_score(r, delay: int) -> float:
    """The run's delay-curve score at the first measured delay >= ``delay`` (NaN without a curve)."""
    for p in (r.probe("delay").get("curve") or {}).get("points", []):
        if p["delay"] >= delay:
            return float(p["score"])
    return math.nan


def delay_table(records: Sequence[Any]) -> str:
    """One row per configuration with a delay-recall curve: the score at delay 0 (the in-context task),
    at the learning delay (one experience per lane: the delay gate) and at the longest delay the stream
    tests, each mean ± std [95% CI] over seeds; the span (first delay below the level; '>L' when it never
    falls below it up to L tokens) per seed; how many runs pass the delay gate. '' when no run has a curve."""
    from experiments.compare import groups_with
    from experiments.stats.intervals import mean_interval

    groups = groups_with(records, lambda r: r.probe("delay").get("curve"))
    if not groups:
        return ""
    # the delays in the header when every configuration shares them, else in each cell (streams whose
    # experiences differ in length have different learning delays)
    shared = {(v[0].probe("delay")["learning"], v[0].probe("delay")["longest"]) for v in groups.values()}
    learning, longest = next(iter(shared)) if len(shared) == 1 else (None, None)
    head = ["configuration", "n", "score @ delay 0",
            "@ learning delay" + (f" ({learning} tokens)" if learning is not None else ""),
            "@ longest" + (f" ({longest} tokens)" if longest is not None else ""), "span per seed (tokens)", "delay gate"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups):
        runs = groups[key]
        delay = [r.probe("delay") for r in runs]
        cells = [key, str(len(runs))]
        for i, where in enumerate((0, delay[0]["learning"], delay[0]["longest"])):
            cell = mean_interval([curve_score(r, where) for r in runs]).format()
            cells.append(cell + (f" @ {where} tokens" if i and learning is None else ""))
        spans = [d.get("span") for d in delay]
        last = [d["curve"]["points"][-1]["delay"] for d in delay]
        cells.append(", ".join(f">{m}" if s is None else str(s) for s, m in zip(spans, last)))
        passed = [d.get("gate", {}).get("learned") for d in delay]
        gated = any(r.params.get("gate.delay") == "experience" for r in runs)     # the current rule
        cells.append(f"{sum(bool(p) for p in passed)}/{sum(p is not None for p in passed)} recall"
                     + ("" if gated else " (not a gate here)"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
