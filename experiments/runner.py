"""One run of the experiment, as the protocol of ``docs/design.md`` (its fifth section) reads:

    cfg = run_config("experiments/configs/icr_frozen.yaml", ["model.layers=[ovq]", "seed=1"])
    result = run(cfg)          # RunResult: the matrix R, the summaries, the gates, the MLflow run id, ...

:func:`run` is the phases in order, each a function of this module that takes what the previous one
returned:

0. :func:`resolve` the config once (validated copy, data seed, the stream's vocabulary, device, code
   version, checkpoint path): a :class:`ResolvedRun` no phase changes; the caller's config is left as
   it was. Everything a user can get wrong is refused here, before a store or a folder is touched.
   :func:`open_run`: rank 0 decides from the last checkpoint of the same identity whether this is a new
   run, a resumed one (in meta-training or in the stream) or a finished one to reuse (an
   :class:`Opening`, followed by every rank).
1. :func:`meta_phase`: meta-training (fresh, resumed from its checkpoint, or loaded from a shared one:
   a :class:`MetaOutcome`), then :func:`after_meta` (the stream's model with the meta-trained weights).
2. :func:`gate_phase`: the learned gate and the probes before the stream (:class:`Gates`; after the
   stream, :func:`finish` runs those after it: :mod:`experiments.probes`).
3. :func:`stream_phase`: for every experience j, train (or, with ``frozen``, only stream) through the
   model with the memory policy, evaluate every experience i from a copy of the carried state (R[j][i]),
   log, checkpoint. ``stop_after=j`` stops there (a :class:`RunStopped` is returned; the run resumes).
4. :func:`finish`: both forgetting definitions, the stream gate and (streams whose facts change) the
   same scored against the facts in force: the :class:`RunResult`.

``seed`` seeds the data too unless ``stream.options.seed`` is set
(``experiments.config.with_data_seed``). Under torchrun (``strategies.training.distributed``) every
rank runs this same function on its block of the lanes; rank 0 alone decides (:func:`open_run`, the
shared meta-training, both through ``distributed.decided_by_rank0``), tracks, writes checkpoints
(every lane's state) and prints; every rank returns the same R (only rank 0's result names the MLflow
run).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import torch

import ovq_cl.base.avalanche_compat  # noqa: F401  (before avalanche)
from avalanche.training.plugins import EvaluationPlugin

from experiments import meta_cache
from experiments.artifacts import forgetting_plot, matrix_csv
from experiments.code_version import code_version, plugin_source_hash
from experiments.config import RunConfig, freeze, with_data_seed
from experiments.probes import PROBES, Probe, ProbeContext, probes_in_order, unknown_probes
from experiments.probes.base import gate_tag
from experiments.records import migrate
from experiments.run_lock import meta_training_lock, run_lock
from experiments.run_result import RunResult, combined_gate, delay_flag
from experiments.threads import install_loop_threads
from experiments.tracking.params import default_tracking_uri, store_key
from experiments.tracking.lifecycle import (avalanche_loggers, close_orphans, run_exists, run_tracker,
                                           unfinished_elsewhere)
from ovq_cl import DecoderLM, RegressionLM
from ovq_cl.config import ModelConfig, model_config
from strategies.evaluation import forgetting
from strategies.evaluation.gate import experience_chances, measure_gate, stream_gate_from_chances
from strategies.evaluation.metrics import higher_is_better
from strategies.evaluation.results import (ResultMatrix, n_learned_buffers, n_parameters, shared_memory_bytes,
                                           state_metrics)
from strategies.plugins import load_plugin_states, plugin_states, unsaved_plugins
from strategies.registry import build_strategy
from strategies.training import distributed
from strategies.training.checkpoint import load_latest, rng_state, save_checkpoint, set_rng_state
from strategies.training.meta import MetaTraining, logged_metrics
from streams import stream_benchmark
from streams.common import held_out, stack_items


@dataclass(frozen=True)
class RunStopped:
    """What ``run(..., stop_after=j)`` returns when it stopped after experience j, before the end: the run
    is marked KILLED in MLflow (tag ``stopped_after_experience``) and resumes from its checkpoint when
    started again."""

    config: RunConfig
    after_experience: int
    run_id: Optional[str]
    checkpoint: Optional[str]


STALE_TAGS = ("error", "stopped_after_experience")
"""Tags of an attempt that a finished run no longer carries (the error of a killed attempt, ...)."""


def _silent(message: str) -> None:
    pass


# ------------------------------------------------------------------------------------ the phases' types


@dataclass(frozen=True)
class ResolvedRun:
    """A run config resolved once, before anything is computed or written: what every phase reads.

    ``config`` is a validated copy of the caller's (defaults filled in, the data seed, the stream's
    vocabulary, ``progress`` off on ranks other than 0) that no phase can change (frozen,
    :func:`experiments.config.freeze`); ``stream_model`` the
    model config after meta-training (``config.model`` with ``after_meta.model`` merged in).
    """

    config: RunConfig
    stream_model: ModelConfig
    bench: Any                   # the stream's Avalanche benchmark (train_stream, test_stream, info, meta_train, ...)
    device: str
    code_version: str
    checkpoint_path: str         # {checkpoint.dir}/{label}-{identity}-{code version}-{store}/last.pt
    store: str                   # the tracking store's key (experiments.tracking.params.store_key)
    world_size: int              # 1 outside torchrun
    main: bool                   # rank 0 or the one process: it decides, tracks, writes and prints

    @property
    def info(self):
        return self.bench.info

    @property
    def checkpoints(self) -> bool:
        return self.config.checkpoint.enabled

    def autocast(self):
        """torch.autocast for ``precision`` bf16 / fp16 on the run's device; nothing for fp32."""
        if self.config.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.config.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.device.split(":")[0], dtype=dtype)


