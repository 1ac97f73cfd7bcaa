"""Running a study: its commands one after the other, then RESULTS.md (``ovq-cl study NAME``).

``--smoke DIR`` runs every command on tiny sizes (:func:`smoke_command`), everything written under DIR:
it checks that a study runs end to end and that the report reads what it wrote, not its numbers.
The specs are :mod:`experiments.study_specs`; the report :mod:`experiments.report`.
"""
from __future__ import annotations

import os
import shlex
import time
from typing import Callable, List, Optional, Sequence, Tuple

from experiments.code_version import code_version
from experiments.report import write_report
from experiments.study_specs import StudySpec, load_study, sweep_name


SMOKE_OVERRIDES = ("meta_train.steps=2", "meta_train.batch_size=4", "gate.episodes=4", "gate.batch_size=4",
                   "gate.delay_episodes=2", "gate.interference_episodes=2", "gate.interference_max_items=2",
                   "gate.position_episodes=1", "progress=false", "tracking.enabled=false")


def smoke_command(argv: List[str], spec: StudySpec, root: str,
                  cut: Callable[[str, list], list] = lambda key, values: values[:1],
                  overrides: Sequence[str] = SMOKE_OVERRIDES) -> List[str]:
    """A study command made tiny for ``--smoke``: every ``--grid`` axis cut to its first value (``cut``:
    another choice, e.g. only the seed axes), the
    spec's ``smoke`` overrides (and its ``smoke_by_config`` ones for the command's config file) and
    :data:`SMOKE_OVERRIDES` (``overrides``: those of the code that will run it) added, its JSON, runs, checkpoints and MLflow
    store under ``root``. It checks that the command parses, every config validates and runs, and the
    report reads what it wrote; it says nothing about the numbers."""
    from experiments.sweep import parse_grid

    config = argv[1] if len(argv) > 1 and argv[0] == "sweep" else None
    extra = [*overrides, *spec.smoke, *spec.smoke_by_config.get(config, []), f"tracking.tracking_uri=sqlite:///{os.path.join(root, 'mlruns.db')}",
             f"checkpoint.dir={os.path.join(root, 'checkpoints')}", f"output_dir={root}"]
    # a grid value is applied after the overrides, so a key the smoke sets is taken out of the axes (e.g. a
    # recipe axis that sets meta_train.steps would otherwise run its full budget on tiny data)
    smoke_keys = {o.split("=", 1)[0].strip() for o in extra}
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--grid":
            ((key, values),) = parse_grid([argv[i + 1]]).items()
            keys = key.split("&")
            keep = [j for j, k in enumerate(keys) if k.strip() not in smoke_keys]
            values = list(dict.fromkeys("&".join(v.split("&")[j] for j in keep) for v in values)) if "&" in key else values
            if keep:
                out += ["--grid", f"{'&'.join(keys[j] for j in keep)}={';'.join(cut(key, values))}"]
            i += 2
        elif a == "--out":
            out += ["--out", os.path.join(root, "results")]
            i += 2
        else:
            out.append(a)
            i += 1
    return out + extra + ["--quiet"]


def sweep_commands(spec: StudySpec) -> List[Tuple[int, List[str]]]:
    """(index, argv) of each ``ovq-cl sweep`` command of the study, argv without the ``ovq-cl`` (so that
    it starts with ``sweep``, as the CLI's parser reads it); other commands (a module of the study's folder, e.g. a search) are skipped."""
    out = []
    for i, command in enumerate(spec.commands):
        argv = shlex.split(command)
        if argv[:2] == ["ovq-cl", "sweep"]:
            out.append((i, argv[1:]))
    return out


def expand_sweep(argv: List[str]) -> list:
    """The RunConfigs a sweep command (argv from :func:`sweep_commands` or :func:`smoke_command`)
    makes, each validated, read by the CLI's own parser."""
    from experiments.arguments import build_parser, parse_args
    from experiments.sweep import expand, parse_grid

    args = parse_args(build_parser(), argv)
    return expand(args.config, args.overrides, parse_grid(args.grid), plugins=args.plugin)


def is_seed_axis(key: str) -> bool:
    """Whether a grid axis (``seed``, or a joint ``a&b`` axis) sets only seeds."""
    from experiments.config import SEED_KEYS

    return all(part.strip() in SEED_KEYS for part in key.split("&"))


def validate_every_config(argv: List[str]) -> None:
    """Builds (validates, runs nothing) every config of a sweep's grid, read by the CLI's own parser: a
    smoke run runs only the first value of each axis, and a typo in another value must still fail it.

    Every combination of the axes that are not seeds, at the first value of the seed axes; then every
    other seed value once, beside the first values of the rest. A seed interacts with no other option
    (it is checked alone: an int >= 0), so this catches what the full product would, at a fraction of
    its cost (validating a config takes ~0.3 s, and a five-seed sweep has five times the configs)."""
    from experiments.arguments import build_parser, parse_args
    from experiments.sweep import expand, parse_grid

    parser = build_parser()
    args = parse_args(parser, ["sweep", *argv])
    grid = parse_grid(args.grid)
    seeds = [k for k in grid if is_seed_axis(k)]
    expand(args.config, args.overrides, {k: (v[:1] if k in seeds else v) for k, v in grid.items()}, plugins=args.plugin)
    for axis in seeds:
        if len(grid[axis]) > 1:
            expand(args.config, args.overrides, {k: (v[1:] if k == axis else v[:1]) for k, v in grid.items()},
                   plugins=args.plugin)


