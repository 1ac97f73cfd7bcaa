"""Study 11's declared decision (experiments/rule_answer.py): known answers on hand-made records."""
import shutil

import pytest

from experiments import compare, sections, study_specs
from experiments.studies.ovq_plasticity import analysis as rule_answer

BASE = "* | model.mixers.ovq.growth=plateau, model.mixers.ovq.when_full=none"


def _record(stream, rule, seed, final, metric="accuracy", current=None):
    """One run of OVQ with dictionary ``rule`` = (growth, when_full) on ``stream`` (its partition value)."""
    growth, when_full = rule
    return compare.RunRecord(
        label=f"{stream}-{growth}-{when_full}-s{seed}", metric=metric, summary={"final_average": final},
        summary_current={"final_average": current} if current is not None else {},
        params={"model.layers": "['ovq']", "stream.name": stream, "model.mixers.ovq.growth": growth,
                "model.mixers.ovq.when_full": when_full,
                "model.mixers.ovq.num_slots": "128" if stream == "icr" else "32"},
        seed=seed, data_seed=seed)


PLATEAU, NOVELTY, MERGE = ("plateau", "none"), ("novelty", "none"), ("novelty", "merge")


def _stream(stream, finals, seeds=5, **kw):
    """``finals``: {rule: base score}; seed s adds a small seed effect shared by every rule (pairs), and a
    smaller one of its own per (rule, seed), so that no two rules differ by the same amount on every seed
    (zero variance: no t-test)."""
    return [_record(stream, rule, s, f + 0.01 * s + 0.003 * ((s * (i + 1)) % 3 - 1), **kw)
            for i, (rule, f) in enumerate(finals.items()) for s in range(seeds)]


def _decide(records, seeds=5, unwritten=()):
    streams = [(name, [r for r in records if r.params["stream.name"] == name])
               for name in dict.fromkeys(r.params["stream.name"] for r in records)]
    cells = rule_answer.rule_cells(streams, BASE, seeds)
    return cells, rule_answer.decision(cells, [n for n, _ in streams], seeds, unwritten)


def test_a_rule_that_wins_every_stream_is_the_preset_and_otherwise_each_stream_says_which():
    everywhere = _stream("icr", {PLATEAU: 0.5, NOVELTY: 0.6, MERGE: 0.5}) + _stream("text", {PLATEAU: 0.4, NOVELTY: 0.5, MERGE: 0.3})
    cells, (sentence, preset) = _decide(everywhere)
    assert preset == "ovq.growth=novelty" and "wins the primary endpoint on every stream** (2; intersection-union" in sentence
    outcomes = {(c.stream, c.label): c.outcome for c in cells}
    assert outcomes == {("icr", "ovq.growth=novelty"): "wins", ("icr", "ovq.growth=novelty, ovq.when_full=merge"): "no difference",
                        ("text", "ovq.growth=novelty"): "wins", ("text", "ovq.growth=novelty, ovq.when_full=merge"): "loses"}
    # a rule is the same rule across streams although the dictionary size (set by the budget) differs
    assert len({c.rule for c in cells}) == 2
    split = _stream("icr", {PLATEAU: 0.5, NOVELTY: 0.6, MERGE: 0.5}) + _stream("text", {PLATEAU: 0.4, NOVELTY: 0.4, MERGE: 0.5})
    _, (sentence, preset) = _decide(split)
    assert preset is None and sentence.startswith("**No rule wins the primary endpoint on every stream** (intersection-union")
    assert "- icr: ovq.growth=novelty (+0.101)" in sentence and "- text: ovq.growth=novelty, ovq.when_full=merge (+0.098)" in sentence


def test_lower_is_better_for_bits_per_byte_and_facts_in_force_are_read_where_scored():
    text = _stream("text", {PLATEAU: 3.0, NOVELTY: 2.8, MERGE: 3.2}, metric="bits_per_byte")
    cells, _ = _decide(text)
    assert {c.label: c.outcome for c in cells} == {"ovq.growth=novelty": "wins", "ovq.growth=novelty, ovq.when_full=merge": "loses"}
    # R says novelty is better, the facts in force say it is worse: the facts in force decide
    rebind = [_record("keys", PLATEAU, s, 0.5 + 0.01 * s, current=0.6 + 0.01 * s + 0.002 * (s % 2)) for s in range(5)]
    rebind += [_record("keys", NOVELTY, s, 0.7 + 0.01 * s, current=0.5 + 0.01 * s) for s in range(5)]
    cells, _ = _decide(rebind)
    assert cells[0].current and cells[0].outcome == "loses" and cells[0].comparison.mean_difference == pytest.approx(-0.1, abs=0.002)


