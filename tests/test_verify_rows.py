"""``ovq-cl report --verify``: every configuration behind the verdict and claims tables ends verified,
unverified (and why) or DIFFERS; only DIFFERS (a record of today's code that today's code does not
reproduce) fails the check; the statuses are kept in results/verification.json, which the tables read."""
import copy
import json

import pytest

from conftest import study_file
import yaml

from experiments import claims, report, sections, study_specs, verify
from experiments.verify import configuration_label, row_state

COMMAND = ("ovq-cl sweep cfg.yaml checkpoint.enabled=false --grid 'model.layers=[ovq];[linear]' "
           "--grid 'seed=0;1' --name toy --out results")


def _config() -> dict:
    from test_runner import TINY

    return {**TINY, "meta_train": {"steps": 4, "batch_size": 8},
            "stream": {**TINY["stream"], "options": {**TINY["stream"]["options"], "n_experiences": 2}}}


@pytest.fixture(scope="module")
def toy_records(tmp_path_factory):
    """The four records (OVQ and linear, seeds 0 and 1) of a tiny sweep, made once by today's code."""
    from experiments.sweep import expand, run_sweep

    folder = tmp_path_factory.mktemp("toy")
    (folder / "cfg.yaml").write_text(yaml.safe_dump(_config()))
    grid = {"model.layers": ["[ovq]", "[linear]"], "seed": ["0", "1"]}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        configs = expand("cfg.yaml", ["checkpoint.enabled=false", f"tracking.tracking_uri=sqlite:///{folder / 'm.db'}"], grid)
        run_sweep(configs, "toy", grid=grid, out="results", announce=lambda m: None, show=lambda t: None)
    return json.loads((folder / "results" / "toy.json").read_text())


def _project(tmp_path, monkeypatch, records, claim_list=()):
    """A project in ``tmp_path``: the toy study (a verdict study), its records, and ``claim_list``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(_config()))
    studies = tmp_path / "studies"
    studies.mkdir(exist_ok=True)
    study_file(studies, "toy").write_text(yaml.safe_dump({
        "title": "Toy", "commands": [COMMAND], "results": ["results/toy.json"], "baseline": "ovq", "verdict": "toy"}))
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": list(claim_list)}))
    monkeypatch.setattr(study_specs, "STUDIES_DIR", str(studies))
    monkeypatch.setattr(report, "PROJECT_DIR", str(tmp_path))
    monkeypatch.setattr(sections, "PROJECT_DIR", str(tmp_path))
    _own_claims(monkeypatch, str(tmp_path / "claims.yaml"))
    _write(tmp_path, records)


def _own_claims(monkeypatch, path: str) -> None:
    """The check and the report read the claims file at ``path``, not the project's."""
    section = claims.claims_section
    monkeypatch.setattr(claims, "CLAIMS_FILE", path)
    monkeypatch.setattr(claims, "claims_section", lambda root, *a, **k: section(root, path, **k))


def _write(tmp_path, records, name="toy.json"):
    (tmp_path / "results").mkdir(exist_ok=True)
    (tmp_path / "results" / name).write_text(json.dumps(records))


def _pick(records, mixer, seed):
    return next(d for d in records if d["seed"] == seed and mixer in d["label"])


def _kept(tmp_path) -> dict:
    return verify.load_verification(str(tmp_path))["Toy"]


