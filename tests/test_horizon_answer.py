"""Study 17's declared answer rule (experiments/horizon_answer.py): known answers on hand-made records."""
import json
import math
import shutil

import pytest

from experiments import compare, sections, study_specs
from experiments.studies.why_forget import analysis as horizon_answer
from experiments.stats.multiple import holm

STANDARD = "* | stream.options.meta_sequence_episodes=4"
LONG = "* | stream.options.meta_sequence_episodes=32"


def _record(mixer, episodes, seed, final, half, recalled=0.9, learned=True, chance=0.0):
    """One run: ``episodes`` 4 is the standard recipe, 32 the long one; ``half`` None = never halves."""
    curve = [{"items": n, "score": 1.0, "se": 0.0, "n": 8} for n in (0, 256)]
    return compare.RunRecord(
        label=f"{mixer}-{episodes}-s{seed}", metric="accuracy", summary={"final_average": final},
        params={"model.layers": f"['{mixer}']", "stream.options.meta_sequence_episodes": str(episodes),
                "model.state_budget": "67840", "meta_train.steps": "400" if episodes == 4 else "1000"},
        seed=seed, data_seed=seed, learned=learned, gate_chance=chance,
        probes={"interference": {"curves": {"other_region": curve}, "half_items": {"other_region": half}}},
        meta_history=[{"step": 500, "accuracy": 0.5, "accuracy_recalled": 0.1},
                      {"step": 1000, "accuracy": 0.95, "accuracy_recalled": recalled}])


def _pairs(mixer, standard, long, **kw):
    """Three seeds: ``standard`` and ``long`` are per-seed (final, half) tuples."""
    return ([_record(mixer, 4, s, f, h) for s, (f, h) in enumerate(standard)]
            + [_record(mixer, 32, s, f, h, **kw) for s, (f, h) in enumerate(long)])


def _answers(records):
    rows = horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)
    return {row.mixer: row.answer() for row in rows}, horizon_answer.mixer_answers(rows)


def test_trained_for_the_horizon_is_b_the_rule_is_a_and_not_learning_the_long_task_is_c():
    records = (
        # half point moves on every seed and the final average rises: (b)
        _pairs("delta", [(0.40, 32), (0.35, 64), (0.38, 16)], [(0.70, 128), (0.72, None), (0.69, 64)])
        # learns the long task, nothing moves: (a)
        + _pairs("ssm", [(0.30, 16), (0.32, 16), (0.31, 32)], [(0.31, 16), (0.30, 8), (0.32, 32)])
        # does not learn the long task (recalled skill 0.2): (c), whatever else
        + _pairs("linear", [(0.60, 64), (0.61, 64), (0.62, 64)], [(0.60, 64), (0.61, 32), (0.60, 64)], recalled=0.2)
        # never halves under the standard recipe: nothing to move, (c)
        + _pairs("ovq", [(0.65, None)] * 3, [(0.66, None)] * 3))
    rows, mixers = _answers(records)
    assert rows["delta"][0] == "b" and mixers["delta"][0] == "b"
    assert rows["ssm"][0] == "a"
    assert rows["linear"] == ("c", "does not learn the long task within the budget: rule and training not separated")
    assert rows["ovq"][0] == "c" and "nothing to move" in rows["ovq"][1]


def test_the_recalled_skill_is_against_the_gates_chance():
    """0.55 accuracy on recalled answers is skill 0.4375 against chance 0.2: below 0.5, not learned."""
    records = _pairs("ssm", [(0.3, 16)] * 3, [(0.3, 16)] * 3, recalled=0.55, chance=0.2)
    rows = horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)
    assert rows[0].recalled_skill == [pytest.approx(0.4375)] * 3
    assert rows[0].answer()[0] == "c"
    records = _pairs("ssm", [(0.3, 16)] * 3, [(0.3, 16)] * 3, recalled=0.65, chance=0.2)
    assert horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)[0].answer()[0] == "a"


def test_a_half_point_that_moves_while_the_final_average_falls_or_moves_on_some_seeds_only_is_c():
    fell = _pairs("delta", [(0.60, 16), (0.61, 32), (0.62, 16)], [(0.30, 64), (0.32, 64), (0.29, 128)])
    some = _pairs("ssm", [(0.30, 16), (0.32, 16), (0.31, 32)], [(0.31, 64), (0.30, 8), (0.32, 32)])
    rows, _ = _answers(fell + some)
    assert rows["delta"] == ("c", "half point moved but the final average fell")
    assert rows["ssm"] == ("c", "the half point moved on some seeds only")