def _noisy(stream, rule, differences, base=True):
    return (([_record(stream, PLATEAU, s, 0.5) for s in range(5)] if base else []) +
            [_record(stream, rule, s, 0.5 + d) for s, d in enumerate(differences)])


GAIN, NONE = [0.05, 0.01, 0.06, 0.02, 0.04], [0.01, -0.01, 0.02, -0.02, 0.0]     # paired t p 0.018 and 1


def test_which_rule_where_is_holm_within_each_stream():
    """A raw p of 0.018 wins alone, and no longer among three rules of the same stream; another stream's
    rules do not enter the family."""
    one, _ = _decide(_noisy("icr", NOVELTY, GAIN) + _noisy("text", NOVELTY, NONE))
    icr = next(c for c in one if c.stream == "icr")
    assert icr.comparison.p_t == pytest.approx(0.018, abs=0.001) and icr.p_holm == icr.comparison.p_t and icr.outcome == "wins"
    # two rules on each stream: icr's family is its own two, whatever text's p
    two, _ = _decide(_noisy("icr", NOVELTY, GAIN) + _noisy("icr", MERGE, NONE, False)
                     + _noisy("text", NOVELTY, GAIN) + _noisy("text", MERGE, GAIN, False))
    icr = next(c for c in two if c.stream == "icr" and c.label == "ovq.growth=novelty")
    assert icr.p_holm == icr.p_holm_low == pytest.approx(2 * icr.comparison.p_t) and icr.outcome == "wins"
    three, _ = _decide(_noisy("icr", NOVELTY, GAIN) + _noisy("icr", MERGE, NONE, False) + _noisy("icr", ("linear", "none"), NONE, False))
    icr = next(c for c in three if c.label == "ovq.growth=novelty")
    assert icr.p_holm == pytest.approx(3 * icr.comparison.p_t) and icr.outcome == "no difference"


def test_every_stream_is_an_intersection_union_test_holm_over_the_rules():
    # novelty: raw p 0.018 on both streams, the good way: IUT p 0.018; merge: never better, p 1
    records = (_noisy("icr", NOVELTY, GAIN) + _noisy("icr", MERGE, NONE, False)
               + _noisy("text", NOVELTY, GAIN) + _noisy("text", MERGE, NONE, False))
    cells, (sentence, preset) = _decide(records)
    tests = rule_answer.every_stream_p(cells, ["icr", "text"])
    assert sorted(round(p, 3) for p, _ in tests.values()) == [0.018, 1.0] and preset == "ovq.growth=novelty"
    assert sorted(round(q, 3) for _, q in tests.values()) == [0.036, 1.0]            # Holm over the 2 rules
    # the same p the wrong way on one stream: not a win there, so not a preset
    worse = [-d for d in GAIN]
    records = _noisy("icr", NOVELTY, GAIN) + _noisy("text", NOVELTY, worse)
    cells, (sentence, preset) = _decide(records)
    assert preset is None and rule_answer.every_stream_p(cells, ["icr", "text"])[cells[0].rule][0] == 1.0
    assert "- text: the baseline (no rule beats it); worse than the baseline: ovq.growth=novelty" in sentence


