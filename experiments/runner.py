"""One run of the experiment: meta-training, then the stream, evaluated after every experience.

    cfg = run_config("experiments/configs/icr_frozen.yaml", ["model.layers=[ovq]", "seed=1"])
    result = run(cfg)          # RunResult: the matrix R, the summary, the MLflow run id, ...

Phases (``docs/design.md``, section 5):
1. meta-training on the stream's own meta-training set, fresh state per episode; then the learned gate
   (``strategies.gate``) on held-out episodes from a fresh state;
2. the stream: for every experience j, train (or, with ``frozen``, only stream) through the model with
   the memory policy, then evaluate every experience i from a copy of the carried state -> R[j][i];
3. after every experience: metrics to MLflow (step = j) and a checkpoint (weights, optimizer,
   memory, metrics, RNG) from which the run resumes if it is started again with the same config;
4. at the end: both forgetting definitions, the stream gate, and (streams whose facts change) R_current.

``seed`` seeds the data too unless ``stream.options.seed`` is set (``experiments.config.with_data_seed``).
"""
from __future__ import annotations

import copy
import csv
import io
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import torch

import ovq_cl.base.avalanche_compat  # noqa: F401  (before avalanche)
from avalanche.training.plugins import EvaluationPlugin

from experiments.config import RunConfig, with_data_seed
from ovq_cl import DecoderLM, RegressionLM
from ovq_cl.config import model_config
from strategies import forgetting
from strategies.checkpoint import load_checkpoint, save_checkpoint, set_rng_state
from strategies.gate import GateResult, measure_gate, stream_gate
from strategies.memory import PersistentMemoryPlugin
from strategies.meta import meta_train
from strategies.metrics import ResultMatrix
from strategies.scores import higher_is_better
from strategies.regularizers import LanguageDistillationPlugin, SequenceEWCPlugin, SequenceReplayPlugin
from strategies.sequence import FrozenWeights, SequenceTemplate
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
    parameters: int = 0
    state_bytes_per_lane: List[float] = field(default_factory=list)
    wall_seconds: float = math.nan

    @property
    def learned(self) -> Optional[bool]:
        """True when both gates passed, False when either failed, None when neither was measured."""
        return combined_gate(self.gate.get("learned"), self.stream_gate.get("learned"))

    def record(self) -> Dict[str, Any]:
        """A JSON-able record of the run: config (flattened), seeds, every matrix and summary."""
        from experiments.tracking import flatten_config

        return {
            "label": self.config.label(), "config_id": self.config.identity(), "params": flatten_config(self.config),
            "seed": self.config.seed, "data_seed": self.config.data_seed, "metric": self.metric,
            "higher_is_better": higher_is_better(self.metric), "R": self.R, "R_se": self.R_se, "R_n": self.R_n,
            "current": self.current, "summary": self.summary, "summary_current": self.summary_current,
            "gate": self.gate, "stream_gate": self.stream_gate, "learned": self.learned,
            "tokens_after": self.tokens_after, "state_bytes_per_layer_lane": self.state_bytes_per_lane,
            "parameters": self.parameters, "meta_history": self.meta_history, "run_id": self.run_id,
            "wall_seconds": self.wall_seconds,
        }


def combined_gate(*flags: Optional[bool]) -> Optional[bool]:
    """False if any gate failed, True if all measured gates passed, None if none was measured."""
    measured = [f for f in flags if f is not None]
    if not measured:
        return None
    return all(measured)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(cfg: RunConfig, info) -> torch.nn.Module:
    """A DecoderLM for token streams (vocabulary from the stream), a RegressionLM for continuous ICL."""
    user = dict(cfg.model.__dict__)
    if info.vocab_size is not None:
        user["vocab_size"] = info.vocab_size
        return DecoderLM(model_config(user))
    return RegressionLM(model_config(user), d_in=info.d_in, d_out=info.d_out)


def build_strategy(cfg: RunConfig, model, evaluator, seed: int):
    s = cfg.strategy
    plugins = [PersistentMemoryPlugin(cfg.memory.policy)]
    common = dict(train_mb_size=s.train_mb_size, train_epochs=s.epochs, evaluator=evaluator, plugins=plugins)
    if s.name == "frozen":
        return FrozenWeights(model=model, **common), None
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    if s.name == "ewc":
        plugins.append(SequenceEWCPlugin(ewc_lambda=s.ewc_lambda, mode=s.ewc_mode, decay_factor=s.ewc_decay))
    elif s.name == "replay":
        plugins.append(SequenceReplayPlugin(mem_size=s.replay_mem_size, policy=s.replay_policy, seed=seed))
    elif s.name == "lwf":
        plugins.append(LanguageDistillationPlugin(s.lwf_alpha, s.lwf_temperature, s.lwf_positions))
    return SequenceTemplate(model=model, optimizer=optimizer, grad_clip=s.grad_clip, **common), optimizer


