"""The paper's claims, tested here: one row per claim of the OVQ paper, our test, our numbers and a verdict
by a rule fixed in ``experiments/claims.yaml`` before the numbers are read.

Each claim names the runs that test it (``results``, optionally ``select``-ed by params), the mixer it
is about (``ours``), the mixers it is compared with (``against``), the endpoint and the kind of claim:

- ``more``: ours scores better than each of ``against`` on the endpoint (paired over the seeds of model
  and data, Holm over the claim's family): "yes" where the adjusted p < 0.05 in the claimed direction,
  "opposite" where it is < 0.05 the other way, "no difference detected" otherwise, with the smallest
  true difference the test finds with 80% power at the observed spread of the differences (at 5% and at
  Holm's first step: what "no difference" could have seen), and "no t-test" where every pair differs by
  the same nonzero amount (zero variance: no t-test is made). A win needs two memories that learned the
  task (each side passing its learned gates on most, more than half, of the paired seeds):
  "against a non-learner" where ours did and theirs did not (a lead over a memory that never learned
  the task is no evidence that ours keeps more), "ours did not learn" where theirs did and ours did not
  (its lead is not credited; a significant loss still reads "opposite"), "neither learned" where
  neither did, and, at a point of a probe's curve, "both at the floor" where both sides' mean skill
  there is below the learned gate's bar. None of these is read as evidence either way. A "yes" whose
  winner stopped learning (``stats.learning.stopped_learning_at``: an experience after the first whose
  learning score fell below the stream gate's bar) names it: "yes; ovq stopped learning on 5/5 seeds
  (from exp 2)" (experiences count from 0), and so does the verdict. With a declared ``margin`` (an
  equivalence margin, fixed before the runs), a comparison with no difference detected is read again by
  two one-sided tests at that margin (at the family's Bonferroni share of 5%): "equivalent" where they
  show it, else it stays "no difference detected" and the claim is **not decided** (its power fell
  short); every cell shows the exact Wilcoxon p beside the t-test's;
- ``as_much``: ours matches each of ``against``, the only kind that can say "matches" or "as much as",
  and only against the ``margin`` declared with the claim: "yes" (equivalent) where the 95% interval of
  the paired difference lies inside +-``margin`` (in the endpoint's units, edges included), else "no",
  with the p of two one-sided tests at that margin beside it (TOST; the interval rule, stricter than
  TOST at 5%, decides); "no t-test" where every
  pair differs by the same nonzero amount, to within rounding (a zero-width interval says nothing about
  the spread; the test is the one ``paired_comparison`` declines to make). Matching a reference that
  cannot do the task says nothing: "reference did not learn" where the reference failed the learned
  gates on most seeds (more than half; half is not most), and, at a point of a probe's curve
  (``capacity@N``, ``interference@KIND@ITEMS``), "reference does not recall here" where its mean skill
  there (over the paired runs; the skill, against the probe's chance, not the score) is below the
  learned gate's bar (``gate.min_skill``, 0.5), or "reference's skill not measured here" where a paired
  run of it has no skill at the point: two memories at the floor always match;
- ``fails_to_learn``: every run of each of ``against`` learned nothing (held-out skill, and the stream's
  where measured, below the stream gate's bar for having learned anything, ``gate.min_stream_skill``
  = 0.1) while ours passed the learned gates on most seeds ("yes"), else "no". Failing the learned gate
  (skill 0.5) is not "failing to learn even one function": a run at skill 0.44 learned a good deal;
- ``untestable``: a sentence saying why this project cannot test it (yet).

A claim is **reproduced** when every comparison says "yes", **partly** (k of n) when some do, **not
reproduced** when none does, **undecided** while a comparison has "no t-test", **not testable here**
when no comparison could be read (a side did not learn, both at the floor, or the reference cannot do
the task); the comparisons not read are said beside a verdict. A claim that ``awaits`` a declared study
is **not decided** until that study's runs are in. Every verdict carries its **evidence class**:
confirmatory (``confirmatory: true``: declared before its runs, 10 or more seeds) or exploratory, with
its seeds (a 5-seed exact Wilcoxon cannot go below p 0.0625: its rows lean on the t-test).

**Code versions**: runs of different code versions are never paired. Where a comparison's runs are of
several versions, it pairs within the version that gives the most pairs (of two alike, the one with the
latest run) and says how many runs of other versions it left out. A comparison with no seed shared
within any one version is "refused", and the claim's verdict is then "incomplete" (never "not
reproduced": a comparison that was not made is no evidence). A replicate run twice by one code counts
once (the latest).

**Holm families**: a claim's comparisons are adjusted together; claims that share a ``family`` name (a
study's declared family split over rows, e.g. one per domain) are adjusted as one family, each distinct
test once (two rows may show the same one), with the family's tests that no row shows
(``family_also``) counted in it. Every
comparison of a family counts in it, one without a t-test that more runs cannot give one (refused, not
measured, zero variance over its declared pairs) as p = 1, so the data cannot shrink a declared family
and turn another comparison's "no difference" into "yes"; one still to come (no runs yet, or short of its
declared pairs) at p = 0 and at p = 1, a word read only where both agree. A comparison reads one scoring for all its pairs: against the facts in force
(``summary_current``) only where every run of the pairs has it.

The endpoint is one of:

- a summary name (``final_average``, ...): read against the facts in force where the runs have that
  scoring (``summary_current``), else from R;
- ``capacity@N``: the capacity curve's score with N facts bound once (recall of N facts from a fresh
  state; the context grows with N), in the stream's metric and its direction;
- ``capacity_mean``: the mean score over the capacity curve's points; a pair counts only where both
  runs measured the same ladder of N;
- ``interference@KIND@ITEMS``: the interference curve of KIND's score with ITEMS items between the facts
  and their queries (e.g. ``interference@neutral@32768``: a few facts, then 65,536 separator tokens:
  length alone, with nothing to hold but the facts), in the stream's metric and its direction;
- ``position@DOMAIN``: bits per byte in the last position bucket of DOMAIN's position curve (the longest
  contexts), lower is better; a pair counts only where both runs' last buckets cover the same positions.

A claim declares its ``seeds`` (the pairs each comparison is to have, the same number its test text
states); until every comparison has them the verdict is **pending** (the numbers so far are shown, with
a raw p, and no word is read from a comparison short of its pairs; in its Holm family such a test, and
one without runs, counts at p = 0 and at p = 1, and the other comparisons read a word only where both
agree); a refused comparison and one whose runs never measured the
endpoint do not hold it. A run without the measurement gives NaN, which drops its pair; a comparison
left with no pair says "not measured", one with a single pair "too few pairs", and the verdict says so
(or "not run yet" when no compared mixer has runs) when no comparison could be made.

**Secondary endpoints** (``secondary``): shown after each comparison's answer, on the same pairs (ours
minus theirs, 95% t interval, no adjustment), and never read: they make the cell show what the primary
endpoint hides, e.g. beside a forgetting claim read on the final average, the forgetting itself and the
learning average (a memory that forgets little because it learned little must be seen as one).
"""
from __future__ import annotations

