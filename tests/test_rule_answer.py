"""Study 11's declared decision (experiments/rule_answer.py): known answers on hand-made records."""
import pytest

from experiments import compare, rule_answer, study_specs

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
    cells = rule_answer.rule_cells(streams, BASE)
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
    one, _ = _decide(_noisy("icr", NOVELTY, GAIN) + _noisy("text", NOVELTY, NONE) + _noisy("text", MERGE, NONE, False))
    icr = next(c for c in one if c.stream == "icr")
    assert icr.comparison.p_t == pytest.approx(0.018, abs=0.001) and icr.p_holm == icr.comparison.p_t and icr.outcome == "wins"
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
    # one comparison pairs runs of two code versions: refused, and the decision waits
    mixed = _stream("icr", {PLATEAU: 0.5, NOVELTY: 0.6}) + _stream("text", {PLATEAU: 0.4, NOVELTY: 0.5})
    mixed[-1].code_version = "code-other"
    cells, decided = _decide(mixed)
    assert decided[0] == "pending (1 comparison(s) pair runs of different code versions)"
    assert [c.outcome for c in cells if c.stream == "text"] == ["refused (runs of different code versions)"]


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
    assert spec.answer == "rule_on_every_stream" and spec.answer_seeds == 5 and spec.partition
    (tmp_path / "x.yaml").write_text("title: x\nanswer: rule_on_every_stream\nbaseline: ovq\n")
    with pytest.raises(ValueError, match="needs baseline, partition and answer_seeds >= 2"):
        study_specs.load_study(str(tmp_path / "x.yaml"))


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