def test_a_seed_where_neither_recipe_halves_says_nothing_about_moving():
    records = _pairs("delta", [(0.40, 32), (0.41, None), (0.39, 16)], [(0.70, 128), (0.72, None), (0.69, 64)])
    rows, _ = _answers(records)
    assert rows["delta"][0] == "b"
    worse = _pairs("delta", [(0.40, 32), (0.41, None), (0.39, 16)], [(0.70, 128), (0.72, 64), (0.69, 64)])
    assert _answers(worse)[0]["delta"] == ("c", "the half point moved on some seeds only")


def test_holm_over_the_rows_decides_what_counts_as_a_change():
    """A rise with raw p ~0.03 is a change alone (answer c: it rose without the half point moving) and no
    change once adjusted over four rows (answer a)."""
    rise = [(0.3 + d, 16) for d in (0.05, 0.10, 0.08)]
    alone = horizon_answer.recipe_rows(_pairs("ssm", [(0.3, 16)] * 3, rise), "model.layers", STANDARD, LONG)
    assert 0.02 < alone[0].final.p_t < 0.05 and alone[0].p_holm == alone[0].final.p_t
    assert alone[0].final_direction == "above" and alone[0].answer()[0] == "c"
    noisy = sum((_pairs(m, [(0.3, 16)] * 3, [(0.3 + d, 16) for d in (0.02, -0.01, 0.03)])
                 for m in ("a1", "a2", "a3")), [])
    together = horizon_answer.recipe_rows(_pairs("ssm", [(0.3, 16)] * 3, rise) + noisy, "model.layers", STANDARD, LONG)
    assert [r.p_holm for r in together] == pytest.approx(holm([r.final.p_t for r in together]))
    ssm = next(r for r in together if r.mixer == "ssm")
    assert ssm.p_holm == pytest.approx(4 * ssm.final.p_t)
    assert ssm.final_direction == "no difference" and ssm.answer()[0] == "a"


def test_a_decided_b_row_decides_the_mixer_while_another_row_is_pending():
    """(b) if either treatment gives (b): a pending row cannot undo it; (a) or (c) must wait for every row."""
    records = _pairs("delta", [(0.40, 32), (0.35, 64), (0.38, 16)], [(0.70, 128), (0.72, None), (0.69, 64)])
    rerun = _record("delta", 32, 0, 0.9, None)
    rerun.params["meta_train.retention_loss"] = "1.0"               # one seed of another treatment so far
    rows = horizon_answer.recipe_rows(records + [rerun], "model.layers", STANDARD, LONG)
    assert sorted(r.answer()[0] for r in rows) == ["", "b"]
    assert horizon_answer.mixer_answers(rows)["delta"] == ("b", "meta_train.retention_loss=0.0")
    still = _pairs("ssm", [(0.30, 16), (0.32, 16), (0.31, 32)], [(0.31, 16), (0.30, 8), (0.32, 32)])   # (a)
    other = _record("ssm", 32, 0, 0.9, 16)
    other.params["meta_train.retention_loss"] = "1.0"
    rows = horizon_answer.recipe_rows(still + [other], "model.layers", STANDARD, LONG)
    assert horizon_answer.mixer_answers(rows)["ssm"] == ("", "pending")


def test_a_row_is_pending_until_every_standard_seed_has_its_pair():
    records = _pairs("delta", [(0.4, 32)] * 3, [(0.7, 128), (0.72, None)])
    rows, mixers = _answers(records)
    assert rows["delta"] == ("", "pending (2 of 3 pairs)") and mixers["delta"] == ("", "pending")
    table = horizon_answer.answer_table(records, "model.layers", STANDARD, LONG)
    assert "32→128, 32→>256" in table and "- **delta**: pending" in table
    assert horizon_answer.confirm_recipes(horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)) == {}
    assert "confirmatory re-run" not in table


def test_a_mixer_is_b_when_either_treatment_is_b():
    # as records are read: retention_loss 0.0 is dropped (compare.ABSENT_VALUES), 1.0 kept
    records = _pairs("delta", [(0.4, 32), (0.41, 32), (0.39, 16)], [(0.4, 32), (0.41, 16), (0.4, 16)])
    for s, (f, h) in enumerate([(0.7, 128), (0.72, None), (0.69, 64)]):
        r = _record("delta", 32, s, f, h)
        r.params["meta_train.retention_loss"] = "1.0"
        records.append(r)
    rows = horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)
    assert sorted(r.answer()[0] for r in rows) == ["a", "b"]
    assert sorted(r.treatment for r in rows) == ["meta_train.retention_loss=0.0", "meta_train.retention_loss=1.0"]
    letter, where = horizon_answer.mixer_answers(rows)["delta"]
    assert letter == "b" and "retention_loss=1.0" in where
    # the confirmatory re-run takes the recipe with the higher final average (here the retention loss, +0.30)
    recipe, gain = horizon_answer.confirm_recipes(rows)["delta"]
    assert recipe == "meta_train.retention_loss=1.0" and gain == pytest.approx(0.3033, abs=1e-3)
    assert "recipe for the confirmatory re-run: meta_train.retention_loss=1.0" in horizon_answer.answer_table(
        records, "model.layers", STANDARD, LONG)


