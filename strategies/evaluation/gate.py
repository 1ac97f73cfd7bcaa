"""The learned gate: did the model learn the task at all? Forgetting means nothing otherwise.

A mixer that never learned in-context recall scores at chance everywhere, so its forgetting is a
small number (nothing to lose) that must never sit beside real ones. Two checks, both against
*chance* = the score of the best predictor that ignores the context, computed on the same labels:

- accuracy: the frequency of the most common label (always answering it);
- mse: the mean variance of the targets per output dim (always answering their mean);
- bits_per_byte: the entropy in bits of the labels' empirical distribution (a unigram model).

``skill = (score - chance) / (perfect - chance)`` puts every metric on one scale: 0 at chance, 1
perfect (perfect is 1 for accuracy, 0 for MSE and bits per byte), negative below chance.

1. **Before the stream** (:func:`measure_gate`): the model's score on held-out episodes of the
   meta-training task, each from a fresh state, in eval mode: ``learned`` iff skill >= ``min_skill``.
   This measures in-context skill, not the training-batch score of meta-training.
2. **On the stream** (:func:`stream_gate`): the mean learning score ``R[j][j]`` against chance on the
   stream's test labels: ``learned_on_stream`` iff skill >= ``min_stream_skill``. It catches runs
   whose memory policy or state never lets a fact reach the test (e.g. ``reset_episode``: test episodes
   start fresh, so every score is chance and forgetting is exactly 0).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from ovq_cl.base import collate_episodes
from strategies.evaluation.metrics import SequenceScore, chance_score, skill

@dataclass
class ProbePoint:
    """A probe's score on a set of items, each from a fresh state (what every point of the delay,
    interference and capacity curves measures), with its s.e., chance and skill as in the gate."""

    score: float
    standard_error: float
    chance: float
    skill: float
    episodes: int


def probe_scores(model: torch.nn.Module, dataset, metric: str, batch_size: int, device="cpu",
                 context: Optional[dict] = None) -> Dict[str, Any]:
    """The fields of a :class:`ProbePoint` for ``dataset`` (the gate's measurement, no threshold)."""
    g = measure_gate(model, dataset, metric, min_skill=math.inf, batch_size=batch_size, device=device, context=context)
    return {"score": g.score, "standard_error": g.standard_error, "chance": g.chance, "skill": g.skill,
            "episodes": g.episodes}


@dataclass
class GateResult:
    """What the gate measured. ``learned`` is None when nothing could be measured."""

    score: float
    standard_error: float
    chance: float
    skill: float
    threshold: float
    episodes: int
    learned: Optional[bool]

    def as_dict(self) -> Dict:
        return asdict(self)


@torch.no_grad()
def measure_gate(model: torch.nn.Module, dataset: Optional[Dataset], kind: str, min_skill: float,
                 batch_size: int = 32, device="cpu", context: Optional[dict] = None) -> GateResult:
    """The model's score on ``dataset`` (items (x, y), every episode from a fresh state), its skill
    against chance on the same labels, and ``learned = skill >= min_skill``."""
    if dataset is None or len(dataset) == 0:
        return GateResult(math.nan, math.nan, math.nan, math.nan, min_skill, 0, None)
    was_training = model.training
    model.eval()
    score = SequenceScore(kind, context)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_episodes)
    labels = []
    try:
        for x, y, *_ in loader:
            out, _ = model(x.to(device))
            score.update(out, y.to(device))
            labels.append(y)
    finally:
        model.train(was_training)
    y_all = torch.cat(labels)
    chance = chance_score(kind, y_all, context)
    value = score.result()
    s = skill(kind, value, chance)
    return GateResult(value, score.standard_error(), chance, s, min_skill, len(dataset),
                      None if math.isnan(s) else bool(s >= min_skill))


def experience_chances(test_labels: Sequence[torch.Tensor], kind: str, context: Optional[dict] = None) -> List[float]:
    """Per experience j, the best context-free predictor's score on j's own test labels."""
    return [chance_score(kind, y, context) for y in test_labels]


def stream_gate_from_chances(learning_scores: Sequence[Optional[float]], chances: Sequence[float], kind: str,
                             min_stream_skill: float) -> GateResult:
    """Did the run learn the stream: the mean over experiences j of the skill of R[j][j] against j's own
    chance, >= ``min_stream_skill``. Each experience is its own null: a memory that ignores the facts but
    predicts an experience's label distribution (text: its domain's unigrams; ICL: its functions' output
    variance) scores that experience's chance, not the pooled stream's. The result's ``chance`` is the
    mean of the per-experience chances, its ``score`` the mean learning score."""
    skills = [skill(kind, s, c) for s, c in zip(learning_scores, chances) if s is not None and not math.isnan(s)]
    scores = [s for s in learning_scores if s is not None and not math.isnan(s)]
    if not skills or len(chances) != len(learning_scores):
        return GateResult(math.nan, math.nan, math.nan, math.nan, min_stream_skill, 0, None)
    s = sum(skills) / len(skills)
    return GateResult(sum(scores) / len(scores), math.nan, sum(chances) / len(chances), s, min_stream_skill, 0,
                      None if math.isnan(s) else bool(s >= min_stream_skill))


def stream_gate(learning_scores: Sequence[Optional[float]], test_labels: Sequence[torch.Tensor], kind: str,
                min_stream_skill: float, context: Optional[dict] = None) -> GateResult:
    """:func:`stream_gate_from_chances` with each experience's chance taken on its test labels."""
    return stream_gate_from_chances(learning_scores, experience_chances(test_labels, kind, context), kind,
                                    min_stream_skill)
