"""Progress of the phases of a stream (each experience's training, each evaluation), on stderr: bars on a
terminal, plain lines in a log (:mod:`ovq_cl.base.progress`)."""
from __future__ import annotations

import ovq_cl.base.avalanche_compat  # noqa: F401  (before avalanche)
from avalanche.core import SupervisedPlugin

from ovq_cl.base.progress import progress


class ProgressPlugin(SupervisedPlugin, supports_distributed=True):
    """One bar (or line) per training experience (minibatches) and one per evaluation (experiences)."""

    run_managed = True      # its state is the run's own (strategies.plugins)

    def __init__(self) -> None:
        super().__init__()
        self._bar = None

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def before_training_epoch(self, strategy, **kwargs):
        self._close()
        self._bar = progress(total=len(strategy.dataloader), unit="minibatches",
                             desc=f"experience {strategy.experience.current_experience}: train")

    def after_training_iteration(self, strategy, **kwargs):
        if self._bar is not None:
            self._bar.update()

    def after_training_exp(self, strategy, **kwargs):
        self._close()

    def before_eval(self, strategy, **kwargs):
        self._close()
        self._bar = progress(total=len(strategy.current_eval_stream), unit="experiences", desc="evaluate")

    def after_eval_exp(self, strategy, **kwargs):
        if self._bar is not None:
            self._bar.update()

    def after_eval(self, strategy, **kwargs):
        self._close()