def test_a_treatment_rerun_at_a_larger_budget_replaces_the_shorter_one():
    """The budget rule: 2,000 steps (it was still improving) is the one read, not both."""
    records = _pairs("delta", [(0.4, 32)] * 3, [(0.4, 32)] * 3)
    for r in records:
        r.params["meta_train.steps"] = "400" if r.params["stream.options.meta_sequence_episodes"] == "4" else "1000"
    for s, (f, h) in enumerate([(0.7, 128), (0.72, None), (0.69, 64)]):
        r = _record("delta", 32, s, f, h)
        r.params["meta_train.steps"] = "2000"
        records.append(r)
    rows = horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)
    assert len(rows) == 1 and rows[0].answer()[0] == "b" and rows[0].final.mean_difference > 0.2


def test_an_answer_rule_is_checked_when_the_study_is_read(tmp_path):
    """The rule is study 17's own renderer: another study does not have it, and its options are checked."""
    (tmp_path / "x.yaml").write_text("title: x\nsections: [horizon_answer]\n")
    with pytest.raises(ValueError, match="no section renderer 'horizon_answer'"):
        study_specs.load_study(str(tmp_path / "x.yaml"))
    folder = tmp_path / "y"
    folder.mkdir()
    shutil.copy(horizon_answer.__file__, folder / "analysis.py")
    (folder / "study.yaml").write_text("title: y\nsections: [{horizon_answer: {within: model.layers}}]\n")
    with pytest.raises(ValueError, match="section 'horizon_answer': missing option\\(s\\) \\['baseline', 'treatment', 'seeds'\\]"):
        study_specs.load_study(str(folder / "study.yaml"))


def test_the_study_declares_the_rule_it_applies():
    spec = study_specs.load_study("why_forget")
    [(render, options)] = [(r, o) for r, o in sections.study_sections(spec) if r is horizon_answer.render]
    assert "meta_sequence_episodes=32" in options["treatment"] and options["seeds"] == 3
    assert options["rerun_budget"] == 2000


def test_a_standard_rerun_at_a_larger_budget_is_the_one_paired_against_and_no_mixer_vanishes():
    """The budget rule holds for the standard recipe too (it was still improving at 400 steps): its
    2,000-step rerun is the baseline of the pairs; a mixer left with no single standard is named, not dropped."""
    records = _pairs("ssm", [(0.2, 16)] * 3, [(0.8, 256), (0.82, 256), (0.85, 256)])
    for r in records:
        r.params["meta_train.steps"] = "400" if r.params["stream.options.meta_sequence_episodes"] == "4" else "1000"
    for s, final in enumerate([0.5, 0.52, 0.49]):
        r = _record("ssm", 4, s, final, 32)
        r.params["meta_train.steps"] = "2000"
        records.append(r)
    rows = horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)
    assert len(rows) == 1 and rows[0].final.mean_difference == pytest.approx((0.8 + 0.82 + 0.85 - 0.5 - 0.52 - 0.49) / 3)
    assert rows[0].halves == [(32, 256)] * 3                       # the 2,000-step standard's half points
    # two standards that differ in more than the budget: neither is the baseline, and the table says so
    odd = _record("ssm", 4, 0, 0.3, 16)
    odd.params["model.state_budget"] = "16960"
    table = horizon_answer.answer_table(records + [odd] + _pairs("delta", [(0.4, 32)] * 3, [(0.7, None)] * 3),
                                        "model.layers", STANDARD, LONG)
    assert "- **ssm**: no answer: 2 configurations match the standard" in table
    assert "| delta |" in table


def test_while_a_declared_rerun_is_unwritten_the_answer_and_its_recipes_are_provisional():
    records = _pairs("delta", [(0.4, 32)] * 3, [(0.7, None), (0.72, None), (0.75, None)])
    final = horizon_answer.answer_table(records, "model.layers", STANDARD, LONG)
    assert "Provisional" not in final and "; recipe for the confirmatory re-run: " in final
    early = horizon_answer.answer_table(records, "model.layers", STANDARD, LONG, unwritten=["results/longer.json"])
    assert early.startswith("**Provisional**: declared sweeps not finished yet (results/longer.json)")
    assert "; provisional recipe for the confirmatory re-run: " in early
    # the rows themselves are the same: only what they may become is said
    # a (b) stays "decided by" (no rerun can undo it); only the recipe may still change
    assert early.split("\n", 2)[2] == final.replace("; recipe", "; provisional recipe").replace(
        "\nGrid for", "\nProvisional grid for")


