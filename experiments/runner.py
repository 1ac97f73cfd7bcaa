"""One run of the experiment: meta-training and the learned gate, then the stream, evaluated after
every experience (``docs/design.md``, section 5).

    cfg = run_config("experiments/configs/icr_frozen.yaml", ["model.layers=[ovq]", "seed=1"])
    result = run(cfg)          # RunResult: the matrix R, the summaries, the gates, the MLflow run id, ...

:func:`run` reads as the protocol: start (meta-train, gate) or resume (from the last checkpoint of the
same config), then for every experience j: train (or, with ``frozen``, only stream) through the model
with the memory policy, evaluate every experience i from a copy of the carried state (R[j][i]), log,
checkpoint. At the end: both forgetting definitions, the stream gate, and (streams whose facts change)
the same scored against the facts in force. ``seed`` seeds the data too unless
``stream.options.seed`` is set (``experiments.config.with_data_seed``).

Under torchrun (``strategies.distributed``) every rank runs this same function on its block of the
lanes; rank 0 alone decides reuse and resumption, tracks, writes checkpoints (every lane's state) and
prints; every rank returns the same R (only rank 0's result names the MLflow run).
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

import ovq_cl.base.avalanche_compat  # noqa: F401  (before avalanche)
from avalanche.training.plugins import EvaluationPlugin

from experiments.artifacts import forgetting_plot, matrix_csv
from experiments.config import RunConfig, with_data_seed
from experiments import meta_cache
from ovq_cl import DecoderLM, RegressionLM
from ovq_cl.config import ModelConfig, model_config
from strategies import distributed, forgetting
from experiments.code_version import code_version
from strategies.checkpoint import load_latest, rng_state, save_checkpoint, set_rng_state
from strategies.delay import delay_gate, filler_ladder, measure_delay_curve, plot_delay_curve
from strategies.gate import measure_gate, stream_gate
from strategies.meta import meta_train
from strategies.metrics import ResultMatrix, n_parameters, state_metrics
from strategies.plugins import load_plugin_states, plugin_states
from strategies.registry import build_strategy
from strategies.scores import higher_is_better
from streams import stream_benchmark
from streams.common import held_out, stack_items


@dataclass
class RunResult:
    """Everything a run measured (also written to MLflow as ``results.json``; see :meth:`record`).

    R[j][i]: score on experience i after training experience j; R_se / R_n: its episode-clustered
    standard error and number of answers. ``current``: for streams whose facts change, the matrices
    scored against the labels in force after j (``R_current``, ``R_current_se``, ``updated``, ``stale``,
    ``changed``), else None. ``gate`` / ``stream_gate``: :class:`strategies.gate.GateResult` as dicts.
    """

    config: RunConfig
    metric: str
    R: List[List[Optional[float]]]
    summary: Dict[str, float]
    tokens_after: List[int]
    state_bytes: List[int]
    run_id: Optional[str] = None
    checkpoint: Optional[str] = None
    meta_history: List[Dict[str, float]] = field(default_factory=list)
    R_se: List[List[Optional[float]]] = field(default_factory=list)
    R_n: List[List[Optional[float]]] = field(default_factory=list)
    current: Optional[Dict[str, List[List[Optional[float]]]]] = None
    summary_current: Dict[str, float] = field(default_factory=dict)
    gate: Dict[str, Any] = field(default_factory=dict)
    stream_gate: Dict[str, Any] = field(default_factory=dict)
    delay: Dict[str, Any] = field(default_factory=dict)
    parameters: int = 0
    state_bytes_per_lane: List[float] = field(default_factory=list)
    wall_seconds: float = math.nan
    artifact_uri: Optional[str] = None
    code_version: Optional[str] = None     # experiments.code_version of the code that ran it (None: not recorded)

    @classmethod
    def from_record(cls, cfg: RunConfig, d: Dict[str, Any], checkpoint: Optional[str] = None) -> "RunResult":
        """The result of a finished run, from its record (what :meth:`record` wrote)."""
        return cls(cfg, d["metric"], d["R"], d["summary"], d["tokens_after"], d.get("state_bytes", []),
                   d.get("run_id"), checkpoint, d.get("meta_history", []), R_se=d["R_se"], R_n=d["R_n"],
                   current=d.get("current"), summary_current=d.get("summary_current", {}), gate=d.get("gate", {}),
                   stream_gate=d.get("stream_gate", {}), delay=d.get("delay", {}), parameters=d.get("parameters", 0),
                   state_bytes_per_lane=d.get("state_bytes_per_layer_lane", []),
                   wall_seconds=d.get("wall_seconds", math.nan), artifact_uri=d.get("artifact_uri"),
                   code_version=d.get("code_version"))

    @property
    def learned(self) -> Optional[bool]:
        """True when every gate that applies passed (held-out skill, delay when required, stream), False
        when one failed, None when none was measured."""
        return combined_gate(self.gate.get("learned"), _delay_flag(self.delay), self.stream_gate.get("learned"))

    def record(self) -> Dict[str, Any]:
        """A JSON-able record of the run: config (flattened), seeds, every matrix and summary."""
        from experiments.tracking import flatten_config

        return {
            "label": self.config.label(), "config_id": self.config.identity(), "params": flatten_config(self.config),
            "seed": self.config.seed, "data_seed": self.config.data_seed, "metric": self.metric,
            "higher_is_better": higher_is_better(self.metric), "R": self.R, "R_se": self.R_se, "R_n": self.R_n,
            "current": self.current, "summary": self.summary, "summary_current": self.summary_current,
            "gate": self.gate, "stream_gate": self.stream_gate, "delay": self.delay, "learned": self.learned,
            "tokens_after": self.tokens_after, "state_bytes_per_layer_lane": self.state_bytes_per_lane,
            "state_bytes": self.state_bytes,
            "parameters": self.parameters, "meta_history": self.meta_history, "run_id": self.run_id,
            "wall_seconds": self.wall_seconds, "artifact_uri": self.artifact_uri, "code_version": self.code_version,
        }


def combined_gate(*flags: Optional[bool]) -> Optional[bool]:
    """False if any gate failed, True if all measured gates passed, None if none was measured."""
    measured = [f for f in flags if f is not None]
    if not measured:
        return None
    return all(measured)


@dataclass
class Session:
    """What a run carries from experience to experience (and what a checkpoint restores)."""

    model: torch.nn.Module
    strategy: Any
    optimizer: Optional[torch.optim.Optimizer]
    results: ResultMatrix
    next_experience: int = 0
    tokens_after: List[int] = field(default_factory=list)
    meta_history: List[Dict[str, float]] = field(default_factory=list)
    gate: Dict[str, Any] = field(default_factory=dict)
    delay: Dict[str, Any] = field(default_factory=dict)


def _delay_flag(delay: Dict[str, Any]) -> Optional[bool]:
    """The delay gate's verdict where the run requires it (``gate.delay``), else None (not a gate)."""
    if not delay or not delay.get("required"):
        return None
    return delay.get("gate", {}).get("learned")


