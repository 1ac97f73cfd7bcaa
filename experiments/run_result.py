"""A run's result: :class:`RunResult`, what :func:`experiments.runner.run` returns for a finished run and
the record it writes (``results.json`` in MLflow, the ``result`` of its last checkpoint)."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from experiments.config import RunConfig
from experiments.records import SCHEMA_VERSION, migrate
from strategies.evaluation.metrics import higher_is_better


@dataclass
class RunResult:
    """Everything a run measured (also written to MLflow as ``results.json``; see :meth:`record`).

    R[j][i]: score on experience i after training experience j; R_se / R_n: its episode-clustered
    standard error and number of answers. ``current``: for streams whose facts change, the matrices
    scored against the labels in force after j (``R_current``, ``R_current_se``, ``updated``, ``stale``,
    ``changed``), else None. ``gate`` / ``stream_gate``: :class:`strategies.evaluation.gate.GateResult` as dicts.
    """

    config: RunConfig
    metric: str
    R: List[List[Optional[float]]]
    summary: Dict[str, float]
    tokens_after: List[int]
    state_bytes: List[int]
    run_id: Optional[str] = None
    checkpoint: Optional[str] = None
    meta_history: List[Dict[str, float]] = field(default_factory=list)
    # where meta-training's weights came from: "trained" by this run, "resumed" from its own checkpoint,
    # "shared" (loaded from another run's identical meta-training, experiments.meta_cache); None: not recorded
    meta_source: Optional[str] = None
    R_se: List[List[Optional[float]]] = field(default_factory=list)
    R_n: List[List[Optional[float]]] = field(default_factory=list)
    current: Optional[Dict[str, List[List[Optional[float]]]]] = None
    summary_current: Dict[str, float] = field(default_factory=dict)
    gate: Dict[str, Any] = field(default_factory=dict)
    stream_gate: Dict[str, Any] = field(default_factory=dict)
    probes: Dict[str, Dict[str, Any]] = field(default_factory=dict)   # each measured probe's record (experiments.probes)
    parameters: int = 0
    state_bytes_per_lane: List[float] = field(default_factory=list)
    wall_seconds: float = math.nan         # every attempt's, up to the checkpoint the next resumed from
    attempts: Optional[int] = 1            # processes that ran it, a killed one counted where the next
                                           # resumed from its checkpoint (None: resumed from a checkpoint
                                           # that kept no time, so wall_seconds is the last attempts' only)
    artifact_uri: Optional[str] = None
    code_version: Optional[str] = None     # experiments.code_version of the code that ran it (None: not recorded)
    # where and how it ran: git commit and whether the tree was dirty, torch/python versions, host, the
    # torch threads (the order of float sums, hence the last bits of every number), world size, device
    provenance: Dict[str, Any] = field(default_factory=dict)
    # memory about the data outside the per-lane state, shared by all lanes (VQ's codebook), per layer;
    # and the numbers in the buffers the layers learn from data (not torch parameters, counted beside)
    shared_bytes_per_layer: List[int] = field(default_factory=list)
    learned_buffers: int = 0

    @classmethod
    def from_record(cls, cfg: RunConfig, d: Dict[str, Any], checkpoint: Optional[str] = None) -> "RunResult":
        """The result of a finished run, from its record (what :meth:`record` wrote, any schema version)."""
        d = migrate(d)
        return cls(cfg, d["metric"], d["R"], d["summary"], d["tokens_after"], d.get("state_bytes", []),
                   d.get("run_id"), checkpoint, d.get("meta_history", []), R_se=d["R_se"], R_n=d["R_n"],
                   current=d.get("current"), summary_current=d.get("summary_current", {}), gate=d.get("gate", {}),
                   stream_gate=d.get("stream_gate", {}), probes=dict(d.get("probes") or {}), parameters=d.get("parameters", 0),
                   state_bytes_per_lane=d.get("state_bytes_per_layer_lane", []),
                   wall_seconds=d.get("wall_seconds", math.nan), attempts=d.get("attempts", 1),
                   meta_source=d.get("meta_source"), artifact_uri=d.get("artifact_uri"),
                   code_version=d.get("code_version"), provenance=d.get("provenance", {}),
                   shared_bytes_per_layer=d.get("shared_bytes_per_layer", []), learned_buffers=d.get("learned_buffers", 0))

    @property
    def learned(self) -> Optional[bool]:
        """True when every gate that applies passed (held-out skill, delay when required, stream), False
        when one failed, None when none was measured."""
        return combined_gate(self.gate.get("learned"), delay_flag(self.probes.get("delay") or {}),
                             self.stream_gate.get("learned"))

    def record(self) -> Dict[str, Any]:
        """A JSON-able record of the run (:mod:`experiments.records`, schema ``SCHEMA_VERSION``): config
        (flattened), seeds, every matrix and summary, the probes' records."""
        from experiments.tracking import flatten_config

        return {
            "schema_version": SCHEMA_VERSION, "label": self.config.label(), "config_id": self.config.identity(), "params": flatten_config(self.config),
            "seed": self.config.seed, "data_seed": self.config.data_seed, "metric": self.metric,
            "higher_is_better": higher_is_better(self.metric), "R": self.R, "R_se": self.R_se, "R_n": self.R_n,
            "current": self.current, "summary": self.summary, "summary_current": self.summary_current,
            "gate": self.gate, "stream_gate": self.stream_gate,
            "probes": {name: p for name, p in self.probes.items() if p},
            "learned": self.learned,
            "tokens_after": self.tokens_after, "state_bytes_per_layer_lane": self.state_bytes_per_lane,
            "state_bytes": self.state_bytes,
            "parameters": self.parameters, "meta_history": self.meta_history, "meta_source": self.meta_source,
            "run_id": self.run_id,
            "wall_seconds": self.wall_seconds, "attempts": self.attempts, "artifact_uri": self.artifact_uri,
            "code_version": self.code_version,
            "provenance": self.provenance, "shared_bytes_per_layer": self.shared_bytes_per_layer,
            "learned_buffers": self.learned_buffers,
        }


@dataclass
class RecordedResult(RunResult):
    """A finished run read back from its record where it ran (a sweep's JSON): :meth:`record` gives that
    record as it was, so rewriting the JSON never restates it in this machine's paths or tracking store."""

    stored: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_stored(cls, cfg: RunConfig, d: Dict[str, Any]) -> "RecordedResult":
        d = migrate(d)
        base = RunResult.from_record(cfg, d)
        return cls(**{f: getattr(base, f) for f in base.__dataclass_fields__}, stored=copy.deepcopy(d))

    def record(self) -> Dict[str, Any]:
        return copy.deepcopy(self.stored)


def combined_gate(*flags: Optional[bool]) -> Optional[bool]:
    """False if any gate failed, True if all measured gates passed, None if none was measured."""
    measured = [f for f in flags if f is not None]
    if not measured:
        return None
    return all(measured)



def delay_flag(delay: Dict[str, Any]) -> Optional[bool]:
    """The delay gate's verdict where the run requires it (``gate.delay``), else None (not a gate)."""
    if not delay or not delay.get("required"):
        return None
    return delay.get("gate", {}).get("learned")