def test_a_sweep_is_unfinished_until_its_file_holds_every_run_of_its_grid(tmp_path):
    from experiments import report

    class Spec:
        commands = ["ovq-cl sweep c.yaml --grid 'seed=0;1;2' --grid 'model.layers=[delta];[ovq]' --name longer --out results",
                    "ovq-cl sweep c.yaml meta_train.steps=2000 --name one --out results"]
        results = ["results/longer.json", "results/one.json"]

    def records(*ids, version="code-a"):
        return json.dumps([{"config_id": i, "code_version": version} for i in ids])

    (tmp_path / "results").mkdir()
    assert report.unfinished_sweeps(Spec, str(tmp_path)) == ["results/longer.json (0 of 6 runs)", "results/one.json (0 of 1 runs)"]
    (tmp_path / "results" / "longer.json").write_text(records("a", "b"))
    (tmp_path / "results" / "one.json").write_text(records("y"))
    assert report.unfinished_sweeps(Spec, str(tmp_path)) == ["results/longer.json (2 of 6 runs)"]
    # a record merged twice is one run; runs of another code version do not finish the sweep
    (tmp_path / "results" / "longer.json").write_text(records("a", "b", "c", "d", "e", "e"))
    assert report.unfinished_sweeps(Spec, str(tmp_path)) == ["results/longer.json (5 of 6 runs)"]
    mixed = json.loads(records("a", "b", "c")) + json.loads(records("d", "e", "f", version="code-b"))
    (tmp_path / "results" / "longer.json").write_text(json.dumps(mixed))
    assert report.unfinished_sweeps(Spec, str(tmp_path)) == ["results/longer.json (3 of 6 runs)"]
    (tmp_path / "results" / "longer.json").write_text(records(*"abcdef"))
    assert report.unfinished_sweeps(Spec, str(tmp_path)) == []


def test_a_sweep_is_read_as_the_cli_reads_it_and_every_declared_file_is_checked(tmp_path):
    from experiments import report

    class Spec:
        # '--grid=...' and the default --name (sweep) and --out (outputs/sweeps), as argparse reads them
        commands = ["ovq-cl sweep c.yaml --grid=seed=0;1;2 --name=b --out=results", "ovq-cl sweep c.yaml"]
        results = ["results/b.json", "results/elsewhere.json"]
    (tmp_path / "results").mkdir()
    assert report.unfinished_sweeps(Spec, str(tmp_path)) == [
        "results/b.json (0 of 3 runs)", "outputs/sweeps/sweep.json (0 of 1 runs)", "results/elsewhere.json (not written)"]
    (tmp_path / "results" / "b.json").write_text("[{")
    assert report.unfinished_sweeps(Spec, str(tmp_path))[0] == "results/b.json (unreadable: JSONDecodeError)"


def test_only_sweeps_that_run_what_a_table_reads_hold_it(tmp_path):
    """With patterns, a sweep counts only if one of its runs matches them (a probe at another budget does
    not hold study 17's answer); a sweep whose runs cannot be expanded here counts."""
    import os

    from experiments import report
    config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "configs",
                          "icr_budget.yaml")

    class Spec:
        commands = [f"ovq-cl sweep {config} --grid 'model.state_budget=16960;271360' --grid 'seed=0;1' --name probes --out results",
                    f"ovq-cl sweep {config} model.state_budget=67840 stream.options.meta_sequence_episodes=32 "
                    "--grid 'seed=0;1' --name long --out results",
                    "ovq-cl sweep missing.yaml --name elsewhere --out results"]
        results = ["results/probes.json", "results/long.json", "results/elsewhere.json"]
    (tmp_path / "results").mkdir()
    everything = ["results/probes.json (0 of 4 runs)", "results/long.json (0 of 2 runs)", "results/elsewhere.json (0 of 1 runs)"]
    assert report.unfinished_sweeps(Spec, str(tmp_path)) == everything
    assert report.unfinished_sweeps(Spec, str(tmp_path), ["* | stream.options.meta_sequence_episodes=32"]) == everything[1:]
    assert report.unfinished_sweeps(Spec, str(tmp_path), ["* | model.state_budget=16960"]) == everything[::2]


