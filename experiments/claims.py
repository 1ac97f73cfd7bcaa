"""The paper's claims, tested here: one row per claim of the OVQ paper, our test, our numbers and a verdict
by a rule fixed in ``experiments/claims.yaml`` before the numbers are read.

Each claim names the runs that test it (``results``, optionally ``select``-ed by params), the mixer it
is about (``ours``), the mixers it is compared with (``against``), the endpoint and the kind of claim:

- ``more``: ours scores better than each of ``against`` on the endpoint (paired over the seeds of model
  and data, Holm over the claim's comparisons): "yes" where the adjusted p < 0.05 in the claimed
  direction, "opposite" where it is < 0.05 the other way, "no difference" otherwise, and "no t-test" where
  every pair differs by the same nonzero amount (zero variance: no t-test is made; it still counts in the
  claim's Holm family, as p = 1, since the family is declared);
- ``as_much``: ours matches each of ``against``: "yes" where the 95% interval of the paired difference
  lies inside +-``margin`` (in the endpoint's units), else "no"; "no t-test" where every pair differs by
  the same nonzero amount (a zero-width interval says nothing about the spread);
- ``fails_to_learn``: every run of each of ``against`` fails the learned gates while some run of ours
  passes them ("yes"), else "no";
- ``untestable``: a sentence saying why this project cannot test it (yet).

A claim is **reproduced** when every comparison says "yes", **partly** (k of n) when some do, **not
reproduced** when none does, and **undecided** while a comparison has "no t-test". Runs of different code versions are never paired here.

The endpoint is one of:

- a summary name (``final_average``, ...): read against the facts in force where the runs have that
  scoring (``summary_current``), else from R;
- ``capacity@N``: the capacity curve's score with N facts bound once (recall of N facts from a fresh
  state; the context grows with N), in the stream's metric and its direction;
- ``capacity_mean``: the mean score over the capacity curve's points; a pair counts only where both
  runs measured the same ladder of N;
- ``position@DOMAIN``: bits per byte in the last position bucket of DOMAIN's position curve (the longest
  contexts), lower is better; a pair counts only where both runs' last buckets cover the same positions.

A claim declares its ``seeds`` (the pairs each comparison is to have, the same number its test text
states); until every comparison has them the verdict is **pending** (the numbers so far are shown,
the verdict is not read from them); a refused comparison and one whose runs never measured the
endpoint do not hold it. A run without the measurement gives NaN, which drops its pair; a comparison
left with no pair says "not measured", one with a single pair "too few pairs", and the verdict says so
(or "not run yet" when no compared mixer has runs) when no comparison could be made.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from omegaconf import OmegaConf

from experiments import compare
from experiments.intervals import holm, paired_comparison
from strategies.evaluation.metrics import higher_is_better

CLAIMS_FILE = os.path.join(os.path.dirname(__file__), "claims.yaml")
KINDS = ("more", "as_much", "fails_to_learn", "untestable")
SUMMARY_ENDPOINTS = tuple(dict.fromkeys(compare.COLUMNS + compare.CURRENT_COLUMNS)) + ("capacity_mean",)


@dataclass
class Claim:
    claim: str                                  # what the paper says, in our words
    test: str                                   # our test: stream, scale, seeds, section
    kind: str = "more"
    ours: str = "ovq"                           # a configuration pattern (compare.find_group)
    against: List[str] = field(default_factory=list)
    results: List[str] = field(default_factory=list)
    select: Dict[str, List[str]] = field(default_factory=dict)   # keep runs whose param KEY is one of these
    endpoint: str = "final_average"
    margin: float = math.nan                    # as_much: the largest difference that counts as "as much"
    untestable: str = ""                        # why not (kind untestable)
    seeds: int = 0                              # the declared pairs (runs, for fails_to_learn) per comparison
    note: str = ""                              # a sentence beside the verdict (e.g. the scale difference)


@dataclass
class ClaimResult:
    claim: Claim
    cells: List[str]                            # one per comparison: "vs X: ..." with its answer
    answers: List[str]                          # "yes", "no", "no difference", "opposite", "no t-test", "refused"
    verdict: str


def load_claims(path: str = CLAIMS_FILE) -> tuple:
    """(preamble, [Claim]) from the claims file; one line per mistake (ValueError)."""
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    claims = []
    for i, entry in enumerate(raw.get("claims") or []):
        unknown = set(entry) - set(Claim.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{path}: claim {i + 1}: unknown keys {sorted(unknown)}")
        c = Claim(**entry)
        if c.kind not in KINDS:
            raise ValueError(f"{path}: claim {i + 1}: kind must be one of {KINDS}, got {c.kind!r}")
        if c.kind == "untestable" and not c.untestable:
            raise ValueError(f"{path}: claim {i + 1}: an untestable claim says why (untestable: ...)")
        if c.kind != "untestable" and not (c.results and c.against):
            raise ValueError(f"{path}: claim {i + 1}: needs results and against")
        if not (c.endpoint.startswith(("capacity@", "position@")) or c.endpoint in SUMMARY_ENDPOINTS):
            raise ValueError(f"{path}: claim {i + 1}: endpoint {c.endpoint!r} is not a summary name "
                             f"{SUMMARY_ENDPOINTS}, capacity@N, capacity_mean or position@DOMAIN")
        if c.endpoint.startswith("position@") and not c.endpoint.split("@", 1)[1]:
            raise ValueError(f"{path}: claim {i + 1}: position@DOMAIN needs a domain, got {c.endpoint!r}")
        if c.endpoint.startswith("capacity@") and not c.endpoint.split("@", 1)[1].isdigit():
            raise ValueError(f"{path}: claim {i + 1}: capacity@N needs a whole number of facts, got {c.endpoint!r}")
        declared = re.findall(r"(\d+) seeds", c.test)
        if c.kind != "untestable" and not (isinstance(c.seeds, int) and c.seeds >= 2):
            raise ValueError(f"{path}: claim {i + 1}: seeds (the declared pairs per comparison, >= 2) is missing")
        if declared and {int(d) for d in declared} != {c.seeds}:
            raise ValueError(f"{path}: claim {i + 1}: its test says {', '.join(declared)} seeds, seeds is {c.seeds}")
        if c.kind == "as_much" and not c.margin > 0:
            raise ValueError(f"{path}: claim {i + 1}: kind as_much needs a margin > 0")
        claims.append(c)
    return raw.get("preamble", ""), claims


def _records(claim: Claim, root: str) -> List[compare.RunRecord]:
    out = []
    for rel in claim.results:
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            continue
        with open(path) as fh:
            for d in json.load(fh):
                r = compare.record_from_json(d)
                if all(str(r.params.get(k)) in [str(v) for v in vs] for k, vs in claim.select.items()):
                    out.append(r)
    return out


def _value(r: compare.RunRecord, endpoint: str) -> float:
    """One run's endpoint (module docstring); NaN where the run did not measure it."""
    if endpoint.startswith("capacity@") or endpoint == "capacity_mean":
        points = compare.capacity_points(r)
        if endpoint == "capacity_mean":
            return sum(p["score"] for p in points) / len(points) if points else math.nan
        facts = int(endpoint.split("@", 1)[1])
        return next((float(p["score"]) for p in points if p["facts"] == facts), math.nan)
    if endpoint.startswith("position@"):
        bucket = compare.last_position_bucket(r, endpoint.split("@", 1)[1])
        return float(bucket["bits_per_byte"]) if bucket else math.nan
    v = r.summary_current.get(endpoint) if endpoint in r.summary_current else r.summary.get(endpoint)
    return math.nan if v is None else float(v)