def test_verify_passes_over_unverified_rows_and_fails_only_on_todays_code(tmp_path, monkeypatch, capsys, toy_records):
    from experiments.cli import main

    records = copy.deepcopy(toy_records)
    _project(tmp_path, monkeypatch, records)
    ovq, linear = _pick(records, "ovq", 0), _pick(records, "linear", 0)
    ovq_label, linear_label = configuration_label(ovq), configuration_label(linear)
    assert ovq_label.startswith("icr-ovq-naive-") and ovq_label != linear_label
    assert configuration_label(_pick(records, "ovq", 1)) == ovq_label       # one label for every seed
    out = tmp_path / "R.md"                 # not the project's own RESULTS.md path

    # every configuration reproduces: verified, kept, and the verdict table says so
    assert main(["report", "--verify", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count(" verified  Toy:") == 2 and "2 verified, 0 unverified, 0 differ" in err and out.exists()
    kept = _kept(tmp_path)
    assert set(kept) == {ovq_label, linear_label}
    entry = kept[linear_label]
    assert entry["status"] == "verified" and entry["rerun"] and entry["seed"] == 0
    assert entry["code_version"] == linear["code_version"] == entry["rerun_code_version"]
    assert entry["rerun_wall_seconds"] > 0 and entry["date"] and entry["run"] == linear["label"]
    assert "| verified (2 of 2 configurations: one seed each rerun bit for bit) |" in report.verdict_table(study_specs.all_studies())

    # a second check by the same code reruns nothing it already verified (so a limit reaches further each
    # time) and keeps the file as it was
    before = (tmp_path / verify.VERIFICATION_FILE).read_text()
    assert main(["report", "--verify", "--verify-limit", "0", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("(not repeated)") == 2 and "2 verified, 0 unverified" in err
    assert (tmp_path / verify.VERIFICATION_FILE).read_text() == before
    # with other code, "not rerun" replaces no rerun entry
    monkeypatch.setattr("experiments.code_version._CACHED", "code-other")
    assert main(["report", "--verify", "--verify-limit", "0", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count(verify.BEYOND_LIMIT) == 3 and "0 verified, 2 unverified" in err        # 2 lines + the count
    assert (tmp_path / verify.VERIFICATION_FILE).read_text() == before
    monkeypatch.undo()
    _project(tmp_path, monkeypatch, records)

    # a record without a code version whose R was altered, and one whose params match no config of the
    # study's commands: both unverified, said why, and the check passes (RESULTS.md written)
    del linear["code_version"]
    linear["R"][0][0] += 1e-7
    ovq["params"]["model.mixers.ovq.retired_option"] = "3"           # an option today's OVQ no longer has
    _write(tmp_path, records)
    out.unlink()
    assert main(["report", "--verify", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"unverified  Toy: {linear_label} (seed 0, run {linear['label']})  no code version recorded" in err
    assert verify.NOT_EXPRESSIBLE in err and out.exists()
    assert ("0 verified, 2 unverified (configuration no longer expressible by its study's commands: 1, "
            "no code version recorded: 1), 0 differ") in err
    kept = _kept(tmp_path)
    assert kept[linear_label]["status"] == "unverified" and kept[linear_label]["code_version"] is None
    assert kept[configuration_label(ovq)]["reason"] == verify.NOT_EXPRESSIBLE
    assert kept[configuration_label(ovq)]["rerun"] is False
    assert kept[ovq_label]["status"] == "verified"          # seed 1's configuration, checked before: still there
    cell = ("| unverified: 2 of 2: configuration no longer expressible by its study's commands; "
            "no code version recorded |")
    assert cell in report.verdict_table(study_specs.all_studies())

    # a record made by today's code, moved by one part in ten million: DIFFERS, the check fails
    records = copy.deepcopy(toy_records)
    victim = _pick(records, "linear", 0)
    victim["R"][0][0] += 1e-7
    _write(tmp_path, records)
    out.unlink()
    assert main(["report", "--verify", "--verify-only", "linear", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"   DIFFERS  Toy: {linear_label} (seed 0, run {victim['label']})  largest difference 1e-07" in err
    assert "0 verified, 0 unverified, 1 differ" in err and "RESULTS.md not written" in err and not out.exists()
    assert _kept(tmp_path)[linear_label]["status"] == "DIFFERS"
    assert "| DIFFERS |" in report.verdict_table(study_specs.all_studies())


def test_claims_configurations_are_checked_once_cheapest_first(tmp_path, monkeypatch, toy_records):
    records = copy.deepcopy(toy_records)
    for d in records:
        d["wall_seconds"] = {"ovq": 5.0, "linear": 2.0}[d["label"].split("-")[1]]
    _pick(records, "ovq", 0)["wall_seconds"] = None                     # unknown: last
    # a claim over the study's file (its configurations are the verdict's: checked once) and a file no
    # study lists (its configuration: unverified, "no study spec lists its file")
    stray = [{**copy.deepcopy(d), "params": {**d["params"], "model.d_model": "48"}} for d in records[:1]]
    stray[0]["wall_seconds"] = 1.0
    claim = {"claim": "OVQ holds more", "test": "toy, 2 seeds", "ours": "ovq", "against": ["linear"],
             "results": ["results/toy.json", "results/stray.json"], "seeds": 2}
    _project(tmp_path, monkeypatch, records, [claim])
    _write(tmp_path, stray, "stray.json")
    lines = []
    checks = verify.verify(study_specs.all_studies(), limit=0, announce=lines.append)
    assert [(c.study, c.label) for c in checks] == [
        ("results/stray.json", configuration_label(stray[0])),
        ("Toy", configuration_label(_pick(records, "linear", 0))),
        ("Toy", configuration_label(_pick(records, "ovq", 0)))]
    assert [c.reason for c in checks] == [verify.NO_SPEC, verify.BEYOND_LIMIT, verify.BEYOND_LIMIT]
    assert all(c.ok and c.status == "unverified" for c in checks) and len(lines) == 3
    assert verify.study_of_file("results/toy.json") == "Toy"
    assert verify.study_of_file("results/stray.json") == "results/stray.json"
    # written stably: the same statuses give the same file
    path = verify.write_verification(checks, str(tmp_path), date="2026-12-08")
    first = open(path).read()
    verify.write_verification(checks, str(tmp_path), date="2026-12-08")
    assert open(path).read() == first and json.loads(first)["results/stray.json"]
    # the claims table's cell: a configuration's runs (records or JSON) under its studies' titles
    kept = verify.load_verification(str(tmp_path))
    runs = [r for r in records if "ovq" in r["label"]]
    entry = verify.configuration_entry(kept, ["Toy"], runs)
    assert entry["reason"] == verify.BEYOND_LIMIT
    assert row_state([entry, verify.configuration_entry(kept, ["Other"], runs)]) == \
        "unverified: 2 of 2: not rerun (beyond --verify-limit); not checked"


def test_row_state_known_answers():
    verified = {"status": "verified", "reason": ""}
    old = {"status": "unverified", "reason": "no code version recorded", "detail": "no code version recorded; ..."}
    other = {"status": "unverified", "reason": "made by code-abc",
             "detail": "made by code-abc; today's code gives another R (largest difference 0.001); rerun ..."}
    differs = {"status": "DIFFERS", "reason": "", "detail": "largest difference 1e-07"}
    assert row_state([verified, verified]) == "verified (2 of 2 configurations: one seed each rerun bit for bit)"
    assert row_state([verified]) == "verified (1 of 1 configuration: one seed each rerun bit for bit)"
    assert row_state([verified, old]) == "unverified: 1 of 2: no code version recorded"
    assert row_state([other, old]) == "unverified: 2 of 2: made by code-abc; no code version recorded"
    assert row_state([verified, None]) == "unverified: 1 of 2: not checked"
    assert row_state([differs, old]) == "DIFFERS" and row_state([verified, differs]) == "DIFFERS"
    assert row_state([]) == "not checked" and row_state([None, None]) == "not checked"
    # by (study title, configuration label) pairs
    kept = {"S": {"a #1": verified, "b #2": old}}
    assert verify.state_of(kept, [("S", "a #1"), ("S", "b #2")]) == "unverified: 1 of 2: no code version recorded"
    assert verify.state_of(kept, [("S", "a #1"), ("T", "a #1")]) == "unverified: 1 of 2: not checked"