def test_the_decision_waits_for_every_declared_pair_and_every_stream():
    records = _stream("icr", {PLATEAU: 0.5, NOVELTY: 0.6}) + _stream("text", {PLATEAU: 0.4, NOVELTY: 0.5}, seeds=4)
    cells, (sentence, preset) = _decide(records)
    assert preset is None and sentence == "pending (1 comparison(s) have fewer than 5 pairs)"
    assert _decide(records, seeds=4)[1][1] == "ovq.growth=novelty"
    assert _decide(records, seeds=4, unwritten=["results/x.json"])[1] == ("pending (not written yet: results/x.json)", None)
    no_base = _stream("icr", {PLATEAU: 0.5, NOVELTY: 0.6}) + _stream("text", {NOVELTY: 0.5})
    assert _decide(no_base)[1][0] == "pending (no baseline runs yet on text)"
    # a sweep that runs rule after rule: text has the baseline and novelty, not merge yet
    part = _stream("icr", {PLATEAU: 0.5, NOVELTY: 0.6, MERGE: 0.5}) + _stream("text", {PLATEAU: 0.4, NOVELTY: 0.5})
    assert _decide(part)[1] == ("pending (not every rule has runs on text)", None)
    # a run of another code version is never paired: left out (and said), so that comparison is short
    mixed = _stream("icr", {PLATEAU: 0.5, NOVELTY: 0.6}) + _stream("text", {PLATEAU: 0.4, NOVELTY: 0.5})
    mixed[-1].code_version = "code-other"
    cells, decided = _decide(mixed)
    assert decided[0] == "pending (1 comparison(s) have fewer than 5 pairs)"
    text = next(c for c in cells if c.stream == "text")
    assert text.left_out == 1 and text.comparison.n == 4 and text.outcome == "pending (4 of 5 pairs)"
    # every run of the rule by another code than the baseline's: nothing to pair within one version, refused
    for r in mixed:
        if r.params["stream.name"] == "text" and r.params["model.mixers.ovq.growth"] == "novelty":
            r.code_version = "code-other"
    cells, decided = _decide(mixed)
    assert decided[0] == "pending (1 comparison(s) pair runs of different code versions only)"
    assert next(c for c in cells if c.stream == "text").outcome.startswith("refused")


def test_one_rule_is_one_rule_whatever_the_number_format_of_its_options():
    """Older records log count_cap as 32.0, newer as 32: the same rule on both streams."""
    records = _stream("icr", {PLATEAU: 0.5, NOVELTY: 0.6}) + _stream("text", {PLATEAU: 0.4, NOVELTY: 0.5})
    for r in records:
        r.params["model.mixers.ovq.count_cap"] = "None"
        if r.params["model.mixers.ovq.growth"] == "novelty":
            r.params["model.mixers.ovq.count_cap"] = "32.0" if r.params["stream.name"] == "icr" else "32"
    cells, (_, preset) = _decide(records)
    assert len({c.rule for c in cells}) == 1 and preset == "ovq.count_cap=32.0, ovq.growth=novelty"


def test_study_11_declares_the_decision_and_a_bad_declaration_is_one_line(tmp_path):
    spec = study_specs.load_study("ovq_plasticity")
    [options] = [o for r, o in sections.study_sections(spec) if r is rule_answer.render]
    assert options == {"seeds": 5} and spec.partition and spec.baseline
    shutil.copy(rule_answer.__file__, tmp_path / "analysis.py")
    (tmp_path / "study.yaml").write_text("title: x\nbaseline: ovq\nsections: [{rule_answer: {seeds: 5}}]\n")
    with pytest.raises(ValueError, match="needs the spec's baseline and partition and seeds >= 2"):
        study_specs.load_study(str(tmp_path / "study.yaml"))


def test_a_stream_whose_pairs_all_differ_by_the_same_amount_leaves_the_decision_undecided_in_any_order():
    """No t-test on one stream: the intersection-union p (the largest stream p) is unknown, whichever stream
    comes first (max() over a NaN once answered by the order of the streams)."""
    flat = _noisy("icr", NOVELTY, [0.0625] * 5)
    clear = _noisy("text", NOVELTY, GAIN)
    for records in (flat + clear, clear + flat):
        cells, (sentence, preset) = _decide(records)
        assert preset is None and sentence.startswith("undecided (1 comparison(s) have no t-test")
        assert next(c for c in cells if c.stream == "icr").outcome.startswith("no t-test")
    # while the decision is pending anyway, the sentence keeps saying why
    _, (sentence, _) = _decide(flat + clear, seeds=6)
    assert sentence == "pending (2 comparison(s) have fewer than 6 pairs)"


def test_a_rule_waits_while_rules_of_its_stream_still_to_be_read_could_move_its_holm_p():
    """Raw p 0.018 among three rules: 'wins' with the two unread ones at p = 0, not at p = 1 (0.054): pending;
    once they are read (p ~1), 'no difference'. A rule of the stream with no runs there yet counts the same."""
    short = [_record("icr", MERGE, s, 0.5 + d) for s, d in enumerate(NONE[:2])]
    short += [_record("icr", ("linear", "none"), s, 0.5 + d) for s, d in enumerate(NONE[:2])]
    cells, (sentence, _) = _decide(_noisy("icr", NOVELTY, GAIN) + short)
    novelty = next(c for c in cells if c.label == "ovq.growth=novelty")
    assert (novelty.p_holm_low, novelty.p_holm) == (pytest.approx(novelty.comparison.p_t), pytest.approx(3 * novelty.comparison.p_t))
    assert novelty.outcome == "pending (rules of this stream still to be read could move its Holm p)"
    assert sentence.startswith("pending")
    full = _noisy("icr", NOVELTY, GAIN) + _noisy("icr", MERGE, NONE, False) + _noisy("icr", ("linear", "none"), NONE, False)
    assert next(c for c in _decide(full)[0] if c.label == "ovq.growth=novelty").outcome == "no difference"
    # a rule seen on another stream but not on this one yet is one of this stream's rules still to be read
    elsewhere = _noisy("icr", NOVELTY, GAIN) + _noisy("text", NOVELTY, GAIN) + _noisy("text", MERGE, NONE, False) \
        + _noisy("text", ("linear", "none"), NONE, False)
    icr = next(c for c in _decide(elsewhere)[0] if c.stream == "icr")
    assert icr.outcome.startswith("pending (rules of this stream")


