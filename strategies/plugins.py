"""Plugins that carry state across a checkpoint, as Lightning callbacks do.

A plugin whose state must survive a resume (EWC's importances, the replay buffer, LwF's old model, a
user's plugin) subclasses :class:`CheckpointedPlugin` and implements ``state_dict`` /
``load_state_dict``; the runner saves and restores every such plugin of a strategy, by position and
class name, with no list of known plugin types.

Any other plugin of the strategy (Avalanche's own: Synaptic Intelligence, MAS, GEM, LwF, ...; a user's)
is saved by its instance attributes (``vars``), pickled when the checkpoint is written, and restored into
the new run's plugin of the same position and class, so that a resumed run goes on with its importances,
memories and old models as the uninterrupted run does. A plugin whose attributes cannot be pickled
(a lambda, an open file) is named: the checkpoint records it, and a resume says in one line that its state
restarts (:func:`unsaved_plugins`). Plugins whose state the run keeps itself (``run_managed = True``: the
carried memory, progress bars; the evaluation, clock and periodic-evaluation plugins Avalanche's template
adds) are left out, so that a harmless setting changed on a resume (progress bars on) keeps the positions.
"""
from __future__ import annotations

import pickle
from typing import Any, Dict, List

from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.clock import Clock
from avalanche.training.templates.base_sgd import PeriodicEval

#: plugins Avalanche's template adds to every strategy itself, whose state the run keeps (the evaluation's
#: results) or rebuilds (the clock, periodic evaluation), as it did before stock plugins were saved
TEMPLATE_PLUGINS = (EvaluationPlugin, Clock, PeriodicEval)

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


#: the key of a plugin's saved attributes (a plugin that is not a CheckpointedPlugin), and of one whose
#: attributes could not be pickled (its state restarts on a resume)
ATTRIBUTES, UNSAVED = "__attributes__", "__unsaved__"


def _saved(plugin: Any) -> bool:
    """Whether the checkpoint carries this plugin's state (the run's own plugins keep theirs elsewhere)."""
    return not (getattr(plugin, "run_managed", False) or isinstance(plugin, TEMPLATE_PLUGINS))


def plugin_states(plugins: List[Any]) -> Dict[str, Dict[str, Any]]:
    """The state of every plugin in ``plugins`` (a strategy's) that the run does not keep itself, keyed by
    position and class: a CheckpointedPlugin's ``state_dict()``, any other's attributes, or, where those
    cannot be pickled, ``{UNSAVED: reason}``."""
    states = {}
    for i, p in enumerate(plugins):
        if isinstance(p, CheckpointedPlugin):
            states[_key(i, p)] = p.state_dict()
        elif _saved(p):
            attributes = dict(vars(p))
            try:
                pickle.dumps(attributes)
            except Exception as err:  # noqa: BLE001 - any pickling failure: the plugin is named, not saved
                states[_key(i, p)] = {UNSAVED: f"{type(err).__name__}: {str(err)[:200]}"}
            else:
                states[_key(i, p)] = {ATTRIBUTES: attributes}
    return states


def unsaved_plugins(states: Dict[str, Dict[str, Any]]) -> Dict[str, str]:
    """{plugin key: why} for the plugins a checkpoint could not save (their state restarts on a resume)."""
    return {key: state[UNSAVED] for key, state in states.items() if UNSAVED in state}


def load_plugin_states(plugins: List[Any], states: Dict[str, Dict[str, Any]]) -> None:
    """Restores what :func:`plugin_states` saved; a saved state with no matching plugin is an error
    (the checkpoint belongs to another strategy). A plugin saved as ``UNSAVED`` keeps its fresh state."""
    expected = {_key(i, p): p for i, p in enumerate(plugins) if isinstance(p, CheckpointedPlugin) or _saved(p)}
    unknown = sorted(set(states) - set(expected))
    if unknown:
        raise ValueError(f"checkpoint holds plugin states {unknown} that this strategy does not have "
                         f"({sorted(expected)})")
    for key, state in states.items():
        if isinstance(expected[key], CheckpointedPlugin):
            expected[key].load_state_dict(state)
        elif ATTRIBUTES in state:
            vars(expected[key]).update(state[ATTRIBUTES])