def run(cfg: RunConfig, parent_run_id: Optional[str] = None, stop_after: Optional[int] = None,
        rerun: bool = False, announce: Callable[[str], None] = print) -> RunResult:
    """Runs, resumes or reuses one configuration.

    A run's identity is its resolved config (seeds included; tracking, paths and progress excluded)
    and the code version (:func:`experiments.code_version.code_version`). A finished run of the same
    identity, in the same tracking store, is reused (``rerun=True`` runs again); an unfinished one is
    resumed from its last checkpoint; anything else starts a new run. ``stop_after=j`` stops after
    experience j (tests, debugging). ``announce`` receives what the run does (reuse, resume, where).
    """
    cfg = with_data_seed(cfg.check())
    cfg.check_locations()
    dp = distributed.start(cfg.resolved_device())     # None unless started by torchrun
    distributed.check_device(cfg.resolved_device())
    distributed.check_divisible(**{"strategy.train_mb_size": cfg.strategy.train_mb_size,
                                   "meta_train.batch_size": cfg.meta_train.batch_size})
    if not distributed.is_main():                     # one voice: rank 0's
        announce, cfg.progress = (lambda message: None), False
    started = time.perf_counter()
    seed_everything(cfg.seed)
    bench = stream_benchmark(cfg.stream.name, cfg.stream.options)
    check_lanes(cfg, bench)
    if bench.info.vocab_size is not None:
        cfg.model.vocab_size = bench.info.vocab_size          # the logged config is the one that runs
    check_after_meta(cfg, bench.info)
    if dp is not None:
        check_data_parallel_models(cfg, bench.info)
    version = code_version()
    ckpt_path = os.path.join(cfg.checkpoint.dir, f"{cfg.label()}-{cfg.identity()}-{_slug(version)}", "last.pt")
    ckpt = None
    if cfg.checkpoint.enabled and cfg.checkpoint.resume and not rerun:
        if distributed.is_main():                     # rank 0 asks the store; the others follow its answer
            ckpt = _usable_checkpoint(load_latest(ckpt_path, warn=announce), cfg, announce)
        if distributed.broadcast_flag(ckpt is not None) and ckpt is None:
            ckpt = load_latest(ckpt_path)
            if ckpt is None:
                raise FileNotFoundError(f"torchrun: rank {dp.rank} cannot read the checkpoint rank 0 resumes "
                                        f"({ckpt_path}); every rank needs the checkpoint folder (a shared path)")
    if ckpt is not None and "result" in ckpt["extra"]:
        announce(f"ovq-cl: reusing finished run {ckpt['extra'].get('run_id')} ({os.path.dirname(ckpt_path)}); "
                 "pass --rerun to run again")
        return RunResult.from_record(cfg, ckpt["extra"]["result"], ckpt_path)
    tracker = (_tracker(cfg, parent_run_id, None if ckpt is None else ckpt["extra"].get("run_id"), version)
               if distributed.is_main() else None) or _NullTracker()
    with tracker:
        in_stream = ckpt is not None and "meta" not in ckpt["extra"]     # past meta-training: the stream's model
        session = _new_session(cfg, bench, tracker, cfg.stream_model() if in_stream else cfg.model)
        if ckpt is None:
            tracker.log_config(cfg)
            _close_orphans(cfg, tracker, announce)
            announce(f"ovq-cl: run {cfg.label()}: MLflow run {tracker.run_id} in {tracker.tracking_uri}; "
                     f"checkpoints in {os.path.dirname(ckpt_path) if cfg.checkpoint.enabled else '(none)'}")
        tracker.set_tags({"world_size": 1 if dp is None else dp.world_size})     # of this attempt (a resume may differ)
        save_meta = _meta_saver(cfg, ckpt_path, session, tracker) if cfg.checkpoint.enabled else None
        if ckpt is None or "meta" in ckpt["extra"]:
            session = _start(cfg, session, bench, tracker, save_meta, resume=ckpt)
        else:
            _resume(session, ckpt, tracker)
            announce(f"ovq-cl: resuming run {tracker.run_id} at experience {session.next_experience} "
                     f"({os.path.dirname(ckpt_path)})")
        for j in _progress(range(session.next_experience, bench.info.n_experiences), cfg, "experiences"):
            with _autocast(cfg):
                session.strategy.train(bench.train_stream[j])
                session.tokens_after.append(session.strategy.tokens_streamed)
                session.strategy.eval(bench.test_stream)
            tracker.log_metrics(_experience_metrics(session, j, bench.info.metric), step=j)
            session.next_experience = j + 1
            if cfg.checkpoint.enabled:
                _save(ckpt_path, session, tracker)
            if stop_after is not None and stop_after <= j < bench.info.n_experiences - 1:
                raise KeyboardInterrupt(f"stopped after experience {j} (stop_after)")
        result = _finish(cfg, session, bench, tracker, ckpt_path, time.perf_counter() - started, version)
        if cfg.checkpoint.enabled:                    # a finished run is reused by an identical one
            _save(ckpt_path, session, tracker, extra={"result": result.record()})
        return result


