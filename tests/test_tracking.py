"""MLflow tracking against a temporary SQLite store: runs, nesting, statuses, params, metrics, artifacts, tags,
the tracking-URI rules, and the Avalanche logger on a real (tiny) Naive run."""
import csv
import dataclasses
import io
import json
import math
import os
import pickle
from importlib import metadata

import pytest
import torch
from matplotlib.figure import Figure
from mlflow import MlflowClient
from omegaconf import OmegaConf

from experiments import tracking
from experiments.artifacts import matrix_csv
from experiments.tracking import (
    DEFAULT_TRACKING_URI, TRUNCATED_MARKER, RunTracker, SweepTracker, default_tracking_uri, flatten_config,
    runs_table,
)

CFG = OmegaConf.create({
    "seed": 3,
    "model": {"d_model": 32, "mixers": ["swa", "ovq"], "ovq": {"num_slots": 64, "slots_x2": "${model.ovq.num_slots}"}},
    "stream": {"name": "icr", "variant": None, "extra": {}},
    "strategy": {"name": "naive", "lr": 0.001},
})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite store for the module (migrations run once); cwd and MLFLOW_TRACKING_URI point into tmp."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)                                  # anything relative (e.g. ./mlruns) lands in tmp
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        yield {"uri": uri, "artifacts": str(root / "artifacts"), "root": root, "client": MlflowClient(uri)}


@pytest.fixture(autouse=True)
def _env(store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["uri"])


def tracker(store, name, experiment="tracking-test", **kw):
    return RunTracker(experiment, name, tracking_uri=store["uri"], artifact_location=store["artifacts"], **kw)


def read_artifact(client, run_id, path) -> bytes:
    with open(client.download_artifacts(run_id, path), "rb") as f:
        return f.read()


# --------------------------------------------------------------------------------------------------


def test_flatten_config():
    flat = flatten_config(CFG)
    assert flat == {
        "seed": "3", "model.d_model": "32", "model.mixers": "['swa', 'ovq']", "model.ovq.num_slots": "64",
        "model.ovq.slots_x2": "64", "stream.name": "icr", "stream.variant": "None", "stream.extra": "{}",
        "strategy.name": "naive", "strategy.lr": "0.001",
    }

    @dataclasses.dataclass
    class Inner:
        num_slots: int = 8
        sizes: tuple = (1, 2)

    @dataclasses.dataclass
    class Outer:
        inner: Inner = dataclasses.field(default_factory=Inner)
        name: str = "x"

    assert flatten_config(Outer()) == {"inner.num_slots": "8", "inner.sizes": "[1, 2]", "name": "x"}
    assert flatten_config({"a": {"b": OmegaConf.create({"c": 1})}, "bad key!": 2}) == {"a.b.c": "1", "bad key_": "2"}
    long = flatten_config({"xs": list(range(5000))})["xs"]
    assert len(long) == tracking.MAX_PARAM_VALUE_LENGTH and long.endswith(TRUNCATED_MARKER)
    with pytest.raises(TypeError):
        flatten_config([1, 2])


