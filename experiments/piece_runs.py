"""A study's runs beyond one process (``ovq-cl study NAME --backend ray [--lanes N]``).

What is left to run has one definition, :func:`experiments.pieces.study_pieces` (a run is left while no
record in the study's files holds it); this module runs those pieces as Ray tasks of one CPU each, every
piece's command (``ovq-cl sweep`` cut to one run) in the checkout its commit pins
(:func:`experiments.pieces.checkout_of`, with that checkout's own ``.venv``), one thread, and merges each
finished piece's record into the study's file (:func:`experiments.sweep.merge_record_files`) the moment it
ends, so that a finished run is kept whatever happens next.

Started again after a kill it asks the same question again: finished runs are held and skipped, a piece
whose JSON its checkout already has (its run ended, the process that would have merged it did not) is
merged rather than run, and an interrupted run resumes from its last checkpoint (the runner's rule for
a configuration whose checkpoint exists). Ctrl-C or SIGTERM to the driver sends SIGTERM to every running
piece (its run is marked KILLED, its checkpoint kept; :data:`INTERRUPTED`); a Ray worker that dies takes
its piece's process with it (``PR_SET_PDEATHSIG``), so no run goes on unseen, holding its run's lock.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from experiments.pieces import Piece, checkout_of, program_of

#: seconds the driver waits on Ray at a time before it looks for a signal again
WAIT_S = 1.0

#: exit statuses of a run that was stopped, not ended (Ctrl-C, SIGKILL, SIGTERM): it resumes next time
INTERRUPTED = (130, 137, 143, -2, -9, -15)


@dataclass(frozen=True)
class PieceOutcome:
    """How one piece ended: ``merged`` (its record is in the study's file), ``failed`` (its exit status
    and log say why), ``interrupted`` (stopped; resumes next time) or ``no record`` (it exited 0 and wrote
    no JSON: another process held its run)."""

    piece: Piece
    outcome: str
    returncode: Optional[int]
    log: str


def piece_file(piece: Piece, project_dir: str) -> str:
    """The JSON ``piece`` writes, where it writes it (its checkout)."""
    return piece.piece_file if os.path.isabs(piece.piece_file) else \
        os.path.join(checkout_of(piece.commit, project_dir), piece.piece_file)


def piece_command(piece: Piece, project_dir: str) -> List[str]:
    """The piece's ``ovq-cl`` (:func:`experiments.pieces.program_of`: its pinned checkout's own) with its
    arguments."""
    return [*program_of(piece.commit, project_dir), *piece.argv]


def check_checkouts(pieces: Sequence[Piece], project_dir: str) -> None:
    """One line before anything runs for every pinned commit without its checkout and environment."""
    missing = sorted({p.commit for p in pieces if p.commit and not os.access(
        os.path.join(checkout_of(p.commit, project_dir), ".venv", "bin", "ovq-cl"), os.X_OK)})
    if missing:
        raise ValueError("; ".join(f"no checkout of commit {c}: git worktree add ../ovq-cl-{c} {c} && "
                                   f"make -C ../ovq-cl-{c} install" for c in missing))


def _die_with_parent() -> None:
    """In the piece's process before it starts: SIGTERM when the worker that started it dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)    # PR_SET_PDEATHSIG
    except OSError:
        pass


