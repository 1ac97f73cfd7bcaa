"""Bitwise check of a refactor: every sampled study config's R before and after, compared exactly.

    python -m benchmarks.same_results record before.json            # at the old commit
    python -m benchmarks.same_results record after.json             # at the new one
    python -m benchmarks.same_results compare before.json after.json

The sample is every sweep command of every study in ``experiments/studies/`` at its smoke sizes
(``experiments.study.smoke_command``: the study's own tiny overrides, meta-training cut), with every
value of the axes that are not seeds (every mixer, strategy, rule) and the first value of the seed
axes; ``--meta-steps`` meta-training steps so the weights move. Each run is fresh (``rerun``), in a
temporary store; what is written per config identity: R, R_se, the facts-in-force matrices, every
summary, the gates and the meta-training losses, as exact floats (JSON keeps a double's repr).
``--only PATTERN`` keeps configs whose label contains PATTERN; ``--every K`` every K-th of them (a
spread sample: the 285 configs take hours); ``--limit N`` the first N; ``--same-as EARLIER.json`` exactly
the configs recorded in an earlier file (the "after" of a partial "before").
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def sample_configs(meta_steps: int, root: str):
    """(study name, RunConfig) for the sample, deduplicated by config identity: every sweep command at
    smoke sizes with its grid whole but for the seeds (the first only)."""
    from experiments.study import expand_sweep, is_seed_axis, smoke_command, smoke_repeats, sweep_commands
    from experiments.study_specs import load_study
    try:
        from experiments.study_specs import study_names
    except ImportError:                  # a commit from before study folders: one YAML file per study
        from experiments.study_specs import STUDIES_DIR

        def study_names():
            return sorted(f[:-5] for f in os.listdir(STUDIES_DIR) if f.endswith(".yaml"))

    seen, out = set(), []
    for name in study_names():
        spec = load_study(name)
        repeats = set(smoke_repeats(spec))
        for i, argv in sweep_commands(spec):
            if i in repeats:
                continue
            small = smoke_command(argv, spec, root, cut=lambda key, values: values[:1] if is_seed_axis(key) else values)
            for cfg in expand_sweep(small + [f"meta_train.steps={meta_steps}"]):
                if cfg.identity() not in seen:
                    seen.add(cfg.identity())
                    out.append((name, cfg))
    return out


def _exact(x):
    """Floats as their repr (NaN and infinities too), recursively."""
    if isinstance(x, float):
        return repr(x)
    if isinstance(x, dict):
        return {str(k): _exact(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_exact(v) for v in x]
    return x


def _key(study: str, cfg) -> str:
    return f"{study} | {cfg.label()} | {cfg.identity()}"


def record(path: str, meta_steps: int, only: str, limit: int, every: int = 1, same_as: str = "") -> int:
    from experiments.runner import run

    root = tempfile.mkdtemp(prefix="same_results_")
    configs = [(s, c) for s, c in sample_configs(meta_steps, root) if only in c.label()][::every][: limit or None]
    if same_as:
        wanted = set(json.load(open(same_as)))
        configs = [(s, c) for s, c in configs if _key(s, c) in wanted]
    print(f"{len(configs)} configs", flush=True)
    done = json.load(open(path)) if os.path.exists(path) else {}
    for k, (study, cfg) in enumerate(configs):
        key = _key(study, cfg)
        if key in done:
            continue
        t = time.perf_counter()
        try:
            r = run(cfg, rerun=True, announce=lambda m: None)
            done[key] = _exact({"R": r.R, "R_se": r.R_se, "R_n": r.R_n, "current": r.current, "summary": r.summary,
                                "summary_current": r.summary_current, "gate": r.gate, "stream_gate": r.stream_gate,
                                "probes": _probes(r), "meta_loss": [h.get("loss") for h in r.meta_history],
                                "parameters": r.parameters, "state_bytes": r.state_bytes})
        except Exception as err:         # recorded: a config that fails before must fail after
            done[key] = {"error": f"{type(err).__name__}: {err}"}
        print(f"[{k + 1}/{len(configs)}] {time.perf_counter() - t:5.1f}s {key}", flush=True)
        with open(path, "w") as f:          # every finished run kept
            json.dump(done, f, indent=1, sort_keys=True)
    return 0


def _probes(r) -> dict:
    """Every probe's record, from a result of either layout: ``probes`` (since the probe registry) or the
    four fields that held them before, so that a record made at an older commit compares with a new one."""
    if hasattr(r, "probes"):
        return {k: v for k, v in r.probes.items() if v}
    return {k: getattr(r, k) for k in ("delay", "interference", "capacity", "position") if getattr(r, k, None)}


def compare(before: str, after: str) -> int:
    a, b = json.load(open(before)), json.load(open(after))
    common = sorted(set(a) & set(b))
    differ = [k for k in common if a[k] != b[k]]
    for k in differ:
        fields = sorted(f for f in set(a[k]) | set(b[k]) if a[k].get(f) != b[k].get(f))
        print(f"DIFFERS {k}: {fields}")
    print(f"{len(common)} configs in both, {len(common) - len(differ)} bitwise equal, {len(differ)} differ; "
          f"only before: {len(set(a) - set(b))}, only after: {len(set(b) - set(a))}")
    return 1 if differ else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record")
    r.add_argument("out")
    r.add_argument("--meta-steps", type=int, default=6)
    r.add_argument("--only", default="")
    r.add_argument("--limit", type=int, default=0)
    r.add_argument("--every", type=int, default=1)
    r.add_argument("--same-as", default="", help="only the configs recorded in this earlier file")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = p.parse_args(argv)
    if args.command == "record":
        return record(args.out, args.meta_steps, args.only, args.limit, args.every, args.same_as)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
