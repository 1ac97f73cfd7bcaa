"""The lifecycle of MLflow runs: one RunTracker per run (FINISHED / FAILED), SweepTracker parents, environment tags."""
from __future__ import annotations

import json
import logging
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from experiments.tracking.params import (
    _BATCH_METRICS, _BATCH_PARAMS, MAX_TAG_VALUE_LENGTH, _plain, _safe_key, _scalar, _truncate,
    default_tracking_uri, flatten_config,
)

_PROJECT_DIR = Path(__file__).resolve().parents[2]
_PACKAGES = {"torch": "torch", "avalanche": "avalanche-lib", "mlflow": "mlflow", "ovq-cl": "ovq-cl"}
log = logging.getLogger(__name__)


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", "-C", str(_PROJECT_DIR), *args], capture_output=True, text=True, timeout=10,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},   # read-only: never take the index lock
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere; ``"unknown"``)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_capability() -> str:
    """The instruction set torch's CPU kernels use here (``torch.backends.cpu.get_cpu_capability()``)."""
    import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return "unknown"


def _user() -> str:
    """Who runs this process (the login name, else the user id): MLflow's User column."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


def environment_tags() -> Dict[str, str]:
    """Tags that identify the code and environment of a run.

    ``git.commit`` (also ``mlflow.source.git.commit``, shown by the MLflow UI; ``"unknown"`` outside
    a git checkout), ``git.dirty`` (``"true"`` when tracked or untracked non-ignored files differ from
    the commit, ``"unknown"`` outside a checkout), ``version.python``, ``version.torch``,
    ``version.avalanche``, ``version.mlflow``, ``version.ovq-cl`` (``"not installed"`` when
    missing), ``host``, ``cpu`` (the processor's model name) and ``cpu.capability`` (the vector instruction
    set torch's CPU kernels dispatch to, e.g. AVX512): one commit on one thread may give weights that
    differ in the last bits on another machine (float sums of another vector width), and these say which.
    """
    commit = (_git("rev-parse", "HEAD") or "").strip() or "unknown"
    status = _git("status", "--porcelain") if commit != "unknown" else None
    tags = {
        "git.commit": commit,
        "mlflow.source.git.commit": commit,
        # the UI's Source and User columns: the command that made the run, and who ran it
        "mlflow.source.name": " ".join(["ovq-cl" if os.path.basename(sys.argv[0]) in ("ovq-cl", "cli.py") else sys.argv[0],
                                        *sys.argv[1:]])[:500],
        "mlflow.source.type": "LOCAL",
        "mlflow.user": _user(),
        "git.dirty": "unknown" if status is None else str(bool(status.strip())).lower(),
        "version.python": platform.python_version(),
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu.capability": cpu_capability(),
    }
    for short, dist in _PACKAGES.items():
        try:
            tags[f"version.{short}"] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            tags[f"version.{short}"] = "not installed"
    return tags


def tracking_client(tracking_uri: str):
    """An :class:`mlflow.MlflowClient` bound to ``tracking_uri``.

    MLflow creates a SQLite store's tables when the first client opens it, and two processes doing so
    at once (two sweeps started together, parallel trials) race: one fails with "table ... already
    exists". So a SQLite store is opened under a file lock beside it (``<db>.lock``); other stores as is.
    """
    from mlflow import MlflowClient

    if not tracking_uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=tracking_uri)
    from filelock import FileLock

    path = os.path.abspath(tracking_uri[len("sqlite:///"):])
    os.makedirs(os.path.dirname(path), exist_ok=True)       # checked writable, created only when used
    with FileLock(path + ".lock", timeout=120):
        return MlflowClient(tracking_uri=tracking_uri)


def _now_ms() -> int:
    return int(time.time() * 1000)


class RunTracker:
    """A context manager for ONE MLflow run (FINISHED on a clean exit, FAILED when an exception escapes).

    Args:
        experiment: MLflow experiment name; created if missing.
        run_name: the run's name, e.g. ``"icr/ovq/naive/persist/seed0"``.
        tracking_uri: see :func:`default_tracking_uri` (explicit > ``$MLFLOW_TRACKING_URI`` > SQLite).
        parent_run_id: nest this run under that run (sets ``mlflow.parentRunId``; the UI shows it
            as a child when both are in the same experiment).
        tags: extra tags (e.g. stream, strategy, seed); the environment tags
            (:func:`environment_tags`) and ``kind`` (``"run"``) are always set.
        artifact_location: where artifacts go, used only when this call creates the experiment
            (default: MLflow's, ``./mlruns/<experiment id>`` for a SQLite store).
        run_id: reopen this existing run instead of creating one (resume after a crash or from a
            checkpoint): its status goes back to RUNNING and its tags are refreshed.

    The run starts in ``__enter__`` (or :meth:`start`) and ends in ``__exit__`` (or :meth:`end`).
    On an escaping exception the run gets an ``error`` tag and an ``error.txt`` traceback
    artifact, is marked FAILED, and the exception propagates. A process killed outright
    (SIGKILL, power loss) leaves its run RUNNING: nothing in-process can prevent that.

    A RunTracker pickles (its MLflow client is recreated on demand), so it survives an Avalanche
    checkpoint of a strategy whose evaluator holds an :class:`MLflowLogger`.
    """

    kind = "run"

    def __init__(
        self,
        experiment: str,
        run_name: str,
        tracking_uri: Optional[str] = None,
        parent_run_id: Optional[str] = None,
        tags: Optional[Mapping[str, Any]] = None,
        artifact_location: Optional[str] = None,
        run_id: Optional[str] = None,
    ):
        self.experiment = experiment
        self.run_name = run_name
        self.tracking_uri = default_tracking_uri(tracking_uri)
        self.parent_run_id = parent_run_id
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.artifact_location = None if artifact_location is None else str(artifact_location)
        self.experiment_id: Optional[str] = None
        self._run_id = run_id
        self._active = False
        self._client_obj = None

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def client(self):
        """The :class:`mlflow.MlflowClient` bound to :attr:`tracking_uri`."""
        if self._client_obj is None:
            self._client_obj = tracking_client(self.tracking_uri)
        return self._client_obj

    @property
    def run_id(self) -> str:
        """The MLflow run id (available once the run has started)."""
        if self._run_id is None:
            raise RuntimeError("the run has not started: use `with tracker:` or tracker.start()")
        return self._run_id

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> "RunTracker":
        """Create the experiment if needed and start (or reopen) the run, with its tags."""
        if self._active:
            raise RuntimeError(f"run {self._run_id} is already active")
        self.experiment_id = self._experiment_id()
        self.environment = environment_tags()           # read once; the run's record repeats it (provenance)
        tags = {**self.environment, "kind": self.kind, **self.tags}
        if self.parent_run_id and self._run_id is None:
            # only a run this parent starts is its child: a reopened run keeps the parent it had
            tags["mlflow.parentRunId"] = self.parent_run_id
        tags = {_safe_key(k): _truncate(v, MAX_TAG_VALUE_LENGTH, f"tag {k!r}") for k, v in tags.items()}
        if self._run_id is None:
            run = self.client.create_run(self.experiment_id, run_name=self.run_name, tags=tags)
            self._run_id = run.info.run_id
        else:
            self.client.update_run(self._run_id, status="RUNNING")
            self._log_tags(tags)
        self._active = True
        return self

    @property
    def artifact_uri(self) -> str:
        """Where the run's artifacts are stored."""
        return self.client.get_run(self.run_id).info.artifact_uri

    def end(self, status: str = "FINISHED") -> None:
        """End the run with ``status`` (``FINISHED``, ``FAILED`` or ``KILLED``); a no-op if not active."""
        if not self._active:
            return
        self._active = False
        self.client.set_terminated(self.run_id, status=status)

    def __enter__(self) -> "RunTracker":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.end("FINISHED")
            return False
        interrupted = issubclass(exc_type, KeyboardInterrupt)          # Ctrl-C, SIGTERM: KILLED, not FAILED
        try:
            self._record_error(exc_type, exc, tb)
        finally:
            try:
                self.end("KILLED" if interrupted else "FAILED")
            except Exception:  # noqa: BLE001 - never mask the exception that ended the run
                log.exception("could not mark MLflow run %s FAILED", self._run_id)
        return False  # re-raise

    def _record_error(self, exc_type, exc, tb) -> None:
        try:
            self.client.set_tag(self.run_id, "error",
                                _truncate(f"{exc_type.__name__}: {exc}", MAX_TAG_VALUE_LENGTH, "error tag"))
            self.client.log_text(self.run_id, "".join(traceback.format_exception(exc_type, exc, tb)), "error.txt")
        except Exception:  # noqa: BLE001
            log.exception("could not record the error of MLflow run %s", self._run_id)

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is None:
            try:
                return self.client.create_experiment(self.experiment, artifact_location=self.artifact_location)
            except MlflowException:  # created meanwhile by another process
                exp = self.client.get_experiment_by_name(self.experiment)
                if exp is None:
                    raise
        if exp.lifecycle_stage == "deleted":
            raise RuntimeError(f"MLflow experiment {self.experiment!r} is deleted: restore it "
                               f"(`mlflow experiments restore --experiment-id {exp.experiment_id}`) or use another name")
        return exp.experiment_id

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_client_obj"] = None
        return state

    # -- logging -----------------------------------------------------------------------------------

    def _check(self) -> str:
        if not self._active:
            raise RuntimeError("the run is not active: log inside `with tracker:` (or between start() and end())")
        return self.run_id

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set (or overwrite) tags on the run."""
        self._check()
        self._log_tags({_safe_key(k): _truncate(str(v), MAX_TAG_VALUE_LENGTH, f"tag {k!r}") for k, v in tags.items()})

    def delete_tags(self, keys: Iterable[str]) -> None:
        """Removes those of ``keys`` the run has (what an earlier attempt left, e.g. its ``error``)."""
        run_id = self._check()
        present = self.client.get_run(run_id).data.tags
        for key in keys:
            if key in present:
                self.client.delete_tag(run_id, key)

    def _log_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, len(items), _BATCH_PARAMS):
            self.client.log_batch(self.run_id, tags=items[i:i + _BATCH_PARAMS])

    def log_config(self, cfg: Any, filename: str = "config.yaml") -> Dict[str, str]:
        """Log the resolved config: params = :func:`flatten_config`, and the whole config as ``config.yaml``.

        Returns the params logged. MLflow params are write-once: logging a different value for
        an existing key (e.g. a changed config on resume) raises.
        """
        import yaml

        run_id = self._check()
        from mlflow.entities import Param

        params = flatten_config(cfg)
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), _BATCH_PARAMS):
            self.client.log_batch(run_id, params=items[i:i + _BATCH_PARAMS])
        self.client.log_text(run_id, yaml.safe_dump(_plain(cfg), sort_keys=False), filename)
        return params

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log ``{name: number}`` at ``step`` (the experience index, or a training iteration).

        Values may be ints, floats, bools, numpy scalars or one-element tensors; NaN is allowed.
        Anything else raises ``TypeError``. Names MLflow would reject are sanitised.
        """
        triples = []
        for name, value in metrics.items():
            v = _scalar(value)
            if v is None:
                raise TypeError(f"metric {name!r}: {type(value).__name__} is not a single number")
            triples.append((name, v, step))
        self.log_metric_values(triples)

    def log_metric_values(self, values: Iterable[Tuple[str, float, int]]) -> None:
        """Log ``(name, value, step)`` triples in batched requests (each with its own step)."""
        from mlflow.entities import Metric

        run_id = self._check()
        ts = _now_ms()
        latest: Dict[Tuple[str, int], float] = {}
        for name, value, step in values:
            latest[(_safe_key(name), int(step))] = float(value)   # a key logged twice at one step: the last wins
        items = [Metric(k, v, ts, s) for (k, s), v in latest.items()]
        for i in range(0, len(items), _BATCH_METRICS):
            self.client.log_batch(run_id, metrics=items[i:i + _BATCH_METRICS])

    def log_figure(self, fig: Any, filename: str) -> str:
        """Log a matplotlib (or plotly) figure as an image artifact (``.png`` added if no extension)."""
        run_id = self._check()
        if not os.path.splitext(filename)[1]:
            filename += ".png"
        self.client.log_figure(run_id, fig, filename)
        return filename

    def log_dict(self, d: Mapping[str, Any], filename: str) -> str:
        """Log ``d`` as an indented JSON artifact (tensors/arrays as lists, other objects as ``str``)."""
        run_id = self._check()
        self.client.log_text(run_id, json.dumps(_plain(d), indent=2), filename)
        return filename

    def log_text(self, text: str, filename: str) -> str:
        """Log a string as a text artifact."""
        self.client.log_text(self._check(), text, filename)
        return filename

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(experiment={self.experiment!r}, run_name={self.run_name!r}, "
                f"run_id={self._run_id!r}, tracking_uri={self.tracking_uri!r})")


class SweepTracker(RunTracker):
    """The parent run of a sweep (tag ``kind=sweep``): ``with SweepTracker(...) as sweep`` then
    ``with sweep.child(run_name) as run`` for each configuration.

    The children are created in the same experiment and store, nested under this run
    (``mlflow.parentRunId``). Runs in other processes can nest under it too:
    ``RunTracker(experiment, name, parent_run_id=sweep.run_id)``. Like any RunTracker, the parent is
    marked FAILED if an exception escapes the ``with`` block (a child's failure that the sweep
    catches leaves the parent FINISHED and the child FAILED).
    """

    kind = "sweep"

    def child(self, run_name: str, tags: Optional[Mapping[str, Any]] = None) -> RunTracker:
        """A RunTracker (not yet started) for one run nested under this sweep."""
        return RunTracker(self.experiment, run_name, tracking_uri=self.tracking_uri,
                          parent_run_id=self.run_id, tags=tags)
