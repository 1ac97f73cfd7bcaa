"""`ovq-cl pieces`: a study's missing runs, one sweep command each (run on Ray by experiments.piece_runs,
tests/test_piece_runs.py).

What matters: a piece makes exactly the run (resolved config) the whole sweep would have made, so its
record merges in as that run; a run is skipped only when a record of the pinned code holds it."""
import json
import os
import shlex
import shutil
import sys

import pytest

from experiments.pieces import study_pieces
from experiments.study import expand_sweep
from experiments.study_specs import load_study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "experiments/configs/icr_frozen.yaml"
SWEEP = (f"ovq-cl sweep {CONFIG} stream.options.train_episodes=8 --grid 'model.layers=[ovq];[full]' "
         "--grid 'seed=0;1' --name tiny --out results")


def _study(tmp_path, commands, code=None, results=("results/tiny.json",)):
    """A study file and a project root under tmp_path (the config copied in, as the project has it)."""
    os.makedirs(tmp_path / "experiments" / "configs", exist_ok=True)
    shutil.copy(os.path.join(ROOT, CONFIG), tmp_path / CONFIG)
    os.makedirs(tmp_path / "results", exist_ok=True)
    lines = ["title: tiny", "commands:"] + [f"  - {json.dumps(c)}" for c in commands]
    lines += [f"results: {json.dumps(list(results))}"]
    if code:
        lines += [f"code: {json.dumps(code)}"]
    path = tmp_path / "tiny.yaml"
    path.write_text("\n".join(lines) + "\n")
    return load_study(str(path))


def _record(cfg, code_version):
    """A run record as a sweep writes it, for a config (what a finished run leaves; the runner resolves
    the vocabulary, so the record's differs from the unresolved config's, as in real records)."""
    params = cfg.to_dict()
    params["model"]["vocab_size"] = 98
    return {"shared_bytes_per_layer": [], "learned_buffers": 0, "label": cfg.label(), "config_id": cfg.identity() + code_version, "params": params,
            "code_version": code_version, "summary": {}, "R": [[1.0]]}


def _full_sweep():
    return expand_sweep(shlex.split(SWEEP)[1:])


def test_every_piece_makes_the_run_the_whole_sweep_makes(tmp_path):
    spec = _study(tmp_path, [SWEEP])
    pieces = study_pieces(spec, str(tmp_path))
    full = {c.label(): c.identity() for c in _full_sweep()}
    assert len(pieces) == 4
    for p in pieces:
        (cfg,) = expand_sweep(list(p.argv))           # one run per piece, read by the CLI's own parser
        assert full[cfg.label()] == cfg.identity() and p.label == cfg.label()
        assert p.study_file == "results/tiny.json" and p.piece_file == f"results/tiny__{p.label}.json"
        assert p.commit is None and p.line().startswith("-\tresults/tiny.json\t")


def test_a_run_is_held_only_by_a_record_of_the_pinned_code(tmp_path):
    spec = _study(tmp_path, [SWEEP], code={"*": "code-aaaaaa@1234567"})
    by_label = {c.label(): c for c in _full_sweep()}
    ovq_s1 = next(c for label, c in by_label.items() if "ovq" in label and label.endswith("s1"))
    full_s0 = next(c for label, c in by_label.items() if "full" in label and label.endswith("s0"))
    # ovq seed 1 finished under the pin; full seed 0 only under other code (it cannot pair: still to run)
    (tmp_path / "results" / "tiny.json").write_text(json.dumps([_record(ovq_s1, "code-aaaaaa"),
                                                                  _record(full_s0, "code-bbbbbb")]))
    left = study_pieces(spec, str(tmp_path))
    assert sorted(p.label for p in left) == sorted(set(by_label) - {ovq_s1.label()})
    assert all(p.commit == "1234567" and p.code == "code-aaaaaa" for p in left)
    assert len(study_pieces(spec, str(tmp_path), include_held=True)) == 4


