"""A sweep's trials as Ray tasks (``ovq-cl sweep ... --backend ray``; ``pip install 'ovq-cl[ray]'``).

Each configuration runs in a Ray worker through :func:`experiments.runner.run`, exactly as in the
serial sweep: a child MLflow run of the sweep's parent, reused when an identical run already finished
in the same store (so a sweep interrupted and started again skips what finished), resumed from its
last checkpoint when a run of its identity was left RUNNING by a process that died. Per trial:
``num_cpus`` / ``num_gpus`` as asked (torch uses that many threads), one retry when the trial raises
or its worker process dies (``max_retries=1``, ``retry_exceptions=True``), then it is reported as
failed and the sweep goes on.

Without an address, a local Ray is started for the sweep and stopped after it (nothing to install
beyond the extra); with ``address`` (``--ray-address``, e.g. ``ray://head:10001`` or ``auto``) the
trials go to that cluster. The workers start in the driver's working directory when it exists on
their node, so relative paths (the default ``sqlite:///mlruns.db``, ``outputs/``) mean the same as
in a serial sweep; on a multi-node cluster, use a tracking server and shared checkpoint paths.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Callable, List, Optional, Tuple

from experiments.messages import say, silent


def _trial(cfg, parent_run_id: Optional[str], rerun: bool, cwd: str, threads: int, messages: bool = True):
    """One configuration in a Ray worker; returns the RunResult. No progress: a worker's output reaches
    the driver through Ray's log (prefixed, line by line), where bars are noise and the driver already
    says when each trial ends; ``messages``: the run's one-line decisions (new, resumed, reused)."""
    import torch

    try:
        # Ray interrupts a cancelled trial through SIGINT; a driver started in the background (`cmd &`,
        # nohup, some schedulers) passes SIGINT ignored down to its workers, which would make the trial
        # deaf to it (seen here: trials RUNNING until killed)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:                           # not the main thread: Ray then interrupts otherwise
        pass
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    torch.set_num_threads(max(1, threads))
    from ovq_cl.base import load_plugins

    load_plugins(cfg.plugins)                    # a user's mixers, streams, ... registered in this worker too
    from experiments.runner import run

    cfg.progress = False
    return run(cfg, parent_run_id=parent_run_id, rerun=rerun,
               announce=say if messages else silent)


def run_on_ray(configs, parent_run_id: Optional[str], rerun: bool = False, announce: Callable[[str], None] = print,
               address: Optional[str] = None, cpus: float = 1, gpus: float = 0,
               on_result: Optional[Callable[[list], None]] = None, quiet: bool = False) -> Tuple[list, List[Tuple[str, str]]]:
    """Runs ``configs`` as Ray tasks. Returns (results, failures) in the order of ``configs``;
    ``on_result(results so far)`` is called after each finished trial (the sweep rewrites its JSON).
    ``quiet``: Ray says errors only and the trials nothing (their failures still come back here)."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("sweep --backend ray needs Ray: pip install 'ovq-cl[ray]'") from None
    from experiments.tracking import default_tracking_uri

    for cfg in configs:                          # one store for every worker, whatever its environment
        cfg.tracking.tracking_uri = default_tracking_uri(cfg.tracking.tracking_uri)
    with ray_session(address, quiet):
        return _run_trials(ray, configs, parent_run_id, rerun, announce, cpus, gpus, on_result, quiet)


@contextlib.contextmanager
def ray_session(address: Optional[str] = None, quiet: bool = False, num_cpus: Optional[int] = None):
    """Ray for the caller's tasks: the one running (left running after), else a local one of ``num_cpus``
    CPUs (Ray's default: the machine's) or, with ``address``, a cluster's, started here and stopped after;
    ``quiet``: Ray says errors only, the workers nothing."""
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        # Ray's core installs its own SIGTERM handlers (a C-level dump, then abort: the parent run would be
        # FAILED and the trials left RUNNING); the caller's handler (the CLI's: SIGTERM as Ctrl-C) is put back
        sigterm = signal.getsignal(signal.SIGTERM)
        if not sys.stderr.isatty():
            os.environ.setdefault("RAY_COLOR_PREFIX", "0")     # no colour codes in a log file
        # every trial's decisions in full: Ray folds lines that differ only in numbers (two seeds' "run
        # ...-s0" / "-s1" lines) into one "[repeated 2x across cluster]", in colour even in a log
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False, logging_level="ERROR" if quiet else "WARNING",
                 log_to_driver=not quiet,
                 runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith(("OVQ_CL_", "PYTHONPATH"))}})
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


def _run_trials(ray, configs, parent_run_id, rerun, announce, cpus, gpus, on_result, quiet):
    """:func:`run_on_ray`'s trials, in a Ray session."""
    remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=1, retry_exceptions=True)(_trial)
    cwd, threads = os.getcwd(), max(1, int(cpus))
    refs = {remote.remote(cfg, parent_run_id, rerun, cwd, threads, not quiet): i for i, cfg in enumerate(configs)}
    results: List[Optional[object]] = [None] * len(configs)
    failures: List[Tuple[int, str, str]] = []
    pending, started, n_done = list(refs), time.perf_counter(), 0
    try:
        while pending:
            # bounded, so that Ctrl-C / SIGTERM reach the driver at once (see experiments.piece_runs.WAIT_S)
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            if not ready:
                continue
            i = refs[ready[0]]
            try:
                results[i] = ray.get(ready[0])
                outcome = "done"
            except Exception as err:  # noqa: BLE001 - a failed trial (after its retry) is reported
                cause = getattr(err, "cause", None) or err
                failures.append((i, configs[i].label(), f"{type(cause).__name__}: {str(cause).splitlines()[0][:300]}"))
                outcome = "FAILED (after one retry)"
            n_done += 1
            if on_result is not None:
                on_result([r for r in results if r is not None])
            spent = time.perf_counter() - started
            announce(f"[{n_done}/{len(configs)}] {configs[i].label()} {outcome}; {spent:.0f} s so far")
    except BaseException:                    # Ctrl-C, SIGTERM (or a bug here): stop what still runs
        _stop_trials(ray, pending)
        raise
    return [r for r in results if r is not None], [(label, err) for _, label, err in sorted(failures)]


#: seconds an interrupted trial gets to mark its run KILLED before its worker is killed
STOP_GRACE_S = 30.0


def _stop_trials(ray, refs: list, grace_s: float = STOP_GRACE_S) -> None:
    """Interrupts the running trials as Ctrl-C interrupts a serial run: each gets a KeyboardInterrupt,
    so its MLflow run is marked KILLED and its last checkpoint stays (the sweep started again resumes
    it); queued trials are dropped; a trial still running after ``grace_s`` seconds is killed (its run
    is then closed as KILLED by the next start, see ``experiments.tracking.lifecycle.close_orphans``)."""
    if not refs:
        return
    for ref in refs:
        ray.cancel(ref, force=False)
    _, left = ray.wait(refs, num_returns=len(refs), timeout=grace_s)
    for ref in left:
        ray.cancel(ref, force=True)
