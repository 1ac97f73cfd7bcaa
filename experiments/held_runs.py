"""Which runs of a study's sweeps its result files already hold: a run is held by a record with its label,
every value its command sets and its pinned code version (a key the record does not log at its absent
value). Read by ``ovq-cl pieces`` (:mod:`experiments.pieces`: the runs still to make) and by the report
(:func:`experiments.report.unfinished_sweeps`: a sweep whose runs another sweep of the study made is
finished); a module of its own so that the report does not import the pieces (which import the study
runner, which imports the report).
"""
from __future__ import annotations

import itertools
import os
from typing import Dict, List, Optional, Sequence

from experiments.study_specs import StudySpec, sweep_name


def record_held(records: List[dict], label: str, wanted: Dict[str, str], code: Optional[str]) -> bool:
    """Whether a record (of ``code``, when given) has ``label`` and every value of ``wanted`` (flattened
    params; a key the record does not log has its absent value, ``compare.ABSENT_VALUES``, as the run's
    identity reads it: no retention loss logged is 0.0)."""
    from experiments.compare import ABSENT_VALUES
    from experiments.tracking.params import flatten_config

    for d in records:
        if not isinstance(d, dict) or not isinstance(d.get("params"), dict) or d.get("label") != label:
            continue
        if code is not None and d.get("code_version") != code:
            continue
        params = flatten_config(d["params"])
        if all(params.get(k, ABSENT_VALUES.get(k)) == v for k, v in wanted.items()):
            return True
    return False


def read_records(path: str) -> List[dict]:
    """The run records of a sweep's JSON ([] when it does not exist yet; :func:`experiments.records.load_records`)."""
    from experiments.records import load_records

    return load_records(path)


def sweep_held(spec: StudySpec, root: str, argv: Sequence[str]) -> bool:
    """Whether every run of one of ``spec``'s sweep commands (``argv`` without ``ovq-cl``) is held by a
    record in one of the study's declared result files, as :func:`study_pieces` reads a run held (its
    label, every value the command sets, its pinned code version): a run that two of a study's sweeps
    reach is run once, as the first command's piece, and merged into that sweep's file, so the other
    sweep's own file may never be written."""
    from experiments.arguments import build_parser, parse_args
    from experiments.sweep import parse_grid

    args = parse_args(build_parser(), list(argv))
    records = [d for f in dict.fromkeys(os.path.normpath(f) for f in spec.results) for d in read_records(os.path.join(root, f))]
    name = sweep_name(argv)
    pins = getattr(spec, "code", None) or {}      # a spec without pins: a record of any code holds a run
    pin = pins.get(name) if name in pins else pins.get("*")
    code = pin.split("@")[0] if pin else None
    return all(record_held(records, cfg.label(), wanted, code) for _, cfg, wanted in sweep_runs(args, root, list(parse_grid(args.grid))))


def sweep_runs(args, root: str, walk: Sequence[str]):
    """Each run of a parsed sweep command, its grid walked in ``walk``'s axis order (the slowest first):
    (its axis values, its config, every value its command sets as the run's record logs it)."""
    from experiments.sweep import _assignments, expand, parse_grid
    from experiments.tracking.params import flatten_config

    grid = parse_grid(args.grid)
    axes = list(grid)
    set_keys = [o.split("=", 1)[0].strip() for o in args.overrides if "=" in o]   # what the command sets
    for chosen in itertools.product(*(grid[k] for k in walk)):
        values = dict(zip(walk, chosen))
        (cfg,) = expand(os.path.join(root, args.config), args.overrides, {k: [values[k]] for k in axes},
                        plugins=getattr(args, "plugin", []))
        flat = flatten_config(cfg)
        keys = set_keys + [a.split("=", 1)[0] for k in axes for a in _assignments(k, values[k])]
        yield values, cfg, {k: flat[k] for k in keys if k in flat}
