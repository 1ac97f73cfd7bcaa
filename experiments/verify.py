"""``ovq-cl report --verify``: one seed of every configuration behind the verdict table and the claims
table is run again by the current code, and its result matrix compared with the stored one bit for bit.
Every configuration ends with one of three statuses, said on stderr and kept in ``results/verification.json``:

- **verified**: the rerun's R equals the stored R bit for bit;
- **DIFFERS**: the rerun's R differs, and the record was made by the code version running now on the same
  CPU instruction set (``provenance.cpu_capability``, where recorded): the code does not reproduce its own
  result. This, and only this, fails the check (``ovq-cl report --verify`` exits 1, RESULTS.md not written);
- **unverified (why)**: the check could not say, and says why: ``no code version recorded`` (a record
  written before records carried one, whose rerun differs: one that matches is verified), ``made by
  code-X; today's code gives another R ...`` (rerun it from its commit's worktree to verify it),
  ``recorded on CPU, rerun on CPU`` (float sums of another vector width: not a code difference),
  ``configuration no longer expressible by its study's commands`` (no single config the commands expand
  to has the record's parameters), ``no study spec lists its file`` (a claim's file no study lists) or
  ``not rerun (beyond --verify-limit)``. An unverified configuration never fails the check, and is
  never called verified.

Which configurations: those of every study with ``verdict`` (its records as the report reads them) and
those of every claim with ``results`` (its files, its ``select``), grouped as the report groups runs
(``compare.group_records``), one record (the lowest seed) per configuration, a configuration behind both
tables once. They are rerun cheapest first (the record's ``wall_seconds``; unknown last), at most
``--verify-limit`` of them; the others are reported ``not rerun (beyond --verify-limit)``. Nothing stops
the check early.

A stored record is rebuilt into a config from the commands of the study whose ``results`` list its file:
every sweep command of the spec is expanded at full size (every grid value), and the config whose
parameters equal the record's (seeds included; tracking, checkpoints and progress aside) is the one that
made it. It runs fresh (``rerun``), with tracking and checkpoints off, and with the torch threads the
record says it ran with (``provenance.threads``; one when not recorded): the thread count changes the
order of float sums and so the last bits of every number; so does the CPU's vector instruction set
(``provenance.cpu_capability``, recorded since 2026-12-06), which a rerun cannot choose.

A configuration is named by its study's title and its **configuration label** (:func:`configuration_label`:
the run label without its seed, and a hash of the configuration's parameters without seeds, e.g.
``icr-ovq-frozen-persist #1a2b3c4d``), the keys of ``results/verification.json``, which every run of the
check merges its statuses into (:func:`write_verification`; an entry ``not rerun (beyond --verify-limit)``
never replaces one that was rerun). The tables read it (:func:`load_verification`, :func:`row_state`,
:func:`configuration_entry`: :mod:`experiments.rerun_check`, re-exported here; the report and the claims
table import them from there, since importing this module from the report would be a cycle): the
verdict table's ``rerun check`` column says, for the two configurations of each row, whether they were
rerun bit for bit.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from experiments import compare
from experiments.rerun_check import (  # noqa: F401  (the reader, re-exported: see experiments/rerun_check.py)
    BEYOND_LIMIT, DIFFERS, NO_CODE_VERSION, NO_SPEC, NOT_EXPRESSIBLE, UNVERIFIED, VERIFICATION_FILE, VERIFIED,
    _params_of, _spec_of_file, configuration_entry, configuration_label, load_verification, lookup, row_state,
    state_of, study_of_file, verification_path)
from experiments.study_specs import StudySpec


@dataclass
class Verification:
    """One configuration's check. ``status``: ``verified``, ``DIFFERS`` or ``unverified``; ``reason``: why
    it is unverified, short (what :func:`row_state` shows); ``detail``: what the line says beside it."""

    study: str
    label: str                                  # the configuration label (configuration_label)
    seed: Optional[int]
    status: str
    detail: str = ""
    reason: str = ""
    run: str = ""                               # the record's own label (with its seed)
    config_id: Optional[str] = None             # the record's run identity
    code_version: Optional[str] = None          # the record's code version (None: not recorded)
    rerun_code_version: Optional[str] = None    # the code that reran it (None: not rerun)
    rerun_wall_seconds: Optional[float] = None
    rerun: bool = False                         # whether it was run again
    repeated: bool = False                      # verified earlier by this very code: read from the file, not rerun
    r_digest: Optional[str] = None              # a digest of the stored R it was checked against

    @property
    def ok(self) -> bool:
        """Whether it leaves the check passing: everything but DIFFERS."""
        return self.status != DIFFERS

    @property
    def kind(self) -> str:
        """The reason as counted in the summary (code versions and CPUs named apart are one kind each)."""
        if self.reason.startswith("made by "):
            return "made by other code"
        if self.reason.startswith("recorded on "):
            return "recorded on another CPU instruction set"
        return self.reason

    def line(self) -> str:
        """``unverified  STUDY: LABEL (seed 0, run icr-ovq-frozen-persist-s0)  no code version recorded; ...``"""
        return (f"{self.status:>10}  {self.study}: {self.label} (seed {self.seed}, run {self.run})"
                + (f"  {self.detail}" if self.detail else ""))

    def entry(self, date: str) -> dict:
        """Its entry in ``results/verification.json``."""
        wall = self.rerun_wall_seconds
        return {"study": self.study, "label": self.label, "seed": self.seed, "status": self.status,
                "reason": self.reason, "detail": self.detail, "run": self.run, "config_id": self.config_id,
                "code_version": self.code_version, "rerun_code_version": self.rerun_code_version,
                "rerun_wall_seconds": None if wall is None or math.isnan(wall) else round(wall, 2),
                "rerun": self.rerun, "date": date, "r_digest": self.r_digest}


# ------------------------------------------------------------------------------ configurations


def _lowest_seed(runs: Sequence) -> object:
    return min(runs, key=lambda r: (r.seed is None, r.seed or 0))


def _one_per_configuration(raw: List[dict]) -> List[dict]:
    """The record of the lowest seed of each configuration (configurations as the report groups them)."""
    records = [compare.record_from_json(d) for d in raw]
    source = {id(r): d for r, d in zip(records, raw)}
    return [source[id(_lowest_seed(runs))] for runs in compare.group_records(records).values()]


@dataclass
class _Target:
    study: str
    spec: Optional[StudySpec]
    record: dict


def _claim_targets(specs: Sequence[StudySpec], root: str) -> List[_Target]:
    """One record (the lowest seed) per configuration of every claim with results, as the claims table
    groups its records (its files, its ``select``)."""
    from experiments import claims as claims_module

    _, claims = claims_module.load_claims(claims_module.CLAIMS_FILE)
    out = []
    for claim in claims:
        if not claim.results:
            continue
        found = claims_module.claim_records(claim, root)
        records = [r for _, _, r in found]
        files = {id(r): (rel, d) for rel, d, r in found}
        for runs in compare.group_records(records).values():
            rel, d = files[id(_lowest_seed(runs))]
            spec = _spec_of_file(rel, specs)
            out.append(_Target(rel if spec is None else spec.title, spec, d))
    return out


def targets(specs: Sequence[StudySpec], root: Optional[str] = None) -> List[_Target]:
    """Every configuration behind the verdict table and the claims table, once each, cheapest first."""
    from experiments import report

    root = root or report.PROJECT_DIR
    found = [_Target(spec.title, spec, d) for spec in specs if spec.verdict
             for d in _one_per_configuration(report._raw(spec, root))]
    found += _claim_targets(specs, root)
    seen, out = set(), []
    for t in found:
        key = (t.study, configuration_label(t.record))
        if key not in seen:
            seen.add(key)
            out.append(t)

    def cost(t: _Target):
        wall = t.record.get("wall_seconds")
        known = isinstance(wall, (int, float)) and math.isfinite(wall)
        return (not known, wall if known else 0.0)
    return sorted(out, key=cost)


# ------------------------------------------------------------------------------ rebuilding and rerunning


def _expanded(spec: StudySpec) -> list:
    """Every config the spec's sweep commands make, at full size."""
    from experiments.study import expand_sweep, sweep_commands

    return [cfg for _, argv in sweep_commands(spec) for cfg in expand_sweep(argv)]


