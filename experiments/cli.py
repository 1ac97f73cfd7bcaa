"""Command line: ``ovq-cl demo | run | sweep | compare | study | report | state-sizes``.

``--plugin MODULE`` (run, sweep, state-sizes, demo; repeatable) imports a module of yours first, so the
mixers, streams, strategies and metrics it registers can be named in configs; packages can instead
declare entry points (``ovq_cl.mixers``, ``ovq_cl.streams``, ``ovq_cl.strategies``, ``ovq_cl.metrics``).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import List, Optional


class Terminated(KeyboardInterrupt):
    """SIGTERM (sent by `timeout`, schedulers, `docker stop`), handled like Ctrl-C: the run is marked
    KILLED in MLflow and its last checkpoint stays usable."""


def _on_sigterm(signum, frame):
    raise Terminated("SIGTERM")


def one_line(err: BaseException) -> str:
    """An error message on one line (omegaconf's and others' multi-line messages joined by '; ')."""
    parts = [line.strip() for line in str(err).splitlines() if line.strip()]
    return "; ".join(parts) or type(err).__name__


#: what a user can cause and fix: printed as one line (with --debug: the traceback)
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError,
               FloatingPointError)


def build_parser() -> argparse.ArgumentParser:
    """The ``ovq-cl`` command line (also used to read a study's commands)."""
    parser = argparse.ArgumentParser(prog="ovq-cl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    plugin = argparse.ArgumentParser(add_help=False)
    plugin.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import this module first (it registers your mixers, streams, strategies, metrics)")
    plugin.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    demo = sub.add_parser("demo", parents=[plugin], help="train the small LM with each mixer on a toy recall task")
    demo.add_argument("--mixers", default=None, help="comma-separated mixer names (default: all demo mixers)")
    demo.add_argument("--steps", type=int, default=None)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--state-budget", default=None,
                      help="bytes of state per layer and lane every mixer is sized to (default 16960; 'none': "
                           "each mixer's own options)")
    demo.add_argument("--no-progress", action="store_true")
    run_p = sub.add_parser("run", parents=[plugin], help="one run: meta-training, then the stream, tracked in MLflow")
    run_p.add_argument("config", help="a YAML run config (see experiments/configs/)")
    run_p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. model.layers=[ovq] seed=1")
    run_p.add_argument("--rerun", action="store_true",
                       help="run again even if this config, with this code, already finished (default: reuse it)")
    run_p.add_argument("--quiet", action="store_true", help="no progress bars and messages, only the result")
    sweep_p = sub.add_parser("sweep", parents=[plugin], help="a grid of runs under one parent MLflow run, then a comparison table")
    sweep_p.add_argument("config", help="the base YAML run config")
    sweep_p.add_argument("overrides", nargs="*", help="key=value overrides applied to every run")
    sweep_p.add_argument("--grid", action="append", default=[],
                         help="KEY=V1;V2;... (repeatable), e.g. --grid 'model.layers=[ovq];[full]' --grid 'seed=0;1;2'; keys that change together: --grid 'a&b=1&32;8&4'")
    sweep_p.add_argument("--name", default="sweep", help="name of the parent MLflow run")
    sweep_p.add_argument("--out", default="outputs/sweeps", help="folder for the table and the plot")
    sweep_p.add_argument("--rerun", action="store_true", help="run again the configs that already finished")
    sweep_p.add_argument("--backend", choices=("serial", "ray"), default="serial",
                         help="serial: one run after the other (default); ray: parallel Ray tasks (pip install 'ovq-cl[ray]')")
    sweep_p.add_argument("--ray-address", default=None,
                         help="an existing Ray cluster (e.g. auto, ray://head:10001); default: a local Ray started for the sweep")
    sweep_p.add_argument("--trial-cpus", type=float, default=1, help="CPUs per trial with --backend ray (torch threads)")
    sweep_p.add_argument("--trial-gpus", type=float, default=0, help="GPUs per trial with --backend ray")
    sweep_p.add_argument("--quiet", action="store_true", help="no progress bars and messages, only the table")
    cmp_p = sub.add_parser("compare", help="95%% intervals over seeds, and paired tests against a baseline, of "
                                           "finished runs (an MLflow experiment, or sweep JSON files)")
    cmp_p.add_argument("json", nargs="*", help="sweep JSON files (ovq-cl sweep --out); default: the MLflow experiment")
    cmp_p.add_argument("--baseline", default=None,
                       help="a configuration (its row name) or mixer pattern (e.g. ovq, swa+ovq) to pair every other with")
    cmp_p.add_argument("--experiment", default="ovq-cl")
    cmp_p.add_argument("--tracking-uri", default=None)
    cmp_p.add_argument("--filter", default="", help="an MLflow search filter, e.g. \"params.strategy.name = 'frozen'\"")
    study_p = sub.add_parser("study", help="run a study of experiments/studies/ (its sweeps), then rewrite RESULTS.md")
    study_p.add_argument("name", help="the study's name (file name under experiments/studies/ without .yaml)")
    study_p.add_argument("--smoke", default=None, metavar="DIR",
                         help="every command on tiny sizes (first grid value, a few steps), everything written under "
                              "DIR (its own RESULTS.md): checks the study runs end to end, not its numbers")
    study_p.add_argument("--backend", choices=("serial", "ray"), default="serial",
                         help="how each of the study's sweeps runs its trials (as ovq-cl sweep --backend)")
    study_p.add_argument("--ray-address", default=None, help="as ovq-cl sweep --ray-address")
    study_p.add_argument("--trial-cpus", type=float, default=1, help="as ovq-cl sweep --trial-cpus")
    study_p.add_argument("--trial-gpus", type=float, default=0, help="as ovq-cl sweep --trial-gpus")
    report_p = sub.add_parser("report", help="rewrite RESULTS.md from the studies' result JSON (no runs)")
    report_p.add_argument("--out", default=None, help="where to write (default: RESULTS.md of the project)")
    sizes = sub.add_parser("state-sizes", parents=[plugin], help="print every mixer's state bytes per layer and lane against T")
    sizes.add_argument("--lengths", default="1024,16384", help="comma-separated sequence lengths")
    sizes.add_argument("--d-model", type=int, default=256)
    sizes.add_argument("--heads", type=int, default=4)
    sizes.add_argument("--budget", type=int, default=None,
                       help="bytes per layer and lane: size every mixer to it and show the sizing and parameters")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Optional[List[str]] = None) -> argparse.Namespace:
    """``argv`` read by ``parser``, key=value overrides collected wherever they stand."""
    # key=value overrides may come before, between or after options (argparse alone would refuse
    # `run CFG --plugin M key=value`): whatever argparse leaves over and looks like one is an override
    args, rest = parser.parse_known_args(argv)
    if rest:
        if not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in rest):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        args.overrides = list(args.overrides) + rest
    return args


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.command in ("run", "sweep", "study"):
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _dispatch(args, parser)
    except Terminated:
        print("ovq-cl: terminated (SIGTERM); the run is marked KILLED and resumes from its last checkpoint "
              "when started again", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("ovq-cl: interrupted; the run is marked KILLED and resumes from its last checkpoint when "
              "started again", file=sys.stderr)
        return 130
    except USER_ERRORS as err:
        if getattr(args, "debug", False):
            raise
        print(f"ovq-cl: error: {one_line(err)}  (--debug for the traceback)", file=sys.stderr)
        return 2


def _dispatch(args, parser) -> int:
    if getattr(args, "plugin", None):
        from ovq_cl.base import load_plugins

        load_plugins(args.plugin)

    if args.command == "demo":
        from experiments.demo import DemoConfig, run_demo
        from ovq_cl.layers import MIXERS

        cfg = DemoConfig(seed=args.seed)
        if args.mixers:
            from experiments.demo import layer_pattern

            cfg.mixers = [m.strip() for m in args.mixers.split(",") if m.strip()]
            unknown = [p for m in cfg.mixers for p in layer_pattern(m) if p not in MIXERS]
            if unknown:
                parser.error(f"unknown mixer(s) {unknown}; known: {sorted(MIXERS)}")
        if args.steps is not None:
            if args.steps < 1:
                parser.error("--steps must be >= 1")
            cfg.steps = args.steps
        if args.state_budget is not None:
            if args.state_budget.lower() == "none":
                cfg.state_budget = None
            elif not args.state_budget.isdigit() or int(args.state_budget) < 1:
                parser.error(f"--state-budget must be a positive number of bytes or 'none', got {args.state_budget!r}")
            else:
                cfg.state_budget = int(args.state_budget)
        run_demo(cfg, progress=not args.no_progress)
    elif args.command == "run":
        from experiments.config import run_config
        from experiments.runner import run

        cfg = run_config(args.config, args.overrides, plugins=args.plugin)
        cfg.progress = cfg.progress or not args.quiet           # one bar per phase, on stderr
        from strategies import distributed

        try:
            result = run(cfg, rerun=args.rerun, announce=_silent if args.quiet else _say)
        finally:
            distributed.stop()
        if distributed.launched() and os.environ.get("RANK", "0") != "0":
            return 0                                  # under torchrun rank 0 prints the result
        _print_result(result)
    elif args.command in ("sweep", "study") and _under_torchrun():
        raise ValueError(f"ovq-cl {args.command} under torchrun: run each config with 'torchrun ... -m "
                         "experiments.cli run CONFIG', or spread a sweep's trials with --backend ray")
    elif args.command == "sweep":
        from experiments.config import check_writable
        from experiments.sweep import check_backend, expand, parse_grid, run_sweep

        grid = parse_grid(args.grid)
        check_backend(args.backend, args.ray_address, args.trial_cpus, args.trial_gpus)
        configs = expand(args.config, args.overrides, grid, plugins=args.plugin)   # every config checked first
        for cfg in configs:
            cfg.progress = cfg.progress or not args.quiet
        check_writable(args.out, "sweep --out")                 # before any run, not after all of them
        print(f"{len(configs)} runs")
        results, failures = run_sweep(configs, args.name, grid=grid, out=args.out, rerun=args.rerun,
                                      announce=_silent if args.quiet else _say, backend=args.backend,
                                      ray_address=args.ray_address, trial_cpus=args.trial_cpus, trial_gpus=args.trial_gpus)
        for label, err in failures:
            print(f"FAILED {label}: {err}")
        return 1 if failures else 0
    elif args.command == "compare":
        import json

        from experiments import compare

        if args.json:
            records = [compare.record_from_json(d) for path in args.json for d in json.load(open(path))]
        else:
            records = compare.mlflow_records(args.experiment, args.tracking_uri, args.filter)
        if not records:
            print("ovq-cl: no finished runs found", file=sys.stderr)
            return 1
        print(compare.summary_table(records))
        if args.baseline:
            print()
            print(compare.paired_table(records, args.baseline))
    elif args.command == "study":
        from experiments.report import run_study

        from experiments.sweep import check_backend

        check_backend(args.backend, args.ray_address, args.trial_cpus, args.trial_gpus)
        sweep_args = [] if args.backend == "serial" else (
            ["--backend", args.backend, "--trial-cpus", str(args.trial_cpus), "--trial-gpus", str(args.trial_gpus)]
            + (["--ray-address", args.ray_address] if args.ray_address else []))
        return run_study(args.name, smoke=args.smoke, sweep_args=sweep_args)
    elif args.command == "report":
        from experiments.report import write_report

        print(write_report(args.out))
    elif args.command == "state-sizes":
        from experiments.state_sizes import state_size_table

        lengths = [int(t) for t in args.lengths.split(",") if t.strip()]
        print(state_size_table(lengths, d_model=args.d_model, n_heads=args.heads, budget=args.budget))
    return 0


def _under_torchrun() -> bool:
    from strategies import distributed

    return distributed.launched()


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _silent(message: str) -> None:
    pass


def _print_result(result) -> None:
    R, n = result.R, len(result.R)
    print(f"{result.config.label()}  metric: {result.metric}  (row j: after training experience j)")
    print("      " + " ".join(f"{'exp ' + str(i):>8}" for i in range(n)))
    for j, row in enumerate(R):
        print(f"R[{j}]  " + " ".join(f"{'' if v is None else format(v, '.3f'):>8}" for v in row))
    def line(summary):
        # a run that did not learn has nothing to forget: no forgetting number is printed for it
        return "  ".join(f"{k}=not learned" if result.learned is False and (k.startswith("forgetting") or k == "bwt")
                         else f"{k}={v:.4f}" for k, v in summary.items())

    print(line(result.summary))
    if result.summary_current:
        print("against the facts in force:  " + line(result.summary_current))
    g, s = result.gate, result.stream_gate
    if g.get("learned") is not None:
        print(f"learned gate (held-out episodes, fresh state): score {g['score']:.3f} ± {g['standard_error']:.3f}, "
              f"chance {g['chance']:.3f}, skill {g['skill']:.2f} (>= {g['threshold']}): "
              f"{'learned' if g['learned'] else 'NOT LEARNED'}")
    d = result.delay
    if d:
        from strategies.delay import DelayCurve
        curve, dg = DelayCurve.from_dict(d["curve"]), d["gate"]
        span = d.get("span")
        print(f"delay-recall curve (fresh state, before the stream; span: {metric_span(span, curve)}):")
        print(curve.table())
        verdict = ("not measured: the curve stops before this delay (gate.delay_max_tokens)" if dg["learned"] is None
                   else "recalls" if dg["learned"] else "DOES NOT RECALL")
        print(f"delay gate (skill at the learning delay, {d['learning']} tokens): {dg['skill']:.2f} "
              f"(>= {dg['threshold']}): {verdict}" + ("" if d.get("required") else " (informative, not a gate here)"))
    print(f"stream gate (mean R[j][j] vs chance {s['chance']:.3f}): skill {s['skill']:.2f} (>= {s['threshold']}): "
          f"{'learned' if s['learned'] else 'NOT LEARNED: forgetting means nothing here'}")
    print(f"state bytes per layer and lane: {[int(b) for b in result.state_bytes_per_lane]}   "
          f"parameters: {result.parameters:,}")
    print(f"MLflow run: {result.run_id}   artifacts: {result.artifact_uri}   checkpoint: {result.checkpoint}")


def metric_span(span, curve) -> str:
    """'N tokens' where the curve falls below the span level, or '> last delay' when it never does."""
    if span is not None:
        return f"below the level from {span} tokens"
    return f"above the level up to {curve.points[-1].delay} tokens" if curve.points else "not measured"


if __name__ == "__main__":
    sys.exit(main())
