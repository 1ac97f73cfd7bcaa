"""The paper's claims, tested here: one row per claim of the OVQ paper, our test, our numbers and a verdict
by a rule fixed in ``experiments/claims.yaml`` before the numbers are read.

Each claim names the runs that test it (``results``, optionally ``select``-ed by params), the mixer it
is about (``ours``), the mixers it is compared with (``against``), the endpoint and the kind of claim:

- ``more``: ours scores better than each of ``against`` on the endpoint (paired over the seeds of model
  and data, Holm over the claim's family): "yes" where the adjusted p < 0.05 in the claimed direction,
  "opposite" where it is < 0.05 the other way, "no difference" otherwise, and "no t-test" where every
  pair differs by the same nonzero amount (zero variance: no t-test is made). Where neither side passed
  the learned gates on most of the paired seeds, the answer is "neither learned": the difference is
  shown, but two memories that both failed their gates differ in what neither learned, which is no
  evidence for or against the claim;
- ``as_much``: ours matches each of ``against``: "yes" where the 95% interval of the paired difference
  lies inside +-``margin`` (in the endpoint's units), else "no"; "no t-test" where every pair differs by
  the same nonzero amount (a zero-width interval says nothing about the spread). Matching a reference
  that cannot do the task says nothing: "reference did not learn" where the reference failed the
  learned gates on most seeds, and, at a capacity point (``capacity@N``), "reference does not recall
  here" where its mean skill there is below the learned gate's bar (``gate.min_skill``, 0.5): two
  memories at the floor always match;
- ``fails_to_learn``: every run of each of ``against`` learned nothing (held-out skill, and the stream's
  where measured, below the stream gate's bar for having learned anything, ``gate.min_stream_skill``
  = 0.1) while ours passed the learned gates on most seeds ("yes"), else "no". Failing the learned gate
  (skill 0.5) is not "failing to learn even one function": a run at skill 0.44 learned a good deal;
- ``untestable``: a sentence saying why this project cannot test it (yet).

A claim is **reproduced** when every comparison says "yes", **partly** (k of n) when some do, **not
reproduced** when none does, **undecided** while a comparison has "no t-test", **not testable here**
when no comparison could be read (neither side learned, or the reference cannot do the task); the
comparisons not read are said beside a verdict.

**Code versions**: runs of different code versions are never paired. Where a comparison's runs are of
several versions, it pairs within the version that gives the most pairs (of two alike, the one with the
latest run) and says how many runs of other versions it left out. A comparison with no seed shared
within any one version is "refused", and the claim's verdict is then "incomplete" (never "not
reproduced": a comparison that was not made is no evidence). A replicate run twice by one code counts
once (the latest).

**Holm families**: a claim's comparisons are adjusted together; claims that share a ``family`` name (a
study's declared family split over rows, e.g. one per domain) are adjusted as one family. Every
comparison of a family counts in it, one without a t-test (refused, not measured, too few pairs, zero
variance) as p = 1, so the data cannot shrink a declared family and turn another comparison's "no
difference" into "yes". A comparison reads one scoring for all its pairs: against the facts in force
(``summary_current``) only where every run of the pairs has it.

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
import statistics
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

from omegaconf import OmegaConf

from experiments import compare
from experiments.config import GateSection
from experiments.intervals import PairedComparison, holm, paired_comparison
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
    family: str = ""                            # claims sharing a family name are Holm-adjusted together


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
            for order, d in enumerate(json.load(fh)):
                r = compare.record_from_json(d)
                if not r.finished_at:           # a record's place in its list says which is later
                    r.finished_at = float(order)
                if all(str(r.params.get(k)) in [str(v) for v in vs] for k, vs in claim.select.items()):
                    out.append(r)
    return out


def _version(r: compare.RunRecord) -> str:
    return r.code_version or "code version not recorded"


def _by_replicate(runs: List[compare.RunRecord]) -> Dict[tuple, compare.RunRecord]:
    """One run per replicate: a replicate run twice by one code (``--rerun``, two sweeps listing it) is
    the latest run, as :func:`compare.deduplicated` keeps it."""
    out: Dict[tuple, compare.RunRecord] = {}
    for r in runs:
        if r.replicate not in out or r.finished_at >= out[r.replicate].finished_at:
            out[r.replicate] = r
    return out


def _value(r: compare.RunRecord, endpoint: str, current: bool = True) -> float:
    """One run's endpoint (module docstring); NaN where the run did not measure it. ``current``: read a
    summary endpoint against the facts in force (``summary_current``) where the run has it."""
    if endpoint.startswith("capacity@") or endpoint == "capacity_mean":
        points = compare.capacity_points(r)
        if endpoint == "capacity_mean":
            return sum(p["score"] for p in points) / len(points) if points else math.nan
        facts = int(endpoint.split("@", 1)[1])
        return next((float(p["score"]) for p in points if p["facts"] == facts), math.nan)
    if endpoint.startswith("position@"):
        bucket = compare.last_position_bucket(r, endpoint.split("@", 1)[1])
        return float(bucket["bits_per_byte"]) if bucket else math.nan
    v = r.summary_current.get(endpoint) if current and endpoint in r.summary_current else r.summary.get(endpoint)
    return math.nan if v is None else float(v)


def _skill_at(r: compare.RunRecord, endpoint: str) -> float:
    """capacity@N: the run's skill (against the probe's chance) at N facts; NaN otherwise."""
    if not endpoint.startswith("capacity@"):
        return math.nan
    facts = int(endpoint.split("@", 1)[1])
    return next((float(p["skill"]) for p in compare.capacity_points(r) if p["facts"] == facts and "skill" in p),
                math.nan)


def _where(r: compare.RunRecord, endpoint: str):
    """What a run's endpoint was measured over, which both runs of a pair must share: the ladder of N for
    ``capacity_mean``, the last bucket's (lo, hi) for ``position@DOMAIN``; None for the other endpoints."""
    if endpoint == "capacity_mean":
        return tuple(p["facts"] for p in compare.capacity_points(r))
    if endpoint.startswith("position@"):
        bucket = compare.last_position_bucket(r, endpoint.split("@", 1)[1])
        return (bucket["lo"], bucket["hi"]) if bucket else None
    return None


