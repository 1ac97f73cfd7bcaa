"""Runs a researcher can rely on: results reused only for the same config and code, safe resume,
another store, corrupt checkpoints, SIGTERM, meta-training checkpoints, one-line errors, early checks."""
import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments.config import run_config
from experiments.runner import run
from experiments.tracking import runs_table
from test_runner import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cfg_in(tmp, experiment, uri, **sections):
    user = {**TINY, "tracking": {"experiment": experiment, "tracking_uri": uri},
            "checkpoint": {"dir": str(tmp / "ckpt")}}
    user.update(sections)
    return run_config(user)


@pytest.fixture
def store(tmp_path, monkeypatch, new_store):
    monkeypatch.chdir(tmp_path)
    return new_store(tmp_path / "mlruns.db")


def test_a_finished_run_is_reused_only_for_the_same_config_and_code(tmp_path, store, monkeypatch):
    import experiments.runner as runner

    said = []
    monkeypatch.setattr(runner, "code_version", lambda: "aaaa")
    first = run(cfg_in(tmp_path, "cache", store), announce=said.append)
    again = run(cfg_in(tmp_path, "cache", store, progress=True), announce=said.append)    # harmless change
    assert again.run_id == first.run_id and again.R == first.R
    assert any(f"reusing finished run {first.run_id}" in s and "--rerun" in s for s in said)
    assert [r["status"] for r in runs_table("cache", store)] == ["FINISHED"]
    monkeypatch.setattr(runner, "code_version", lambda: "bbbb")                # the code changed: run again
    changed = run(cfg_in(tmp_path, "cache", store))
    forced = run(cfg_in(tmp_path, "cache", store), rerun=True)
    assert len({first.run_id, changed.run_id, forced.run_id}) == 3
    runs = runs_table("cache", store)
    assert len(runs) == 3 and {r["tags"]["code_version"] for r in runs} == {"aaaa", "bbbb"}


def test_resuming_with_a_harmless_setting_changed_finishes_the_same_run(tmp_path, store):
    assert run(cfg_in(tmp_path, "resume", store), stop_after=0).after_experience == 0
    resumed = run(cfg_in(tmp_path, "resume", store, progress=True))
    (row,) = runs_table("resume", store)
    assert row["run_id"] == resumed.run_id and row["status"] == "FINISHED"
    assert row["params"]["progress"] == "None"           # params are the first run's; nothing clashed


def test_a_resumed_runs_wall_time_counts_its_earlier_attempt_up_to_the_checkpoint(tmp_path, store):
    """A run stopped after experience 0 and resumed: its record says 2 attempts and a wall time that holds
    the first attempt's seconds up to its checkpoint (stored there), not the second attempt's alone."""
    import torch

    run(cfg_in(tmp_path, "wall", store), stop_after=0)
    (path,) = glob.glob(str(tmp_path / "ckpt" / "*" / "last.pt"))
    first = torch.load(path, weights_only=False)["extra"]
    assert first["attempts"] == 1 and first["wall_seconds"] > 0
    began = time.perf_counter()
    resumed = run(cfg_in(tmp_path, "wall", store))
    second = time.perf_counter() - began
    assert resumed.attempts == 2 and resumed.record()["attempts"] == 2
    assert first["wall_seconds"] < resumed.wall_seconds <= first["wall_seconds"] + second
    fresh = run(cfg_in(tmp_path, "wall", store, seed=1))           # another run, in one attempt
    assert fresh.attempts == 1
    # a checkpoint that kept no time (written by older code): the attempts before it are unknown, not 0
    run(cfg_in(tmp_path, "wall", store, seed=2), stop_after=0)
    (path,) = [p for p in glob.glob(str(tmp_path / "ckpt" / "*-s2-*" / "last.pt"))]
    ckpt = torch.load(path, weights_only=False)
    for key in ("wall_seconds", "attempts"):
        del ckpt["extra"][key]
    torch.save(ckpt, path)
    assert run(cfg_in(tmp_path, "wall", store, seed=2)).attempts is None


