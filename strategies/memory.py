"""Persistent layer memory across minibatches and experiences, as an Avalanche plugin.

The strategy keeps ``strategy.states`` (one state per block, None = fresh) and hands it to the model
on every minibatch; this plugin decides what the next minibatch starts from:

- ``persist``: the state carries on for the whole stream (lane b continues lane b: the training loader
  is ordered and keeps a fixed batch size), detached between minibatches (truncated BPTT);
- ``reset_experience``: carried within an experience, fresh at the start of each one;
- ``reset_episode``: fresh on every minibatch (each lane holds one episode per minibatch), in
  evaluation too.

Evaluation never changes the carried state: every eval minibatch starts from a copy of the state as
it was when evaluation began (sliced to the minibatch's lanes), so test episodes cannot see each
other's answers either.
"""
from __future__ import annotations

from typing import List, Optional

import ovq_cl.base.avalanche_compat  # noqa: F401
from avalanche.core import SupervisedPlugin

from ovq_cl.state import MixerState

POLICIES = ("persist", "reset_experience", "reset_episode")


def select_lanes(states: Optional[List[Optional[MixerState]]], n: int):
    """The first n lanes of every state (None stays None)."""
    if states is None:
        return None
    return [None if s is None else s._map(lambda t: t[:n]) for s in states]


def clone_states(states):
    return None if states is None else [None if s is None else s.clone() for s in states]


def detach_states(states):
    return None if states is None else [None if s is None else s.detach() for s in states]


class PersistentMemoryPlugin(SupervisedPlugin, supports_distributed=True):
    """Carries ``strategy.states`` according to ``policy`` (see the module docstring)."""

    run_managed = True      # its state is the run's own (strategies.plugins)

    def __init__(self, policy: str = "persist") -> None:
        super().__init__()
        if policy not in POLICIES:
            raise ValueError(f"memory policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self._carried = None

    def before_training_exp(self, strategy, **kwargs):
        if self.policy == "reset_experience":
            strategy.states = None

    def before_training_iteration(self, strategy, **kwargs):
        if self.policy == "reset_episode":
            strategy.states = None

    def after_training_iteration(self, strategy, **kwargs):
        strategy.states = detach_states(strategy.new_states)

    def before_eval(self, strategy, **kwargs):
        self._carried = strategy.states

    def before_eval_iteration(self, strategy, **kwargs):
        if self.policy == "reset_episode":          # every episode, test episodes included, starts fresh
            strategy.states = None
            return
        strategy.states = select_lanes(clone_states(self._carried), strategy.mb_x.shape[0])

    def after_eval(self, strategy, **kwargs):
        strategy.states = self._carried
        self._carried = None
