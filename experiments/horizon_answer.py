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
neither the half point moved nor the final average rose; **(c)** otherwise, with the reason; **undecided**
when every pair's final average differs by the same amount (no t-test can be made, so neither "not
below" nor "did not rise" is known). A mixer's
answer is (b) if some treatment gives (b), else (a) if some gives (a), else (c). A row is decided only
when every replicate of the standard has its treatment pair ("pending" before). The budget rule: a
treatment rerun with more meta-training steps (it was "still improving") replaces the shorter one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from experiments import compare
from experiments.intervals import holm, paired_comparison

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
    p_holm: float = math.nan
    recipe: Dict[str, str] = field(default_factory=dict)   # what tells the treatments apart: {full key: value}

    @property
    def decided(self) -> bool:
        # every standard replicate has its pair, and at least the declared seeds (a standard whose own
        # seeds are not all in yet must not decide a row with fewer pairs than declared)
        return self.n_pairs >= max(2, self.seeds) and self.n_pairs == self.n_standard

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
    def half_moved(self) -> bool:
        # a pair where neither recipe halves within the ladder says nothing about moving beyond
        said = [(s, t) for s, t in self.halves if not (math.isinf(s) and math.isinf(t))]
        return bool(said) and all(t > s for s, t in said)

    @property
    def half_still(self) -> bool:
        return bool(self.halves) and all(t <= s for s, t in self.halves)

    @property
    def final_direction(self) -> str:
        if self.final.n >= 2 and math.isnan(self.final.p_t) and self.final.mean_difference != 0:
            return "no t-test"          # every pair differs by the same amount (paired_comparison makes none)
        if self.final.n < 2 or math.isnan(self.p_holm) or self.p_holm >= ALPHA:
            return "no difference"
        return "above" if self.final.mean_difference > 0 else "below"

    def answer(self) -> Tuple[str, str]:
        """(letter, reason); letter '' while pending."""
        if not self.decided:
            return "", f"pending ({self.n_pairs} of {max(self.n_standard, self.seeds)} pairs)"
        if self.nothing_to_move:
            return "c", "the standard recipe never halves within the ladder: nothing to move"
        if self.final_direction == "no t-test":
            # "not below" / "did not rise" are what the declared test says; with no test neither is known
            return "?", ("undecided: every pair's final average differs by the same amount "
                         f"({self.final.mean_difference:+.3f}), so the declared t-test cannot be made")
        if self.passes_gates and self.half_moved and self.final_direction != "below":
            return "b", "passes its gates, half point moved on every seed, final average not below"
        if self.learns_long_task and self.half_still and self.final_direction != "above":
            return "a", "learns the long task; neither the half point nor the final average moved"
        if not self.learns_long_task:
            return "c", "does not learn the long task within the budget: rule and training not separated"
        if not (self.half_moved or self.half_still):
            return "c", "the half point moved on some seeds only"
        if self.half_still:
            return "c", "the final average rose without the half point moving"
        return "c", ("half point moved but the final average fell" if self.final_direction == "below"
                     else "half point moved but not every gate passed")


#: a run's half point: inf when it never halves up to the ladder's end, NaN without a curve or without
#: skill at 0 items (never "robust"); one definition, the tables'
_half = compare.half_point


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


def recipe_rows(records: Sequence[compare.RunRecord], by: str, standard: str, treatment: str,
                kind: str = "other_region", seeds: int = 0) -> List[RecipeRow]:
    """The rows of the answer: per value of ``by`` (the mixer), every configuration matching ``treatment``
    against the one matching ``standard`` (patterns as :func:`experiments.compare.find_group`), each read
    at its longest budget (the budget rule), Holm over all rows' final-average tests. A mixer without one
    standard or without a treatment has no rows (:func:`answer_table` names it)."""
    rows: List[RecipeRow] = []
    treatment_params: List[Dict[str, str]] = []
    mixers = sorted({r.params.get(by) for r in records if r.params.get(by) is not None})
    for mixer in mixers:
        groups = compare.group_records(r for r in records if r.params.get(by) == mixer)
        standards = _standards(groups, standard)
        if len(standards) != 1:
            continue
        treatments = set(_longest_budgets([k for k in compare.matching_groups(groups, treatment) if k != standards[0]],
                                          groups))
        for key, pairs in compare._pairs_against(groups, standards[0]):
            if key not in treatments:
                continue
            final = paired_comparison([t.summary.get("final_average", math.nan) for t, _ in pairs],
                                      [s.summary.get("final_average", math.nan) for _, s in pairs])
            halves = [(_half(s, kind), _half(t, kind)) for t, s in pairs]
            rows.append(RecipeRow(
                mixer="+".join(compare._layers(mixer)) or mixer, treatment=key,
                n_pairs=len(pairs), n_standard=len(groups[standards[0]]),
                recalled_skill=[recalled_skill(t) for t in groups[key]], learned=[t.learned for t in groups[key]],
                halves=[h for h in halves if not any(math.isnan(x) for x in h)], final=final, seeds=seeds))
            treatment_params.append(compare.relevant_params(groups[key][0].params))
    # name each treatment by what tells the treatments apart (e.g. the retention loss), not by all it
    # changes against the standard recipe (the study's setup says that)
    keys = [k for k in compare._varying(treatment_params) if k != by and compare._mixer_of_option(k) is None]
    for row, params in zip(rows, treatment_params):
        row.recipe = {k: str(params.get(k, compare.ABSENT_VALUES.get(k))) for k in keys
                      if k in params or k in compare.ABSENT_VALUES}
        row.treatment = ", ".join(f"{compare._short(k)}={v}" for k, v in row.recipe.items()) or "treatment"
    tested = [i for i, row in enumerate(rows) if row.final.n >= 2 and not math.isnan(row.final.p_t)]
    for i, p in zip(tested, holm([rows[i].final.p_t for i in tested])):
        rows[i].p_holm = p
    return rows


