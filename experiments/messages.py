"""What a command says to its user: one-line messages on stderr (stdout is for tables and results).

The CLI passes :func:`say` (or :func:`silent` under ``--quiet``) as a run's ``announce``; a Ray trial
says its decisions the same way, on its stderr, which Ray forwards to the driver's.
"""
from __future__ import annotations

import sys


def say(message: str) -> None:
    """A message on stderr, flushed."""
    print(message, file=sys.stderr, flush=True)


def silent(message: str) -> None:
    """No message (``--quiet``)."""
