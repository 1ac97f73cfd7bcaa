"""Experiments: configs, the runner, MLflow tracking and comparisons. The only place that touches MLflow."""