def test_a_record_that_differs_in_a_value_the_command_sets_holds_nothing(tmp_path):
    spec = _study(tmp_path, [SWEEP])
    ovq_s0 = next(c for c in _full_sweep() if "ovq" in c.label() and c.label().endswith("s0"))
    record = _record(ovq_s0, "code-aaaaaa")
    record["params"]["stream"]["options"]["train_episodes"] = 64     # another override: another run
    (tmp_path / "results" / "tiny.json").write_text(json.dumps([record]))
    assert len(study_pieces(spec, str(tmp_path))) == 4


def test_a_record_of_one_grid_value_leaves_the_other_value_to_run(tmp_path):
    """Two runs that share a label (an axis the label does not name): the record of one holds that one only."""
    sweep = SWEEP.replace("--grid 'model.layers=[ovq];[full]'", "--grid 'meta_train.lr=0.001;0.003'")
    spec = _study(tmp_path, [sweep])
    runs = expand_sweep(shlex.split(sweep)[1:])
    low_s0 = next(c for c in runs if c.meta_train.lr == 0.001 and c.seed == 0)
    (tmp_path / "results" / "tiny.json").write_text(json.dumps([_record(low_s0, "code-aaaaaa")]))
    left = study_pieces(spec, str(tmp_path))
    assert len(left) == 3
    assert sorted("meta_train.lr=0.003" in " ".join(p.argv) for p in left if p.label == low_s0.label()) == [True]


def test_a_record_without_a_param_at_its_absent_value_holds_the_run_that_sets_it(tmp_path):
    """No retention loss logged (code from before the key) is 0.0, as the run's identity reads it."""
    sweep = SWEEP.replace("stream.options.train_episodes=8", "stream.options.train_episodes=8 meta_train.retention_loss=0.0")
    spec = _study(tmp_path, [sweep])
    ovq_s0 = next(c for c in expand_sweep(shlex.split(sweep)[1:]) if "ovq" in c.label() and c.seed == 0)
    record = _record(ovq_s0, "code-aaaaaa")
    del record["params"]["meta_train"]["retention_loss"]
    (tmp_path / "results" / "tiny.json").write_text(json.dumps([record]))
    assert len(study_pieces(spec, str(tmp_path))) == 3


def test_a_run_finished_by_another_sweep_of_the_study_is_held(tmp_path):
    spec = _study(tmp_path, [SWEEP], results=("results/tiny.json", "results/rest.json"))
    ovq_s0 = next(c for c in _full_sweep() if "ovq" in c.label() and c.label().endswith("s0"))
    (tmp_path / "results" / "rest.json").write_text(json.dumps([_record(ovq_s0, "code-aaaaaa")]))
    assert len(study_pieces(spec, str(tmp_path))) == 3


def test_a_run_two_commands_reach_is_one_piece(tmp_path):
    """A study that adds a command to rerun what an earlier sweep never ran (a session ended): while
    neither has run it, the queue holds it once, not once per command."""
    rerun = (f"ovq-cl sweep {CONFIG} stream.options.train_episodes=8 --grid 'model.layers=[ovq]' "
             "--grid 'seed=1' --name rest --out results")
    spec = _study(tmp_path, [SWEEP, rerun], results=("results/tiny.json", "results/rest.json"))
    pieces = study_pieces(spec, str(tmp_path))
    assert len(pieces) == 4 and len({p.label for p in pieces}) == 4
    assert all(p.study_file == "results/tiny.json" for p in pieces)
    # under another pin it is another run (other code), so it stays
    spec = _study(tmp_path, [SWEEP, rerun], code={"*": "code-aaaaaa@1234567", "rest": "code-bbbbbb@7654321"},
                  results=("results/tiny.json", "results/rest.json"))
    assert len(study_pieces(spec, str(tmp_path))) == 5


