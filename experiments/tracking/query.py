"""Reading runs back: the runs of an experiment as plain dicts (for comparisons)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments.tracking.params import default_tracking_uri
from experiments.tracking.runs import tracking_client


def runs_table(experiment: str, tracking_uri: Optional[str] = None, filter_string: str = "") -> List[Dict[str, Any]]:
    """All (non-deleted) runs of ``experiment``, oldest first, as plain dicts.

    Each row: ``run_id``, ``run_name``, ``status``, ``parent_run_id`` (None for top-level runs),
    ``start_time``/``end_time`` (ms since the epoch), ``params`` (str values), ``metrics`` (the
    final value of each metric: the one at the largest step) and ``tags``. ``filter_string`` is
    MLflow's search syntax (e.g. ``"params.seed = '0'"``). An unknown experiment gives ``[]``.
    """
    client = tracking_client(default_tracking_uri(tracking_uri))
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


def metric_histories(client, run_id: str, keys: List[str]) -> Dict[str, Dict[int, float]]:
    """Each metric's value at each step of one run, read with ``client`` (one
    :func:`~experiments.tracking.runs.tracking_client` for all the runs a caller reads): ``{key: {step:
    value}}`` (``{}`` for a key never logged). Where a step was logged twice (a run resumed from a
    checkpoint logs an experience again), the later value wins."""
    out: Dict[str, Dict[int, float]] = {}
    for key in keys:
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)
        out[key] = {int(m.step): float(m.value) for m in history}
    return out