def _plugin_state(strategy) -> Dict[str, Any]:
    """What the regularisers need to resume: EWC importances, the replay buffer, LwF's old model."""
    out: Dict[str, Any] = {}
    for p in strategy.plugins:
        if isinstance(p, SequenceEWCPlugin):
            out["ewc"] = {"saved_params": dict(p.saved_params), "importances": dict(p.importances)}
        elif isinstance(p, SequenceReplayPlugin):
            out["replay"] = p.storage
        elif isinstance(p, LanguageDistillationPlugin) and p.old_model is not None:
            out["lwf"] = p.old_model.state_dict()
    return out


def _load_plugin_state(strategy, state: Dict[str, Any]) -> None:
    for p in strategy.plugins:
        if isinstance(p, SequenceEWCPlugin) and "ewc" in state:
            p.saved_params.update(state["ewc"]["saved_params"])
            p.importances.update(state["ewc"]["importances"])
        elif isinstance(p, SequenceReplayPlugin) and "replay" in state:
            p.storage = state["replay"]
        elif isinstance(p, LanguageDistillationPlugin) and "lwf" in state:
            p.old_model = copy.deepcopy(strategy.model).eval()
            p.old_model.load_state_dict(state["lwf"])
            for q in p.old_model.parameters():
                q.requires_grad_(False)