# ------------------------------------------------------------------------------------ the phases


def check_lanes(cfg: RunConfig, bench) -> None:
    """Every training experience must fill the ``strategy.train_mb_size`` lanes at least once: said here,
    before meta-training, not by the strategy after it (one line, nothing computed)."""
    lanes = cfg.strategy.train_mb_size
    for j, exp in enumerate(bench.train_stream):
        if len(exp.dataset) < lanes:
            raise ValueError(f"stream: experience {j} has {len(exp.dataset)} training episodes, fewer than "
                             f"strategy.train_mb_size={lanes} lanes (raise stream.options.train_episodes or lower "
                             "strategy.train_mb_size)")


def check_after_meta(cfg: RunConfig, info) -> None:
    """``after_meta.model`` may change how the memory evolves, not the weights: the stream's model must
    have every parameter of the meta-trained one, same names, same shapes (one line, before any compute)."""
    if not cfg.after_meta.model:
        return
    state = rng_state()                 # building models draws initial weights: leave the run's RNG as it was
    try:
        with torch.device("meta"):      # shapes only: no memory, no initialisation work
            before = {k: tuple(v.shape) for k, v in build_model(cfg, info).state_dict().items()}
            after = {k: tuple(v.shape) for k, v in build_model(cfg, info, cfg.stream_model()).state_dict().items()}
    finally:
        set_rng_state(state)
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            raise ValueError(f"run config: after_meta.model changes the weights ({key}: {before.get(key)} after "
                             f"meta-training, {after.get(key)} in the stream); only options that keep every "
                             "parameter can change after meta-training")


