"""The version of the code that produced a result: part of a run's identity.

``code_version()`` is the git commit, plus ``+dirty.<hash>`` when the code differs from it (a hash of
``git diff HEAD`` and of the untracked files, restricted to what can change a result: the packages,
the configs, pyproject.toml and constraints.txt; tests, docs and results do not count). Outside a
git checkout it is the installed package version.

It is read once per process and kept: a sweep imports its code when it starts, so a checkout that
changes while the sweep runs must not relabel the later runs with code they do not run.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from importlib import metadata
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE_PATHS = ("ovq_cl", "streams", "strategies", "experiments", "pyproject.toml", "constraints.txt")


def _git(*args: str) -> Optional[bytes]:
    try:
        out = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, timeout=20,
                             env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


_CACHED: Optional[str] = None


def code_version() -> str:
    """The version of the code this process runs (read from the checkout at the first call)."""
    global _CACHED
    if _CACHED is None:
        _CACHED = _read_version()
    return _CACHED


def _read_version() -> str:
    commit = (_git("rev-parse", "HEAD") or b"").decode().strip()
    if not commit:
        try:
            return f"package-{metadata.version('ovq-cl')}"
        except metadata.PackageNotFoundError:
            return "unknown"
    diff = _git("diff", "HEAD", "--", *CODE_PATHS) or b""
    digest = hashlib.sha1(diff)
    untracked = (_git("ls-files", "--others", "--exclude-standard", "--", *CODE_PATHS) or b"").decode().split()
    for path in sorted(untracked):
        digest.update(path.encode())
        digest.update(_file_bytes(os.path.join(ROOT, path)))
    dirty = bool(diff.strip()) or bool(untracked)
    return commit[:12] + (f"+dirty.{digest.hexdigest()[:8]}" if dirty else "")


def _file_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""
