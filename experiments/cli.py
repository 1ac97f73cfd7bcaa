"""Command line: ``ovq-cl demo | run | sweep | compare | merge | migrate | pieces | study | report | state-sizes``.

``--plugin MODULE`` (run, sweep, state-sizes, demo; repeatable) imports a module of yours first, so the
mixers, streams, strategies and metrics it registers can be named in configs; packages can instead
declare entry points (``ovq_cl.mixers``, ``ovq_cl.streams``, ``ovq_cl.strategies``, ``ovq_cl.metrics``).
"""
from __future__ import annotations

import os
import signal
import sys
from typing import List, Optional

from experiments.arguments import LENGTHS_DEFAULT, build_parser, parse_args
from experiments.messages import say, silent
from experiments.run_lock import RunInUse


class Terminated(KeyboardInterrupt):
    """SIGTERM (sent by `timeout`, schedulers, `docker stop`), handled like Ctrl-C: the run is marked
    KILLED in MLflow and its last checkpoint stays usable."""


#: set by the SIGTERM handler: a library between the handler and main() (Ray's wait) may turn the
#: Terminated it raises into a plain KeyboardInterrupt, and the exit status must still say SIGTERM
_terminated = False


def _on_sigterm(signum, frame):
    global _terminated
    _terminated = True
    raise Terminated("SIGTERM")


def one_line(err: BaseException) -> str:
    """An error message on one line (omegaconf's and others' multi-line messages joined by '; ')."""
    parts = [line.strip() for line in str(err).splitlines() if line.strip()]
    return "; ".join(parts) or type(err).__name__


#: what a user can cause and fix: printed as one line (with --debug: the traceback)
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError,
               FloatingPointError, RunInUse)


def main(argv: Optional[List[str]] = None) -> int:
    global _terminated
    _terminated = False
    parser = build_parser()
    args = parse_args(parser, argv)
    if getattr(args, "quiet", False):
        quiet_libraries()
    if args.command in ("run", "sweep", "study"):
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        from experiments.threads import install_loop_threads

        install_loop_threads()      # OVQ's loop threads: this process's policy (OVQ_CL_LOOP_THREADS, else auto)
        return _dispatch(args, parser)
    except KeyboardInterrupt as interrupt:
        if args.command not in ("run", "sweep", "study"):     # nothing tracked, nothing to resume
            print(f"ovq-cl: {args.command} interrupted", file=sys.stderr)
            return 130
        if not (_terminated or isinstance(interrupt, Terminated)):
            print("ovq-cl: interrupted; the run is marked KILLED and resumes from its last checkpoint when "
                  "started again", file=sys.stderr)
            return 130
        print("ovq-cl: terminated (SIGTERM); the run is marked KILLED and resumes from its last checkpoint "
              "when started again", file=sys.stderr)
        return 143
    except USER_ERRORS as err:
        if getattr(args, "debug", False):
            raise
        return _user_error(f"ovq-cl: error: {one_line(err)}  (--debug for the traceback)")
    except OSError as err:
        import errno

        if err.errno != errno.ENOSPC or getattr(args, "debug", False):
            raise
        return _user_error(f"ovq-cl: error: {err.strerror if err.strerror and err.filename is None else err}  "
                           "(--debug for the traceback)")
    except Exception as err:  # noqa: BLE001 - only the tracking store's faults are turned into one line
        store_fault = _store_fault(err)
        if store_fault is None or getattr(args, "debug", False):
            raise
        return _user_error(f"ovq-cl: error: the tracking store ({store_fault}): {one_line(err)}  "
                           "(nothing was lost: a run's checkpoints stay; --debug for the traceback)")


