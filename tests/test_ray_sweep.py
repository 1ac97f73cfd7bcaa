"""Sweeps on Ray: the same runs, records and table as the serial sweep, trials as child runs of the
sweep's parent, a trial whose process is killed mid-run retried (resumed from its checkpoint) so the
sweep still finishes, and a restarted sweep reusing what finished. Run through the CLI in subprocesses
(the user's plugin registers names that must not leak into this process's registries)."""
import json
import os

import pytest

from test_extensions import CONFIG, ovq_cl

GRID = ["--grid", "seed=0;1;2;3"]


def sweep(tmp, backend, store, *extra, env=None):
    uri = f"sqlite:///{tmp / (store + '.db')}"
    args = ["sweep", "cfg.yaml", "--plugin", "plugins.extension", f"tracking.tracking_uri={uri}",
            f"checkpoint.dir=ckpt/{store}", *GRID, "--name", store, "--out", f"out/{store}", "--backend", backend,
            "--quiet", *extra]
    return ovq_cl(tmp, *args, env=env), uri


def records(tmp, store):
    return json.loads((tmp / "out" / store / f"{store}.json").read_text())


@pytest.mark.slow
def test_a_ray_sweep_gives_the_serial_sweeps_runs_and_table_and_survives_a_killed_trial(tmp_path):
    pytest.importorskip("ray")          # only this test runs trials on Ray; the option checks need no Ray
    from experiments.tracking import runs_table

    (tmp_path / "cfg.yaml").write_text(CONFIG)
    serial, _ = sweep(tmp_path, "serial", "serial")
    assert serial.returncode == 0, serial.stderr[-2000:]
    marker = tmp_path / "killed-once"
    # RAY_worker_niceness=0: Ray starts its workers at nice 15, starved to a crawl on a machine busy with
    # other jobs (seen here: importing torch took minutes); the test must not depend on an idle machine
    env = {"EXTENSION_KILL_BEFORE": "1", "EXTENSION_KILL_MARKER": str(marker), "RAY_worker_niceness": "0"}
    on_ray, uri = sweep(tmp_path, "ray", "ray", "--trial-cpus", "1", env=env)
    assert on_ray.returncode == 0, (on_ray.stdout + on_ray.stderr)[-3000:]
    assert marker.exists()                                             # one trial's process was killed
    a, b = records(tmp_path, "serial"), records(tmp_path, "ray")
    assert [r["label"] for r in a] == [r["label"] for r in b] and [r["config_id"] for r in a] == [r["config_id"] for r in b]
    assert [r["R"] for r in a] == [r["R"] for r in b]                  # the killed trial resumed to the same numbers
    assert (tmp_path / "out/serial/serial.md").read_text() == (tmp_path / "out/ray/ray.md").read_text()
    runs = {r["run_name"]: r for r in runs_table("ovq-cl", uri) if r["status"] == "FINISHED"}
    parent = runs.pop("ray")
    assert len(runs) == 4 and all(r["parent_run_id"] == parent["run_id"] for r in runs.values())
    # started again, every trial is reused from the store and nothing runs twice: reuse is decided in
    # run() by identity and store, whichever backend calls it, so the restart runs serially (a second
    # Ray start-up would add ~30 s to a suite that must stay under 10 minutes)
    again, _ = sweep(tmp_path, "serial", "ray")
    assert again.returncode == 0, again.stderr[-2000:]
    assert [r["run_id"] for r in records(tmp_path, "ray")] == [r["run_id"] for r in b]


def test_backend_options_are_checked_before_anything_runs(tmp_path, monkeypatch, capsys):
    from experiments.cli import main

    (tmp_path / "cfg.yaml").write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    for extra, message in ((["--backend", "serial", "--ray-address", "auto"], "need --backend ray"),
                           (["--backend", "ray", "--trial-cpus", "0"], "--trial-cpus must be > 0"),
                           (["--backend", "serial", "--trial-gpus", "1"], "need --backend ray")):
        assert main(["sweep", "cfg.yaml", f"tracking.tracking_uri=sqlite:///{tmp_path / 'bad.db'}", *GRID, *extra]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "bad.db").exists()                      # no parent run was created