def n_parameters(model: torch.nn.Module) -> int:
    """Trainable and frozen parameters, each tensor counted once (tied weights once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def state_metrics(model, states) -> Dict[str, float]:
    """State bytes per layer and lane, and mixer statistics (OVQ active slots, count entropy)."""
    out: Dict[str, float] = {}
    if states is None:
        return out
    for layer, (mixer, state) in enumerate(zip(model.mixers, states)):
        if state is None:
            continue
        lanes = max(1, int(next((t.shape[0] for t in state.state_dict().values() if t.dim() > 0), 1)))
        out[f"state_bytes/layer{layer}"] = state.nbytes / lanes
        for key, value in mixer.state_stats(state.mixer).items():
            out[f"{key}/layer{layer}"] = value
    return out


def matrix_csv(R) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["trained_on"] + [f"eval_{i}" for i in range(len(R))])
    for j, row in enumerate(R):
        writer.writerow([j] + ["" if v is None else f"{v:.6g}" for v in row])
    return buf.getvalue()


def forgetting_plot(R, tokens_after, metric: str, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for row in range(len(R)):
        js = [j for j in range(row, len(R)) if R[j][row] is not None]
        axes[0].plot(js, [R[j][row] for j in js], marker="o", label=f"exp {row}")
        axes[1].plot([tokens_after[j] - tokens_after[row] for j in js], [R[j][row] for j in js], marker="o")
    axes[0].set_xlabel("after training experience j")
    axes[1].set_xlabel("tokens streamed per lane since the experience ended")
    for ax in axes:
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _tracker(cfg: RunConfig, parent_run_id: Optional[str], run_id: Optional[str]):
    if not cfg.tracking.enabled:
        return None
    from experiments.tracking import RunTracker

    tags = {"stream": cfg.stream.name, "layers": "+".join(cfg.model.layers), "strategy": cfg.strategy.name,
            "memory": cfg.memory.policy, "seed": cfg.seed, "data_seed": cfg.data_seed,
            "config_id": cfg.identity()}
    return RunTracker(cfg.tracking.experiment, cfg.tracking.run_name or cfg.label(), cfg.tracking.tracking_uri,
                      parent_run_id=parent_run_id, tags=tags, run_id=run_id)


class _NullTracker:
    run_id = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        return lambda *a, **k: None


def _summaries(R, higher: bool, prefix: str) -> Dict[str, float]:
    """``{prefix}/{name}`` for the summary numbers of R (rows measured so far), NaNs dropped."""
    values = forgetting.summary(R, higher)
    return {f"{prefix}/{k}": v for k, v in values.items() if v is not None and not math.isnan(v)}


def _changed_fractions(results: ResultMatrix, j: int) -> Dict[str, float]:
    """Over the cells of row j, the share of answers whose fact changed since they were learned that the
    model gave with the new value (updated) or the old one (stale)."""
    n = sum(results.changed[j][i] or 0 for i in range(j + 1))
    if not n:
        return {}
    up = sum((results.updated[j][i] or 0) * (results.changed[j][i] or 0) for i in range(j + 1))
    st = sum((results.stale[j][i] or 0) * (results.changed[j][i] or 0) for i in range(j + 1))
    return {"current/changed_answers": n, "current/updated_fraction": up / n, "current/stale_fraction": st / n}


def run(cfg: RunConfig, parent_run_id: Optional[str] = None, stop_after: Optional[int] = None) -> RunResult:
    """Runs (or resumes) one configuration. ``stop_after=j`` stops after experience j (tests, debugging)."""
    cfg = with_data_seed(cfg.check())
    started = time.perf_counter()
    seed_everything(cfg.seed)
    bench = stream_benchmark(cfg.stream.name, cfg.stream.options)
    info = bench.info
    K, metric = info.n_experiences, info.metric
    higher = higher_is_better(metric)
    model = build_model(cfg, info)
    ckpt_path = os.path.join(cfg.checkpoint.dir, f"{cfg.label()}-{cfg.identity()}", "last.pt")
    ckpt = None
    if cfg.checkpoint.enabled and cfg.checkpoint.resume and os.path.exists(ckpt_path):
        ckpt = load_checkpoint(ckpt_path)
    tracker = _tracker(cfg, parent_run_id, None if ckpt is None else ckpt["extra"].get("run_id")) or _NullTracker()
    with tracker:
        tracker.log_config(cfg)
        if ckpt is None:
            tracker.set_tags({"metric": metric, **{f"metric_definition.{k}": v for k, v in forgetting.DEFINITIONS.items()}})
            tracker.log_dict({"metric": metric, "higher_is_better": higher, "definitions": forgetting.DEFINITIONS},
                             "metric_definitions.json")
        relabel = info.labels_in_force if info.facts_change else None
        results = ResultMatrix(metric, K, labels_in_force=relabel)
        evaluator = EvaluationPlugin(results, loggers=_loggers(tracker))
        parameters = n_parameters(model)
        meta_history: List[Dict[str, float]] = []
        gate: Dict[str, Any] = {}
        if ckpt is None:
            meta_history = meta_train(
                model, bench.meta_train, steps=cfg.meta_train.steps, batch_size=cfg.meta_train.batch_size,
                lr=cfg.meta_train.lr, metric=metric, seed=cfg.seed, progress=cfg.progress, log=tracker.log_metrics,
            )
            if meta_history:
                tracker.log_metrics({"meta_train/final_loss": meta_history[-1]["loss"]}, step=0)
            gate = _measure_gate(cfg, model, bench, metric).as_dict()
            tracker.log_metrics({"model/parameters": parameters, **{f"gate/{k}": float(v) for k, v in gate.items()
                                                                   if v is not None and k != "learned"}}, step=0)
            tracker.set_tags({"learned": _gate_tag(gate.get("learned"))})
        strategy, optimizer = build_strategy(cfg, model, evaluator, cfg.seed)
        tokens_after: List[int] = []
        start = 0
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            if optimizer is not None and ckpt["optimizer"] is not None:
                optimizer.load_state_dict(ckpt["optimizer"])
            if ckpt["states"] is not None:
                strategy.states = model.states_from_state_dicts(ckpt["states"])
            results.load_state_dict(ckpt["metrics"]["results"])
            tokens_after = list(ckpt["metrics"]["tokens_after"])
            meta_history = list(ckpt["metrics"].get("meta_history", []))
            gate = dict(ckpt["metrics"].get("gate", {}))
            strategy.tokens_streamed = tokens_after[-1] if tokens_after else 0
            _load_plugin_state(strategy, ckpt["extra"].get("plugins", {}))
            set_rng_state(ckpt["rng"])
            start = ckpt["next_experience"]
            tracker.set_tags({"resumed_at_experience": start})
        for j in range(start, K):
            strategy.train(bench.train_stream[j])
            tokens_after.append(strategy.tokens_streamed)
            strategy.eval(bench.test_stream)
            row = {f"R/eval_{i}": v for i, v in enumerate(results.R[j]) if v is not None}
            row.update({f"R_se/eval_{i}": v for i, v in enumerate(results.R_se[j]) if v is not None and not math.isnan(v)})
            row.update(_summaries(results.R[: j + 1], higher, "stream"))
            if relabel is not None:
                row.update({f"R_current/eval_{i}": v for i, v in enumerate(results.R_current[j]) if v is not None})
                row.update(_summaries(results.R_current[: j + 1], higher, "stream_current"))
                row.update(_changed_fractions(results, j))
            row["stream/learning_score"] = results.R[j][j]
            row["stream/tokens_per_lane"] = strategy.tokens_streamed
            row.update(state_metrics(model, strategy.states))
            tracker.log_metrics(row, step=j)
            if cfg.checkpoint.enabled:
                save_checkpoint(
                    ckpt_path, model=model, optimizer=optimizer, states=strategy.states, next_experience=j + 1,
                    metrics={"results": results.state_dict(), "tokens_after": tokens_after,
                             "meta_history": meta_history, "gate": gate},
                    extra={"run_id": tracker.run_id, "plugins": _plugin_state(strategy)},
                )
            if stop_after is not None and j >= stop_after and j < K - 1:
                raise KeyboardInterrupt(f"stopped after experience {j} (stop_after)")
        R = results.R
        summary = forgetting.summary(R, higher)
        current = None
        summary_current: Dict[str, float] = {}
        if relabel is not None:
            current = {m: getattr(results, m) for m in ("R_current", "R_current_se", "updated", "stale", "changed")}
            summary_current = forgetting.summary(results.R_current, higher)
            summary_current.update({k.split("/", 1)[1]: v for k, v in _changed_fractions(results, K - 1).items()
                                    if not k.endswith("changed_answers")})
        _, test_labels = _test_labels(bench)
        s_gate = stream_gate(summary["learning_average"], test_labels, metric, cfg.gate.min_stream_skill).as_dict()
        learned = combined_gate(gate.get("learned"), s_gate["learned"])
        tracker.set_tags({"learned_on_stream": _gate_tag(s_gate["learned"]), "learned_overall": _gate_tag(learned)})
        final = {f"final/{k}": v for k, v in summary.items() if not math.isnan(v)}
        final.update({f"final_current/{k}": v for k, v in summary_current.items() if not math.isnan(v)})
        final.update({f"stream_gate/{k}": float(v) for k, v in s_gate.items() if v is not None and k != "learned"})
        tracker.log_metrics(final, step=K - 1)
        tracker.log_text(matrix_csv(R), "result_matrix.csv")
        per_lane = state_metrics(model, strategy.states)
        result = RunResult(
            cfg, metric, R, summary, tokens_after, [0 if s is None else int(s.nbytes) for s in (strategy.states or [])],
            tracker.run_id, ckpt_path if cfg.checkpoint.enabled else None, meta_history,
            R_se=results.R_se, R_n=results.R_n, current=current, summary_current=summary_current, gate=gate,
            stream_gate=s_gate, parameters=parameters,
            state_bytes_per_lane=[per_lane[k] for k in sorted(per_lane) if k.startswith("state_bytes/")],
            wall_seconds=time.perf_counter() - started,
        )
        record = result.record()
        record["forgetting_curve"] = forgetting.forgetting_curve(R, tokens_after)
        record["definitions"] = forgetting.DEFINITIONS
        tracker.log_dict(record, "results.json")
        fig = forgetting_plot(R, tokens_after, metric, cfg.label() + ("" if learned is not False else "  [NOT LEARNED]"))
        tracker.log_figure(fig, "forgetting_curve.png")
        import matplotlib.pyplot as plt

        plt.close(fig)
        return result


def _gate_tag(flag: Optional[bool]) -> str:
    return "unmeasured" if flag is None else str(bool(flag)).lower()


def _measure_gate(cfg: RunConfig, model, bench, metric: str) -> GateResult:
    """The learned gate on held-out meta-training episodes (never seen in meta-training), fresh state each."""
    source = getattr(bench, "meta_train_episodes", None)
    dataset = None if source is None else held_out(source, cfg.gate.episodes)
    return measure_gate(model, dataset, metric, cfg.gate.min_skill, cfg.gate.batch_size)


def _test_labels(bench):
    """Every test item of the stream, stacked: (x [N, T...], y [N, T...])."""
    xs, ys = zip(*(stack_items(exp.dataset) for exp in bench.test_stream))
    return torch.cat(xs), torch.cat(ys)


def _loggers(tracker) -> list:
    if isinstance(tracker, _NullTracker):
        return []
    from experiments.tracking import MLflowLogger

    return [MLflowLogger(tracker)]
