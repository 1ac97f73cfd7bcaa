"""EWC, replay and LwF-style distillation, made to work with stateful sequence models.

- ``SequenceEWCPlugin``: Avalanche's EWC, with importances from the sequence loss, each episode from a
  fresh state (an importance is a property of the weights on the experience's data). The diagonal
  Fisher is estimated from **per-sample** gradients, ``F = mean_i (grad loss_i)^2`` over episodes i
  (the empirical Fisher: labels from the data), not from the squared gradient of a minibatch's mean
  loss, which shrinks it by about the batch size (``fisher: minibatch`` keeps that for comparison).
  Under torchrun the ranks share the episodes and sum their squared gradients.
- ``SequenceReplayPlugin``: Avalanche's exemplar buffers (reservoir or experience-balanced); the
  buffer's episodes are mixed into the experience's episodes in a seeded order, so the ordered,
  fixed-lane loader still applies (Avalanche's ReplayPlugin changes the batch size, which would break
  lanes).
- ``LanguageDistillationPlugin``: LwF for language models (Avalanche's LwF assumes classification
  heads): KL between the previous model's and the current model's token distributions at temperature
  tau (MSE between predictions for regression), the previous model starting from the same state as
  the current one.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import ovq_cl.base.avalanche_compat  # noqa: F401
from avalanche.benchmarks.utils import concat_datasets
from avalanche.training.plugins import EWCPlugin
from avalanche.training.storage_policy import ExperienceBalancedBuffer, ReservoirSamplingBuffer
from avalanche.training.utils import zerolike_params_dict

from ovq_cl.base import collate_episodes, scored_mask
from strategies.training import distributed
from strategies.plugins import CheckpointedPlugin
from strategies.evaluation.metrics import sequence_loss


FISHER_ESTIMATES = ("per_sample", "minibatch")


@dataclass(frozen=True)
class EWCOptions:
    """ewc_lambda: weight of the penalty; mode: separate | online; decay_factor: online mode's decay;
    fisher: per_sample (mean of squared per-episode gradients) | minibatch (squared gradient of each
    minibatch's mean loss); fisher_episodes: episodes the estimate uses (0: all of the experience)."""

    ewc_lambda: float = 100.0
    mode: str = "separate"
    decay_factor: Optional[float] = None
    fisher: str = "per_sample"
    fisher_episodes: int = 0

    def __post_init__(self) -> None:
        if self.fisher not in FISHER_ESTIMATES:
            raise ValueError(f"ewc: fisher must be one of {FISHER_ESTIMATES}, got {self.fisher!r}")
        if self.fisher_episodes < 0:
            raise ValueError(f"ewc: fisher_episodes must be >= 0 (0: all), got {self.fisher_episodes}")
        if self.mode not in ("separate", "online"):
            raise ValueError(f"ewc: mode must be 'separate' or 'online', got {self.mode!r}")
        if (self.decay_factor is not None) != (self.mode == "online"):
            raise ValueError("ewc: decay_factor is set exactly when mode is 'online'")
        if self.ewc_lambda < 0:
            raise ValueError(f"ewc: ewc_lambda must be >= 0, got {self.ewc_lambda}")


@dataclass(frozen=True)
class ReplayOptions:
    """mem_size: stored episodes; policy: balanced (equal share per past experience) | reservoir."""

    mem_size: int = 64
    policy: str = "balanced"

    def __post_init__(self) -> None:
        if self.mem_size < 1:
            raise ValueError(f"replay: mem_size must be >= 1, got {self.mem_size}")
        if self.policy not in ("balanced", "reservoir"):
            raise ValueError(f"replay: policy must be 'balanced' or 'reservoir', got {self.policy!r}")


@dataclass(frozen=True)
class LwFOptions:
    """alpha: weight of the distillation term; temperature: tau; positions: all | scored."""

    alpha: float = 1.0
    temperature: float = 2.0
    positions: str = "all"

    def __post_init__(self) -> None:
        if self.positions not in ("all", "scored"):
            raise ValueError(f"lwf: positions must be 'all' or 'scored', got {self.positions!r}")


class SequenceEWCPlugin(EWCPlugin, CheckpointedPlugin, supports_distributed=True):
    """EWC (``mode`` "separate" or "online") on the sequence loss."""

    def state_dict(self) -> Dict[str, Any]:
        return {"saved_params": dict(self.saved_params), "importances": dict(self.importances)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.saved_params.update(state["saved_params"])
        self.importances.update(state["importances"])

    def __init__(self, ewc_lambda: float = 100.0, mode: str = "separate", decay_factor: Optional[float] = None,
                 fisher: str = "per_sample", fisher_episodes: int = 0) -> None:
        super().__init__(ewc_lambda, mode, decay_factor)
        self.fisher, self.fisher_episodes = fisher, fisher_episodes

    def compute_importances(self, model, criterion, optimizer, dataset, device, batch_size, num_workers=0):
        """The diagonal empirical Fisher on ``dataset`` (episodes, each from a fresh state); per sample:
        one episode per backward, F = mean_i g_i^2; minibatch: F = mean_m (mean-loss gradient of m)^2."""
        model.eval()
        importances = zerolike_params_dict(model)
        if self.fisher_episodes:
            dataset = dataset.subset(range(min(self.fisher_episodes, len(dataset))))
        size = 1 if self.fisher == "per_sample" else batch_size
        loader = DataLoader(dataset, batch_size=size, shuffle=False, collate_fn=collate_episodes)
        dp = distributed.active()       # under torchrun: every rank a share of the batches, then the sums
        n = 0
        for index, (x, y, *_) in enumerate(loader):
            if dp is not None and index % dp.world_size != dp.rank:
                continue
            optimizer.zero_grad()
            out, _ = model(x.to(device))
            sequence_loss(out, y.to(device)).backward()
            for (name, p), (name2, imp) in zip(model.named_parameters(), importances.items()):
                assert name == name2
                if p.grad is not None:
                    imp.data += p.grad.detach().pow(2)
            n += 1
        if dp is not None:
            n = int(distributed.all_reduce_sum(torch.tensor([float(n)]))[0])
            for imp in importances.values():
                imp.data = distributed.all_reduce_sum(imp.data)
        for imp in importances.values():
            imp.data /= max(n, 1)
        optimizer.zero_grad()
        model.train()
        return importances


class SequenceReplayPlugin(CheckpointedPlugin, supports_distributed=True):
    """Replays ``mem_size`` stored episodes with every new experience.

    policy: "balanced" (ExperienceBalancedBuffer: equal share per past experience) or "reservoir".
    """

    def __init__(self, mem_size: int = 64, policy: str = "balanced", seed: int = 0) -> None:
        super().__init__()
        if mem_size < 1:
            raise ValueError(f"replay: mem_size must be >= 1, got {mem_size}")
        if policy == "balanced":
            self.storage = ExperienceBalancedBuffer(max_size=mem_size, adaptive_size=True)
        elif policy == "reservoir":
            self.storage = ReservoirSamplingBuffer(max_size=mem_size)
        else:
            raise ValueError(f"replay: policy must be 'balanced' or 'reservoir', got {policy!r}")
        self.seed = seed

    def state_dict(self) -> Dict[str, Any]:
        return {"storage": self.storage}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.storage = state["storage"]

    def after_train_dataset_adaptation(self, strategy, **kwargs):
        buffer = self.storage.buffer
        if len(buffer) == 0:
            return
        merged = concat_datasets([strategy.adapted_dataset, buffer])
        gen = torch.Generator().manual_seed(self.seed * 1009 + strategy.experience.current_experience)
        order = torch.randperm(len(merged), generator=gen).tolist()
        strategy.adapted_dataset = merged.subset(order)

    def after_training_exp(self, strategy, **kwargs):
        self.storage.post_adapt(strategy, strategy.experience)


class LanguageDistillationPlugin(CheckpointedPlugin, supports_distributed=True):
    """Learning without Forgetting for sequence models: ``alpha * tau^2 * KL(p_old || p_new)``."""

    def __init__(self, alpha: float = 1.0, temperature: float = 2.0, positions: str = "all") -> None:
        super().__init__()
        if positions not in ("all", "scored"):
            raise ValueError(f"distillation positions must be 'all' or 'scored', got {positions!r}")
        self.alpha, self.temperature, self.positions = alpha, temperature, positions
        self.old_model: Optional[torch.nn.Module] = None
        self._restored: Optional[Dict[str, torch.Tensor]] = None    # old model's weights from a checkpoint

    def state_dict(self) -> Dict[str, Any]:
        return {"old_model": None if self.old_model is None else self.old_model.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        # the old model is a copy of the strategy's model: built when the strategy is next seen
        self._restored = state["old_model"]

    def before_training_exp(self, strategy, **kwargs):
        if self._restored is not None:
            self._freeze_copy(strategy.model)
            self.old_model.load_state_dict(self._restored)
            self._restored = None

    def _freeze_copy(self, model: torch.nn.Module) -> None:
        self.old_model = copy.deepcopy(model).eval()
        for p in self.old_model.parameters():
            p.requires_grad_(False)

    def before_backward(self, strategy, **kwargs):
        if self.old_model is None or self.alpha == 0:
            return
        from strategies.memory import clone_states

        with torch.no_grad():
            old_out, _ = self.old_model(strategy.mb_x, clone_states(strategy.mb_states_in))
        new_out, y = strategy.mb_output, strategy.mb_y
        if y.is_floating_point():
            strategy.loss = strategy.loss + self.alpha * F.mse_loss(new_out, old_out)
            return
        if self.positions == "scored":
            mask = scored_mask(y)
            new_out, old_out = new_out[mask], old_out[mask]
        else:
            new_out, old_out = new_out.flatten(0, -2), old_out.flatten(0, -2)
        tau = self.temperature
        kl = F.kl_div(F.log_softmax(new_out / tau, -1), F.log_softmax(old_out / tau, -1), log_target=True,
                      reduction="batchmean")
        if self.positions == "scored" and distributed.active() is not None:
            kl = kl * distributed.loss_weight(int(new_out.shape[0]))     # a mean over every rank's answers
        strategy.loss = strategy.loss + self.alpha * tau * tau * kl

    def after_training_exp(self, strategy, **kwargs):
        self._freeze_copy(strategy.model)
