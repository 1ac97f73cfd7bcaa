"""The result matrix R[j][i] as an Avalanche plugin metric, and the size and statistics of a run's state.

Scores themselves (the metric registry, the loss, SequenceScore) are in :mod:`strategies.evaluation.metrics`.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import ovq_cl.base.avalanche_compat  # noqa: F401  (before avalanche)
from avalanche.evaluation import PluginMetric
from avalanche.evaluation.metric_results import MetricValue
from avalanche.evaluation.metric_utils import get_metric_name

from ovq_cl.base import scored_mask
from strategies.evaluation.metrics import SequenceScore


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
      predicted with the new value (``updated``) and with the value of experience i (``stale``), and
      among the answers whose label did not change (``unchanged[j][i]`` of them) the fraction correct
      (``kept``): for i < j, how much of what did not change the memory still holds (retention apart
      from updating, the two axes of a stability-plasticity frontier).

    An evaluation of any other stream (e.g. the train stream) or before any training fills nothing.
    """

    def __init__(self, kind: str, n_experiences: int, labels_in_force: Optional[Callable] = None,
                 stream_name: str = "test", context: Optional[dict] = None) -> None:
        super().__init__()
        self.kind, self.n, self.stream_name = kind, n_experiences, stream_name
        self.labels_in_force = labels_in_force
        self.score = SequenceScore(kind, context)
        self.current = SequenceScore(kind, context)
        self._changed = [0, 0, 0]                      # answers whose label changed, of them updated, stale
        self._unchanged = [0, 0]                       # answers whose label did not change, of them correct
        self.R = self._empty()
        self.R_se, self.R_n = self._empty(), self._empty()
        self.R_current, self.R_current_se = self._empty(), self._empty()
        self.updated, self.stale, self.changed = self._empty(), self._empty(), self._empty()
        self.kept, self.unchanged = self._empty(), self._empty()
        self.trained: int = 0

    def _empty(self) -> List[List[Optional[float]]]:
        return [[None] * self.n for _ in range(self.n)]

    MATRICES = ("R", "R_se", "R_n", "R_current", "R_current_se", "updated", "stale", "changed", "kept", "unchanged")

    def reset(self) -> None:
        self.score.reset()
        self.current.reset()
        self._changed = [0, 0, 0]
        self._unchanged = [0, 0]

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
            same = scored_mask(y_cpu) & (y_now == y_cpu)
            self._unchanged[0] += int(same.sum())
            self._unchanged[1] += int((same & (pred == y_cpu)).sum())

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
                n, ok = self._unchanged
                self.unchanged[j][i] = n
                self.kept[j][i] = ok / n if n else None
        name = get_metric_name(f"{self.kind}_Exp", strategy, add_experience=True)
        return [MetricValue(self, name, value, strategy.clock.train_iterations)]

    def changed_fractions(self, j: int) -> Dict[str, float]:
        """Over the cells of row j, the answers whose fact changed since they were learned, and the share
        of them the model gave with the new value (updated) or the old one (stale); with them, over the
        earlier experiences' cells (i < j), the share of the answers whose fact did not change that are
        still correct (retained); {} if no fact changed."""
        n = sum(self.changed[j][i] or 0 for i in range(j + 1))
        if not n:
            return {}
        up = sum((self.updated[j][i] or 0) * (self.changed[j][i] or 0) for i in range(j + 1))
        st = sum((self.stale[j][i] or 0) * (self.changed[j][i] or 0) for i in range(j + 1))
        out = {"changed_answers": n, "updated_fraction": up / n, "stale_fraction": st / n}
        same = sum(self.unchanged[j][i] or 0 for i in range(j))
        if same:
            out["retained_fraction"] = sum((self.kept[j][i] or 0) * (self.unchanged[j][i] or 0) for i in range(j)) / same
        return out

    def state_dict(self) -> Dict:
        return {**{m: getattr(self, m) for m in self.MATRICES}, "trained": self.trained}

    def load_state_dict(self, d: Dict) -> None:
        for m in self.MATRICES:
            if m in d:
                setattr(self, m, [list(row) for row in d[m]])
        self.trained = int(d["trained"])

    def __str__(self) -> str:
        return f"{self.kind}_Exp"


def n_parameters(model) -> int:
    """Trainable and frozen parameters, each tensor counted once (tied weights once). Buffers the layers
    learn from data (VQ's codebook and its EMA statistics) are not parameters to torch; they are counted
    apart (:func:`n_learned_buffers`) and shown beside."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def n_learned_buffers(model) -> int:
    """Numbers in the buffers every mixer learns from data (``Mixer.learned_buffers``)."""
    return sum(m.learned_buffer_numel() for m in getattr(model, "mixers", []))


def shared_memory_bytes(model) -> List[int]:
    """Per layer: bytes of the memory about the data a layer shares by all lanes (``Mixer.shared_memory_nbytes``:
    VQ's codebook), kept outside the per-lane state."""
    return [int(m.shared_memory_nbytes()) for m in getattr(model, "mixers", [])]


def state_metrics(model, states) -> Dict[str, float]:
    """State bytes per layer and lane (``state_bytes/layerK``), and each mixer's own statistics of its
    state (e.g. OVQ's ``active_slots/layerK``, ``count_entropy/layerK``)."""
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
