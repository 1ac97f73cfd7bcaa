"""The Avalanche logger that forwards every scalar metric to a RunTracker (imports Avalanche: load lazily)."""
from __future__ import annotations

import logging
from typing import Any, List, Mapping, Tuple

import ovq_cl.base.avalanche_compat  # noqa: F401  (before any avalanche import)
from avalanche.evaluation.metric_results import AlternativeValues
from avalanche.logging import BaseLogger

from experiments.tracking.params import _scalar
from experiments.tracking.runs import RunTracker

log = logging.getLogger(__name__)


class MLflowLogger(BaseLogger):
    """An Avalanche logger that forwards every scalar metric value to a :class:`RunTracker`.

    Each ``MetricValue`` becomes an MLflow metric named as in Avalanche (e.g.
    ``Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp001``; sanitised only if MLflow would
    reject it) with ``step = x_plot`` (Avalanche's x_plot is the strategy clock's training
    iteration count). Dict values become ``name/key`` metrics (as in Avalanche's base logger);
    ``AlternativeValues`` give their first numeric alternative. Values that are not a single
    number (images, figures, tensors with more than one element) are skipped; their names are
    collected in :attr:`skipped`. All values of one callback go in one batched request.

    Usage: ``EvaluationPlugin(accuracy_metrics(experience=True), loggers=[MLflowLogger(tracker)])``
    inside ``with tracker:``.
    """

    def __init__(self, tracker: RunTracker, prefix: str = ""):
        super().__init__()
        self.tracker, self.prefix = tracker, prefix
        self.skipped: set = set()

    def _triples(self, name: str, value: Any, x_plot: Any) -> List[Tuple[str, float, int]]:
        if isinstance(value, AlternativeValues):
            value = next((a for a in value.alternatives if _scalar(a) is not None), None)
        if isinstance(value, Mapping):
            return [t for k, v in value.items() for t in self._triples(f"{name}/{k}", v, x_plot)]
        v = _scalar(value)
        if v is None:
            if name not in self.skipped:
                log.debug("MLflowLogger: skipping non-scalar metric %s (%s)", name, type(value).__name__)
                self.skipped.add(name)
            return []
        return [(self.prefix + name, v, 0 if x_plot is None else int(x_plot))]

    def log_single_metric(self, name, value, x_plot) -> None:
        self.tracker.log_metric_values(self._triples(name, value, x_plot))

    def log_metrics(self, metric_values) -> None:
        triples = [t for mv in metric_values for t in self._triples(mv.name, mv.value, mv.x_plot)]
        if triples:
            self.tracker.log_metric_values(triples)
