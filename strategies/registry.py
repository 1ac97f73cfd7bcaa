"""The strategy registry: a strategy is a name, an options dataclass, and the plugins it adds.

    @dataclass(frozen=True)
    class AnchorOptions:
        strength: float = 0.1

    register_strategy("anchor", AnchorOptions, plugins=lambda options, seed: [AnchorPlugin(options.strength)])

Every strategy streams the experiences through :class:`~strategies.sequence.SequenceTemplate` with the
persistent-memory plugin first and its own plugins after; ``trains_weights=False`` uses
:class:`~strategies.sequence.FrozenWeights` instead (no optimizer). Options come from the run config's
``strategy.options`` and are validated against the dataclass before anything runs. Plugins that keep
state across a resume subclass :class:`~strategies.plugins.CheckpointedPlugin`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from ovq_cl.base import Registry, validate
from strategies.memory import PersistentMemoryPlugin
from strategies.regularizers import (
    EWCOptions, LanguageDistillationPlugin, LwFOptions, ReplayOptions, SequenceEWCPlugin, SequenceReplayPlugin,
)
from strategies.sequence import FrozenWeights, SequenceTemplate


@dataclass(frozen=True)
class NoOptions:
    """A strategy without options."""


@dataclass(frozen=True)
class StrategySpec:
    options_type: type
    plugins: Callable[[Any, int], List[Any]]
    trains_weights: bool = True


STRATEGIES: Registry[StrategySpec] = Registry("strategy", "ovq_cl.strategies")


def register_strategy(name: str, options_type: type = NoOptions,
                      plugins: Optional[Callable[[Any, int], List[Any]]] = None,
                      trains_weights: bool = True) -> StrategySpec:
    """``plugins(options, seed) -> [plugin, ...]`` builds the strategy's plugins for one run."""
    return STRATEGIES.register(name, StrategySpec(options_type, plugins or (lambda options, seed: []), trains_weights))


def strategy_options(name: str, user: Any = None):
    """The options of strategy ``name``: ``user`` validated against its dataclass, defaults filled in."""
    return validate(STRATEGIES.get(name).options_type, dict(user or {}), f"strategy {name!r} options")


def build_strategy(name: str, options: Any, *, model: torch.nn.Module, memory_policy: str, lr: float,
                   train_mb_size: int, epochs: int, grad_clip: Optional[float], evaluator, seed: int,
                   extra_plugins: Sequence[Any] = (), device="cpu") -> Tuple[SequenceTemplate, Optional[torch.optim.Optimizer]]:
    """The Avalanche template of a run and its optimizer (None when the weights are frozen)."""
    spec = STRATEGIES.get(name)
    options = strategy_options(name, options)
    plugins = [PersistentMemoryPlugin(memory_policy), *spec.plugins(options, seed), *extra_plugins]
    common = dict(train_mb_size=train_mb_size, train_epochs=epochs, evaluator=evaluator, plugins=plugins, device=device)
    if not spec.trains_weights:
        frozen = {"minibatches_per_forward": options.minibatches_per_forward} if isinstance(options, FrozenOptions) else {}
        return FrozenWeights(model=model, memory_policy=memory_policy, **frozen, **common), None
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    return SequenceTemplate(model=model, optimizer=optimizer, grad_clip=grad_clip, **common), optimizer


@dataclass(frozen=True)
class FrozenOptions:
    """minibatches_per_forward: training minibatches streamed in one forward (a speed knob for long
    streams; :class:`~strategies.sequence.FrozenWeights`)."""

    minibatches_per_forward: int = 1


register_strategy("frozen", FrozenOptions, trains_weights=False)
register_strategy("naive")
register_strategy("ewc", EWCOptions, lambda o, seed: [SequenceEWCPlugin(o.ewc_lambda, o.mode, o.decay_factor,
                                                                         o.fisher, o.fisher_episodes)])
register_strategy("replay", ReplayOptions, lambda o, seed: [SequenceReplayPlugin(o.mem_size, o.policy, seed)])
register_strategy("lwf", LwFOptions, lambda o, seed: [LanguageDistillationPlugin(o.alpha, o.temperature, o.positions)])