@dataclass(frozen=True)
class Opening:
    """Rank 0's decision about a resolved run, followed by every rank: the checkpoint it continues from
    (None: a new run). A checkpoint with a ``result`` is a finished run to reuse; one with ``meta`` was
    written during meta-training; any other is in the stream."""

    checkpoint: Optional[Dict[str, Any]] = None

    @property
    def finished(self) -> Optional[Dict[str, Any]]:
        """The record of the finished run to reuse, or None."""
        return None if self.checkpoint is None else self.checkpoint["extra"].get("result")

    @property
    def in_stream(self) -> bool:
        return self.checkpoint is not None and "meta" not in self.checkpoint["extra"]

    @property
    def meta_progress(self) -> Optional[Dict[str, Any]]:
        """Meta-training's progress when the run resumes inside it, else None."""
        return None if self.checkpoint is None else self.checkpoint["extra"].get("meta")


@dataclass(frozen=True)
class MetaOutcome:
    """Meta-training's result: its logged history and where the weights came from (``trained``,
    ``resumed`` from this run's checkpoint, ``shared``: loaded from another run's identical
    meta-training, whose file the run's tag ``meta_train_shared`` names)."""

    history: List[Dict[str, float]]
    source: str


@dataclass(frozen=True)
class Gates:
    """The learned gate and the probes measured before the stream (their record forms:
    :class:`strategies.evaluation.gate.GateResult` as a dict; ``{name: record}``, :mod:`experiments.probes`)."""

    gate: Dict[str, Any]
    probes: Dict[str, Dict[str, Any]] = field(default_factory=dict)


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
    meta_source: Optional[str] = None      # MetaOutcome.source: trained, resumed or shared (None: not recorded)
    gate: Dict[str, Any] = field(default_factory=dict)
    probes: Dict[str, Dict[str, Any]] = field(default_factory=dict)   # the probes' records so far, by name
    # the run's wall time across attempts: this attempt began at ``started`` (time.perf_counter); earlier
    # attempts had spent ``wall_before`` seconds up to the checkpoint this one resumed from (their work
    # after it, lost with them, is not counted); ``attempts``: this one and each earlier one that left the
    # checkpoint the next resumed from (None: resumed from a checkpoint that kept no time, so
    # ``wall_before`` is unknown and left at 0)
    started: float = field(default_factory=time.perf_counter)
    wall_before: float = 0.0
    attempts: Optional[int] = 1

    def wall_seconds(self) -> float:
        """Seconds the run has taken so far, every attempt's up to its last checkpoint and this one's."""
        return self.wall_before + time.perf_counter() - self.started


# ------------------------------------------------------------------------------------ the protocol


def run(cfg: RunConfig, parent_run_id: Optional[str] = None, stop_after: Optional[int] = None,
        rerun: bool = False, announce: Callable[[str], None] = print) -> Union[RunResult, RunStopped]:
    """Runs, resumes or reuses one configuration; ``cfg`` is left as it is.

    A run's identity is its resolved config (seeds included; tracking, paths and progress excluded)
    and the code version (:func:`experiments.code_version.code_version`). A finished run of the same
    identity, in the same tracking store, is reused (``rerun=True`` runs again); an unfinished one is
    resumed from its last checkpoint; anything else starts a new run. ``stop_after=j`` stops after
    experience j and returns a :class:`RunStopped` (tests, debugging). ``announce`` receives what the
    run does (reuse, resume, where).
    """
    started = time.perf_counter()
    install_loop_threads()          # the OVQ loop's thread policy is the run's, not the op's
    resolved = resolve(cfg)
    if not resolved.main:                                   # one voice: rank 0's
        announce = _silent
    with _lock(resolved):                                   # one process per run (rank 0 holds it)
        return _run(resolved, parent_run_id, stop_after, rerun, announce, started)


def _lock(run: ResolvedRun):
    """The run's lock (:mod:`experiments.run_lock`) where it has a checkpoint folder, on rank 0."""
    if not (run.checkpoints and run.main):
        return contextlib.nullcontext()
    return run_lock(os.path.dirname(run.checkpoint_path), run.config.label())