def _store_fault(err: BaseException) -> Optional[str]:
    """Where ``err`` (or what it was raised from) comes from when it is a fault of the tracking store: MLflow,
    SQLAlchemy or SQLite (an unsupported URI, a corrupted or locked database); None otherwise."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        module = type(err).__module__.split(".")[0]
        if module in ("mlflow", "sqlalchemy", "sqlite3"):
            return {"mlflow": "MLflow", "sqlalchemy": "its database", "sqlite3": "its SQLite file"}[module]
        err = err.__cause__ or err.__context__
    return None


#: seconds a torchrun rank other than 0 waits, after a mistake, for rank 0 to say it and end the group
RANK_ERROR_WAIT_S = 60.0


def _user_error(line: str) -> int:
    """Says ``line`` once and returns the exit status 2. Under torchrun every rank meets the same
    mistake (one config): rank 0 says it and exits, and torchrun then stops the other ranks, which wait
    silently (a mistake only this rank meets is said after ``RANK_ERROR_WAIT_S``, with its rank). The
    line also goes to torchrun's error file, so the launcher's failure summary (which torchrun always
    prints when a rank fails) names it instead of a link to its docs."""
    import time

    rank = int(os.environ.get("RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0
    if rank != 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)        # torchrun's stop ends the wait, silently
        time.sleep(RANK_ERROR_WAIT_S)
        line = f"[rank {rank}] {line}"
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        import json

        try:
            with open(error_file, "w") as fh:
                json.dump({"message": line, "timestamp": int(time.time())}, fh)
        except OSError:
            pass                                     # the summary then shows torchrun's own text
    print(line, file=sys.stderr)
    return 2


def _dispatch(args, parser) -> int:
    """Loads the plugins, then runs the subcommand's handler (one function each, below)."""
    if getattr(args, "plugin", None):
        from ovq_cl.base import load_plugins

        load_plugins(args.plugin)
    if args.command in ("sweep", "study") and _under_torchrun():
        raise ValueError(f"ovq-cl {args.command} under torchrun: run each config with 'torchrun ... -m "
                         "experiments.cli run CONFIG', or spread a sweep's trials with --backend ray")
    return HANDLERS[args.command](args, parser)


def _demo(args, parser) -> int:
    """ovq-cl demo: every mixer on associative recall, trained here (the README's table)."""
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
    return 0


def _run(args, parser) -> int:
    """ovq-cl run: one configuration: run, resume or reuse it, and print its appendix."""
    from experiments.config import run_config
    from experiments.runner import run

    cfg = run_config(args.config, args.overrides, plugins=args.plugin)
    cfg.progress = shown_progress(cfg.progress, args.quiet)
    from strategies.training import distributed

    try:
        result = run(cfg, rerun=args.rerun, announce=silent if args.quiet else say)
    finally:
        distributed.stop()
    if distributed.launched() and os.environ.get("RANK", "0") != "0":
        return 0                                  # under torchrun rank 0 prints the result
    _print_result(result)
    return 0


def _sweep(args, parser) -> int:
    """ovq-cl sweep: a grid of configurations, every one checked before the first runs."""
    from experiments.config import check_writable
    from experiments.sweep import check_backend, expand, parse_grid, run_sweep, unequal_state

    grid = parse_grid(args.grid)
    check_backend(args.backend, args.ray_address, args.trial_cpus, args.trial_gpus)
    configs = expand(args.config, args.overrides, grid, plugins=args.plugin)   # every config checked first
    for cfg in configs:
        cfg.progress = shown_progress(cfg.progress, args.quiet)
    check_writable(args.out, "sweep --out")                 # before any run, not after all of them
    unfair = unequal_state(configs)
    if unfair:
        say(unfair)                                          # even under --quiet: the comparison is at stake
    (silent if args.quiet else say)(f"ovq-cl: sweep {args.name}: {len(configs)} runs")
    results, failures = run_sweep(configs, args.name, grid=grid, out=args.out, rerun=args.rerun,
                                  announce=silent if args.quiet else say, backend=args.backend,
                                  ray_address=args.ray_address, trial_cpus=args.trial_cpus, trial_gpus=args.trial_gpus,
                                  quiet=args.quiet, base=(args.config, list(args.overrides)))
    for label, err in failures:
        print(f"FAILED {label}: {err}")
    return 1 if failures else 0


def _compare(args, parser) -> int:
    """ovq-cl compare: summary and paired tables from sweep JSON or an MLflow experiment."""
    from experiments import compare
    from experiments.records import load_records

    if args.json:
        if args.sweep:
            parser.error("compare --sweep selects runs of an MLflow experiment; with JSON files, name the sweep's file")
        records = [compare.record_from_json(d) for path in args.json for d in load_records(path, missing_ok=False)]
    else:
        records = compare.mlflow_records(args.experiment, args.tracking_uri, args.filter, sweep=args.sweep)
    if not records:
        print("ovq-cl: no finished runs found", file=sys.stderr)
        return 1
    records, notes = compare.deduplicated(records)
    notes += compare.unknown_metric_notes(records)
    for note in notes:
        print(f"ovq-cl: {note}", file=sys.stderr)
    print(compare.summary_table(records))
    if args.baseline:
        print()
        print(compare.paired_table(records, args.baseline))
    if args.plot:
        say(f"ovq-cl: forgetting curves: {compare.curves_plot(records, args.plot, args.sweep or args.experiment)}")
    return 0


