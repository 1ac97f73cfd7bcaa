"""Plugins that carry state across a checkpoint, as Lightning callbacks do.

A plugin whose state must survive a resume (EWC's importances, the replay buffer, LwF's old model, a
user's plugin) subclasses :class:`CheckpointedPlugin` and implements ``state_dict`` /
``load_state_dict``; the runner saves and restores every such plugin of a strategy, by position and
class name, with no list of known plugin types.
"""
from __future__ import annotations

from typing import Any, Dict, List

import ovq_cl.base.avalanche_compat  # noqa: F401  (before avalanche)
from avalanche.core import SupervisedPlugin


class CheckpointedPlugin(SupervisedPlugin):
    """An Avalanche plugin with ``state_dict()`` -> picklable dict and ``load_state_dict(d)``."""

    def state_dict(self) -> Dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        raise NotImplementedError


def _key(index: int, plugin: Any) -> str:
    return f"{index}.{type(plugin).__name__}"


def plugin_states(plugins: List[Any]) -> Dict[str, Dict[str, Any]]:
    """The state of every CheckpointedPlugin in ``plugins`` (a strategy's), keyed by position and class."""
    return {_key(i, p): p.state_dict() for i, p in enumerate(plugins) if isinstance(p, CheckpointedPlugin)}


def load_plugin_states(plugins: List[Any], states: Dict[str, Dict[str, Any]]) -> None:
    """Restores what :func:`plugin_states` saved; a saved state with no matching plugin is an error
    (the checkpoint belongs to another strategy)."""
    expected = {_key(i, p): p for i, p in enumerate(plugins) if isinstance(p, CheckpointedPlugin)}
    unknown = sorted(set(states) - set(expected))
    if unknown:
        raise ValueError(f"checkpoint holds plugin states {unknown} that this strategy does not have "
                         f"({sorted(expected)})")
    for key, state in states.items():
        expected[key].load_state_dict(state)