def mixers_without_rows(records: Sequence[compare.RunRecord], by: str, standard: str, treatment: str,
                        rows: Sequence[RecipeRow]) -> Dict[str, str]:
    """{mixer: why it has no row}: no single standard configuration to pair against (none, or several
    left after the budget rule), or no configuration of the treatment."""
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
    """Per mixer: (letter, the treatment that decided it). A decided (b) row decides the mixer at once (no
    other row can undo "(b) if either treatment gives (b)"); otherwise ('', ...) while any of its rows is
    pending, and ('?', ...) when some row is undecided (no t-test), since that row might give (b) or (a)."""
    out: Dict[str, Tuple[str, str]] = {}
    for mixer in dict.fromkeys(row.mixer for row in rows):
        mine = [row for row in rows if row.mixer == mixer]
        letters = [(row.answer()[0], row.treatment) for row in mine]
        first_b = next((t for letter, t in letters if letter == "b"), None)
        if first_b is not None:
            out[mixer] = ("b", first_b)
            continue
        if any(not letter for letter, _ in letters):
            out[mixer] = ("", "pending")
            continue
        undecided = next((t for letter, t in letters if letter == "?"), None)
        if undecided is not None:
            out[mixer] = ("?", undecided)
            continue
        for wanted in ("b", "a", "c"):
            hit = next((t for letter, t in letters if letter == wanted), None)
            if hit is not None:
                out[mixer] = (wanted, hit)
                break
    return out


def confirm_recipes(rows: Sequence[RecipeRow]) -> Dict[str, Tuple[str, float]]:
    """Per mixer, the treatment its confirmatory re-run uses (study 23, declared before study 17's seeds 1-2
    were read): the one with the highest final average, paired against the same standard, so the largest
    mean difference (higher is better: study 17's endpoint is recall); ties go to the first listed. Only
    mixers whose every row is decided appear, and a row without a difference (NaN) is never chosen. Every
    mixer is given its own best recipe by the same rule. The rows are study 17's own (seeds 0-2): study
    23's runs, on seeds 3-12, are in another study's records and never choose."""
    out: Dict[str, Tuple[str, float]] = {}
    for mixer in dict.fromkeys(row.mixer for row in rows):
        mine = [row for row in rows if row.mixer == mixer]
        if not mine or not all(row.decided for row in mine):
            continue
        scored = [row for row in mine if not math.isnan(row.final.mean_difference)]
        if scored:
            best = max(scored, key=lambda row: row.final.mean_difference)     # max keeps the first of equals
            out[mixer] = (best.treatment, best.final.mean_difference)
    return out


def confirm_grid(rows: Sequence[RecipeRow], by: str = "model.layers",
                 recipes: Optional[Dict[str, Tuple[str, float]]] = None) -> str:
    """The joint grid axis that gives each mixer its confirmatory recipe (:func:`confirm_recipes`), as
    ``ovq-cl sweep`` reads it: ``--grid 'model.layers&KEY&...=[mixer]&VALUE&...;...'``; '' unless every mixer
    with rows has a recipe and the recipes set the same keys. What the confirmatory study's command is
    written from, so that no recipe is copied by hand. ``recipes``: :func:`confirm_recipes` of ``rows``
    where the caller has it already."""
    recipes = confirm_recipes(rows) if recipes is None else recipes
    mixers = list(dict.fromkeys(row.mixer for row in rows))
    if not mixers or set(recipes) != set(mixers):
        return ""
    chosen = {m: next(row.recipe for row in rows if row.mixer == m and row.treatment == recipes[m][0]) for m in mixers}
    keys = list(next(iter(chosen.values())))
    if not keys or any(list(recipe) != keys for recipe in chosen.values()):
        return ""
    values = ";".join("&".join([f"[{m.replace('+', ',')}]", *(chosen[m][k] for k in keys)]) for m in mixers)
    return f"--grid '{'&'.join([by, *keys])}={values}'"


def _halves_cell(halves: Sequence[Tuple[float, float]], ladder_end: str) -> str:
    def f(x):
        return ladder_end if math.isinf(x) else f"{x:.0f}"
    return ", ".join(f"{f(s)}→{f(t)}" for s, t in halves) or "-"


def answer_table(records: Sequence[compare.RunRecord], by: str, standard: str, treatment: str,
                 kind: str = "other_region", unwritten: Sequence[str] = (), seeds: int = 0) -> str:
    """The declared rule's table (one row per mixer and treatment) and one line per mixer with its answer.

    ``unwritten``: the study's declared sweeps not finished yet. Their runs may be the budget rule's
    longer reruns, which replace rows here, so while any is missing the table says it is provisional and
    so does every recipe line (a recipe read too early would be copied into a declared study)."""
    rows = recipe_rows(records, by, standard, treatment, kind, seeds)
    if not rows:
        return ""
    ends = sorted({p["items"] for r in records for p in ((r.interference or {}).get("curves") or {}).get(kind, [])})
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
    for mixer, why in mixers_without_rows(records, by, standard, treatment, rows).items():
        lines.append(f"- **{mixer}**: no answer: {why}")
    grid = confirm_grid(rows, by, recipes)
    if grid:
        lines += ["", f"{'Provisional grid' if unwritten else 'Grid'} for the confirmatory re-run, by this rule: `{grid}`"]
    return "\n".join(lines)
