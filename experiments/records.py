"""Run records on disk: the one reader and writer of a sweep's JSON (a list of
:meth:`experiments.run_result.RunResult.record` dicts), and the schema's versions.

Every record carries ``schema_version``. Reading migrates an older record to the current schema
(:func:`migrate`), so that no other module reads an old layout; ``ovq-cl migrate FILE...`` rewrites files
once in the current schema. Versions:

1. (no ``schema_version``) the probes' records at the top level: ``delay``, ``interference``,
   ``capacity``, ``position`` (each {} when not measured).
2. the probes' records under ``probes`` (``{name: record}``, only those measured; any registered probe,
   :mod:`experiments.probes`).
3. every record carries what readers used to derive: ``shared_bytes_per_layer`` and ``learned_buffers``
   (VQ's codebook bytes, the learned buffers' numbers) and, where its stream gate was measured,
   ``stream_gate.chances`` (each experience's own chance). Commit ``MIGRATING_COMMIT`` derived them once
   for every file of results/; its readers refuse a record that lacks them (:func:`check_derived`).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Sequence

SCHEMA_VERSION = 3
_V1_PROBES = ("delay", "interference", "capacity", "position")


def migrate(record: Dict[str, Any]) -> Dict[str, Any]:
    """``record`` in the current schema: itself when it already is, else a migrated copy. A record of a
    newer schema than this code knows is a ValueError (its meaning cannot be guessed)."""
    version = record.get("schema_version", 1)
    if version == SCHEMA_VERSION:
        return record
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise ValueError(f"run record {record.get('label', '?')}: schema_version {version!r}; this code reads "
                         f"1 to {SCHEMA_VERSION} (update the checkout that reads it)")
    out = dict(record)
    if version == 1:
        probes = {name: out.pop(name) for name in _V1_PROBES if name in out}
        out["probes"] = {name: p for name, p in probes.items() if p}
    out["schema_version"] = SCHEMA_VERSION
    return out


MIGRATING_COMMIT = "e720fe0"     # the last code that derives what schema 3 stores from a record's params


def check_derived(record: Dict[str, Any]) -> None:
    """What the readers of a run's scores need that schema 3 stores (its memory's sizes, its experiences'
    chances); a record made before runs stored them (schema 2 from a pinned checkout that stores them moves
    up as it is) is refused in one line: their derivation (the mixers built shapes-only, the stream
    rebuilt) ran once over results/ and lives in that commit only."""
    stream = record.get("stream_gate") or {}
    lacks = [k for k in ("shared_bytes_per_layer", "learned_buffers") if k not in record]
    if "chances" not in stream and record.get("R") and "learned" in stream:     # [] : none to store
        lacks.append("stream_gate.chances")
    if lacks:
        raise ValueError(f"run record {record.get('label', '?')}: made before records stored {', '.join(lacks)}; "
                         f"migrate its file once with the code that derives them: git worktree add ../ovq-cl-"
                         f"{MIGRATING_COMMIT} {MIGRATING_COMMIT} && make -C ../ovq-cl-{MIGRATING_COMMIT} install && "
                         f"../ovq-cl-{MIGRATING_COMMIT}/.venv/bin/ovq-cl migrate FILE")


def load_records(path: str, missing_ok: bool = True) -> List[Dict[str, Any]]:
    """The run records of a sweep's JSON, each in the current schema ([] when the file does not exist and
    ``missing_ok``). ValueError when it is not a list of run records."""
    try:
        return [migrate(d) for d in _read_list(path)]
    except FileNotFoundError:
        if missing_ok:
            return []
        raise


def _read_list(path: str) -> List[Dict[str, Any]]:
    """A sweep's JSON as it is on disk: a list of mappings, else ValueError."""
    with open(path) as fh:
        records = json.load(fh)
    if not isinstance(records, list):
        raise ValueError(f"{path} is not a list of run records (what ovq-cl sweep --out writes)")
    if not all(isinstance(d, dict) for d in records):
        raise ValueError(f"{path} holds an entry that is not a run record (not a mapping)")
    return records


def write_records(path: str, records: Sequence[Dict[str, Any]]) -> None:
    """``records`` to ``path`` atomically (a reader never sees half a file); the caller holds the file's
    lock where two writers may meet."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(list(records), fh, indent=1)
    os.replace(tmp, path)


def migrate_files(paths: Sequence[str]) -> List[str]:
    """Rewrites every file of ``paths`` in the current schema, under the lock sweeps write it with; returns
    those that changed."""
    from filelock import FileLock

    changed = []
    for path in paths:
        with FileLock(f"{path}.lock"):
            before = _read_list(path)
            after = [migrate(d) for d in before]
            if after != before:
                write_records(path, after)
                changed.append(path)
    return changed
