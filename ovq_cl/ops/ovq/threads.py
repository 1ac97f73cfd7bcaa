"""How many CPU threads the OVQ chunk loop uses: a policy that does not stall on a busy machine.

The chunk loop runs ~20-50 small torch ops per chunk. Each multi-threaded op ends in an OpenMP barrier
where the threads spin-wait for each other; when another process holds a core, one of our threads is
descheduled and the rest spin until it returns, a scheduler time slice per op instead of microseconds
(measured here: one OVQ layer at 16k tokens 0.28 s idle, 55 s beside two training processes on the 2
cores, where SDPA went from 0.67 s to 1.55 s). One big op (SDPA) pays that once; the loop pays it per
op. A single thread has no barrier, so the loop runs single-threaded whenever the cores are not all
ours.

Policies (``set_loop_threads`` or the environment variable ``OVQ_CL_LOOP_THREADS``):

- ``"auto"`` (default): at the start of each call, count the runnable tasks of other processes
  (``/proc/loadavg``'s instantaneous count minus this process's running threads) and use
  ``min(torch threads, cores - others)``, at least 1; where that count is unavailable (not Linux),
  the torch setting as it is.
- ``"inherit"``: torch's thread setting as it is (the behaviour before this policy).
- an integer n >= 1: n threads inside the loop.

The policy changes only how many threads compute each op, never what is computed; the tests check
that the outputs agree across thread counts. The torch setting is restored after the loop; it is
process-wide, so other Python threads running torch ops meanwhile share it.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator, Optional, Union

import torch

_POLICY: Union[str, int] = "auto"


def _parse(policy: Union[str, int]) -> Union[str, int]:
    if isinstance(policy, str) and policy not in ("auto", "inherit"):
        try:
            policy = int(policy)
        except ValueError:
            raise ValueError(f"OVQ loop threads: policy must be 'auto', 'inherit' or an integer >= 1, got {policy!r}") from None
    if isinstance(policy, int) and policy < 1:
        raise ValueError(f"OVQ loop threads: an integer policy must be >= 1, got {policy}")
    return policy


def set_loop_threads(policy: Union[str, int]) -> None:
    """Sets the policy for every later call ('auto', 'inherit' or n >= 1)."""
    global _POLICY
    _POLICY = _parse(policy)


def loop_threads_policy() -> Union[str, int]:
    """The policy in force: ``OVQ_CL_LOOP_THREADS`` when set, else the one set here (default 'auto')."""
    env = os.environ.get("OVQ_CL_LOOP_THREADS")
    return _parse(env) if env else _POLICY


def threads_for(current: int, cores: int, others_running: Optional[int]) -> int:
    """The 'auto' choice: ``min(current, cores - others_running)``, at least 1 (``current`` when the
    count of other runnable tasks is unknown)."""
    if others_running is None:
        return current
    return max(1, min(current, cores - max(0, others_running)))


def others_running() -> Optional[int]:
    """Runnable tasks of other processes right now (Linux), or None where it cannot be read.

    ``/proc/loadavg`` counts the whole host; where this process may use only some of its CPUs (a
    cpuset, a container), the count is scaled to that share, so a busy host with our own cores idle
    does not look busy to us (a heuristic: the load is assumed spread evenly)."""
    try:
        with open("/proc/loadavg") as fh:
            running = int(fh.read().split()[3].split("/")[0])
        ours = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as fh:
                    ours += fh.read().rsplit(")", 1)[1].split()[0] == "R"
            except OSError:                      # a thread that ended meanwhile
                continue
        others = max(0, running - max(ours, 1))
        host = os.cpu_count() or 1
        return others if _cores() >= host else int(round(others * _cores() / host))
    except (OSError, ValueError, IndexError):
        return None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                       # not Linux
        return os.cpu_count() or 1


_LAST: dict = {}
_RECHECK_S = 0.1            # decode steps and layers call the loop thousands of times a second


def _auto_threads(current: int) -> int:
    """The 'auto' choice, decided again at most every 0.1 s (reading /proc costs ~0.1 ms per thread)."""
    now = time.monotonic()
    if _LAST.get("current") == current and now - _LAST.get("at", -1e9) < _RECHECK_S:
        return _LAST["n"]
    n = threads_for(current, _cores(), others_running())
    _LAST.update(current=current, at=now, n=n)
    return n


@contextlib.contextmanager
def loop_threads(device: torch.device) -> Iterator[int]:
    """Runs the block with the policy's thread count (CPU tensors only); yields the count used."""
    current = torch.get_num_threads()
    policy = loop_threads_policy()
    if device.type != "cpu" or policy == "inherit":
        yield current
        return
    n = policy if isinstance(policy, int) else _auto_threads(current)
    if n == current:
        yield current
        return
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(current)