def _merge(args, parser) -> int:
    """ovq-cl merge: run records merged into one JSON (each run once)."""
    from experiments.sweep import merge_record_files

    written, dropped = merge_record_files(args.out, args.json)
    say(f"ovq-cl: merge: {written} run records in {args.out}" + (f" ({dropped} repeats kept once)" if dropped else ""))
    return 0


def _migrate(args, parser) -> int:
    """ovq-cl migrate: sweep JSON files rewritten in the current record schema (each record migrated once)."""
    from experiments.records import SCHEMA_VERSION, migrate_files

    changed = migrate_files(args.json)
    say(f"ovq-cl: migrate: {len(changed)} of {len(args.json)} files rewritten in schema version {SCHEMA_VERSION}")
    return 0


def _pieces(args, parser) -> int:
    """ovq-cl pieces: a study's missing runs, one line each (or checked tiny with --check)."""
    from experiments.pieces import study_pieces
    from experiments.report import PROJECT_DIR
    from experiments.study_specs import load_study

    spec = load_study(args.name)
    pieces = study_pieces(spec, PROJECT_DIR, order=args.order, include_held=args.all)
    if args.check:
        from experiments.pieces import check_pieces

        checks = check_pieces(pieces, spec, PROJECT_DIR, args.check, announce=say)
        bad = [c for c in checks if not c.ok]
        say(f"ovq-cl: pieces --check: {len(checks) - len(bad)} of {len(checks)} configurations ran on tiny sizes"
            f" (of {len(pieces)} runs to run)" + (f"; {len(bad)} failed, logs under {args.check}/logs" if bad else ""))
        return 1 if bad else 0
    for piece in pieces:
        print(piece.line())
    pinned = sorted({p.commit for p in pieces if p.commit})
    say(f"ovq-cl: pieces: {len(pieces)} runs of study {args.name} to run" +
        (f", from commit {', '.join(pinned)} (a checkout of its own, with its own .venv)" if pinned else ""))
    known = [p.minutes for p in pieces if p.minutes]
    if known:
        say(f"ovq-cl: pieces: expected wall time (the longest of each configuration's finished runs): "
            f"{sum(known) / 60:.1f} h for {len(known)} of them" + (", the others unknown" if len(known) < len(pieces) else ""))
    if pieces:
        say(f"ovq-cl: pieces: to run them, each merged as it ends: ovq-cl study {args.name} --backend ray --lanes 2")
    return 0


def _study(args, parser) -> int:
    """ovq-cl study: a study's sweeps (or, on Ray, its runs still to make, from their pinned checkouts), then RESULTS.md."""
    if args.backend == "ray":
        from experiments.piece_runs import run_study_pieces
        from experiments.report import PROJECT_DIR

        if args.smoke or args.skip_pinned:
            raise ValueError("study --backend ray runs the study's own runs: --smoke and --skip-pinned are serial's")
        if args.lanes < 1:
            raise ValueError(f"study --lanes must be >= 1, got {args.lanes}")
        return run_study_pieces(args.name, PROJECT_DIR, lanes=args.lanes, address=args.ray_address, announce=say,
                                until=None if args.until is None else time_of(args.until))
    from experiments.study import run_study

    return run_study(args.name, main, smoke=args.smoke, skip_pinned=args.skip_pinned)


def time_of(text: str, now: Optional[float] = None) -> float:
    """``HH:MM`` (today, local time) or ``+MIN`` (minutes from now) as a time.time(); ValueError otherwise."""
    import datetime
    import re
    import time

    now = time.time() if now is None else now
    if (m := re.fullmatch(r"\+\s*(\d+)\s*(min|m)?", text.strip())):
        return now + 60 * int(m.group(1))
    if (m := re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())) and int(m.group(1)) < 24 and int(m.group(2)) < 60:
        day = datetime.datetime.fromtimestamp(now)
        return day.replace(hour=int(m.group(1)), minute=int(m.group(2)), second=0, microsecond=0).timestamp()
    raise ValueError(f"--until {text!r}: give HH:MM (today) or +MIN (minutes from now), e.g. 18:10 or +90")