def test_a_sweep_whose_runs_another_sweep_made_is_finished(tmp_path):
    """The run two commands reach is run once, for the first, and merged into its file: the second sweep's own
    file is never written, and its sweep is finished once every run of its grid is held (the report's
    decision tables wait for unfinished sweeps, so they would wait for ever)."""
    from experiments import report
    from experiments.held_runs import sweep_held

    rerun = (f"ovq-cl sweep {CONFIG} stream.options.train_episodes=8 --grid 'model.layers=[ovq]' "
             "--grid 'seed=1' --name rest --out results")
    spec = _study(tmp_path, [SWEEP, rerun], results=("results/tiny.json", "results/rest.json"))
    runs = {c.label(): c for c in _full_sweep()}
    tiny = tmp_path / "results" / "tiny.json"

    def held_without(left_out):
        tiny.write_text(json.dumps([_record(c, "code-aaaaaa") for label, c in runs.items() if label not in left_out]))
        return [sweep_held(spec, str(tmp_path), shlex.split(c)[1:]) for c in (SWEEP, rerun)]

    # the full attention run of seed 1 missing: the first sweep is unfinished, the rerun (OVQ, seed 1) is held
    assert held_without({"icr-full-frozen-persist-s1"}) == [False, True]
    # the OVQ run of seed 1 missing: neither is finished
    assert held_without({"icr-ovq-frozen-persist-s1"}) == [False, False]
    assert held_without(set()) == [True, True]
    assert report.unfinished_sweeps(spec, str(tmp_path)) == []


def test_seed_outer_completes_the_pairs_first(tmp_path):
    spec = _study(tmp_path, [SWEEP])
    assert [p.label.rsplit("-s", 1)[1] for p in study_pieces(spec, str(tmp_path))] == ["0", "1", "0", "1"]
    assert [p.label.rsplit("-s", 1)[1] for p in study_pieces(spec, str(tmp_path), order="seed-outer")] == ["0", "0", "1", "1"]
    with pytest.raises(ValueError, match="order must be one of"):
        study_pieces(spec, str(tmp_path), order="random")
    # across the study's sweeps too: every sweep's runs of seed 0 (each sweep in the study's order), then seed 1
    # ... then seed 10, after 9, not after 1
    other = (f"ovq-cl sweep {CONFIG} stream.options.train_episodes=8 --grid 'model.layers=[swa]' "
             "--grid 'seed=0;1;10;9' --name rest --out results")
    spec = _study(tmp_path, [SWEEP, other], results=("results/tiny.json", "results/rest.json"))
    order = [(p.label.split("-")[1], p.label.rsplit("-s", 1)[1]) for p in study_pieces(spec, str(tmp_path), order="seed-outer")]
    assert order == [("ovq", "0"), ("full", "0"), ("swa", "0"), ("ovq", "1"), ("full", "1"), ("swa", "1"),
                     ("swa", "9"), ("swa", "10")]
    assert len(study_pieces(spec, str(tmp_path))) == 8                 # the same pieces in the sweep order


def test_two_runs_with_one_label_write_two_files(tmp_path):
    sweep = SWEEP.replace("--grid 'seed=0;1'", "--grid 'meta_train.lr=0.001;0.003'")
    pieces = study_pieces(_study(tmp_path, [sweep]), str(tmp_path))
    assert len({p.piece_file for p in pieces}) == 4 and len({p.label for p in pieces}) == 2


