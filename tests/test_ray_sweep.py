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
def test_a_ray_sweep_gives_the_serial_sweeps_runs_and_table_and_survives_a_killed_trial(tmp_path, new_store):
    pytest.importorskip("ray")          # only this test runs trials on Ray; the option checks need no Ray
    from experiments.tracking import runs_table

    (tmp_path / "cfg.yaml").write_text(CONFIG)
    for store in ("serial", "ray"):
        new_store(tmp_path / (store + ".db"))
    serial, _ = sweep(tmp_path, "serial", "serial")
    assert serial.returncode == 0, serial.stderr[-2000:]
    marker = tmp_path / "killed-once"
    # RAY_worker_niceness=0: Ray starts its workers at nice 15, starved to a crawl on a machine busy with
    # other jobs (seen here: importing torch took minutes); the test must not depend on an idle machine
    env = {"EXTENSION_KILL_BEFORE": "1", "EXTENSION_KILL_MARKER": str(marker), "RAY_worker_niceness": "0"}
    on_ray, uri = sweep(tmp_path, "ray", "ray", "--trial-cpus", "1", env=env)
    assert on_ray.returncode == 0, (on_ray.stdout + on_ray.stderr)[-3000:]
    assert marker.exists()                                             # one trial's process was killed
    assert "(_trial" not in on_ray.stdout + on_ray.stderr                  # --quiet: no worker noise from Ray
    assert "| all runs |" in on_ray.stdout                                 # the table on stdout, quiet or not
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


@pytest.mark.slow
def test_sigterm_on_a_ray_sweep_marks_the_parent_and_its_running_trials_killed_and_a_restart_resumes_them(tmp_path, new_store):
    """SIGTERM (a scheduler's stop, `timeout`) to a Ray sweep's driver: as Ctrl-C on a serial sweep,
    exit 143 with one line, the parent run and every trial that had started KILLED (none left RUNNING),
    their checkpoints kept; started again, each trial resumes at the experience it had reached. The
    driver is started in the background with SIGINT ignored, as `cmd &` does in a script (Ray interrupts
    a cancelled trial through SIGINT, which such a driver's workers would otherwise ignore)."""
    pytest.importorskip("ray")
    import signal
    import subprocess
    import sys
    import time

    from experiments.tracking import runs_table
    from test_extensions import ROOT

    (tmp_path / "cfg.yaml").write_text(CONFIG)
    marker = tmp_path / "waiting"
    uri = new_store(tmp_path / "ray.db")
    args = ["sweep", "cfg.yaml", "--plugin", "plugins.extension", f"tracking.tracking_uri={uri}", "checkpoint.dir=ckpt",
            "--grid", "seed=0;1", "--name", "ray", "--out", "out"]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "tests"), "RAY_worker_niceness": "0",
           "EXTENSION_WAIT_BEFORE": "1", "EXTENSION_WAIT_MARKER": str(marker)}
    driver = subprocess.Popen([sys.executable, "-m", "experiments.cli", *args, "--backend", "ray", "--trial-cpus", "1"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 240
    while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert marker.exists(), "no trial reached experience 1"
    time.sleep(1.0)                                   # a second trial, if the machine runs two, gets there too
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 143, (out + err)[-3000:]
    assert "terminated (SIGTERM)" in err and "Traceback" not in err and "SIGTERM received" not in err
    # not quiet: each trial's decision in full, in plain text (Ray would fold lines that differ only in
    # numbers, the two seeds' start lines, into one "[repeated 2x across cluster]", in colour)
    for pid in marker.read_text().split():                  # every trial that got to experience 1
        assert f"(_trial pid={pid}) ovq-cl: run " in err, err[-3000:]
    assert "repeated" not in err and "\x1b[" not in err, err[-3000:]
    runs = runs_table("ovq-cl", uri)
    statuses = {r["run_name"]: r["status"] for r in runs}
    assert statuses.pop("ray") == "KILLED"
    waiting = len(marker.read_text().split())       # trials at experience 1; on a busy machine another may
    assert waiting >= 1 and len(statuses) >= waiting and set(statuses.values()) == {"KILLED"}, statuses  # be earlier
    # started again (serially: reuse and resume are decided by run() whatever the backend), each
    # trial that had started resumes at experience 1 and every run finishes
    env.pop("EXTENSION_WAIT_BEFORE")
    again = subprocess.run([sys.executable, "-m", "experiments.cli", *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("at experience 1") >= waiting, again.stderr[-3000:]
    finished = [r for r in runs_table("ovq-cl", uri) if r["status"] == "FINISHED" and r["run_name"] != "ray"]
    assert len(finished) == 2
