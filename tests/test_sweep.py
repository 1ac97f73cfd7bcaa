"""Sweeps: a grid expands to configs, runs nest under one parent run, the comparison aggregates seeds."""
import pytest

from experiments import compare
from experiments.sweep import expand, parse_grid, run_sweep

from test_runner import TINY


def test_grid_expands_to_every_combination():
    grid = parse_grid(["model.layers=[ovq];[swa,ovq]", "seed=0;1;2"])
    configs = expand(TINY, [], grid)
    assert len(configs) == 6
    assert sorted({tuple(c.model.layers) for c in configs}) == [("ovq",), ("swa", "ovq")]
    assert sorted(c.seed for c in configs) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="KEY=V1"):
        parse_grid(["seed"])


def test_sweep_nests_runs_and_compares_over_seeds(tmp_path, monkeypatch):
    from experiments.tracking import runs_table

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    monkeypatch.chdir(tmp_path)
    base = {**TINY, "tracking": {"tracking_uri": uri, "experiment": "sweep-test"},
            "checkpoint": {"dir": str(tmp_path / "ckpt")},
            "stream": {"name": "icr", "options": {**TINY["stream"]["options"], "n_experiences": 2}}}
    configs = expand(base, [], {"seed": ["0", "1"]})
    results, failures = run_sweep(configs, "tiny-sweep")
    assert not failures and len(results) == 2
    runs = {r["run_name"]: r for r in runs_table("sweep-test", uri)}
    parent = runs.pop("tiny-sweep")
    assert parent["status"] == "FINISHED" and len(runs) == 2
    assert all(r["parent_run_id"] == parent["run_id"] and r["status"] == "FINISHED" for r in runs.values())
    text = compare.table(results)
    assert "± " in text and "(2)" in text and text.count("\n") == 2      # header, rule, one configuration
    from_store = compare.mlflow_table("sweep-test", uri)
    assert from_store.count("\n") == 2 and "(2)" in from_store and "all runs" in from_store
    png = compare.curves_plot(results, str(tmp_path / "curves.png"))
    assert open(png, "rb").read(4) == b"\x89PNG"


def test_groups_are_named_by_the_values_that_differ_and_never_merge_configs():
    items = [{"seed": "0", "model.vq.codebook_size": "16", "stream.name": "icr"},
             {"seed": "1", "model.vq.codebook_size": "16", "stream.name": "icr"},
             {"seed": "0", "model.vq.codebook_size": "32", "stream.name": "icr"}]
    groups = compare.group_by_config(items, lambda p: p)
    assert {k: len(v) for k, v in groups.items()} == {"vq.codebook_size=16": 2, "vq.codebook_size=32": 1}