def test_a_final_average_that_moves_by_the_same_amount_on_every_seed_is_undecided():
    """Equal differences on every pair have no t-test: the declared "not below" / "did not rise" is unknown,
    so the row is neither (b) nor (a), and the mixer is undecided unless another treatment gives (b)."""
    fell = _pairs("delta", [(0.5, 16), (0.6, 32), (0.55, 16)], [(0.375, 64), (0.475, 64), (0.425, 128)])
    rose = _pairs("ssm", [(0.25, 16), (0.5, 16), (0.375, 32)], [(0.375, 16), (0.625, 16), (0.5, 32)])
    rows, mixers = _answers(fell + rose)
    assert rows["delta"][0] == "?" and "-0.125" in rows["delta"][1] and mixers["delta"][0] == "?"
    assert rows["ssm"][0] == "?" and mixers["ssm"][0] == "?"
    table = horizon_answer.answer_table(fell + rose, "model.layers", STANDARD, LONG)
    assert "- **delta**: undecided (no t-test for" in table
    # a (b) from another treatment still decides the mixer
    for s, (f, h) in enumerate([(0.7, 128), (0.72, None), (0.69, 64)]):
        r = _record("delta", 32, s, f, h)
        r.params["meta_train.retention_loss"] = "1.0"
        fell.append(r)
    assert horizon_answer.mixer_answers(horizon_answer.recipe_rows(fell, "model.layers", STANDARD, LONG))["delta"][0] == "b"


def test_the_confirmatory_grid_is_written_from_the_recipes_not_by_hand():
    """Each mixer's recipe (the treatment with the higher final average) as one joint grid axis."""
    records = []
    for mixer, (plain, retained) in {"delta": (0.5, 0.7), "ssm": (0.6, 0.4)}.items():
        records += _pairs(mixer, [(0.3, 32), (0.31, 32), (0.29, 16)], [(plain + d, None) for d in (0.0, 0.01, -0.01)])
        for s, d in enumerate((0.0, 0.02, -0.01)):
            r = _record(mixer, 32, s, retained + d, None)
            r.params["meta_train.retention_loss"] = "1.0"
            records.append(r)
    rows = horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)
    grid = horizon_answer.confirm_grid(rows)
    # the steps always (a recipe is read at its budget; the study's base config would set its own)
    assert grid == "--grid 'model.layers&meta_train.retention_loss&meta_train.steps=[delta]&1.0&1000;[ssm]&0.0&1000'"
    from experiments.sweep import parse_grid
    assert parse_grid([grid.split(" ", 1)[1].strip("'")]) == {                 # as the sweep command reads it
        "model.layers&meta_train.retention_loss&meta_train.steps": ["[delta]&1.0&1000", "[ssm]&0.0&1000"]}
    table = horizon_answer.answer_table(records, "model.layers", STANDARD, LONG)
    assert table.endswith(f"Grid for the confirmatory re-run, by this rule: `{grid}`")
    early = horizon_answer.answer_table(records, "model.layers", STANDARD, LONG, unwritten=["results/x.json (0 of 3 runs)"])
    assert early.endswith(f"Provisional grid for the confirmatory re-run, by this rule: `{grid}`")
    # a mixer still without a recipe (pending rows): no grid
    assert horizon_answer.confirm_grid(horizon_answer.recipe_rows(records[:-1], "model.layers", STANDARD, LONG)) == ""


def test_a_row_waits_for_the_declared_seeds_even_when_the_standard_has_fewer():
    """Two standard seeds with their pairs are not a decision when three are declared."""
    records = _pairs("delta", [(0.40, 32), (0.35, 64)], [(0.70, 128), (0.72, None)])
    assert horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)[0].answer()[0] == "b"
    row = horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG, seeds=3)[0]
    assert row.answer() == ("", "pending (2 of 3 pairs)")


def _history(records, values, steps=(500, 750, 1000)):
    """Give ``records`` a meta-training curve through ``values`` at ``steps`` (the last ``steps`` is theirs)."""
    for r in records:
        r.meta_history = [{"step": st, "accuracy": v, "accuracy_recalled": 0.9} for st, v in zip(steps, values)]
    return records