def _run(resolved: ResolvedRun, parent_run_id, stop_after, rerun, announce, started) -> Union[RunResult, RunStopped]:
    """:func:`run` once the config is resolved and the run is this process's."""
    opening = open_run(resolved, rerun, announce)
    if opening.finished is not None:
        announce(f"ovq-cl: reusing finished run {opening.checkpoint['extra'].get('run_id')} "
                 f"({os.path.dirname(resolved.checkpoint_path)}); pass --rerun to run again")
        return RunResult.from_record(resolved.config, opening.finished, resolved.checkpoint_path)
    with _tracker(resolved, parent_run_id, opening) as tracker:
        session = new_session(resolved, tracker, resolved.stream_model if opening.in_stream else resolved.config.model)
        session.started = started
        if opening.checkpoint is None:
            _announce_new(resolved, tracker, announce)
        else:                                 # a resume: the earlier attempts' time, where the checkpoint kept it
            kept = opening.checkpoint["extra"]
            known = "wall_seconds" in kept and kept.get("attempts") is not None
            session.wall_before = float(kept.get("wall_seconds", 0.0))
            session.attempts = int(kept["attempts"]) + 1 if known else None
        tracker.set_tags({"world_size": resolved.world_size})     # of this attempt (a resume may differ)
        if opening.in_stream:
            restore(session, opening.checkpoint, tracker)
            announce(f"ovq-cl: resuming run {tracker.run_id} at experience {session.next_experience} "
                     f"({os.path.dirname(resolved.checkpoint_path)})")
            unsaved = unsaved_plugins(opening.checkpoint["extra"].get("plugins", {}))
            if unsaved:                       # said, and tagged: this run is not the uninterrupted one
                tracker.set_tags({"plugin_state_restarted": ", ".join(sorted(unsaved))})
                announce("ovq-cl: warning: the checkpoint could not save the state of plugin(s) "
                         + "; ".join(f"{k} ({why})" for k, why in sorted(unsaved.items()))
                         + ": they restart empty, so this resumed run differs from an uninterrupted one")
        else:
            meta = meta_phase(resolved, session, tracker, opening, announce)
            session.meta_history, session.meta_source = meta.history, meta.source
            tracker.set_tags({"meta_train_source": meta.source})        # trained, resumed or shared
            session = after_meta(resolved, session, tracker)
            gates = gate_phase(resolved, session, tracker)
            session.gate, session.probes = gates.gate, gates.probes
        stopped = stream_phase(resolved, session, tracker, stop_after)
        if stopped is not None:
            tracker.set_tags({"stopped_after_experience": stopped})
            tracker.end("KILLED")
            return RunStopped(resolved.config, stopped, tracker.run_id,
                              resolved.checkpoint_path if resolved.checkpoints else None)
        tracker.delete_tags(STALE_TAGS)                # what a killed or stopped attempt left
        result = finish(resolved, session, tracker, session.wall_seconds())
        if resolved.checkpoints:                      # a finished run is reused by an identical one
            save(resolved, session, tracker, extra={"result": result.record()})
        return result


# ------------------------------------------------------------------------------------ 0. resolve and open


def resolve(cfg: RunConfig) -> ResolvedRun:
    """Validates a copy of ``cfg`` and everything the run will need, before any compute or write: the
    places it writes, the device and the torchrun group (joined here), batch sizes against the ranks,
    the stream (built here, after seeding every generator with ``seed``), its lanes, the options
    ``after_meta.model`` may change. One line per mistake (ValueError)."""
    cfg = with_data_seed(cfg.checked())          # checked again only if changed since run_config checked it
    cfg.check_locations()
    device = cfg.resolved_device()
    dp = distributed.start(device)                    # None unless started by torchrun
    distributed.check_device(device)
    distributed.check_divisible(**{"strategy.train_mb_size": cfg.strategy.train_mb_size,
                                   "meta_train.batch_size": cfg.meta_train.batch_size})
    main = distributed.is_main()
    if not main:
        cfg.progress = False
    seed_everything(cfg.seed)
    bench = stream_benchmark(cfg.stream.name, cfg.stream.options)
    check_lanes(cfg, bench)
    check_meta_batch(cfg, bench)
    check_probes(cfg, bench)
    check_retention(cfg, bench)
    if bench.info.vocab_size is not None:
        cfg.model.vocab_size = bench.info.vocab_size          # the logged config is the one that runs
    with _rng_kept():                     # after seeding: what the run draws must not depend on after_meta
        stream_model = cfg.stream_model()
    check_models_build(cfg, stream_model, bench.info)
    if dp is not None:
        check_data_parallel_models(cfg, stream_model, bench.info)
    plugins = plugin_source_hash(cfg.plugins)          # a user's code changes results as ours does
    version = code_version() + (f"+plugins.{plugins}" if plugins else "")
    store = store_key(default_tracking_uri(cfg.tracking.tracking_uri) if cfg.tracking.enabled else None)
    path = os.path.join(cfg.checkpoint.dir, f"{cfg.label()}-{cfg.identity()}-{_slug(version)}-{store}", "last.pt")
    return ResolvedRun(freeze(cfg), stream_model, bench, device, version, path, store, 1 if dp is None else dp.world_size, main)


def open_run(run: ResolvedRun, rerun: bool, announce: Callable[[str], None]) -> Opening:
    """Rank 0 reads the last checkpoint of this identity (unless ``rerun``, or checkpoints or resuming
    are off) and keeps it if its run belongs to the tracking store this run logs to; every rank follows."""
    cfg, path = run.config, run.checkpoint_path
    if rerun or not (cfg.checkpoint.enabled and cfg.checkpoint.resume):
        return Opening()
    ckpt = distributed.decided_by_rank0(lambda: _usable_checkpoint(load_latest(path, warn=announce), cfg, announce),
                                        lambda: load_latest(path), f"the checkpoint {path}")
    if ckpt is None and run.main:
        _say_if_the_code_changed(run, announce)
    return Opening(ckpt)


