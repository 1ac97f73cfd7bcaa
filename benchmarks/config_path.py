"""Where a run's config travels: every function of the project that receives it, for one small run.

    python -m benchmarks.config_path                       # the table: files, functions, climbs
    python -m benchmarks.config_path --list                # and every function, by file

A run of ``experiments/configs/icr_frozen.yaml`` at toy sizes (a temporary store and folder) is traced
with ``sys.setprofile``; a *stop* is a call of a project function (``ovq_cl``, ``streams``,
``strategies``, ``experiments``) with an argument that is the run's config, one of its sections (an instance of a
class of ``experiments.config`` or ``ovq_cl.config``: ``RunConfig``, ``StreamSection``, ``ModelConfig``,
...), a dataclass carrying it in a field ``config`` (the runner's ``ResolvedRun``), or a container read
from one of those (an options dict, the list of layers: the same object, by identity).
A *climb* is a stop whose caller sits in a lower layer than the callee (``ovq_cl`` < ``streams``,
``strategies`` < ``experiments``): a lower layer calling back up. The numbers describe the code's
structure, not its speed: they are the same on any machine.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = {"ovq_cl": 0, "streams": 1, "strategies": 1, "experiments": 2}
CONFIG_MODULES = ("experiments.config", "ovq_cl.config")


def _layer(path: str):
    rel = os.path.relpath(path, ROOT)
    top = rel.split(os.sep, 1)[0]
    return (LAYERS[top], rel) if top in LAYERS and not rel.startswith("..") else (None, rel)


def _is_config(value) -> bool:
    """The config, a section of it, or a dataclass that carries it in a field ``config`` (the runner's
    ``ResolvedRun``, a ``RunResult``): all count as the config travelling."""
    if type(value).__module__ in CONFIG_MODULES:
        return True
    fields = getattr(type(value), "__dataclass_fields__", {})
    return "config" in fields and type(getattr(value, "config", None)).__module__ in CONFIG_MODULES


def _parts(value, out: set, depth: int = 0) -> None:
    """The ids of the containers reachable from ``value`` (dataclass fields, dict values, list items):
    the option dicts and lists of a config, which travel on their own once read from it."""
    if depth > 6 or id(value) in out:
        return
    fields = getattr(type(value), "__dataclass_fields__", None)
    if fields is not None:
        children = [getattr(value, f, None) for f in fields]
    elif isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, (list, tuple)):
        children = list(value)
    else:
        return
    if depth:
        out.add(id(value))
    for child in children:
        _parts(child, out, depth + 1)


def trace(overrides):
    """(stops, climbs): {file: set of functions}, [(caller, callee)] for one run with ``overrides``."""
    from experiments.config import run_config
    from experiments.runner import run

    stops, climbs, parts = defaultdict(set), [], set()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        layer, rel = _layer(code.co_filename)
        if layer is None:
            return
        n = code.co_argcount + code.co_kwonlyargcount
        args = [frame.f_locals.get(name) for name in code.co_varnames[:n]]
        configs = [a for a in args if _is_config(a)]
        for a in configs:                    # what the config holds travels with it from here on
            _parts(a if type(a).__module__ in CONFIG_MODULES else a.config, parts)
        if not configs and not any(a is not None and id(a) in parts for a in args):
            return
        name = f"{code.co_name}:{code.co_firstlineno}"
        stops[rel].add(name)
        caller = frame.f_back
        if caller is not None:
            c_layer, c_rel = _layer(caller.f_code.co_filename)
            if c_layer is not None and c_layer < layer:
                climbs.append((f"{c_rel}:{caller.f_code.co_name}", f"{rel}:{name}"))

    cfg = run_config(os.path.join(ROOT, "experiments/configs/icr_frozen.yaml"), overrides)
    sys.setprofile(profile)
    try:
        run(cfg, rerun=True, announce=lambda m: None)
    finally:
        sys.setprofile(None)
    return stops, climbs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="every function, by file")
    args = p.parse_args(argv)
    out = tempfile.mkdtemp(prefix="config_path_")
    overrides = [f"output_dir={out}", f"tracking.tracking_uri=sqlite:///{out}/mlruns.db", "meta_train.steps=2",
                 "gate.episodes=8", "gate.delay_episodes=0", "model.d_model=32", "model.n_layers=1",
                 "stream.options.train_episodes=16", "stream.options.test_episodes=8",
                 "stream.options.n_experiences=2"]
    stops, climbs = trace(overrides)
    n_stops = sum(len(v) for v in stops.values())
    print(f"config stops: {n_stops} functions in {len(stops)} files; climbs (a lower layer calling up): {len(climbs)}")
    if args.list:
        for rel in sorted(stops):
            print(f"  {rel}: {', '.join(sorted(stops[rel]))}")
        for caller, callee in climbs:
            print(f"  climb: {caller} -> {callee}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
