"""A study's missing runs as one command each (``ovq-cl pieces NAME``), to run in lanes and merge back.

A long study outlives a session on a machine whose disk and processes do not: its runs go one at a
time, each as a sweep of one configuration, from the checkout its ``code:`` pins (a frozen commit,
whose sweeps may predate reading their own records back), and each finished run's JSON is merged into
the study's file (``ovq-cl merge``) as soon as it is written. This module writes those commands: for
every sweep command of the study, every grid combination whose run the sweep's JSON does not hold yet,
as the same command with every ``--grid`` axis cut to that combination's value and its own ``--name``.

Cutting the axes leaves the base config, the overrides and the axis order as they were, so a piece's
run has the resolved config (``config_id``) that the whole sweep would have given it, and its record
merges into the study's file as that run (:func:`experiments.sweep.merge_record_files`).

``--check DIR`` (:func:`check_pieces`) runs one piece of each configuration on tiny sizes from its pinned
checkout first, so that a configuration no smoke run took fails in seconds, not an hour into its run.
:mod:`experiments.piece_runs` runs the pieces (``ovq-cl study NAME --backend ray``).

A run is "held" when a record of any of the study's files (a sweep's runs may have been finished by
another sweep of the study, e.g. the seeds a crashed sweep left, run under a joint axis), of the code
version the sweep is pinned to (any version, unpinned), has the run's label (stream, mixers,
strategy, memory policy, seed) and every value the command sets (its overrides and the combination's
axes) as its params say. The values the runner resolves (the vocabulary, the data seed) are not
compared: the command never sets them; nor are the base config's defaults, which later code may
change under a record of frozen code.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from experiments.held_runs import read_records, record_held, sweep_runs
from experiments.study_specs import StudySpec, sweep_name

ORDERS = ("sweep", "seed-outer")


@dataclass(frozen=True)
class Piece:
    """One run of a study as a command: ``argv`` starts with ``sweep`` (as the CLI reads it); ``commit``
    and ``code`` are the sweep's pin (None when unpinned); ``study_file`` is the JSON its record is merged
    into; ``piece_file`` the JSON the piece writes (relative to the checkout it runs in)."""

    argv: Tuple[str, ...]
    label: str
    study_file: str
    piece_file: str
    code: Optional[str] = None
    commit: Optional[str] = None
    minutes: Optional[int] = None       # its expected wall time (:func:`expected_minutes`), None when unknown

    def line(self) -> str:
        """``COMMIT<TAB>STUDY_FILE<TAB>PIECE_FILE<TAB>ovq-cl sweep ... # ~M min`` (``-`` for an unpinned
        sweep; the comment when its wall time can be expected): what ``ovq-cl pieces`` prints. The
        estimate is a shell comment, so the command runs as it is, pasted into a shell."""
        command = shlex.join(["ovq-cl", *self.argv]) + (f"  # ~{self.minutes} min" if self.minutes else "")
        return "\t".join([self.commit or "-", self.study_file, self.piece_file, command])


def expected_minutes(records: List[dict], label: str, wanted: Dict[str, str]) -> Optional[int]:
    """The longest wall time (minutes, rounded up) of the finished runs of the same configuration but for
    its seeds and its test-time options (the label but its seed; every value of ``wanted``, flattened
    params as strings, but the seed keys and ``after_meta.*``: runs that differ there share one
    meta-training, so whichever of them ran first paid for it, and this one may be first); else the
    longest of the runs of the same label but its seed (the same mixers and stream, another recipe); None
    when no record says. The longest, not the mean: on a machine wiped at a stop a run cut off is lost
    whole, and a run that meta-trains alone takes longer than one that shares it."""
    import math
    import re

    from experiments.config import SEED_KEYS
    from experiments.tracking.params import flatten_config

    def unseeded(text: str) -> str:
        return re.sub(r"-s\d+$", "", text)

    same_mixers, same_config = [], []
    for d in records:
        if not isinstance(d, dict) or d.get("wall_seconds") is None or unseeded(str(d.get("label"))) != unseeded(label):
            continue
        same_mixers.append(float(d["wall_seconds"]))
        params = flatten_config(d["params"]) if isinstance(d.get("params"), dict) else {}
        if all(params.get(k) == v for k, v in wanted.items() if k not in SEED_KEYS and not k.startswith("after_meta.")):
            same_config.append(float(d["wall_seconds"]))
    walls = same_config or same_mixers
    return math.ceil(max(walls) / 60) if walls else None


def _file(out: str, name: str) -> str:
    """The JSON a sweep named ``name`` writes with ``--out out``."""
    return os.path.normpath(os.path.join(out, name + ".json"))


def _cut(argv: Sequence[str], values: Dict[str, str], name: str) -> List[str]:
    """``argv`` with each ``--grid AXIS=...`` cut to ``AXIS=values[AXIS]`` and ``--name`` set to ``name``
    (added when the command had none); every other argument in place."""
    from experiments.sweep import parse_grid

    out, i, named = [], 0, False
    argv = list(argv)
    while i < len(argv):
        a = argv[i]
        if a == "--grid" or a.startswith("--grid="):
            item = argv[i + 1] if a == "--grid" else a.split("=", 1)[1]
            ((key, _),) = parse_grid([item]).items()
            out += ["--grid", f"{key}={values[key]}"]
            i += 2 if a == "--grid" else 1
        elif a == "--name" or a.startswith("--name="):
            out += ["--name", name]
            named = True
            i += 2 if a == "--name" else 1
        else:
            out.append(a)
            i += 1
    return out if named else out + ["--name", name]


def study_pieces(spec: StudySpec, root: str, order: str = "sweep", include_held: bool = False) -> List[Piece]:
    """The runs of ``spec``'s sweep commands that their JSON (under ``root``) does not hold, one
    :class:`Piece` each, in each sweep's grid order, sweeps in the study's order (``order="seed-outer"``:
    the seed axes vary slowest, across the study's sweeps too, so that the pairs of a paired comparison
    complete early: every sweep's runs of the first seed, then of the next; a run that
    two commands reach (the same resolved config and pin) is one piece, the first command's).
    ``include_held``: every run, held or not. Each piece is validated (its config built) here."""
    from experiments.arguments import build_parser, parse_args
    from experiments.study import is_seed_axis, sweep_commands
    from experiments.sweep import parse_grid

    if order not in ORDERS:
        raise ValueError(f"pieces: order must be one of {ORDERS}, got {order!r}")
    parser = build_parser()
    commands = [(argv, parse_args(parser, argv)) for _, argv in sweep_commands(spec)]
    files = dict.fromkeys([_file(a.out, a.name) for _, a in commands]
                          + [os.path.normpath(f) for f in spec.results])
    records = [d for f in files for d in read_records(os.path.join(root, f))]
    pieces: List[Piece] = []
    seeds: List[Tuple] = []        # each piece's seed values (order="seed-outer" sorts on them)
    taken = set()
    # a run is one resolved config under one pin: two commands that both reach it (a later command that
    # reruns what an earlier sweep never ran, as a study may add after a stop) give it one piece, the first
    queued = set()
    for argv, args in commands:
        grid = parse_grid(args.grid)
        name = sweep_name(argv)
        pin = spec.code.get(name) if name in spec.code else spec.code.get("*")
        code, commit = pin.split("@") if pin else (None, None)
        study_file = _file(args.out, args.name)
        axes = list(grid)
        walk = ([k for k in axes if is_seed_axis(k)] + [k for k in axes if not is_seed_axis(k)]
                if order == "seed-outer" else axes)
        for values, cfg, wanted in sweep_runs(args, root, walk):
            label = cfg.label()
            if not include_held and record_held(records, label, wanted, code):
                continue
            run_key = (commit, cfg.identity())
            if run_key in queued:
                continue
            queued.add(run_key)
            piece_name, k = f"{args.name}__{label}", 1
            while _file(args.out, piece_name) in taken:      # two runs of one label: a file each
                k += 1
                piece_name = f"{args.name}__{label}__{k}"
            taken.add(_file(args.out, piece_name))
            pieces.append(Piece(argv=tuple(_cut(argv, values, piece_name)), label=label, study_file=study_file,
                                piece_file=_file(args.out, piece_name), code=code, commit=commit,
                                minutes=expected_minutes(records, label, wanted)))
            seeds.append(tuple(str(values[k]) for k in walk if is_seed_axis(k)))
    if order == "seed-outer":       # across sweeps: a stable sort keeps each seed's runs in the study's order
        by_seed = sorted(range(len(pieces)), key=lambda i: tuple(_numeric(v) for v in seeds[i]))
        pieces = [pieces[i] for i in by_seed]
    return pieces


def _numeric(value: str) -> Tuple[int, float, str]:
    """A sort key that puts seed 10 after seed 9 (numbers by value, anything else after, by its text)."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def _unseeded(argv: Sequence[str]) -> Tuple[str, ...]:
    """``argv`` without its seed axes and its ``--name``: what two pieces that differ only by seed share."""
    from experiments.study import is_seed_axis
    from experiments.sweep import parse_grid

    out, i, argv = [], 0, list(argv)
    while i < len(argv):
        a = argv[i]
        if a in ("--grid", "--name"):
            if a == "--grid" and not is_seed_axis(next(iter(parse_grid([argv[i + 1]])))):
                out += argv[i:i + 2]
            i += 2
        else:
            out.append(a)
            i += 1
    return tuple(out)


def one_per_configuration(pieces: Sequence[Piece]) -> List[Piece]:
    """The first piece of each configuration (pieces that differ only by their seeds run the same code
    paths at tiny sizes), in the pieces' order."""
    first: Dict[Tuple, Piece] = {}
    for p in pieces:
        first.setdefault((p.commit, _unseeded(p.argv)), p)
    return list(first.values())


@dataclass(frozen=True)
class Check:
    """A piece run on tiny sizes: its exit status (0: ran end to end), wall seconds, its log file and, when
    it failed, the log's last line."""

    piece: Piece
    returncode: int
    seconds: float
    log: str
    last_line: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def checkout_of(commit: Optional[str], project_dir: str) -> str:
    """The folder a piece pinned to ``commit`` runs in: ``../ovq-cl-COMMIT`` beside the project (what
    :mod:`experiments.piece_runs` runs it in), the project itself for an unpinned one (None)."""
    if commit is None:
        return project_dir
    return os.path.normpath(os.path.join(project_dir, "..", f"ovq-cl-{commit}"))


def program_of(commit: Optional[str], project_dir: str) -> List[str]:
    """The ``ovq-cl`` a piece runs with: its pinned checkout's own (``.venv/bin/ovq-cl``), or this
    interpreter's for an unpinned one (whatever environment this checkout was installed into)."""
    if commit is None:
        return [sys.executable, "-m", "experiments.cli"]
    return [os.path.join(checkout_of(commit, project_dir), ".venv", "bin", "ovq-cl")]


def smoke_overrides_of(checkout: str) -> Tuple[str, ...]:
    """The tiny sizes the code of a checkout makes its smoke runs with (its ``SMOKE_OVERRIDES``): a frozen
    commit may predate a key this code sets (e.g. a probe added since), which its config would refuse."""
    import subprocess

    python = os.path.join(checkout, ".venv", "bin", "python")
    # experiments.study holds them; code older than that module kept them in experiments.report
    read = ("import json\ntry:\n    from experiments.study import SMOKE_OVERRIDES as o\nexcept ImportError:\n"
            "    from experiments.report import SMOKE_OVERRIDES as o\nprint(json.dumps(list(o)))")
    out = subprocess.run([python, "-c", read], cwd=checkout, capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        raise ValueError(f"pieces --check: cannot read the smoke sizes of the code in {checkout}: "
                         f"{(out.stderr.strip().splitlines() or ['(no output)'])[-1]}")
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def check_pieces(pieces: Sequence[Piece], spec: StudySpec, project_dir: str, root: str,
                 announce=print) -> List[Check]:
    """Runs one piece of each configuration (:func:`one_per_configuration`) on tiny sizes, as ``ovq-cl
    study --smoke`` makes a command tiny (:func:`experiments.study.smoke_command`), from the checkout it is
    pinned to (its own ``.venv``; the code that will make its real run), one thread, everything written
    under ``root`` (logs in ``root/logs``), at the tiny sizes that checkout's own smoke runs use
    (:func:`smoke_overrides_of`) and the study spec's ``smoke`` overrides. A study's smoke test runs only the first value of each grid
    axis, with this code; this runs every configuration still to run, with the code that will run it, so
    that a path no smoke run took (another mixer on that stream, a probe only it meets) fails in seconds
    here rather than after an hour of meta-training.

    Before anything runs, a pinned piece whose checkout (or its ``.venv``) is missing is a ValueError."""
    import subprocess
    import time

    from experiments.study import smoke_command

    from experiments.study import SMOKE_OVERRIDES

    chosen = one_per_configuration(pieces)
    commits = {p.commit for p in chosen if p.commit is not None}
    for commit in sorted(commits):
        checkout = checkout_of(commit, project_dir)
        if not os.access(os.path.join(checkout, ".venv", "bin", "ovq-cl"), os.X_OK):
            raise ValueError(f"pieces --check: no checkout of {commit} with its .venv at {checkout}: "
                             f"git worktree add ../ovq-cl-{commit} {commit} && make -C ../ovq-cl-{commit} install")
    # each checkout's own sizes, read once per commit (a subprocess importing that code)
    sizes = {None: SMOKE_OVERRIDES, **{c: smoke_overrides_of(checkout_of(c, project_dir)) for c in commits}}
    root = os.path.abspath(root)
    os.makedirs(os.path.join(root, "logs"), exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    checks = []
    for p in chosen:
        checkout = checkout_of(p.commit, project_dir)
        program = program_of(p.commit, project_dir)
        argv = smoke_command(list(p.argv), spec, root, overrides=sizes[p.commit])
        log = os.path.join(root, "logs", os.path.basename(p.piece_file)[:-len(".json")] + ".log")
        start = time.monotonic()
        with open(log, "w") as fh:
            rc = subprocess.run([*program, *argv], cwd=checkout, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
        lines = [line.strip() for line in open(log, errors="replace") if line.strip()]
        check = Check(piece=p, returncode=rc, seconds=time.monotonic() - start, log=log,
                      last_line="" if rc == 0 else (lines[-1] if lines else "(no output)"))
        where = f" [{p.commit}]" if p.commit else ""
        announce(f"ovq-cl: pieces --check: ok ({check.seconds:.0f} s) {p.label}{where}" if check.ok else
                 f"ovq-cl: pieces --check: FAILED (exit {rc}, {check.seconds:.0f} s) {p.label}{where}: {check.last_line} (log: {log})")
        checks.append(check)
    return checks
