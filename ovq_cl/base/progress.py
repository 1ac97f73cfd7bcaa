"""Progress of a phase (meta-training, an experience's training, an evaluation, a demo mixer), on stderr.

On a terminal: a tqdm bar, redrawn in place. Anywhere else (a file, a pipe, a CI log, a Ray worker's
log), a bar is thousands of carriage-return fragments, so a phase is plain lines instead: one when it
ends (``meta-train: 500/500 steps in 41.2 s``) and, for a long phase, one a minute while it runs.
"""
from __future__ import annotations

import sys
import time
from typing import Iterable, Optional

#: seconds between the lines a long phase writes to a log while it runs
LOG_EVERY_S = 60.0


def on_terminal(stream=None) -> bool:
    """Whether ``stream`` (default stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):              # closed or replaced by something without isatty
        return False


class PlainProgress:
    """tqdm's few methods used here (``update``, ``close``, iteration, ``with``), written as lines."""

    def __init__(self, iterable: Optional[Iterable] = None, total: Optional[int] = None, desc: str = "",
                 unit: str = "steps", initial: int = 0, stream=None) -> None:
        self.iterable, self.desc, self.unit, self.stream = iterable, desc, unit, stream
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.n, self.start_n = total, initial, initial
        self.started = self.last_line = time.perf_counter()
        self.closed = False

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update()
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self.last_line >= LOG_EVERY_S:
            self.last_line = now
            self._line("so far")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._line("done")

    def _line(self, when: str) -> None:
        spent = time.perf_counter() - self.started
        of = "" if self.total is None else f"/{self.total}"
        resumed = f" (from {self.start_n})" if self.start_n else ""
        print(f"{self.desc}: {self.n}{of} {self.unit}{resumed} in {spent:.1f} s{'' if when == 'done' else ' so far'}",
              file=self.stream or sys.stderr, flush=True)


def progress(iterable: Optional[Iterable] = None, *, total: Optional[int] = None, desc: str = "", show: bool = True,
             unit: str = "steps", initial: int = 0):
    """A bar on a terminal, plain lines in a log, nothing when ``show`` is false. Iterate it, or call
    ``update()`` and ``close()`` as with tqdm."""
    from tqdm import tqdm

    if not show:                                  # tqdm's own pass-through: iteration as is, methods no-ops
        return tqdm(iterable, total=total, disable=True)
    if on_terminal():
        return tqdm(iterable, total=total, desc=desc, initial=initial, leave=False)
    return PlainProgress(iterable, total=total, desc=desc, unit=unit, initial=initial)