def test_a_piece_expects_the_longest_wall_time_of_its_configuration_and_writes_it_as_a_comment():
    from experiments.pieces import Piece, expected_minutes

    def record(seed, lr, wall):
        return {"label": f"icr-ovq-frozen-persist-s{seed}", "wall_seconds": wall,
                "params": {"seed": seed, "meta_train": {"lr": lr}}}

    records = [record(0, 0.001, 600), record(1, 0.001, 3001), record(0, 0.003, 9000), {"label": "x", "wall_seconds": 5}]
    assert expected_minutes(records, "icr-ovq-frozen-persist-s7", {"seed": "7", "meta_train.lr": "0.001"}) == 51
    assert expected_minutes(records, "icr-ovq-frozen-persist-s7", {"seed": "7", "meta_train.lr": "0.01"}) == 150   # another recipe
    assert expected_minutes(records, "icr-full-frozen-persist-s7", {"seed": "7"}) is None
    # a test-time option shares the meta-training: the run that paid for it counts for both options
    shared = [{**record(0, 0.001, 1200), "params": {"seed": 0, "meta_train": {"lr": 0.001}, "after_meta": {"n": 128}}},
              {**record(0, 0.001, 300), "params": {"seed": 0, "meta_train": {"lr": 0.001}, "after_meta": {"n": 2048}}}]
    assert expected_minutes(shared, "icr-ovq-frozen-persist-s1", {"seed": "1", "meta_train.lr": "0.001", "after_meta.n": "2048"}) == 20
    piece = Piece(argv=("sweep", "c.yaml", "--name", "n"), label="l", study_file="s.json", piece_file="p.json", minutes=51)
    assert piece.line().split("\t") == ["-", "s.json", "p.json", "ovq-cl sweep c.yaml --name n  # ~51 min"]
    assert Piece(argv=("sweep",), label="l", study_file="s", piece_file="p").line().endswith("ovq-cl sweep")


def test_the_cut_keeps_every_other_argument_and_names_a_command_that_had_no_name():
    from experiments.pieces import _cut

    argv = ["sweep", CONFIG, "seed=1", "--grid=model.layers=[ovq];[full]", "--plugin", "my.mod", "--grid", "meta_train.lr=1;2"]
    assert _cut(argv, {"model.layers": "[full]", "meta_train.lr": "2"}, "x__y") == [
        "sweep", CONFIG, "seed=1", "--grid", "model.layers=[full]", "--plugin", "my.mod", "--grid", "meta_train.lr=2",
        "--name", "x__y"]


def test_the_command_prints_a_queue_line_per_missing_run(tmp_path, capsys):
    """`ovq-cl pieces STUDY` (a study file's path here): one tab-separated queue line per run, on stdout."""
    from experiments.cli import main

    study = tmp_path / "tiny.yaml"
    study.write_text(f"title: tiny\ncommands:\n  - {json.dumps(SWEEP.replace('--name tiny', '--name tiny_cli_unwritten'))}\n")
    assert main(["pieces", str(study), "--order", "seed-outer"]) in (0, None)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and all(len(line.split("\t")) == 4 for line in lines)
    assert [line.split("\t")[2] for line in lines][:2] == [
        "results/tiny_cli_unwritten__icr-ovq-frozen-persist-s0.json", "results/tiny_cli_unwritten__icr-full-frozen-persist-s0.json"]


def test_one_piece_per_configuration_sets_the_seeds_aside():
    from experiments.pieces import Piece, one_per_configuration

    def piece(mixer, seed, commit="1234567"):
        argv = ("sweep", CONFIG, "--grid", f"model.layers=[{mixer}]", "--grid", f"seed={seed}", "--name", f"t__{mixer}{seed}")
        return Piece(argv=argv, label=f"{mixer}-s{seed}", study_file="s.json", piece_file=f"{mixer}{seed}.json", commit=commit)

    pieces = [piece("ovq", 1), piece("full", 1), piece("ovq", 2), piece("full", 2), piece("ovq", 2, commit="7654321")]
    assert [p.piece_file for p in one_per_configuration(pieces)] == ["ovq1.json", "full1.json", "ovq2.json"]


def _fake_checkout(tmp_path, commit):
    """A pinned checkout whose ovq-cl records where and how it ran, and fails (one line, exit 3) for full;
    its python says its code's smoke sizes."""
    bin_dir = tmp_path / f"ovq-cl-{commit}" / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "ovq-cl"
    script.write_text("#!/usr/bin/env bash\n"
                      f"echo \"$PWD|$OMP_NUM_THREADS|$*\" >> {tmp_path / 'calls.txt'}\n"
                      "echo 'some progress'\n"
                      "case \"$*\" in *'model.layers=[full]'*) echo 'ValueError: full broke here' >&2; exit 3;; esac\n")
    script.chmod(0o755)
    # its code's own smoke sizes (experiments.study.SMOKE_OVERRIDES), older than this code's
    python = bin_dir / "python"
    python.write_text("#!/usr/bin/env bash\necho '[\"meta_train.steps=3\", \"progress=false\"]'\n")
    python.chmod(0o755)
    return tmp_path / f"ovq-cl-{commit}"