#: parameters a run fills in itself when it resolves its config (the vocabulary comes from the stream,
#: which the stream's own options already match)
RESOLVED_KEYS = ("model.vocab_size",)


def _comparable(params: Dict[str, str]) -> Dict[str, str]:
    return {k: str(v) for k, v in params.items() if not k.startswith(compare.IGNORED_PREFIXES)
            and k not in compare.REPORTING_KEYS and k not in RESOLVED_KEYS}


def rebuild(record: dict, configs: Sequence) -> Optional[object]:
    """The config among ``configs`` whose flattened parameters equal the record's (None if no single one)."""
    from experiments.tracking import flatten_config

    wanted = _comparable(record["params"])
    matches = []
    for cfg in configs:
        have = _comparable(flatten_config(cfg))
        if all(have.get(k) == v for k, v in wanted.items()):
            matches.append(cfg)
    return matches[0] if len(matches) == 1 else None


def _rerun(cfg, record: dict):
    """(R or None, code version, wall seconds, error or "") of ``cfg`` run again as ``record`` ran."""
    import copy

    import torch

    from experiments.code_version import code_version
    from experiments.runner import run

    cfg = copy.deepcopy(cfg)
    cfg.tracking.enabled, cfg.checkpoint.enabled, cfg.progress = False, False, False
    threads = torch.get_num_threads()
    torch.set_num_threads(int((record.get("provenance") or {}).get("threads") or 1))
    started = time.perf_counter()
    try:
        result = run(cfg, rerun=True, announce=lambda message: None)
        return result.R, result.code_version or code_version(), time.perf_counter() - started, ""
    except Exception as e:                      # a rerun that fails is a finding, not the end of the check
        return None, code_version(), time.perf_counter() - started, f"{type(e).__name__}: {e}"
    finally:
        torch.set_num_threads(threads)


