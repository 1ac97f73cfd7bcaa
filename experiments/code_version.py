"""The version of the code that produced a result: part of a run's identity.

``code_version()`` is ``code-<hash>`` of the committed *content* of what can change a result (the git
blob ids of the packages, the run configs, pyproject.toml and constraints.txt at HEAD; not the
commit), plus ``+dirty.<hash>`` when the checkout differs from it (a hash of ``git diff HEAD`` and of
the untracked files over the same paths). Tests, docs, results and the studies' prose
(the ``.yaml`` and ``.md`` files under ``experiments/studies/``, ``experiments/verdict.yaml``,
``experiments/claims.yaml``, ``experiments/results_header.md``; a study folder's ``.py`` files are code) do not count, so a commit that touches only
them keeps every finished run and checkpoint valid: a study interrupted before such a commit resumes
after it instead of starting over. The commit itself is a tag of every run. Outside a git checkout
it is the installed package version.

It is read once per process and kept: a sweep imports its code when it starts, so a checkout that
changes while the sweep runs must not relabel the later runs with code they do not run.

Code that is not ovq-cl's own changes results too: a run that loads plugins (``--plugin``, ``plugins:``)
or registry entry points has the version ``code_version()`` plus ``+plugins.<hash>`` (the runner adds
:func:`plugin_source_hash`) of the source of every such module's top-level package (all its ``.py`` files, so
the helpers it imports from its own package count), read when the run starts. Editing a plugin makes
a new run identity: no finished run or shared meta-training made by the old plugin code is reused.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from importlib import metadata
from typing import Iterable, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE_PATHS = ("ovq_cl", "streams", "strategies", "experiments", "pyproject.toml", "constraints.txt")
# under CODE_PATHS, not code: the studies' specs and notes (a study folder's .py files, e.g. a search that
# makes results or an analysis, are code), the verdict's and the claims' prose
PROSE_PATHS = ("experiments/studies/**/*.yaml", "experiments/studies/**/*.md", "experiments/verdict.yaml",
               "experiments/claims.yaml", "experiments/results_header.md")
_PATHSPEC = (*CODE_PATHS, *(f":(exclude,glob){p}" for p in PROSE_PATHS))


def _is_prose(path: str) -> bool:
    return path in PROSE_PATHS or (path.startswith("experiments/studies/") and path.endswith((".yaml", ".md")))


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
    tree = _git("ls-tree", "-r", "HEAD", "--", *CODE_PATHS)         # ls-tree knows no exclude pathspec
    if tree is None:
        try:
            return f"package-{metadata.version('ovq-cl')}"
        except metadata.PackageNotFoundError:
            return "unknown"
    lines = [ln for ln in tree.splitlines() if not _is_prose(ln.split(b"\t", 1)[-1].decode())]
    content = hashlib.sha1(b"\n".join(lines)).hexdigest()   # mode, blob id and path of every code file
    diff = _git("diff", "HEAD", "--", *_PATHSPEC) or b""
    digest = hashlib.sha1(diff)
    untracked = (_git("ls-files", "--others", "--exclude-standard", "--", *_PATHSPEC) or b"").decode().split()
    for path in sorted(untracked):
        digest.update(path.encode())
        digest.update(_file_bytes(os.path.join(ROOT, path)))
    dirty = bool(diff.strip()) or bool(untracked)
    return f"code-{content[:12]}" + (f"+dirty.{digest.hexdigest()[:8]}" if dirty else "")


def _file_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def plugin_source_hash(plugins: Iterable[str] = ()) -> str:
    """A hash of the source of the named modules and of the entry points loaded in this process ('' when
    there are none): every ``.py`` file of each one's top-level package (or the module's file), by path
    relative to that package and content. Modules of ovq-cl itself are left to :func:`code_version`."""
    from ovq_cl.base.registry import ENTRY_POINT_MODULES

    roots = sorted({r for name in (*plugins, *ENTRY_POINT_MODULES) for r in _source_roots(name)})
    if not roots:
        return ""
    h = hashlib.sha256()
    for root in roots:
        files = [root] if os.path.isfile(root) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".py"))
        for path in files:
            h.update(os.path.relpath(path, os.path.dirname(root)).encode())
            h.update(_file_bytes(path))
    return h.hexdigest()[:12]


def _source_roots(name: str) -> List[str]:
    """The folder of ``name``'s top-level package, or its file for a lone module; none for ovq-cl's own."""
    top = name.split(".")[0]
    module = sys.modules.get(top) or importlib.import_module(top)
    path = getattr(module, "__file__", None)
    if path is None:                       # a namespace package: its folders
        return [p for p in getattr(module, "__path__", []) if not _ours(p)]
    root = os.path.dirname(path) if os.path.basename(path) == "__init__.py" else path
    return [] if _ours(root) else [os.path.abspath(root)]


def _ours(path: str) -> bool:
    return os.path.abspath(path).startswith(tuple(os.path.join(ROOT, p) for p in CODE_PATHS))

