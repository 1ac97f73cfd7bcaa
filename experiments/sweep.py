"""Sweeps as code: a base config times a grid of overrides, under one parent MLflow run (one child run
per configuration), run one after the other (``backend="serial"``, the default) or as parallel Ray
tasks (``backend="ray"``: a local Ray started for the sweep, or an existing cluster at
``ray_address``; ``pip install 'ovq-cl[ray]'``)."""
from __future__ import annotations

import contextlib
import itertools
import os
import traceback
from typing import Dict, List, Optional, Sequence, Tuple

from experiments.config import RunConfig, run_config
from experiments.records import load_records, write_records


def expand(base, overrides: Sequence[str], grid: Dict[str, List[str]], plugins: Sequence[str] = ()) -> List[RunConfig]:
    """Every combination of the grid's values (each a dotlist value string) on top of base + overrides.

    expand("experiments/configs/icr_frozen.yaml", [], {"model.layers": ["[ovq]", "[full]"], "seed": ["0", "1"]})
    -> 4 RunConfigs.

    Keys that must change together form one axis: ``"a&b": ["1&32", "8&4"]`` sets a=1, b=32, then a=8, b=4.
    """
    keys = list(grid)
    configs = []
    for values in itertools.product(*(grid[k] for k in keys)):
        configs.append(run_config(base, list(overrides) + [o for k, v in zip(keys, values) for o in _assignments(k, v)],
                                  plugins=plugins))
    return configs


def _assignments(key: str, value: str) -> List[str]:
    """``"a&b", "1&2"`` -> ``["a=1", "b=2"]``; a plain key -> ``["key=value"]``."""
    if "&" not in key:
        return [f"{key}={value}"]
    keys, values = key.split("&"), value.split("&")
    if len(keys) != len(values):
        raise ValueError(f"grid axis {key!r}: value {value!r} has {len(values)} parts for {len(keys)} keys")
    return [f"{k.strip()}={v.strip()}" for k, v in zip(keys, values)]


def parse_grid(items: Sequence[str]) -> Dict[str, List[str]]:
    """["model.layers=[ovq];[full]", "seed=0;1;2"] -> {"model.layers": ["[ovq]", "[full]"], "seed": ["0", "1", "2"]}.
    Joint axes: "a&b=1&32;8&4" (the values of a and b change together)."""
    grid: Dict[str, List[str]] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"grid entry {item!r} is not KEY=V1;V2;...")
        key, values = item.split("=", 1)
        grid[key.strip()] = [v.strip() for v in values.split(";") if v.strip()]
        if not grid[key.strip()]:
            raise ValueError(f"grid entry {item!r} has no values")
        for v in grid[key.strip()]:
            _assignments(key.strip(), v)                 # a joint axis with a wrong number of parts fails here
    return grid


BACKENDS = ("serial", "ray")


def unequal_state(configs: Sequence[RunConfig], tolerance: float = 0.25) -> Optional[str]:
    """One line when the sweep's mixers carry state of unequal size (bytes per layer and lane on the stream,
    after ``after_meta``, as ``ovq_cl.layers.budget`` counts it; the largest more than ``tolerance`` above
    the smallest): a comparison of memories that is silently unfair (e.g. OVQ at a pinned 128 slots against
    Gated DeltaNet's default heads, 16x fewer bytes). Mixers whose state grows with the context (full
    attention) are named, not compared; a sweep whose every config sets ``model.state_budget`` is sized to
    it (as close as each knob allows) and says nothing. None when fair."""
    from ovq_cl.layers import build_mixer
    from ovq_cl.layers.budget import state_bytes

    if all(cfg.model.state_budget is not None for cfg in configs):
        return None
    fixed: Dict[str, int] = {}
    growing = set()
    for cfg in configs:
        model = cfg.stream_model().resolved()
        for name in dict.fromkeys(model.layers):
            mixer = build_mixer(name, model.d_model, model.n_heads, model.mixers[name])
            if mixer.state_nbytes(4096) != mixer.state_nbytes(1024):
                growing.add(name)
            else:
                label = "+".join(model.layers)
                fixed[label] = max(fixed.get(label, 0), state_bytes(name, model.d_model, model.n_heads, model.mixers[name]))
    if len(fixed) < 2 or max(fixed.values()) <= (1 + tolerance) * min(fixed.values()):
        return None
    sizes = ", ".join(f"{label} {b:,} B" for label, b in sorted(fixed.items(), key=lambda kv: -kv[1]))
    grows = f" ({', '.join(sorted(growing))}: grows with the context)" if growing else ""
    return (f"ovq-cl: warning: the mixers compared carry unequal state per layer and lane: {sizes}{grows}; "
            "model.state_budget=BYTES sizes every mixer to the same bytes (a knob the config pins is freed by "
            "model.mixers.NAME.KNOB=null)")


