"""A study is a folder: its spec (``study.yaml``) and, where it needs one, its own renderers
(``analysis.py``); adding one touches no framework module, and no framework module names a study."""
import json
import os
import re

import pytest

from conftest import study_file
from experiments import sections, study_specs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ANALYSIS = '''
def render(ctx, caption: str, digits: int = 2):
    """A table no framework module knows: each configuration's mean final average, rounded."""
    from experiments import compare
    lines = [caption, "", "| configuration | mean |", "|---|---|"]
    for key, runs in sorted(compare.group_records(ctx.records).items()):
        mean = sum(r.summary["final_average"] for r in runs) / len(runs)
        lines.append(f"| {key} | {mean:.{digits}f} |")
    return lines + [""]


SECTIONS = {"mean_table": render}
'''


def _run(mixer, seed, final):
    return {"shared_bytes_per_layer": [], "learned_buffers": 0, "label": f"{mixer}-s{seed}", "config_id": f"{mixer}{seed}", "params": {"model.layers": f"['{mixer}']", "seed": seed},
            "seed": seed, "metric": "accuracy", "higher_is_better": True, "R": [[final]],
            "summary": {"final_average": final, "learning_average": final}, "learned": True}


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """A folder of studies outside the package, with one study whose own file defines a renderer."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "mine.json").write_text(json.dumps([_run("ovq", s, 0.5 + 0.1 * s) for s in range(3)]
                                                             + [_run("delta", s, 0.2) for s in range(3)]))
    studies = tmp_path / "studies"
    study_file(studies, "mine").write_text(
        "title: '40. Mine'\nsetup: 'Mine.'\ncommands: [\"ovq-cl sweep cfg.yaml --name mine --out results\"]\n"
        "results: [results/mine.json]\nbaseline: ovq\n"
        "sections: [summary, {mean_table: {caption: 'My own table:', digits: 3}}, matrices]\n")
    (studies / "mine" / "analysis.py").write_text(ANALYSIS)
    monkeypatch.setattr(study_specs, "STUDIES_DIR", str(studies))
    monkeypatch.setattr(sections, "PROJECT_DIR", str(tmp_path))
    return studies


def test_a_study_with_a_renderer_of_its_own_is_a_folder_and_nothing_else(outside):
    spec = study_specs.load_study("mine")
    assert spec.name == "mine" and study_specs.study_names() == ["mine"]
    text = sections.section(spec)
    mine = text.split("My own table:")[1]
    assert "| layers=['delta'] | 0.200 |" in mine and "| layers=['ovq'] | 0.600 |" in mine
    # in the order the spec lists: the summary before it, the matrices after it, the paired tables nowhere
    assert text.index("| configuration | metric | n |") < text.index("My own table:") < text.index("mean R[j][i]")
    assert "Paired against" not in text


def test_every_mistake_in_a_sections_list_is_one_line_when_the_spec_is_read(outside):
    spec_path = outside / "mine" / "study.yaml"
    text = spec_path.read_text()
    cases = {
        "sections: [summary, nosuch]": "no section renderer 'nosuch' \\(known: .*'mean_table'",
        "sections: [{mean_table: {digits: 3}}]": "section 'mean_table': missing option\\(s\\) \\['caption'\\]",
        "sections: [{paired: {budget: 3}}]": "section 'paired': unknown option\\(s\\) \\['budget'\\] \\(its options: \\['budget_rule'\\]\\)",
        "sections: [{summary: {}, paired: {}}]": "a section is a renderer's name or",
    }
    for line, message in cases.items():
        spec_path.write_text(re.sub(r"^sections: .*$", line, text, flags=re.M))
        with pytest.raises(ValueError, match=message):
            study_specs.load_study("mine")
    spec_path.write_text(text)
    (outside / "mine" / "analysis.py").write_text("SECTIONS = {'summary': print}\n")
    with pytest.raises(ValueError, match="redefines the framework's renderers \\['summary'\\]"):
        study_specs.load_study("mine")
    (outside / "mine" / "analysis.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="defines no SECTIONS"):
        study_specs.load_study("mine")


def test_a_spec_without_sections_shows_the_default_parts_and_every_shipped_study_resolves_its_own():
    assert sections.DEFAULT_SECTIONS[0] == "summary" and set(sections.DEFAULT_SECTIONS) <= set(sections.RENDERERS)
    for spec in study_specs.all_studies():          # every renderer found, every option taken
        assert all(callable(render) for render, _ in sections.study_sections(spec))


def test_no_module_outside_a_study_folder_names_a_study():
    """A study's name (its folder), a numbered study or section ("study 17", "sections 13"), or a study's
    folder path appears in no module of the experiments package outside the studies' folders: what a
    study needs lives in its folder. (Model code may cite where a default came from, e.g. a layer's
    search; "section N" of docs/design.md is not a study.)"""
    names = study_specs.study_names()
    numbered = re.compile(r"(?<!design\.md )\b(?:study|studies|section|sections) \d")
    offenders = []
    for package in ("experiments",):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            if os.path.join("experiments", "studies") in folder:
                continue
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(folder, f)
                text = open(path).read()
                found = [m.group(0) for m in numbered.finditer(text)]
                # a folder path, or a name as a quoted string (a bare word like "limits" may be English)
                found += [n for n in names if f"studies/{n}" in text or f'"{n}"' in text or f"'{n}'" in text]
                if found:
                    offenders.append((os.path.relpath(path, ROOT), sorted(set(found))))
    assert not offenders, offenders


def test_every_study_with_findings_has_a_one_sentence_reading():
    """RESULTS.md's index shows each study's reading beside the link to its page: a study read (its findings
    written) says it in one sentence; one not yet read says nothing there."""
    from experiments.study_specs import all_studies

    for spec in all_studies():
        if spec.findings.strip():
            assert spec.reading.strip(), f"{spec.name}: findings but no reading"
        assert len(" ".join(spec.reading.split())) <= 350, f"{spec.name}: a reading is one sentence"