import math
import os
import re
import statistics
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from experiments import compare
from experiments.config import GateSection
from experiments.probes.capacity import capacity_points
from experiments.probes.interference import curves_of
from experiments.probes.position import last_position_bucket
from experiments.records import load_records
from experiments.stats import learning, pairing, reading
from experiments.stats.intervals import PairedComparison, paired_comparison
from experiments.stats.multiple import holm_bounds
from experiments.stats.power import detectable_difference, equivalence_p, paired_sd
from strategies.evaluation.metrics import higher_is_better

CLAIMS_FILE = os.path.join(os.path.dirname(__file__), "claims.yaml")
KINDS = ("more", "as_much", "fails_to_learn", "untestable")
CONFIRMATORY_SEEDS = 10                         # a confirmatory row's least seeds (declared before its runs)
POWER = 0.8                                     # "no difference detected" says the effect seen with this power
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
    margin: float = math.nan                    # as_much: the largest difference that counts as "as much";
                                                # more: the declared equivalence margin (optional)
    untestable: str = ""                        # why not (kind untestable)
    seeds: int = 0                              # the declared pairs (runs, for fails_to_learn) per comparison
    note: str = ""                              # a sentence beside the verdict (e.g. the scale difference)
    family: str = ""                            # claims sharing a family name are Holm-adjusted together
    family_also: List[str] = field(default_factory=list)   # the declared family's tests no row shows (ours
                                                # against each, on this claim's records and endpoint): in its Holm family
    secondary: List[str] = field(default_factory=list)   # endpoints shown beside each comparison, never read
    confirmatory: bool = False                  # declared before its runs with 10+ seeds (else exploratory)
    headline: str = ""                          # a short name; a row with one is in README's findings table
    awaits: str = ""                            # a declared study (its name) whose runs decide this row: until
                                                # all of them are in, the verdict is "not decided"

    @property
    def evidence(self) -> str:
        """The row's evidence class, said beside every verdict: ``confirmatory, 10 seeds`` or
        ``exploratory, 5 seeds`` (untestable claims have none)."""
        if self.kind == "untestable":
            return ""
        return f"{'confirmatory' if self.confirmatory else 'exploratory'}, {self.seeds} seeds"


@dataclass
class ClaimResult:
    claim: Claim
    cells: List[str]                            # one per comparison: "vs X: ..." with its answer
    answers: List[str]                          # "yes", "no", "no difference detected", "opposite", "no t-test", ...
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
        if not isinstance(c.secondary, list):
            raise ValueError(f"{path}: claim {i + 1}: secondary is a list of endpoints, got {c.secondary!r}")
        for what, endpoint in [("endpoint", c.endpoint)] + [("secondary endpoint", e) for e in c.secondary]:
            _check_endpoint(f"{path}: claim {i + 1}: {what}", endpoint)
        if c.secondary and c.kind not in ("more", "as_much"):
            raise ValueError(f"{path}: claim {i + 1}: secondary endpoints are shown beside paired comparisons "
                             f"(kinds more and as_much), not on a {c.kind} claim")
        if c.endpoint in c.secondary or len(set(c.secondary)) != len(c.secondary):
            raise ValueError(f"{path}: claim {i + 1}: secondary endpoints are distinct and not the endpoint, "
                             f"got {c.secondary}")
        declared = re.findall(r"(\d+) seeds", c.test)
        if c.kind != "untestable" and not (isinstance(c.seeds, int) and c.seeds >= 2):
            raise ValueError(f"{path}: claim {i + 1}: seeds (the declared pairs per comparison, >= 2) is missing")
        if declared and {int(d) for d in declared} != {c.seeds}:
            raise ValueError(f"{path}: claim {i + 1}: its test says {', '.join(declared)} seeds, seeds is {c.seeds}")
        if c.kind == "as_much" and not c.margin > 0:
            raise ValueError(f"{path}: claim {i + 1}: kind as_much needs a margin > 0")
        if c.confirmatory and not (c.seeds >= CONFIRMATORY_SEEDS and c.kind in ("more", "as_much")):
            raise ValueError(f"{path}: claim {i + 1}: a confirmatory row is a paired comparison declared with at "
                             f"least {CONFIRMATORY_SEEDS} seeds, got kind {c.kind} with {c.seeds}")
        if c.awaits:
            try:
                awaited_study(c.awaits)
            except FileNotFoundError as e:
                raise ValueError(f"{path}: claim {i + 1}: awaits {e}") from None
        claims.append(c)
    return raw.get("preamble", ""), claims


def _check_endpoint(what: str, endpoint) -> None:
    """One line (ValueError) unless ``endpoint`` is one the claims table can read (module docstring)."""
    if not isinstance(endpoint, str) or not (endpoint.startswith(("capacity@", "position@", "interference@"))
                                             or endpoint in SUMMARY_ENDPOINTS):
        raise ValueError(f"{what} {endpoint!r} is not a summary name {SUMMARY_ENDPOINTS}, capacity@N, "
                         "capacity_mean, interference@KIND@ITEMS or position@DOMAIN")
    if endpoint.startswith("interference@"):
        parts = endpoint.split("@")
        if len(parts) != 3 or not parts[1] or not parts[2].isdigit():
            raise ValueError(f"{what}: interference@KIND@ITEMS needs a filler kind and a whole number of items, "
                             f"got {endpoint!r}")
        # KIND is not checked against ICR's kinds: a user's stream may register a probe with kinds of its own
        # (a kind no run measured reads "not measured", visibly)
    if endpoint.startswith("position@") and not endpoint.split("@", 1)[1]:
        raise ValueError(f"{what}: position@DOMAIN needs a domain, got {endpoint!r}")
    if endpoint.startswith("capacity@") and not endpoint.split("@", 1)[1].isdigit():
        raise ValueError(f"{what}: capacity@N needs a whole number of facts, got {endpoint!r}")