def _pair_values(mine: compare.RunRecord, other: compare.RunRecord, endpoint: str, current: bool = True):
    """(ours, theirs) of one replicate; NaN for both when they were measured over different things."""
    if _where(mine, endpoint) != _where(other, endpoint):
        return math.nan, math.nan
    return _value(mine, endpoint, current), _value(other, endpoint, current)


def _higher_is_better(endpoint: str, metric: str) -> bool:
    if endpoint.startswith("position@"):
        return False                                   # bits per byte
    return higher_is_better(metric)                    # capacity scores are in the stream's metric


def _learned_nothing(r: compare.RunRecord) -> bool:
    """The held-out skill was measured and is below the stream gate's bar for having learned anything, and
    so is the stream's where it was measured (a run whose skill was not measured did not show that)."""
    bar = GateSection.min_stream_skill
    return r.gate_skill < bar and (math.isnan(r.stream_skill) or r.stream_skill < bar)


def _most(k: int, n: int) -> bool:
    return n > 0 and 2 * k > n


@dataclass
class _Comparison:
    """One of a claim's comparisons before the family's Holm adjustment."""
    name: str
    answer: str = ""                           # set now for the untested ones, after Holm for the others
    cell: str = ""
    stat: Optional[PairedComparison] = None
    count: int = 0                             # pairs (runs, for fails_to_learn), against claim.seeds
    waits: bool = True                         # can more runs add pairs (a short one then holds the verdict)
    learned: tuple = (0, 0)                    # ours, theirs: runs that passed the learned gates, of the pairs
    reference_skill: float = math.nan          # as_much on capacity@N: the reference's mean skill there
    note: str = ""                             # said after the numbers (code versions, learned counts)


