"""RESULTS.md is generated from run records: the section of a study has its tables, tests and labels."""
import json

import pytest

from experiments import report


def _run(layers, seed, R, learned=True):
    K = len(R)
    from strategies.forgetting import summary

    return {"label": f"{layers}-s{seed}", "params": {"model.layers": f"['{layers}']", "seed": str(seed),
                                                    "stream.options.seed": str(seed)},
            "metric": "accuracy", "summary": summary(R), "summary_current": {}, "learned": learned,
            "gate": {"skill": 0.9 if learned else 0.0}, "stream_gate": {"skill": 0.8}, "R": R,
            "R_se": [[0.02] * K for _ in range(K)], "tokens_after": list(range(K)),
            "state_bytes_per_layer_lane": [67840.0, 67840.0], "parameters": 1000, "seed": seed, "data_seed": seed,
            "wall_seconds": 30.0}


@pytest.fixture
def study(tmp_path, monkeypatch):
    runs = [_run("ovq", s, [[1.0, 0.0], [0.9 - 0.01 * s, 0.95]]) for s in range(3)]
    runs += [_run("vq", s, [[1.0, 0.0], [0.99, 0.97]]) for s in range(3)]
    runs += [_run("linear", s, [[0.05, 0.0], [0.04, 0.05]], learned=False) for s in range(3)]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "toy.json").write_text(json.dumps(runs))
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "toy.yaml").write_text(
        "title: 'Toy study'\nsetup: 'A setup.'\ncommands: [\"ovq-cl sweep cfg.yaml --name toy --out results\"]\n"
        "results: [results/toy.json]\nbaseline: ovq\nfindings: 'A finding.'\n")
    monkeypatch.setattr(report, "STUDIES_DIR", str(studies))
    monkeypatch.setattr(report, "PROJECT_DIR", str(tmp_path))
    return tmp_path


def test_a_study_section_has_every_table_and_label(study):
    text = report.section(report.load_study("toy"))
    assert text.startswith("## Toy study") and "ovq-cl sweep cfg.yaml" in text and "A finding." in text
    assert "9 runs, wall time per run 30 s" in text
    linear = [line for line in text.splitlines() if line.startswith("| layers=['linear']")]
    assert linear and "not learned" in linear[0] and "0/3 learned" in linear[0]
    assert "baseline: layers=['ovq']" in text
    assert any(line.startswith("| layers=['vq'] | forgetting_max | 3 |") for line in text.splitlines())
    assert "layers=['linear']: mean R[j][i] over 3 runs, mean per-cell s.e. 0.020  [NOT LEARNED" in text


def test_write_report_and_unknown_study(study):
    path = report.write_report(str(study / "RESULTS.md"))
    text = open(path).read()
    assert text.startswith("# Results") and "## Toy study" in text and "do not edit by hand" in text
    with pytest.raises(FileNotFoundError, match="known: \\['toy'\\]"):
        report.load_study("nope")


def test_shipped_studies_load():
    specs = report.all_studies()
    assert specs and any(s.commands for s in specs)
    assert all(s.results for s in specs if s.commands), "every study with runs says where they are written"
    assert all(c.startswith("ovq-cl ") for s in specs for c in s.commands)


def test_cli_compare_reads_sweep_json_and_pairs_against_a_baseline(study, capsys):
    from experiments.cli import main

    assert main(["compare", str(study / "results" / "toy.json"), "--baseline", "ovq"]) == 0
    out = capsys.readouterr().out
    assert "95% CI" in out and "baseline: layers=['ovq']" in out and "not learned" in out
    assert main(["report", "--out", str(study / "R.md")]) == 0 and (study / "R.md").exists()
