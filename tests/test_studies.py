"""Every study's command, made tiny (``ovq-cl study NAME --smoke DIR``): its sweeps parse, its configs
validate and run, and the report reads back what they wrote. Numbers are not checked here."""
import os

import pytest

from experiments import sections, study, study_specs

STUDIES = study_specs.study_names()


@pytest.fixture(scope="module")
def smoke_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("smoke"))


@pytest.mark.parametrize("name", STUDIES)
def test_each_study_command_runs_on_tiny_sizes(name, smoke_root, monkeypatch):
    from experiments.cli import main

    spec = study_specs.load_study(name)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main(["study", name, "--smoke", smoke_root]) == 0
    pages = os.path.join(smoke_root, "results", "studies")
    text = open(os.path.join(pages, f"{name}.md")).read()
    assert f"## {spec.title}" in text
    # its own page alone: the folder holds other studies' tiny runs, whose figures are not drawn again
    assert f"(results/studies/{name}.md)" in open(os.path.join(smoke_root, "RESULTS.md")).read()
    repeats = set(study.smoke_repeats(spec))
    runs = [c for i, c in enumerate(spec.commands) if c.startswith("ovq-cl sweep") and i not in repeats]
    if runs:
        # every sweep run wrote its JSON under the smoke folder, and none in the project
        for command in runs:
            rel = os.path.join("results", command.split("--name ")[1].split()[0] + ".json")
            assert rel in spec.results and os.path.exists(os.path.join(smoke_root, rel)), rel
        assert "(no runs yet" not in sections.section(spec, smoke_root)
