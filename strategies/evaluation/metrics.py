"""Scores of sequence outputs: the metric registry, the loss, and a running score with its error.

Outputs are scored only where the labels say so: token streams ``out [B, T, V]`` against
``y [B, T]`` with -100 where nothing is scored; ICL regression ``out [B, T, d]`` against
``y [B, T, d]`` with NaN rows where nothing is scored. Classification ``out [B, C]`` against
``y [B]`` also works (used to cross-check against Avalanche's own metrics).

A metric is a :class:`MetricSpec` registered by name (``register_metric``): its value per scored answer,
its direction, its perfect score, and its *chance* score (the best predictor that ignores the context,
computed on the labels themselves; the learned gate measures skill against it). A stream names its
metric in ``StreamInfo.metric``; a user's stream can name a user's metric.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional

import ovq_cl.base.avalanche_compat  # noqa: F401  (torchmetrics imports torchvision too)
import torch
import torch.nn.functional as F
import torchmetrics

from ovq_cl.base import Registry, scored_mask


@dataclass(frozen=True)
class MetricSpec:
    """values(pred, target) -> [n]: one value per scored answer (pred [n, V] logits or [n, d] values,
    target [n] or [n, d]); the score is their mean. chance(target) -> the best context-free predictor's
    score on those targets. perfect: the best possible score."""

    values: Callable[..., torch.Tensor]
    chance: Callable[..., float]
    higher_is_better: bool
    perfect: float
    float_targets: bool = False
    needs_context: bool = False   # values/chance take the stream's ``metric_context`` as keyword arguments


METRICS: Registry[MetricSpec] = Registry("metric", "ovq_cl.metrics")


def register_metric(name: str, spec: MetricSpec) -> MetricSpec:
    return METRICS.register(name, spec)


def _label_frequencies(target: torch.Tensor) -> torch.Tensor:
    counts = torch.bincount(target.reshape(-1)).double()
    return counts[counts > 0] / counts.sum()


def _entropy_bits(target: torch.Tensor) -> float:
    p = _label_frequencies(target)
    return float(-(p * p.log2()).sum())


register_metric("accuracy", MetricSpec(
    values=lambda pred, target: (pred.argmax(-1) == target).float(),
    chance=lambda target: float(_label_frequencies(target).max()),        # always the most frequent answer
    higher_is_better=True, perfect=1.0))
register_metric("mse", MetricSpec(
    values=lambda pred, target: (pred - target).pow(2).mean(-1),           # per answer, mean over dims
    chance=lambda target: float(target.double().var(0, unbiased=False).mean()),   # always the targets' mean
    higher_is_better=False, perfect=0.0, float_targets=True))
register_metric("bits_per_byte", MetricSpec(
    values=lambda pred, target: F.cross_entropy(pred, target, reduction="none") / math.log(2),
    chance=_entropy_bits,                                                   # a unigram model
    higher_is_better=False, perfect=0.0))


def _binned_values(pred, target, bin_centers, first_value_token):
    n = len(bin_centers)
    centers = bin_centers.to(pred.device)
    guess = centers[(pred.argmax(-1) - first_value_token).clamp(0, n - 1)]
    return (guess - centers[(target - first_value_token).clamp(0, n - 1)]).pow(2)


def _binned_chance(target, bin_centers, first_value_token):
    values = bin_centers[(target.cpu() - first_value_token).clamp(0, len(bin_centers) - 1)].double()
    return float(values.var(unbiased=False))


register_metric("binned_mse", MetricSpec(                          # quantised regression (ICL, tokens)
    values=_binned_values, chance=_binned_chance, higher_is_better=False, perfect=0.0, needs_context=True))


def higher_is_better(kind: str) -> bool:
    return METRICS.get(kind).higher_is_better


def chance_score(kind: str, y: torch.Tensor, context: Optional[dict] = None) -> float:
    """The chance score of metric ``kind`` on labels y ([N, T] int with -100, or [N, T, d] float with NaN)."""
    target = y[scored_mask(y)]
    if target.numel() == 0:
        return math.nan
    spec = METRICS.get(kind)
    return spec.chance(target, **(context or {})) if spec.needs_context else spec.chance(target)


def skill(kind: str, score: float, chance: float) -> float:
    """(score - chance) / (perfect - chance): 0 at chance, 1 perfect, negative below chance; NaN if undefined."""
    span = METRICS.get(kind).perfect - chance
    if math.isnan(score) or math.isnan(chance) or span == 0:
        return math.nan
    return (score - chance) / span


def scored(out: torch.Tensor, y: torch.Tensor):
    """The scored predictions and targets, flattened: ([n, V], [n]) or ([n, d], [n, d])."""
    if y.is_floating_point() or out.dim() == y.dim() + 1:
        mask = scored_mask(y)
        return out[mask], y[mask]
    raise ValueError(f"cannot score outputs {tuple(out.shape)} against labels {tuple(y.shape)}")


def sequence_loss(out: torch.Tensor, y: torch.Tensor, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Cross-entropy over scored tokens (or classes), or MSE over scored regression targets: the mean over
    the scored answers. ``weights`` (shaped like the scored mask of ``y``, e.g. [B, T]): each answer's
    term multiplied by its weight, still divided by the number of answers (so weights of 1 change nothing)."""
    pred, target = scored(out, y)
    if target.numel() == 0:
        return out.sum() * 0.0
    if weights is None:
        if target.is_floating_point():
            return F.mse_loss(pred, target)
        return F.cross_entropy(pred, target)
    w = weights[scored_mask(y)].to(pred.dtype)
    if target.is_floating_point():
        per = F.mse_loss(pred, target, reduction="none")
        return (per * w.reshape(-1, *([1] * (per.dim() - 1)))).mean()
    return (F.cross_entropy(pred, target, reduction="none") * w).mean()


