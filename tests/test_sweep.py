"""Sweeps: a grid expands to configs, runs nest under one parent run, the comparison aggregates seeds."""
import math
import re

import pytest

from experiments import compare
from experiments.sweep import expand, parse_grid, run_sweep, unequal_state

from test_runner import TINY


def test_grid_expands_to_every_combination():
    grid = parse_grid(["model.layers=[ovq];[swa,ovq]", "seed=0;1;2"])
    configs = expand(TINY, ["model.n_layers=2"], grid)
    assert len(configs) == 6
    assert sorted({tuple(c.model.layers) for c in configs}) == [("ovq",), ("swa", "ovq")]
    assert sorted(c.seed for c in configs) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="KEY=V1"):
        parse_grid(["seed"])


def test_a_joint_axis_changes_its_keys_together():
    grid = parse_grid(["meta_train.batch_size&meta_train.steps=32&10;4&20", "seed=0;1"])
    configs = expand(TINY, [], grid)
    assert sorted((c.meta_train.batch_size, c.meta_train.steps, c.seed) for c in configs) == [
        (4, 20, 0), (4, 20, 1), (32, 10, 0), (32, 10, 1)]
    with pytest.raises(ValueError, match="2 parts for 3 keys"):
        parse_grid(["a&b&c=1&2"])


def test_sweep_nests_runs_and_compares_over_seeds(tmp_path, monkeypatch, new_store):
    """Seeds of model and data vary together by default; the two runs are replicates of one
    configuration, whether read from the RunResults, their JSON records or the MLflow store."""
    import json

    from experiments.tracking import runs_table

    uri = new_store(tmp_path / "mlruns.db")
    monkeypatch.chdir(tmp_path)
    base = {**TINY, "tracking": {"tracking_uri": uri, "experiment": "sweep-test"},
            "checkpoint": {"dir": str(tmp_path / "ckpt")},
            "stream": {"name": "icr", "options": {**TINY["stream"]["options"], "n_experiences": 2}}}
    configs = expand(base, [], {"seed": ["0", "1"]})
    assert [c.data_seed for c in configs] == [0, 1]
    results, failures = run_sweep(configs, "tiny-sweep")
    assert not failures and len(results) == 2
    runs = {r["run_name"]: r for r in runs_table("sweep-test", uri)}
    parent = runs.pop("tiny-sweep")
    assert parent["status"] == "FINISHED" and len(runs) == 2
    assert all(r["parent_run_id"] == parent["run_id"] and r["status"] == "FINISHED" for r in runs.values())
    assert sorted(r["params"]["stream.options.seed"] for r in runs.values()) == ["0", "1"]
    # a run's MLflow name is its label and its config id's first characters: configurations that share a
    # label (stream, mixers, strategy, memory, seed) and differ elsewhere get names of their own
    assert sorted(runs) == sorted(f"{c.label()}-{r['tags']['config_id'][:6]}" for c, r in
                                  zip(configs, sorted(runs.values(), key=lambda r: r["params"]["stream.options.seed"])))
    text = compare.table(results)
    rows = [line for line in text.splitlines() if line.startswith("| all runs")]
    assert len(rows) == 1 and "(2)" in rows[0] and "[" in rows[0]          # one configuration, n = 2, with CIs
    records = compare.mlflow_records("sweep-test", uri)
    from_store = compare.summary_table(records)
    from_json = compare.summary_table([compare.record_from_json(json.loads(json.dumps(r.record()))) for r in results])
    assert text == from_json
    # read back from MLflow (R from the metric histories, each experience's chance one by one) every cell
    # is the JSON's, the stopped-learning column (R's diagonal against each experience's chance) included
    assert sorted(map(repr, (r.R for r in records))) == sorted(repr(r.R) for r in results)
    assert all(r.stream_chances and not math.isnan(r.stream_threshold) for r in records)
    assert from_store == from_json and "unmeasured" not in from_store
    png = compare.curves_plot([compare.record_from_result(r) for r in results], str(tmp_path / "curves.png"))
    assert open(png, "rb").read(4) == b"\x89PNG"