def _compare(claim: Claim, ours: List[compare.RunRecord], theirs: List[compare.RunRecord], name: str) -> _Comparison:
    """Pairs ``ours`` with ``theirs`` over the replicates both ran with one code version: where the runs
    are of several, the version with the most pairs (the others are said, never pooled)."""
    if claim.kind == "fails_to_learn":
        nothing = [r for r in theirs if _learned_nothing(r)]
        ours_learned = sum(r.learned is True for r in ours)
        best = max((r.gate_skill for r in theirs if not math.isnan(r.gate_skill)), default=math.nan)
        versions = sorted({_version(r) for r in ours + theirs})
        ok = len(nothing) == len(theirs) and _most(ours_learned, len(ours))
        cell = (f"{name}: {len(nothing)}/{len(theirs)} runs learned nothing (held-out and stream skill < "
                f"{GateSection.min_stream_skill:g}; best held-out skill {best:.2f}; {claim.ours}: {ours_learned}/"
                f"{len(ours)} learned)" + (f"; runs of {len(versions)} code versions" if len(versions) > 1 else ""))
        return _Comparison(name, "yes" if ok else "no", cell, count=min(len(theirs), len(ours)))
    per_version = {}
    for v in sorted({_version(r) for r in ours} & {_version(r) for r in theirs}):
        mine = _by_replicate([r for r in ours if _version(r) == v])
        other = _by_replicate([r for r in theirs if _version(r) == v])
        shared = sorted(set(mine) & set(other), key=str)
        if shared:
            per_version[v] = (mine, other, shared)
    if not per_version:
        versions = {_version(r) for r in ours + theirs}
        if len(versions) > 1 and set(_by_replicate(ours)) & set(_by_replicate(theirs)):
            return _Comparison(name, "refused", f"vs {name}: refused (its seeds and ours were run by {len(versions)} "
                               "code versions, none shared within one)", waits=False)
        return _Comparison(name, "no shared seeds", f"vs {name}: no seed run by both yet")
    # the version with the most pairs; of two with as many, the later one (the newest run it holds)
    v = max(per_version, key=lambda k: (len(per_version[k][2]), max(r.finished_at for r in per_version[k][0].values())))
    mine, other, shared = per_version[v]
    left_out = sum(_version(r) != v for r in ours + theirs)
    # one scoring for the whole comparison: against the facts in force only where every run has it
    current = all(claim.endpoint in mine[s].summary_current and claim.endpoint in other[s].summary_current
                  for s in shared)
    values = [_pair_values(mine[s], other[s], claim.endpoint, current) for s in shared]
    c = paired_comparison([a for a, _ in values], [b for _, b in values])
    used = [s for s, (a, b) in zip(shared, values) if not (math.isnan(a) or math.isnan(b))]
    learned = (sum(mine[s].learned is True for s in used), sum(other[s].learned is True for s in used))
    skills = [_skill_at(other[s], claim.endpoint) for s in used]
    skills = [x for x in skills if not math.isnan(x)]
    note = f"learned {learned[0]}/{len(used)} vs {learned[1]}/{len(used)}"
    if left_out:
        note += f"; code {v} ({left_out} runs of other code versions not paired)"
    if c.n < 2:
        if c.n == 0:
            return _Comparison(name, "not measured", f"vs {name}: not measured (no pair of runs with "
                               f"{claim.endpoint})", count=0, waits=False)
        return _Comparison(name, "too few pairs", f"vs {name}: {c.mean_difference:+.3f} from one pair of runs: too "
                           "few pairs", count=1)
    return _Comparison(name, stat=c, count=c.n, learned=learned, note=note,
                       reference_skill=statistics.fmean(skills) if skills else math.nan)