def check_data_parallel_models(cfg: RunConfig, info) -> None:
    """Under torchrun: neither the meta-training nor the stream's model may have an option that shards
    wrongly (``distributed.check_mixer_options``); one line, before any compute."""
    state = rng_state()
    try:
        with torch.device("meta"):
            for model in (cfg.model, cfg.stream_model()):
                distributed.check_mixer_options(build_model(cfg, info, model))
    finally:
        set_rng_state(state)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(cfg: RunConfig, info, model: Optional[ModelConfig] = None) -> torch.nn.Module:
    """A DecoderLM for token streams (vocabulary from the stream), a RegressionLM for continuous ICL;
    ``model``: the model config (default ``cfg.model``, the meta-training one)."""
    user = dict((model or cfg.model).__dict__)
    if info.vocab_size is not None:
        user["vocab_size"] = info.vocab_size
        return DecoderLM(model_config(user))
    return RegressionLM(model_config(user), d_in=info.d_in, d_out=info.d_out)


def _new_session(cfg: RunConfig, bench, tracker, model_cfg: Optional[ModelConfig] = None) -> Session:
    info = bench.info
    model = build_model(cfg, info, model_cfg)
    results = ResultMatrix(info.metric, info.n_experiences,
                           labels_in_force=info.labels_in_force if info.facts_change else None,
                           context=info.metric_context)
    evaluator = EvaluationPlugin(results, loggers=_loggers(tracker))
    s = cfg.strategy
    device = cfg.resolved_device()
    model.to(device)
    distributed.check_mixer_options(model)
    distributed.prepare_model(model)       # under torchrun: rank 0's weights, VQ's EMA over the group
    extra = []
    if cfg.progress:
        from strategies.progress import ProgressPlugin

        extra.append(ProgressPlugin())
    strategy, optimizer = build_strategy(
        s.name, s.options, model=model, memory_policy=cfg.memory.policy, lr=s.lr, train_mb_size=s.train_mb_size,
        epochs=s.epochs, grad_clip=s.grad_clip, evaluator=evaluator, seed=cfg.seed, extra_plugins=extra,
        device=device)
    return Session(model, strategy, optimizer, results)