def test_a_rule_without_a_t_test_stays_in_its_streams_family():
    """Novelty and linear at raw p 0.018, merge +0.0625 on every pair (no t-test, p unknown): with merge at
    p = 1 neither wins (0.054), at p = 0 both do: undecided, never 'wins' from a family of two."""
    records = (_noisy("icr", NOVELTY, GAIN) + _noisy("icr", ("linear", "none"), GAIN, False)
               + _noisy("icr", MERGE, [0.0625] * 5, False))
    cells, _ = _decide(records)
    novelty = next(c for c in cells if c.label == "ovq.growth=novelty")
    assert novelty.p_holm == pytest.approx(3 * novelty.comparison.p_t)
    assert novelty.outcome == "undecided (a rule of this stream without a t-test could move its Holm p)"


def test_a_decision_every_unknown_p_would_give_is_made():
    """Merge goes the wrong way on icr with no t-test: its intersection-union p is 1 whatever; novelty wins
    both streams (IUT p 0.018, Holm over two rules 0.036): the preset, and not 'undecided'."""
    records = (_noisy("icr", NOVELTY, GAIN) + _noisy("icr", MERGE, [-0.0625] * 5, False)
               + _noisy("text", NOVELTY, GAIN) + _noisy("text", MERGE, NONE, False))
    cells, (sentence, preset) = _decide(records)
    assert preset == "ovq.growth=novelty" and "Holm over 2 rules 0.036" in sentence
    # with no winner, each stream still says which rule where, and names what it cannot read
    records = (_noisy("icr", NOVELTY, GAIN) + _noisy("icr", MERGE, [-0.0625] * 5, False)
               + _noisy("text", NOVELTY, NONE) + _noisy("text", MERGE, NONE, False))
    _, (sentence, preset) = _decide(records)
    assert preset is None and "- icr: ovq.growth=novelty (+0.036); not read (no t-test): ovq.growth=novelty, ovq.when_full=merge" in sentence
    assert "- text: the baseline (no rule beats it)" in sentence


def test_the_preset_is_read_after_holm_over_the_rules_and_is_the_one_with_the_smallest_p():
    """IUT p 0.018 among three rules: Holm 0.054, no preset (the raw p alone would make one). Two rules that
    pass: the smaller adjusted p is the preset."""
    three = sum((_noisy(s, NOVELTY, GAIN) + _noisy(s, MERGE, NONE, False) + _noisy(s, ("linear", "none"), NONE, False)
                 for s in ("icr", "text")), [])
    cells, (sentence, preset) = _decide(three)
    p = next(c for c in cells if c.label == "ovq.growth=novelty").comparison.p_t
    smallest = float(sentence.split("smallest adjusted p ")[1].split(")")[0])
    assert preset is None and p < 0.05 and smallest == pytest.approx(3 * p, rel=0.01) and smallest >= 0.05
    strong = [0.10, 0.09, 0.11, 0.10, 0.095]
    both = sum((_noisy(s, NOVELTY, GAIN) + _noisy(s, ("linear", "none"), strong, False) for s in ("icr", "text")), [])
    _, (sentence, preset) = _decide(both)
    assert preset == "ovq.growth=linear"


def test_pairs_are_the_same_seed_of_model_and_of_data():
    records = _noisy("icr", NOVELTY, GAIN)
    for r in records[5:]:                      # the rule's runs: same model seeds, other data seeds
        r.data_seed = r.seed + 10
    cells, (sentence, _) = _decide(records)
    assert cells[0].comparison.n == 0 and sentence == "pending (1 comparison(s) have fewer than 5 pairs)"
