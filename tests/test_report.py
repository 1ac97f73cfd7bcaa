"""RESULTS.md is generated from run records: the section of a study has its tables, tests and labels."""
import json

import pytest

from conftest import study_file

from experiments import compare, report, sections, study_specs
from experiments import study as study_runner


def _run(layers, seed, R, learned=True):
    K = len(R)
    from strategies.evaluation.forgetting import summary

    return {"shared_bytes_per_layer": [], "learned_buffers": 0, "label": f"{layers}-s{seed}", "params": {"model.layers": f"['{layers}']", "seed": str(seed),
                                                    "stream.options.seed": str(seed)},
            "metric": "accuracy", "summary": summary(R), "summary_current": {}, "learned": learned,
            "gate": {"skill": 0.9 if learned else 0.0}, "stream_gate": {"skill": 0.8}, "R": R,
            "R_se": [[0.02] * K for _ in range(K)], "tokens_after": list(range(K)),
            "state_bytes_per_layer_lane": [67840.0, 67840.0], "parameters": 1000, "seed": seed, "data_seed": seed,
            "wall_seconds": 30.0}


@pytest.fixture
def study(tmp_path, monkeypatch):
    runs = [{**_run("ovq", s, [[1.0, 0.0], [0.9 - 0.01 * s, 0.95]]), "code_version": "code-aaa"} for s in range(3)]
    runs += [_run("vq", s, [[1.0, 0.0], [0.99, 0.97]]) for s in range(3)]
    runs += [_run("linear", s, [[0.05, 0.0], [0.04, 0.05]], learned=False) for s in range(3)]
    return _study_folder(tmp_path, monkeypatch, "toy", runs,
                         "title: 'Toy study'\nsetup: 'A setup.'\nbaseline: ovq\nfindings: 'A finding.'\n")