def _run_piece(argv: List[str], cwd: str, log: str) -> int:
    """One piece in a Ray worker: its command, one thread, output to ``log``; its exit status. Cancelled
    (Ray interrupts the task), it sends the piece SIGTERM and waits for it to close its run."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PATH=f"{os.path.join(cwd, '.venv', 'bin')}:{os.environ.get('PATH', '')}")
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)     # see experiments.ray_backend._trial
    except ValueError:
        pass
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "a") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent)
        try:
            # polled, not waited on: Ray's cancel raises KeyboardInterrupt between bytecodes, never inside
            # a blocking wait
            while proc.poll() is None:
                time.sleep(0.5)
            return proc.returncode
        except BaseException:
            proc.send_signal(signal.SIGTERM)
            return proc.wait()


def run_pieces(pieces: Sequence[Piece], project_dir: str, log_dir: str, lanes: int = 2,
               address: Optional[str] = None, announce: Callable[[str], None] = print,
               command: Callable[[Piece, str], List[str]] = piece_command,
               until: Optional[float] = None) -> List[PieceOutcome]:
    """Runs ``pieces`` as Ray tasks of one CPU, ``lanes`` at a time in their order (a local Ray of ``lanes``
    CPUs, or the cluster at ``address``), each merged into its study file as it ends; returns the outcome
    of every piece that ended, in the order of ``pieces``. A piece whose JSON already exists is merged and
    not run. ``until`` (a time.time()): a piece starts only if its expected wall time (``Piece.minutes``)
    ends before it (one without an estimate, until it), so that runs a session's end would cut are left
    for the next. ``command(piece, project_dir)``: the argv a piece runs, in its checkout (its pinned
    ``ovq-cl``; a test's own)."""
    from experiments.ray_backend import _stop_trials, ray_session
    from experiments.sweep import merge_record_files

    def merge(piece: Piece) -> str:
        study_file = os.path.join(project_dir, piece.study_file)
        kept, repeats = merge_record_files(study_file, [piece_file(piece, project_dir)])
        return f"merged into {piece.study_file} ({kept} records" + (f", {repeats} repeat dropped)" if repeats else ")")

    outcomes: List[Optional[PieceOutcome]] = [None] * len(pieces)
    waiting = []
    for i, piece in enumerate(pieces):
        log = os.path.join(log_dir, f"{os.path.basename(piece.piece_file)[:-len('.json')]}.log")
        if os.path.exists(piece_file(piece, project_dir)):          # ended before: merged, not run again
            announce(f"{piece.label}: its JSON exists, {merge(piece)}")
            outcomes[i] = PieceOutcome(piece, "merged", 0, log)
        else:
            waiting.append((i, piece, log))
    if not waiting:
        return [o for o in outcomes if o is not None]

    def next_piece():
        """The first waiting piece that would end in time (removed from ``waiting``), else None."""
        now = time.time()
        for k, (i, piece, log) in enumerate(waiting):
            if until is None or now + 60 * (piece.minutes or 0) < until:
                return waiting.pop(k)
        return None

    with ray_session(address, quiet=True, num_cpus=lanes) as ray:
        task = ray.remote(num_cpus=1, max_retries=0)(_run_piece)
        running: Dict[object, tuple] = {}

        def start() -> None:
            while len(running) < lanes and (chosen := next_piece()) is not None:
                i, piece, log = chosen
                checkout = checkout_of(piece.commit, project_dir)
                running[task.remote(command(piece, project_dir), checkout, log)] = chosen
                announce(f"{piece.label}: started ({log})")

        started = time.perf_counter()
        try:
            start()
            while running:
                # a bounded wait, so that Ctrl-C / SIGTERM reach this loop at once (a wait without a timeout
                # can hold the interpreter in Ray's C++ until a task ends: seen in the suite, a 5-minute hang)
                ready, _ = ray.wait(list(running), num_returns=1, timeout=WAIT_S)
                if not ready:
                    continue
                i, piece, log = running.pop(ready[0])
                try:
                    rc, said = ray.get(ready[0]), ""
                except Exception as err:  # noqa: BLE001 - the worker died or the task was cancelled
                    rc, said = None, f"its task ended without a status ({type(err).__name__})"
                if rc == 0 and os.path.exists(piece_file(piece, project_dir)):
                    outcome, said = "merged", merge(piece)
                elif rc == 0:
                    outcome, said = "no record", f"exited 0 and wrote no {piece.piece_file} (another process holds its run?)"
                elif rc in INTERRUPTED or rc is None:
                    outcome = "interrupted"
                    said = said or f"interrupted (exit {rc}): it resumes from its checkpoint next time"
                else:
                    outcome, said = "failed", f"FAILED (exit {rc}), see {log}"
                outcomes[i] = PieceOutcome(piece, outcome, rc, log)
                announce(f"[{sum(o is not None for o in outcomes)}/{len(pieces)}] {piece.label}: {said}; "
                         f"{time.perf_counter() - started:.0f} s so far")
                start()
        except BaseException:                # Ctrl-C, SIGTERM: each running piece closes its run, then stops
            _stop_trials(ray, list(running))
            raise
    if waiting:
        announce(f"{len(waiting)} runs not started: none would end before the time given (--until)")
    return [o for o in outcomes if o is not None]


def run_study_pieces(name: str, project_dir: str, lanes: int = 2, address: Optional[str] = None,
                     order: str = "seed-outer", announce: Callable[[str], None] = print,
                     until: Optional[float] = None) -> int:
    """``ovq-cl study NAME --backend ray``: every run of the study that its files do not hold, ``lanes`` at a
    time, each from its pinned checkout, then RESULTS.md; 0 when every piece ended with its record merged,
    1 when one failed, 130 when one was interrupted (run the same command again to go on)."""
    from experiments.pieces import study_pieces
    from experiments.report import write_report
    from experiments.study_specs import load_study

    spec = load_study(name)
    pieces = study_pieces(spec, project_dir, order=order)
    check_checkouts(pieces, project_dir)
    others = [c for c in spec.commands if not c.startswith("ovq-cl sweep ")]
    announce(f"study {name}: {len(pieces)} runs left to run, {lanes} at a time" + (
        f"; its {len(others)} other commands (not runs) are not run here: `ovq-cl study {name}` runs them" if others else ""))
    outcomes = run_pieces(pieces, project_dir, os.path.join(project_dir, "outputs", "pieces", name), lanes=lanes,
                          address=address, announce=announce, until=until)
    failed = [o for o in outcomes if o.outcome == "failed"]
    stopped = [o for o in outcomes if o.outcome == "interrupted"]
    write_report()
    if stopped:
        print(f"study {name}: {len(stopped)} runs interrupted: run the same command again to resume them", file=sys.stderr)
    return 1 if failed else 130 if stopped else 0