def _judge(v: Verification, record: dict, R, error: str) -> Verification:
    """The status of a rerun configuration (``R``: the rerun's, None where it failed with ``error``)."""
    from experiments.tracking.runs import cpu_capability

    if not error and R == record.get("R"):
        v.status = VERIFIED
        return v
    what = f"the rerun failed ({error})" if error else \
        f"largest difference {_largest_difference(R, record.get('R')):.3g}"
    theirs, ours = (record.get("provenance") or {}).get("cpu_capability"), cpu_capability()
    if not v.code_version:
        v.status, v.reason, v.detail = UNVERIFIED, NO_CODE_VERSION, f"{NO_CODE_VERSION}; today's code: {what}"
    elif v.code_version != v.rerun_code_version:
        gives = f"fails on it ({error})" if error else f"gives another R ({what})"
        v.status, v.reason = UNVERIFIED, f"made by {v.code_version}"
        v.detail = f"made by {v.code_version}; today's code {gives}; rerun from its commit's worktree to verify it"
    elif theirs and theirs != ours:
        v.status, v.reason = UNVERIFIED, f"recorded on {theirs}, rerun on {ours}"
        v.detail = f"{v.reason} ({what})"
    else:
        v.status, v.detail = DIFFERS, what
    return v


def verify(specs: Sequence[StudySpec], root: Optional[str] = None, only: str = "",
           limit: Optional[int] = None, announce: Callable[[str], None] = print) -> List[Verification]:
    """Runs one seed of every configuration behind the verdict and claims tables again (``only``: those whose
    run or configuration label contains it; ``limit``: at most N reruns, cheapest first) and compares R
    exactly. Returns one :class:`Verification` per configuration, in the order checked; never stops early."""
    expanded: Dict[str, object] = {}
    out: List[Verification] = []
    reruns = 0
    # a configuration this very code already reran bit for bit (its entry of the same record) is not rerun
    # again: a second --verify with a limit extends the check to the next cheapest instead of repeating it
    from experiments import report
    from experiments.code_version import code_version

    done = load_verification(root or report.PROJECT_DIR)
    today = code_version()
    for t in targets(specs, root):
        d = t.record
        label = configuration_label(d)
        if only and only not in d["label"] and only not in label:
            continue
        v = Verification(t.study, label, d.get("seed"), UNVERIFIED, run=d["label"], config_id=d.get("config_id"),
                         code_version=d.get("code_version"), r_digest=_digest(d.get("R")))
        out.append(v)
        cfg = None
        if t.spec is None:
            v.reason = v.detail = NO_SPEC
        else:
            if t.spec.title not in expanded:
                try:
                    expanded[t.spec.title] = _expanded(t.spec)
                except Exception as e:      # commands that no longer expand express no configuration
                    expanded[t.spec.title] = f"its commands do not expand: {type(e).__name__}: {e}"
            configs = expanded[t.spec.title]
            cfg = None if isinstance(configs, str) else rebuild(d, configs)
            if cfg is None:
                why = configs if isinstance(configs, str) else "no single config of them has this record's parameters"
                v.reason, v.detail = NOT_EXPRESSIBLE, f"{NOT_EXPRESSIBLE} ({why})"
            elif _verified_by(lookup(done, t.study, label), d, today):
                earlier = lookup(done, t.study, label)
                v.status, v.rerun, v.rerun_code_version, v.repeated = VERIFIED, True, today, True
                v.rerun_wall_seconds = earlier.get("rerun_wall_seconds")
                v.detail = f"rerun bit for bit by this code on {earlier.get('date')} (not repeated)"
            elif limit is not None and reruns >= limit:
                v.reason = v.detail = BEYOND_LIMIT
            else:
                reruns += 1
                R, v.rerun_code_version, v.rerun_wall_seconds, error = _rerun(cfg, d)
                v.rerun = True
                _judge(v, d, R, error)
        announce(v.line())
    return out