def _start(cfg: RunConfig, session: Session, bench, tracker, save_meta=None, resume=None) -> Session:
    """Phase 1: meta-training (fresh state per episode; checkpointed every ``meta_train.checkpoint_every``
    steps, resumed from ``resume``), then the model of ``after_meta`` (:func:`_after_meta`), then the
    learned gate on held-out episodes and the delay curve. Returns the session the stream runs with."""
    metric = bench.info.metric
    meta_progress = None
    if resume is None:
        tracker.set_tags({"metric": metric, **{f"metric_definition.{k}": v for k, v in forgetting.DEFINITIONS.items()}})
        tracker.log_dict({"metric": metric, "higher_is_better": higher_is_better(metric),
                          "definitions": forgetting.DEFINITIONS}, "metric_definitions.json")
    else:
        session.model.load_state_dict(resume["model"])
        set_rng_state(resume["rng"])
        meta_progress = resume["extra"]["meta"]
        tracker.set_tags({"resumed_at_meta_step": meta_progress["step"]})
    shared = None
    if cfg.checkpoint.enabled and cfg.checkpoint.share_meta:
        dp = distributed.active()
        shared = meta_cache.meta_path(cfg, meta_cache.meta_key(cfg, getattr(bench, "meta_train_episodes", bench.meta_train),
                                                               world_size=1 if dp is None else dp.world_size))
    main = distributed.is_main()
    stored = meta_cache.load_meta(shared) if shared and meta_progress is None and main else None
    if distributed.broadcast_flag(stored is not None) and stored is None:     # rank 0 found it: so do the others
        stored = meta_cache.load_meta(shared)
        if stored is None:
            raise FileNotFoundError(f"torchrun: a rank cannot read the shared meta-training {shared} that rank 0 "
                                    "loaded; every rank needs the checkpoint folder (a shared path)")
    if stored is not None:                 # the same meta-training already ran: its weights, history, RNG
        session.model.load_state_dict(stored["model"])
        session.meta_history = stored["history"]
        set_rng_state(stored["rng"])
        tracker.set_tags({"meta_train_shared": shared})
    else:
        with _autocast(cfg):
            session.meta_history = _meta_train(cfg, session, bench, tracker, metric, save_meta, meta_progress)
        if shared and main:
            meta_cache.save_meta(shared, session.model, session.meta_history)
    if session.meta_history:
        tracker.log_metrics({"meta_train/final_loss": session.meta_history[-1]["loss"]}, step=0)
    session = _after_meta(cfg, session, bench, tracker)
    source = getattr(bench, "meta_train_episodes", None)
    with _autocast(cfg):
        gate = measure_gate(session.model, None if source is None else held_out(source, cfg.gate.episodes), metric,
                            cfg.gate.min_skill, cfg.gate.batch_size, device=cfg.resolved_device(),
                            context=bench.info.metric_context)
    session.gate = gate.as_dict()
    tracker.log_metrics({"model/parameters": n_parameters(session.model),
                         **{f"gate/{k}": float(v) for k, v in session.gate.items() if v is not None and k != "learned"}},
                        step=0)
    tracker.set_tags({"learned": _gate_tag(gate.learned)})
    session.delay = _delay_curve(cfg, session, bench, tracker)
    return session


def _after_meta(cfg: RunConfig, session: Session, bench, tracker) -> Session:
    """The meta-trained weights in a session whose model is built with ``after_meta.model`` (the same
    session when there is none). The RNG is left as meta-training left it, so a run whose override
    changes nothing computes what the run without it computes (tested)."""
    if not cfg.after_meta.model:
        return session
    state = rng_state()
    try:
        new = _new_session(cfg, bench, tracker, cfg.stream_model())
    finally:
        set_rng_state(state)
    new.model.load_state_dict(session.model.state_dict())
    new.meta_history = session.meta_history
    tracker.set_tags({"after_meta.model": json.dumps(cfg.after_meta.model, sort_keys=True, default=str)})
    return new


def _stream_delays(cfg: RunConfig, bench) -> Dict[str, int]:
    """The delays (tokens per lane) the stream tests: ``learning``, one experience's tokens (the most a
    fact waits for its test in the experience that teaches it), and ``longest``, all experiences'."""
    lanes = cfg.strategy.train_mb_size
    per_exp = [math.ceil(len(exp.dataset) / lanes) * bench.info.seq_len for exp in bench.train_stream]
    return {"learning": max(per_exp), "longest": sum(per_exp), "episode": bench.info.seq_len}


def _delay_curve(cfg: RunConfig, session: Session, bench, tracker) -> Dict[str, Any]:
    """The delay-recall curve (``strategies.delay``) from a fresh state, before the stream; printed,
    logged (metrics ``delay/score`` stepped by delay, a table, a plot) and, with ``gate.delay``, a gate."""
    probe = getattr(bench, "delay_probe", None)
    if probe is None or cfg.gate.delay_episodes == 0:
        return {}
    delays = _stream_delays(cfg, bench)
    # a long stream's longest delay would need probes as long as the stream: gate.delay_max_tokens caps it
    fillers = filler_ladder(min(delays["longest"], cfg.gate.delay_max_tokens or delays["longest"]), delays["episode"])
    with _autocast(cfg):
        curve = measure_delay_curve(session.model, probe, fillers, delays["episode"], bench.info.metric,
                                    cfg.gate.delay_episodes, cfg.gate.batch_size, device=cfg.resolved_device(),
                                    context=bench.info.metric_context)
    required = cfg.resolved_delay_gate()
    d_gate = delay_gate(curve, delays["learning"], cfg.gate.min_skill).as_dict()
    span = curve.span(cfg.gate.span_level)
    out = {"curve": curve.as_dict(), "gate": d_gate, "required": required, "span": span, **delays}
    tracker.log_metric_values([("delay/score", p.score, p.delay) for p in curve.points]
                              + [("delay/skill", p.skill, p.delay) for p in curve.points if math.isfinite(p.skill)])
    tracker.log_metrics({"delay_gate/skill": d_gate["skill"], "delay_gate/delay": float(delays["learning"]),
                         **({"delay/span": float(span)} if span is not None else {})}, step=0)
    tracker.set_tags({"recalls_at_learning_delay": _gate_tag(d_gate["learned"]),
                      "delay_gate_required": str(required).lower()})
    tracker.log_dict(out, "delay_curve.json")
    tracker.log_text(curve.table(), "delay_curve.txt")
    fig = plot_delay_curve(curve, cfg.label(), {"learning delay": delays["learning"], "longest": delays["longest"]})
    tracker.log_figure(fig, "delay_curve.png")
    import matplotlib.pyplot as plt

    plt.close(fig)
    if cfg.progress:
        print(f"delay-recall curve ({cfg.label()}), learning delay {delays['learning']} tokens, span "
              f"{'> ' + str(curve.points[-1].delay) if span is None else span}:\n{curve.table()}", flush=True)
    return out