def test_a_row_the_budget_rule_will_replace_is_pending_and_gives_no_answer_or_recipe():
    """A treatment still improving below the declared rerun budget awaits its rerun: its (b) is 'so far',
    never the mixer's answer nor a recipe; once the rerun is in, the rerun is the row read."""
    standard = _history(_pairs("delta", [(0.40, 32), (0.35, 64), (0.38, 16)], [])[:3], (1.0, 1.0, 1.0))
    improving = _history([_record("delta", 32, s, f, h) for s, (f, h) in enumerate([(0.7, 128), (0.72, None), (0.69, 64)])],
                         (0.5, 0.80, 0.95))        # +0.15 over the last quarter: still improving
    rows = horizon_answer.recipe_rows(standard + improving, "model.layers", STANDARD, LONG, rerun_budget=2000)
    assert rows[0].answer() == ("", "pending: it is still improving at 1000 steps: the budget rule reads its "
                                    "2000-step rerun (so far (b) how it was trained)")
    assert horizon_answer.mixer_answers(rows)["delta"] == ("", "pending")
    assert horizon_answer.confirm_recipes(rows) == {} and horizon_answer.confirm_grid(rows) == ""
    # without a declared rerun budget the same row decides, as before
    assert horizon_answer.recipe_rows(standard + improving, "model.layers", STANDARD, LONG)[0].answer()[0] == "b"
    # the rerun at 2,000 steps (at its plateau, or still improving: the rule reruns once) replaces it
    rerun = _history([_record("delta", 32, s, f, h) for s, (f, h) in enumerate([(0.8, None), (0.75, None), (0.7, 128)])],
                     (0.9, 0.95, 0.99), steps=(1000, 1500, 2000))
    for r in rerun:
        r.params["meta_train.steps"] = "2000"
    rows = horizon_answer.recipe_rows(standard + improving + rerun, "model.layers", STANDARD, LONG, rerun_budget=2000)
    assert len(rows) == 1 and rows[0].params["meta_train.steps"] == "2000" and rows[0].answer()[0] == "b"
    assert horizon_answer.mixer_answers(rows)["delta"][0] == "b"
    # a standard recipe still improving below the budget holds every row of its mixer
    flat = _history(improving, (0.95, 0.95, 0.95))
    rising = _history(standard, (0.5, 0.8, 0.95))
    row = horizon_answer.recipe_rows(rising + flat, "model.layers", STANDARD, LONG, rerun_budget=2000)[0]
    assert row.answer()[1].startswith("pending: the standard recipe is still improving at 400 steps")


def test_a_seed_without_a_half_point_is_never_read_as_moved():
    """No recall of the probe's facts at 0 items on one seed: 'on every seed' cannot be read, so (c)."""
    records = _pairs("delta", [(0.40, 32), (0.35, 64), (0.38, 16)], [(0.70, 128), (0.72, None), (0.69, 64)])
    records[-1].probes["interference"]["curves"]["other_region"] = [{"items": n, "score": 0.0, "skill": 0.0, "se": 0.0, "n": 8}
                                                           for n in (0, 256)]
    records[-1].probes["interference"]["half_items"]["other_region"] = None
    rows, mixers = _answers(records)
    assert rows["delta"] == ("c", "no half point on some seed (no recall of the probe's facts at 0 items, or no curve)")
    table = horizon_answer.answer_table(records, "model.layers", STANDARD, LONG)
    assert "32→128, 64→>256, 16→n/a" in table


def test_a_final_average_that_fell_with_the_half_point_still_is_not_the_update_rule():
    """(a) needs "neither moves": a final average significantly below the standard's is a move, so (c)."""
    records = _pairs("ssm", [(0.60, 16), (0.62, 16), (0.61, 32)], [(0.30, 16), (0.33, 8), (0.31, 32)])
    rows, _ = _answers(records)
    assert rows["ssm"] == ("c", "the final average fell without the half point moving")


def test_pairs_across_code_versions_are_refused_and_a_rerun_by_newer_code_is_not_silently_two_recipes():
    records = _pairs("delta", [(0.40, 32), (0.35, 64), (0.38, 16)], [(0.70, 128), (0.72, None), (0.69, 64)])
    for r in records:
        r.code_version = "code-A" if r.params["stream.options.meta_sequence_episodes"] == "4" else "code-B"
    rows, mixers = _answers(records)
    assert rows["delta"][0] == "" and rows["delta"][1].startswith("refused: pairs a run of code-B with one of code-A")
    assert mixers["delta"] == ("", "pending")
    # a 2,000-step rerun that logs a param the 1,000-step runs lack: which is the other's rerun? said, not guessed
    records = _pairs("delta", [(0.40, 32), (0.35, 64), (0.38, 16)], [(0.70, 128), (0.72, None), (0.69, 64)])
    for s, (f, h) in enumerate([(0.8, None), (0.75, None), (0.7, 128)]):
        r = _record("delta", 32, s, f, h)
        r.params.update({"meta_train.steps": "2000", "gate.new_knob": "1"})
        records.append(r)
    table = horizon_answer.answer_table(records, "model.layers", STANDARD, LONG)
    assert table.startswith("(no answer: delta: treatments") and "gate.new_knob" in table


def test_no_grid_while_a_mixer_has_records_but_no_row():
    records = []
    for mixer in ("delta", "ssm"):
        records += _pairs(mixer, [(0.3, 32), (0.31, 32), (0.29, 16)], [(0.5 + d, None) for d in (0.0, 0.01, -0.01)])
    twice = [_record("ssm", 4, s, 0.3, 32) for s in range(3)]          # a second standard configuration
    for r in records + twice:
        r.params["meta_train.batch_size"] = "16" if any(r is t for t in twice) else "32"
    table = horizon_answer.answer_table(records + twice, "model.layers", STANDARD, LONG)
    assert "- **ssm**: no answer: 2 configurations match the standard" in table
    assert "Grid for the confirmatory re-run" not in table
    assert "Grid for the confirmatory re-run" in horizon_answer.answer_table(records, "model.layers", STANDARD, LONG)