def _digest(R) -> Optional[str]:
    """A short digest of a stored result matrix (exact: its JSON, floats as repr writes them)."""
    if R is None:
        return None
    import hashlib

    return hashlib.sha256(json.dumps(R).encode()).hexdigest()[:16]


def _verified_by(entry: Optional[dict], record: dict, version: str) -> bool:
    """Whether ``entry`` says ``record`` (the same run identity, or code version where it has none, and the
    same stored R) was rerun bit for bit by code ``version``."""
    if not entry or entry.get("status") != VERIFIED or entry.get("rerun_code_version") != version:
        return False
    if entry.get("r_digest") is None or entry["r_digest"] != _digest(record.get("R")):
        return False                 # checked against another stored R (or an older entry that kept none)
    if entry.get("config_id") and record.get("config_id"):
        return entry["config_id"] == record["config_id"]
    return entry.get("code_version") == record.get("code_version")


def summary(checks: Sequence[Verification]) -> str:
    """``3 verified, 2 unverified (no code version recorded: 1, made by other code: 1), 0 differ``."""
    unverified = Counter(c.kind for c in checks if c.status == UNVERIFIED)
    why = ", ".join(f"{k}: {n}" for k, n in sorted(unverified.items()))
    return (f"{sum(c.status == VERIFIED for c in checks)} verified, {sum(unverified.values())} unverified"
            + (f" ({why})" if why else "") + f", {sum(c.status == DIFFERS for c in checks)} differ")


def _largest_difference(a, b) -> float:
    try:
        return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb) if x is not None and y is not None)
    except (ValueError, TypeError):
        return float("nan")


# ------------------------------------------------------------------------------ the file the tables read
# (read by experiments/rerun_check.py)


def write_verification(checks: Sequence[Verification], root: Optional[str] = None,
                       date: Optional[str] = None) -> str:
    """Merges ``checks`` into ``results/verification.json`` under ``root``; returns its path. An entry
    ``not rerun (beyond --verify-limit)`` does not replace one that was rerun (a later check with a
    smaller limit keeps what an earlier one found), nor does a check read from it (verified by this very
    code, not repeated); every other entry replaces the configuration's."""
    from experiments import report

    root = root or report.PROJECT_DIR
    data = load_verification(root)
    date = date or datetime.date.today().isoformat()
    for c in checks:
        old = data.get(c.study, {}).get(c.label)
        if c.repeated or (c.reason == BEYOND_LIMIT and old is not None and old.get("rerun")):
            continue                 # what an earlier check found stands as it was written
        data.setdefault(c.study, {})[c.label] = c.entry(date)
    path = verification_path(root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(json.dumps(data, sort_keys=True, indent=2) + "\n")
    return path