def claim_records(claim: Claim, root: str) -> List[tuple]:
    """(file, its JSON record, the record) of every run a claim reads: its ``results`` files in order (a
    missing file is skipped), kept by its ``select``. A record's place in the claim's lists says which of
    two records of one replicate is later, where the record has no finishing time."""
    out = []
    order = 0
    for rel in claim.results:
        path = os.path.join(root, rel)
        for d in load_records(path):
            r = compare.record_from_json(d)
            order += 1
            if not r.finished_at:
                r.finished_at = float(order)
            if all(str(r.params.get(k)) in [str(v) for v in vs] for k, vs in claim.select.items()):
                out.append((rel, d, r))
    return out


def _records(claim: Claim, root: str) -> List[compare.RunRecord]:
    return [r for _, _, r in claim_records(claim, root)]


def _value(r: compare.RunRecord, endpoint: str, current: bool = True) -> float:
    """One run's endpoint (module docstring); NaN where the run did not measure it. ``current``: read a
    summary endpoint against the facts in force (``summary_current``) where the run has it."""
    if endpoint.startswith("capacity@") or endpoint == "capacity_mean":
        points = capacity_points(r)
        if endpoint == "capacity_mean":
            return sum(p["score"] for p in points) / len(points) if points else math.nan
        facts = int(endpoint.split("@", 1)[1])
        return next((float(p["score"]) for p in points if p["facts"] == facts), math.nan)
    if endpoint.startswith("position@"):
        bucket = last_position_bucket(r, endpoint.split("@", 1)[1])
        return float(bucket["bits_per_byte"]) if bucket else math.nan
    if endpoint.startswith("interference@"):
        point = _interference_point(r, endpoint)
        return math.nan if point is None else float(point["score"])
    v = r.summary_current.get(endpoint) if current and endpoint in r.summary_current else r.summary.get(endpoint)
    return math.nan if v is None else float(v)


def _interference_point(r: compare.RunRecord, endpoint: str):
    """``interference@KIND@ITEMS``: the run's point of KIND's curve at ITEMS items (a dict), or None."""
    _, kind, items = endpoint.split("@")
    points = curves_of(r).get(kind) or []
    return next((p for p in points if int(p["items"]) == int(items)), None)


def _skill_at(r: compare.RunRecord, endpoint: str) -> float:
    """capacity@N, interference@KIND@ITEMS: the run's skill (against the probe's chance) at that point of
    the curve; NaN otherwise."""
    if endpoint.startswith("interference@"):
        point = _interference_point(r, endpoint)
        return math.nan if point is None or "skill" not in point else float(point["skill"])
    if not endpoint.startswith("capacity@"):
        return math.nan
    facts = int(endpoint.split("@", 1)[1])
    return next((float(p["skill"]) for p in capacity_points(r) if p["facts"] == facts and "skill" in p),
                math.nan)


def _where(r: compare.RunRecord, endpoint: str):
    """What a run's endpoint was measured over, which both runs of a pair must share: the ladder of N for
    ``capacity_mean``, the last bucket's (lo, hi) for ``position@DOMAIN``; None for the other endpoints."""
    if endpoint == "capacity_mean":
        return tuple(p["facts"] for p in capacity_points(r))
    if endpoint.startswith("position@"):
        bucket = last_position_bucket(r, endpoint.split("@", 1)[1])
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
    if endpoint.startswith("forgetting") or endpoint == "stale_fraction":
        return False                                   # positive = forgotten (either metric); answered stale
    if endpoint in ("bwt", "updated_fraction", "retained_fraction"):
        return True                                    # bwt = -forgetting; shares of facts answered right
    return higher_is_better(metric)                    # scores and capacity scores are in the stream's metric


def _learned_nothing(r: compare.RunRecord) -> bool:
    """The held-out skill was measured and is below the stream gate's bar for having learned anything, and
    so is the stream's where it was measured (a run whose skill was not measured did not show that)."""
    bar = GateSection.min_stream_skill
    return r.gate_skill < bar and (math.isnan(r.stream_skill) or r.stream_skill < bar)


_most = reading.learned_on_most

#: the claims table's word for each reading of a "more" comparison (experiments.stats.reading)
_CLAIM_WORDS = {reading.LEAD: "yes", reading.LOSS: "opposite", reading.NO_DIFFERENCE: "no difference detected",
                reading.LEAD_OVER_NON_LEARNER: "against a non-learner", reading.NOT_READ_NON_LEARNER: "against a non-learner",
                reading.LEAD_NOT_LEARNED: "ours did not learn", reading.NOT_READ_NOT_LEARNED: "ours did not learn",
                reading.NEITHER_LEARNED: "neither learned"}


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
    reference_skill: float = math.nan          # as_much on a probe's point: the reference's mean skill there
    our_skill: float = math.nan                # on a probe's point: ours' mean skill there
    stopped: tuple = (0, 0, None)              # ours: (runs that stopped learning, runs measured, earliest experience)
    detectable: float = math.nan               # "no difference detected": the difference seen with 80% power at 5%
    note: str = ""                             # said after the numbers (code versions, learned counts)
    values: tuple = ((), ())                   # ours, theirs per pair: an interval at another level (families)
    beside: str = ""                           # the secondary endpoints on the same pairs (shown, not read)


def _measured(claim: Claim):
    """Whether a pair of runs measured the claim's endpoint (both values finite, over the same things)."""
    def measured(a: compare.RunRecord, b: compare.RunRecord) -> bool:
        x, y = _pair_values(a, b, claim.endpoint)
        return not (math.isnan(x) or math.isnan(y))
    return measured


