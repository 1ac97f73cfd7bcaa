"""``ovq-cl report --verify``: before the verdict is written, one seed of every verdict configuration is
run again by the current code and its result matrix must equal the stored one bit for bit.

A stored record is rebuilt into a config from its study's own commands: every sweep command of the
spec is expanded at full size (every grid value), and the config whose parameters equal the record's
(seeds included; tracking, checkpoints and progress aside) is the one that made it. It runs fresh
(``rerun``), with tracking and checkpoints off, and with the torch threads the record says it ran with
(``provenance.threads``; one when not recorded): the thread count changes the order of float sums and
so the last bits of every number; so does the CPU's vector instruction set (``provenance.cpu_capability``,
recorded since 2026-12-06), which a rerun cannot choose: a record that differs and was made on another
instruction set says so in its detail. A record that cannot be rebuilt (a parameter no current config has)
is reported as such and fails the check too: nothing unverifiable is called verified.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from experiments import compare
from experiments.study_specs import StudySpec


@dataclass
class Verification:
    """One configuration's check: ``status`` is ``same``, ``DIFFERS`` or ``cannot rebuild``."""

    study: str
    label: str
    seed: Optional[int]
    status: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "same"

    def line(self) -> str:
        return f"{self.status:>14}  {self.study}: {self.label} (seed {self.seed}){'  ' + self.detail if self.detail else ''}"


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


def _one_per_configuration(raw: List[dict]) -> List[dict]:
    """The record of the lowest seed of each configuration (configurations as the report groups them)."""
    records = [compare.record_from_json(d) for d in raw]
    source = {id(r): d for r, d in zip(records, raw)}
    return [source[id(min(runs, key=lambda r: (r.seed is None, r.seed or 0)))]
            for runs in compare.group_records(records).values()]


def verify(specs: Sequence[StudySpec], root: Optional[str] = None, only: str = "",
           limit: Optional[int] = None, announce: Callable[[str], None] = print) -> List[Verification]:
    """Runs one seed of every configuration of the verdict studies again (``only``: labels containing it;
    ``limit``: the first N) and compares R exactly. Returns one :class:`Verification` per configuration."""
    import copy

    import torch

    from experiments.report import _raw
    from experiments.runner import run

    out: List[Verification] = []
    for spec in specs:
        if not spec.verdict:
            continue
        raw = [d for d in _one_per_configuration(_raw(spec, root)) if only in d["label"]]
        if not raw:
            continue
        configs = _expanded(spec)
        for d in raw:
            if limit is not None and len(out) >= limit:
                return out
            cfg = rebuild(d, configs)
            if cfg is None:
                out.append(Verification(spec.title, d["label"], d.get("seed"), "cannot rebuild",
                                        "no single config of the study's commands has this record's parameters"))
                announce(out[-1].line())
                continue
            cfg = copy.deepcopy(cfg)
            cfg.tracking.enabled, cfg.checkpoint.enabled, cfg.progress = False, False, False
            threads = torch.get_num_threads()
            torch.set_num_threads(int((d.get("provenance") or {}).get("threads") or 1))
            try:
                result = run(cfg, rerun=True, announce=lambda message: None)
            finally:
                torch.set_num_threads(threads)
            same = result.R == d["R"]
            detail = "" if same else f"largest difference {_largest_difference(result.R, d['R']):.3g}"
            if not same:
                detail += _capability_note(d)
            out.append(Verification(spec.title, d["label"], d.get("seed"), "same" if same else "DIFFERS", detail))
            announce(out[-1].line())
    return out


def _capability_note(record: dict) -> str:
    """``"; recorded on AVX2, rerun on AVX512"`` when the record names another CPU instruction set than
    this machine's (float sums of another vector width: not a code difference), else ``""``."""
    from experiments.tracking.runs import cpu_capability

    theirs, ours = (record.get("provenance") or {}).get("cpu_capability"), cpu_capability()
    return f"; recorded on {theirs}, rerun on {ours}" if theirs and theirs != ours else ""


def _largest_difference(a, b) -> float:
    try:
        return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb) if x is not None and y is not None)
    except ValueError:
        return float("nan")
