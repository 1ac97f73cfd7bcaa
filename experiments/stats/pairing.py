"""Pairing over seeds: two configurations are compared on the replicates (seed of model, seed of data)
both ran, within one code version (a seed run again by later code pairs with the version its partner
has), one run per replicate (the latest).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Sequence, Tuple

if TYPE_CHECKING:       # for annotations only: experiments.compare imports this module
    from experiments.compare import RunRecord


def version_of(r: "RunRecord") -> str:
    return r.code_version or "code version not recorded"


def latest_per_replicate(runs: Iterable["RunRecord"]) -> Dict[Tuple, "RunRecord"]:
    """One run per replicate: a replicate run twice by one code (``--rerun``, two sweeps listing it) is
    the latest run (``finished_at``; a record's place in its list where it has no time), as
    :func:`deduplicated` keeps it."""
    out: Dict[Tuple, "RunRecord"] = {}
    for r in runs:
        if r.replicate not in out or r.finished_at >= out[r.replicate].finished_at:
            out[r.replicate] = r
    return out


def pairs_in_one_version(mine: Sequence["RunRecord"], other: Sequence["RunRecord"],
                         measured: Callable[["RunRecord", "RunRecord"], bool] = lambda a, b: True):
    """Pairs ``mine`` with ``other`` on the replicates both ran with one code version: the version whose
    pairs ``measured`` accepts most often (of two alike, the one holding the latest run). Returns
    (version or None, [(mine, other)] of that version's measured pairs, runs of other versions left
    out, whether some replicate is shared only across versions)."""
    best = None
    for v in sorted({version_of(r) for r in mine} & {version_of(r) for r in other}):
        a = latest_per_replicate(r for r in mine if version_of(r) == v)
        b = latest_per_replicate(r for r in other if version_of(r) == v)
        pairs = [(a[s], b[s]) for s in sorted(set(a) & set(b), key=str) if measured(a[s], b[s])]
        rank = (len(pairs), max([x.finished_at for pair in pairs for x in pair], default=-math.inf))
        if pairs and (best is None or rank > best[0]):
            best = (rank, v, pairs)
    across = bool(set(latest_per_replicate(mine)) & set(latest_per_replicate(other)))
    if best is None:
        return None, [], 0, across
    _, v, pairs = best
    left_out = sum(version_of(r) != v for r in list(mine) + list(other))
    return v, pairs, left_out, across


def pairs_against(groups: Dict[str, List["RunRecord"]], base_key: str):
    """(key, [(run, baseline run)]) for every other group, its runs paired with the baseline's on the
    replicates (seed of model, seed of data) both ran."""
    base = {r.replicate: r for r in groups[base_key]}
    for key in sorted(groups):
        if key == base_key:
            continue
        others = {r.replicate: r for r in groups[key]}
        yield key, [(others[s], base[s]) for s in sorted(set(base) & set(others), key=str)]