def _compare(claim: Claim, ours: List[compare.RunRecord], theirs: List[compare.RunRecord], name: str) -> _Comparison:
    """Pairs ``ours`` with ``theirs`` over the replicates both ran with one code version: where the runs
    are of several, the version with the most pairs that measured the endpoint (the others are said,
    never pooled)."""
    if claim.kind == "fails_to_learn":
        return _fails_to_learn(claim, ours, theirs, name)
    v, pairs, left_out, across = pairing.pairs_in_one_version(ours, theirs, _measured(claim))
    if v is None:
        if pairing.pairs_in_one_version(ours, theirs)[1]:       # pairs within a version, none measured it
            return _Comparison(name, "not measured", f"vs {name}: not measured (no pair of runs with "
                               f"{claim.endpoint})", count=0, waits=False)
        if across:                                               # seeds shared only across versions
            versions = {pairing.version_of(r) for r in ours + theirs}
            return _Comparison(name, "refused", f"vs {name}: refused (its seeds and ours were run by {len(versions)} "
                               "code versions, none shared within one)", waits=False)
        return _Comparison(name, "no shared seeds", f"vs {name}: no seed run by both yet")
    values = [_pair_values(a, b, claim.endpoint, _in_force(pairs, claim.endpoint)) for a, b in pairs]
    c = paired_comparison([x for x, _ in values], [y for _, y in values])
    learned = (sum(a.learned is True for a, _ in pairs), sum(b.learned is True for _, b in pairs))
    # each side's mean skill at a probe's point: NaN unless every paired run of that side measured it
    our_skill, their_skill = (_mean_or_nan([_skill_at(r, claim.endpoint) for r in side]) for side in zip(*pairs))
    note = f"learned {learned[0]}/{len(pairs)} vs {learned[1]}/{len(pairs)}"
    if claim.kind == "more" and not (math.isnan(our_skill) or math.isnan(their_skill)):
        # at a probe's point, whether either side recalls there at all: a difference between two memories
        # at the floor is a difference in how they fail (said, not a rule: "more" has no floor rule)
        note += f"; skill there {our_skill:.2f} vs {their_skill:.2f}"
    if left_out:
        note += f"; code {v} ({left_out} runs of other code versions not paired)"
    if c.n < 2:
        return _Comparison(name, "too few pairs", f"vs {name}: {c.mean_difference:+.3f} from one pair of runs: too "
                           "few pairs", count=c.n)
    return _Comparison(name, stat=c, count=c.n, learned=learned, note=note,
                       reference_skill=their_skill, our_skill=our_skill, stopped=_stopped([a for a, _ in pairs]),
                       values=([x for x, _ in values], [y for _, y in values]),
                       beside=_beside(claim, pairs))


def _stopped(runs: Sequence[compare.RunRecord]) -> tuple:
    """(runs that stopped learning, runs whose learning could be measured, the earliest experience one
    stopped at, or None): :func:`experiments.stats.learning.stopped` over ``runs``, so that a win by a
    memory that stopped taking new facts names it."""
    s = learning.stopped(runs)
    return s.stopped, s.measured, s.earliest


def _stopped_words(claim: Claim, cmp: _Comparison) -> str:
    """``"; ovq stopped learning on 5/5 seeds (from exp 2)"``, or '' when none of ours' runs stopped."""
    k, n, at = cmp.stopped
    return f"; {_short_name(claim.ours)} stopped learning on {k}/{n} seeds (from exp {at})" if k else ""


def _short_name(pattern: str) -> str:
    """A configuration pattern's mixers alone: ``"ovq | after_meta...=128"`` -> ``"ovq"``."""
    return pattern.split("|", 1)[0].strip()


def _detectable(cmp: _Comparison, family_size: int) -> str:
    """What a "no difference detected" could have seen: the smallest true difference the paired t-test
    over these pairs finds with 80% power at the observed spread of the differences, at 5% and, in a
    family, at Holm's first step (5% / the family's size, the bar its smallest p must pass)."""
    ours, theirs = cmp.values
    n = sum(1 for x, y in zip(ours, theirs) if not (math.isnan(x) or math.isnan(y)))
    if n < 2:
        return ""
    sd = paired_sd(ours, theirs)
    at_five = detectable_difference(sd, n)
    # the word is read at the Holm p: the verdict quotes the effect at Holm's first step, the stricter bar
    cmp.detectable = detectable_difference(sd, n, alpha=0.05 / max(family_size, 1))
    text = f"80% power to detect {at_five:.3f} at 5%"
    if family_size > 1:
        text += f", {cmp.detectable:.3f} at Holm's first step (5%/{family_size})"
    return f" ({text}; paired SD {sd:.3f})"


def _both_at_floor(cmp: _Comparison) -> bool:
    """At a probe's point, whether both sides' mean skill there was measured and is below the learned
    gate's bar (``gate.min_skill``): neither recalls at the point read."""
    return (not (math.isnan(cmp.our_skill) or math.isnan(cmp.reference_skill))
            and cmp.our_skill < GateSection.min_skill and cmp.reference_skill < GateSection.min_skill)


def _mean_or_nan(values: Sequence[float]) -> float:
    """The mean of ``values``; NaN for none (and, as fmean does, NaN when any is NaN)."""
    return statistics.fmean(values) if values else math.nan


def _in_force(pairs, endpoint: str) -> bool:
    """One scoring for all of a comparison's pairs: against the facts in force only where every run has it."""
    return all(endpoint in a.summary_current and endpoint in b.summary_current for a, b in pairs)


def _beside(claim: Claim, pairs) -> str:
    """The claim's secondary endpoints on the comparison's pairs: ours - theirs with its 95% t interval,
    unadjusted (they are shown, not read), each over those of the pairs that measured it (one scoring for
    all of them, as the primary's), each with its direction. '' when the claim declares none."""
    parts = []
    for endpoint in claim.secondary:
        better = "higher" if _higher_is_better(endpoint, pairs[0][0].metric) else "lower"
        values = [v for v in (_pair_values(a, b, endpoint, _in_force(pairs, endpoint)) for a, b in pairs)
                  if not any(math.isnan(x) for x in v)]
        if len(values) < 2:
            parts.append(f"{endpoint} ({better} is better): not measured on 2 pairs")
            continue
        c = paired_comparison([x for x, _ in values], [y for _, y in values])
        n = "" if c.n == len(pairs) else f" over {c.n} pairs"
        if c.low == c.high:                 # every pair differs by the same amount: no spread to show
            parts.append(f"{endpoint} ({better} is better) {c.mean_difference:+.3f} in every one of {c.n} pairs "
                         "(zero variance, no interval)")
            continue
        parts.append(f"{endpoint} ({better} is better) {c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}]{n}")
    return f". Beside it, not read (95% CI, unadjusted): {', '.join(parts)}" if parts else ""