def _meta_train(cfg: RunConfig, session: Session, bench, tracker, metric: str, save_meta, meta_progress):
    return meta_train(
        session.model, bench.meta_train, steps=cfg.meta_train.steps, batch_size=cfg.meta_train.batch_size,
        lr=cfg.meta_train.lr, metric=metric, seed=cfg.seed, progress=cfg.progress, log=tracker.log_metrics,
        checkpoint_every=cfg.meta_train.checkpoint_every, save=save_meta, resume=meta_progress,
        context=bench.info.metric_context, device=cfg.resolved_device(), tbptt=cfg.meta_train.tbptt)


def _resume(session: Session, ckpt: Dict[str, Any], tracker) -> None:
    """Restores weights, optimizer, carried memory, metrics, plugin states and RNG from a checkpoint."""
    session.model.load_state_dict(ckpt["model"])
    if session.optimizer is not None and ckpt["optimizer"] is not None:
        session.optimizer.load_state_dict(ckpt["optimizer"])
    if ckpt["states"] is not None:       # every lane's state: this rank's block of them (any world size)
        device = next(session.model.parameters()).device
        states = [None if s is None else s.to(device) for s in session.model.states_from_state_dicts(ckpt["states"])]
        session.strategy.states = distributed.local_lanes(states, session.strategy.train_mb_size)
    session.results.load_state_dict(ckpt["metrics"]["results"])
    session.tokens_after = list(ckpt["metrics"]["tokens_after"])
    session.meta_history = list(ckpt["metrics"].get("meta_history", []))
    session.gate = dict(ckpt["metrics"].get("gate", {}))
    session.delay = dict(ckpt["metrics"].get("delay", {}))
    session.strategy.tokens_streamed = session.tokens_after[-1] if session.tokens_after else 0
    load_plugin_states(session.strategy.plugins, ckpt["extra"].get("plugins", {}))
    set_rng_state(ckpt["rng"])
    session.next_experience = ckpt["next_experience"]
    tracker.set_tags({"resumed_at_experience": session.next_experience})


def _save(path: str, session: Session, tracker, extra: Optional[Dict[str, Any]] = None) -> None:
    """Every rank calls it (the lanes' states are gathered); rank 0 writes."""
    states = distributed.gather_lanes(session.strategy.states)
    if not distributed.is_main():
        return
    save_checkpoint(
        path, model=session.model, optimizer=session.optimizer, states=states,
        next_experience=session.next_experience,
        metrics={"results": session.results.state_dict(), "tokens_after": session.tokens_after,
                 "meta_history": session.meta_history, "gate": session.gate, "delay": session.delay},
        extra={"run_id": tracker.run_id, "tracking_uri": tracker.tracking_uri,
               "plugins": plugin_states(session.strategy.plugins), **(extra or {})},
    )


def _meta_saver(cfg: RunConfig, path: str, session: Session, tracker):
    """What meta-training calls every ``checkpoint_every`` steps: a checkpoint with its progress."""
    def save(progress: Dict[str, Any]) -> None:
        _save(path, session, tracker, extra={"meta": progress})      # no lanes carried: no collective
    return save