def _retained(mixer, finals_halves, **kw):
    """The treatment with the retention loss (a second long recipe), per-seed (final, half)."""
    out = []
    for s, (f, h) in enumerate(finals_halves):
        r = _record(mixer, 32, s, f, h, **kw)
        r.params["meta_train.retention_loss"] = "1.0"
        out.append(r)
    return out


def test_a_row_waits_while_its_holm_p_depends_on_rows_still_pending():
    """Delta's fall (raw p 0.035) reads "no difference" with the SSM's missing row at p = 1 and "below" at
    p = 0: (b) or (c), so it waits; the SSM's last pair decides it ((c): its own p is small)."""
    delta = _pairs("delta", [(0.50, 32), (0.60, 64), (0.55, 16)], [(0.47, 128), (0.56, None), (0.53, 64)])
    ssm = _pairs("ssm", [(0.3, 16)] * 3, [(0.40, 16), (0.42, 16)])
    rows = horizon_answer.recipe_rows(delta + ssm, "model.layers", STANDARD, LONG, seeds=3)
    row = next(r for r in rows if r.mixer == "delta")
    assert row.p_holm_low == pytest.approx(row.final.p_t) and row.p_holm == pytest.approx(2 * row.final.p_t)
    assert row.answer()[0] == "" and "depends on rows of the table still pending" in row.answer()[1]
    assert horizon_answer.mixer_answers(rows)["delta"] == ("", "pending")
    rows = horizon_answer.recipe_rows(delta + ssm + [_record("ssm", 32, 2, 0.41, 16)], "model.layers", STANDARD, LONG, seeds=3)
    assert {r.mixer: r.answer()[0] for r in rows} == {"delta": "c", "ssm": "c"}
    assert rows[0].p_holm == rows[0].p_holm_low


def test_a_row_without_a_t_test_counts_at_p_1_and_never_shrinks_the_family():
    """Equal differences on every pair (no t-test) stay in the Holm family as p = 1: the SSM's rise (raw p
    ~0.03) is adjusted over two rows, so "no difference" (and (a)), not "above"."""
    rise = _pairs("ssm", [(0.3, 16)] * 3, [(0.3 + d, 16) for d in (0.05, 0.10, 0.08)])
    equal = _pairs("delta", [(0.5, 16), (0.6, 32), (0.55, 16)], [(0.375, 64), (0.475, 64), (0.425, 128)])
    rows = horizon_answer.recipe_rows(rise + equal, "model.layers", STANDARD, LONG)
    ssm = next(r for r in rows if r.mixer == "ssm")
    assert 0.025 < ssm.final.p_t < 0.05 and ssm.p_holm == pytest.approx(2 * ssm.final.p_t)
    assert ssm.answer()[0] == "a"


def test_what_every_open_reading_gives_is_decided():
    """A no-t-test row answers where every reading it leaves open gives one answer ((c) for a seed without
    a half point), and a mixer is (a) when its undecided row could give (a) or (c) but never (b)."""
    records = _pairs("delta", [(0.5, 16), (0.6, 32), (0.55, 16)], [(0.375, 64), (0.475, 64), (0.425, 128)])
    records[-1].probes["interference"]["half_items"]["other_region"] = None
    records[-1].probes["interference"]["curves"]["other_region"] = [{"items": n, "score": 0.0, "skill": 0.0, "se": 0.0, "n": 8}
                                                           for n in (0, 256)]
    rows, mixers = _answers(records)
    assert rows["delta"][0] == "c" and mixers["delta"][0] == "c"
    still = _pairs("ssm", [(0.30, 16), (0.32, 16), (0.31, 32)], [(0.31, 16), (0.30, 8), (0.32, 32)])     # (a)
    fell = _retained("ssm", [(0.30 - 0.125, 16), (0.32 - 0.125, 16), (0.31 - 0.125, 32)])                   # (a) or (c)
    rows = horizon_answer.recipe_rows(still + fell, "model.layers", STANDARD, LONG)
    assert sorted(r.answer()[0] for r in rows) == ["?", "a"]
    assert horizon_answer.mixer_answers(rows)["ssm"] == ("a", "meta_train.retention_loss=0.0")
    # ... but (b) or (c) open beside an (a): the mixer cannot be read
    moved = _retained("ssm", [(0.30 - 0.125, 64), (0.32 - 0.125, 64), (0.31 - 0.125, 128)])                # (b) or (c)
    rows = horizon_answer.recipe_rows(still + moved, "model.layers", STANDARD, LONG)
    assert horizon_answer.mixer_answers(rows)["ssm"] == ("?", "meta_train.retention_loss=1.0")