def _comparisons(claim: Claim, root: str):
    """(comparisons, None) or (None, an early verdict: not testable, not run yet)."""
    if claim.kind == "untestable":
        return None, f"not testable here: {claim.untestable}"
    records = _records(claim, root)
    if not records:
        return None, "not run yet"
    groups = compare.group_records(records)
    try:
        ours = groups[compare.find_group(groups, claim.ours)]
    except ValueError:
        return None, f"not run yet (no runs of {claim.ours})"
    out = []
    for name in claim.against:
        try:
            theirs = groups[compare.find_group(groups, name)]
        except ValueError:
            out.append(_Comparison(name, "no runs", f"vs {name}: no runs"))
            continue
        out.append(_compare(claim, ours, theirs, name))
    return out, None


def _answer(claim: Claim, cmp: _Comparison, p_holm: float, higher: bool) -> None:
    """The answer and cell of a tested comparison (``cmp.stat`` set), by the claim's kind."""
    c, name = cmp.stat, cmp.name
    n = c.n
    if claim.kind == "more":
        if math.isnan(c.p_t):
            # every pair differs by the same nonzero amount: no t-test is made (see paired_comparison),
            # and a difference whose spread is unknown is neither a "yes" nor "no difference"
            cmp.answer = "no t-test"
            cmp.cell = f"vs {name}: every one of {n} pairs differs by {c.mean_difference:+.3f}: no t-test (zero variance)"
            return
        better = c.mean_difference > 0 if higher else c.mean_difference < 0
        cmp.answer = ("yes" if better else "opposite") if p_holm < 0.05 else "no difference"
        if not (_most(cmp.learned[0], n) or _most(cmp.learned[1], n)):
            # two memories that both failed the learned gates on most seeds: their difference is about
            # what neither learned, so it is said but not read as the claim's evidence either way
            cmp.answer = "neither learned"
        cmp.cell = (f"vs {name}: {c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}], Holm p {p_holm:.2g}, "
                    f"{n} pairs ({cmp.note}): {cmp.answer}")
        return
    # as_much
    if c.low == c.high and c.mean_difference != 0:
        # a zero-width interval from pairs that all differ by the same amount is not evidence of a small
        # difference: it is too few seeds to see the spread
        cmp.answer = "no t-test"
        cmp.cell = (f"vs {name}: every one of {n} pairs differs by {c.mean_difference:+.3f}: no interval "
                    f"(zero variance; margin +-{claim.margin:g})")
        return
    inside = -claim.margin <= c.low and c.high <= claim.margin
    cmp.answer = "yes" if inside else "no"
    if not _most(cmp.learned[1], n):
        cmp.answer = "reference did not learn"          # matching a reference that failed its gates says nothing
    elif claim.endpoint.startswith("capacity@") and not cmp.reference_skill >= GateSection.min_skill:
        # matching a reference that does not recall at this point is matching two memories at the floor
        cmp.answer = "reference does not recall here"
    skill = (f"; {name}'s skill there {cmp.reference_skill:.2f}" if not math.isnan(cmp.reference_skill) else "")
    cmp.cell = (f"vs {name}: {c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}] (margin +-{claim.margin:g}), "
                f"{n} pairs ({cmp.note}{skill}): {cmp.answer}")


