"""A study's runs beyond one process (experiments.piece_runs): what is left runs as Ray tasks, each finished
piece's record merged as it ends, a failure said and the rest run, an interrupted run left to resume, a
piece whose JSON exists merged and not run again, a missing pinned checkout refused in one line."""
import json
import sys

import pytest

from experiments.pieces import Piece


def _pieces(tmp_path, n):
    return [Piece(argv=("sweep", f"k={k}"), label=f"r{k}", study_file="study.json", piece_file=f"piece{k}.json")
            for k in range(n)]


def _command(tmp_path, fail=(), interrupt=()):
    """The argv of a fake piece: writes its record (and that it ran) or fails (exit 3) or is killed (SIGTERM)."""
    def command(piece, checkout):
        k = int(piece.label[1:])
        record = {"label": piece.label, "config_id": f"id{k}", "params": {"seed": k}, "code_version": "c", "R": [[k]]}
        if k in fail:
            body = "import sys; sys.exit(3)"
        elif k in interrupt:
            body = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
        else:
            body = (f"import json; json.dump([{record!r}], open({piece.piece_file!r}, 'w')); "
                    f"open({str(tmp_path / 'ran.txt')!r}, 'a').write({piece.label!r} + '\\n')")
        return [sys.executable, "-c", body]
    return command


def test_pieces_run_on_ray_each_once_merged_as_they_end_failures_and_interruptions_said(tmp_path):
    pytest.importorskip("ray")
    from experiments.piece_runs import run_pieces

    pieces = _pieces(tmp_path, 5)
    done_before = {"label": "r4", "config_id": "id4", "params": {"seed": 4}, "code_version": "c", "R": [[4]]}
    (tmp_path / "piece4.json").write_text(json.dumps([done_before]))      # ended, never merged: merged, not run
    said = []
    outcomes = run_pieces(pieces, str(tmp_path), str(tmp_path / "logs"), lanes=2, announce=said.append,
                          command=_command(tmp_path, fail={2}, interrupt={3}))
    assert [o.outcome for o in outcomes] == ["merged", "merged", "failed", "interrupted", "merged"]
    assert sorted((tmp_path / "ran.txt").read_text().split()) == ["r0", "r1"]           # each once; r4 not again
    assert sorted(r["label"] for r in json.loads((tmp_path / "study.json").read_text())) == ["r0", "r1", "r4"]
    assert outcomes[2].returncode == 3 and any("r2: FAILED (exit 3)" in s for s in said)
    assert any("r3: interrupted" in s and "resumes" in s for s in said)


def test_a_pinned_piece_without_its_checkout_is_refused_before_anything_runs(tmp_path):
    from experiments.piece_runs import check_checkouts

    pinned = Piece(argv=("sweep",), label="r0", study_file="s.json", piece_file="p.json", commit="abc1234")
    with pytest.raises(ValueError, match=r"no checkout of commit abc1234: git worktree add \.\./ovq-cl-abc1234 abc1234"):
        check_checkouts([pinned], str(tmp_path / "project"))
    check_checkouts([Piece(argv=("sweep",), label="r0", study_file="s.json", piece_file="p.json")], str(tmp_path))


STOPPABLE = """
import os, signal, sys, time
mark = sys.argv[1]
def stop(*_):
    open(mark, "a").write("terminated\\n"); sys.exit(143)
signal.signal(signal.SIGTERM, stop)
open(mark, "a").write(f"started {os.getpid()}\\n")
time.sleep(600)
"""

DRIVER = """
import sys
sys.path.insert(0, {root!r})
from experiments.pieces import Piece
from experiments.piece_runs import run_pieces
piece = Piece(argv=("sweep",), label="r0", study_file="study.json", piece_file="piece0.json")
run_pieces([piece], {tmp!r}, {tmp!r} + "/logs", lanes=1,
           command=lambda p, checkout: [sys.executable, "-c", {body!r}, {mark!r}])
"""