def test_groups_ignore_every_seed_and_never_merge_configs():
    items = [{"seed": "0", "stream.options.seed": "0", "model.vq.codebook_size": "16", "stream.name": "icr"},
             {"seed": "1", "stream.options.seed": "7", "model.vq.codebook_size": "16", "stream.name": "icr"},
             {"seed": "0", "stream.options.seed": "0", "model.vq.codebook_size": "32", "stream.name": "icr"}]
    groups = compare.group_by_config(items, lambda p: p)
    assert {k: len(v) for k, v in groups.items()} == {"vq.codebook_size=16": 2, "vq.codebook_size=32": 1}


def _record(layers, seed, forgetting_max, learned=True, final=0.9):
    return compare.RunRecord(
        label=f"{layers}-{seed}", params={"model.layers": f"['{layers}']", "seed": str(seed),
                                         "stream.options.seed": str(seed)},
        metric="accuracy", summary={"final_average": final, "learning_average": 0.95, "forgetting_max": forgetting_max,
                                    "forgetting_learned": forgetting_max, "bwt": -forgetting_max},
        learned=learned, state_bytes=[1000.0, 1000.0], parameters=123, seed=seed, data_seed=seed)


def test_not_learned_runs_show_no_forgetting_number():
    records = [_record("ovq", s, 0.08) for s in range(3)] + [_record("linear", s, 0.005, learned=False) for s in range(3)]
    text = compare.summary_table(records)
    linear = next(line for line in text.splitlines() if "linear" in line)
    assert linear.count("not learned") == 3 and "0.005" not in linear and "0/3 learned" in linear
    ovq = next(line for line in text.splitlines() if "'ovq'" in line)
    assert "0.080 ± 0.000" in ovq and "1,000" in ovq and "123" in ovq


def test_the_summary_table_shows_runs_that_stopped_learning_beside_their_forgetting():
    """A memory that takes in the first experience and then nothing new forgets nothing: its row says it
    stopped learning (and from which experience), beside a zero forgetting; one that keeps learning says 0."""
    import dataclasses

    def run(layers, seed, diagonal):
        R = [[diagonal[i] if i <= j else 0.1 for i in range(3)] for j in range(3)]
        return dataclasses.replace(_record(layers, seed, 0.4), R=R, stream_threshold=0.1, stream_chances=[0.1] * 3)

    records = [run("ovq", s, [0.6, 0.15, 0.1]) for s in range(2)] + [run("full", s, [0.6, 0.6, 0.6]) for s in range(2)]
    lines = compare.summary_table(records).splitlines()
    head = [c.strip() for c in next(line for line in lines if line.startswith("| configuration")).strip("|").split("|")]
    column = head.index("stopped learning")
    assert head[column - 1] == "learning_average" and head[column + 1] == "forgetting_max"
    cell = {k: [c.strip() for c in next(line for line in lines if k in line).strip("|").split("|")][column]
            for k in ("'ovq'", "'full'")}
    assert cell == {"'ovq'": "2/2 (from exp 1)", "'full'": "0/2"}