def test_a_pair_without_a_final_average_keeps_the_row_pending():
    records = _pairs("delta", [(0.40, 32), (0.35, 64), (0.38, 16)], [(0.70, 128), (0.72, None), (0.69, 64)])
    records[-1].summary = {}
    rows, mixers = _answers(records)
    assert rows["delta"] == ("", "pending: 1 of its 3 pairs have no final average") and mixers["delta"][0] == ""


def test_b_needs_every_gate_passed_and_a_mixer_with_an_a_and_a_c_row_is_a():
    records = _pairs("delta", [(0.40, 32), (0.35, 64), (0.38, 16)], [(0.70, 128), (0.72, None), (0.69, 64)])
    records[-1].learned = False
    rows, _ = _answers(records)
    assert rows["delta"] == ("c", "half point moved but not every gate passed")
    still = _pairs("ssm", [(0.30, 16), (0.32, 16), (0.31, 32)], [(0.31, 16), (0.30, 8), (0.32, 32)])           # (a)
    not_long = _retained("ssm", [(0.31, 16), (0.30, 8), (0.32, 32)], recalled=0.2)                            # (c)
    rows = horizon_answer.recipe_rows(still + not_long, "model.layers", STANDARD, LONG)
    assert sorted(r.answer()[0] for r in rows) == ["a", "c"]
    assert horizon_answer.mixer_answers(rows)["ssm"] == ("a", "meta_train.retention_loss=0.0")


def test_every_row_ovqs_included_is_in_the_holm_family_and_the_thresholds_are_inclusive():
    """Holm over every row, OVQ's (nothing to move) too; skill exactly 0.5 learns the long task."""
    rise = _pairs("ssm", [(0.3, 16)] * 3, [(0.3 + d, 16) for d in (0.05, 0.10, 0.08)])
    ovq = _pairs("ovq", [(0.65, None)] * 3, [(0.66 + d, None) for d in (0.0, 0.02, -0.01)])
    rows = horizon_answer.recipe_rows(rise + ovq, "model.layers", STANDARD, LONG)
    ssm = next(r for r in rows if r.mixer == "ssm")
    assert len(rows) == 2 and ssm.p_holm == pytest.approx(min(1.0, 2 * ssm.final.p_t))
    edge = horizon_answer.recipe_rows(_pairs("ssm", [(0.3, 16)] * 3, [(0.3, 16)] * 3, recalled=0.5),
                                      "model.layers", STANDARD, LONG)[0]
    assert edge.learns_long_task
    one = horizon_answer.recipe_rows(_pairs("delta", [(0.4, 32)], [(0.7, None)]), "model.layers", STANDARD, LONG)[0]
    assert one.answer()[0] == ""                                    # one pair never decides (at least two)


def test_the_recalled_skill_is_read_at_the_last_step_and_a_tie_goes_to_the_first_recipe():
    records = _pairs("delta", [(0.40, 32), (0.35, 64), (0.38, 16)], [(0.70, 128), (0.72, None), (0.69, 64)])
    rows = horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)
    assert rows[0].recalled_skill == [pytest.approx(0.9)] * 3       # step 1000's, not step 500's 0.1
    records[-1].meta_history = records[-1].meta_history[:1] + [{"step": 1000, "accuracy": 0.95}]
    assert math.isnan(horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)[0].recalled_skill[-1])
    base = _pairs("ssm", [(0.3, 32), (0.31, 32), (0.29, 16)], [(0.5 + d, None) for d in (0.0, 0.01, -0.01)])
    same = _retained("ssm", [(0.5 + d, None) for d in (0.0, 0.01, -0.01)])
    rows = horizon_answer.recipe_rows(base + same, "model.layers", STANDARD, LONG)
    assert len(rows) == 2 and rows[0].final.mean_difference == rows[1].final.mean_difference
    recipe, _ = horizon_answer.confirm_recipes(rows)["ssm"]
    assert recipe == rows[0].treatment                              # equal gains: the first listed
    recipe, _ = horizon_answer.confirm_recipes(rows[::-1])["ssm"]
    assert recipe == rows[1].treatment


def test_a_refused_row_chooses_no_recipe():
    records = _pairs("delta", [(0.40, 32), (0.35, 64), (0.38, 16)], [(0.70, 128), (0.72, None), (0.69, 64)])
    for r in records:
        r.code_version = "code-A" if r.params["stream.options.meta_sequence_episodes"] == "4" else "code-B"
    rows = horizon_answer.recipe_rows(records, "model.layers", STANDARD, LONG)
    assert not rows[0].is_final and horizon_answer.confirm_recipes(rows) == {}
