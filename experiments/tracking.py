"""MLflow tracking: one MLflow run per experiment run, nested under a parent run for a sweep.

Everything goes through :class:`mlflow.MlflowClient` bound to an explicit tracking URI, never through
the fluent ``mlflow.start_run`` API: no global "active run" exists, so two trackers (a sweep parent and
its children, or two runs in one process) never interfere, and nothing leaks into other code.

- :func:`default_tracking_uri`: explicit argument > ``MLFLOW_TRACKING_URI`` > ``sqlite:///mlruns.db``.
- :func:`flatten_config`: a resolved config as dotted keys with ``str`` values (MLflow params).
- :class:`RunTracker`: a context manager for ONE run; FINISHED on a clean exit, FAILED when any
  exception (KeyboardInterrupt included) escapes, which is then re-raised.
- :class:`SweepTracker`: the parent run of a sweep; ``sweep.child(run_name)`` gives nested RunTrackers.
- ``MLflowLogger``: an Avalanche logger forwarding every scalar metric value to a RunTracker with
  ``step = x_plot``. It is built on first access (``from experiments.tracking import MLflowLogger``),
  so that importing this module does not import Avalanche (seconds) for code that only reads runs.
- :func:`runs_table`: the runs of an experiment as plain dicts (for comparisons).

Example::

    with SweepTracker("icr-shift", "sweep-2024-06") as sweep:
        for seed in (0, 1, 2):
            with sweep.child(f"ovq/naive/persist/seed{seed}") as run:
                run.log_config(cfg)
                strategy = Naive(..., evaluator=EvaluationPlugin(..., loggers=[MLflowLogger(run)]))
                ...
                run.log_metrics({"avg_accuracy": acc}, step=j)
                run.log_matrix("accuracy_matrix", R)
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import os
import platform
import re
import socket
import subprocess
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

DEFAULT_TRACKING_URI = "sqlite:///mlruns.db"
"""The default store: a SQLite file in the current directory (``mlflow ui --backend-store-uri sqlite:///mlruns.db``)."""

MAX_PARAM_VALUE_LENGTH = 6000   # MLflow's limit on a param value (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH)
MAX_TAG_VALUE_LENGTH = 8000     # ... on a tag value
MAX_KEY_LENGTH = 250            # ... on a param, metric or tag key
TRUNCATED_MARKER = "...[truncated]"

_PROJECT_DIR = Path(__file__).resolve().parents[1]
_PACKAGES = {"torch": "torch", "avalanche": "avalanche-lib", "mlflow": "mlflow", "ovq-cl": "ovq-cl"}
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- ]" if os.name == "nt" else r"[^/\w.\- :]")
_BATCH_METRICS = 1000           # MLflow's per-request limits
_BATCH_PARAMS = 100

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_TRACKING_URI", "MLflowLogger", "RunTracker", "SweepTracker", "default_tracking_uri",
    "flatten_config", "runs_table",
]


# ---------------------------------------------------------------------------------------------------
# small helpers


