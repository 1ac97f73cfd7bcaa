"""The shipped run configs: each one resolves, and ``icr_horizon.yaml`` is the long-horizon recipe study 23
ran, mixer by mixer (a config that drifted from the declared recipe would make a reader's re-run another
experiment than the one RESULTS.md reports)."""
import glob
import os

import pytest

from experiments.arguments import build_parser, parse_args
from experiments.config import run_config
from experiments.study import sweep_commands
from experiments.study_specs import load_study
from experiments.sweep import expand, parse_grid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "experiments", "configs", "*.yaml")))
HORIZON = os.path.join(ROOT, "experiments", "configs", "icr_horizon.yaml")
# the per-mixer differences icr_horizon.yaml's header states (study 17's rule gave each mixer its recipe)
PER_MIXER = {"delta": [], "ovq": [], "ssm": [], "deltanet": ["meta_train.steps=1000"],
             "linear": ["meta_train.steps=1000", "meta_train.retention_loss=0.0"]}


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p) for p in CONFIGS])
def test_every_shipped_config_resolves(path):
    cfg = run_config(path)
    assert cfg.model.layers, path


def test_horizon_config_is_study_23s_recipe_for_every_mixer():
    (_, argv), = sweep_commands(load_study("why_forget_confirm"))
    args = parse_args(build_parser(), argv)
    grid = parse_grid(args.grid)
    grid["seed"] = grid["seed"][:1]                     # one seed: the recipe does not depend on it
    declared = {cfg.model.layers[0]: cfg for cfg in expand(args.config, args.overrides, grid)}
    assert sorted(declared) == sorted(PER_MIXER)
    for mixer, extra in PER_MIXER.items():
        # the run identity: everything that changes a run's results, so the same seed must give the same one
        shipped = run_config(HORIZON, [f"model.layers=[{mixer}]", f"seed={declared[mixer].seed}", *extra])
        assert shipped.identity() == declared[mixer].identity(), mixer


def test_horizon_config_differs_from_the_standard_recipe():
    """The check above must be able to fail: the standard recipe (icr_budget.yaml at the same budget) is
    another config."""
    standard = run_config(os.path.join(ROOT, "experiments", "configs", "icr_budget.yaml"), ["model.state_budget=67840"])
    assert standard.identity() != run_config(HORIZON).identity()