def _say_if_the_code_changed(run: ResolvedRun, announce: Callable[[str], None]) -> None:
    """One line when this config has checkpoints in this store made by other code: it runs again."""
    import glob

    folder = os.path.dirname(run.checkpoint_path)
    prefix, suffix = f"{run.config.label()}-{run.config.identity()}-", f"-{run.store}"
    others = sorted((p for p in glob.glob(os.path.join(os.path.dirname(folder), glob.escape(prefix) + "*" + suffix))
                     if p != folder and os.path.exists(os.path.join(p, "last.pt"))), key=os.path.getmtime)
    if others:
        old = os.path.basename(others[-1])[len(prefix):-len(suffix)]
        announce(f"ovq-cl: the code changed since this config last ran here ({old} -> {_slug(run.code_version)}): "
                 "running it again")


def check_lanes(cfg: RunConfig, bench) -> None:
    """Every training experience must fill the ``strategy.train_mb_size`` lanes at least once: said here,
    before meta-training, not by the strategy after it (one line, nothing computed)."""
    lanes = cfg.strategy.train_mb_size
    for j, exp in enumerate(bench.train_stream):
        if len(exp.dataset) < lanes:
            raise ValueError(f"stream: experience {j} has {len(exp.dataset)} training episodes, fewer than "
                             f"strategy.train_mb_size={lanes} lanes (raise stream.options.train_episodes or lower "
                             "strategy.train_mb_size)")


def check_meta_batch(cfg: RunConfig, bench) -> None:
    """Meta-training draws whole batches (``drop_last``): a set smaller than ``meta_train.batch_size``
    yields none, and the loop would wait for a batch forever. Said here, before anything runs (one line)."""
    meta = getattr(bench, "meta_train", None)
    # an empty set is left to MetaTraining's own line ("the stream has no meta-training set")
    if cfg.meta_train.steps > 0 and meta is not None and 0 < len(meta) < cfg.meta_train.batch_size:
        raise ValueError(f"meta_train.batch_size: {cfg.meta_train.batch_size} is more than the {len(meta)} items of "
                         "the meta-training set, so no batch can be drawn (lower meta_train.batch_size or raise "
                         "stream.options.meta_train_episodes)")


def check_models_build(cfg: RunConfig, stream_model: ModelConfig, info) -> None:
    """The meta-training model and the stream's build, shapes only (each once): every check a mixer makes
    on its options (``d_model`` against ``n_heads``, a user mixer's own) refuses here, before a run or a
    folder exists (one line, prefixed by the model it concerns). ``after_meta.model`` may change how the
    memory evolves, not the weights: the stream's model must have every parameter of the meta-trained
    one, same names, same shapes."""
    shapes = {}
    for what, model in (("model", cfg.model), ("after_meta.model", stream_model)):
        try:
            with _shapes_only():
                shapes[what] = {k: tuple(v.shape) for k, v in build_model(model, info).state_dict().items()}
        except (ValueError, TypeError) as err:
            raise ValueError(f"{what}: {err}") from err
        if stream_model == cfg.model:
            return
    before, after = shapes["model"], shapes["after_meta.model"]
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            raise ValueError(f"run config: after_meta.model changes the weights ({key}: {before.get(key)} after "
                             f"meta-training, {after.get(key)} in the stream); only options that keep every "
                             "parameter can change after meta-training")


def check_data_parallel_models(cfg: RunConfig, stream_model: ModelConfig, info) -> None:
    """Under torchrun: neither the meta-training nor the stream's model may have an option that shards
    wrongly (``distributed.check_mixer_options``); one line, before any compute."""
    with _shapes_only():
        for model in (cfg.model, stream_model):
            distributed.check_mixer_options(build_model(model, info))


@contextlib.contextmanager
def _rng_kept():
    """The global RNG as it was on entry, whatever runs inside: building a model draws its initial
    weights, and so does sizing a mixer to ``model.state_budget`` (it builds one to count its state)."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


@contextlib.contextmanager
def _shapes_only():
    """Models built inside have shapes only (no memory, no initialisation work); the RNG is kept."""
    with _rng_kept(), torch.device("meta"):
        yield


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(model: ModelConfig, info) -> torch.nn.Module:
    """A DecoderLM for token streams (vocabulary from the stream), a RegressionLM for continuous ICL."""
    user = dict(model.__dict__)
    if info.vocab_size is not None:
        user["vocab_size"] = info.vocab_size
        return DecoderLM(model_config(user))
    return RegressionLM(model_config(user), d_in=info.d_in, d_out=info.d_out)


def new_session(run: ResolvedRun, tracker, model_cfg: ModelConfig) -> Session:
    """A fresh model (``model_cfg``) on the run's device, its result matrix and its strategy."""
    cfg, info = run.config, run.info
    model = build_model(model_cfg, info)
    results = ResultMatrix(info.metric, info.n_experiences,
                           labels_in_force=info.labels_in_force if info.facts_change else None,
                           context=info.metric_context)
    evaluator = EvaluationPlugin(results, loggers=avalanche_loggers(
        tracker, cfg.tracking.loggers, os.path.join(cfg.output_dir, "loggers", f"{cfg.label()}-{cfg.identity()}")))
    s = cfg.strategy
    model.to(run.device)
    distributed.check_mixer_options(model)
    distributed.prepare_model(model)       # under torchrun: rank 0's weights, VQ's EMA over the group
    extra = []
    if cfg.progress:
        from strategies.progress import ProgressPlugin

        extra.append(ProgressPlugin())
    strategy, optimizer = build_strategy(
        s.name, s.options, model=model, memory_policy=cfg.memory.policy, lr=s.lr, train_mb_size=s.train_mb_size,
        epochs=s.epochs, grad_clip=s.grad_clip, evaluator=evaluator, seed=cfg.seed, extra_plugins=extra,
        device=run.device)
    return Session(model, strategy, optimizer, results)


