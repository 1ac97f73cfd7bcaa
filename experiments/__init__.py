"""Experiments: configs, the runner, MLflow tracking and comparisons. The only place that touches MLflow."""

import os

# MLflow 3 starts a telemetry thread that sets and unsets an environment variable while other threads copy
# os.environ (a KeyError in whatever copies it, e.g. the git calls of the tracking tags); nothing may leave
# the machine anyway. A user who wants it sets MLFLOW_DISABLE_TELEMETRY=false.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