def _fails_to_learn(claim: Claim, ours: List[compare.RunRecord], theirs: List[compare.RunRecord],
                    name: str) -> _Comparison:
    """Each side's runs, one per replicate (the latest): every seed of theirs learned nothing, ours learned
    on most. Nothing is paired here (each run's gates are its own), so seeds made by different code
    versions are read together, and the cell says how many versions they span."""
    mine, their_runs = pairing.latest_per_replicate(ours), pairing.latest_per_replicate(theirs)
    nothing = [r for r in their_runs.values() if _learned_nothing(r)]
    ours_learned = sum(r.learned is True for r in mine.values())
    best = max((r.gate_skill for r in their_runs.values() if not math.isnan(r.gate_skill)), default=math.nan)
    versions = {pairing.version_of(r) for r in list(mine.values()) + list(their_runs.values())}
    ok = len(nothing) == len(their_runs) and _most(ours_learned, len(mine))
    cell = (f"{name}: {len(nothing)}/{len(their_runs)} seeds learned nothing (held-out and stream skill < "
            f"{GateSection.min_stream_skill:g}; best held-out skill {best:.2f}; {claim.ours}: {ours_learned}/"
            f"{len(mine)} learned)" + (f"; seeds of {len(versions)} code versions" if len(versions) > 1 else ""))
    return _Comparison(name, "yes" if ok else "no", cell, count=min(len(their_runs), len(mine)))


def _comparisons(claim: Claim, root: str):
    """(comparisons, ours' metric), or (None, an early verdict: not testable, not run yet)."""
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
    return out, ours[0].metric


def _short(claim: Claim, cmp: Optional[_Comparison]) -> bool:
    """Whether a declared comparison is still to come: it has no runs yet, or fewer pairs than its claim
    declares and more runs can add them (its numbers so far are shown, no word is read from them)."""
    if cmp is None:
        return bool(claim.seeds)
    return bool(claim.seeds) and cmp.waits and cmp.count < claim.seeds


def _answer(claim: Claim, cmp: _Comparison, p_holm: float, higher: bool, family_size: int = 1,
            p_holm_low: float = math.nan) -> None:
    """The answer and cell of a tested comparison (``cmp.stat`` set), by the claim's kind. ``family_size``:
    the comparisons of its Holm family; an "as much" interval is read at 1 - 0.05 / family_size (95%
    alone), the Bonferroni share of the family's 5%. ``p_holm`` is the adjusted p with the family's tests
    still to come at p = 1, ``p_holm_low`` at p = 0: a word that differs between the two waits
    ("pending"), as does every word of a comparison short of its declared pairs (its raw p shown)."""
    c, name = cmp.stat, cmp.name
    n = c.n
    if _short(claim, cmp) and claim.kind == "more":
        cmp.answer = "pending"
        p = ("no t-test so far (every pair differs by the same amount)" if math.isnan(c.p_t)
             else f"p {c.p_t:.2g} unadjusted")
        cmp.cell = (f"vs {name}: {c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}], {p}, "
                    f"{n} pairs ({cmp.note}): pending ({n} of {claim.seeds} pairs: no word read)")
        return
    if claim.kind == "more":
        ours_learned, theirs_learned = _most(cmp.learned[0], n), _most(cmp.learned[1], n)
        if not (ours_learned or theirs_learned):
            # two memories that both failed the learned gates on most seeds: their difference is about
            # what neither learned, so it is said but not read as the claim's evidence either way
            cmp.answer = "neither learned"
        elif _both_at_floor(cmp):
            # at a probe's point where neither side recalls (skill below the learned gate's bar): two
            # memories at the floor differ in how they fail, which tests nothing the claim says
            cmp.answer = "both at the floor"
        elif math.isnan(c.p_t):
            # every pair differs by the same nonzero amount: no t-test is made (see paired_comparison),
            # and a difference whose spread is unknown is neither a "yes" nor "no difference"
            cmp.answer = "no t-test"
            cmp.cell = f"vs {name}: every one of {n} pairs differs by {c.mean_difference:+.3f}: no t-test (zero variance)"
            return
        elif not math.isnan(p_holm_low) and (p_holm_low < 0.05) != (p_holm < 0.05):
            cmp.answer = "pending"
            cmp.cell = (f"vs {name}: {c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}], Holm p "
                        f"{p_holm_low:.2g}-{p_holm:.2g}, {n} pairs ({cmp.note}): pending (tests of its Holm family "
                        "still to come could move its p)")
            return
        else:
            # who learned decides what the test may be read as (experiments.stats.reading, as the verdict)
            better = c.mean_difference > 0 if higher else c.mean_difference < 0
            cmp.answer = _CLAIM_WORDS[reading.read_difference(p_holm < 0.05, better, ours_learned, theirs_learned)]
        word = cmp.answer
        if cmp.answer == "no difference detected" and claim.margin > 0:
            # a declared equivalence margin: the two one-sided tests at the family's share of 5% (Bonferroni,
            # as an "as much" interval is read) say whether the absence of a difference is shown
            tost = equivalence_p(*cmp.values, claim.margin)
            level = 0.05 / max(family_size, 1)
            if tost < level:
                cmp.answer = "equivalent"
                word = (f"equivalent within +-{claim.margin:g} (two one-sided tests p {tost:.2g} < "
                        f"{level:.2g})")
            else:
                word += _detectable(cmp, family_size) + (
                    f"; equivalence within +-{claim.margin:g} not shown (two one-sided tests p {tost:.2g}, "
                    f"needs < {level:.2g})")
        elif cmp.answer == "yes":
            word += _stopped_words(claim, cmp)
        elif cmp.answer == "no difference detected":
            word += _detectable(cmp, family_size)
        rank = "" if math.isnan(c.p_wilcoxon) else f", Wilcoxon p {c.p_wilcoxon:.2g} unadjusted"
        cmp.cell = (f"vs {name}: {c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}], Holm p {p_holm:.2g}{rank}, "
                    f"{n} pairs ({cmp.note}): {word}")
        return
    # as_much
    level = 1 - 0.05 / max(family_size, 1)
    if level != 0.95:
        c = paired_comparison(*cmp.values, level=level)
    if _most(n - cmp.learned[1], n):
        # matching a reference that failed its gates on most seeds says nothing (half is not most)
        cmp.answer = "reference did not learn"
    elif (claim.endpoint.startswith(("capacity@", "interference@"))
          and not cmp.reference_skill >= GateSection.min_skill):
        # matching a reference that does not recall at this point is matching two memories at the floor;
        # a reference whose skill there was not measured has not shown that it recalls
        cmp.answer = "reference does not recall here" if not math.isnan(cmp.reference_skill) else "reference's skill not measured here"
    elif math.isnan(c.p_t) and c.mean_difference != 0:
        # pairs that all differ by the same amount (to within rounding: no t-test) give a zero-width
        # interval, which is not evidence of a small difference: it is too few seeds to see the spread
        cmp.answer = "no t-test"
        cmp.cell = (f"vs {name}: every one of {n} pairs differs by {c.mean_difference:+.3f}: no interval "
                    f"(zero variance; margin +-{claim.margin:g})")
        return
    else:
        cmp.answer = "yes" if -claim.margin <= c.low and c.high <= claim.margin else "no"
    if _short(claim, cmp) and cmp.answer in READ + NOT_READ:
        # a side's gates or the reference's skill at the point are read over the declared pairs too
        cmp.answer = "pending"
    skill = (f"; {name}'s skill there {cmp.reference_skill:.2f}" if not math.isnan(cmp.reference_skill) else "")
    interval = "" if level == 0.95 else f" ({level:.1%} interval: a family of {family_size})"
    # a "no" is either a difference beyond the margin or an interval too wide to show a match: said apart
    why = ""
    if cmp.answer == "no":
        why = (" (the whole interval beyond the margin)" if c.low > claim.margin or c.high < -claim.margin
               else " (the interval reaches past the margin: a match is not shown, nor a difference beyond it)")
    elif cmp.answer == "yes":
        why = f" (equivalent: the whole interval inside +-{claim.margin:g})"
    if cmp.answer in ("yes", "no"):
        # the equivalence test beside the interval rule: two one-sided t-tests at the declared margin
        tost = equivalence_p(*cmp.values, claim.margin)
        if not math.isnan(tost):
            why += f"; two one-sided tests p {tost:.2g}"
    said = f"pending ({n} of {claim.seeds} pairs: no word read)" if cmp.answer == "pending" else cmp.answer + why
    cmp.cell = (f"vs {name}: {c.mean_difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}]{interval} (margin "
                f"+-{claim.margin:g}), {n} pairs ({cmp.note}{skill}): {said}")