# a number of bytes: a smoke run at one budget exercises the same commands as at another (the sizes, hence
# e.g. whether OVQ's dictionary fills in a full-size run, do differ: the real runs cover that)
SIZE_KEYS = ("model.state_budget",)


def _is_size(key: str, values) -> bool:
    """A setting that only sizes the model (a byte budget given as a number, not null)."""
    return key.strip() in SIZE_KEYS and all(str(v).strip().isdigit() for v in values)


def smoke_repeats(spec: StudySpec) -> List[int]:
    """The indices of the study's sweep commands that a smoke run would run exactly as an earlier one
    but for their seeds, names and numeric state budgets (e.g. a budget's seeds split over five
    commands, or the same sweep at two budgets): their configs are still validated, but one of them is
    enough to run on tiny sizes."""
    from experiments.sweep import parse_grid

    seen, repeats = set(), []
    for i, argv in sweep_commands(spec):
        shape, j = [], 1
        while j < len(argv):
            if argv[j] in ("--name", "--out"):
                j += 2
                continue
            if argv[j] == "--grid":
                ((key, values),) = parse_grid([argv[j + 1]]).items()
                shape.append(("grid", key) if is_seed_axis(key) or _is_size(key, values) else argv[j + 1])
                j += 2
                continue
            key, eq, value = argv[j].partition("=")
            shape.append(("set", key) if eq and _is_size(key, [value]) else argv[j])
            j += 1
        if tuple(shape) in seen:
            repeats.append(i)
        seen.add(tuple(shape))
    return repeats


def pinned_elsewhere(spec: StudySpec, version: str) -> List[Tuple[int, str, str, str]]:
    """(command index, sweep name, pinned version, commit) of every command of ``spec`` pinned (its
    ``code``) to a code version other than ``version``."""
    out = []
    for i, command in enumerate(spec.commands):
        argv = shlex.split(command)
        if argv[:2] != ["ovq-cl", "sweep"]:          # pins are about runs: only sweeps make them
            continue
        name = sweep_name(argv)
        pin = spec.code.get(name) if name in spec.code else spec.code.get("*")
        if pin:
            pinned, commit = pin.split("@")
            if pinned != version:
                out.append((i, name or "", pinned, commit))
    return out


def run_study(name: str, execute: Callable[[List[str]], int], smoke: Optional[str] = None,
              skip_pinned: bool = False) -> int:
    """Runs every command of the study (each an ``ovq-cl ...`` line), then rewrites RESULTS.md.

    ``smoke``: a folder; every command made tiny (:func:`smoke_command`), everything written under it
    (its RESULTS.md included), the project's results untouched. Searches are skipped in a smoke run
    (they have their own test). ``execute`` runs one command's arguments (the CLI passes its own
    ``main``: this module sits below the CLI). Beyond one process, and for pinned sweeps, a study's runs
    go through :mod:`experiments.piece_runs` (``ovq-cl study NAME --backend ray``)."""
    spec = load_study(name)
    started = time.perf_counter()
    repeats = set(smoke_repeats(spec)) if smoke else set()
    # a sweep pinned to other code (its runs pair with runs that code made) is refused before anything runs;
    # a smoke run checks the commands, not their numbers, so it runs them all with this code
    elsewhere = {} if smoke else {i: (n, v, c) for i, n, v, c in pinned_elsewhere(spec, code_version())}
    if elsewhere and not skip_pinned:
        listed = "; ".join(f"{n} from {v} (commit {c})" for n, v, c in elsewhere.values())
        raise ValueError(f"study {name}: this checkout is {code_version()}, and these sweeps must run from other code: "
                         f"{listed}. Run each from a worktree of its commit (git worktree add ../ovq-cl-COMMIT COMMIT), "
                         "with its own .venv (make install), and run `ovq-cl study NAME --backend ray` here: it runs "
                         "each of the study's runs from its pinned checkout and merges it; or pass --skip-pinned to run the others")
    for i, command in enumerate(spec.commands):
        if i in elsewhere:
            n, v, c = elsewhere[i]
            print(f"(pinned to {v}, commit {c}: skipped here) $ {command}", flush=True)
            continue
        argv = shlex.split(command)
        own = f"experiments.studies.{spec.name}."      # a module of the study's own folder (e.g. a search)
        searched = argv[:2] == ["python", "-m"] and len(argv) > 2 and argv[2].startswith(own)
        if argv[0] != "ovq-cl" and not searched:
            raise ValueError(f"study {name}: commands must start with 'ovq-cl' or "
                             f"'python -m {own}', got {command!r}")
        if smoke and searched:
            print(f"(smoke: search skipped) $ {command}", flush=True)
            continue
        print(f"$ {command}", flush=True)
        if searched:
            import importlib

            code = importlib.import_module(argv[2]).main(argv[3:])
        else:
            if smoke and argv[1] == "sweep":
                validate_every_config(argv[2:])
            if i in repeats:
                print("(smoke: validated; runs as an earlier command but for its seeds or byte budget, not run again)", flush=True)
                continue
            args = smoke_command(argv[1:], spec, smoke) if smoke else argv[1:]
            code = execute(args)
        if code:
            print(f"study {name}: {command!r} exited with {code}")
            return code
    print(f"study {name}: {time.perf_counter() - started:.0f} s wall", flush=True)
    if smoke:
        write_report(os.path.join(smoke, "RESULTS.md"), root=smoke, only=name)
    else:
        write_report()
    return 0
