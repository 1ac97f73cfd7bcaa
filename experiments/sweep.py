"""Sweeps as code: a base config times a grid of overrides, run one after the other under one parent
MLflow run (one child run per configuration)."""
from __future__ import annotations

import itertools
import traceback
from typing import Dict, List, Optional, Sequence

from experiments.config import RunConfig, run_config


def expand(base, overrides: Sequence[str], grid: Dict[str, List[str]], plugins: Sequence[str] = ()) -> List[RunConfig]:
    """Every combination of the grid's values (each a dotlist value string) on top of base + overrides.

    expand("experiments/configs/icr_frozen.yaml", [], {"model.layers": ["[ovq]", "[full]"], "seed": ["0", "1"]})
    -> 4 RunConfigs.
    """
    keys = list(grid)
    configs = []
    for values in itertools.product(*(grid[k] for k in keys)):
        configs.append(run_config(base, list(overrides) + [f"{k}={v}" for k, v in zip(keys, values)], plugins=plugins))
    return configs


def parse_grid(items: Sequence[str]) -> Dict[str, List[str]]:
    """["model.layers=[ovq];[full]", "seed=0;1;2"] -> {"model.layers": ["[ovq]", "[full]"], "seed": ["0", "1", "2"]}."""
    grid: Dict[str, List[str]] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"grid entry {item!r} is not KEY=V1;V2;...")
        key, values = item.split("=", 1)
        grid[key.strip()] = [v.strip() for v in values.split(";") if v.strip()]
        if not grid[key.strip()]:
            raise ValueError(f"grid entry {item!r} has no values")
    return grid


def run_sweep(configs: List[RunConfig], name: str, tracking_uri: Optional[str] = None, experiment: Optional[str] = None):
    """Runs every config; a failed run is reported and the sweep goes on. Returns (results, failures)."""
    from experiments.runner import run
    from experiments.tracking import SweepTracker

    experiment = experiment or (configs[0].tracking.experiment if configs else "ovq-cl")
    results, failures = [], []
    with SweepTracker(experiment, name, tracking_uri or (configs[0].tracking.tracking_uri if configs else None)) as parent:
        parent.set_tags({"n_runs": len(configs)})
        for cfg in configs:
            cfg.tracking.experiment = experiment
            try:
                results.append(run(cfg, parent_run_id=parent.run_id))
            except Exception as err:  # one broken configuration must not lose the others
                failures.append((cfg.label(), f"{type(err).__name__}: {err}"))
                traceback.print_exc()
        parent.set_tags({"n_failed": len(failures)})
    return results, failures