def _report(args, parser) -> int:
    """ovq-cl report: RESULTS.md (and README's findings table), after --verify where asked."""
    from experiments.report import write_report

    if args.verify:
        from experiments.study_specs import all_studies
        from experiments.verify import DIFFERS, summary, verify, write_verification

        checks = verify(all_studies(), only=args.verify_only, limit=args.verify_limit, announce=say)
        kept = write_verification(checks)
        if args.verify_only and not checks:
            say(f"ovq-cl: report --verify: no configuration's label contains {args.verify_only!r}")
        if any(c.status == DIFFERS for c in checks):
            print(f"ovq-cl: report --verify: {summary(checks)}: a configuration made by today's code does not "
                  f"reproduce its stored R bit for bit (listed above, kept in {kept}); RESULTS.md not written",
                  file=sys.stderr)
            return 1
        say(f"ovq-cl: report --verify: {summary(checks)} (kept in {kept})")
    print(write_report(args.out))
    return 0


def _state_sizes(args, parser) -> int:
    """ovq-cl state-sizes: each mixer's state bytes at the given lengths."""
    from experiments.state_sizes import parse_mixer_options, state_size_table

    lengths = [int(t) for t in args.lengths.split(",") if t.strip()]
    d_model, heads, budget, options = args.d_model, args.heads, args.budget, parse_mixer_options(args.option)
    if args.as_demo:
        from experiments.demo import DemoConfig

        demo = DemoConfig()
        d_model, heads, budget = demo.d_model, demo.n_heads, demo.state_budget
        options = {**demo.mixer_options, **options}
        lengths = [demo.task.seq_len] if args.lengths == LENGTHS_DEFAULT else lengths
    print(state_size_table(lengths, d_model=d_model, n_heads=heads, budget=budget, options=options))
    return 0


#: each subcommand's handler (``experiments.arguments`` defines the subcommands)
HANDLERS = {"demo": _demo, "run": _run, "sweep": _sweep, "compare": _compare, "merge": _merge, "migrate": _migrate, "pieces": _pieces, "study": _study, "report": _report, "state-sizes": _state_sizes}


def shown_progress(configured: Optional[bool], quiet: bool) -> bool:
    """Progress under the CLI: ``--quiet`` wins over everything; otherwise the config's ``progress``,
    on when it does not say (a bar per phase on a terminal, a line per phase in a log)."""
    return False if quiet else (True if configured is None else bool(configured))


#: loggers of the libraries a run uses that say INFO (MLflow's store creation, its migrations)
LIBRARY_LOGGERS = ("mlflow", "alembic")


def quiet_libraries() -> None:
    """``--quiet``: the libraries' INFO lines go too (warnings and errors stay)."""
    import logging

    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")      # read when mlflow is imported (its own setup)
    for name in LIBRARY_LOGGERS:                                   # and for a process that imported it already
        logging.getLogger(name).setLevel(logging.WARNING)


def _under_torchrun() -> bool:
    from strategies.training import distributed

    return distributed.launched()


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
        print(f"held-out gate (held-out episodes, fresh state): score {g['score']:.3f} ± {g['standard_error']:.3f}, "
              f"chance {g['chance']:.3f}, skill {g['skill']:.2f} (>= {g['threshold']}): "
              f"{'passed' if g['learned'] else 'FAILED'}")
    d = result.probes.get("delay")
    if d:
        from strategies.evaluation.delay import DelayCurve
        curve, dg = DelayCurve.from_dict(d["curve"]), d["gate"]
        span = d.get("span")
        print(f"delay-recall curve (fresh state, before the stream; span: {metric_span(span, curve)}):")
        print(curve.table())
        verdict = ("not measured: the curve stops before this delay (gate.delay_max_tokens)" if dg["learned"] is None
                   else "recalls" if dg["learned"] else "DOES NOT RECALL")
        print(f"delay gate (skill at the learning delay, {d['learning']} tokens): {dg['skill']:.2f} "
              f"(>= {dg['threshold']}): {verdict}" + ("" if d.get("required") else " (informative, not a gate here)"))
    print(f"stream gate (mean skill of R[j][j], each against its experience's chance, mean chance {s['chance']:.3f}): "
          f"skill {s['skill']:.2f} (>= {s['threshold']}): "
          f"{'passed' if s['learned'] else 'FAILED: forgetting means nothing here'}")
    overall = result.learned
    print("learned (every gate that applies; what the tables and the MLflow tag learned_overall call learned): "
          + {True: "yes", False: "NO", None: "unmeasured"}[overall])
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
