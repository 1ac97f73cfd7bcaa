"""The sequence-aware Avalanche template: models with a state, token-level loss on scored positions.

``SequenceTemplate`` is Avalanche's ``SupervisedTemplate`` with three changes:

- forward threads a per-block state: ``out, new_states = model(x, strategy.states)``; what the next
  minibatch starts from is decided by :class:`~strategies.memory.PersistentMemoryPlugin` (without it
  every minibatch starts fresh);
- the loss is cross-entropy over scored tokens (labels != -100) or MSE over scored regression targets
  (not NaN), plus the model's auxiliary loss (VQ's commitment) in training;
- loaders are ordered, with a fixed batch size (lane b of minibatch m+1 continues lane b of
  minibatch m); training drops a last partial batch so that lanes never change.

``FrozenWeights`` streams experiences with no weight update: only the layers' own memory learns.

Under torchrun (``strategies.training.distributed``) each rank takes its block of the lanes of every minibatch
(its own carried state), weights its loss by its share of the answers and averages the gradients; in
evaluation the outputs of every rank's lanes are gathered, so metrics see the whole minibatch.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.utils.data import DataLoader

import ovq_cl.base.avalanche_compat  # noqa: F401
from avalanche.training.templates import SupervisedTemplate

from ovq_cl.base import collate_episodes
from strategies.training import distributed
from strategies.evaluation.metrics import sequence_loss
from strategies.training.step import clip_gradients, n_answers, training_objective


class SequenceTemplate(SupervisedTemplate):
    """Naive fine-tuning of a stateful sequence model (add plugins for EWC, replay, distillation).

    model: ``out, states = model(x, states)`` with x [B, T] tokens or [B, T, d_in] vectors.
    grad_clip: max gradient norm (None: no clipping).
    """

    def __init__(self, *, model=None, optimizer=None, train_mb_size: int = 8, eval_mb_size: Optional[int] = None,
                 train_epochs: int = 1, grad_clip: Optional[float] = 1.0, plugins: Optional[Sequence] = None,
                 evaluator=None, device="cpu", **kwargs) -> None:
        extra = {} if evaluator is None else {"evaluator": evaluator}
        super().__init__(
            model=model, optimizer=optimizer, criterion=sequence_loss, train_mb_size=train_mb_size,
            train_epochs=train_epochs, eval_mb_size=eval_mb_size or train_mb_size, device=device,
            plugins=list(plugins or []), **extra, **kwargs,
        )
        self.grad_clip = grad_clip
        self.states = None          # what the next minibatch starts from
        self.new_states = None      # what the last forward returned
        self.mb_states_in = None    # what the last forward started from (for distillation)
        self.tokens_streamed = 0    # training tokens per lane so far
        self._whole_mbatch = None   # under torchrun: the minibatch of every rank's lanes

    # ------------------------------------------------------------------------------- data loading
    def make_train_dataloader(self, num_workers=0, shuffle=False, pin_memory=None, persistent_workers=False,
                              drop_last=True, **kwargs):
        if len(self.adapted_dataset) < self.train_mb_size:
            raise ValueError(
                f"experience {self.experience.current_experience} has {len(self.adapted_dataset)} episodes, "
                f"fewer than train_mb_size={self.train_mb_size} lanes"
            )
        self.dataloader = DataLoader(self.adapted_dataset, batch_size=self.train_mb_size, shuffle=False,
                                     drop_last=True, collate_fn=collate_episodes, num_workers=num_workers)

    def make_eval_dataloader(self, num_workers=0, shuffle=False, pin_memory=None, persistent_workers=False,
                             **kwargs):
        self.dataloader = DataLoader(self.adapted_dataset, batch_size=self.eval_mb_size, shuffle=False,
                                     collate_fn=collate_episodes, num_workers=num_workers)

    def make_optimizer(self, **kwargs):
        """Keeps the optimizer as built (our models never grow parameters). Avalanche's default re-maps
        the parameters on the first experience a strategy sees, which would drop a restored
        optimizer state on resume."""

    # -------------------------------------------------------------------------------- the step
    def _unpack_minibatch(self):
        super()._unpack_minibatch()
        self._whole_mbatch = None
        dp = distributed.active()
        if dp is not None:               # this rank's lanes (row b of a minibatch is lane b)
            self._whole_mbatch = self.mbatch
            lo, hi = dp.lane_range(self.mbatch[0].shape[0], self.train_mb_size)
            self.mbatch = [t[lo:hi] for t in self.mbatch]

    def forward(self):
        self.mb_states_in = self.states
        if self._whole_mbatch is None or self.is_training:
            out, self.new_states = self.model(self.mb_x, self.states)
            return out
        # evaluation under torchrun: this rank's lanes (a last partial minibatch may leave it none),
        # then every rank's outputs, so that the metrics score the whole minibatch on every rank
        out = None
        if self.mb_x.shape[0]:
            out, self.new_states = self.model(self.mb_x, self.states)
        self.mbatch = self._whole_mbatch
        return distributed.gather_rows(out)

    def criterion(self):
        if not self.is_training:
            return sequence_loss(self.mb_output, self.mb_y)
        return training_objective(self.model, self.mb_output, self.mb_y,
                                  where=f"at experience {self.experience.current_experience}, "
                                        f"iteration {self.clock.train_exp_iterations}",
                                  weight=distributed.loss_weight(n_answers(self.mb_y))
                                  if distributed.active() is not None else 1.0)

    def backward(self):
        super().backward()
        distributed.average_gradients(self.model)
        clip_gradients(self.model, self.grad_clip)

    def _after_training_iteration(self, **kwargs):
        self.tokens_streamed += int(self.mb_x.shape[1])
        super()._after_training_iteration(**kwargs)


class _ConcatenatedLoader:
    """Groups ``k`` consecutive minibatches of an ordered loader into one, concatenated along time:
    lane b of the group is lane b's k episodes in a row, the same tokens in the same order (the last
    group may be shorter). x, y: [B, k * T, ...]; task labels: the first minibatch's."""

    def __init__(self, loader: DataLoader, k: int) -> None:
        self.loader, self.k = loader, k

    def __len__(self) -> int:
        return -(-len(self.loader) // self.k)

    def __iter__(self):
        group = []
        for batch in self.loader:
            group.append(batch)
            if len(group) == self.k:
                yield self._join(group)
                group = []
        if group:
            yield self._join(group)

    @staticmethod
    def _join(group):
        x = torch.cat([b[0] for b in group], 1)
        y = torch.cat([b[1] for b in group], 1)
        return (x, y, *group[0][2:])


class FrozenWeights(SequenceTemplate):
    """Streams the experiences through the model with no weight update (and VQ codebooks fixed):
    forward only, in eval mode, under no_grad. Only the layers' persistent memory changes.

    ``minibatches_per_forward`` k > 1 streams k consecutive training minibatches in one forward (each
    lane's episodes in a row): the same tokens in the same order, so with a carried state (memory
    policy persist or reset_experience) the same numbers up to the float tolerance of one call against
    split calls, with k times fewer Python iterations: long streams run faster. Not with
    reset_episode (each episode must start fresh)."""

    def __init__(self, *, model, minibatches_per_forward: int = 1, memory_policy: str = "persist", **kwargs) -> None:
        if minibatches_per_forward < 1:
            raise ValueError(f"frozen: minibatches_per_forward must be >= 1, got {minibatches_per_forward}")
        if minibatches_per_forward > 1 and memory_policy == "reset_episode":
            raise ValueError("frozen: minibatches_per_forward > 1 joins episodes into one forward, which "
                             "memory policy reset_episode (a fresh state per episode) forbids")
        dummy = torch.optim.SGD([torch.nn.Parameter(torch.zeros(()))], lr=0.0)
        super().__init__(model=model, optimizer=dummy, **kwargs)
        self.minibatches_per_forward = minibatches_per_forward

    def make_train_dataloader(self, *args, **kwargs):
        super().make_train_dataloader(*args, **kwargs)
        if self.minibatches_per_forward > 1:
            self.dataloader = _ConcatenatedLoader(self.dataloader, self.minibatches_per_forward)

    def forward(self):
        self.model.eval()
        with torch.no_grad():
            return super().forward()

    def criterion(self):
        with torch.no_grad():
            return sequence_loss(self.mb_output, self.mb_y)

    def backward(self):
        pass

    def optimizer_step(self):
        pass
