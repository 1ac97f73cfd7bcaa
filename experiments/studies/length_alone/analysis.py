"""Did two studies' runs that meta-train the same model get the same meta-training?

A study that reuses another study's models (study 25 reads section 22's: the same config file, seeds and
code; only the probes differ) declares it (the section ``meta_agreement: {with_study: NAME}`` in its spec). Where the meta-training
cache of one checkout held the other study's weights, a run loads them and its history is the other's by
construction; where it did not (a run made in another checkout, or on another machine), the run trains
again, and the same code, seed and data should give the same weights bit for bit. Float sums in another
order (another CPU's instruction set, another thread count) change the last bits, and over a thousand
steps of Adam those grow: the table says, per run, whether its logged history is the other study's
exactly, and if not, from which logged step it differs and by how much at the end. A difference there
means the two studies' models are not the same weights, so a pairing across them pairs two trainings.

Runs are matched on what meta-training reads that a record keeps (:func:`meta_identity`: the seed, the
model, the stream and the meta-training section, not what happens after meta-training: the gate, the
strategy, ``after_meta``), so a study's several runs of one seed (e.g. OVQ at two test-time dictionary
sizes) each meet the other study's runs of that seed.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: param prefixes that meta-training reads (the record's flattened config); everything else (gate,
#: strategy, memory, tracking, checkpoint, after_meta.*) happens after it or does not change its numbers
META_PREFIXES = ("seed", "model.", "stream.", "meta_train.", "device", "precision", "plugins")
#: ... of those, keys that change no number of meta-training
META_IGNORED = ("meta_train.checkpoint_every",)


def meta_identity(params: Dict[str, Any]) -> str:
    """What of a record's params meta-training reads, as one comparable string."""
    kept = {k: v for k, v in params.items()
            if k.startswith(META_PREFIXES) and k not in META_IGNORED}
    return json.dumps(kept, sort_keys=True, default=str)


def _history_key(history: Sequence[Dict[str, float]]) -> str:
    return json.dumps(list(history), sort_keys=True)


def first_difference(a: Sequence[Dict[str, float]], b: Sequence[Dict[str, float]]) -> Optional[int]:
    """The first logged step at which two histories differ in any logged value (a step logged by one only
    counts as a difference); None when they are identical."""
    for row_a, row_b in zip(a, b):
        if row_a != row_b:
            return int(row_a.get("step", row_b.get("step", -1)))
    if len(a) != len(b):
        longer = a if len(a) > len(b) else b
        return int(longer[min(len(a), len(b))].get("step", -1))
    return None


@dataclass
class Agreement:
    """One run of this study against the other study's runs of the same meta-training."""

    label: str                    # the run's label and its after-meta settings
    source: str                   # where its meta-training came from (the record's meta_source)
    there: int                    # the other study's runs with the same meta_identity
    there_histories: int          # ... and how many distinct histories they logged
    identical: bool               # its history is one of theirs, bit for bit
    first_step: Optional[int]     # else the first logged step that differs from the closest of theirs
    final_here: float             # the last logged loss, here and in the closest of theirs
    final_there: float
    cpu_here: str
    cpu_there: str


def _after_meta(params: Dict[str, Any]) -> str:
    settings = [f"{k[len('after_meta.'):]}={v}" for k, v in sorted(params.items())
                if k.startswith("after_meta.") and str(v) not in ("{}", "[]", "None")]   # an empty section: none set
    return f" ({', '.join(settings)})" if settings else ""


def _cpu(record: Dict[str, Any]) -> str:
    prov = record.get("provenance") or {}
    cpu = prov.get("cpu")
    if not cpu:
        return "not recorded"
    return cpu + (f" [{prov['cpu_capability']}]" if prov.get("cpu_capability") else "")


def _final_loss(history: Sequence[Dict[str, float]]) -> float:
    return float(history[-1]["loss"]) if history and "loss" in history[-1] else math.nan


def agreements(here: Sequence[Dict[str, Any]], there: Sequence[Dict[str, Any]]) -> List[Agreement]:
    """Each run of ``here`` (records with a meta-training history) against the runs of ``there`` with the
    same :func:`meta_identity`; runs with no counterpart are left out."""
    by_identity: Dict[str, List[Dict[str, Any]]] = {}
    for r in there:
        if r.get("meta_history"):
            by_identity.setdefault(meta_identity(r["params"]), []).append(r)
    rows = []
    for r in sorted(here, key=lambda r: (r["label"], _after_meta(r["params"]))):
        history = r.get("meta_history") or []
        others = by_identity.get(meta_identity(r["params"]), [])
        if not history or not others:
            continue
        distinct: Dict[str, Dict[str, Any]] = {}
        for o in others:
            distinct.setdefault(_history_key(o["meta_history"]), o)
        firsts: List[Tuple[float, Dict[str, Any], Optional[int]]] = []
        for o in distinct.values():
            step = first_difference(history, o["meta_history"])
            firsts.append((math.inf if step is None else step, o, step))
        _, closest, step = max(firsts, key=lambda t: t[0])     # the latest first difference: the closest
        rows.append(Agreement(
            label=r["label"] + _after_meta(r["params"]), source=r.get("meta_source") or "not recorded",
            there=len(others), there_histories=len(distinct), identical=step is None, first_step=step,
            final_here=_final_loss(history), final_there=_final_loss(closest["meta_history"]),
            cpu_here=_cpu(r), cpu_there=_cpu(closest)))
    return rows


def agreement_table(here: Sequence[Dict[str, Any]], there: Sequence[Dict[str, Any]]) -> str:
    """A markdown table of :func:`agreements` ("" when no run has a counterpart)."""
    rows = agreements(here, there)
    if not rows:
        return ""
    lines = ["| run | its meta-training | runs there (distinct histories) | history | final loss here | "
             "final loss there | relative difference | CPU here | CPU there |", "|---|---|---|---|---|---|---|---|---|"]
    for a in rows:
        rel = (a.final_here - a.final_there) / abs(a.final_there) if a.final_there else math.nan
        history = "identical" if a.identical else f"differs from step {a.first_step}"
        lines.append(f"| {a.label} | {a.source} | {a.there} ({a.there_histories}) | {history} | {a.final_here:.6f} | "
                     f"{a.final_there:.6f} | {rel:+.1%} | {a.cpu_here} | {a.cpu_there} |")
    n_same = sum(a.identical for a in rows)
    lines += ["", f"{n_same} of {len(rows)} runs have the other study's meta-training history bit for bit."]
    return "\n".join(lines)


def render(ctx, with_study: str) -> List[str]:
    """Each run's meta-training against that of the study ``with_study`` (a folder's name) whose models
    this study meta-trains again or loads (:func:`agreement_table`)."""
    from experiments.report import study_number
    from experiments.sections import _raw
    from experiments.study_specs import load_study

    other = load_study(with_study)
    table = agreement_table(ctx.raw, _raw(other, ctx.root))
    if not table:
        return []
    return [f"Meta-training against {study_number(other.title)}'s (each run against that study's runs "
            "of the same seed, model, stream and meta-training settings: its logged history, bit for bit, "
            "and the last logged loss; a run whose meta-training was `shared` loaded another run's "
            "weights and history from the checkout's cache, so it is identical by construction; one "
            "`trained` trained again):", "", table, ""]


def _check(spec, with_study: str) -> None:
    from experiments.study_specs import study_names

    if with_study not in study_names():
        raise ValueError(f"study {spec.name}: section 'meta_agreement': with_study names no study: {with_study!r}")


render.check = _check
SECTIONS = {"meta_agreement": render}
