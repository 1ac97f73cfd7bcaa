"""Progress bars (tqdm, on stderr) for the phases of a stream: each experience's training, each evaluation."""
from __future__ import annotations

import ovq_cl.base.avalanche_compat  # noqa: F401  (before avalanche)
from avalanche.core import SupervisedPlugin
from tqdm import tqdm


class ProgressPlugin(SupervisedPlugin, supports_distributed=True):
    """One bar per training experience (minibatches) and one per evaluation (experiences)."""

    def __init__(self) -> None:
        super().__init__()
        self._bar = None

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def before_training_epoch(self, strategy, **kwargs):
        self._close()
        self._bar = tqdm(total=len(strategy.dataloader), leave=False,
                         desc=f"experience {strategy.experience.current_experience}: train")

    def after_training_iteration(self, strategy, **kwargs):
        if self._bar is not None:
            self._bar.update()

    def after_training_exp(self, strategy, **kwargs):
        self._close()

    def before_eval(self, strategy, **kwargs):
        self._close()
        self._bar = tqdm(total=len(strategy.current_eval_stream), leave=False, desc="evaluate")

    def after_eval_exp(self, strategy, **kwargs):
        if self._bar is not None:
            self._bar.update()

    def after_eval(self, strategy, **kwargs):
        self._close()
