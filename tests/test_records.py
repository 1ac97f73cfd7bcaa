"""Run records on disk (experiments.records): one schema, versioned; reading migrates, `ovq-cl migrate`
rewrites once; the project's own record files are in the current schema."""
import glob
import json
import os

import pytest

from experiments.records import SCHEMA_VERSION, load_records, migrate, migrate_files, write_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

V1 = {"label": "icr-ovq-s0", "config_id": "abc", "params": {"seed": "0"}, "R": [[1.0]], "shared_bytes_per_layer": [0], "learned_buffers": 0,
      "delay": {"span": 200}, "interference": {}, "capacity": {"capacity": 16}, "position": {}}


def test_a_version_1_record_moves_its_probes_under_probes_and_keeps_everything_else():
    new = migrate(V1)
    assert new["schema_version"] == SCHEMA_VERSION == 3
    assert new["probes"] == {"delay": {"span": 200}, "capacity": {"capacity": 16}}     # measured ones only
    assert not {"delay", "interference", "capacity", "position"} & set(new)
    assert {k: v for k, v in new.items() if k not in ("probes", "schema_version")} == \
        {k: v for k, v in V1.items() if k not in ("delay", "interference", "capacity", "position")}
    assert "delay" in V1, "the caller's record is left as it was"
    assert migrate(new) is new, "a current record is returned as it is"


def test_a_record_of_an_unknown_schema_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"run record x: schema_version 4; this code reads 1 to 3"):
        migrate({"label": "x", "schema_version": 4})


def test_files_are_read_migrated_and_rewritten_once(tmp_path):
    path = str(tmp_path / "study.json")
    with open(path, "w") as fh:
        json.dump([V1], fh)
    assert load_records(path) == [migrate(V1)]
    assert migrate_files([path]) == [path] and migrate_files([path]) == []       # once
    assert json.load(open(path)) == [migrate(V1)]
    assert load_records(str(tmp_path / "none.json")) == []
    (tmp_path / "bad.json").write_text(json.dumps({"R": []}))
    with pytest.raises(ValueError, match="is not a list of run records"):
        load_records(str(tmp_path / "bad.json"))
    (tmp_path / "odd.json").write_text(json.dumps([["linear"]]))
    with pytest.raises(ValueError, match="holds an entry that is not a run record"):
        load_records(str(tmp_path / "odd.json"))


def test_a_version_1_piece_merges_into_a_current_file(tmp_path):
    from experiments.sweep import merge_record_files

    study, piece = str(tmp_path / "study.json"), str(tmp_path / "piece.json")
    write_records(study, [migrate({**V1, "config_id": "other"})])
    with open(piece, "w") as fh:
        json.dump([V1], fh)                                    # what a checkout pinned before version 2 writes
    assert merge_record_files(study, [piece]) == (2, 0)
    assert all(d["schema_version"] == SCHEMA_VERSION for d in json.load(open(study)))
    assert merge_record_files(study, [piece]) == (2, 1), "the same run, once migrated, is the same run"


def test_a_result_writes_the_current_schema_and_reads_back_the_same():
    from experiments.config import run_config
    from experiments.run_result import RecordedResult, RunResult

    cfg = run_config({"stream": {"name": "icr", "options": {}}})
    result = RunResult(cfg, "accuracy", [[1.0]], {"final_average": 1.0}, [10], [0], R_se=[[0.0]], R_n=[[4]],
                       probes={"delay": {"span": 20}, "capacity": {}})
    record = result.record()
    assert record["schema_version"] == SCHEMA_VERSION and record["probes"] == {"delay": {"span": 20}}
    assert RunResult.from_record(cfg, record).record() == record
    old = {k: v for k, v in record.items() if k not in ("probes", "schema_version")}
    old.update(delay={"span": 20}, capacity={}, interference={}, position={})
    assert RecordedResult.from_stored(cfg, old).record() == record, "a stored version-1 record is kept migrated"


def test_the_projects_record_files_are_in_the_current_schema():
    """`ovq-cl migrate` ran once over results/; a lane's merge migrates what a pinned checkout writes."""
    stale = []
    for path in sorted(glob.glob(os.path.join(ROOT, "results", "*.json"))):
        records = json.load(open(path))
        if isinstance(records, list) and records and all(isinstance(d, dict) and "config_id" in d for d in records):
            stale += [os.path.basename(path)] if any(d.get("schema_version") != SCHEMA_VERSION for d in records) else []
    assert not stale, f"records in an old schema (run `ovq-cl migrate` on them): {stale}"