READ = ("yes", "no", "no difference detected", "opposite", "equivalent")
NOT_READ = ("neither learned", "reference did not learn", "reference does not recall here",
            "reference's skill not measured here", "against a non-learner", "ours did not learn", "both at the floor")
REFERENCE_NOT_READ = NOT_READ[1:4]           # an "as much" whose reference cannot do the task there
NOT_MADE = ("not measured", "no runs", "too few pairs", "no shared seeds")


def _verdict(claim: Claim, comparisons: List[_Comparison]) -> str:
    """The claim's verdict from its answers. Only comparisons read count as evidence: "reproduced" needs
    every declared comparison read and "yes"; one not read (a side failed its gates) or not made (not
    measured, too few pairs) is said beside the verdict, and never turns it into "not reproduced"."""
    answers = [c.answer for c in comparisons]
    n = len(answers)
    if n and all(a == "no runs" for a in answers):
        return f"not run yet (no runs of {', '.join(claim.against)})"
    # The verdict is declared over claim.seeds pairs; one read from fewer would be a peek. A comparison
    # whose runs never measured the endpoint will not gain pairs by waiting: it does not hold the others.
    waiting = [c.count for c in comparisons if c.waits]
    if claim.seeds and waiting and min(waiting) < claim.seeds:
        return (f"pending ({min(waiting)} of {claim.seeds} {'seeds' if claim.kind == 'fails_to_learn' else 'pairs'} "
                "in the comparison with fewest)")
    if "pending" in answers:      # complete, but its Holm family's tests still to come could move its word
        return "pending (tests of its Holm family still to come could move a comparison's word)"
    refused = sum(a == "refused" for a in answers)
    if refused:
        return (f"incomplete: {refused} of {n} comparisons refused (no seed run by both within one code "
                "version); rerun them with one code")
    untested = sum(a == "no t-test" for a in answers)
    if untested:
        return f"undecided ({untested} of {n} comparisons without a test: every pair differs by the same amount)"
    read = [a for a in answers if a in READ]
    k = sum(a == "yes" for a in read)
    aside = [a for a in answers if a not in READ]
    reasons = ", ".join(sorted(set(aside)))
    if not read:
        if all(a == "neither learned" for a in answers):
            return "not testable here: neither side passed the learned gates on most seeds, in every comparison"
        if all(a in REFERENCE_NOT_READ for a in answers):
            return ("not testable here: the reference " + (
                "does not recall at this point (its skill there is "
                f"below the learned gate's {GateSection.min_skill:g})" if "reference does not recall here" in answers
                else "has no measured skill at this point" if "reference's skill not measured here" in answers
                else "failed the learned gates"))
        if all(a == "against a non-learner" for a in answers):
            return ("not testable here: every baseline failed the learned gates on most seeds (a lead over a "
                    "memory that did not learn the task is no evidence that ours keeps more)")
        if all(a in ("ours did not learn", "neither learned") for a in answers):
            return f"not testable here: {_short_name(claim.ours)} did not pass the learned gates on most seeds"
        if all(a == "both at the floor" for a in answers):
            return (f"not testable here: neither side recalls at the point read (both skills below the learned "
                    f"gate's {GateSection.min_skill:g})")
        if all(a in NOT_MADE for a in answers):
            return "too few pairs" if "too few pairs" in answers else f"not measured ({claim.endpoint})"
        return f"not testable here: no comparison could be read ({reasons})"
    stopped = [c.stopped for c in comparisons if c.answer == "yes" and c.stopped[0]]
    if stopped:
        # a memory that holds more because it stopped taking new facts early must not read as one that keeps
        k_stop, n_stop, at = max(stopped)
        aside_words = f"; won by a memory that stopped learning ({_short_name(claim.ours)}: {k_stop}/{n_stop} seeds, from exp {at})"
    else:
        aside_words = ""
    if claim.kind == "more" and claim.margin > 0:
        # a claim with a declared equivalence margin reads each comparison as a difference, an equivalence,
        # or neither shown: the last is a test whose power fell short, which decides nothing
        short = sum(a == "no difference detected" for a in read)
        same = sum(a == "equivalent" for a in read)
        lost = sum(a == "opposite" for a in read)
        if lost:
            # a significant loss is said before anything power could not decide
            parts = [f"ours holds less in {lost}"] + ([f"holds more in {k}"] if k else []) + (
                [f"equivalent within +-{claim.margin:g} in {same}"] if same else []) + (
                [f"neither shown in {short} (power fell short)"] if short else [])
            return (f"not reproduced: {', '.join(parts)} of {n} comparisons"
                    + (f"; {len(aside)} not read ({reasons})" if aside else ""))
        if short:
            return (f"not decided: neither a difference nor equivalence within +-{claim.margin:g} shown in {short} of "
                    f"{n} comparisons (power fell short)" + (f"; {len(aside)} not read ({reasons})" if aside else ""))
        if same and not k:
            return (f"not reproduced: equivalent within +-{claim.margin:g} in {same} of {n} comparisons"
                    + (f"; {len(aside)} not read ({reasons})" if aside else ""))
        if same:
            return (f"partly ({k} of {n}){aside_words}; equivalent within +-{claim.margin:g} in {same}"
                    + (f"; {len(aside)} not read ({reasons})" if aside else ""))
    unseen = [c.detectable for c in comparisons if c.answer == "no difference detected" and not math.isnan(c.detectable)]
    if not k and unseen and all(a in ("no difference detected",) + NOT_READ + NOT_MADE for a in answers):
        # nothing went either way: say what the test could not have seen, not only that the claim failed
        low, high = f"{min(unseen):.2f}", f"{max(unseen):.2f}"
        span = low if low == high else f"{low}-{high}"
        shown = ("not reproduced: no difference detected (a difference of about " + span
                 + " would have been found with 80% power at the family's level; smaller ones may have been "
                 "missed; equivalence not shown)")
        return shown if not aside else f"{shown}; {len(aside)} of {n} comparisons not read ({reasons})"
    if not aside:
        return ("reproduced" if k == n else (f"partly ({k} of {n})" if k else "not reproduced")) + aside_words
    said = f"{len(aside)} of {n} comparisons not read ({reasons})"
    return (f"partly ({k} of {n}){aside_words}; {said}" if k else f"not reproduced in the {len(read)} read; {said}")


