"""Scores for sequence outputs (torchmetrics), and the result matrix R[j][i] as an Avalanche metric.

Outputs are scored only where the labels say so: token streams ``out [B, T, V]`` against
``y [B, T]`` with -100 where nothing is scored; ICL regression ``out [B, T, d]`` against
``y [B, T, d]`` with NaN rows where nothing is scored. Classification ``out [B, C]`` against
``y [B]`` also works (used to cross-check against Avalanche's own metrics).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

import strategies.avalanche_compat  # noqa: F401  (torchmetrics imports torchvision too)
import torch
import torch.nn.functional as F
import torchmetrics
from avalanche.evaluation import PluginMetric
from avalanche.evaluation.metric_results import MetricValue
from avalanche.evaluation.metric_utils import get_metric_name

IGNORE = -100
HIGHER_IS_BETTER = {"accuracy": True, "mse": False, "bits_per_byte": False}


def scored(out: torch.Tensor, y: torch.Tensor):
    """The scored predictions and targets, flattened: ([n, V], [n]) or ([n, d], [n, d])."""
    if y.is_floating_point():
        mask = ~torch.isnan(y).any(-1)
        return out[mask], y[mask]
    if out.dim() == y.dim() + 1:
        mask = y != IGNORE
        return out[mask], y[mask]
    raise ValueError(f"cannot score outputs {tuple(out.shape)} against labels {tuple(y.shape)}")


def sequence_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over scored tokens (or classes), or MSE over scored regression targets."""
    pred, target = scored(out, y)
    if target.numel() == 0:
        return out.sum() * 0.0
    if target.is_floating_point():
        return F.mse_loss(pred, target)
    return F.cross_entropy(pred, target)


class SequenceScore:
    """update(out, y) / result() / reset() for one metric kind: accuracy, mse or bits_per_byte."""

    def __init__(self, kind: str) -> None:
        if kind not in HIGHER_IS_BETTER:
            raise ValueError(f"unknown metric {kind!r}; known: {sorted(HIGHER_IS_BETTER)}")
        self.kind = kind
        self.reset()

    def reset(self) -> None:
        if self.kind == "mse":
            self._metric = torchmetrics.MeanSquaredError()
        else:
            self._metric = torchmetrics.MeanMetric()

    @torch.no_grad()
    def update(self, out: torch.Tensor, y: torch.Tensor) -> None:
        pred, target = scored(out.detach().float().cpu(), y.detach().cpu())
        if target.numel() == 0:
            return
        if self.kind == "mse":
            self._metric.update(pred, target)
        elif self.kind == "accuracy":
            self._metric.update((pred.argmax(-1) == target).float())
        else:  # bits per byte: mean cross-entropy in bits over scored bytes
            self._metric.update(F.cross_entropy(pred, target, reduction="none") / math.log(2))

    def result(self) -> float:
        if self._metric.update_count == 0:
            return math.nan
        return float(self._metric.compute())


class ResultMatrix(PluginMetric[float]):
    """The score of every eval experience after every training experience: ``R[j][i]``.

    Emits one value per eval experience (name ``{kind}_Exp/eval_phase/...``, step = training
    experiences done) for the loggers, and keeps the whole matrix in ``self.R``. Row j is filled by
    the evaluation that follows training experience j (the runner evaluates after every experience);
    an evaluation before any training fills nothing.
    """

    def __init__(self, kind: str, n_experiences: int) -> None:
        super().__init__()
        self.kind, self.n = kind, n_experiences
        self.score = SequenceScore(kind)
        self.R: List[List[Optional[float]]] = [[None] * n_experiences for _ in range(n_experiences)]
        self.trained: int = 0

    def reset(self) -> None:
        self.score.reset()

    def result(self) -> float:
        return self.score.result()

    def update(self, strategy) -> None:
        self.score.update(strategy.mb_output, strategy.mb_y)

    def after_training_exp(self, strategy) -> None:
        self.trained = strategy.experience.current_experience + 1

    def before_eval_exp(self, strategy) -> None:
        self.reset()

    def after_eval_iteration(self, strategy) -> None:
        self.update(strategy)

    def after_eval_exp(self, strategy) -> "List[MetricValue]":
        value = self.result()
        i = strategy.experience.current_experience
        if self.trained > 0:
            self.R[self.trained - 1][i] = value
        name = get_metric_name(f"{self.kind}_Exp", strategy, add_experience=True)
        return [MetricValue(self, name, value, strategy.clock.train_iterations)]

    def state_dict(self) -> Dict:
        return {"R": self.R, "trained": self.trained}

    def load_state_dict(self, d: Dict) -> None:
        self.R, self.trained = [list(row) for row in d["R"]], int(d["trained"])

    def __str__(self) -> str:
        return f"{self.kind}_Exp"