def _verdict(claim: Claim, comparisons: List[_Comparison]) -> str:
    answers = [c.answer for c in comparisons]
    k, n = sum(a == "yes" for a in answers), len(answers)
    if n and all(a == "no runs" for a in answers):
        return f"not run yet (no runs of {', '.join(claim.against)})"
    # The verdict is declared over claim.seeds pairs; one read from fewer would be a peek. A comparison
    # whose runs never measured the endpoint will not gain pairs by waiting: it does not hold the others.
    waiting = [c.count for c in comparisons if c.waits]
    if claim.seeds and waiting and min(waiting) < claim.seeds:
        return (f"pending ({min(waiting)} of {claim.seeds} {'runs' if claim.kind == 'fails_to_learn' else 'pairs'} "
                "in the comparison with fewest)")
    refused = sum(a == "refused" for a in answers)
    if refused:
        return (f"incomplete: {refused} of {n} comparisons refused (no seed run by both within one code "
                "version); rerun them with one code")
    if n and all(a in ("not measured", "no runs", "too few pairs", "no shared seeds") for a in answers):
        return "too few pairs" if "too few pairs" in answers else f"not measured ({claim.endpoint})"
    untested = sum(a == "no t-test" for a in answers)
    if untested:
        return f"undecided ({untested} of {n} comparisons without a test: every pair differs by the same amount)"
    if all(a == "neither learned" for a in answers):
        return "not testable here: neither side passed the learned gates on most seeds, in every comparison"
    if all(a in ("reference did not learn", "reference does not recall here") for a in answers):
        return ("not testable here: the reference " + ("does not recall at this point (its skill there is below "
                f"the learned gate's {GateSection.min_skill:g})" if "reference does not recall here" in answers
                else "failed the learned gates"))
    verdict = "reproduced" if n and k == n else (f"partly ({k} of {n})" if k else "not reproduced")
    side = [a for a in answers if a in ("neither learned", "reference did not learn", "reference does not recall here")]
    return verdict + (f"; {len(side)} of {n} comparisons not read ({', '.join(sorted(set(side)))})" if side else "")


def evaluate_claims(claims: List[Claim], root: str) -> List[ClaimResult]:
    """Every claim's comparisons, answers and verdict (module docstring). Holm runs over each family:
    the claims that share a ``family`` name (a study's declared family split over several rows), else the
    claim alone; every comparison of the family counts in it, a comparison without a t-test as p = 1, so
    that the data cannot shrink a declared family and turn another comparison's "no difference" into "yes"."""
    staged = [_comparisons(c, root) for c in claims]
    families: Dict[str, List[_Comparison]] = {}
    for i, (claim, (comparisons, _)) in enumerate(zip(claims, staged)):
        if comparisons is not None and claim.kind in ("more", "as_much"):
            families.setdefault(claim.family or f"#{i}", []).extend(comparisons)
    p_holm: Dict[int, float] = {}
    for members in families.values():
        ps = [1.0 if m.stat is None or math.isnan(m.stat.p_t) else m.stat.p_t for m in members]
        for m, p in zip(members, holm(ps)):
            p_holm[id(m)] = p
    results = []
    for claim, (comparisons, early) in zip(claims, staged):
        if comparisons is None:
            results.append(ClaimResult(claim, [], [], early))
            continue
        if claim.kind in ("more", "as_much"):
            records = _records(claim, root)
            groups = compare.group_records(records)
            metric = groups[compare.find_group(groups, claim.ours)][0].metric
            for m in comparisons:
                if m.stat is not None:
                    _answer(claim, m, p_holm[id(m)], _higher_is_better(claim.endpoint, metric))
        results.append(ClaimResult(claim, [m.cell for m in comparisons], [m.answer for m in comparisons],
                                   _verdict(claim, comparisons)))
    return results


def evaluate(claim: Claim, root: str) -> ClaimResult:
    """One claim on its own (its own Holm family): :func:`evaluate_claims` of it alone."""
    return evaluate_claims([replace(claim, family="")], root)[0]


def _table_cell(text: str) -> str:
    """``text`` safe inside one Markdown table cell: a configuration pattern such as ``ovq | after_meta...``
    carries the pattern separator, which would otherwise split the cell in two."""
    return text.replace("|", "\\|")


def claims_section(root: str, path: str = CLAIMS_FILE) -> str:
    """The claims table for RESULTS.md (its preamble, one row per claim)."""
    preamble, claims = load_claims(path)
    lines = ["## The paper's claims, tested here", "", preamble.strip(), "",
             "| the paper's claim | our test | our result (ours - theirs, 95% CI) | verdict |", "|---|---|---|---|"]
    for claim, result in zip(claims, evaluate_claims(claims, root)):
        body = "; ".join(result.cells) or "-"
        verdict = f"**{result.verdict}**" + (f". {claim.note}" if claim.note else "")
        lines.append("| " + " | ".join(_table_cell(text) for text in (claim.claim, claim.test, body, verdict)) + " |")
    return "\n".join(lines) + "\n"
