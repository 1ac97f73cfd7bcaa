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
   ``stream_gate.chances`` (each experience's own chance).
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
    if version <= 2:
        _derive_once(out)
    out["schema_version"] = SCHEMA_VERSION
    return out


def _derive_once(record: Dict[str, Any]) -> None:
    """Schema 2 -> 3 in place: what a record made before runs stored it lacks, derived from its params as
    the readers derived it (the memory's sizes from the mixers built shapes-only, each experience's chance
    from its stream rebuilt)."""
    from experiments.compare import derived_memory, _num
    from experiments.stream_chances import experience_chances

    if "shared_bytes_per_layer" not in record or "learned_buffers" not in record:
        shared, buffers = derived_memory(record.get("params") or {})
        record.setdefault("shared_bytes_per_layer", shared)
        record.setdefault("learned_buffers", buffers)
    stream = record.get("stream_gate") or {}
    if not stream.get("chances") and record.get("R") and "learned" in stream:
        chances = experience_chances(record.get("params") or {}, record["metric"], _num(stream.get("chance")))
        if chances:
            record["stream_gate"] = {**stream, "chances": chances}


def load_records(path: str, missing_ok: bool = True) -> List[Dict[str, Any]]:
    """The run records of a sweep's JSON, each in the current schema ([] when the file does not exist and
    ``missing_ok``). ValueError when it is not a list of run records."""
    try:
        with open(path) as fh:
            records = json.load(fh)
    except FileNotFoundError:
        if missing_ok:
            return []
        raise
    if not isinstance(records, list):
        raise ValueError(f"{path} is not a list of run records (what ovq-cl sweep --out writes)")
    if not all(isinstance(d, dict) for d in records):
        raise ValueError(f"{path} holds an entry that is not a run record (not a mapping)")
    return [migrate(d) for d in records]


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
            with open(path) as fh:
                before = json.load(fh)
            after = load_records(path, missing_ok=False)
            if after != before:
                write_records(path, after)
                changed.append(path)
    return changed