@pytest.mark.parametrize("stop", ["SIGINT", "SIGKILL"])
def test_a_stopped_driver_stops_its_running_piece_with_sigterm(tmp_path, stop):
    """Ctrl-C to the driver interrupts each running piece with SIGTERM (its run closes as KILLED and keeps
    its checkpoint); a driver killed outright takes its pieces with it all the same (no run goes on unseen,
    holding its run's lock; the next start closes its MLflow run as KILLED)."""
    pytest.importorskip("ray")
    import os
    import signal
    import subprocess
    import time

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mark = tmp_path / "mark.txt"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(root=root, tmp=str(tmp_path), body=STOPPABLE, mark=str(mark))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=stop == "SIGINT")
    deadline = time.time() + 300              # Ray's start and stop take long on a loaded machine
    while not (mark.exists() and "started" in mark.read_text()) and time.time() < deadline:
        time.sleep(0.5)
    assert mark.exists() and "started" in mark.read_text()
    driver.send_signal(getattr(signal, stop))
    driver.wait(timeout=max(30.0, deadline - time.time()))
    pid = int(mark.read_text().split()[1])

    def alive() -> bool:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False

    while alive() and time.time() < deadline:
        time.sleep(0.5)
    assert not alive(), "the piece's process outlived its driver"
    if stop == "SIGINT":
        assert mark.read_text().split()[2:] == ["terminated"], "interrupted with SIGTERM: it closed its run"


def test_near_its_until_time_a_run_that_would_not_end_is_left_and_one_that_would_runs(tmp_path):
    pytest.importorskip("ray")
    import dataclasses
    import time

    from experiments.piece_runs import run_pieces

    long, short, unknown = (dataclasses.replace(p, minutes=m) for p, m in zip(_pieces(tmp_path, 3), (120, 1, None)))
    said = []
    outcomes = run_pieces([long, short, unknown], str(tmp_path), str(tmp_path / "logs"), lanes=1,
                          announce=said.append, command=_command(tmp_path), until=time.time() + 30 * 60)
    assert [o.piece.label for o in outcomes] == ["r1", "r2"]              # in order, each once; r0 left
    assert (tmp_path / "ran.txt").read_text().split() == ["r1", "r2"]
    assert "1 runs not started" in said[-1]


def test_until_reads_a_clock_time_or_minutes_from_now_and_refuses_anything_else():
    from experiments.cli import time_of

    assert time_of("+90", now=1000.0) == 1000.0 + 5400 and time_of("+5 min", now=0.0) == 300.0
    with pytest.raises(ValueError, match="give HH:MM"):
        time_of("half past never")
    with pytest.raises(ValueError, match="give HH:MM"):
        time_of("25:00")


def test_a_piece_runs_its_pinned_checkouts_ovq_cl_and_an_unpinned_one_this_interpreters(tmp_path):
    import os

    from experiments.piece_runs import piece_command

    pinned = Piece(argv=("sweep", "a.yaml"), label="r0", study_file="s.json", piece_file="p.json", commit="abc1234")
    project = str(tmp_path / "project")
    assert piece_command(pinned, project) == [os.path.join(str(tmp_path), "ovq-cl-abc1234", ".venv", "bin", "ovq-cl"),
                                              "sweep", "a.yaml"]
    unpinned = Piece(argv=("sweep", "a.yaml"), label="r0", study_file="s.json", piece_file="p.json")
    assert piece_command(unpinned, project) == [sys.executable, "-m", "experiments.cli", "sweep", "a.yaml"]


def test_a_study_runs_on_ray_end_to_end_and_then_nothing_is_left(tmp_path):
    """The real path, tiny: `ovq-cl pieces`' runs of a study (unpinned) run as Ray tasks with the real
    command, each record merged into the study's file; asked again, nothing is left to run."""
    pytest.importorskip("ray")
    from experiments.piece_runs import run_pieces
    from experiments.pieces import study_pieces
    from experiments.study import SMOKE_OVERRIDES
    from test_pieces import SWEEP, _study

    # the smoke sizes and a stream of two short experiences: what is tested is the path, not the numbers
    small = ["stream.options.n_experiences=2", "stream.options.test_episodes=4", *SMOKE_OVERRIDES]
    tiny = SWEEP.replace("[ovq];[full]", "[full]").replace(" --grid", " " + " ".join(small) + " --grid", 1)
    spec = _study(tmp_path, [tiny])
    pieces = study_pieces(spec, str(tmp_path))
    assert [p.label for p in pieces] == ["icr-full-frozen-persist-s0", "icr-full-frozen-persist-s1"]
    outcomes = run_pieces(pieces, str(tmp_path), str(tmp_path / "logs"), lanes=2, announce=lambda _: None)
    assert [o.outcome for o in outcomes] == ["merged", "merged"], open(outcomes[0].log).read()[-2000:]
    records = json.loads((tmp_path / "results" / "tiny.json").read_text())
    assert sorted(r["seed"] for r in records) == [0, 1] and all(r["schema_version"] == 3 for r in records)
    assert study_pieces(spec, str(tmp_path)) == []