def _usable_checkpoint(ckpt: Optional[Dict[str, Any]], cfg: RunConfig, announce) -> Optional[Dict[str, Any]]:
    """The checkpoint if it belongs to a run of the tracking store this run logs to (and that run still
    exists); otherwise None, with a message: the run starts over in this store."""
    if ckpt is None or not cfg.tracking.enabled:
        return ckpt
    from experiments.tracking import default_tracking_uri

    uri, old_uri, run_id = default_tracking_uri(cfg.tracking.tracking_uri), ckpt["extra"].get("tracking_uri"), \
        ckpt["extra"].get("run_id")
    if run_id is None or old_uri != uri or not _run_exists(uri, run_id):
        announce(f"ovq-cl: the checkpoint of this config belongs to MLflow run {run_id} in {old_uri}, which is "
                 f"not in {uri}: starting over (pass checkpoint.resume=false to skip this check)")
        return None
    return ckpt


def _close_orphans(cfg: RunConfig, tracker, announce) -> None:
    """Runs of this identity left RUNNING by a process of this host that no longer exists (killed
    outright before its first checkpoint) are marked KILLED, so that no run stays RUNNING forever."""
    if tracker.run_id is None:
        return
    import socket

    client, me = tracker.client, tracker.run_id
    query = f"tags.config_id = '{cfg.identity()}' and attributes.status = 'RUNNING'"
    for old in client.search_runs([tracker.experiment_id], filter_string=query):
        tags = old.data.tags
        if old.info.run_id == me or tags.get("host") != socket.gethostname() or _pid_alive(tags.get("pid")):
            continue
        client.set_tag(old.info.run_id, "error", f"orphaned: process {tags.get('pid')} ended without finishing "
                                                 f"or a checkpoint; superseded by run {me}")
        client.set_terminated(old.info.run_id, status="KILLED")
        announce(f"ovq-cl: marked orphaned run {old.info.run_id} KILLED")


def _pid_alive(pid: Optional[str]) -> bool:
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _run_exists(uri: str, run_id: str) -> bool:
    from mlflow.exceptions import MlflowException

    from experiments.tracking.runs import tracking_client

    try:
        tracking_client(uri).get_run(run_id)
    except MlflowException:
        return False
    return True


def _slug(version: str) -> str:
    return version.replace("+", "-").replace(".", "")


def _autocast(cfg: RunConfig):
    """torch.autocast for ``precision`` bf16 / fp16 on the run's device; nothing for fp32."""
    import contextlib

    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    return torch.autocast(device_type=cfg.resolved_device().split(":")[0], dtype=dtype)


def _progress(iterable, cfg: RunConfig, what: str):
    from tqdm import tqdm

    return tqdm(iterable, desc=what, disable=not cfg.progress, leave=False)


def _experience_metrics(session: Session, j: int, metric: str) -> Dict[str, float]:
    """What is logged after experience j (step j): row j of R and its errors, the summaries so far,
    the same against the facts in force, the learning score, tokens, state bytes and statistics."""
    results, higher = session.results, higher_is_better(metric)
    row = {f"R/eval_{i}": v for i, v in enumerate(results.R[j]) if v is not None}
    row.update({f"R_se/eval_{i}": v for i, v in enumerate(results.R_se[j]) if v is not None and not math.isnan(v)})
    row.update(_prefixed(forgetting.summary(results.R[: j + 1], higher), "stream"))
    if results.labels_in_force is not None:
        row.update({f"R_current/eval_{i}": v for i, v in enumerate(results.R_current[j]) if v is not None})
        row.update(_prefixed(forgetting.summary(results.R_current[: j + 1], higher), "stream_current"))
        row.update(_prefixed(results.changed_fractions(j), "current"))
    row["stream/learning_score"] = results.R[j][j]
    row["stream/tokens_per_lane"] = session.strategy.tokens_streamed
    row.update(state_metrics(session.model, distributed.gather_lanes(session.strategy.states)))   # every lane
    return row


