"""The rerun check's outcome as the tables read it: ``results/verification.json``, which ``ovq-cl report
--verify`` (:mod:`experiments.verify`) writes, one entry per configuration keyed by its study's title and
its configuration label (:func:`configuration_label`), and the cell a table shows for the configurations
behind one of its rows (:func:`row_state`).

Kept apart from :mod:`experiments.verify` (which re-exports all of it) so that the report and the claims
table can read it: the check itself runs studies' commands (:mod:`experiments.study`), which write the
report, so an import of the check from the report would be a cycle (``tests/test_import_graph.py``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Dict, Iterable, Optional, Sequence, Tuple, Union

from experiments import compare
from experiments.study_specs import StudySpec

#: the project (the report's root unless told otherwise)
PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VERIFIED, DIFFERS, UNVERIFIED = "verified", "DIFFERS", "unverified"

#: why a configuration is unverified (the fixed ones; two more name what differs: "made by code-X",
#: "recorded on CPU, rerun on CPU")
NO_CODE_VERSION = "no code version recorded"
NOT_EXPRESSIBLE = "configuration no longer expressible by its study's commands"
NO_SPEC = "no study spec lists its file"
BEYOND_LIMIT = "not rerun (beyond --verify-limit)"

#: where the statuses are kept, under the report's root
VERIFICATION_FILE = os.path.join("results", "verification.json")


# ------------------------------------------------------------------------------ configurations


def _params_of(record: Union[dict, "compare.RunRecord"]) -> Tuple[str, Dict[str, object], Optional[int]]:
    if isinstance(record, dict):
        return record["label"], compare._params(record.get("params") or {}), record.get("seed")
    return record.label, record.params, record.seed


def configuration_label(record: Union[dict, "compare.RunRecord"]) -> str:
    """The name of a record's configuration, the same for every seed of it: its run label without the seed
    and a hash of its parameters without seeds, bookkeeping, the options of mixers it does not use and a
    ``code_version`` a table may have added (``icr-ovq-frozen-persist #1a2b3c4d``). Takes a JSON record
    (a dict) or a :class:`compare.RunRecord`."""
    label, params, _ = _params_of(record)
    kept = {k: str(v) for k, v in compare.relevant_params(dict(params)).items()
            if not compare._is_seed_or_bookkeeping(k) and k != "code_version"}
    digest = hashlib.sha1(json.dumps(sorted(kept.items())).encode()).hexdigest()[:8]
    return f"{re.sub(r'-s-?[0-9]+$', '', label)} #{digest}"


def study_of_file(rel: str, specs: Optional[Sequence[StudySpec]] = None) -> str:
    """The title of the study whose ``results`` list ``rel`` (a study with ``verdict`` first, then in study
    order), the key its configurations have in ``results/verification.json``; ``rel`` itself where no
    study lists it (its configurations are then unverified: ``no study spec lists its file``)."""
    spec = _spec_of_file(rel, specs)
    return rel if spec is None else spec.title


def _spec_of_file(rel: str, specs: Optional[Sequence[StudySpec]] = None) -> Optional[StudySpec]:
    if specs is None:
        from experiments.study_specs import all_studies
        specs = all_studies()
    listing = [s for s in specs if rel in s.results]
    return next((s for s in listing if s.verdict), listing[0] if listing else None)


# ------------------------------------------------------------------------------ the file


def verification_path(root: Optional[str] = None) -> str:
    """``results/verification.json`` under ``root`` (default: the project)."""
    return os.path.join(root or PROJECT_DIR, VERIFICATION_FILE)


def load_verification(root: Optional[str] = None) -> Dict[str, Dict[str, dict]]:
    """``results/verification.json`` under ``root`` (default: the project): {study title: {configuration
    label: entry}}; {} where no check has run."""
    path = verification_path(root)
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        return json.load(fh)


def lookup(verification: Dict[str, Dict[str, dict]], study: str, label: str) -> Optional[dict]:
    """The entry of one configuration (study title, configuration label); None where it has none."""
    return (verification.get(study) or {}).get(label)


def configuration_entry(verification: Dict[str, Dict[str, dict]], studies: Union[str, Sequence[str]],
                        runs: Sequence) -> Optional[dict]:
    """The entry of the configuration whose runs (records or JSON dicts of its seeds) are ``runs``, under
    any of ``studies`` (a title, or several: a claim's files may belong to several studies): the runs'
    configuration labels are tried lowest seed first (the seed the check reruns); None where none has one."""
    studies = [studies] if isinstance(studies, str) else list(studies)
    ordered = sorted(runs, key=lambda r: (_params_of(r)[2] is None, _params_of(r)[2] or 0))
    for label in dict.fromkeys(configuration_label(r) for r in ordered):
        for study in studies:
            entry = lookup(verification, study, label)
            if entry is not None and _rerun_of_these(entry, runs):
                return entry
    return None


def _field(run, name: str):
    return run.get(name) if isinstance(run, dict) else getattr(run, name, None)


def _rerun_of_these(entry: dict, runs: Sequence) -> bool:
    """Whether ``entry`` checked one of ``runs`` itself: the same run identity (``config_id``) where the
    entry and the runs have one, else the same code version. A configuration's label leaves the code out,
    so an entry of another code version's record (or of a record since replaced) says nothing of these."""
    ids = {_field(r, "config_id") for r in runs} - {None}
    if entry.get("config_id") and ids:
        return entry["config_id"] in ids
    return entry.get("code_version") in {_field(r, "code_version") for r in runs}


def _short(entry: dict) -> str:
    reason = entry.get("reason") or entry.get("detail") or "unverified"
    return reason.split(";", 1)[0]


def row_state(entries: Sequence[Optional[dict]]) -> str:
    """A table cell from the entries of the configurations behind one row (None for a configuration with
    no entry): ``verified (2 of 2 configurations: one seed each rerun bit for bit)``, ``unverified: 1 of 2: no code
    version recorded`` (the reasons of the unverified ones; ``not checked`` for one without an entry),
    ``DIFFERS`` where any differs, ``not checked`` where none has an entry."""
    entries = list(entries)
    if not entries or all(e is None for e in entries):
        return "not checked"
    if any(e is not None and e.get("status") == DIFFERS for e in entries):
        return DIFFERS
    n = len(entries)
    unverified = [e for e in entries if e is None or e.get("status") != VERIFIED]
    if not unverified:
        return f"verified ({n} of {n} configuration{'s' if n > 1 else ''}: one seed each rerun bit for bit)"
    reasons = list(dict.fromkeys("not checked" if e is None else _short(e) for e in unverified))
    return f"unverified: {len(unverified)} of {n}: {'; '.join(reasons)}"


def state_of(verification: Dict[str, Dict[str, dict]], keys: Iterable[Tuple[str, str]]) -> str:
    """:func:`row_state` of the configurations named by (study title, configuration label) pairs."""
    return row_state([lookup(verification, study, label) for study, label in keys])