def test_check_runs_each_configuration_tiny_from_its_pinned_checkout_and_says_what_failed(tmp_path):
    from experiments.pieces import check_pieces

    project = tmp_path / "project"
    spec = _study(project, [SWEEP], code={"*": "code-aaaaaa@1234567"})
    pieces = study_pieces(spec, str(project), order="seed-outer")
    said = []
    with pytest.raises(ValueError, match="no checkout of 1234567"):       # before anything runs
        check_pieces(pieces, spec, str(project), str(tmp_path / "out"), announce=said.append)
    assert not (tmp_path / "out").exists() and not said
    checkout = _fake_checkout(tmp_path, "1234567")
    checks = check_pieces(pieces, spec, str(project), str(tmp_path / "out"), announce=said.append)
    assert [(c.piece.label, c.ok) for c in checks] == [("icr-ovq-frozen-persist-s0", True), ("icr-full-frozen-persist-s0", False)]
    assert checks[1].returncode == 3 and checks[1].last_line == "ValueError: full broke here"
    assert "FAILED (exit 3" in said[1] and "full broke here" in said[1] and said[0].startswith("ovq-cl: pieces --check: ok")
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 2                                                  # seed 1 of each: not run
    for call in calls:
        cwd, threads, argv = call.split("|")
        assert cwd == str(checkout) and threads == "1"
        assert "meta_train.steps=3" in argv and "gate.position_episodes" not in argv   # the checkout's sizes, not ours
        assert f"--out {tmp_path / 'out' / 'results'}" in argv and "seed=0" in argv


def test_check_runs_a_piece_end_to_end_with_the_real_command(tmp_path):
    """An unpinned piece runs in the project with this interpreter: a real tiny run, its JSON under DIR."""
    from experiments.pieces import check_pieces

    spec = _study(tmp_path, [SWEEP.replace("[ovq];[full]", "[full]").replace("seed=0;1", "seed=0")])
    (check,) = check_pieces(study_pieces(spec, str(tmp_path)), spec, str(tmp_path), str(tmp_path / "out"), announce=lambda _: None)
    assert check.ok, open(check.log).read()[-2000:]
    (record,) = json.loads((tmp_path / "out" / "results" / "tiny__icr-full-frozen-persist-s0.json").read_text())
    assert str(record["params"]["meta_train.steps"]) == "2" and not os.path.exists(tmp_path / "results" / "tiny.json")


def test_the_smoke_sizes_are_read_from_the_pinned_code_wherever_it_kept_them(tmp_path):
    """Code older than experiments/study.py kept SMOKE_OVERRIDES in experiments/report.py: both are read."""
    from experiments.pieces import smoke_overrides_of

    checkout = tmp_path / "ovq-cl-old"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (checkout / "experiments").mkdir()
    (checkout / "experiments" / "__init__.py").write_text("")
    (checkout / "experiments" / "report.py").write_text("SMOKE_OVERRIDES = ('meta_train.steps=1', 'progress=false')\n")
    assert smoke_overrides_of(str(checkout)) == ("meta_train.steps=1", "progress=false")
    (checkout / "experiments" / "study.py").write_text("SMOKE_OVERRIDES = ('meta_train.steps=5',)\n")
    assert smoke_overrides_of(str(checkout)) == ("meta_train.steps=5",)
    (checkout / "experiments" / "study.py").write_text("raise RuntimeError('broken code')\n")
    with pytest.raises(ValueError, match="cannot read the smoke sizes"):
        smoke_overrides_of(str(checkout))
