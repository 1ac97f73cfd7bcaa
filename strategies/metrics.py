"""Scores for sequence outputs (torchmetrics), and the result matrix R[j][i] as an Avalanche metric.

Outputs are scored only where the labels say so: token streams ``out [B, T, V]`` against
``y [B, T]`` with -100 where nothing is scored; ICL regression ``out [B, T, d]`` against
``y [B, T, d]`` with NaN rows where nothing is scored. Classification ``out [B, C]`` against
``y [B]`` also works (used to cross-check against Avalanche's own metrics).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional

import ovq_cl.base.avalanche_compat  # noqa: F401  (torchmetrics imports torchvision too)
import torch
import torch.nn.functional as F
import torchmetrics
from avalanche.evaluation import PluginMetric
from avalanche.evaluation.metric_results import MetricValue
from avalanche.evaluation.metric_utils import get_metric_name

from ovq_cl.base import IGNORE, scored_mask
HIGHER_IS_BETTER = {"accuracy": True, "mse": False, "bits_per_byte": False}


def scored(out: torch.Tensor, y: torch.Tensor):
    """The scored predictions and targets, flattened: ([n, V], [n]) or ([n, d], [n, d])."""
    if y.is_floating_point() or out.dim() == y.dim() + 1:
        mask = scored_mask(y)
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
    """update(out, y) / result() / reset() for one metric kind: accuracy, mse or bits_per_byte.

    The mean is torchmetrics' (over every scored answer, as before). Beside it the score keeps, per
    episode (one lane of a minibatch), the sum and the number of its answers, for a standard error that
    respects that answers of one episode are not independent: the cluster-robust (episode-level) s.e.
    of a ratio mean, ``sqrt(E / (E - 1) * sum_e (s_e - m n_e)^2) / N`` over E episodes with sums s_e,
    counts n_e, N answers and mean m. With one answer per episode it is the usual s.e. of the mean
    (for accuracy: the binomial ``sqrt(p (1 - p) / (N - 1))``).
    """

    def __init__(self, kind: str) -> None:
        if kind not in HIGHER_IS_BETTER:
            raise ValueError(f"unknown metric {kind!r}; known: {sorted(HIGHER_IS_BETTER)}")
        self.kind = kind
        self.reset()

    def reset(self) -> None:
        # the mean of per-answer values; for MSE that is torchmetrics' MeanSquaredError over every
        # scored element, as every answer has the same number of output dims
        self._metric = torchmetrics.MeanMetric()
        self._episode_sums: List[torch.Tensor] = []
        self._episode_counts: List[torch.Tensor] = []

    def answer_values(self, out: torch.Tensor, y: torch.Tensor):
        """(values [n], episode [n]): one value per scored answer (correct 0/1, squared error averaged over
        the output dims, or bits) and the index (in the minibatch) of the episode it belongs to."""
        out, y = out.detach().float().cpu(), y.detach().cpu()
        lanes = torch.arange(y.shape[0]).view(-1, *([1] * (y.dim() - 1))).expand_as(y)
        if y.is_floating_point():
            lanes = lanes[..., 0]
        pred, target = scored(out, y)
        episode = lanes[scored_mask(y)] if target.numel() else lanes.reshape(-1)[:0]
        if self.kind == "mse":
            if not target.is_floating_point():
                raise ValueError("metric 'mse' needs float targets [B, T, d]; token labels [B, T] (ICL with "
                                 "encoding=tokens) must be mapped to values first")
            values = (pred - target).pow(2).mean(-1)
        elif self.kind == "accuracy":
            values = (pred.argmax(-1) == target).float()
        else:  # bits per byte: cross-entropy in bits of every scored byte
            values = F.cross_entropy(pred, target, reduction="none") / math.log(2)
        return values, episode

    @torch.no_grad()
    def update(self, out: torch.Tensor, y: torch.Tensor) -> None:
        self.update_values(*self.answer_values(out, y), n_episodes=y.shape[0])

    def update_values(self, values: torch.Tensor, episode: torch.Tensor, n_episodes: int) -> None:
        if values.numel() == 0:
            return
        self._metric.update(values)
        self._episode_sums.append(torch.zeros(n_episodes, dtype=torch.float64).index_add_(0, episode, values.double()))
        self._episode_counts.append(torch.bincount(episode, minlength=n_episodes).double())

    def result(self) -> float:
        if self._metric.update_count == 0:
            return math.nan
        return float(self._metric.compute())

    @property
    def n_answers(self) -> int:
        return int(sum(c.sum() for c in self._episode_counts))

    @property
    def n_episodes(self) -> int:
        return int(sum(int((c > 0).sum()) for c in self._episode_counts))

    def standard_error(self) -> float:
        """Episode-clustered standard error of :meth:`result` (NaN with fewer than 2 scored episodes)."""
        if not self._episode_counts:
            return math.nan
        sums, counts = torch.cat(self._episode_sums), torch.cat(self._episode_counts)
        keep = counts > 0
        sums, counts = sums[keep], counts[keep]
        E, N = int(counts.numel()), float(counts.sum())
        if E < 2:
            return math.nan
        m = float(sums.sum()) / N
        return math.sqrt(E / (E - 1) * float((sums - m * counts).pow(2).sum())) / N


class ResultMatrix(PluginMetric[float]):
    """The score of every eval experience after every training experience: ``R[j][i]``, with errors.

    Emits one value per eval experience (name ``{kind}_Exp/eval_phase/...``, step = training
    iterations, Avalanche's x axis) for the loggers, and keeps, for the stream named ``stream_name``
    (the test stream) only, every evaluation after training experience j in row j:

    - ``R[j][i]``: the score against the experience's own labels (fixed when the experience was made);
    - ``R_se[j][i]``, ``R_n[j][i]``: its episode-clustered standard error and number of answers;
    - with ``labels_in_force`` (streams whose facts change, e.g. ICR with ``rebind_across``):
      ``R_current[j][i]``, the same answers scored against the labels in force after experience j
      (``labels_in_force(i, j, x, y) -> y_now``, same shape as y), its s.e., and among the answers
      whose label changed since experience i was made (``changed[j][i]`` of them) the fraction
      predicted with the new value (``updated``) and with the value of experience i (``stale``).

    An evaluation of any other stream (e.g. the train stream) or before any training fills nothing.
    """

    def __init__(self, kind: str, n_experiences: int, labels_in_force: Optional[Callable] = None,
                 stream_name: str = "test") -> None:
        super().__init__()
        self.kind, self.n, self.stream_name = kind, n_experiences, stream_name
        self.labels_in_force = labels_in_force
        self.score = SequenceScore(kind)
        self.current = SequenceScore(kind)
        self._changed = [0, 0, 0]                      # answers whose label changed, of them updated, stale
        self.R = self._empty()
        self.R_se, self.R_n = self._empty(), self._empty()
        self.R_current, self.R_current_se = self._empty(), self._empty()
        self.updated, self.stale, self.changed = self._empty(), self._empty(), self._empty()
        self.trained: int = 0

    def _empty(self) -> List[List[Optional[float]]]:
        return [[None] * self.n for _ in range(self.n)]

    MATRICES = ("R", "R_se", "R_n", "R_current", "R_current_se", "updated", "stale", "changed")

    def reset(self) -> None:
        self.score.reset()
        self.current.reset()
        self._changed = [0, 0, 0]

    def result(self) -> float:
        return self.score.result()

    def _recording(self, strategy) -> bool:
        return self.trained > 0 and strategy.experience.origin_stream.name == self.stream_name

    def update(self, strategy) -> None:
        out, y = strategy.mb_output, strategy.mb_y
        values, episode = self.score.answer_values(out, y)
        self.score.update_values(values, episode, y.shape[0])
        if self.labels_in_force is None or not self._recording(strategy):
            return
        i, j = strategy.experience.current_experience, self.trained - 1
        y_now = self.labels_in_force(i, j, strategy.mb_x.detach().cpu(), y.detach().cpu())
        self.current.update(out, y_now)
        if not y.is_floating_point():
            pred = out.detach().argmax(-1).cpu()
            y_cpu = y.detach().cpu()
            changed = scored_mask(y_cpu) & (y_now != y_cpu)
            self._changed[0] += int(changed.sum())
            self._changed[1] += int((changed & (pred == y_now)).sum())
            self._changed[2] += int((changed & (pred == y_cpu)).sum())

    def after_training_exp(self, strategy) -> None:
        self.trained = strategy.experience.current_experience + 1

    def before_eval_exp(self, strategy) -> None:
        self.reset()

    def after_eval_iteration(self, strategy) -> None:
        self.update(strategy)

    def after_eval_exp(self, strategy) -> "List[MetricValue]":
        value = self.result()
        i = strategy.experience.current_experience
        if self._recording(strategy):
            j = self.trained - 1
            self.R[j][i], self.R_se[j][i], self.R_n[j][i] = value, self.score.standard_error(), self.score.n_answers
            if self.labels_in_force is not None:
                self.R_current[j][i], self.R_current_se[j][i] = self.current.result(), self.current.standard_error()
                n, up, st = self._changed
                self.changed[j][i] = n
                self.updated[j][i] = up / n if n else None
                self.stale[j][i] = st / n if n else None
        name = get_metric_name(f"{self.kind}_Exp", strategy, add_experience=True)
        return [MetricValue(self, name, value, strategy.clock.train_iterations)]

    def state_dict(self) -> Dict:
        return {**{m: getattr(self, m) for m in self.MATRICES}, "trained": self.trained}

    def load_state_dict(self, d: Dict) -> None:
        for m in self.MATRICES:
            if m in d:
                setattr(self, m, [list(row) for row in d[m]])
        self.trained = int(d["trained"])

    def __str__(self) -> str:
        return f"{self.kind}_Exp"