def test_tracking_uri_rules(store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///from-env.db")
    assert default_tracking_uri() == "sqlite:///from-env.db"
    assert default_tracking_uri("http://localhost:5000") == "http://localhost:5000"
    assert RunTracker("e", "r").tracking_uri == "sqlite:///from-env.db"
    assert RunTracker("e", "r", tracking_uri=store["uri"]).tracking_uri == store["uri"]
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert default_tracking_uri() == DEFAULT_TRACKING_URI == "sqlite:///mlruns.db"


def test_env_uri_is_used_for_logging(store):
    """No tracking_uri given: the run lands in the store named by MLFLOW_TRACKING_URI (the tmp one)."""
    with RunTracker("env-test", "from-env", artifact_location=store["artifacts"]) as run:
        run.log_metrics({"x": 1.0}, step=0)
    assert store["client"].get_run(run.run_id).info.status == "FINISHED"
    assert [r["run_name"] for r in runs_table("env-test")] == ["from-env"]


def test_run_logs_params_metrics_artifacts_tags(store):
    client = store["client"]
    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    R = [[0.9], [0.7, 0.95], [0.5, float("nan"), 1.0]]
    with tracker(store, "icr/ovq/naive/persist/seed0", tags={"stream": "icr", "seed": 0}) as run:
        assert run.active
        params = run.log_config(CFG)
        for j in range(3):
            run.log_metrics({"avg_accuracy": 0.5 + 0.1 * j, "learning_accuracy": torch.tensor(0.9)}, step=j)
        assert run.log_text(matrix_csv([[0.9, None], [0.7, 0.95]]), "result_matrix.csv") == "result_matrix.csv"
        assert run.log_figure(fig, "plots/forgetting") == "plots/forgetting.png"
        run.log_dict({"R": R[:2], "t": torch.arange(3)}, "summary.json")
        with pytest.raises(TypeError):
            run.log_metrics({"v": torch.ones(3)}, step=0)
    assert not run.active
    r = client.get_run(run.run_id)
    assert r.info.status == "FINISHED" and r.info.run_name == "icr/ovq/naive/persist/seed0"
    assert r.data.params == flatten_config(CFG) == params
    assert [(m.step, round(m.value, 6)) for m in sorted(client.get_metric_history(run.run_id, "avg_accuracy"),
                                                        key=lambda m: m.step)] == [(0, 0.5), (1, 0.6), (2, 0.7)]
    assert r.data.metrics["learning_accuracy"] == pytest.approx(0.9)

    tags = r.data.tags
    assert tags["stream"] == "icr" and tags["seed"] == "0" and tags["kind"] == "run"
    assert tags["git.commit"] == tags["mlflow.source.git.commit"]
    assert tags["git.commit"] == "unknown" or len(tags["git.commit"]) == 40
    assert tags["git.dirty"] in ("true", "false", "unknown")
    for key in ("version.python", "version.torch", "version.avalanche", "version.mlflow", "version.ovq-cl", "host", "cpu"):
        assert tags[key]
    assert tags["cpu.capability"] == str(torch.backends.cpu.get_cpu_capability())
    assert tags["version.torch"] == metadata.version("torch") and tags["version.mlflow"] == metadata.version("mlflow")

    listed = {a.path for a in client.list_artifacts(run.run_id)} | \
        {a.path for a in client.list_artifacts(run.run_id, "plots")}
    assert {"config.yaml", "result_matrix.csv", "summary.json", "plots/forgetting.png"} <= listed
    assert r.info.artifact_uri.startswith("file://" + store["artifacts"]) or store["artifacts"] in r.info.artifact_uri

    cfg_back = OmegaConf.create(read_artifact(client, run.run_id, "config.yaml").decode())
    assert OmegaConf.to_container(cfg_back) == OmegaConf.to_container(CFG, resolve=True)
    rows = list(csv.reader(io.StringIO(read_artifact(client, run.run_id, "result_matrix.csv").decode())))
    assert rows == [["trained_on", "eval_0", "eval_1"], ["0", "0.9", ""], ["1", "0.7", "0.95"]]
    assert read_artifact(client, run.run_id, "plots/forgetting.png")[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(read_artifact(client, run.run_id, "summary.json")) == {"R": [[0.9], [0.7, 0.95]], "t": [0, 1, 2]}


def test_logging_outside_a_run_raises(store):
    run = tracker(store, "not-started")
    with pytest.raises(RuntimeError):
        run.run_id
    with pytest.raises(RuntimeError):
        run.log_metrics({"a": 1}, step=0)


@pytest.mark.parametrize("exc", [ValueError("boom"), KeyboardInterrupt()])
def test_failing_run_is_failed_and_reraises(store, exc):
    run = tracker(store, f"crash-{type(exc).__name__}")
    with pytest.raises(type(exc)):
        with run:
            run.log_metrics({"loss": 1.0}, step=0)
            raise exc
    r = store["client"].get_run(run.run_id)
    assert r.info.status == ("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")    # Ctrl-C, SIGTERM
    assert r.info.end_time is not None and r.data.tags["error"].startswith(type(exc).__name__)
    assert type(exc).__name__ in read_artifact(store["client"], run.run_id, "error.txt").decode()


def test_sweep_nests_children_and_fails(store):
    with SweepTracker("sweep-test", "sweep-1", tracking_uri=store["uri"], artifact_location=store["artifacts"]) as sweep:
        for seed in (0, 1):
            with sweep.child(f"seed{seed}", tags={"seed": seed}) as run:
                run.log_config({"seed": seed})
                run.log_metrics({"acc": 0.5 + seed}, step=0)
        with pytest.raises(RuntimeError):
            with sweep.child("seed2") as run:
                raise RuntimeError("child crashed")
        # a run created elsewhere (another process) nests by parent id
        with RunTracker("sweep-test", "external", tracking_uri=store["uri"], parent_run_id=sweep.run_id):
            pass
    table = {row["run_name"]: row for row in runs_table("sweep-test", store["uri"])}
    assert set(table) == {"sweep-1", "seed0", "seed1", "seed2", "external"}
    parent = table["sweep-1"]
    assert parent["status"] == "FINISHED" and parent["parent_run_id"] is None and parent["tags"]["kind"] == "sweep"
    for name in ("seed0", "seed1", "seed2", "external"):
        assert table[name]["parent_run_id"] == parent["run_id"] == table[name]["tags"]["mlflow.parentRunId"]
    assert table["seed2"]["status"] == "FAILED" and table["seed1"]["status"] == "FINISHED"
    assert table["seed1"]["params"] == {"seed": "1"} and table["seed1"]["metrics"] == {"acc": 1.5}
    assert table["seed1"]["tags"]["seed"] == "1"
    assert runs_table("no-such-experiment", store["uri"]) == []

    with pytest.raises(ZeroDivisionError):
        with SweepTracker("sweep-test", "sweep-2", tracking_uri=store["uri"]) as sweep2:
            1 / 0
    assert store["client"].get_run(sweep2.run_id).info.status == "FAILED"


def test_resume_reopens_the_run_and_pickles(store):
    with tracker(store, "resumable") as run:
        run.log_metrics({"acc": 0.1}, step=0)
    again = pickle.loads(pickle.dumps(run))            # e.g. inside an Avalanche checkpoint
    with tracker(store, "resumable", run_id=again.run_id) as resumed:
        assert store["client"].get_run(resumed.run_id).info.status == "RUNNING"
        resumed.log_metrics({"acc": 0.2}, step=1)
    assert resumed.run_id == run.run_id
    assert sorted(m.step for m in store["client"].get_metric_history(run.run_id, "acc")) == [0, 1]
    assert store["client"].get_run(run.run_id).info.status == "FINISHED"


def test_mlflow_logger_on_a_tiny_avalanche_run(store):
    import ovq_cl.base.avalanche_compat  # noqa: F401  (before any avalanche import)
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.utils import ConstantSequence, TaskLabels, make_avalanche_dataset
    from avalanche.evaluation.metrics import accuracy_metrics, loss_metrics
    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.training.supervised import Naive
    from torch.utils.data import TensorDataset

    from experiments.tracking import MLflowLogger

    def exp_data(j, n):
        g = torch.Generator().manual_seed(j)
        x = torch.randn(n, 4, generator=g)
        y = (x[:, 0] > 0).long() + 2 * j
        ds = TensorDataset(x, y)
        return make_avalanche_dataset(ds, data_attributes=[TaskLabels(ConstantSequence(j, n))])

    bench = benchmark_from_datasets(train=[exp_data(j, 16) for j in range(2)], test=[exp_data(j, 8) for j in range(2)])
    model = torch.nn.Linear(4, 4)
    with tracker(store, "avalanche-naive") as run:
        logger = MLflowLogger(run)
        assert isinstance(pickle.loads(pickle.dumps(logger)), MLflowLogger)
        strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         criterion=torch.nn.CrossEntropyLoss(), train_mb_size=8, train_epochs=1, eval_mb_size=8,
                         evaluator=EvaluationPlugin(accuracy_metrics(minibatch=True, experience=True, stream=True),
                                                    loss_metrics(epoch=True), loggers=[logger]))
        for exp in bench.train_stream:
            strategy.train(exp)
            strategy.eval(bench.test_stream)
        logger.log_single_metric("images/grid", torch.zeros(3, 8, 8), 5)    # not a scalar: skipped
        logger.log_single_metric("odd name [exp=0]", 0.25, 7)                # sanitised
        logger.log_single_metric("d", {"a": 1, "b": torch.tensor([2.0])}, 8)  # dict values -> d/a, d/b
    assert "images/grid" in logger.skipped

    client = store["client"]
    metrics = client.get_run(run.run_id).data.metrics
    acc_exp = [k for k in metrics if k.startswith("Top1_Acc_Exp/eval_phase/test_stream")]
    assert len(acc_exp) == 2, sorted(metrics)
    assert any(k.startswith("Top1_Acc_MB/train_phase") for k in metrics)
    assert any(k.startswith("Top1_Acc_Stream/eval_phase/test_stream") for k in metrics)
    assert all(0.0 <= metrics[k] <= 1.0 for k in acc_exp)
    hist = client.get_metric_history(run.run_id, acc_exp[0])
    assert len(hist) == 2 and sorted(m.step for m in hist) == [2, 4]   # x_plot = training iterations so far
    assert "images/grid" not in metrics and metrics["odd name _exp_0_"] == 0.25
    assert metrics["d/a"] == 1 and metrics["d/b"] == 2
    assert all(not math.isnan(v) for v in metrics.values())


def test_nothing_written_to_the_repo(store):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert not os.path.exists(os.path.join(store["root"], "mlruns"))
    assert os.getcwd() == str(store["root"])
    assert repo not in store["uri"]


def _open_store_after(barrier, uri, errors):
    barrier.wait()                                       # every process opens the new store at once
    try:
        tracking.runs.tracking_client(uri).search_experiments()
    except Exception as exc:                             # noqa: BLE001 - reported to the parent
        errors.put(f"{type(exc).__name__}: {exc}"[:200])


def test_processes_creating_one_sqlite_store_together_all_succeed(tmp_path):
    """Two sweeps started together used to race on creating the store's tables ("table ... already
    exists"); the store is now opened under a file lock. Three processes, released by one barrier."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, errors = ctx.Barrier(3), ctx.Queue()
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    procs = [ctx.Process(target=_open_store_after, args=(barrier, uri, errors)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert not found, found


def test_metric_histories_keep_each_steps_latest_value_as_a_resumed_run_logs_an_experience_again(tmp_path, new_store):
    import time

    from experiments.tracking.query import metric_histories
    from experiments.tracking.runs import tracking_client

    uri = new_store(tmp_path / "h.db")
    client = tracking_client(uri)
    run = client.create_run(client.create_experiment("h"))
    t0 = int(time.time() * 1000)
    for step, value, at in ((0, 0.5, t0), (1, 0.25, t0 + 1), (1, 0.75, t0 + 2)):     # step 1 again, later
        client.log_metric(run.info.run_id, "R/eval_0", value, timestamp=at, step=step)
    got = metric_histories(client, run.info.run_id, ["R/eval_0", "never/logged"])
    assert got == {"R/eval_0": {0: 0.5, 1: 0.75}, "never/logged": {}}


def test_a_run_feeds_the_avalanche_loggers_its_user_names_and_a_bad_one_is_refused_first(tmp_path):
    """`tracking.loggers: [text, package.module:factory]`: Avalanche's TextLogger writes the run's evaluation
    to {output_dir}/loggers/...; a factory of the user's gets that folder; a name that is neither is one
    line before anything runs."""
    import glob

    from experiments.config import run_config
    from experiments.runner import run
    from test_runner import TINY

    made = []

    def factory(folder):
        from avalanche.logging import TextLogger

        made.append(folder)
        return TextLogger(open(os.path.join(folder, "mine.txt"), "a"))

    import test_tracking

    test_tracking.user_factory = factory
    cfg = run_config({**TINY, "output_dir": str(tmp_path / "out"), "tracking": {"enabled": False},
                      "checkpoint": {"enabled": False}},
                     ["tracking.loggers=[text,test_tracking:user_factory]"])
    run(cfg)
    (log,) = glob.glob(str(tmp_path / "out" / "loggers" / "*" / "log.txt"))
    assert os.path.getsize(log) > 0 and made and os.path.getsize(os.path.join(made[0], "mine.txt")) > 0
    with pytest.raises(ValueError, match="tracking.loggers: 'wandb' is neither one of text, csv, tensorboard"):
        run_config({**TINY, "tracking": {"enabled": False}}, ["tracking.loggers=[wandb]"]).check()