def _test_key(claim: Claim, name: str) -> tuple:
    """What makes two rows' comparisons one test: the records, the two sides, the endpoint, the selection."""
    return (tuple(sorted(claim.results)), claim.ours, name, claim.endpoint, claim.kind,
            tuple(sorted((k, tuple(v)) for k, v in claim.select.items())))


def configuration_runs(claim: Claim, root: str) -> List[List[compare.RunRecord]]:
    """The runs of each configuration a claim compares (ours, then each of ``against`` that has runs), as
    its comparisons group them: what a rerun check of the row covers."""
    if claim.kind == "untestable":
        return []
    groups = compare.group_records(_records(claim, root))
    out = []
    for pattern in [claim.ours] + list(claim.against):
        try:
            out.append(groups[compare.find_group(groups, pattern)])
        except ValueError:
            continue
    return out


def awaited_study(name: str):
    """The study spec a claims row ``awaits``: from the studies folder in use, else from the project's own
    (a report over another folder of studies still reads the project's claims, whose studies are these)."""
    from experiments.study_specs import load_study

    try:
        return load_study(name)
    except FileNotFoundError:
        own = os.path.join(os.path.dirname(os.path.abspath(__file__)), "studies", name, "study.yaml")
        if os.path.exists(own):
            return load_study(own)
        raise


def _results_missing(name: str, root: str) -> List[str]:
    """The declared result files of study ``name`` that do not exist under ``root`` (what a row that awaits
    it waits for, where the caller has no finer count of the study's runs)."""
    return [f"{path} (not written)" for path in awaited_study(name).results if not os.path.exists(os.path.join(root, path))]


def evaluate_claims(claims: List[Claim], root: str,
                    unfinished: Optional[Callable[[str], List[str]]] = None) -> List[ClaimResult]:
    """Every claim's comparisons, answers and verdict (module docstring). Holm runs over each family:
    the claims that share a ``family`` name (a study's declared family split over several rows), else the
    claim alone. Every declared comparison of the family counts in it: one without a t-test that more runs
    cannot give one as p = 1, so that the data cannot shrink a declared family and turn another
    comparison's "no difference" into "yes". A test two rows show counts once,
    and a member's ``family_also`` (the declared family's tests no row shows) counts too. A declared test
    still to come (no runs yet, or fewer pairs than its claim declares) has no p yet: the adjustment is
    made with it at p = 1 (the Holm p shown) and at p = 0, and a comparison's word is read only where both
    agree (``stats.multiple.holm_bounds``); a comparison short of its pairs says no word at all. A family's
    verdicts wait until every member has its declared pairs (a member still pending would move the
    others' adjusted p).

    A claim that ``awaits`` a declared study reads **not decided** while that study's runs are not all in
    (``unfinished(name)``: what is still to come, e.g. the report's count of its sweeps' runs; by default
    its result files not yet written), with what its own comparisons read so far after it."""
    staged = [_comparisons(c, root) for c in claims]
    # the family's tests no row shows (family_also): made like the shown ones, adjusted with them, never printed
    unshown = [(_comparisons(replace(c, against=list(c.family_also)), root)[0] if c.family_also else [])
               for c in claims]
    families: Dict[str, List[int]] = {}
    for i, claim in enumerate(claims):
        if claim.kind in ("more", "as_much"):
            families.setdefault(claim.family or f"#{i}", []).append(i)
    p_holm: Dict[int, float] = {}
    p_holm_low: Dict[int, float] = {}
    size: Dict[int, int] = {}
    for members in families.values():
        # one p per distinct test: two rows that show the same comparison (ours against one mixer, on the
        # same records and endpoint) count it once, as the study declared it once. Each test's p as a
        # range: known (p, p); made without a t-test, or never to be made, (1, 1); still to come (0, 1)
        tests: Dict[tuple, tuple] = {}
        shown: Dict[tuple, List[_Comparison]] = {}
        for i in members:
            names = list(claims[i].against) + list(claims[i].family_also)
            made = (staged[i][0] or [None] * len(claims[i].against)) + (unshown[i] or [None] * len(claims[i].family_also))
            for k, (name, m) in enumerate(zip(names, made)):
                key = _test_key(claims[i], name)
                if _short(claims[i], m):
                    p = (0.0, 1.0)
                elif m is None or m.stat is None or math.isnan(m.stat.p_t):
                    p = (1.0, 1.0)
                else:
                    p = (m.stat.p_t, m.stat.p_t)
                tests.setdefault(key, p)
                if m is not None and k < len(claims[i].against):
                    shown.setdefault(key, []).append(m)
        keys = list(tests)
        low, high = holm_bounds([tests[k] for k in keys])
        for key, lo, hi in zip(keys, low, high):
            for m in shown.get(key, []):
                p_holm[id(m)], p_holm_low[id(m)] = hi, lo
        for i in members:
            size[i] = len(keys)
    verdicts: List[ClaimResult] = []
    for i, (claim, (comparisons, metric_or_verdict)) in enumerate(zip(claims, staged)):
        if comparisons is None:
            verdicts.append(ClaimResult(claim, [], [], metric_or_verdict))
            continue
        if claim.kind in ("more", "as_much"):
            for m in comparisons:
                if m.stat is not None:
                    _answer(claim, m, p_holm[id(m)], _higher_is_better(claim.endpoint, metric_or_verdict), size[i],
                            p_holm_low[id(m)])
                    m.cell += m.beside
        verdicts.append(ClaimResult(claim, [m.cell for m in comparisons], [m.answer for m in comparisons],
                                    _verdict(claim, comparisons)))
    for claim, result in zip(claims, verdicts):
        if claim.awaits:
            missing = (unfinished or (lambda name: _results_missing(name, root)))(claim.awaits)
            if missing:
                number = awaited_study(claim.awaits).title.split(".", 1)[0]
                where = f"section {number}: " if number.isdigit() else ""
                result.verdict = (f"not decided: waits for the declared study {claim.awaits} ({where}{'; '.join(missing)}); "
                                  f"its own comparisons read so far: {result.verdict}")
    for name, members in families.items():
        if len(members) < 2:
            continue
        waiting = [i for i in members if verdicts[i].verdict.startswith(("pending", "not run yet"))]
        for i in members:
            if waiting and i not in waiting:
                verdicts[i].verdict = (f"pending (its Holm family, {name}, waits for {len(waiting)} of its "
                                       f"{len(members)} rows)")
    return verdicts