def _announce_new(run: ResolvedRun, tracker, announce: Callable[[str], None]) -> None:
    """A new run: its config logged, orphans of its identity closed, where it is said."""
    cfg = run.config
    tracker.log_config(cfg)
    close_orphans(tracker, cfg.identity(), announce)
    here = os.path.abspath(cfg.checkpoint.dir)
    for run_id, folder in unfinished_elsewhere(tracker, cfg.identity(), run.code_version, here):
        announce(f"ovq-cl: unfinished run {run_id} of this config keeps its checkpoint under {folder}; this run "
                 f"starts over under {here} (set checkpoint.dir={folder} to resume that one instead)")
    announce(f"ovq-cl: run {cfg.label()}: MLflow run {tracker.run_id} in {tracker.tracking_uri}; "
             f"checkpoints in {os.path.dirname(run.checkpoint_path) if run.checkpoints else '(none)'}")


# ------------------------------------------------------------------------------------ 1. meta-training


def meta_phase(run: ResolvedRun, session: Session, tracker, opening: Opening,
               announce: Callable[[str], None] = _silent) -> MetaOutcome:
    """Meta-training (fresh state per episode), into ``session.model``: resumed from this run's checkpoint
    when it stopped inside it, else loaded from a shared identical meta-training (``checkpoint.share_meta``),
    else trained, checkpointed every ``meta_train.checkpoint_every`` steps and shared."""
    cfg, metric = run.config, run.info.metric
    progress = opening.meta_progress
    if opening.checkpoint is None:
        tracker.set_tags({"metric": metric, **{f"metric_definition.{k}": v for k, v in forgetting.DEFINITIONS.items()}})
        tracker.log_dict({"metric": metric, "higher_is_better": higher_is_better(metric),
                          "definitions": forgetting.DEFINITIONS}, "metric_definitions.json")
    else:
        session.model.load_state_dict(opening.checkpoint["model"])
        set_rng_state(opening.checkpoint["rng"])
        tracker.set_tags({"resumed_at_meta_step": progress["step"]})
        announce(f"ovq-cl: resuming run {tracker.run_id} in meta-training at step {progress['step']} of "
                 f"{cfg.meta_train.steps} ({os.path.dirname(run.checkpoint_path)})")
    shared = None
    if cfg.checkpoint.enabled and cfg.checkpoint.share_meta:
        source = getattr(run.bench, "meta_train_episodes", run.bench.meta_train)
        shared = meta_cache.meta_path(cfg, meta_cache.meta_key(cfg, source, world_size=run.world_size))
    # One process per shared entry decides and trains: a run started beside another with the same key
    # waits for it and then loads what it stored, instead of meta-training the same weights beside it.
    with meta_training_lock(shared, announce) if shared and run.main else contextlib.nullcontext():
        stored = None
        if shared and progress is None:
            stored = distributed.decided_by_rank0(lambda: meta_cache.load_meta(shared),
                                                  lambda: meta_cache.load_meta(shared),
                                                  f"the shared meta-training {shared}")
        if stored is not None:             # the same meta-training already ran: its weights, history, RNG
            session.model.load_state_dict(stored["model"])
            set_rng_state(stored["rng"])
            tracker.set_tags({"meta_train_shared": shared})
            announce(f"ovq-cl: reusing the meta-training of an identical config, code and data ({shared}); "
                     "checkpoint.share_meta=false trains it again")
            outcome = MetaOutcome(stored["history"], "shared")
        else:
            with run.autocast():
                history = _meta_train(run, session, tracker, progress)
            if shared and run.main:
                meta_cache.save_meta(shared, session.model, history)
            outcome = MetaOutcome(history, "trained" if progress is None else "resumed")
    if outcome.history:
        tracker.log_metrics({"meta_train/final_loss": outcome.history[-1]["loss"]}, step=0)
    return outcome