class SequenceScore:
    """update(out, y) / result() / reset() for one registered metric (accuracy, mse, bits_per_byte, ...).

    The mean is torchmetrics' (over every scored answer, as before). Beside it the score keeps, per
    episode (one lane of a minibatch), the sum and the number of its answers, for a standard error that
    respects that answers of one episode are not independent: the cluster-robust (episode-level) s.e.
    of a ratio mean, ``sqrt(E / (E - 1) * sum_e (s_e - m n_e)^2) / N`` over E episodes with sums s_e,
    counts n_e, N answers and mean m. With one answer per episode it is the usual s.e. of the mean
    (for accuracy: the binomial ``sqrt(p (1 - p) / (N - 1))``).
    """

    def __init__(self, kind: str, context: Optional[dict] = None) -> None:
        self.spec = METRICS.get(kind)
        self.kind, self.context = kind, dict(context or {})
        self.reset()

    def __getstate__(self):
        # the metric's spec (functions) is looked up again by name: a score pickles (checkpoints)
        state = dict(self.__dict__)
        state.pop("spec", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.spec = METRICS.get(self.kind)

    def reset(self) -> None:
        # the mean of per-answer values; for MSE that is torchmetrics' MeanSquaredError over every
        # scored element, as every answer has the same number of output dims
        # a non-finite answer makes the score NaN (a diverged run is seen as broken): torchmetrics' default
        # drops NaN and averages the rest, which makes a run that diverged on some lanes look better
        self._metric = torchmetrics.MeanMetric(nan_strategy="disable")
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
        if self.spec.float_targets != target.is_floating_point():
            raise ValueError(f"metric {self.kind!r} needs {'float' if self.spec.float_targets else 'integer'} "
                             f"targets, got {target.dtype} (ICL with encoding=tokens scores token labels: "
                             "map them to values first)")
        if self.spec.needs_context:
            return self.spec.values(pred, target, **self.context), episode
        return self.spec.values(pred, target), episode

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
