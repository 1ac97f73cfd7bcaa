"""A run's life in the tracking store: its tracker (or a silent one), the Avalanche loggers that feed it,
runs left RUNNING by killed processes, and whether a run still exists.

The runner (``experiments.runner``) builds one tracker per run attempt with :func:`run_tracker`; ranks
other than 0 and runs with ``tracking.enabled: false`` get a :class:`NullTracker`, which accepts every
call and records nothing, so the phases never ask whether they are tracked.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Callable, Dict, Optional


class NullTracker:
    """A tracker that records nothing (no store, or a rank other than 0): every method is a no-op."""

    run_id = None
    tracking_uri = None
    environment = None              # no tags read (the run's provenance reads its own)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        return lambda *a, **k: None


def run_tracker(enabled: bool, experiment: str, run_name: str, tracking_uri: Optional[str],
                parent_run_id: Optional[str], run_id: Optional[str], tags: Dict[str, Any]):
    """A :class:`experiments.tracking.RunTracker` for a new run (``run_id`` None) or the reopened run
    ``run_id``; a :class:`NullTracker` when not ``enabled``."""
    if not enabled:
        return NullTracker()
    from experiments.tracking.runs import RunTracker

    return RunTracker(experiment, run_name, tracking_uri, parent_run_id=parent_run_id,
                      tags={**tags, "pid": os.getpid()}, run_id=run_id)


#: the Avalanche loggers ``tracking.loggers`` can name, each made with the run's own folder
LOGGER_NAMES = ("text", "csv", "tensorboard")


def avalanche_loggers(tracker, names=(), folder: str = "outputs/loggers") -> list:
    """Avalanche loggers of a run: the one writing to ``tracker`` (none for a :class:`NullTracker`), then one
    per name of ``tracking.loggers``: ``text`` (Avalanche's TextLogger into ``folder/log.txt``), ``csv``
    (CSVLogger in ``folder/csv``), ``tensorboard`` (TensorboardLogger in ``folder/tensorboard``; needs the
    tensorboard package), or ``package.module:factory``, called with ``folder`` and returning a logger
    (W&B, a user's own): the loggers a user already reads, fed by the same evaluation."""
    loggers = []
    if not isinstance(tracker, NullTracker):
        from experiments.tracking import MLflowLogger

        # Avalanche steps its metrics by training iteration, ours by experience: its names say which axis
        loggers.append(MLflowLogger(tracker, prefix="by_iteration/"))
    for name in names:
        os.makedirs(folder, exist_ok=True)
        if name == "text":
            from avalanche.logging import TextLogger

            loggers.append(TextLogger(open(os.path.join(folder, "log.txt"), "a")))
        elif name == "csv":
            from avalanche.logging import CSVLogger

            loggers.append(CSVLogger(log_folder=os.path.join(folder, "csv")))
        elif name == "tensorboard":
            from avalanche.logging import TensorboardLogger

            loggers.append(TensorboardLogger(tb_log_dir=os.path.join(folder, "tensorboard")))
        else:
            loggers.append(logger_factory(name)(folder))
    return loggers


def logger_factory(name: str) -> Callable[[str], Any]:
    """The factory ``package.module:attr`` names (ValueError in one line when it is not one)."""
    import importlib

    module, colon, attr = name.partition(":")
    if not (colon and module and attr):
        raise ValueError(f"tracking.loggers: {name!r} is neither one of {', '.join(LOGGER_NAMES)} nor "
                         "package.module:factory")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"tracking.loggers: {name!r}: {type(err).__name__}: {err}") from err


def close_orphans(tracker, config_id: str, announce: Callable[[str], None]) -> None:
    """Runs of ``config_id`` left RUNNING by a process of this host that no longer exists (killed
    outright before its first checkpoint) are marked KILLED, so that no run stays RUNNING forever."""
    if tracker.run_id is None:
        return
    client, me = tracker.client, tracker.run_id
    query = f"tags.config_id = '{config_id}' and attributes.status = 'RUNNING'"
    for old in client.search_runs([tracker.experiment_id], filter_string=query):
        tags = old.data.tags
        if old.info.run_id == me or tags.get("host") != socket.gethostname() or pid_alive(tags.get("pid")):
            continue
        client.set_tag(old.info.run_id, "error", f"orphaned: process {tags.get('pid')} ended before finishing "
                                                 f"or resuming it; superseded by run {me}")
        client.set_terminated(old.info.run_id, status="KILLED")
        announce(f"ovq-cl: marked orphaned run {old.info.run_id} KILLED")


def pid_alive(pid: Optional[str]) -> bool:
    """Whether process ``pid`` of this host exists (a PID we may not signal exists too)."""
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def run_exists(uri: str, run_id: str) -> bool:
    """Whether the store at ``uri`` holds run ``run_id`` (a replaced store no longer does)."""
    from mlflow.exceptions import MlflowException

    from experiments.tracking.runs import tracking_client

    try:
        tracking_client(uri).get_run(run_id)
    except MlflowException:
        return False
    return True


def unfinished_elsewhere(tracker, config_id: str, code_version: str, checkpoint_dir: str) -> list:
    """(run id, checkpoint folder) of the runs of this config and code in the store that did not finish
    and keep their checkpoints under another ``checkpoint.dir`` (tag ``checkpoint_dir``): what a new run
    that could have resumed them must say."""
    if tracker.run_id is None:
        return []
    query = (f"tags.config_id = '{config_id}' and tags.code_version = '{code_version}' "
             "and attributes.status != 'FINISHED'")
    out = []
    for old in tracker.client.search_runs([tracker.experiment_id], filter_string=query):
        folder = old.data.tags.get("checkpoint_dir")
        if old.info.run_id != tracker.run_id and folder and folder != checkpoint_dir:
            out.append((old.info.run_id, folder))
    return out

