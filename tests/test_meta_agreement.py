"""Two studies that share models: each run's meta-training history against the other study's
(experiments/meta_agreement.py), and the section that prints it (``meta_shared_with``)."""
import json
import shutil

import pytest

from conftest import study_file

from experiments import report, sections, study_specs
from experiments.studies.length_alone import analysis as meta_agreement
from test_report import _run


def _history(losses):
    return [{"step": 50 * (i + 1), "loss": loss, "accuracy": 0.5} for i, loss in enumerate(losses)]


def _record(layers, seed, losses, **params):
    r = _run(layers, seed, [[1.0, 0.0], [0.9, 0.9]])
    r["params"] = {**r["params"], "meta_train.steps": "100", **params}
    r["meta_history"] = _history(losses)
    return r


def test_identical_histories_differing_steps_and_settings_after_meta_training():
    """A run meets the other study's runs of the same meta-training, whatever happens after it (the gate,
    after_meta, checkpoint_every); a different seed or meta-training setting meets none; a history is
    identical only bit for bit, else the first logged step that differs is named."""
    there = [_record("ovq", 0, [3.0, 1.0, 0.5], **{"gate.episodes": "64", "after_meta.model.mixers.ovq.num_slots": "512"}),
             _record("ovq", 1, [3.0, 1.1, 0.4]),
             _record("full", 0, [2.0, 1.0, 0.2])]
    here = [_record("ovq", 0, [3.0, 1.0, 0.5], **{"gate.episodes": "8", "meta_train.checkpoint_every": "7",
                                                  "after_meta.model.mixers.ovq.num_slots": "2048"}),
            _record("ovq", 1, [3.0, 1.1, 0.44]),                        # its last logged row differs
            _record("full", 0, [2.0, 1.0 + 1e-9, 0.2]),                 # a last-bits difference at step 100
            _record("full", 0, [2.0, 1.0, 0.2], **{"meta_train.lr": "0.1"}),   # another meta-training: no match
            _record("ssm", 0, [1.0], **{"after_meta.model": "{}"})]       # an empty after_meta section: no label
    there.append(_record("ssm", 0, [1.0]))
    rows = {a.label: a for a in meta_agreement.agreements(here, there)}
    assert set(rows) == {"ovq-s0 (model.mixers.ovq.num_slots=2048)", "ovq-s1", "full-s0", "ssm-s0"}
    ovq0, ovq1, full0 = rows["ovq-s0 (model.mixers.ovq.num_slots=2048)"], rows["ovq-s1"], rows["full-s0"]
    assert ovq0.identical and ovq0.first_step is None and ovq0.there == 1
    assert not ovq1.identical and ovq1.first_step == 150
    assert ovq1.final_here == pytest.approx(0.44) and ovq1.final_there == pytest.approx(0.4)
    assert not full0.identical and full0.first_step == 100
    assert ovq0.source == "not recorded" and ovq0.cpu_here == "not recorded"


def test_against_several_histories_the_closest_is_read_and_a_loaded_one_says_so():
    """Where the other study's runs of one meta-training logged different histories (trained on two
    machines), a run is read against the one it follows longest; ``meta_source`` and the CPU are shown."""
    there = [_record("ovq", 0, [3.0, 1.0, 0.5], **{"after_meta.x": "1"}),
             _record("ovq", 0, [3.0, 1.2, 0.5], **{"after_meta.x": "2"})]
    here = [{**_record("ovq", 0, [3.0, 1.0, 0.6]), "meta_source": "shared",
             "provenance": {"cpu": "Some CPU", "cpu_capability": "AVX512"}}]
    (a,) = meta_agreement.agreements(here, there)
    assert (a.there, a.there_histories, a.first_step) == (2, 2, 150)
    assert a.final_there == pytest.approx(0.5) and a.source == "shared" and a.cpu_here == "Some CPU [AVX512]"
    assert meta_agreement.first_difference(_history([1.0, 2.0]), _history([1.0])) == 100   # a step one lacks
    table = meta_agreement.agreement_table(here, there)
    assert "differs from step 150" in table and "+20.0%" in table and "0 of 1 runs" in table


def test_a_study_that_shares_models_prints_the_table_and_names_a_real_study(tmp_path, monkeypatch):
    (tmp_path / "results").mkdir()
    studies = tmp_path / "studies"
    studies.mkdir()
    runs = {"a": [_record("ovq", s, [3.0, 1.0, 0.5 + s]) for s in range(2)],
            "b": [_record("ovq", 0, [3.0, 1.0, 0.5]), _record("ovq", 1, [3.0, 1.0, 9.9])]}
    for name, rs in runs.items():
        (tmp_path / "results" / f"{name}.json").write_text(json.dumps(rs))
        study_file(studies, name).write_text(
            f"title: '{'22' if name == 'a' else '25'}. {name}'\n"
            f"commands: [\"ovq-cl sweep cfg.yaml --name {name} --out results\"]\nresults: [results/{name}.json]\n"
            + ("sections: [summary, {meta_agreement: {with_study: a}}]\n" if name == "b" else ""))
    # study b's folder holds the renderer, as length_alone's does (a study's own code lives in its folder)
    shutil.copy(meta_agreement.__file__, studies / "b" / "analysis.py")
    monkeypatch.setattr(study_specs, "STUDIES_DIR", str(studies))
    monkeypatch.setattr(report, "PROJECT_DIR", str(tmp_path))
    monkeypatch.setattr(sections, "PROJECT_DIR", str(tmp_path))
    text = sections.section(study_specs.load_study("b"))
    assert "Meta-training against study 22's" in text and "1 of 2 runs have the other study's" in text
    assert "Meta-training against" not in sections.section(study_specs.load_study("a"))
    (studies / "b" / "study.yaml").write_text("title: 'c'\nsections: [{meta_agreement: {with_study: nosuch}}]\n")
    with pytest.raises(ValueError, match="with_study names no study: 'nosuch'"):
        study_specs.load_study("b")
    (studies / "b" / "study.yaml").write_text("title: 'c'\nsections: [{meta_agreement: {study: a}}]\n")
    with pytest.raises(ValueError, match="section 'meta_agreement': unknown option\\(s\\) \\['study'\\]; missing option\\(s\\) \\['with_study'\\]"):
        study_specs.load_study("b")