def _meta_train(run: ResolvedRun, session: Session, tracker, progress: Optional[Dict[str, Any]]):
    """The meta-training loop, its rows logged and its progress checkpointed as they come."""
    cfg, info = run.config, run.info
    m = cfg.meta_train
    training = MetaTraining(session.model, run.bench.meta_train, steps=m.steps, batch_size=m.batch_size, lr=m.lr,
                            metric=info.metric, seed=cfg.seed, progress=cfg.progress, resume=progress,
                            context=info.metric_context, device=run.device, tbptt=m.tbptt,
                            recalled=getattr(run.bench, "meta_recalled", None), retention_loss=m.retention_loss,
                            reach=getattr(run.bench, "meta_reach", None))
    for done in training:
        if done.logged is not None:
            tracker.log_metrics(logged_metrics(done.logged, info.metric), done.step)
        if run.checkpoints and m.checkpoint_every and done.step % m.checkpoint_every == 0 and done.step < m.steps:
            save(run, session, tracker, extra={"meta": training.progress()})      # no lanes carried: no collective
    return training.history


def after_meta(run: ResolvedRun, session: Session, tracker) -> Session:
    """The meta-trained weights in a session whose model is built with ``after_meta.model`` (the same
    session when there is none). The RNG is left as meta-training left it, so a run whose override
    changes nothing computes what the run without it computes (tested)."""
    cfg = run.config
    if not cfg.after_meta.model:
        return session
    state = rng_state()
    try:
        new = new_session(run, tracker, run.stream_model)
    finally:
        set_rng_state(state)
    new.model.load_state_dict(session.model.state_dict())
    new.meta_history, new.meta_source = session.meta_history, session.meta_source
    new.started, new.wall_before, new.attempts = session.started, session.wall_before, session.attempts
    tracker.set_tags({"after_meta.model": json.dumps(cfg.after_meta.model, sort_keys=True, default=str)})
    return new


# ------------------------------------------------------------------------------------ 2. the gates


def gate_phase(run: ResolvedRun, session: Session, tracker) -> Gates:
    """The learned gate on held-out meta-training episodes (each from a fresh state), then the probes
    that run before the stream (:func:`probe_phase`): all logged."""
    cfg, info = run.config, run.info
    source = getattr(run.bench, "meta_train_episodes", None)
    with run.autocast():
        gate = measure_gate(session.model, None if source is None else held_out(source, cfg.gate.episodes),
                            info.metric, cfg.gate.min_skill, cfg.gate.batch_size, device=run.device,
                            context=info.metric_context)
    record = gate.as_dict()
    tracker.log_metrics({"model/parameters": n_parameters(session.model),
                         "model/learned_buffers": n_learned_buffers(session.model),
                         **{f"model/shared_bytes/layer{i}": b for i, b in enumerate(shared_memory_bytes(session.model))},
                         **{f"gate/{k}": float(v) for k, v in record.items() if v is not None and k != "learned"}},
                        step=0)
    # three gates, three names: the held-out one here, learned_on_stream and learned_overall (what the tables
    # call learned) at the end
    tracker.set_tags({"learned_held_out": gate_tag(gate.learned)})
    return Gates(record, probe_phase(run, session, tracker, "before_stream"))


def probe_phase(run: ResolvedRun, session: Session, tracker, phase: str) -> Dict[str, Dict[str, Any]]:
    """Every registered probe of ``phase`` that the config asks for (:mod:`experiments.probes`, in
    registration order), on the session's model, each with the global RNG kept (a probe changes nothing the
    stream draws; the built-ins excepted, ``Probe.keeps_rng``): its metrics, tags and artifacts (``<artifact>.json`` its record, ``.txt`` its table,
    ``.png`` its figure) logged, its table printed with progress on. Returns ``{name: record}``."""
    import matplotlib.pyplot as plt

    cfg, out = run.config, {}
    for probe in probes_in_order(phase):
        if not probe.wanted(cfg):
            continue
        ctx = ProbeContext(cfg, run.bench, session.model, run.device, run.autocast, probe.options(cfg))
        with _rng_kept() if probe.keeps_rng else contextlib.nullcontext():
            measured = probe.measure(ctx)
        if not measured.record:
            continue
        out[probe.name] = measured.record
        tracker.log_metric_values(measured.series)
        if measured.metrics:
            tracker.log_metrics(measured.metrics, step=0)
        if measured.tags:
            tracker.set_tags(measured.tags)
        name = probe.artifact or probe.name
        tracker.log_dict(measured.record, f"{name}.json")
        tracker.log_text(measured.table, f"{name}.txt")
        if measured.figure is not None:
            tracker.log_figure(measured.figure, f"{name}.png")
            plt.close(measured.figure)
        if cfg.progress:
            print(f"{measured.heading}\n{measured.table}", flush=True)
    return out


def check_probes(cfg: RunConfig, bench) -> None:
    """The probes under ``probes:`` are registered user probes, each with a mapping of options, and every
    probe the config asks for can run on this stream (each probe's ``check``): one line, before anything
    runs."""
    unknown = unknown_probes(list(cfg.probes))
    if unknown:
        raise ValueError(f"run config: probes.{unknown[0]}: no probe {unknown[0]!r} is registered; known: "
                         f"{PROBES.names()} (a user probe registers with experiments.probes.register_probe, "
                         "imported with --plugin or plugins:)")
    for name, options in cfg.probes.items():
        if options is not None and not hasattr(options, "keys"):
            raise ValueError(f"run config: probes.{name} must be a mapping of the probe's options ({{}} for none), "
                             f"got {options!r}")
        if type(PROBES.get(name)).wanted is not Probe.wanted:       # asked for by its own keys, not here
            raise ValueError(f"run config: probes.{name}: the built-in probe {name!r} is configured under gate "
                             f"(see its module, experiments.probes.{name})")
    for probe in probes_in_order():
        if probe.wanted(cfg):
            probe.check(cfg, bench)