def test_two_stores_keep_their_own_checkpoints_and_both_resume(tmp_path, store, new_store):
    """Running a config against another store (a shell with MLFLOW_TRACKING_URI set) never touches the
    first store's checkpoint: each store's unfinished run resumes in it, each finished run is reused in
    its own store. A store that lost the run (replaced, or the run deleted) starts over, saying so."""
    said = []
    other = new_store(tmp_path / "other.db")
    a = run(cfg_in(tmp_path, "stores", store), stop_after=0)
    b = run(cfg_in(tmp_path, "stores", other), stop_after=0, announce=said.append)
    assert a.checkpoint != b.checkpoint and not any("starting over" in s for s in said)
    resumed_a = run(cfg_in(tmp_path, "stores", store), announce=said.append)
    resumed_b = run(cfg_in(tmp_path, "stores", other), announce=said.append)
    assert (resumed_a.run_id, resumed_b.run_id) == (a.run_id, b.run_id) and resumed_a.R == resumed_b.R
    assert sum("resuming run" in s for s in said) == 2
    again = run(cfg_in(tmp_path, "stores", store), announce=said.append)
    assert again.run_id == a.run_id and any(f"reusing finished run {a.run_id}" in s for s in said)
    assert [r["status"] for r in runs_table("stores", store)] == ["FINISHED"]
    assert [r["status"] for r in runs_table("stores", other)] == ["FINISHED"]
    import experiments.runner as runner

    runner_exists, n = runner.run_exists, len(said)
    try:                                                # the store was replaced: its run no longer exists
        runner.run_exists = lambda uri, run_id: False
        third = run(cfg_in(tmp_path, "stores", store), announce=said.append)
    finally:
        runner.run_exists = runner_exists
    assert third.run_id not in (a.run_id, b.run_id) and any("starting over" in s for s in said[n:])


def test_a_second_process_on_the_same_run_refuses_in_one_line_and_a_dead_holder_holds_nothing(tmp_path, store):
    """Two processes on one run identity: the second refuses at once, naming the first (CLI: one line,
    exit 2; a sweep: that run skipped, the others run). When the holder dies (SIGKILL: no clean-up), its
    lock goes with it and the next start runs."""
    import signal
    import subprocess

    from experiments.run_lock import RunInUse
    from experiments.runner import resolve

    cfg = cfg_in(tmp_path, "locked", store)
    folder = os.path.dirname(resolve(cfg).checkpoint_path)
    hold = ("import sys, time; from experiments.run_lock import run_lock\n"
            "with run_lock(sys.argv[1], 'x'):\n    print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", hold, folder], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunInUse, match=f"in use by process {holder.pid} "):
            run(cfg)
        from experiments.config import as_yaml

        (tmp_path / "locked.yaml").write_text(as_yaml(cfg))
        cli = subprocess.run([sys.executable, "-m", "experiments.cli", "run", "--quiet", str(tmp_path / "locked.yaml")],
                             cwd=tmp_path, capture_output=True, text=True)
        assert cli.returncode == 2 and f"in use by process {holder.pid}" in cli.stderr
        assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr
        from experiments.sweep import run_sweep

        other = cfg_in(tmp_path, "locked", store, seed=1)
        results, failures = run_sweep([cfg, other], "locked_sweep", announce=lambda m: None)
        assert [r.config.seed for r in results] == [1] and len(failures) == 1 and "in use" in failures[0][1]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert len(run(cfg).R) == 3                                       # the dead holder's lock is gone



def test_a_corrupt_checkpoint_falls_back_to_the_previous_one_or_says_how_to_start_over(tmp_path, store):
    from strategies.training.checkpoint import CheckpointError

    straight = run(cfg_in(tmp_path / "a", "corrupt", store))
    cfg = cfg_in(tmp_path / "b", "corrupt", store)
    assert run(cfg, stop_after=1).after_experience == 1                       # last.pt at 2, prev.pt at 1
    (last,) = glob.glob(str(tmp_path / "b" / "ckpt" / "*" / "last.pt"))
    open(last, "wb").write(b"not a checkpoint")
    said = []
    resumed = run(cfg_in(tmp_path / "b", "corrupt", store), announce=said.append)
    assert resumed.R == straight.R and any("previous checkpoint" in s for s in said)
    for name in ("last.pt", "prev.pt"):
        open(os.path.join(os.path.dirname(last), name), "wb").write(b"garbage")
    with pytest.raises(CheckpointError, match="checkpoint.resume=false"):
        run(cfg_in(tmp_path / "b", "corrupt", store))