def check_backend(backend: str, ray_address: Optional[str] = None, trial_cpus: float = 1, trial_gpus: float = 0) -> None:
    """One clear line before anything runs: a known backend, sane resources, Ray importable when asked."""
    if backend not in BACKENDS:
        raise ValueError(f"sweep: backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "ray" and (ray_address or trial_gpus):
        raise ValueError("sweep: --ray-address and --trial-gpus need --backend ray")
    if not trial_cpus > 0 or trial_gpus < 0:
        raise ValueError(f"sweep: --trial-cpus must be > 0 and --trial-gpus >= 0, got {trial_cpus}, {trial_gpus}")
    if backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError("sweep: --backend ray needs Ray: pip install 'ovq-cl[ray]'") from None


def run_sweep(configs: List[RunConfig], name: str, tracking_uri: Optional[str] = None, experiment: Optional[str] = None,
              grid: Optional[Dict[str, List[str]]] = None, out: Optional[str] = None, rerun: bool = False,
              announce=print, backend: str = "serial", ray_address: Optional[str] = None, trial_cpus: float = 1,
              trial_gpus: float = 0, show=print, quiet: bool = False, base: Optional[Tuple[str, Sequence[str]]] = None):
    """Runs every config under one parent MLflow run; a failed run is reported and the sweep goes on.

    The parent logs the grid as params and, with ``out``, the comparison table, the run records (JSON)
    and the forgetting-curve plot as artifacts (also written to ``out``); the JSON is rewritten after
    every finished run, so a sweep killed midway leaves the records of the runs it finished. Finished
    identical runs are reused, never re-parented (only the runs a sweep starts are its children), and so
    are the runs the JSON of ``out`` already records with this resolved config and code version (a
    machine without the store or the checkpoints, e.g. a fresh clone, does not run them again;
    ``rerun`` runs them). Prints one line per run with the time so far and an estimate of the time
    left. Returns (results, failures): the runs read from records first, then the others, each in the
    order of ``configs`` whatever the backend. ``announce`` receives the messages (the CLI: stderr, or
    nothing under ``--quiet``), ``show`` the comparison table (the CLI: stdout, quiet or not);
    ``quiet``: Ray's trials and start-up say nothing either.

    ``backend="ray"``: each config is a Ray task with ``trial_cpus`` CPUs and ``trial_gpus`` GPUs
    (:mod:`experiments.ray_backend`), run as a child of the same parent; a trial that fails or whose
    process dies is retried once, then reported as failed.
    """
    check_backend(backend, ray_address, trial_cpus, trial_gpus)
    import time

    from experiments import compare
    from experiments.run_lock import RunInUse
    from experiments.runner import run
    from experiments.tracking import SweepTracker

    all_configs = list(configs)
    experiment = experiment or (configs[0].tracking.experiment if configs else "ovq-cl")
    results, failures = [], []
    started = time.perf_counter()
    json_path = os.path.join(out, f"{name}.json") if out else None
    # the run identities of this sweep (resolved: a record's config_id is its resolved config's), so that the
    # JSON keeps the records of another process's runs of it; and the runs the JSON already records with
    # this code version are finished: on a machine without the store or checkpoints (a fresh clone of the
    # results) they are read back, not run again
    ours, from_records = _identities_and_records(configs, json_path, rerun, announce) if out else (set(), {})
    found = [from_records[i] for i in sorted(from_records)]
    configs = [c for i, c in enumerate(configs) if i not in from_records]
    # a sweep whose every run its records already hold runs nothing: no new, empty parent run in MLflow
    opened = (SweepTracker(experiment, name, tracking_uri or (all_configs[0].tracking.tracking_uri if all_configs else None))
              if configs or not found else contextlib.nullcontext(None))
    with opened as parent:
        if parent is not None:
            parent.set_tags({"n_runs": len(all_configs)})
            # what makes the sweep again from MLflow alone: its base config (path and content), overrides, grid
            sweep_of = {"grid": {k: list(v) for k, v in (grid or {}).items()}}
            if base is not None:
                sweep_of.update(config=str(base[0]), overrides=list(base[1]))
            if grid or base is not None:
                parent.log_config(sweep_of, filename="sweep.yaml")
            if base is not None and os.path.isfile(str(base[0])):
                with open(str(base[0])) as fh:
                    parent.log_text(fh.read(), os.path.basename(str(base[0])))
        if backend == "ray":
            from experiments.ray_backend import run_on_ray

            for cfg in configs:
                cfg.tracking.experiment = experiment
            results, failures = run_on_ray(
                configs, parent.run_id, rerun=rerun, announce=announce, address=ray_address, cpus=trial_cpus,
                quiet=quiet,
                gpus=trial_gpus, on_result=(lambda done: _write_records(found + done, json_path, ours))
                if out else None)
        for n, cfg in enumerate(configs if backend == "serial" else [], 1):
            cfg.tracking.experiment = experiment
            outcome = "done"
            try:
                results.append(run(cfg, parent_run_id=parent.run_id, rerun=rerun, announce=announce))
                if out:                 # the records so far: a sweep killed later keeps what it finished
                    _write_records(found + results, json_path, ours)
            except RunInUse as err:   # another process runs it: skipped here, said in one line
                failures.append((cfg.label(), f"skipped: {err}"))
                outcome = "SKIPPED (in use by another process)"
            except Exception as err:  # one broken configuration must not lose the others
                failures.append((cfg.label(), f"{type(err).__name__}: {err}"))
                traceback.print_exc()
                outcome = "FAILED"
            spent = time.perf_counter() - started
            announce(f"[{n}/{len(configs)}] {cfg.label()} {outcome}"
                     f"; {spent:.0f} s so far, about {spent / n * (len(configs) - n):.0f} s left")
        results = found + results
        if parent is not None:
            parent.set_tags({"n_failed": len(failures), "n_from_records": len(found)})
        if out and results:
            os.makedirs(out, exist_ok=True)
            records = [compare.record_from_result(r) for r in results]
            paths = {"table": os.path.join(out, f"{name}.md"), "json": os.path.join(out, f"{name}.json"),
                     "plot": os.path.join(out, f"{name}.png")}
            text = compare.table(results)
            with open(paths["table"], "w") as fh:
                fh.write(text + "\n")
            _write_records(results, paths["json"], ours)
            compare.curves_plot(records, paths["plot"], name)
            if parent is not None:
                for path in paths.values():
                    parent.client.log_artifact(parent.run_id, path)
            show(text)
            announce(f"table, records and plot: {', '.join(paths.values())}"
                     + (f" (also artifacts of MLflow run {parent.run_id})" if parent is not None
                        else " (every run read from the sweep's records: no new MLflow run)"))
    return results, failures


def merge_record_files(out: str, inputs: Sequence[str]) -> Tuple[int, int]:
    """The run records of ``out`` (if it exists) and of every file of ``inputs``, in that order, written to
    ``out`` atomically, under the lock sweeps write it with: e.g. a sweep finished in pieces (on several
    machines, or restricted to the runs a fresh machine had no record of) back into the one file its
    study lists. A run is one identity, its ``config_id`` with its ``code_version``: a repeat is kept once
    (the first), and a repeat whose results differ is refused with nothing written (two different results
    can't both be that run's). Returns (records written, repeats dropped)."""
    from filelock import FileLock

    merged, seen, dropped = [], {}, 0
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with FileLock(f"{out}.lock"):
        for path in ([out] if os.path.exists(out) else []) + list(inputs):
            try:
                records = load_records(path, missing_ok=False)
            except ValueError as err:
                raise ValueError(f"merge: {err}") from err
            for record in records:
                if "config_id" not in record or "params" not in record:
                    raise ValueError(f"merge: {path} holds an entry that is not a run record (no config_id or params)")
                identity = (record["config_id"], record.get("code_version"))
                if identity in seen:
                    if _result_of(seen[identity]) != _result_of(record):
                        raise ValueError(f"merge: run {record.get('label')} ({identity[0]}, {identity[1]}) has two "
                                         f"different records (one in {path}); nothing written")
                    dropped += 1
                    continue
                seen[identity] = record
                merged.append(record)
        write_records(out, merged)
    return len(merged), dropped


#: params a run's identity leaves out (``RunConfig.identity``): where it logs and checkpoints, how it shows
#: progress, when it saves: two records of one run may differ there
_NOT_IDENTITY = ("tracking.", "checkpoint.", "output_dir", "progress", "device", "meta_train.checkpoint_every")


def _result_of(record: dict) -> dict:
    """A record less what says where, when, how long and in how many attempts it ran, and less the params
    its identity leaves out (one run reused elsewhere, resumed, or run with another tracking store or
    progress setting, differs there)."""
    kept = {k: v for k, v in record.items()
            if k not in ("run_id", "artifact_uri", "wall_seconds", "attempts", "provenance")}
    if isinstance(kept.get("params"), dict):
        kept["params"] = {k: v for k, v in kept["params"].items() if not k.startswith(_NOT_IDENTITY)}
    return kept


def _identities_and_records(configs, path: str, rerun: bool, announce):
    """(the resolved run identities of ``configs``, {index: RecordedResult} of the configs whose finished
    run the records at ``path`` hold with this code version; none with ``rerun``). A config that does not
    resolve here (e.g. a GPU only the Ray workers have) is left to its run, which says why if it fails."""
    from experiments.run_result import RecordedResult
    from experiments.runner import resolve

    recorded = {}
    if not rerun and os.path.exists(path):
        try:
            recorded = {(d.get("config_id"), d.get("code_version")): d for d in load_records(path)}
        except (OSError, ValueError):       # a file this code did not write: rewritten from the runs
            recorded = {}
    ours, found = set(), {}
    for i, cfg in enumerate(configs):
        try:
            resolved = resolve(cfg)
        except Exception:
            continue
        ours.add(resolved.config.identity())
        d = recorded.get((resolved.config.identity(), resolved.code_version))
        if d is not None:
            found[i] = RecordedResult.from_stored(resolved.config, d)
            announce(f"ovq-cl: {cfg.label()}: finished run {d.get('run_id')} read from its record in {path} (this config "
                     "and code version); pass --rerun to run again")
    return ours, found


def _write_records(results, path: str, ours=()) -> None:
    """The run records as JSON, written atomically (a reader never sees half a file).

    Two processes may share a sweep (each skips the runs the other holds, :class:`RunInUse`): records
    already in the file whose run identity is in ``ours`` (the sweep's resolved identities) and not among
    ``results`` are another process's runs of this sweep, and are kept; the read-merge-write holds a file lock so that two
    writers do not drop each other's records. Records of configurations no longer in the sweep are
    dropped, as before."""
    from filelock import FileLock

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    new = [r.record() for r in results]
    ours = set(ours)
    with FileLock(f"{path}.lock"):
        kept = []
        if ours and os.path.exists(path):
            done = {(d.get("config_id"), d.get("code_version")) for d in new}
            try:
                old = load_records(path)
            except (OSError, ValueError):      # a file this code did not write: rewritten from our runs
                old = []
            kept = [d for d in old if d.get("config_id") in ours
                    and (d.get("config_id"), d.get("code_version")) not in done]
        write_records(path, kept + new)