def default_tracking_uri(explicit: Optional[str] = None) -> str:
    """The tracking URI to use: ``explicit`` if given, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlruns.db``.

    The default SQLite file is relative to the current directory. A tracking server is simply
    ``http://host:5000``. A plain ``file:`` store is refused by MLflow 3 unless
    ``MLFLOW_ALLOW_FILE_STORE=true``; prefer SQLite.
    """
    if explicit:
        return str(explicit)
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def _to_container(cfg: Any) -> Any:
    """A resolved omegaconf config / dataclass / mapping as plain Python containers."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(cfg, (DictConfig, ListConfig)):
            return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if isinstance(cfg, Mapping):
        return {k: _to_container(v) if _is_config_like(v) else v for k, v in cfg.items()}
    return cfg


def _is_config_like(v: Any) -> bool:
    return isinstance(v, Mapping) or (dataclasses.is_dataclass(v) and not isinstance(v, type)) or \
        type(v).__name__ in ("DictConfig", "ListConfig")


def _truncate(value: str, limit: int, what: str) -> str:
    if len(value) <= limit:
        return value
    log.warning("%s is %d characters, over MLflow's limit of %d: truncated (the full value is in config.yaml)",
                what, len(value), limit)
    return value[: limit - len(TRUNCATED_MARKER)] + TRUNCATED_MARKER


def _safe_key(name: str) -> str:
    """``name`` if MLflow accepts it as a param/metric key, else a sanitised version of it.

    MLflow keys may hold alphanumerics, ``_ - . / space`` and (not on Windows) ``:``, must be at most
    250 characters, and must be normalised paths (no ``//``, no leading or trailing ``/``, no ``.``/``..``).
    """
    name = str(name)
    if not _BAD_KEY_CHARS.search(name) and len(name) <= MAX_KEY_LENGTH and _normalised(name):
        return name
    s = re.sub(r"/+", "/", _BAD_KEY_CHARS.sub("_", name)).strip("/")
    s = "/".join("_" if part in (".", "..") else part for part in s.split("/")) or "_"
    return s[:MAX_KEY_LENGTH].rstrip("/")


def _normalised(name: str) -> bool:
    import posixpath

    norm = posixpath.normpath(name)
    return bool(name) and norm == name and norm != "." and not norm.startswith("..") and not norm.startswith("/")


def flatten_config(cfg: Any, prefix: str = "") -> Dict[str, str]:
    """Flatten a config into MLflow params: dotted keys, ``str`` values.

    ``cfg`` may be an omegaconf ``DictConfig`` (interpolations are resolved), a dataclass or a
    mapping, nested to any depth: ``{"model": {"ovq": {"num_slots": 64}}}`` gives
    ``{"model.ovq.num_slots": "64"}``. A list or tuple stays one param, the ``repr`` of it as a plain
    list (``"[64, 128]"``, as omegaconf and ``config.yaml`` have it); an empty mapping becomes ``"{}"``;
    ``None`` becomes ``"None"``.

    A value longer than MLflow's limit (6000 characters) is truncated and ends with
    ``TRUNCATED_MARKER`` (a warning is logged; :meth:`RunTracker.log_config` also stores the
    whole config as ``config.yaml``). Keys MLflow would reject are sanitised (bad characters -> ``_``).
    """
    container = _to_container(cfg)
    if not isinstance(container, Mapping):
        raise TypeError(f"flatten_config needs a mapping-like config, got {type(cfg).__name__}")
    out: Dict[str, str] = {}

    def walk(node: Mapping, path: str) -> None:
        for k, v in node.items():
            key = f"{path}.{k}" if path else str(k)
            v = _to_container(v) if _is_config_like(v) else v
            if isinstance(v, Mapping) and v:
                walk(v, key)
            else:
                text = "{}" if isinstance(v, Mapping) else (repr(_plain(v)) if isinstance(v, (list, tuple)) else str(v))
                out[_safe_key(key)] = _truncate(text, MAX_PARAM_VALUE_LENGTH, f"param {key!r}")

    walk(container, prefix)
    return out


def _plain(obj: Any) -> Any:
    """Plain YAML/JSON-safe Python: containers recursed, numbers/str/bool/None kept, tensors/arrays as
    lists or scalars, anything else as ``str``."""
    if _is_config_like(obj):
        obj = _to_container(obj)
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "tolist"):          # numpy arrays/scalars, torch tensors
        return _plain(obj.tolist())
    return str(obj)


def _scalar(value: Any) -> Optional[float]:
    """``value`` as a float if it is one number (int, float, bool, numpy scalar, one-element tensor), else None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    try:
        n = numel() if callable(numel) else numel
        if n == 1 and hasattr(value, "item"):
            item = value.item()
            if isinstance(item, (bool, int, float)):
                return float(item)
    except Exception:  # noqa: BLE001 - anything that is not a number is simply not a scalar
        pass
    return None


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", "-C", str(_PROJECT_DIR), *args], capture_output=True, text=True, timeout=10,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},   # read-only: never take the index lock
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def environment_tags() -> Dict[str, str]:
    """Tags that identify the code and environment of a run.

    ``git.commit`` (also ``mlflow.source.git.commit``, shown by the MLflow UI; ``"unknown"`` outside
    a git checkout), ``git.dirty`` (``"true"`` when tracked or untracked non-ignored files differ from
    the commit, ``"unknown"`` outside a checkout), ``version.python``, ``version.torch``,
    ``version.avalanche``, ``version.mlflow``, ``version.ovq-cl`` (``"not installed"`` when
    missing) and ``host``.
    """
    commit = (_git("rev-parse", "HEAD") or "").strip() or "unknown"
    status = _git("status", "--porcelain") if commit != "unknown" else None
    tags = {
        "git.commit": commit,
        "mlflow.source.git.commit": commit,
        "git.dirty": "unknown" if status is None else str(bool(status.strip())).lower(),
        "version.python": platform.python_version(),
        "host": socket.gethostname(),
    }
    for short, dist in _PACKAGES.items():
        try:
            tags[f"version.{short}"] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            tags[f"version.{short}"] = "not installed"
    return tags


def _client(tracking_uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------------------------------
# runs


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
            self._client_obj = _client(self.tracking_uri)
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
        tags = {**environment_tags(), "kind": self.kind, **self.tags}
        if self.parent_run_id:
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
        try:
            self._record_error(exc_type, exc, tb)
        finally:
            try:
                self.end("FAILED")
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

    def log_matrix(
        self,
        name: str,
        matrix: Sequence[Sequence[Any]],
        row_label: str = "trained_on",
        col_label: str = "evaluated_on",
        row_names: Optional[Sequence[Any]] = None,
        col_names: Optional[Sequence[Any]] = None,
    ) -> str:
        """Log a matrix (e.g. R[j][i]) as the CSV artifact ``<name>.csv``; returns the artifact path.

        ``matrix`` is a list of rows (ragged rows are padded); ``None`` and NaN are written as
        empty cells. The header row is ``"<row_label>\\<col_label>", <col names...>`` and each row
        starts with its row name (default: 0, 1, ...). For example::

            trained_on\\evaluated_on,0,1
            0,0.9,
            1,0.7,0.95
        """
        run_id = self._check()
        rows = [list(r.tolist() if hasattr(r, "tolist") else r) for r in
                (matrix.tolist() if hasattr(matrix, "tolist") else matrix)]
        n_cols = max((len(r) for r in rows), default=0)
        row_names = list(range(len(rows))) if row_names is None else list(row_names)
        col_names = list(range(n_cols)) if col_names is None else list(col_names)
        if len(row_names) != len(rows) or len(col_names) < n_cols:
            raise ValueError(f"{len(rows)} rows x {n_cols} columns, but {len(row_names)} row names "
                             f"and {len(col_names)} column names")

        def cell(v: Any) -> str:
            if v is None:
                return ""
            f = _scalar(v)
            if f is None:
                return str(v)
            if math.isnan(f):
                return ""
            return str(int(f)) if isinstance(v, int) and not isinstance(v, bool) else repr(f)

        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow([f"{row_label}\\{col_label}", *col_names])
        for rname, row in zip(row_names, rows):
            writer.writerow([rname, *(cell(v) for v in row), *([""] * (len(col_names) - len(row)))])
        filename = name if name.endswith(".csv") else f"{name}.csv"
        self.client.log_text(run_id, buf.getvalue(), filename)
        return filename

    def log_figure(self, fig: Any, filename: str) -> str:
        """Log a matplotlib (or plotly) figure as an image artifact (``.png`` added if no extension)."""
        run_id = self._check()
        if not os.path.splitext(filename)[1]:
            filename += ".png"
        self.client.log_figure(run_id, fig, filename)
        return filename

    def log_artifact(self, path: str, artifact_path: Optional[str] = None) -> None:
        """Log a local file (or, via MLflow, a directory's files) under ``artifact_path``."""
        run_id = self._check()
        if os.path.isdir(path):
            self.client.log_artifacts(run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(run_id, str(path), artifact_path)

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


def runs_table(experiment: str, tracking_uri: Optional[str] = None, filter_string: str = "") -> List[Dict[str, Any]]:
    """All (non-deleted) runs of ``experiment``, oldest first, as plain dicts.

    Each row: ``run_id``, ``run_name``, ``status``, ``parent_run_id`` (None for top-level runs),
    ``start_time``/``end_time`` (ms since the epoch), ``params`` (str values), ``metrics`` (the
    final value of each metric: the one at the largest step) and ``tags``. ``filter_string`` is
    MLflow's search syntax (e.g. ``"params.seed = '0'"``). An unknown experiment gives ``[]``.
    """
    client = _client(default_tracking_uri(tracking_uri))
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    rows, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=1000,
                                  order_by=["attributes.start_time ASC"], page_token=token)
        for run in page:
            rows.append({
                "run_id": run.info.run_id,
                "run_name": run.info.run_name,
                "status": run.info.status,
                "parent_run_id": run.data.tags.get("mlflow.parentRunId"),
                "start_time": run.info.start_time,
                "end_time": run.info.end_time,
                "params": dict(run.data.params),
                "metrics": dict(run.data.metrics),
                "tags": dict(run.data.tags),
            })
        token = page.token
        if not token:
            return rows


# ---------------------------------------------------------------------------------------------------
# the Avalanche logger (built lazily: importing Avalanche takes seconds)


def _make_mlflow_logger_class():
    import ovq_cl.base.avalanche_compat  # noqa: F401  (before any avalanche import)
    from avalanche.evaluation.metric_results import AlternativeValues
    from avalanche.logging import BaseLogger

    class MLflowLogger(BaseLogger):
        """An Avalanche logger that forwards every scalar metric value to a :class:`RunTracker`.

        Each ``MetricValue`` becomes an MLflow metric named as in Avalanche (e.g.
        ``Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp001``; sanitised only if MLflow would
        reject it) with ``step = x_plot`` (Avalanche's x_plot is the strategy clock's training
        iteration count). Dict values become ``name/key`` metrics (as in Avalanche's base logger);
        ``AlternativeValues`` give their first numeric alternative. Values that are not a single
        number (images, figures, tensors with more than one element) are skipped; their names are
        collected in :attr:`skipped`. All values of one callback go in one batched request.

        Usage: ``EvaluationPlugin(accuracy_metrics(experience=True), loggers=[MLflowLogger(tracker)])``
        inside ``with tracker:``.
        """

        def __init__(self, tracker: RunTracker):
            super().__init__()
            self.tracker = tracker
            self.skipped: set = set()

        def _triples(self, name: str, value: Any, x_plot: Any) -> List[Tuple[str, float, int]]:
            if isinstance(value, AlternativeValues):
                value = next((a for a in value.alternatives if _scalar(a) is not None), None)
            if isinstance(value, Mapping):
                return [t for k, v in value.items() for t in self._triples(f"{name}/{k}", v, x_plot)]
            v = _scalar(value)
            if v is None:
                if name not in self.skipped:
                    log.debug("MLflowLogger: skipping non-scalar metric %s (%s)", name, type(value).__name__)
                    self.skipped.add(name)
                return []
            return [(name, v, 0 if x_plot is None else int(x_plot))]

        def log_single_metric(self, name, value, x_plot) -> None:
            self.tracker.log_metric_values(self._triples(name, value, x_plot))

        def log_metrics(self, metric_values) -> None:
            triples = [t for mv in metric_values for t in self._triples(mv.name, mv.value, mv.x_plot)]
            if triples:
                self.tracker.log_metric_values(triples)

    MLflowLogger.__module__ = __name__
    MLflowLogger.__qualname__ = "MLflowLogger"
    return MLflowLogger


def __getattr__(name: str):
    # PEP 562: ``MLflowLogger`` is defined on first access, so that ``import experiments.tracking``
    # stays free of Avalanche; the class is then cached in the module (and pickles by reference).
    if name == "MLflowLogger":
        cls = _make_mlflow_logger_class()
        globals()["MLflowLogger"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
