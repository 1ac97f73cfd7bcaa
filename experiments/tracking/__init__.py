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
    """
from __future__ import annotations

from experiments.tracking.params import (
    DEFAULT_TRACKING_URI, MAX_KEY_LENGTH, MAX_PARAM_VALUE_LENGTH, MAX_TAG_VALUE_LENGTH, TRUNCATED_MARKER,
    default_tracking_uri, flatten_config,
)
from experiments.tracking.query import runs_table
from experiments.tracking.runs import RunTracker, SweepTracker, environment_tags

__all__ = [
    "DEFAULT_TRACKING_URI", "MAX_KEY_LENGTH", "MAX_PARAM_VALUE_LENGTH", "MAX_TAG_VALUE_LENGTH", "MLflowLogger",
    "RunTracker", "SweepTracker", "TRUNCATED_MARKER", "default_tracking_uri", "environment_tags", "flatten_config",
    "runs_table",
]


def __getattr__(name: str):
    # PEP 562: ``MLflowLogger`` is imported on first access, so that ``import experiments.tracking``
    # stays free of Avalanche (seconds to import) for code that only reads runs.
    if name == "MLflowLogger":
        from experiments.tracking.avalanche_logger import MLflowLogger

        return MLflowLogger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
