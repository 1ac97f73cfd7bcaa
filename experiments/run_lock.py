"""One process per run: a lock file in the run's checkpoint folder.

Two processes on one run identity (two shells, a sweep and a hand-started run, two Ray trials) would
both compute it, both log a FINISHED run and both write the same ``last.pt``. :func:`run_lock` takes an
OS file lock (``filelock``: ``flock`` on Linux) on ``{run folder}/run.lock`` for the whole run; a second
process gets :class:`RunInUse` at once, one line naming the holder. The OS releases the lock when its
process ends, however it ends, so a lock left by a killed process is no lock: the next start takes it
(the ``run.lock.owner`` file it finds names a process that is gone, and is replaced).

:func:`meta_training_lock` is the same kind of lock on one shared meta-training entry
(:mod:`experiments.meta_cache`): two runs of one meta-training key started together (two lanes of a
study queue, a 2,048-slot run beside its 128-slot twin) would both meta-train it, each for the whole
time; with the lock the second waits for the first, says so in one line, and then loads what it stored.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from typing import Callable, Iterator

from filelock import FileLock, Timeout

LOCK_NAME = "run.lock"
OWNER_NAME = "run.lock.owner"


class RunInUse(RuntimeError):
    """Another live process holds this run's lock."""


@contextlib.contextmanager
def run_lock(folder: str, label: str) -> Iterator[None]:
    """Holds the lock of the run whose checkpoints live in ``folder`` (created if needed) while the body
    runs; :class:`RunInUse` if another process holds it."""
    os.makedirs(folder, exist_ok=True)
    lock = FileLock(os.path.join(folder, LOCK_NAME), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunInUse(f"run {label} is in use by {holder(folder)}: it is not started twice; wait for that "
                       "process or stop it (this run resumes from its checkpoint when started again)") from None
    with _owned(lock, os.path.join(folder, OWNER_NAME)):
        yield


@contextlib.contextmanager
def meta_training_lock(entry: str, announce: Callable[[str], None]) -> Iterator[None]:
    """Held while this process decides whether to meta-train the shared entry ``entry`` (a ``.pt`` path
    of :mod:`experiments.meta_cache`) and, if it does, until it has stored it. Where another live process
    holds it, ``announce`` gets one line naming that process and this one waits (however long its
    meta-training takes); a lock left by a killed process is no lock."""
    os.makedirs(os.path.dirname(entry) or ".", exist_ok=True)
    lock, owner = FileLock(f"{entry}.lock", timeout=0), f"{entry}.lock.owner"
    try:
        lock.acquire()
    except Timeout:
        announce(f"ovq-cl: waiting for {_described(owner)}, which meta-trains what this run would "
                 f"({entry}); this run then loads it")
        lock.acquire(timeout=-1)
    with _owned(lock, owner):
        yield


@contextlib.contextmanager
def _owned(lock: FileLock, owner: str) -> Iterator[None]:
    """The body of an acquired ``lock``, with ``owner`` naming this process; both let go at the end."""
    try:
        with open(owner, "w") as fh:
            json.dump({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}, fh)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(owner)
        lock.release()


def holder(folder: str) -> str:
    """Who holds the lock of ``folder``, as its owner file says ("another process" when unreadable)."""
    return _described(os.path.join(folder, OWNER_NAME))


def _described(owner: str) -> str:
    """The process an owner file names ("another process" when it cannot be read)."""
    try:
        with open(owner) as fh:
            o = json.load(fh)
    except (OSError, ValueError):
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(o.get("since", 0)))
    return f"process {o.get('pid')} on {o.get('host')} (since {since})"