def test_paired_comparison_against_a_baseline():
    """OVQ forgets 0.05 more than the baseline on every seed: a paired test sees it although the spread
    over seeds (0.1 per seed) is larger than the difference; the not-learned mixer gets no p-value."""
    base = [0.1 * s for s in range(5)]
    records = [_record("vq", s, base[s]) for s in range(5)] + [_record("ovq", s, base[s] + 0.05 + 0.001 * s) for s in range(5)]
    records += [_record("linear", s, 0.0, learned=False) for s in range(5)]
    text = compare.paired_table(records, "vq")
    row = next(line for line in text.splitlines() if "'ovq'" in line and "forgetting_max" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "5" and cells[3].startswith("+0.052")
    assert float(cells[4]) < 1e-3                                     # paired t
    assert cells[5] == cells[4]                    # Holm over the table's forgetting_max tests: one (linear has none)
    assert float(cells[6]) == pytest.approx(0.0625, abs=1e-3)                # exact Wilcoxon, n = 5, all positive
    linear = next(line for line in text.splitlines() if "linear" in line and "forgetting_max" in line)
    assert "not learned" in linear
    with pytest.raises(ValueError, match="baseline"):
        compare.paired_table(records, "full")


def test_paired_tables_add_the_facts_in_force_where_runs_have_them():
    """Streams whose facts change: the same table pairs the final average, the updated and the stale share
    scored against the facts in force (known differences: +0.2 updated, -0.2 stale on every seed)."""
    records = [_record("ovq", s, 0.1) for s in range(4)] + [_record("vq", s, 0.1) for s in range(4)]
    assert "facts in force" not in compare.paired_table(records, "vq")
    for r in records:
        up = 0.5 + 0.01 * r.seed + (0.2 if "ovq" in r.label else 0.0)
        r.summary_current = {"final_average": 0.7, "updated_fraction": up, "stale_fraction": 1.0 - up}
    text = compare.paired_table(records, "vq")
    updated = next(line for line in text.splitlines() if "updated_fraction (facts in force)" in line)
    stale = next(line for line in text.splitlines() if "stale_fraction (facts in force)" in line)
    assert "| 4 | +0.200 [+0.200, +0.200]" in updated and "| 4 | -0.200 [-0.200, -0.200]" in stale
    assert "final_average (facts in force) | 4 | +0.000" in text
    only = compare.paired_table(records, "vq", columns=["current:updated_fraction"])
    assert "final_average" not in only and "updated_fraction (facts in force)" in only
    # a configuration without the scoring (or a fact that never changed) gives "not measured", not NaN
    records += [_record("ssm", s, 0.1) for s in range(4)]
    text = compare.paired_table(records, "vq")
    ssm = next(line for line in text.splitlines() if "ssm" in line and "stale_fraction" in line)
    assert "| 0 | not measured |" in ssm and "nan" not in text


def test_options_of_unused_mixers_do_not_split_or_name_groups():
    items = [{"seed": "0", "model.layers": "['ovq']", "model.ovq.num_slots": "64", "model.vq.codebook_size": "16"},
             {"seed": "1", "model.layers": "['ovq']", "model.ovq.num_slots": "64", "model.vq.codebook_size": "32"},
             {"seed": "0", "model.layers": "['vq']", "model.ovq.num_slots": "64", "model.vq.codebook_size": "32"},
             {"seed": "0", "model.layers": "['vq']", "model.ovq.num_slots": "64", "model.vq.codebook_size": "16"}]
    groups = compare.group_by_config(items, lambda p: p)
    assert {k: len(v) for k, v in groups.items()} == {
        "layers=['ovq']": 2, "layers=['vq'], vq.codebook_size=32": 1, "layers=['vq'], vq.codebook_size=16": 1}


def test_a_sweep_killed_midway_keeps_the_records_of_the_runs_it_finished(tmp_path, monkeypatch):
    import json

    import experiments.runner as runner

    monkeypatch.chdir(tmp_path)
    base = {**TINY, "tracking": {"enabled": False}, "checkpoint": {"dir": str(tmp_path / "ckpt")},
            "stream": {"name": "icr", "options": {**TINY["stream"]["options"], "n_experiences": 2}}}
    configs = expand(base, [], {"seed": ["0", "1", "2"]})
    real_run, calls = runner.run, []

    def run_then_die(cfg, **kwargs):
        calls.append(cfg.seed)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return real_run(cfg, **kwargs)

    monkeypatch.setattr(runner, "run", run_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(configs, "killed-sweep", out=str(tmp_path / "out"))
    records = json.loads((tmp_path / "out" / "killed-sweep.json").read_text())
    assert [r["seed"] for r in records] == [0]


def test_two_processes_on_one_sweep_keep_each_others_records(tmp_path):
    """Two processes share a sweep (each skips the runs the other holds); each writes the records it
    has, and neither drops the other's: the file keeps another process's runs of this sweep, drops
    records of configurations no longer in it, and a run written again replaces its old record."""
    import json

    from experiments.sweep import _write_records

    class Result:
        def __init__(self, name, value, code="v1"):
            self.name, self.value, self.code = name, value, code

        def record(self):
            return {"config_id": self.name, "code_version": self.code, "value": self.value}

    path = str(tmp_path / "out" / "s.json")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "s.json").write_text(json.dumps([{"config_id": "gone", "code_version": "v1", "value": 0}]))
    ours = {"a", "b", "c"}                                      # the sweep's run identities
    _write_records([Result("a", 1)], path, ours)          # process 1 finished a
    _write_records([Result("b", 2)], path, ours)          # process 2 finished b (it skipped a)
    _write_records([Result("a", 1), Result("c", 3)], path, ours)   # process 1 finished c (it skipped b)
    records = json.loads(open(path).read())
    assert sorted((r["config_id"], r["value"]) for r in records) == [("a", 1), ("b", 2), ("c", 3)]
    _write_records([Result("b", 5)], path, ours)          # b run again: its new record replaces the old
    assert sorted((r["config_id"], r["value"]) for r in json.loads(open(path).read())) == [("a", 1), ("b", 5), ("c", 3)]


def test_a_param_dropped_at_its_absent_value_still_splits_groups():
    """``meta_train.retention_loss`` is dropped from records at 0.0 (runs logged before it existed lack
    it): runs at 1.0 and runs without it are two configurations, never one group with repeated seeds."""
    from experiments import compare

    def record(retention, seed):
        params = {"model.layers": "['delta']", "meta_train.retention_loss": retention}
        return compare.record_from_json({"shared_bytes_per_layer": [], "learned_buffers": 0, "label": "x", "params": params, "metric": "accuracy", "summary": {},
                                         "seed": seed, "data_seed": seed})

    groups = compare.group_records([record("1.0", 0), record("0.0", 0), record("1.0", 1), record("0.0", 1)])
    assert {k: sorted(r.seed for r in v) for k, v in groups.items()} == {
        "all runs": [0, 1], "meta_train.retention_loss=1.0": [0, 1]}


def test_merge_puts_a_sweep_finished_in_pieces_back_into_one_file_each_run_once(tmp_path):
    """Records of one sweep run in pieces (a fresh machine runs only what it had no record of) merge into the
    study's file: the file's own first, each identity (config_id, code version) once; the same config of
    another code version is another run; a repeat with a different result is refused, nothing written."""
    import json

    from experiments.cli import main
    from experiments.sweep import merge_record_files

    def record(cid, code="code-a", final=0.5, run_id="r"):
        return {"shared_bytes_per_layer": [], "learned_buffers": 0, "label": f"run-{cid}", "config_id": cid, "code_version": code, "params": {"seed": 0},
                "R": [[final]], "run_id": run_id, "wall_seconds": 1.0}

    out, piece, other = tmp_path / "long.json", tmp_path / "long_s1.json", tmp_path / "long_s2.json"
    out.write_text(json.dumps([record("a"), record("b")]))
    # b: the same run, reused elsewhere (another store, resumed there, its progress shown): the same result
    again = {**record("b", run_id="elsewhere"), "wall_seconds": 9.0, "attempts": 2, "provenance": {"host": "x"}}
    again["params"] = {**again["params"], "progress": "True", "tracking.experiment": "other",
                       "meta_train.checkpoint_every": "50"}
    piece.write_text(json.dumps([again, record("c")]))
    other.write_text(json.dumps([record("c", code="code-b"), record("d")]))
    assert merge_record_files(str(out), [str(piece), str(other)]) == (5, 1)
    merged = json.loads(out.read_text())
    assert [(d["config_id"], d["code_version"]) for d in merged] == [
        ("a", "code-a"), ("b", "code-a"), ("c", "code-a"), ("c", "code-b"), ("d", "code-a")]
    assert merged[1]["run_id"] == "r"                                  # the file's own record is kept

    clash = tmp_path / "clash.json"
    clash.write_text(json.dumps([record("a", final=0.9)]))
    before = out.read_text()
    with pytest.raises(ValueError, match="two different records"):
        merge_record_files(str(out), [str(clash)])
    clash.write_text(json.dumps([{**record("a"), "params": {"seed": 1}}]))    # a param that is the run's own
    before = out.read_text()
    with pytest.raises(ValueError, match="two different records"):
        merge_record_files(str(out), [str(clash)])
    assert out.read_text() == before
    (tmp_path / "bad.json").write_text(json.dumps({"not": "records"}))
    assert main(["merge", str(out), str(tmp_path / "bad.json")]) != 0   # one line, nothing written
    assert out.read_text() == before
    assert main(["merge", str(tmp_path / "new.json"), str(piece)]) == 0
    assert [d["config_id"] for d in json.loads((tmp_path / "new.json").read_text())] == ["b", "c"]


def test_a_fresh_machine_reads_finished_runs_back_from_the_sweeps_records(tmp_path, monkeypatch):
    """Without the tracking store and the checkpoints (a fresh clone whose results/ is in git), a sweep
    whose JSON records a run of the same resolved config and code version reads it back instead of
    running it; the runs it lacks are run and added; the JSON keeps every record; --rerun runs them all."""
    import json

    import experiments.runner as runner

    monkeypatch.chdir(tmp_path)

    def base(machine):
        return {**TINY, "tracking": {"tracking_uri": f"sqlite:///{tmp_path / machine / 'mlruns.db'}",
                                     "experiment": "fresh"},
                "checkpoint": {"dir": str(tmp_path / machine / "ckpt")},
                "stream": {"name": "icr", "options": {**TINY["stream"]["options"], "n_experiences": 2}}}

    for machine in ("old", "new"):
        (tmp_path / machine).mkdir()
    out = str(tmp_path / "results")
    first, failures = run_sweep(expand(base("old"), [], {"seed": ["0", "1"]}), "piece", out=out)
    assert not failures
    before = json.loads((tmp_path / "results" / "piece.json").read_text())

    real_run, ran = runner.run, []

    def counting_run(cfg, **kwargs):
        ran.append(cfg.seed)
        return real_run(cfg, **kwargs)

    monkeypatch.setattr(runner, "run", counting_run)
    results, failures = run_sweep(expand(base("new"), [], {"seed": ["0", "1", "2"]}), "piece", out=out)
    assert not failures and ran == [2]                        # seeds 0 and 1 read back from their records
    after = json.loads((tmp_path / "results" / "piece.json").read_text())
    assert [r["seed"] for r in after] == [0, 1, 2] and after[:2] == before
    assert [r.record()["R"] for r in results[:2]] == [r.record()["R"] for r in first]
    # started again with every run in its records: nothing runs, and no new, empty parent run is made
    from experiments.tracking import runs_table

    parents = lambda: [r for r in runs_table("fresh", f"sqlite:///{tmp_path / 'new' / 'mlruns.db'}") if r["tags"].get("kind") == "sweep"]  # noqa: E731
    n_parents = len(parents())
    again, failures = run_sweep(expand(base("new"), [], {"seed": ["0", "1", "2"]}), "piece", out=out)
    assert not failures and ran == [2] and len(again) == 3 and len(parents()) == n_parents == 1
    run_sweep(expand(base("new"), [], {"seed": ["0"]}), "piece", out=out, rerun=True)
    assert ran == [2, 0]                                      # --rerun: run again, never read back


def test_a_record_read_from_mlflow_carries_vq_codebook_bytes_as_logged():
    params = {"model.layers": "['vq']", "model.n_layers": "2", "model.d_model": "64", "model.n_heads": "4",
              "model.mixers.vq.codebook_size": "16"}
    row = {"metrics": {}, "params": params, "tags": {}}
    unlogged = compare.record_from_mlflow(row)
    assert unlogged.shared_bytes == [] and unlogged.learned_buffers == 0, "not logged: not guessed"
    logged = {"model/shared_bytes/layer0": 7.0, "model/shared_bytes/layer1": 9.0, "model/learned_buffers": 3.0}
    read = compare.record_from_mlflow({**row, "metrics": logged})
    assert read.shared_bytes == [7.0, 9.0] and read.learned_buffers == 3


def test_a_sweep_of_mixers_at_unequal_state_is_said_before_it_runs():
    """The README's first sweep once compared OVQ at a pinned 128 slots (67,584 B per layer and lane as the
    budget counts it) with Gated DeltaNet's default heads (4,096 B) and said nothing. Now one line names
    both sizes, names full attention as growing, and says how to match them; a budget, or one mixer, is quiet."""
    mixers = parse_grid(["model.layers=[ovq];[delta];[full]"])
    line = unequal_state(expand("experiments/configs/icr_frozen.yaml", [], mixers))
    assert line is not None and "ovq 67,584 B, delta 4,096 B" in line and "full: grows with the context" in line
    assert "model.state_budget=BYTES" in line
    budgeted = expand("experiments/configs/icr_frozen.yaml", ["model.state_budget=16960", "model.mixers.ovq.num_slots=null"], mixers)
    assert unequal_state(budgeted) is None
    assert unequal_state(expand("experiments/configs/icr_frozen.yaml", [], parse_grid(["seed=0;1"]))) is None