def check_retention(cfg: RunConfig, bench) -> None:
    """``meta_train.retention_loss`` > 0 needs the stream's recalled-answer masks: one line, before anything runs."""
    if cfg.meta_train.retention_loss > 0 and cfg.meta_train.steps > 0 and getattr(bench, "meta_recalled", None) is None:
        raise ValueError(f"meta_train.retention_loss: stream {cfg.stream.name!r} does not mark which meta-training "
                         "answers recall earlier episodes (StreamData.meta_recalled); set meta_train.retention_loss=0")


# ------------------------------------------------------------------------------------ 3. the stream


def stream_phase(run: ResolvedRun, session: Session, tracker, stop_after: Optional[int] = None) -> Optional[int]:
    """Every experience from ``session.next_experience`` on: train, evaluate every experience (row j of
    R), log, checkpoint. Returns j when it stopped after experience j because of ``stop_after`` (an
    experience before the last), None when the stream is done."""
    n = run.info.n_experiences
    for j in _progress(range(session.next_experience, n), run.config.progress, "experiences"):
        with run.autocast():
            session.strategy.train(run.bench.train_stream[j])
            session.tokens_after.append(session.strategy.tokens_streamed)
            session.strategy.eval(run.bench.test_stream)
        tracker.log_metrics(_experience_metrics(session, j, run.info.metric), step=j)
        session.next_experience = j + 1
        if run.checkpoints:
            save(run, session, tracker)
        if stop_after is not None and stop_after <= j < n - 1:
            return j
    return None


def _progress(iterable, show: bool, what: str):
    from ovq_cl.base.progress import progress

    return progress(iterable, desc=what, show=show, unit=what)


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


# ------------------------------------------------------------------------------------ 4. after the stream


