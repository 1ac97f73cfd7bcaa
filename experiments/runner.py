"""One run of the experiment: meta-training, then the stream, evaluated after every experience.

    cfg = run_config("experiments/configs/icr_frozen.yaml", ["model.layers=[ovq]", "seed=1"])
    result = run(cfg)          # RunResult: the matrix R, the summary, the MLflow run id, ...

Phases (``shared/design/continual-protocol.md``):
1. meta-training on the stream's own meta-training set, fresh state per episode;
2. the stream: for every experience j, train (or, with ``frozen``, only stream) through the model with
   the memory policy, then evaluate every experience i from a copy of the carried state -> R[j][i];
3. after every experience: metrics to MLflow (step = j) and a checkpoint (weights, optimizer,
   memory, metrics, RNG) from which the run resumes if it is started again with the same config.
"""
from __future__ import annotations

import copy
import csv
import io
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import torch

import strategies.avalanche_compat  # noqa: F401  (before avalanche)
from avalanche.training.plugins import EvaluationPlugin

from experiments.config import RunConfig
from ovq_cl import DecoderLM, RegressionLM
from ovq_cl.config import model_config
from strategies import forgetting
from strategies.checkpoint import load_checkpoint, save_checkpoint, set_rng_state
from strategies.memory import PersistentMemoryPlugin
from strategies.meta import meta_train
from strategies.metrics import HIGHER_IS_BETTER, ResultMatrix
from strategies.regularizers import LanguageDistillationPlugin, SequenceEWCPlugin, SequenceReplayPlugin
from strategies.sequence import FrozenWeights, SequenceTemplate
from streams import BENCHMARKS


@dataclass
class RunResult:
    config: RunConfig
    metric: str
    R: List[List[Optional[float]]]
    summary: Dict[str, float]
    tokens_after: List[int]
    state_bytes: List[int]
    run_id: Optional[str] = None
    checkpoint: Optional[str] = None
    meta_history: List[Dict[str, float]] = field(default_factory=list)


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
            "memory": cfg.memory.policy, "seed": cfg.seed, "config_id": cfg.identity()}
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


def run(cfg: RunConfig, parent_run_id: Optional[str] = None, stop_after: Optional[int] = None) -> RunResult:
    """Runs (or resumes) one configuration. ``stop_after=j`` stops after experience j (tests, debugging)."""
    cfg.check()
    seed_everything(cfg.seed)
    bench = BENCHMARKS[cfg.stream.name](cfg.stream.options)
    info = bench.info
    K, metric = info.n_experiences, info.metric
    model = build_model(cfg, info)
    ckpt_path = os.path.join(cfg.checkpoint.dir, f"{cfg.label()}-{cfg.identity()}", "last.pt")
    ckpt = None
    if cfg.checkpoint.enabled and cfg.checkpoint.resume and os.path.exists(ckpt_path):
        ckpt = load_checkpoint(ckpt_path)
    tracker = _tracker(cfg, parent_run_id, None if ckpt is None else ckpt["extra"].get("run_id")) or _NullTracker()
    with tracker:
        tracker.log_config(cfg)
        results = ResultMatrix(metric, K)
        evaluator = EvaluationPlugin(results, loggers=_loggers(tracker))
        meta_history: List[Dict[str, float]] = []
        if ckpt is None:
            meta_history = meta_train(
                model, bench.meta_train, steps=cfg.meta_train.steps, batch_size=cfg.meta_train.batch_size,
                lr=cfg.meta_train.lr, metric=metric, seed=cfg.seed, progress=cfg.progress, log=tracker.log_metrics,
            )
            if meta_history:
                tracker.log_metrics({"meta_train/final_loss": meta_history[-1]["loss"]}, step=0)
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
            strategy.tokens_streamed = tokens_after[-1] if tokens_after else 0
            _load_plugin_state(strategy, ckpt["extra"].get("plugins", {}))
            set_rng_state(ckpt["rng"])
            start = ckpt["next_experience"]
            tracker.set_tags({"resumed_at_experience": start})
        higher = HIGHER_IS_BETTER[metric]
        for j in range(start, K):
            strategy.train(bench.train_stream[j])
            tokens_after.append(strategy.tokens_streamed)
            strategy.eval(bench.test_stream)
            row = {f"R/eval_{i}": v for i, v in enumerate(results.R[j]) if v is not None}
            summary_j = forgetting.summary(results.R[: j + 1], higher) if j > 0 else {
                "final_average": results.R[0][0], "learning_average": results.R[0][0]}
            row.update({f"stream/{k}": v for k, v in summary_j.items() if not math.isnan(v)})
            row["stream/learning_score"] = results.R[j][j]
            row["stream/tokens_per_lane"] = strategy.tokens_streamed
            row.update(state_metrics(model, strategy.states))
            tracker.log_metrics(row, step=j)
            if cfg.checkpoint.enabled:
                save_checkpoint(
                    ckpt_path, model=model, optimizer=optimizer, states=strategy.states, next_experience=j + 1,
                    metrics={"results": results.state_dict(), "tokens_after": tokens_after},
                    extra={"run_id": tracker.run_id, "plugins": _plugin_state(strategy)},
                )
            if stop_after is not None and j >= stop_after and j < K - 1:
                raise KeyboardInterrupt(f"stopped after experience {j} (stop_after)")
        R = results.R
        summary = forgetting.summary(R, higher) if K > 1 else {"final_average": R[0][0]}
        tracker.log_metrics({f"final/{k}": v for k, v in summary.items() if not math.isnan(v)}, step=K - 1)
        tracker.log_text(matrix_csv(R), "result_matrix.csv")
        curve = forgetting.forgetting_curve(R, tokens_after)
        tracker.log_dict({"metric": metric, "higher_is_better": higher, "R": R, "summary": summary,
                          "tokens_after": tokens_after, "forgetting_curve": curve}, "results.json")
        fig = forgetting_plot(R, tokens_after, metric, cfg.label())
        tracker.log_figure(fig, "forgetting_curve.png")
        import matplotlib.pyplot as plt

        plt.close(fig)
        states_bytes = [0 if s is None else int(s.nbytes) for s in (strategy.states or [])]
        return RunResult(cfg, metric, R, summary, tokens_after, states_bytes, tracker.run_id,
                         ckpt_path if cfg.checkpoint.enabled else None, meta_history)


def _loggers(tracker) -> list:
    if isinstance(tracker, _NullTracker):
        return []
    from experiments.tracking import MLflowLogger

    return [MLflowLogger(tracker)]