def _study_folder(tmp_path, monkeypatch, name, runs, spec):
    """A project folder with one study ``name`` (``spec``: its YAML besides commands and results) whose
    sweep wrote ``runs``; the study specs and the report read from it."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / f"{name}.json").write_text(json.dumps(runs))
    studies = tmp_path / "studies"
    studies.mkdir()
    study_file(studies, name).write_text(
        spec + f"commands: [\"ovq-cl sweep cfg.yaml --name {name} --out results\"]\nresults: [results/{name}.json]\n")
    monkeypatch.setattr(study_specs, "STUDIES_DIR", str(studies))
    monkeypatch.setattr(report, "PROJECT_DIR", str(tmp_path))
    monkeypatch.setattr(sections, "PROJECT_DIR", str(tmp_path))
    return tmp_path


def test_a_study_section_has_every_table_and_label(study):
    text = sections.section(study_specs.load_study("toy"))
    assert text.startswith("## Toy study") and "ovq-cl sweep cfg.yaml" in text and "A finding." in text
    assert "9 runs, wall time per run 30 s" in text
    assert "Code versions of these runs: not recorded (6: runs from before results carried their code version), `code-aaa` (3)." in text
    linear = [line for line in text.splitlines() if line.startswith("| layers=['linear']")]
    assert linear and "not learned" in linear[0] and "0/3 learned" in linear[0]
    assert "baseline: layers=['ovq']" in text
    assert any(line.startswith("| layers=['vq'] | forgetting_max | 3 |") for line in text.splitlines())
    assert "layers=['linear']: mean R[j][i] over 3 runs, mean per-cell s.e. 0.020  [NOT LEARNED" in text


def test_a_section_says_how_many_of_its_runs_resumed_after_a_stop(tmp_path, monkeypatch):
    runs = [_run("ovq", s, [[1.0, 0.0], [0.9, 0.95]]) for s in range(3)]
    runs[1]["attempts"], runs[2]["attempts"] = 3, 1
    _study_folder(tmp_path, monkeypatch, "toy", runs, "title: 'Toy'\nbaseline: ovq\n")
    assert "3 runs, wall time per run 30 s" in sections.section(study_specs.load_study("toy"))
    assert "1 of them resumed after a stop (3 attempts;" in sections.section(study_specs.load_study("toy"))
    runs[1]["attempts"] = 1
    (tmp_path / "results" / "toy.json").write_text(json.dumps(runs))
    assert "resumed" not in sections.section(study_specs.load_study("toy"))
    runs[0]["attempts"] = None                        # resumed from a checkpoint that kept no time
    (tmp_path / "results" / "toy.json").write_text(json.dumps(runs))
    assert "1 resumed from a checkpoint that kept no time" in sections.section(study_specs.load_study("toy"))


def test_write_report_and_unknown_study(study):
    """RESULTS.md is an index (a line per study: its title linking to its page, its reading); each study's
    section is its own page under results/studies/, written again byte for byte."""
    spec = study_file(study / "studies", "toy")
    spec.write_text(spec.read_text() + "reading: 'It found a thing.'\n")
    path = report.write_report(str(study / "RESULTS.md"))
    text = open(path).read()
    assert text.startswith("# Results") and "do not edit by hand" in text and "## Toy study" not in text
    assert "- [Toy study](results/studies/toy.md): It found a thing." in text
    page = (study / "results" / "studies" / "toy.md").read_text()
    assert page.startswith("[Results](../../RESULTS.md) > Toy study") and "## Toy study" in page and "A finding." in page
    report.write_report(str(study / "RESULTS.md"))
    assert open(path).read() == text and (study / "results" / "studies" / "toy.md").read_text() == page
    with pytest.raises(FileNotFoundError, match="known: \\['toy'\\]"):
        study_specs.load_study("nope")


def test_shipped_studies_load():
    specs = study_specs.all_studies()
    assert specs and any(s.commands for s in specs)
    searches = [s for s in specs if s.commands and not s.results]      # a study that runs a search writes its own record
    assert [s.name for s in searches] == ["baseline_choices"], "every study with runs says where they are written"
    assert all(c.startswith(("ovq-cl ", "python -m experiments.studies.baseline_choices.")) for s in specs for c in s.commands)


def test_cli_compare_reads_sweep_json_and_pairs_against_a_baseline(study, capsys):
    from experiments.cli import main

    assert main(["compare", str(study / "results" / "toy.json"), "--baseline", "ovq"]) == 0
    out = capsys.readouterr().out
    assert "95% CI" in out and "baseline: layers=['ovq']" in out and "not learned" in out
    assert main(["report", "--out", str(study / "R.md")]) == 0 and (study / "R.md").exists()


def _with_budget_and_curve(run, budget, span_delay):
    """A run record at a state budget, with a delay curve that falls below 0.5 at ``span_delay``."""
    points = [{"filler_episodes": f, "delay": 25 * f, "score": 1.0 if 25 * f < span_delay else 0.1,
               "standard_error": 0.01, "chance": 0.05, "skill": 0.9, "episodes": 8} for f in (0, 1, 2, 4, 8)]
    run = dict(run, params={**run["params"], "model.state_budget": str(budget), "gate.delay": "experience"},
               state_bytes_per_layer_lane=[float(budget)] * 2)
    run["delay"] = {"curve": {"metric": "accuracy", "points": points}, "learning": 50, "longest": 200, "episode": 25,
                    "span": span_delay if span_delay <= 200 else None, "required": True,
                    "gate": {"learned": span_delay > 50, "skill": 0.9}}
    return run


def test_budget_partitions_pair_within_a_budget_and_the_delay_table_and_plot(study):
    runs = [_with_budget_and_curve(_run(m, s, [[1.0, 0.0], [0.9 - 0.1 * (m == "ovq") * (b == 2), 0.95]]), b, span)
            for b in (1, 2) for s in range(3) for m, span in (("ovq", 1000), ("swa", 25))]
    runs += [dict(_run("full", s, [[1.0, 0.0], [1.0, 1.0]]), params={**_run("full", s, [[1]])["params"],
                                                                      "model.state_budget": "None"}) for s in range(3)]
    (study / "results" / "budgets.json").write_text(json.dumps(runs))
    study_file(study / "studies", "budgets").write_text(
        "title: 'Budgets'\ncommands: ['ovq-cl sweep x']\nresults: [results/budgets.json]\nbaseline: ovq\n"
        "partition: model.state_budget\n"
        "sections: [summary, {state_bytes_plot: {path: results/budgets.png}}, paired, matrices]\n")
    text = sections.section(study_specs.load_study("budgets"))
    assert "model.state_budget = 1 (" in text and "model.state_budget = 2 (" in text
    assert text.count("Paired against `ovq`") == 2, "paired tests within each budget, full in both"
    assert "@ learning delay (50 tokens)" in text
    assert "| layers=['ovq'], state_budget=1 | 3 | 1.000" in text and ">200, >200, >200 | 3/3 recall" in text
    assert "| 25, 25, 25 | 0/3 recall |" in text
    assert (study / "results" / "budgets.png").stat().st_size > 1000


def test_the_delay_table_says_each_rows_delays_when_configurations_differ():
    """A stream whose experiences are longer has a later learning delay: one header cannot name both."""
    from experiments.compare import record_from_json
    from experiments.probes.delay import delay_table

    short = [_with_budget_and_curve(_run("ovq", s, [[1.0, 0.0], [0.9, 0.95]]), 1, 1000) for s in range(2)]
    longer = [_with_budget_and_curve(_run("swa", s, [[1.0, 0.0], [0.9, 0.95]]), 1, 25) for s in range(2)]
    for r in longer:
        r["delay"] = {**r["delay"], "learning": 100, "longest": 200}
    same = delay_table([record_from_json(r) for r in short])
    assert "@ learning delay (50 tokens) | @ longest (200 tokens)" in same and "@ 50 tokens" not in same
    mixed = delay_table([record_from_json(r) for r in short + longer])
    assert "| @ learning delay | @ longest |" in mixed
    assert "(2) @ 50 tokens" in mixed and "(2) @ 100 tokens" in mixed and "(2) @ 200 tokens" in mixed


def test_records_are_gated_by_the_current_rule_from_their_stored_gates():
    from experiments.compare import learned_from_gates

    base = {"gate": {"learned": True}, "stream_gate": {"learned": True}, "delay": {"gate": {"learned": False}}}
    assert learned_from_gates({**base, "params": {"gate.delay": "auto"}, "learned": False}) is True
    assert learned_from_gates({**base, "params": {"gate.delay": "experience"}}) is False
    assert learned_from_gates({**base, "stream_gate": {"learned": False}, "params": {}}) is False
    assert learned_from_gates({"learned": True, "params": {}}) is True, "no stored gates: the record's own flag"


def test_a_baseline_can_name_params_beside_its_mixers():
    from experiments.compare import find_group, group_records, record_from_json

    runs = [_run("ovq", 0, [[1.0]]), _run("ovq", 0, [[1.0]]), _run("vq", 0, [[1.0]])]
    runs[1]["params"]["stream.options.meta_sequence_episodes"] = "4"
    runs[0]["params"]["stream.options.meta_sequence_episodes"] = "1"
    groups = group_records([record_from_json(r) for r in runs])
    key = find_group(groups, "ovq | stream.options.meta_sequence_episodes=4")
    assert groups[key][0].params["stream.options.meta_sequence_episodes"] == "4"
    with pytest.raises(ValueError, match="matches 2 configurations"):
        find_group(groups, "ovq")
    # '*' leaves the mixers to the params: the hybrid's group is found by its params alone
    hybrid = _run("swa,ovq", 0, [[1.0]])
    hybrid["params"]["stream.options.meta_sequence_episodes"] = "2"
    groups = group_records([record_from_json(r) for r in runs + [hybrid]])
    key = find_group(groups, "* | stream.options.meta_sequence_episodes=2")
    assert groups[key][0].params["model.layers"] == hybrid["params"]["model.layers"]
    with pytest.raises(ValueError, match="matches 0 configurations"):
        find_group(groups, "ovq | stream.options.meta_sequence_episodes=2")


def _forgetting_run(layers, seed, forgotten, learned=True):
    """Two experiences; experience 0 learned at 1.0 and ``forgotten`` of it lost after experience 1."""
    return _run(layers, seed, [[1.0, 0.0], [1.0 - forgotten, 0.9]], learned)


def test_the_verdict_says_who_forgets_less_from_paired_seeds(study):
    from experiments import compare

    noise = [0.01, -0.02, 0.015, 0.0, -0.01]
    runs = [_forgetting_run("ovq", s, 0.10 + noise[s]) for s in range(5)]
    runs += [_forgetting_run("delta", s, 0.60 + noise[::-1][s]) for s in range(5)]     # forgets more
    runs += [_forgetting_run("vq", s, 0.02 + noise[s] / 2) for s in range(5)]          # forgets less
    runs += [_forgetting_run("ssm", s, 0.10 + noise[::-1][s]) for s in range(5)]       # the same
    runs += [_forgetting_run("linear", s, 0.0, learned=False) for s in range(5)]
    runs += [_forgetting_run("swa", s, 0.3, learned=s < 2) for s in range(5)]         # learned on 2 seeds
    records = [compare.record_from_json(d) for d in runs]
    rows = {r.other: r for r in compare.verdict_rows(records, "ovq")}
    assert rows["delta"].verdict == "OVQ forgets less"
    assert abs(rows["delta"].forgetting.mean_difference - 0.5) < 1e-9 and rows["delta"].n_pairs == 5
    assert rows["vq"].verdict == "**OVQ forgets more**"
    assert rows["ssm"].verdict == "no difference detected"
    assert rows["linear"].verdict == "not comparable: linear did not learn (0/5; OVQ 5/5)" and rows["linear"].n_not_learned == 5
    assert rows["swa"].n_pairs == 2 and rows["swa"].verdict == "OVQ forgets less (2 seeds, fewer than 5)"
    # OVQ itself not learned: that is a place OVQ loses, and the verdict says so
    flipped = [compare.record_from_json({**d, "learned": not d["learned"]}) for d in runs
               if d["params"]["model.layers"] in ("['ovq']", "['linear']")]
    (row,) = compare.verdict_rows(flipped, "ovq")
    assert row.verdict == "not comparable: **OVQ did not learn** (0/5), linear did (5/5)"
    both = [compare.record_from_json({**d, "learned": False}) for d in runs if d["params"]["model.layers"] in ("['ovq']", "['linear']")]
    assert compare.verdict_rows(both, "ovq")[0].verdict == "not comparable: neither learned"
    # the learning cost is paired over every shared seed: OVQ learns 0.95 on average, linear 0.45
    assert abs(rows["linear"].learning.mean_difference - 0.0) < 1e-9

    (study / "results" / "verdict.json").write_text(json.dumps(runs))
    study_file(study / "studies", "toy").write_text(
        "title: 'Toy'\ncommands: [\"ovq-cl sweep cfg.yaml --name v --out results\"]\nresults: [results/verdict.json]\n"
        "baseline: ovq\nverdict: 'toy stream'\n")
    table = report.verdict_table(study_specs.all_studies())
    assert table.count("| toy stream |") == 5 and "**OVQ forgets more**" in table


def test_the_verdict_of_a_rebinding_stream_uses_the_facts_in_force():
    from experiments import compare

    runs = []
    for s in range(3):
        for layers, stale_loss in (("ovq", 0.1), ("delta", 0.5)):
            d = _forgetting_run(layers, s, 0.0)
            d["summary_current"] = {"forgetting_max": stale_loss + 0.01 * s}
            runs.append(d)
    (row,) = compare.verdict_rows([compare.record_from_json(d) for d in runs], "ovq")
    assert row.current and abs(row.forgetting.mean_difference - 0.4) < 1e-9


def test_smoke_commands_are_cut_to_the_first_grid_value_and_write_elsewhere(tmp_path):
    spec = study_specs.StudySpec(smoke=["stream.options.train_episodes=8"])
    argv = ["sweep", "cfg.yaml", "seed=3", "--grid", "model.layers=[ovq];[vq]", "--grid", "a&b=1&2;3&4",
            "--name", "x", "--out", "results"]
    out = study_runner.smoke_command(argv, spec, str(tmp_path))
    assert out[:5] == ["sweep", "cfg.yaml", "seed=3", "--grid", "model.layers=[ovq]"]
    assert out[5:7] == ["--grid", "a&b=1&2"] and out[out.index("--out") + 1] == str(tmp_path / "results")
    assert "stream.options.train_episodes=8" in out and "meta_train.steps=2" in out
    assert any(o.startswith("tracking.tracking_uri=sqlite:///" + str(tmp_path)) for o in out)
    # a key the smoke sets leaves the grid's axes (the grid is applied after the overrides)
    argv = ["sweep", "cfg.yaml", "--grid", "model.layers&meta_train.steps=[delta]&2000;[ssm]&1000",
            "--grid", "meta_train.steps=1000;2000", "--name", "x", "--out", "results"]
    out = study_runner.smoke_command(argv, spec, str(tmp_path))
    assert out[:4] == ["sweep", "cfg.yaml", "--grid", "model.layers=[delta]"] and out.count("--grid") == 1


def test_partitions_over_several_params_pair_within_each_combination():
    from experiments import compare

    runs = []
    for strategy, lam in (("naive", None), ("ewc", "100.0"), ("ewc", "10000.0")):
        for layers, forgotten in (("ovq", 0.1), ("delta", 0.5 if lam != "10000.0" else 0.1)):
            for s in range(3):
                d = _forgetting_run(layers, s, forgotten + 0.01 * s * (layers == "delta"))
                d["params"]["strategy.name"] = strategy
                if lam:
                    d["params"]["strategy.options.ewc_lambda"] = lam
                runs.append(d)
    records = [compare.record_from_json(d) for d in runs]
    parts = dict(report._partitions(records, "strategy.name, strategy.options.ewc_lambda"))
    assert set(parts) == {"ewc, 10000.0", "ewc, 100.0", "naive, -"}
    assert all(len(v) == 6 for v in parts.values())
    (row,) = compare.verdict_rows(parts["ewc, 10000.0"], "ovq")
    assert abs(row.forgetting.mean_difference - 0.01) < 1e-9
    (row,) = compare.verdict_rows(parts["naive, -"], "ovq")
    assert row.verdict == "OVQ forgets less (3 seeds, fewer than 5)"


@pytest.mark.parametrize("grid, bad", [
    (["--grid", "model.layers=[ovq];[nosuch]", "--grid", "seed=0;1"], "nosuch"),          # a later value of an axis
    (["--grid", "model.layers=[ovq];[vq]", "--grid", "seed=0;-1"], "seed"),              # a later seed
    (["--grid", "model.layers=[ovq];[full]", "--grid", "model.mixers.full.window&seed=4&0;x&1"], "window"),  # joint with a seed
])
def test_a_smoke_run_still_validates_the_values_it_does_not_run(grid, bad):
    argv = ["experiments/configs/icr_frozen.yaml", *grid, "--name", "x"]
    study_runner.validate_every_config(["experiments/configs/icr_frozen.yaml", "--grid", "model.layers=[ovq];[vq]",
                                   "--grid", "seed=0;1;2", "--name", "x"])            # a good grid passes
    with pytest.raises(ValueError, match=bad):
        study_runner.validate_every_config(argv)


def test_smoke_runs_once_what_differs_only_by_seeds():
    spec = study_specs.StudySpec(commands=[
        "ovq-cl sweep a.yaml x=1 --grid 'model.layers=[ovq];[vq]' --grid 'seed=0;1' --name a0 --out results",
        "ovq-cl sweep a.yaml x=1 --grid 'model.layers=[ovq];[vq]' --grid 'seed=2;3;4' --name a1 --out results",
        "ovq-cl sweep a.yaml x=2 --grid 'model.layers=[ovq];[vq]' --grid 'seed=0' --name b --out results",
        "ovq-cl sweep a.yaml x=1 --grid 'model.layers=[ovq]' --grid 'seed=0' --name c --out results",
        "ovq-cl report"])
    assert study_runner.smoke_repeats(spec) == [1]
    # a numeric byte budget sizes the model only; null (explicit sizes) is another code path
    budgets = study_specs.StudySpec(commands=[
        "ovq-cl sweep a.yaml model.state_budget=16960 --grid 'seed=0;1' --name a --out results",
        "ovq-cl sweep a.yaml model.state_budget=67840 --grid 'seed=0;1' --name b --out results",
        "ovq-cl sweep a.yaml model.state_budget=null --grid 'seed=0;1' --name c --out results",
        "ovq-cl sweep a.yaml --grid 'model.state_budget=16960;271360' --grid 'seed=0' --name d --out results",
        "ovq-cl sweep a.yaml --grid 'model.state_budget=67840' --grid 'seed=1' --name e --out results"])
    assert study_runner.smoke_repeats(budgets) == [1, 4]


def test_a_run_listed_by_two_sweeps_counts_once(tmp_path, monkeypatch):
    # a sweep that fills in what an interrupted one did not reach lists the runs it reused again
    first = [{**_run("ovq", s, [[1.0, 0.0], [0.9, 0.95]]), "config_id": f"id{s}"} for s in range(2)]
    rest = first[1:] + [{**_run("ovq", 2, [[1.0, 0.0], [0.8, 0.95]]), "config_id": "id2"}]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text(json.dumps(first))
    (tmp_path / "results" / "a_rest.json").write_text(json.dumps(rest))
    monkeypatch.setattr(report, "PROJECT_DIR", str(tmp_path))
    monkeypatch.setattr(sections, "PROJECT_DIR", str(tmp_path))
    spec = study_specs.StudySpec(results=["results/a.json", "results/a_rest.json"])
    raw = report._raw(spec)
    assert [d["config_id"] for d in raw] == ["id0", "id1", "id2"]
    # the same config made by another code version is another run, not dropped as a repeat
    (tmp_path / "results" / "a_rest.json").write_text(json.dumps(rest + [{**first[0], "code_version": "code-b"}]))
    raw = report._raw(spec)
    assert [(d["config_id"], d.get("code_version")) for d in raw][-1] == ("id0", "code-b") and len(raw) == 4


def test_a_replicate_run_by_two_code_versions_counts_once_and_pooled_versions_are_said(tmp_path, monkeypatch):
    # seeds 0-2 by code-a, then seeds 0-2 again by code-b: counted twice, the row would have n = 6
    runs = [{**_run("ovq", s, [[1.0, 0.0], [0.9, 0.95]]), "config_id": f"id{s}", "code_version": "code-a"}
            for s in range(3)]
    runs += [{**_run("ovq", s, [[1.0, 0.0], [0.5, 0.95]]), "config_id": f"id{s}", "code_version": "code-b"}
             for s in range(3)]
    # vq: seeds 0-1 by code-a, seed 2 by code-b: three replicates, pooled, and said
    runs += [{**_run("vq", s, [[1.0, 0.0], [0.9, 0.95]]), "config_id": f"vq{s}", "code_version": "code-a" if s < 2
              else "code-b"} for s in range(3)]
    _study_folder(tmp_path, monkeypatch, "two", runs, "title: 'Two versions'\nsetup: 'A setup.'\nbaseline: ovq\n")
    text = sections.section(study_specs.load_study("two"))
    assert "Note: 3 run(s) of a configuration and seeds that a later code version ran again are left out" in text
    assert ("Note: layers=['vq']: its seeds were run by 2 code versions, pooled here (code-a (n=2), code-b (n=1))"
            in text)
    # the vq seed of code-b pairs with ovq's code-b seed; its code-a seeds pair with ovq's code-b runs
    assert "Pairs made across code versions in this table (the verdict table never pairs across versions): layers=['vq'] (2 of 3)." in text
    rows = {line.split(" | ")[0]: line.split(" | ") for line in text.splitlines()
            if line.startswith("| layers=") and " | accuracy | " in line}
    assert [rows[k][2] for k in ("| layers=['ovq']", "| layers=['vq']")] == ["3", "3"]
    assert rows["| layers=['ovq']"][4].startswith("0.725")          # code-b's runs, the later ones


def _commands_only_study(tmp_path, monkeypatch, name, yaml):
    """A studies folder holding study ``name`` (its YAML), and a study runner that writes no report."""
    studies = tmp_path / "studies"
    studies.mkdir(exist_ok=True)
    study_file(studies, name).write_text(yaml)
    monkeypatch.setattr(study_specs, "STUDIES_DIR", str(studies))
    monkeypatch.setattr(study_runner, "write_report", lambda *a, **k: None)
    return studies


def test_a_study_runs_its_commands_in_order_as_the_cli_reads_them(tmp_path, monkeypatch):
    _commands_only_study(tmp_path, monkeypatch, "two",
                         "title: Two\nsetup: s\nresults: []\ncommands:\n  - \"ovq-cl sweep a.yaml --grid 'seed=0;1' "
                         "--name a --out results\"\n  - \"ovq-cl state-sizes\"\n")
    calls = []                                  # what the CLI's main would have been asked to run
    assert study_runner.run_study("two", lambda argv: calls.append(argv) or 0) == 0
    assert calls == [["sweep", "a.yaml", "--grid", "seed=0;1", "--name", "a", "--out", "results"], ["state-sizes"]]


def test_a_sweep_pinned_to_other_code_is_refused_before_anything_runs(tmp_path, monkeypatch):
    studies = _commands_only_study(
        tmp_path, monkeypatch, "pin", "title: Pin\nsetup: s\nresults: []\ncommands:\n  - \"ovq-cl sweep a.yaml --name a "
        "--out results\"\n  - \"ovq-cl sweep b.yaml --name b --out results\"\ncode: {b: 'code-0123456789ab@87e82ac'}\n")
    monkeypatch.setattr(study_runner, "code_version", lambda: "code-ffffffffffff")
    calls = []
    with pytest.raises(ValueError, match=r"study pin: this checkout is code-ffffffffffff, .* b from "
                                         r"code-0123456789ab \(commit 87e82ac\)"):
        study_runner.run_study("pin", lambda argv: calls.append(argv) or 0)
    assert calls == []                                           # nothing ran
    assert study_runner.run_study("pin", lambda argv: calls.append(argv) or 0, skip_pinned=True) == 0
    assert [sweep[-3] for sweep in calls] == ["a"]
    calls.clear()                                                # the pinned code itself runs everything
    monkeypatch.setattr(study_runner, "code_version", lambda: "code-0123456789ab")
    assert study_runner.run_study("pin", lambda argv: calls.append(argv) or 0) == 0 and len(calls) == 2
    calls.clear()                                                # and so does a smoke run, with this code
    monkeypatch.setattr(study_runner, "smoke_command", lambda argv, spec, root: argv)
    monkeypatch.setattr(study_runner, "validate_every_config", lambda argv: None)
    monkeypatch.setattr(study_runner, "code_version", lambda: "code-ffffffffffff")
    assert study_runner.run_study("pin", lambda argv: calls.append(argv) or 0, smoke=str(tmp_path)) == 0
    assert len(calls) == 2
    study_file(studies, "bad").write_text("title: b\ncode: {b: '87e82ac'}\n")
    with pytest.raises(ValueError, match="code pins are sweep name -> 'code-HASH@COMMIT'"):
        study_specs.load_study("bad")
    study_file(studies, "stray").write_text("title: b\ncommands: ['ovq-cl sweep a.yaml --name a']\n"
                                        "code: {c: 'code-0123456789ab@87e82ac'}\n")
    with pytest.raises(ValueError, match=r"code pins name no sweep of its commands: \['c'\]"):
        study_specs.load_study("stray")
    # --name=X is pinned like --name X; a "*" pin leaves commands that make no runs alone
    study_file(studies, "forms").write_text(
        "title: f\ncommands: ['ovq-cl sweep a.yaml --name=a', 'ovq-cl merge results/x.json a.json', "
        "'ovq-cl sweep b.yaml --name b']\ncode: {'*': 'code-0123456789ab@87e82ac', b: 'code-ffffffffffff@1234567'}\n")
    pinned = study_runner.pinned_elsewhere(study_specs.load_study("forms"), "code-ffffffffffff")
    assert [(i, n) for i, n, *_ in pinned] == [(0, "a")]


def test_runs_logged_before_and_after_a_key_existed_are_one_config():
    """Newer code logs ``after_meta.model={}`` (nothing after meta-training); runs of the same config
    logged before the key existed lack it. Their records must carry the same params (else a verdict row
    pairing them is labelled by the difference), and a real after-meta override must stay visible."""
    from experiments.compare import record_from_json

    old, new, rule = _run("ovq", 0, [[1.0]]), _run("ovq", 0, [[1.0]]), _run("ovq", 0, [[1.0]])
    new["params"]["after_meta.model"] = "{}"
    rule["params"]["after_meta.model.mixers.ovq.count_decay"] = "0.99"          # as flatten_config writes it
    assert record_from_json(new).params == record_from_json(old).params
    assert record_from_json(rule).params["after_meta.model.mixers.ovq.count_decay"] == "0.99"


def test_a_frontier_joins_each_mixers_settings_and_shows_a_memory_that_stops_updating(tmp_path):
    """One line per mixer over its knob's settings; retained and updated are the seeds' means with their
    interval; a run that did not learn still counts (a memory that stops taking new facts sits low)."""
    from experiments import compare

    runs = []
    for s in range(3):
        for decay, kept, updated in (("1.0", 0.95, 0.10), ("0.9", 0.70, 0.60)):
            d = _run("ovq", s, [[1.0, 0.0], [0.9, 0.9]])
            d["params"]["model.mixers.ovq.count_decay"] = decay
            d["summary_current"] = {"retained_fraction": kept + 0.01 * s, "updated_fraction": updated,
                                    "final_average": 0.8}
            runs.append(d)
        d = _run("delta", s, [[1.0, 0.0], [0.5, 0.9]], learned=(s != 2))
        d["summary_current"] = {"retained_fraction": 0.4, "updated_fraction": 0.9, "final_average": 0.6}
        runs.append(d)
    records = [compare.record_from_json(d) for d in runs]
    points = sections.frontier_points(records)
    assert sorted(points) == ["delta", "ovq"]
    assert sorted(setting for setting, _ in points["ovq"]) == ["count_decay=0.9", "count_decay=1.0"]
    assert [setting for setting, _ in points["delta"]] == ["default"] and len(points["delta"][0][1]) == 3
    table = sections.frontier_table(records)
    assert "| ovq | count_decay=1.0 | 3 (3) | 0.960 [" in table and "| 0.100 |" not in table
    assert "| delta | default | 3 (2) | 0.400 |" not in table and "| delta | default | 3 (2) | 0.400 [" in table
    sections.plot_frontier(records, str(tmp_path / "f.png"), "toy")
    assert (tmp_path / "f.png").stat().st_size > 1000


def test_the_meta_training_table_says_which_configuration_is_still_improving(tmp_path):
    """Known answers of the plateau rule: a curve that moved by less than PLATEAU_GAIN over its last
    quarter on every seed is a plateau; one seed still rising makes its configuration "still improving"."""
    from experiments import compare

    runs = []
    for s in range(2):
        flat = _run("ovq", s, [[1.0]])
        flat["meta_history"] = [{"step": k, "loss": 1.0, "accuracy": v, "accuracy_recalled": v - 0.5 + 0.1 * s}
                                for k, v in ((100, 0.5), (200, 0.9), (300, 0.95), (400, 0.955))]
        flat["gate"]["score"] = 0.5 + 0.1 * s          # held-out items: far below the training batches
        rising = _run("delta", s, [[1.0]])
        rising["meta_history"] = [{"step": k, "loss": 1.0, "accuracy": v}
                                  for k, v in ((100, 0.2), (200, 0.3), (300, 0.4), (400, 0.4 + 0.1 * s))]
        runs += [flat, rising]
    records = [compare.record_from_json(d) for d in runs]
    table = sections.meta_training_table(records)
    ovq = next(line for line in table.splitlines() if "ovq" in line)
    delta = next(line for line in table.splitlines() if "delta" in line)
    # ovq gains 0.455 from step 100, 95% of it (0.432) by step 300; delta's seed 0 gains 0.2 by step 300 and
    # its seed 1 0.3, 95% of it only at step 400
    # ovq: held-out 0.5 and 0.6 against 0.955 on the training batches (gaps 0.455 and 0.355); delta logged
    # no held-out score
    assert ("| 400 | accuracy 0.955 (0.955-0.955) | 0.550 (0.500-0.600) | +0.405 (+0.455) | +0.005 (+0.005) | "
            "plateau | 300, 300 | 0.505 (0.455-0.555) |") in ovq
    assert "| accuracy 0.450 (0.400-0.500) | - | - | +0.050 (+0.100) | still improving | 300, 400 | - |" in delta
    assert "by reach-back" not in table, "no column for runs that did not log it"
    # a plateau before learning says so: seeds whose held-out skill is under their gate's bar are counted
    for d in runs:
        d["params"]["gate.min_skill"] = "0.5"
    runs[0]["gate"]["skill"] = 0.07                    # ovq seed 0 (runs: ovq, delta, ovq, delta): below the bar
    runs[3]["gate"]["skill"] = 0.5                     # delta seed 1: at the bar is not below it
    table = sections.meta_training_table([compare.record_from_json(d) for d in runs])
    assert "| plateau (1 of 2 below the held-out gate) | 300, 300 |" in next(line for line in table.splitlines() if "ovq" in line)
    assert "| still improving | 300, 400 |" in next(line for line in table.splitlines() if "delta" in line)
    runs[1]["gate"]["skill"] = 0.1                     # delta seed 0
    table = sections.meta_training_table([compare.record_from_json(d) for d in runs])
    assert "| still improving (1 of 2 below the held-out gate) |" in next(line for line in table.splitlines() if "delta" in line)
    for d in runs:
        del d["params"]["gate.min_skill"]
        d["gate"]["skill"] = 0.9
    # runs that split the recalled answers by reach-back get a column: the means at the last step
    for s, d in enumerate(r for r in runs if "ovq" in r["params"]["model.layers"]):
        d["meta_history"][-1].update({"accuracy_recalled_1_4": 0.9, "accuracy_recalled_5_16": 0.4 + 0.2 * s})
    table = sections.meta_training_table([compare.record_from_json(d) for d in runs])
    assert "| on recalled answers by reach-back at the end (1-4 / 5-16 / 17+ episodes, mean) |" in table.splitlines()[0]
    assert next(line for line in table.splitlines() if "ovq" in line).endswith("| 0.900 / 0.500 / - |")
    assert next(line for line in table.splitlines() if "delta" in line).endswith("| - | - / - / - |")
    sections.plot_meta_curves(records, str(tmp_path / "m.png"), "toy")
    assert (tmp_path / "m.png").stat().st_size > 1000


def test_within_tables_pair_each_mixers_recipes_against_its_own_standard(tmp_path, monkeypatch):
    """The section ``paired_within: {by, baseline}``: one paired table per mixer, each recipe against that mixer's
    standard runs (same seeds), beside the baseline tables across mixers."""
    runs = []
    for mixer, gain in (("ovq", 0.0), ("delta", 0.3)):
        for s in range(3):
            for episodes, R in (("4", [[0.5]]), ("32", [[0.5 + gain + 0.01 * s]])):
                d = _run(mixer, s, R)
                d["params"]["stream.options.meta_sequence_episodes"] = episodes
                runs.append(d)
    _study_folder(tmp_path, monkeypatch, "w", runs, "title: 'Within'\nsetup: 'x'\nsections: [summary, "
                  "{paired_within: {by: model.layers, baseline: '* | stream.options.meta_sequence_episodes=4'}}]\n")
    text = sections.section(study_specs.load_study("w"))
    assert "model.layers = ['delta']" in text and "model.layers = ['ovq']" in text
    delta = text.split("model.layers = ['delta']")[1].split("Paired against")[0]
    ovq = text.split("model.layers = ['ovq']")[1].split("Paired against")[0]
    assert "| final_average | 3 | +0.310 [" in delta and "| final_average | 3 | +0.010 [" in ovq


def test_a_frontier_on_a_stream_without_changing_facts_is_kept_against_learned(tmp_path):
    """Without facts that change, a frontier's axes are what the final row keeps of the experiences
    before the last and how well each later experience is learned (R[j][j], j >= 1), in the metric's
    own units (here MSE, lower is better: the plot inverts both axes)."""
    from experiments import compare

    runs = []
    for s in range(2):
        for window, R in (("66", [[0.2, 1.0, 1.0], [1.2, 0.2, 1.0], [1.3, 1.1, 0.2]]),
                          ("266", [[0.2, 1.0, 1.0], [0.4, 0.3, 1.0], [0.6, 0.5, 0.4]])):
            d = _run("swa", s, R)
            d["metric"] = "mse"
            d["params"]["model.mixers.swa.window"] = window
            runs.append(d)
    records = [compare.record_from_json(d) for d in runs]
    x_name, x_of, y_name, y_of, higher = sections.frontier_axes(records)
    assert x_name.startswith("kept") and y_name.startswith("learned") and higher is False
    table = sections.frontier_table(records)
    assert "| swa | window=66 | 2 (2) | 1.200 [" in table and "| 0.200 [" in table       # kept (1.3+1.1)/2, learned 0.2
    assert "| swa | window=266 | 2 (2) | 0.550 [" in table and "| 0.350 [" in table     # kept (0.6+0.5)/2, (0.3+0.4)/2
    sections.plot_frontier(records, str(tmp_path / "f.png"), "toy")
    assert (tmp_path / "f.png").stat().st_size > 1000


def test_probe_curves_give_mean_and_interval_per_configuration_and_x(tmp_path, monkeypatch):
    """The capacity and position curves of a section: known means at each x, one panel per probe and
    domain, drawn where the spec asks for them."""
    runs = []
    for s in range(3):
        for layers, score in (("ovq", 0.5), ("full", 0.9)):
            r = _run(layers, s, [[1.0]])
            r["capacity"] = {"curve": {"points": [{"facts": 16, "score": 1.0}, {"facts": 64, "score": score + 0.1 * s}]}}
            r["position"] = {"curves": {"prose": {"buckets": [{"lo": 0, "hi": 64, "bits_per_byte": 4.0 + s},
                                                              {"lo": 64, "hi": 256, "bits_per_byte": 3.0}]}}}
            r["interference"] = {"curves": {"other_region": [{"items": 0, "score": 1.0}, {"items": 8, "score": score}]}}
            runs.append(r)
    records = [report.compare.record_from_json(d) for d in runs]
    panels = sections.probe_curve_series(records)
    assert sorted(panels) == ["capacity", "interference: other_region", "position: prose"]
    assert dict(next(v for k, v in panels["interference: other_region"].items() if "full" in k))[8].mean == 0.9
    # few lines: one panel per curve, lines named by mixer
    assert [(curve, mixer, sorted(label for label, _ in lines.values()))
            for curve, mixer, lines in sections.probe_panels(records)] == [
        ("capacity", "", ["full", "ovq"]), ("interference: other_region", "", ["full", "ovq"]),
        ("position: prose", "", ["full", "ovq"])]
    monkeypatch.setattr(sections, "PANEL_LINES", 1)          # more lines than a panel holds: one panel per mixer
    assert [(curve, mixer) for curve, mixer, _ in sections.probe_panels(records)][:2] == [("capacity", "full"),
                                                                                        ("capacity", "ovq")]
    monkeypatch.setattr(sections, "PANEL_LINES", 8)
    ovq = dict(next(v for k, v in panels["capacity"].items() if "ovq" in k))
    assert ovq[16].mean == 1.0 and abs(ovq[64].mean - 0.6) < 1e-12 and ovq[64].n == 3
    prose = dict(next(v for k, v in panels["position: prose"].items() if "full" in k))
    assert abs(prose[64].mean - 5.0) < 1e-12 and prose[256].mean == 3.0
    assert sections.probe_curve_series([report.compare.record_from_json(_run("ovq", 0, [[1.0]]))]) == {}
    _study_folder(tmp_path, monkeypatch, "curvy", runs,
                  "title: 'Curves'\nsetup: 'A setup.'\ncurves: results/curvy.png\n")
    text = sections.section(study_specs.load_study("curvy"))
    assert "![probe curves: capacity, interference, position](results/curvy.png)" in text
    assert (tmp_path / "results" / "curvy.png").stat().st_size > 1000


def test_short_recipe_labels_name_what_sets_a_configuration_apart_once():
    """Params that split the configurations as an earlier one does (a recipe's batch size and steps beside
    its episode count) and budget-set knobs are left out; an absent param shows its absent value."""
    keys = [compare.GroupName(parts) for parts in [
        ["meta_train.batch_size=16", "meta_train.retention_loss=1.0", "meta_train.steps=1000", "layers=['delta']",
         "delta.head_dim=65", "state_budget=67840", "stream.options.meta_sequence_episodes=32"],
        ["meta_train.batch_size=16", "meta_train.steps=1000", "layers=['delta']", "delta.head_dim=65",
         "state_budget=67840", "stream.options.meta_sequence_episodes=32"],
        ["meta_train.batch_size=32", "meta_train.steps=400", "layers=['delta']", "delta.head_dim=32",
         "state_budget=16960", "stream.options.meta_sequence_episodes=4"],
        ["meta_train.batch_size=32", "meta_train.steps=400", "layers=['delta']", "delta.head_dim=65",
         "state_budget=67840", "stream.options.meta_sequence_episodes=4"]]]
    labels = sections.short_recipe_labels(keys)
    assert [labels[k] for k in keys] == [
        "meta_sequence_episodes=32, retention_loss=1.0, state_budget=67840",
        "meta_sequence_episodes=32, retention_loss=0.0, state_budget=67840",
        "meta_sequence_episodes=4, retention_loss=0.0, state_budget=16960",
        "meta_sequence_episodes=4, retention_loss=0.0, state_budget=67840"]
    assert sections.short_recipe_labels(keys[:1]) == {keys[0]: "all runs"}
    test_time = [compare.GroupName([f"after_meta.model.mixers.ovq.num_slots={n}", "layers=['ovq']", "ovq.num_slots=128"])
                 for n in (2048, 128)]
    assert list(sections.short_recipe_labels(test_time).values()) == ["num_slots=2048", "num_slots=128"]


def test_group_names_keep_their_params_even_when_a_value_is_a_list():
    """A configuration's name joins its params with ", ", and a list value holds ", " too: the name keeps
    its parts, so labels name the list whole and nothing parses the name back."""
    params = [{"model.layers": str(layers), "gate.interference": str(kinds), "model.state_budget": "67840"}
              for layers, kinds in [(["swa", "ovq"], ["neutral", "repeat"]), (["swa"], ["neutral", "same_region", "repeat"])]]
    keys = list(compare.group_by_config(params, lambda p: p))
    assert [k.parts for k in keys] == [
        ["gate.interference=['neutral', 'repeat']", "layers=['swa', 'ovq']"],
        ["gate.interference=['neutral', 'same_region', 'repeat']", "layers=['swa']"]]
    assert compare.GroupName([]) == "all runs" and compare.GroupName([]).parts == ["all runs"]
    assert keys[1] == "gate.interference=['neutral', 'same_region', 'repeat'], layers=['swa']"
    # a partition over several keys names each value whole
    assert report._where("model.layers, meta_train.steps", "['swa', 'ovq'], 1000") == "layers=['swa', 'ovq'], steps=1000"
    labels = sections.short_recipe_labels(keys)
    assert labels[keys[0]] == "interference=['neutral', 'repeat']"    # one param, its whole list
    assert labels[keys[1]] == "interference=['neutral', 'same_region', 'repeat']"


def test_the_budget_rule_reads_the_longer_rerun_in_the_paired_tables(tmp_path, monkeypatch):
    """``paired: {budget_rule: meta_train.steps}``: OVQ and Gated DeltaNet rerun at 2,000 steps replace their 1,000-step
    runs in the paired tables (the baseline is one configuration again, not two); the summary shows both."""
    runs = []
    for s in range(3):
        for layers, steps, score in (("ovq", "1000", 0.6), ("ovq", "2000", 0.9), ("delta", "1000", 0.2),
                                     ("delta", "2000", 0.5), ("ssm", "1000", 0.3)):
            d = _run(layers, s, [[score + 0.01 * s]])
            d["params"]["meta_train.steps"] = steps
            runs.append(d)
    records = [report.compare.record_from_json(d) for d in runs]
    kept = report.compare.read_longest_budget(records, "meta_train.steps")
    assert sorted({(r.params["model.layers"], r.params["meta_train.steps"]) for r in kept}) == [
        ("['delta']", "2000"), ("['ovq']", "2000"), ("['ssm']", "1000")]
    _study_folder(tmp_path, monkeypatch, "budgets", runs,
                  "title: 'Budgets'\nsetup: 'A setup.'\nbaseline: ovq\n"
                  "sections: [summary, {paired: {budget_rule: meta_train.steps}}]\n")
    text = sections.section(study_specs.load_study("budgets"))
    assert "the paired tables read the largest (6 runs of shorter budgets left out of them; " in text
    assert "no paired table" not in text
    paired = text.split("Paired against `ovq`")[1].split("```")[0]
    assert "meta_train.steps=2000, layers=['delta'] | final_average | 3 | -0.400" in paired
    assert "meta_train.steps=1000, layers=['delta']" not in paired
    assert "meta_train.steps=1000, layers=['delta']" in text.split("Paired against")[0]      # the summary keeps it


def test_declared_capacity_pairs_are_paired_at_every_point_with_one_holm_family(tmp_path, monkeypatch):
    def run(layers, seed, scores, version="code-a"):
        r = {**_run(layers, seed, [[1.0, 0.0], [0.9, 0.95]]), "config_id": f"{layers}{seed}", "code_version": version}
        r["capacity"] = {"curve": {"metric": "accuracy", "points": [
            {"facts": n, "score": x, "skill": x, "chance": 0.0} for n, x in zip((16, 64), scores)]}}
        return r
    runs = [run("ovq", s, (1.0, 0.6 + 0.01 * s)) for s in range(4)]
    runs += [run("full", s, (1.0, 0.3 + 0.02 * s)) for s in range(3)]
    runs.append(run("full", 3, (1.0, 0.3), version="code-b"))        # seed 3 of another code: not paired
    _study_folder(tmp_path, monkeypatch, "cap", runs, "title: 'Cap'\nsetup: 'A setup.'\n"
                  "capacity_pairs: [[ovq, full], [vq, full]]\n")
    text = sections.section(study_specs.load_study("cap"))
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| layers=['ovq'] | layers=['full']")]
    assert [(r[2], r[3]) for r in rows] == [("16", "3"), ("64", "3")]
    # at 64 facts: ovq 0.60, 0.61, 0.62 against full 0.30, 0.32, 0.34: +0.290; at 16 every pair ties (p 1);
    # seed 3 of full is code-b's, so code-a's three pairs are the ones read
    assert rows[1][4].startswith("+0.290 [") and rows[0][4].startswith("+0.000") and rows[0][6] == "1"
    assert ("Note: layers=['ovq'] against layers=['full']: paired within code-a (1 runs of other code versions not "
            "paired).") in text
    assert "Note: vq against full: baseline 'vq' matches 0 configurations." in text
    with pytest.raises(ValueError, match="capacity_pairs are"):
        study_file(tmp_path / "studies", "bad").write_text("title: b\ncapacity_pairs: [[ovq]]\n")
        study_specs.load_study("bad")