def test_sigterm_marks_the_run_killed_and_meta_training_resumes_to_the_same_result(tmp_path, new_store):
    """SIGTERM during meta-training (after its first checkpoint): exit 143, run KILLED; the next start
    resumes meta-training from its checkpoint and ends with the same R as an uninterrupted run."""
    uri = new_store(tmp_path / "mlruns.db")
    args = [sys.executable, "-m", "experiments.cli", "run", os.path.join(ROOT, "experiments/configs/icr_frozen.yaml"),
            "model.d_model=32", "model.n_heads=2", "meta_train.steps=40", "meta_train.checkpoint_every=10",
            "stream.options.train_episodes=16", f"tracking.tracking_uri={uri}"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(args + ["checkpoint.dir=killed"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not glob.glob(str(tmp_path / "killed" / "*" / "last.pt")):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "terminated (SIGTERM)" in err
    (row,) = runs_table("ovq-cl", uri)
    assert row["status"] == "KILLED" and row["tags"]["error"].startswith("Terminated")
    resumed = subprocess.run(args + ["checkpoint.dir=killed"], cwd=tmp_path, env=env, capture_output=True, text=True)
    straight = subprocess.run(args + ["checkpoint.dir=straight", "tracking.experiment=straight"], cwd=tmp_path,
                              env=env, capture_output=True, text=True)
    assert resumed.returncode == 0 and straight.returncode == 0, resumed.stderr[-2000:] + straight.stderr[-2000:]
    table = lambda out: [line for line in out.splitlines() if line.startswith("R[")]     # noqa: E731
    assert table(resumed.stdout) == table(straight.stdout) and len(table(resumed.stdout)) == 4
    (row,) = runs_table("ovq-cl", uri)
    assert row["status"] == "FINISHED" and "resumed_at_meta_step" in row["tags"]
    assert "error" not in row["tags"]                          # the killed attempt's tag is cleaned on finish
    assert f"resuming run {row['run_id']} in meta-training at step" in resumed.stderr
    import torch                                                # the records: the resumed run took two attempts

    def record(folder):
        (path,) = glob.glob(str(tmp_path / folder / "*" / "last.pt"))
        return torch.load(path, weights_only=False)["extra"]["result"]
    assert record("killed")["attempts"] == 2 and record("straight")["attempts"] == 1


@pytest.mark.parametrize("override,message", [
    ("stream.name=foo", "unknown stream 'foo'"),
    ("model.layers=ovq", "a list is written in brackets"),
    ("strategy.epochs=-1", "strategy.epochs must be >= 1, got -1"),
    ("model.mixers.ovq.num_slot=3", "Did you mean: 'num_slots'"),
    ("checkpoint.dir=afile/sub", "checkpoint.dir: cannot write to"),
])
def test_errors_are_one_line_before_any_compute(tmp_path, monkeypatch, capsys, override, message):
    from experiments.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    code = main(["run", os.path.join(ROOT, "experiments/configs/icr_frozen.yaml"), override, "tracking.enabled=false"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1 and err.startswith("ovq-cl: error:")


def test_bad_yaml_and_compare_on_a_missing_store_or_experiment(tmp_path, monkeypatch, capsys):
    from experiments.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("a: [b\n")
    assert main(["run", "bad.yaml"]) == 2 and "not valid YAML" in capsys.readouterr().err
    assert main(["compare", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert "no tracking store" in capsys.readouterr().err and not (tmp_path / "none.db").exists()


def test_the_logged_config_is_the_one_that_ran(tmp_path, store):
    result = run(cfg_in(tmp_path, "vocab", store))
    (row,) = runs_table("vocab", store)
    assert row["params"]["model.vocab_size"] == str(2 + 64 + 32)     # the stream's vocabulary, not the default
    assert result.config.model.vocab_size == 98


def test_a_sweep_nests_only_the_runs_it_started_and_logs_its_grid_and_table(tmp_path, store):
    from experiments.sweep import expand, run_sweep

    base = {**TINY, "tracking": {"tracking_uri": store, "experiment": "nest"}, "checkpoint": {"dir": str(tmp_path / "c")},
            "stream": {"name": "icr", "options": {**TINY["stream"]["options"], "n_experiences": 2}}}
    grid = {"seed": ["0", "1"]}
    import yaml

    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    run_sweep(expand(base, [], grid), "first", grid=grid, out=str(tmp_path / "out"))
    run_sweep(expand(base, [], grid), "second", grid=grid, out=str(tmp_path / "out2"),       # both reused
              base=(str(tmp_path / "base.yaml"), ["meta_train.steps=2"]))
    runs = {r["run_name"]: r for r in runs_table("nest", store)}
    first, second = runs.pop("first"), runs.pop("second")
    assert len(runs) == 2 and all(r["parent_run_id"] == first["run_id"] for r in runs.values())
    from mlflow import MlflowClient

    client = MlflowClient(store)
    for parent in (first, second):
        names = {a.path for a in client.list_artifacts(parent["run_id"])}
        assert {"sweep.yaml", f"{parent['run_name']}.md", f"{parent['run_name']}.json",
                f"{parent['run_name']}.png"} <= names
    assert second["params"]["grid.seed"] == "['0', '1']"
    # the sweep can be made again from MLflow alone: its base config (path and file) and its overrides
    assert second["params"]["config"] == str(tmp_path / "base.yaml") and second["params"]["overrides"] == "['meta_train.steps=2']"
    assert "base.yaml" in {a.path for a in client.list_artifacts(second["run_id"])}
    assert second["tags"]["mlflow.user"] and second["tags"]["mlflow.source.name"]       # the UI's User and Source


def test_early_checks_of_a_sweep_and_the_default_checkpoint_folder(tmp_path, monkeypatch, capsys):
    from experiments.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    cfg_path = os.path.join(ROOT, "experiments/configs/icr_frozen.yaml")
    assert main(["sweep", cfg_path, "tracking.enabled=false", "--grid", "model.layers=[ovq];[mamba9]"]) == 2
    assert "unknown mixer 'mamba9'" in capsys.readouterr().err                 # the whole grid, before any run
    assert main(["sweep", cfg_path, "tracking.enabled=false", "--grid", "seed=0;1", "--out", "afile/x"]) == 2
    assert "sweep --out: cannot write to" in capsys.readouterr().err
    assert run_config({"output_dir": "elsewhere"}).checkpoint.dir == os.path.join("elsewhere", "checkpoints")


def test_a_run_says_where_it_logs_and_quiet_says_nothing_else(tmp_path, monkeypatch, capsys):
    from experiments.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["run", os.path.join(ROOT, "experiments/configs/icr_frozen.yaml"), "model.d_model=16", "model.n_heads=2",
            "meta_train.steps=2", "gate.episodes=4", "stream.options.n_experiences=2", "stream.options.train_episodes=8",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'm.db'}"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "MLflow run:" in out and "artifacts:" in out and "ovq-cl: run icr-ovq" in err
    assert main(args + ["--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "R[1]" in out and "reusing" not in err and err.strip() == ""


def test_a_run_killed_outright_before_any_checkpoint_is_closed_by_the_next_start(tmp_path, store):
    from mlflow import MlflowClient

    first = run(cfg_in(tmp_path, "orphans", store))
    client = MlflowClient(store)
    client.update_run(first.run_id, status="RUNNING")                 # as if SIGKILLed mid-run
    client.set_tag(first.run_id, "pid", "999999999")                  # a process that no longer exists
    for path in glob.glob(str(tmp_path / "ckpt" / "*" / "*.pt")):       # ... before writing any checkpoint
        os.remove(path)
    second = run(cfg_in(tmp_path, "orphans", store))
    statuses = {r["run_id"]: r["status"] for r in runs_table("orphans", store)}
    assert statuses == {first.run_id: "KILLED", second.run_id: "FINISHED"}


def test_bf16_autocast_runs_on_the_cpu(tmp_path, store):
    result = run(cfg_in(tmp_path, "bf16", store, precision="bf16"))
    assert all(v is not None for row in result.R for v in row)
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        run_config({"precision": "fp16", "device": "cpu"})


def test_the_code_version_is_read_once_per_process(monkeypatch):
    """A sweep runs the code it imported: a commit made while it runs must not relabel its later runs."""
    from experiments import code_version as cv

    monkeypatch.setattr(cv, "_CACHED", None)
    versions = iter(["first", "second"])
    monkeypatch.setattr(cv, "_read_version", lambda: next(versions))
    assert cv.code_version() == "first" and cv.code_version() == "first"


def test_the_code_version_follows_the_code_not_the_commit(tmp_path, monkeypatch):
    """A commit of docs, tests or a study's prose keeps the version (finished runs stay finished, a
    study resumes); a commit of code changes it; uncommitted code changes add a dirty hash."""
    from experiments import code_version as cv

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                       env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})

    def write(path, text):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)

    def commit_all():
        git("add", "-A")
        git("commit", "-q", "-m", "x")

    monkeypatch.setattr(cv, "ROOT", str(tmp_path))
    git("init", "-q")
    write("ovq_cl/op.py", "A = 1\n")
    write("experiments/studies/s/study.yaml", "findings: ''\n")
    write("docs/d.md", "old\n")
    commit_all()
    first = cv._read_version()
    assert first.startswith("code-") and "+dirty" not in first
    write("docs/d.md", "new\n")
    write("experiments/studies/s/study.yaml", "findings: 'OVQ forgets less'\n")
    write("experiments/verdict.yaml", "prose\n")
    write("experiments/claims.yaml", "claims: []\n")
    commit_all()
    assert cv._read_version() == first                                  # prose commits: same code
    write("experiments/studies/s/study.yaml", "findings: 'edited, not committed'\n")
    assert cv._read_version() == first                                  # uncommitted prose: not dirty
    write("ovq_cl/op.py", "A = 2\n")
    dirty = cv._read_version()
    assert dirty.startswith(first + "+dirty.")
    commit_all()
    assert "+dirty" not in cv._read_version() and cv._read_version() != first
    write("ovq_cl/new.py", "B = 1\n")                                   # an untracked code file is code
    assert "+dirty." in cv._read_version()
    commit_all()
    before = cv._read_version()
    write("experiments/studies/s/analysis.py", "SECTIONS = {}\n")        # a study folder's module is code
    assert cv._read_version().startswith(before + "+dirty.")
    commit_all()
    assert "+dirty" not in cv._read_version() and cv._read_version() != before