def evaluate(claim: Claim, root: str) -> ClaimResult:
    """One claim on its own (its own Holm family): :func:`evaluate_claims` of it alone."""
    return evaluate_claims([replace(claim, family="")], root)[0]


def _table_cell(text: str) -> str:
    """``text`` safe inside one Markdown table cell: a configuration pattern such as ``ovq | after_meta...``
    carries the pattern separator, which would otherwise split the cell in two."""
    return text.replace("|", "\\|")


def claims_section(root: str, path: str = CLAIMS_FILE,
                   unfinished: Optional[Callable[[str], List[str]]] = None,
                   state: Optional[Callable[[Claim], str]] = None) -> str:
    """The claims table for RESULTS.md (its preamble, one row per claim, each verdict with its evidence
    class: confirmatory, declared before its runs with 10+ seeds, or exploratory, with its seeds; and the rerun
    check of its configurations, ``state(claim)``, "not checked" without one)."""
    preamble, claims = load_claims(path)
    lines = ["## The paper's claims, tested here", "", preamble.strip(), "",
             "| the paper's claim | our test | our result (ours - theirs, 95% CI) | verdict | evidence | rerun check |",
             "|---|---|---|---|---|---|"]
    for claim, result in zip(claims, evaluate_claims(claims, root, unfinished)):
        body = "; ".join(result.cells) or "-"
        verdict = f"**{result.verdict}**" + (f". {claim.note}" if claim.note else "")
        check = state(claim) if state else "not checked"
        lines.append("| " + " | ".join(_table_cell(text) for text in (claim.claim, claim.test, body, verdict,
                                                                        claim.evidence or "-", check)) + " |")
    return "\n".join(lines) + "\n"


FINDINGS_START = "<!-- findings table: generated by `ovq-cl report` from experiments/claims.yaml; do not edit -->"
FINDINGS_END = "<!-- end of the findings table -->"
MAX_FINDINGS = 12


def findings_table(root: str, path: str = CLAIMS_FILE, unfinished: Optional[Callable[[str], List[str]]] = None,
                   state: Optional[Callable[[Claim], str]] = None) -> str:
    """README's findings table: one line per claims row with a ``headline`` (at most a dozen), its reading
    exactly as the claims table reads it (the same rules, the same runs), the seeds, the evidence class and
    the row's rerun check (``state(claim)``: whether its runs were rerun bit for bit; "not checked" by
    default). A row that waits for a declared study says only that."""
    _, claims = load_claims(path)
    results = evaluate_claims(claims, root, unfinished)
    rows = [(c, r) for c, r in zip(claims, results) if c.headline]
    if len(rows) > MAX_FINDINGS:
        raise ValueError(f"{path}: {len(rows)} rows have a headline; README's findings table holds at most {MAX_FINDINGS}")
    lines = ["| finding (the paper's claim) | our test | reading | seeds | evidence | rerun check |",
             "|---|---|---|---|---|---|"]
    for c, r in rows:
        sections = re.findall(r"section (\d+)", c.test)       # the last named: the one the test reads
        where = f"section {sections[-1]}" if sections else "-"
        reading = r.verdict.split("; its own comparisons read so far")[0] if r.verdict.startswith("not decided") else r.verdict
        lines.append("| " + " | ".join(_table_cell(t) for t in (c.headline, where, reading, str(c.seeds),
                                                                  c.evidence.split(",")[0],
                                                                  state(c) if state else "not checked")) + " |")
    return "\n".join(lines) + "\n"


def replace_findings(text: str, table: str) -> str:
    """``text`` (README) with the part between the findings markers replaced by ``table``; ValueError when
    the markers are missing (a README edited by hand must say where the table goes)."""
    if FINDINGS_START not in text or FINDINGS_END not in text:
        raise ValueError("README.md has no findings markers: put the two lines of experiments.claims.FINDINGS_START "
                         "and FINDINGS_END where the table goes")
    head, rest = text.split(FINDINGS_START, 1)
    _, tail = rest.split(FINDINGS_END, 1)
    return head + FINDINGS_START + "\n" + table + FINDINGS_END + tail
