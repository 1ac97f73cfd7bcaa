"""`ovq-cl compare` on an MLflow store as a user's store is: two sweeps in one experiment, a run scored by a
plugin's metric that this process does not know. One sweep is chosen by name (`--sweep`), the unknown
metric is a note (not an abort), `--baseline` names the way out when it is ambiguous, and `--plot` draws."""
import pytest

from experiments.cli import main


def _store(uri: str) -> None:
    """Experiment 'ovq-cl': sweeps 'first' (ovq, delta x seeds 0-1) and 'second' (ovq, seeds 0-1, another
    lr), and one run of the plugin metric 'error_rate' outside any sweep, all FINISHED."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.create_experiment("ovq-cl")

    def run(name, params, tags, final, parent=None):
        r = client.create_run(exp, run_name=name, tags={**tags, **({"mlflow.parentRunId": parent} if parent else {})})
        for k, v in params.items():
            client.log_param(r.info.run_id, k, v)
        for k, v in final.items():
            client.log_metric(r.info.run_id, f"final/{k}", v)
        for j, row in enumerate([[0.9, 0.0], [0.7, 0.8]]):        # R, as the runner logs it
            for i, v in enumerate(row):
                client.log_metric(r.info.run_id, f"R/eval_{i}", v, step=j)
            client.log_metric(r.info.run_id, "stream/learning_score", row[j], step=j)
        client.set_terminated(r.info.run_id)

    for sweep, lr, layers in (("first", "0.003", ["ovq", "delta"]), ("second", "0.01", ["ovq"])):
        parent = client.create_run(exp, run_name=sweep, tags={"kind": "sweep"}).info.run_id
        for mixer in layers:
            for seed in (0, 1):
                run(f"icr-{mixer}-s{seed}", {"model.layers": f"['{mixer}']", "seed": str(seed), "meta_train.lr": lr},
                    {"metric": "accuracy", "learned_overall": "true"},
                    {"final_average": 0.6 + 0.1 * seed + (0.1 if mixer == "ovq" else 0.0), "forgetting_max": 0.1},
                    parent=parent)
        client.set_terminated(parent)
    run("cipher-ema-s0", {"model.layers": "['ema']", "seed": "0"}, {"metric": "error_rate", "learned_overall": "true"},
        {"final_average": 0.2})


def test_compare_on_a_store_of_two_sweeps_and_a_plugin_metric(tmp_path, new_store, capsys):
    uri = new_store(tmp_path / "mlruns.db")
    _store(uri)
    # the whole experiment: the plugin's metric is a note, not an abort
    assert main(["compare", "--tracking-uri", uri]) == 0
    out, err = capsys.readouterr()
    assert "metric 'error_rate' is not registered here (1 runs)" in err and "--plugin MODULE" in err
    assert "layers=['ema']" in out
    # ovq names two configurations (two sweeps, two lrs): the error says how to narrow
    with pytest.raises(ValueError, match=r"matches 2 configurations.*compare --sweep NAME"):
        main(["compare", "--tracking-uri", uri, "--baseline", "ovq", "--debug"])
    capsys.readouterr()
    # one sweep by its name: its four runs only, paired against ovq, and the curves drawn
    plot = tmp_path / "curves.png"
    assert main(["compare", "--tracking-uri", uri, "--sweep", "first", "--baseline", "ovq", "--plot", str(plot)]) == 0
    out, err = capsys.readouterr()
    assert "ema" not in out and "lr=0.01" not in out
    paired = [line for line in out.splitlines() if line.startswith("| layers=['delta']") and "final_average" in line]
    assert paired and "| 2 |" in paired[0]                            # two seeds paired, in the chosen sweep
    assert plot.stat().st_size > 1000
    assert main(["compare", "--tracking-uri", uri, "--sweep", "third"]) == 2
    assert "no sweep 'third' in experiment 'ovq-cl'; its sweeps: ['first', 'second']" in capsys.readouterr().err


def test_a_record_read_from_mlflow_has_the_label_its_json_record_has():
    from experiments import compare

    row = {"metrics": {}, "params": {"model.layers": "['ovq']"}, "run_name": "icr-ovq-frozen-persist-s0-3ea781",
           "tags": {"config_id": "3ea781b9fa02"}}
    assert compare.record_from_mlflow(row).label == "icr-ovq-frozen-persist-s0"
    named = {**row, "run_name": "my-own-name"}                       # tracking.run_name: kept as the user named it
    assert compare.record_from_mlflow(named).label == "my-own-name"