def finish(run: ResolvedRun, session: Session, tracker, wall_seconds: float) -> RunResult:
    """The summaries, the stream gate, the result's artifacts (CSV, JSON, plot)."""
    cfg, info = run.config, run.info
    metric, results = info.metric, session.results
    higher = higher_is_better(metric)
    summary = forgetting.summary(results.R, higher)
    current, summary_current = None, {}
    if results.labels_in_force is not None:
        current = {m: getattr(results, m) for m in ("R_current", "R_current_se", "updated", "stale", "changed", "kept", "unchanged")}
        summary_current = forgetting.summary(results.R_current, higher)
        last = results.changed_fractions(len(results.R) - 1)
        summary_current.update({k: v for k, v in last.items() if k != "changed_answers"})
    # each experience against its own chance (strategies.evaluation.gate.stream_gate), kept in the record
    labels = [stack_items(exp.dataset)[1] for exp in run.bench.test_stream]
    chances = experience_chances(labels, metric, info.metric_context)
    s_gate = {**stream_gate_from_chances([results.R[j][j] for j in range(len(results.R))], chances, metric,
                                         cfg.gate.min_stream_skill).as_dict(), "chances": chances}
    learned = combined_gate(session.gate.get("learned"), delay_flag(session.probes.get("delay") or {}), s_gate["learned"])
    tracker.set_tags({"learned_on_stream": gate_tag(s_gate["learned"]), "learned_overall": gate_tag(learned)})
    final = _prefixed(summary, "final")
    final.update(_prefixed(summary_current, "final_current"))
    final.update({f"stream_gate/{k}": float(v) for k, v in s_gate.items() if v is not None and k not in ("learned", "chances")})
    # one by one, so a table read back from MLflow scores each R[j][j] against its own experience's chance
    final.update({f"stream_gate/chance/exp_{j}": float(c) for j, c in enumerate(chances)})
    tracker.log_metrics(final, step=len(results.R) - 1)
    tracker.log_text(matrix_csv(results.R), "result_matrix.csv")
    states = distributed.gather_lanes(session.strategy.states)          # every rank's lanes
    per_lane = state_metrics(session.model, states)
    result = RunResult(
        cfg, metric, results.R, summary, session.tokens_after,
        [0 if s is None else int(s.nbytes) for s in (states or [])],
        tracker.run_id, run.checkpoint_path if run.checkpoints else None, session.meta_history,
        R_se=results.R_se, R_n=results.R_n, current=current, summary_current=summary_current, gate=session.gate,
        stream_gate=s_gate, probes={**session.probes, **probe_phase(run, session, tracker, "after_stream")},
        parameters=n_parameters(session.model),
        state_bytes_per_lane=[per_lane[k] for k in sorted(per_lane) if k.startswith("state_bytes/")],
        wall_seconds=wall_seconds, attempts=session.attempts, meta_source=session.meta_source,
        artifact_uri=None if tracker.run_id is None else tracker.artifact_uri, code_version=run.code_version, provenance=provenance(run, tracker),
        shared_bytes_per_layer=shared_memory_bytes(session.model), learned_buffers=n_learned_buffers(session.model),
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


def provenance(run: ResolvedRun, tracker) -> Dict[str, Any]:
    """Which code ran a run, where, and with how many threads (a record says it; two records of one
    config that disagree can then be told apart: code, thread count, the CPU's instruction set, or
    nondeterminism). The environment is the one the tracker tagged the run with (read once); ``dirty``:
    whether the code that counts for results (:data:`experiments.code_version.CODE_PATHS`) differed from
    the commit, not whether any file of the checkout did (a result file being written does not make the
    code dirty)."""
    env = getattr(tracker, "environment", None)
    if env is None:                                  # tracking off: no tags were read
        from experiments.tracking.runs import environment_tags

        env = environment_tags()
    dirty = "+dirty." in run.code_version.split("+plugins.")[0]
    return {"commit": env["git.commit"], "dirty": dirty, "torch": env.get("version.torch"),
            "python": env["version.python"], "host": env["host"], "cpu": env.get("cpu"),
            "cpu_capability": env.get("cpu.capability"), "threads": torch.get_num_threads(),
            "world_size": run.world_size, "device": run.device}


# ------------------------------------------------------------------------------------ checkpoints


def save(run: ResolvedRun, session: Session, tracker, extra: Optional[Dict[str, Any]] = None) -> None:
    """The session's checkpoint at ``run.checkpoint_path``. Every rank calls it (the lanes' states are
    gathered); rank 0 writes."""
    states = distributed.gather_lanes(session.strategy.states)
    if not run.main:
        return
    save_checkpoint(
        run.checkpoint_path, model=session.model, optimizer=session.optimizer, states=states,
        next_experience=session.next_experience,
        metrics={"results": session.results.state_dict(), "tokens_after": session.tokens_after,
                 "meta_history": session.meta_history, "meta_source": session.meta_source, "gate": session.gate,
                 "probes": session.probes},
        extra={"run_id": tracker.run_id, "tracking_uri": tracker.tracking_uri,
               "plugins": plugin_states(session.strategy.plugins), "wall_seconds": session.wall_seconds(),
               "attempts": session.attempts, **(extra or {})},
    )


def restore(session: Session, ckpt: Dict[str, Any], tracker) -> None:
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
    session.meta_source = ckpt["metrics"].get("meta_source")       # None: a checkpoint of older code
    session.gate = dict(ckpt["metrics"].get("gate", {}))
    # a checkpoint of code from before probes were plugins kept the three records at the top level
    session.probes = dict(ckpt["metrics"].get("probes") or migrate(
        {k: ckpt["metrics"].get(k, {}) for k in ("delay", "interference", "capacity")})["probes"])
    session.strategy.tokens_streamed = session.tokens_after[-1] if session.tokens_after else 0
    load_plugin_states(session.strategy.plugins, ckpt["extra"].get("plugins", {}))
    set_rng_state(ckpt["rng"])
    session.next_experience = ckpt["next_experience"]
    tracker.set_tags({"resumed_at_experience": session.next_experience})


def _usable_checkpoint(ckpt: Optional[Dict[str, Any]], cfg: RunConfig, announce) -> Optional[Dict[str, Any]]:
    """The checkpoint if its MLflow run is still in the store this run logs to. Checkpoint folders are
    per store (:func:`experiments.tracking.params.store_key`), so a miss means the store was replaced or
    the run deleted: the run starts over, with a message."""
    if ckpt is None or not cfg.tracking.enabled:
        return ckpt
    uri, run_id = default_tracking_uri(cfg.tracking.tracking_uri), ckpt["extra"].get("run_id")
    if run_id is None or not run_exists(uri, run_id):
        announce(f"ovq-cl: the checkpoint of this config belongs to MLflow run {run_id}, which is not in {uri} "
                 "(the store was replaced or the run deleted): starting over")
        return None
    return ckpt


# ------------------------------------------------------------------------------------ helpers


def _tracker(run: ResolvedRun, parent_run_id: Optional[str], opening: Opening):
    """The run's tracker: a new MLflow run, or the one its checkpoint names; a silent one on ranks other
    than 0 or without tracking."""
    cfg = run.config
    t = cfg.tracking
    tags = {"stream": cfg.stream.name, "layers": "+".join(cfg.model.layers), "strategy": cfg.strategy.name,
            "memory": cfg.memory.policy, "seed": cfg.seed, "data_seed": cfg.data_seed,
            "config_id": cfg.identity(), "code_version": run.code_version}
    if run.checkpoints:
        tags["checkpoint_dir"] = os.path.abspath(cfg.checkpoint.dir)
    run_id = None if opening.checkpoint is None else opening.checkpoint["extra"].get("run_id")
    # the label names a run's stream, mixers, strategy, memory and seed; its config id's first characters set
    # apart configurations that share all of those (three num_slots of OVQ once made three runs of one name)
    name = t.run_name or f"{cfg.label()}-{cfg.identity()[:6]}"
    return run_tracker(t.enabled and run.main, t.experiment, name, t.tracking_uri, parent_run_id, run_id, tags)


def _slug(version: str) -> str:
    return version.replace("+", "-").replace(".", "")


def _prefixed(values: Dict[str, float], prefix: str) -> Dict[str, float]:
    """``{prefix}/{name}`` for the numbers that are defined (NaN dropped)."""
    return {f"{prefix}/{k}": v for k, v in values.items() if v is not None and not math.isnan(v)}
