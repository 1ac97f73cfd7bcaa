"""Study 17's declared answer, computed from its records: does a mixer forget because of its update rule
or because of how it was trained?

The rule was declared in ``experiments/studies/why_forget.yaml`` before the long-horizon runs; this module
applies it, so RESULTS.md's answer is generated like every other number. Per mixer and training recipe
(a *treatment*, e.g. meta-training for the stream's horizon), paired with the mixer's standard recipe over
the replicates (seed of model and data) both ran:

- **learns the long task**: meta-training's score on the recalled answers alone (``<metric>_recalled``:
  facts the episode did not present) at its last logged step, as skill against the held-out gate's chance
  on the same stream, is >= ``min_skill`` on every seed;
- **passes its gates**: every treatment run passed its learned gates (held-out and stream);
- **half point moved**: the ``kind`` interference half point (intervening bindings at which recall of the
  probe's facts halves; beyond the ladder when it never does) is larger under the treatment on every
  pair where either recipe halves within the ladder (a pair where neither does says nothing). A half
  point is a censored count (">256"), so the rule is a direction on every seed, not a mean; where the
  standard recipe never halves within the ladder on any seed there is nothing to move; "did not move" is
  not larger on any pair (larger on some pairs only is neither);
- **final average**: the treatment minus the standard, paired t-test, Holm over every (mixer, treatment)
  row of the table; "above" / "below" when Holm-adjusted p < ``alpha``, else "no difference".

The answer per row: **(b)** "how it was trained" when it passes its gates, its half point moved and its
final average is not below the standard's; **(a)** "the update rule" when it learns the long task and
neither the half point nor the final average moved (a final average that fell is a move: (c));
**(c)** otherwise, with the reason: among them, the standard recipe never halves within the ladder
("nothing to move": the question is about memories that lose facts to interference), or some seed has
no half point at all (no recall of the probe's facts at 0 items), which is never read as "moved" or
"still"; **undecided** when every pair's final average differs by the same amount (no t-test can be
made, so neither "not below" nor "did not move" is known). (b) does not require learning the long task
(the declared text does not: passing the gates and moving the half point is the evidence). A mixer's
answer is (b) if some treatment gives (b), else (a) if some gives (a), else (c). A row is decided only
when every replicate of the standard has its treatment pair ("pending" before).

The budget rule: a configuration rerun with more meta-training steps (it was "still improving")
replaces the shorter one, the standard recipe's too; a row whose treatment or standard is still
improving below the declared rerun budget is pending until its rerun is read, so no answer and no
recipe is read off a row the study will replace. Runs are deduplicated first
(:func:`experiments.compare.deduplicated`), and a row that would pair runs of two code versions is
refused, as the verdict refuses them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from experiments import compare, plateau
from experiments.probes.interference import half_point
from experiments.stats import pairing
from experiments.stats.intervals import paired_comparison
from experiments.stats.multiple import holm, holm_bounds

#: the declared thresholds (study 17): skill on recalled answers for "learns the long task", the level
#: of the Holm-adjusted test on the final average
MIN_SKILL = 0.5
ALPHA = 0.05

STEPS = "meta_train.steps"

ANSWERS = {"b": "(b) how it was trained", "a": "(a) the update rule", "c": "(c) something else"}


@dataclass
class RecipeRow:
    """One mixer under one treatment, against its standard recipe (pairs over replicates)."""

    mixer: str
    treatment: str                      # the treatment's configuration name
    n_pairs: int
    n_standard: int                     # replicates of the standard recipe
    recalled_skill: List[float]         # per treatment run: skill on recalled answers at the end of meta-training
    learned: List[Optional[bool]]       # per treatment run: its learned gates
    halves: List[Tuple[float, float]]   # per pair: (standard, treatment) half point; inf = beyond the ladder
    final: object                       # PairedComparison of final_average, treatment - standard
    seeds: int = 0                      # the declared pairs a row needs (0: every standard replicate)
    p_holm: float = math.nan            # Holm over the table's rows, those still pending counted at p = 1
    p_holm_low: float = math.nan        # ... and at p = 0: the two agree once no row of the family is pending
    recipe: Dict[str, str] = field(default_factory=dict)   # what tells the treatments apart: {full key: value}
    params: Dict[str, str] = field(default_factory=dict)   # the treatment's relevant params (as logged)
    awaits: str = ""                    # why the budget rule will replace this row ('' when it will not)
    refused: str = ""                   # why its pairs cannot be read ('' when they can)

    @property
    def decided(self) -> bool:
        # every standard replicate has its pair, and at least the declared seeds (a standard whose own
        # seeds are not all in yet must not decide a row with fewer pairs than declared), and every pair
        # has its final average (a run without one is not a pair the test can read)
        return (self.n_pairs >= max(2, self.seeds) and self.n_pairs == self.n_standard
                and self.final.n == self.n_pairs)

    @property
    def is_final(self) -> bool:
        """Decided, and nothing the study still runs will replace or refuse it."""
        return self.decided and not self.awaits and not self.refused

    @property
    def learns_long_task(self) -> bool:
        return bool(self.recalled_skill) and all(s >= MIN_SKILL for s in self.recalled_skill)

    @property
    def passes_gates(self) -> bool:
        return bool(self.learned) and all(f is True for f in self.learned)

    @property
    def nothing_to_move(self) -> bool:
        return bool(self.halves) and all(math.isinf(s) for s, _ in self.halves)

    @property
    def half_unknown(self) -> bool:
        """Some pair has no half point (no curve, or no recall of the probe's facts at 0 items): "on every
        seed" cannot be read on the seeds that have one."""
        return any(math.isnan(x) for pair in self.halves for x in pair)

    @property
    def half_moved(self) -> bool:
        # a pair where neither recipe halves within the ladder says nothing about moving beyond
        said = [(s, t) for s, t in self.halves if not (math.isinf(s) and math.isinf(t))]
        return not self.half_unknown and bool(said) and all(t > s for s, t in said)

    @property
    def half_still(self) -> bool:
        return not self.half_unknown and bool(self.halves) and all(t <= s for s, t in self.halves)

    @property
    def no_t_test(self) -> bool:
        """Every pair differs by the same nonzero amount: paired_comparison makes no t-test."""
        return self.final.n >= 2 and math.isnan(self.final.p_t) and self.final.mean_difference != 0

    def _reading(self, p_holm: float) -> str:
        if self.final.n < 2 or math.isnan(p_holm) or p_holm >= ALPHA:
            return "no difference"
        return "above" if self.final.mean_difference > 0 else "below"

    def readings(self) -> List[str]:
        """The final average's possible readings ("above", "below", "no difference") given what is known:
        one where the adjusted test is known; both sides of an unknown where the row has no t-test ("not
        below" is then unknown, declared item (v)), or where its Holm p depends on rows of the family still
        pending (at p = 0 and at p = 1 for them: Holm's adjusted p is monotone in the others' p)."""
        if self.no_t_test:
            return ["no difference", "above" if self.final.mean_difference > 0 else "below"]
        return list(dict.fromkeys([self._reading(self.p_holm_low), self._reading(self.p_holm)]))

    @property
    def final_direction(self) -> str:
        """The reading, or "no t-test", or "family pending" while the Holm family can still move it."""
        if self.no_t_test:
            return "no t-test"
        found = self.readings()
        return found[0] if len(found) == 1 else "family pending"

    def answer(self) -> Tuple[str, str]:
        """(letter, reason); letter '' while pending (pairs missing, a rerun the budget rule will read
        instead, or a Holm family whose pending rows could change the reading) or refused; '?' when the
        row has no t-test and the readings it leaves open give different answers. A row whose answer is
        the same under every reading left open is decided (e.g. (c) for a seed without a half point)."""
        if self.refused:
            return "", f"refused: {self.refused}"
        if not self.decided:
            if self.n_pairs >= max(2, self.seeds) and self.n_pairs == self.n_standard:
                return "", f"pending: {self.n_pairs - self.final.n} of its {self.n_pairs} pairs have no final average"
            return "", f"pending ({self.n_pairs} of {max(self.n_standard, self.seeds)} pairs)"
        answers = {}
        for rule in map(self._rule, self.readings()):
            answers.setdefault(rule[0], rule)
        if len(answers) == 1:
            letter, reason = next(iter(answers.values()))
        elif self.no_t_test:
            # "not below" / "did not rise" are what the declared test says; with no test neither is known
            letter, reason = "?", ("undecided: every pair's final average differs by the same amount "
                                   f"({self.final.mean_difference:+.3f}), so the declared t-test cannot be made "
                                   f"(it would be {' or '.join(ANSWERS[k] for k in sorted(answers))})")
        else:
            letter, reason = "", (f"pending: its Holm p ({compare._p(self.p_holm_low)} to {compare._p(self.p_holm)}) "
                                  "depends on rows of the table still pending")
        if self.awaits:
            return "", f"pending: {self.awaits} (so far {ANSWERS.get(letter, 'undecided')})"
        return letter, reason

    def possible_letters(self) -> set:
        """The answers this row can still give: its own once decided; the two a no-t-test row leaves
        open; any while it is pending or refused."""
        letter, _ = self.answer()
        if letter == "?":
            return {self._rule(reading)[0] for reading in self.readings()}
        return {letter} if letter else {"a", "b", "c"}

    def _rule(self, direction: str) -> Tuple[str, str]:
        """The declared rule on a row with every pair, the final average read as ``direction``."""
        if self.nothing_to_move:
            return "c", "the standard recipe never halves within the ladder: nothing to move"
        if self.half_unknown:
            return "c", "no half point on some seed (no recall of the probe's facts at 0 items, or no curve)"
        if self.passes_gates and self.half_moved and direction != "below":
            return "b", "passes its gates, half point moved on every seed, final average not below"
        if self.learns_long_task and self.half_still and direction == "no difference":
            return "a", "learns the long task; neither the half point nor the final average moved"
        if not self.learns_long_task:
            return "c", "does not learn the long task within the budget: rule and training not separated"
        if not (self.half_moved or self.half_still):
            return "c", "the half point moved on some seeds only"
        if self.half_still:
            return "c", f"the final average {'rose' if direction == 'above' else 'fell'} without the half point moving"
        return "c", ("half point moved but the final average fell" if direction == "below"
                     else "half point moved but not every gate passed")


#: a run's half point: inf when it never halves up to the ladder's end, NaN without a curve or without
#: skill at 0 items (never "robust"); one definition, the tables'
_half = half_point


def recalled_skill(r: compare.RunRecord) -> float:
    """Skill on the recalled answers at meta-training's last logged step, against the held-out gate's chance
    (same stream, same labels); NaN when the run did not log them."""
    from strategies.evaluation.metrics import skill

    rows = [row for row in r.meta_history if f"{r.metric}_recalled" in row]
    if not rows or not r.meta_history or rows[-1]["step"] != r.meta_history[-1]["step"]:
        return math.nan
    return skill(r.metric, float(rows[-1][f"{r.metric}_recalled"]), r.gate_chance)


def _longest_budgets(keys: Sequence[str], groups: Dict[str, List[compare.RunRecord]]) -> List[str]:
    """The study's budget rule: of configurations that differ only in ``meta_train.steps`` (a recipe rerun
    at a larger budget because it was still improving), only the longest is read."""
    return compare.longest_budget_keys(keys, groups, STEPS)


def _standards(groups: Dict[str, List[compare.RunRecord]], standard: str) -> List[str]:
    """The configurations matching ``standard``, each at its longest budget: the budget rule holds for the
    standard recipe too (a standard rerun longer is the one read). One key where the pairing is defined."""
    return _longest_budgets(compare.matching_groups(groups, standard), groups)


def _steps(runs: Sequence[compare.RunRecord]) -> float:
    return float(runs[0].params.get(STEPS, 0))


def _awaits(runs: Sequence[compare.RunRecord], rerun_budget: Optional[float], what: str) -> str:
    """Why the budget rule will run ``runs``' configuration again ('' when it will not): it is still
    improving (:func:`experiments.plateau.still_improving`) at fewer steps than the declared rerun budget."""
    if rerun_budget is None or _steps(runs) >= rerun_budget or not plateau.still_improving(runs):
        return ""
    return f"{what} still improving at {_steps(runs):.0f} steps: the budget rule reads its {rerun_budget:.0f}-step rerun"


def _check_budget_pairs(mixer: str, keys: Sequence[str], groups: Dict[str, List[compare.RunRecord]]) -> None:
    """A clear error where two treatments of one mixer differ in the steps and otherwise only in params one
    of them does not log (e.g. a rerun by newer code): the budget rule cannot tell whether one is the
    other's rerun, and the shorter might decide a row the longer replaces."""
    # a param a run does not log has its known absent value where there is one (no retention loss: 0.0)
    params = [{**compare.ABSENT_VALUES, **compare.relevant_params(groups[k][0].params)} for k in keys]
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            a, b = params[i], params[j]
            differ = {k for k in set(a) | set(b)
                      if a.get(k) != b.get(k) and not compare._is_seed_or_bookkeeping(k)}
            one_sided = {k for k in differ if (k in a) != (k in b)}
            if STEPS in differ and one_sided and differ - one_sided == {STEPS}:
                raise ValueError(f"{mixer}: treatments {keys[i]!r} and {keys[j]!r} differ in {STEPS} and in params only "
                                 f"one logs ({', '.join(sorted(one_sided))}): is one the other's rerun? (the budget rule "
                                 "cannot tell; run both by one code version)")


def recipe_rows(records: Sequence[compare.RunRecord], by: str, standard: str, treatment: str,
                kind: str = "other_region", seeds: int = 0, rerun_budget: Optional[float] = None) -> List[RecipeRow]:
    """The rows of the answer: per value of ``by`` (the mixer), every configuration matching ``treatment``
    against the one matching ``standard`` (patterns as :func:`experiments.compare.find_group`), each read
    at its longest budget (the budget rule), Holm over all rows' final-average tests. A mixer without one
    standard or without a treatment has no rows (:func:`answer_table` names it).

    Records go through :func:`compare.deduplicated` first (a run repeated counts once; a configuration run
    by two code versions is two configurations). A row whose pairs join runs of different code versions is
    refused. ``rerun_budget``: the steps the declared budget rule reruns a still-improving configuration at;
    a row whose treatment or standard is still improving below it awaits that rerun (pending)."""
    records, _ = compare.deduplicated(records)
    rows: List[RecipeRow] = []
    mixers = sorted({r.params.get(by) for r in records if r.params.get(by) is not None})
    for mixer in mixers:
        groups = compare.group_records(r for r in records if r.params.get(by) == mixer)
        standards = _standards(groups, standard)
        if len(standards) != 1:
            continue
        treatments = _longest_budgets([k for k in compare.matching_groups(groups, treatment) if k != standards[0]],
                                      groups)
        _check_budget_pairs("+".join(compare._layers(mixer)) or mixer, treatments, groups)
        standard_awaits = _awaits(groups[standards[0]], rerun_budget, "the standard recipe is")
        for key, pairs in pairing.pairs_against(groups, standards[0]):
            if key not in treatments:
                continue
            final = paired_comparison([t.summary.get("final_average", math.nan) for t, _ in pairs],
                                      [s.summary.get("final_average", math.nan) for _, s in pairs])
            versions = sorted({(t.code_version or "not recorded", s.code_version or "not recorded")
                               for t, s in pairs if t.code_version != s.code_version})
            rows.append(RecipeRow(
                mixer="+".join(compare._layers(mixer)) or mixer, treatment=key,
                n_pairs=len(pairs), n_standard=len(groups[standards[0]]),
                recalled_skill=[recalled_skill(t) for t in groups[key]], learned=[t.learned for t in groups[key]],
                halves=[(_half(s, kind), _half(t, kind)) for t, s in pairs], final=final, seeds=seeds,
                params=compare.relevant_params(groups[key][0].params),
                awaits=_awaits(groups[key], rerun_budget, "it is") or standard_awaits,
                refused="; ".join(f"pairs a run of {t} with one of {s} (the same code is needed)" for t, s in versions)))
    _name_treatments(rows, by)
    _adjust(rows)
    return rows


def _adjust(rows: Sequence[RecipeRow]) -> None:
    """Holm over every row of the table (declared: "every (mixer, recipe) row", OVQ's included). A row
    that is read and has no t-test (equal differences, no difference at all, or refused) counts as
    p = 1, so the data cannot shrink the family; a row still to be read (pairs missing, or a rerun the
    budget rule will read instead) has no p yet: the adjustment is made with it at p = 1 (``p_holm``) and
    at p = 0 (``p_holm_low``), and a reading that differs between the two waits for it. A row with pairs
    missing has no p of its own (NaN); a row the budget rule will replace shows what it says so far: its
    p adjusted with every row at its current p (never read as an answer: the row is pending)."""
    def own(row: RecipeRow) -> float:
        return 1.0 if row.refused or math.isnan(row.final.p_t) else row.final.p_t

    low, high = holm_bounds([(own(r), own(r)) if r.decided and not r.awaits else (0.0, 1.0) for r in rows])
    so_far = holm([own(r) for r in rows])
    for row, hi, lo, now in zip(rows, high, low, so_far):
        if row.refused or math.isnan(row.final.p_t) or not row.decided:
            row.p_holm = row.p_holm_low = math.nan
        elif row.awaits:
            row.p_holm = row.p_holm_low = now
        else:
            row.p_holm, row.p_holm_low = hi, lo


def _name_treatments(rows: Sequence[RecipeRow], by: str) -> None:
    """Name each treatment by what tells the treatments apart (e.g. the retention loss), not by all it
    changes against the standard recipe (the study's setup says that); the options of the mixers join
    the name only where two treatments of one mixer would otherwise share one."""
    varying = [k for k in compare._varying([row.params for row in rows]) if k != by]
    for with_options in (False, True):
        keys = [k for k in varying if with_options or compare._mixer_of_option(k) is None]
        for row in rows:
            row.recipe = {k: str(row.params.get(k, compare.ABSENT_VALUES.get(k))) for k in keys
                          if k in row.params or k in compare.ABSENT_VALUES}
            row.treatment = ", ".join(f"{compare._short(k)}={v}" for k, v in row.recipe.items()) or "treatment"
        names = [(row.mixer, row.treatment) for row in rows]
        if len(set(names)) == len(names):
            return


def mixers_without_rows(records: Sequence[compare.RunRecord], by: str, standard: str, treatment: str,
                        rows: Sequence[RecipeRow]) -> Dict[str, str]:
    """{mixer: why it has no row}: no single standard configuration to pair against (none, or several
    left after the budget rule), or no configuration of the treatment."""
    records, _ = compare.deduplicated(records)      # as recipe_rows reads them
    out = {}
    for mixer in sorted({r.params.get(by) for r in records if r.params.get(by) is not None}):
        name = "+".join(compare._layers(mixer)) or mixer
        if any(row.mixer == name for row in rows):
            continue
        groups = compare.group_records(r for r in records if r.params.get(by) == mixer)
        standards = _standards(groups, standard)
        treated = [k for k in compare.matching_groups(groups, treatment) if k not in standards]
        out[name] = (f"{len(standards)} configurations match the standard `{standard}`, not one" if len(standards) != 1
                     else "no run of a treatment yet" if not treated else "no seed shared with the standard")
    return out


def mixer_answers(rows: Sequence[RecipeRow]) -> Dict[str, Tuple[str, str]]:
    """Per mixer: (letter, the treatment that decided it), by the declared "(b) if either treatment gives
    (b), else (a) if either gives (a), else (c)" over what each row can still give
    (:meth:`RecipeRow.possible_letters`). A row that gives (b) decides the mixer at once, whatever the
    others; (a) needs no row that could still give (b), (c) no row that could give (b) or (a). Otherwise
    ('', 'pending') while a row that could change it is pending, else ('?', the undecided row's treatment):
    a row with no t-test that could give the letter in question."""
    out: Dict[str, Tuple[str, str]] = {}
    for mixer in dict.fromkeys(row.mixer for row in rows):
        mine = [(row.possible_letters(), row) for row in rows if row.mixer == mixer]
        for wanted in ("b", "a", "c"):
            sure = next((row.treatment for can, row in mine if can == {wanted}), None)
            if sure is not None:
                out[mixer] = (wanted, sure)
                break
            open_rows = [row for can, row in mine if wanted in can]
            if open_rows:      # some row could still give this letter, and none gives it for sure
                pending = any(not row.answer()[0] for row in open_rows)
                out[mixer] = ("", "pending") if pending else ("?", open_rows[0].treatment)
                break
    return out


def confirm_recipes(rows: Sequence[RecipeRow]) -> Dict[str, Tuple[str, float]]:
    """Per mixer, the treatment its confirmatory re-run uses (study 23, declared before study 17's seeds 1-2
    were read): the one with the highest final average, paired against the same standard, so the largest
    mean difference (higher is better: study 17's endpoint is recall); ties go to the first listed. Only
    mixers whose every row is final (decided, awaiting no rerun, not refused) appear, and a row without a difference (NaN) is never chosen. Every
    mixer is given its own best recipe by the same rule. The rows are study 17's own (seeds 0-2): study
    23's runs, on seeds 3-12, are in another study's records and never choose."""
    out: Dict[str, Tuple[str, float]] = {}
    for mixer in dict.fromkeys(row.mixer for row in rows):
        mine = [row for row in rows if row.mixer == mixer]
        if not mine or not all(row.is_final for row in mine):
            continue
        scored = [row for row in mine if not math.isnan(row.final.mean_difference)]
        if scored:
            best = max(scored, key=lambda row: row.final.mean_difference)     # max keeps the first of equals
            out[mixer] = (best.treatment, best.final.mean_difference)
    return out


def confirm_grid(rows: Sequence[RecipeRow], by: str = "model.layers",
                 recipes: Optional[Dict[str, Tuple[str, float]]] = None, without_rows: Sequence[str] = ()) -> str:
    """The joint grid axis that gives each mixer its confirmatory recipe (:func:`confirm_recipes`), as
    ``ovq-cl sweep`` reads it: ``--grid 'model.layers&KEY&...=[mixer]&VALUE&...;...'``. Its keys are those that
    tell the treatments apart and always ``meta_train.steps`` (a recipe is read at its budget, and a base
    config's default is not the treatment's), each mixer's values its chosen row's own params. '' unless
    every mixer has a recipe (``without_rows``: mixers with records but no row, which have none). What the
    confirmatory study's command is written from, so that no recipe is copied by hand. ``recipes``:
    :func:`confirm_recipes` of ``rows`` where the caller has it already."""
    recipes = confirm_recipes(rows) if recipes is None else recipes
    mixers = list(dict.fromkeys(row.mixer for row in rows))
    if not mixers or without_rows or set(recipes) != set(mixers):
        return ""
    chosen = {m: next(row for row in rows if row.mixer == m and row.treatment == recipes[m][0]) for m in mixers}
    keys = list(dict.fromkeys([k for row in chosen.values() for k in row.recipe] + [STEPS]))

    def value(row, key):
        return row.params.get(key, compare.ABSENT_VALUES.get(key))

    if any(value(row, k) is None for row in chosen.values() for k in keys):
        return ""
    values = ";".join("&".join([f"[{m.replace('+', ',')}]", *(str(value(chosen[m], k)) for k in keys)]) for m in mixers)
    return f"--grid '{'&'.join([by, *keys])}={values}'"


def _halves_cell(halves: Sequence[Tuple[float, float]], ladder_end: str) -> str:
    def f(x):
        return "n/a" if math.isnan(x) else ladder_end if math.isinf(x) else f"{x:.0f}"
    return ", ".join(f"{f(s)}→{f(t)}" for s, t in halves) or "-"


def answer_table(records: Sequence[compare.RunRecord], by: str, standard: str, treatment: str,
                 kind: str = "other_region", unwritten: Sequence[str] = (), seeds: int = 0,
                 rerun_budget: Optional[float] = None) -> str:
    """The declared rule's table (one row per mixer and treatment) and one line per mixer with its answer.

    ``unwritten``: the study's declared sweeps not finished yet. Their runs may be the budget rule's
    longer reruns, which replace rows here, so while any is missing the table says it is provisional and
    so does every recipe line (a recipe read too early would be copied into a declared study)."""
    try:
        rows = recipe_rows(records, by, standard, treatment, kind, seeds, rerun_budget)
    except ValueError as e:
        return f"(no answer: {e})"
    if not rows:
        return ""
    ends = sorted({p["items"] for r in records for p in (r.probe("interference").get("curves") or {}).get(kind, [])})
    ladder_end = f">{ends[-1]}" if ends else "beyond"
    lines = ([f"**Provisional**: declared sweeps not finished yet ({', '.join(unwritten)}): under the budget "
              "rule their longer runs replace rows of this table, so a row, an answer or a recipe below may still "
              "change.", ""] if unwritten else [])
    lines += [f"| mixer | treatment | n pairs | skill on recalled answers (min over seeds) | gates passed | {kind} half "
             "point per seed (standard→treatment) | final average, treatment - standard [95% CI] | p Holm | answer |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        skills = [s for s in row.recalled_skill if not math.isnan(s)]
        skill_cell = f"{min(skills):.2f}" if skills else "not logged"
        c = row.final
        final = ("-" if c.n == 0 else f"{c.mean_difference:+.3f}" +
                 (f" [{c.low:+.3f}, {c.high:+.3f}]" if c.n >= 2 else " (one pair)"))
        letter, reason = row.answer()
        lines.append(f"| {row.mixer} | {row.treatment} | {row.n_pairs} | {skill_cell} | "
                     f"{sum(f is True for f in row.learned)}/{len(row.learned)} | {_halves_cell(row.halves, ladder_end)} | "
                     f"{final} | {compare._p(row.p_holm)} | {ANSWERS.get(letter, '')} {reason} |")
    lines.append("")
    recipes = confirm_recipes(rows)
    for mixer, (letter, where) in mixer_answers(rows).items():
        recipe = (f"; {'provisional ' if unwritten else ''}recipe for the confirmatory re-run: {recipes[mixer][0]} (final average "
                  f"{recipes[mixer][1]:+.3f} over the standard)" if mixer in recipes else "")
        said = ("pending" if not letter else f"undecided (no t-test for {where})" if letter == "?" else
                f"{ANSWERS[letter]} ({'so far from' if unwritten and letter != 'b' else 'decided by'} {where})")
        lines.append(f"- **{mixer}**: " + said + recipe)
    without_rows = mixers_without_rows(records, by, standard, treatment, rows)
    for mixer, why in without_rows.items():
        lines.append(f"- **{mixer}**: no answer: {why}")
    grid = confirm_grid(rows, by, recipes, list(without_rows))
    if grid:
        lines += ["", f"{'Provisional grid' if unwritten else 'Grid'} for the confirmatory re-run, by this rule: `{grid}`"]
    return "\n".join(lines)


def render(ctx, within: str, baseline: str, treatment: str, seeds: int, rerun_budget: Optional[float] = None) -> List[str]:
    """The section's declared answer: per value of ``within`` (a mixer), each configuration matching
    ``treatment`` against ``baseline``, paired over seeds, Holm over the rows (:func:`answer_table`); a row
    waits for the sweeps still to run that make configurations it reads, and for the reruns at
    ``rerun_budget`` the budget rule asked for."""
    from experiments.report import unfinished_sweeps

    # only sweeps that run configurations the answer reads hold it (not, e.g., probes at other budgets)
    unwritten = unfinished_sweeps(ctx.spec, ctx.root, [baseline, treatment])
    table = answer_table(ctx.records, within, baseline, treatment, unwritten=unwritten, seeds=seeds,
                         rerun_budget=rerun_budget)
    return ["The declared answer (`training_or_rule`, applied by `experiments/studies/why_forget/analysis.py`: per "
            f"mixer, each configuration matching `{treatment}` against `{baseline}`, paired over seeds, "
            "Holm over the rows):", "", table or "(no pairs yet)", ""]


SECTIONS = {"horizon_answer": render}