def _finish(cfg: RunConfig, session: Session, bench, tracker, ckpt_path: str, wall_seconds: float,
            version: Optional[str] = None) -> RunResult:
    """The summaries, the stream gate, the result's artifacts (CSV, JSON, plot)."""
    metric, results = bench.info.metric, session.results
    higher = higher_is_better(metric)
    summary = forgetting.summary(results.R, higher)
    current, summary_current = None, {}
    if results.labels_in_force is not None:
        current = {m: getattr(results, m) for m in ("R_current", "R_current_se", "updated", "stale", "changed")}
        summary_current = forgetting.summary(results.R_current, higher)
        last = results.changed_fractions(len(results.R) - 1)
        summary_current.update({k: v for k, v in last.items() if k != "changed_answers"})
    _, test_labels = _test_items(bench)
    s_gate = stream_gate(summary["learning_average"], test_labels, metric, cfg.gate.min_stream_skill,
                         bench.info.metric_context).as_dict()
    learned = combined_gate(session.gate.get("learned"), _delay_flag(session.delay), s_gate["learned"])
    tracker.set_tags({"learned_on_stream": _gate_tag(s_gate["learned"]), "learned_overall": _gate_tag(learned)})
    final = _prefixed(summary, "final")
    final.update(_prefixed(summary_current, "final_current"))
    final.update({f"stream_gate/{k}": float(v) for k, v in s_gate.items() if v is not None and k != "learned"})
    tracker.log_metrics(final, step=len(results.R) - 1)
    tracker.log_text(matrix_csv(results.R), "result_matrix.csv")
    states = distributed.gather_lanes(session.strategy.states)          # every rank's lanes
    per_lane = state_metrics(session.model, states)
    result = RunResult(
        cfg, metric, results.R, summary, session.tokens_after,
        [0 if s is None else int(s.nbytes) for s in (states or [])],
        tracker.run_id, ckpt_path if cfg.checkpoint.enabled else None, session.meta_history,
        R_se=results.R_se, R_n=results.R_n, current=current, summary_current=summary_current, gate=session.gate,
        stream_gate=s_gate, delay=session.delay, parameters=n_parameters(session.model),
        state_bytes_per_lane=[per_lane[k] for k in sorted(per_lane) if k.startswith("state_bytes/")],
        wall_seconds=wall_seconds, artifact_uri=None if tracker.run_id is None else tracker.artifact_uri,
        code_version=version,
    )
    record = result.record()
    record["forgetting_curve"] = forgetting.forgetting_curve(results.R, session.tokens_after)
    record["definitions"] = forgetting.DEFINITIONS
    tracker.log_dict(record, "results.json")
    fig = forgetting_plot(results.R, session.tokens_after, metric,
                          cfg.label() + ("" if learned is not False else "  [NOT LEARNED]"))
    tracker.log_figure(fig, "forgetting_curve.png")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return result


# ------------------------------------------------------------------------------------ helpers


def _prefixed(values: Dict[str, float], prefix: str) -> Dict[str, float]:
    """``{prefix}/{name}`` for the numbers that are defined (NaN dropped)."""
    return {f"{prefix}/{k}": v for k, v in values.items() if v is not None and not math.isnan(v)}


def _gate_tag(flag: Optional[bool]) -> str:
    return "unmeasured" if flag is None else str(bool(flag)).lower()


def _test_items(bench):
    """Every test item of the stream, stacked: (x [N, T...], y [N, T...])."""
    xs, ys = zip(*(stack_items(exp.dataset) for exp in bench.test_stream))
    return torch.cat(xs), torch.cat(ys)


def _tracker(cfg: RunConfig, parent_run_id: Optional[str], run_id: Optional[str], version: str = ""):
    if not cfg.tracking.enabled:
        return None
    from experiments.tracking import RunTracker

    tags = {"stream": cfg.stream.name, "layers": "+".join(cfg.model.layers), "strategy": cfg.strategy.name,
            "memory": cfg.memory.policy, "seed": cfg.seed, "data_seed": cfg.data_seed,
            "config_id": cfg.identity(), "code_version": version, "pid": os.getpid()}
    return RunTracker(cfg.tracking.experiment, cfg.tracking.run_name or cfg.label(), cfg.tracking.tracking_uri,
                      parent_run_id=parent_run_id, tags=tags, run_id=run_id)


class _NullTracker:
    run_id = None
    tracking_uri = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        return lambda *a, **k: None


def _loggers(tracker) -> list:
    if isinstance(tracker, _NullTracker):
        return []
    from experiments.tracking import MLflowLogger

    # Avalanche steps its metrics by training iteration, ours by experience: its names say which axis
    return [MLflowLogger(tracker, prefix="by_iteration/")]