def _where(r: compare.RunRecord, endpoint: str):
    """What a run's endpoint was measured over, which both runs of a pair must share: the ladder of N for
    ``capacity_mean``, the last bucket's (lo, hi) for ``position@DOMAIN``; None for the other endpoints."""
    if endpoint == "capacity_mean":
        return tuple(p["facts"] for p in compare.capacity_points(r))
    if endpoint.startswith("position@"):
        bucket = compare.last_position_bucket(r, endpoint.split("@", 1)[1])
        return (bucket["lo"], bucket["hi"]) if bucket else None
    return None


def _pair_values(mine: compare.RunRecord, other: compare.RunRecord, endpoint: str):
    """(ours, theirs) of one replicate; NaN for both when they were measured over different things."""
    if _where(mine, endpoint) != _where(other, endpoint):
        return math.nan, math.nan
    return _value(mine, endpoint), _value(other, endpoint)


def _higher_is_better(endpoint: str, metric: str) -> bool:
    if endpoint.startswith("position@"):
        return False                                   # bits per byte
    return higher_is_better(metric)                    # capacity scores are in the stream's metric


def evaluate(claim: Claim, root: str) -> ClaimResult:
    """The claim's comparisons, answers and verdict by the rules of the module docstring."""
    if claim.kind == "untestable":
        return ClaimResult(claim, [], [], f"not testable here: {claim.untestable}")
    records = _records(claim, root)
    if not records:
        return ClaimResult(claim, [], [], "not run yet")
    groups = compare.group_records(records)
    try:
        ours = groups[compare.find_group(groups, claim.ours)]
    except ValueError:
        return ClaimResult(claim, [], [], f"not run yet (no runs of {claim.ours})")
    higher = _higher_is_better(claim.endpoint, ours[0].metric)
    cells, answers, comparisons = [], [], []
    counted = []                               # pairs (runs) each comparison has, against claim.seeds
    for name in claim.against:
        try:
            theirs = groups[compare.find_group(groups, name)]
        except ValueError:
            cells.append(f"vs {name}: no runs")
            answers.append("no runs")
            comparisons.append(None)
            counted.append(0)
            continue
        if claim.kind == "fails_to_learn":
            failed = sum(r.learned is False for r in theirs)
            ours_learned = sum(r.learned is True for r in ours)
            ok = failed == len(theirs) and ours_learned > 0
            counted.append(min(len(theirs), len(ours)))
            cells.append(f"{name}: {failed}/{len(theirs)} runs failed the learned gates ({claim.ours}: "
                         f"{ours_learned}/{len(ours)} learned)")
            answers.append("yes" if ok else "no")
            comparisons.append(None)
            continue
        versions = {r.code_version for r in ours} | {r.code_version for r in theirs}
        if len(versions) > 1:
            cells.append(f"vs {name}: refused (runs of {len(versions)} code versions)")
            answers.append("refused")
            comparisons.append(None)
            counted.append(0)
            continue
        mine = {r.replicate: r for r in ours}
        other = {r.replicate: r for r in theirs}
        shared = sorted(set(mine) & set(other), key=str)
        values = [_pair_values(mine[s], other[s], claim.endpoint) for s in shared]
        c = paired_comparison([a for a, _ in values], [b for _, b in values])
        counted.append(c.n)
        if c.n < 2:
            cells.append(f"vs {name}: not measured (no pair of runs with {claim.endpoint})" if c.n == 0 else
                         f"vs {name}: {c.mean_difference:+.3f} from one pair of runs: too few pairs")
            answers.append("not measured" if c.n == 0 else "too few pairs")
            comparisons.append(None)
            continue
        comparisons.append((name, c))
        cells.append("")                       # filled below, with the adjusted p
        answers.append("")
    if claim.kind == "more":
        tested = [(i, c) for i, c in enumerate(comparisons) if c is not None]
        # the claim's family is declared: a comparison without a t-test still counts in it (as p = 1), so
        # that the data cannot shrink the family and turn another comparison's "no difference" into "yes"
        adjusted = holm([1.0 if math.isnan(c.p_t) else c.p_t for _, (_, c) in tested]) if tested else []
        for (i, (name, c)), p in zip(tested, adjusted):
            better = c.mean_difference > 0 if higher else c.mean_difference < 0
            if math.isnan(c.p_t):
                # every pair differs by the same nonzero amount: no t-test is made (see paired_comparison),
                # and a difference whose spread is unknown is neither a "yes" nor "no difference"
                answers[i] = "no t-test"
                cells[i] = (f"vs {name}: every one of {c.n} pairs differs by {c.mean_difference:+.3f}: no t-test "
                            f"(zero variance)")
                continue
            answers[i] = ("yes" if better else "opposite") if p < 0.05 else "no difference"
            cells[i] = (f"vs {name}: {c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}], Holm p {p:.2g}, "
                        f"{c.n} pairs: {answers[i]}")
    elif claim.kind == "as_much":
        for i, item in enumerate(comparisons):
            if item is None:
                continue
            name, c = item
            if c.n >= 2 and c.low == c.high and c.mean_difference != 0:
                # a zero-width interval from pairs that all differ by the same amount is not evidence of
                # a small difference: it is too few seeds to see the spread
                answers[i] = "no t-test"
                cells[i] = (f"vs {name}: every one of {c.n} pairs differs by {c.mean_difference:+.3f}: no interval "
                            f"(zero variance; margin +-{claim.margin:g})")
                continue
            inside = c.n >= 2 and -claim.margin <= c.low and c.high <= claim.margin
            answers[i] = "yes" if inside else "no"
            cells[i] = (f"vs {name}: {c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}] (margin "
                        f"+-{claim.margin:g}), {c.n} pairs: {answers[i]}")
    k, n = sum(a == "yes" for a in answers), len(answers)
    if n and all(a == "no runs" for a in answers):
        return ClaimResult(claim, cells, answers, f"not run yet (no runs of {', '.join(claim.against)})")
    # The verdict is declared over claim.seeds pairs; one read from fewer would be a peek. A refused
    # comparison (mixed code) and one whose runs never measured the endpoint will not gain pairs by waiting:
    # they are said as they are and do not hold the others.
    waiting = [n for n, a in zip(counted, answers) if a not in ("refused", "not measured")]
    if claim.seeds and waiting and min(waiting) < claim.seeds:
        return ClaimResult(claim, cells, answers, f"pending ({min(waiting)} of {claim.seeds} "
                           f"{'runs' if claim.kind == 'fails_to_learn' else 'pairs'} in the comparison with fewest)")
    if n and all(a in ("not measured", "no runs", "too few pairs") for a in answers):
        return ClaimResult(claim, cells, answers, "too few pairs" if "too few pairs" in answers
                           else f"not measured ({claim.endpoint})")
    untested = sum(a == "no t-test" for a in answers)
    if untested:
        return ClaimResult(claim, cells, answers, f"undecided ({untested} of {n} comparisons without a test: every "
                           "pair differs by the same amount)")
    verdict = "reproduced" if n and k == n else (f"partly ({k} of {n})" if k else "not reproduced")
    return ClaimResult(claim, cells, answers, verdict)


def _table_cell(text: str) -> str:
    """``text`` safe inside one Markdown table cell: a configuration pattern such as ``ovq | after_meta...``
    carries the pattern separator, which would otherwise split the cell in two."""
    return text.replace("|", "\\|")


def claims_section(root: str, path: str = CLAIMS_FILE) -> str:
    """The claims table for RESULTS.md (its preamble, one row per claim)."""
    preamble, claims = load_claims(path)
    lines = ["## The paper's claims, tested here", "", preamble.strip(), "",
             "| the paper's claim | our test | our result (ours - theirs, 95% CI) | verdict |", "|---|---|---|---|"]
    for claim in claims:
        result = evaluate(claim, root)
        body = "; ".join(result.cells) or "-"
        verdict = f"**{result.verdict}**" + (f". {claim.note}" if claim.note else "")
        lines.append("| " + " | ".join(_table_cell(text) for text in (claim.claim, claim.test, body, verdict)) + " |")
    return "\n".join(lines) + "\n"
