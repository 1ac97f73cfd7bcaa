"""Named registries, and how user code gets into them without editing the package.

Every extension point (mixers, streams, strategies, metrics) is a :class:`Registry`: a name maps to an
entry (a class, a spec). User code registers in one of three ways:

1. calling the registry's ``register_*`` function from Python before building a run;
2. ``ovq-cl ... --plugin my_package.my_module`` (the module registers when imported: :func:`load_plugins`);
3. a Python entry point in the user's own package, in the registry's group (``ovq_cl.mixers``,
   ``ovq_cl.streams``, ``ovq_cl.strategies``, ``ovq_cl.metrics``)::

       [project.entry-points."ovq_cl.mixers"]
       my_mixer = "my_package.mixers"           # a module that registers when imported, or
       my_other = "my_package.mixers:register"  # a function called with no arguments

   Entry points load the first time a registry is asked for a name it does not know.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from importlib import metadata
from typing import Dict, Generic, Iterable, List, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """``name -> entry`` for one kind of extension (``kind``: "mixer", "stream", ...)."""

    def __init__(self, kind: str, entry_point_group: str) -> None:
        self.kind, self.group = kind, entry_point_group
        self._entries: Dict[str, T] = {}
        self._entry_points_loaded = False

    def register(self, name: str, entry: T) -> T:
        """Adds ``entry`` as ``name``. Registering the same entry twice is a no-op; another entry under a
        taken name is a ValueError (silently replacing a built-in would change results)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._entries and self._entries[name] is not entry and self._entries[name] != entry:
            raise ValueError(f"{self.kind} name {name!r} is already registered ({self._entries[name]!r})")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        if name not in self._entries:
            self.load_entry_points()
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {self.names()} (add one with "
                             f"register, `--plugin MODULE`, or an entry point in group {self.group!r})")
        return self._entries[name]

    def __contains__(self, name: str) -> bool:
        if name not in self._entries:
            self.load_entry_points()
        return name in self._entries

    def __iter__(self):
        return iter(self.names())

    def names(self) -> List[str]:
        return sorted(self._entries)

    def items(self):
        return sorted(self._entries.items())

    def registered(self) -> List[T]:
        """The entries in the order they were registered (where order matters: probes run in it)."""
        return list(self._entries.values())

    def load_entry_points(self) -> None:
        """Imports (and, for functions, calls) every entry point of this registry's group, once."""
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in metadata.entry_points(group=self.group):
            obj = ep.load()
            ENTRY_POINT_MODULES.append(ep.module)           # its source is part of a run's code version
            if callable(obj) and not isinstance(obj, type):
                obj()


ENTRY_POINT_MODULES: List[str] = []
"""The modules of the entry points loaded in this process, in load order (``experiments.code_version``
hashes their packages' source into a run's code version)."""


#: the top-level packages of ovq-cl: a plugin module must live outside them
FRAMEWORK_PACKAGES = ("ovq_cl", "streams", "strategies", "experiments", "benchmarks")


def load_plugins(modules: Iterable[str]) -> List[str]:
    """Imports every module named (``package.module``); importing registers what it defines.
    A module that cannot be imported is a ValueError on one line naming it and why: not found (where
    Python looked), a dependency of it not installed, a syntax error (file and line), or what its code
    raised (file and line; the whole traceback is chained for ``--debug``)."""
    loaded = []
    modules = list(modules)
    here = os.getcwd()
    if modules and not ({"", ".", here} & set(sys.path)):
        # the current folder, as `python -m` has it: the `ovq-cl` script alone would not find a plugin
        # module written beside the config. Last, not first: a user's folder named like one of ovq-cl's own
        # packages (a `streams/` beside the config) must not shadow the framework's
        sys.path.append(here)
    for name in modules:
        top = name.split(".", 1)[0]
        if top in FRAMEWORK_PACKAGES:
            raise ValueError(f"--plugin {name}: {top!r} is one of ovq-cl's own packages ({', '.join(FRAMEWORK_PACKAGES)}); "
                             f"put your module in a folder of another name (e.g. my_{top}/) and pass --plugin my_{name}")
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            missing = err.name or ""
            if missing and (name == missing or name.startswith(missing + ".")):
                raise ValueError(f"--plugin {name}: no module {missing!r} found in the current folder or on PYTHONPATH "
                                 f"(current folder {here}, PYTHONPATH={os.environ.get('PYTHONPATH', '')!r})") from err
            raise ValueError(f"--plugin {name}: it imports {missing or err}, which is not installed "
                             f"({err}); install it in this environment") from err
        except SyntaxError as err:
            raise ValueError(f"--plugin {name}: syntax error in {err.filename}, line {err.lineno}: {err.msg}") from err
        except Exception as err:  # noqa: BLE001 - a user's module may raise anything while importing
            where = traceback.extract_tb(err.__traceback__)[-1]
            raise ValueError(f"--plugin {name}: importing it raised {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''} ({where.filename}, line {where.lineno})") from err
        loaded.append(name)
    return loaded
