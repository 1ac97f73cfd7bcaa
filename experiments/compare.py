"""Comparisons across runs: mean and spread over seeds, never a single run.

The meta-training score (the task metric on the last meta-training batches) is shown beside the
stream's numbers: a mixer that never learned the task in meta-training cannot forget it, so its
forgetting numbers mean nothing.

Rows group runs that differ only by seed (same stream, layers, strategy, memory policy, and every other
config value); each cell is ``mean ± std (n)`` over seeds.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Dict, Iterable, List, Sequence

from strategies import forgetting

COLUMNS = ("final_average", "learning_average", "average_forgetting", "bwt")


def _stats(values: Sequence[float]) -> str:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "-"
    mean = statistics.fmean(values)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3f} ± {spread:.3f} ({len(values)})"


IGNORED_PREFIXES = ("seed", "tracking.", "checkpoint.", "output_dir", "progress")


def _varying(param_sets: Sequence[Dict[str, str]]) -> List[str]:
    """Config keys (not seed, tracking, checkpoints) whose values differ between runs."""
    keys = set().union(*param_sets) if param_sets else set()
    return sorted(k for k in keys if not k.startswith(IGNORED_PREFIXES)
                  and len({p.get(k) for p in param_sets}) > 1)


def group_by_config(items: Sequence, params_of) -> Dict[str, List]:
    """Items whose configs differ only by seed share a group; the group's name lists the differing values."""
    params = [params_of(it) for it in items]
    varying = _varying(params)
    groups: Dict[str, List] = defaultdict(list)
    for it, p in zip(items, params):
        name = ", ".join(f"{k.split('.', 1)[-1] if k.startswith('model.') else k}={p.get(k)}" for k in varying)
        groups[name or "all runs"].append(it)
    return groups


def group_results(results: Iterable) -> Dict[str, List]:
    """RunResults grouped by their config without the seed."""
    from experiments.tracking import flatten_config

    return group_by_config(list(results), lambda r: flatten_config(r.config))


def mlflow_table(experiment: str, tracking_uri: str = None, filter_string: str = "") -> str:
    """The same comparison from the runs in an MLflow experiment (finished runs only, sweep parents skipped)."""
    from experiments.tracking import runs_table

    rows = [r for r in runs_table(experiment, tracking_uri, filter_string)
            if r["status"] == "FINISHED" and r["tags"].get("kind") != "sweep"]
    groups = group_by_config(rows, lambda r: r["params"])
    head = ["configuration", "meta-train score", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups):
        runs = groups[key]
        meta = [next((v for k, v in r["metrics"].items() if k.startswith("meta_train/") and k != "meta_train/loss"
                      and k != "meta_train/final_loss"), math.nan) for r in runs]
        cells = [key, _stats(meta)] + [_stats([r["metrics"].get(f"final/{c}", math.nan) for r in runs]) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(results: Iterable, extra: Sequence[str] = ()) -> str:
    """A markdown table: one row per configuration, mean ± std (n seeds) of the summary numbers."""
    groups = group_results(results)
    head = ["configuration", "meta-train score", *COLUMNS, "state bytes/layer/lane", *extra]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups):
        runs = groups[key]
        meta = [r.meta_history[-1].get(r.metric, math.nan) if r.meta_history else math.nan for r in runs]
        cells = [key, _stats(meta)] + [_stats([r.summary.get(c, math.nan) for r in runs]) for c in COLUMNS]
        lanes = runs[0].config.strategy.train_mb_size
        cells.append(" / ".join(str(b // lanes) for b in runs[0].state_bytes))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mean_matrix(runs: Sequence) -> List[List[float]]:
    """Elementwise mean of the runs' R matrices."""
    K = len(runs[0].R)
    return [[statistics.fmean(r.R[j][i] for r in runs) for i in range(K)] for j in range(K)]


def curves_plot(results: Iterable, path: str, title: str = "") -> str:
    """Mean forgetting curve per configuration: score on experience i against experiences since i,
    averaged over i and seeds, with the spread over seeds as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, runs in sorted(group_results(results).items()):
        K = len(runs[0].R)
        per_seed = []
        for r in runs:
            rows = forgetting.forgetting_curve(r.R, r.tokens_after)
            per_seed.append([statistics.fmean(x["score"] for x in rows if x["experiences_since"] == d) for d in range(K)])
        mean = [statistics.fmean(s[d] for s in per_seed) for d in range(K)]
        sd = [statistics.stdev([s[d] for s in per_seed]) if len(per_seed) > 1 else 0.0 for d in range(K)]
        ax.plot(range(K), mean, marker="o", label=key)
        ax.fill_between(range(K), [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)], alpha=0.15)
    ax.set_xlabel("experiences since the evaluated experience was learned")
    ax.set_ylabel(runs[0].metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
