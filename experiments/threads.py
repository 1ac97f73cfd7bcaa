"""The thread policy of a run's OVQ chunk loop (the op applies what it is given,
:mod:`ovq_cl.ops.ovq.threads`): by default ``auto``, single-threaded whenever the cores are not all ours.

Policies (``OVQ_CL_LOOP_THREADS``, read when a run or a CLI command starts):

- ``"auto"`` (default): at each call, count the runnable tasks of other processes (``/proc/loadavg``'s
  instantaneous count minus this process's running threads) and use ``min(torch threads, cores -
  others)``, at least 1, decided again at most every 0.1 s; where that count is unavailable (not
  Linux), torch's setting as it is;
- ``"inherit"``: torch's thread setting as it is;
- an integer n >= 1: n threads inside the loop.
"""
from __future__ import annotations

import os
import time
from typing import Optional

from ovq_cl.ops.ovq.threads import set_loop_threads

_LAST: dict = {}
_RECHECK_S = 0.1            # decode steps and layers call the loop thousands of times a second


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


def auto_threads(current: int) -> int:
    """The 'auto' choice for torch's ``current`` setting, decided again at most every 0.1 s (reading
    /proc costs ~0.1 ms per thread)."""
    now = time.monotonic()
    if _LAST.get("current") == current and now - _LAST.get("at", -1e9) < _RECHECK_S:
        return _LAST["n"]
    n = threads_for(current, _cores(), others_running())
    _LAST.update(current=current, at=now, n=n)
    return n


def install_loop_threads(policy: Optional[str] = None) -> None:
    """Gives the OVQ loop this process's policy: ``policy``, else ``OVQ_CL_LOOP_THREADS``, else 'auto'.
    A bad value is one ValueError naming it."""
    policy = policy or os.environ.get("OVQ_CL_LOOP_THREADS") or "auto"
    set_loop_threads(auto_threads if policy == "auto" else policy)
