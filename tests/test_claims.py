"""The paper's claims table: each kind of claim's rule on records with known answers."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

from experiments import claims
from experiments.claims import Claim, evaluate
from experiments.stats.intervals import paired_comparison


def _run(layers, seed, final, learned=True, version="code-a", metric="accuracy", skill=None):
    """A run record; its held-out and stream skill are 0.9 / 0.3 when learned, else 0.0 (or ``skill``)."""
    held_out = (0.9 if learned else 0.0) if skill is None else skill
    return {"shared_bytes_per_layer": [], "learned_buffers": 0, "label": f"{layers}-s{seed}", "params": {"model.layers": f"['{layers}']", "seed": str(seed)},
            "metric": metric, "summary": {"final_average": final}, "summary_current": {}, "learned": learned,
            "gate": {"skill": held_out}, "stream_gate": {"skill": 0.3 if learned else min(held_out, 0.05)},
            "R": [[final]], "seed": seed, "data_seed": seed, "code_version": version}


@pytest.fixture
def root(tmp_path):
    runs = []
    for s in range(6):
        runs += [_run("ovq", s, 0.60 + 0.01 * s), _run("ssm", s, 0.30 + 0.02 * s), _run("vq", s, 0.90 + 0.005 * s),
                 _run("linear", s, 0.60 + 0.01 * s + (0.002 if s % 2 else -0.002)),
                 _run("delta", s, 0.1, learned=False)]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text(json.dumps(runs))
    (tmp_path / "results" / "b.json").write_text(json.dumps([_run("ovq", s, 0.6, version="code-b") for s in range(3)] +
                                                            [_run("ssm", s, 0.3) for s in range(3)]))
    return str(tmp_path)


def test_more_says_yes_opposite_or_no_difference_after_holm(root):
    result = evaluate(Claim("c", "t", kind="more", against=["ssm", "vq", "linear"], results=["results/a.json"]), root)
    assert result.answers == ["yes", "opposite", "no difference detected"]
    assert result.verdict == "partly (1 of 3)"
    # ovq 0.60 + 0.01 s against ssm 0.30 + 0.02 s over s = 0..5: 0.30 - 0.01 * 2.5
    assert result.cells[0].startswith("vs ssm: +0.275 [") and "6 pairs (learned 6/6 vs 6/6): yes" in result.cells[0]
    assert evaluate(Claim("c", "t", against=["ssm"], results=["results/a.json"]), root).verdict == "reproduced"
    assert evaluate(Claim("c", "t", against=["vq"], results=["results/a.json"]), root).verdict == "not reproduced"


def test_more_makes_no_t_test_when_every_pair_differs_by_the_same_amount(tmp_path):
    # ovq beats ssm by exactly 0.25 on each of 3 seeds (zero variance): no t-test, so no Holm p to read; vq
    # against the same ovq runs is an ordinary test (raw p 0.0377) in the declared family of two, where the
    # untested comparison counts as p = 1: 0.075, no difference (a family of one would have said "yes")
    runs = ([_run("ovq", s, 0.5 + 0.125 * s) for s in range(3)] + [_run("ssm", s, 0.25 + 0.125 * s) for s in range(3)]
            + [_run("vq", s, 0.375 + 0.125 * s + 0.0625 * (s % 2)) for s in range(3)])
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "z.json").write_text(json.dumps(runs))
    result = evaluate(Claim("c", "t", against=["ssm", "vq"], results=["results/z.json"]), str(tmp_path))
    assert result.answers[0] == "no t-test" and "nan" not in result.cells[0]
    assert result.cells[0] == "vs ssm: every one of 3 pairs differs by +0.250: no t-test (zero variance)"
    assert result.answers[1] == "no difference detected" and "Holm p 0.075" in result.cells[1]
    assert result.verdict == "undecided (1 of 2 comparisons without a test: every pair differs by the same amount)"
    alone = evaluate(Claim("c", "t", against=["vq"], results=["results/z.json"]), str(tmp_path))
    assert alone.answers == ["yes"] and "Holm p 0.038" in alone.cells[0]
    # "as much": a zero-width interval from a constant difference is not inside any margin
    same = evaluate(Claim("c", "t", kind="as_much", against=["ssm"], results=["results/z.json"], margin=0.5), str(tmp_path))
    assert same.answers == ["no t-test"] and same.verdict.startswith("undecided")


def test_as_much_needs_the_whole_interval_inside_the_margin(root):
    near = Claim("c", "t", kind="as_much", against=["linear"], results=["results/a.json"], margin=0.01)
    assert evaluate(near, root).answers == ["yes"]
    far = Claim("c", "t", kind="as_much", against=["ssm"], results=["results/a.json"], margin=0.01)
    assert evaluate(far, root).answers == ["no"] and evaluate(far, root).verdict == "not reproduced"


def test_fails_to_learn_untestable_missing_and_refused(root):
    fails = Claim("c", "t", kind="fails_to_learn", against=["delta", "ssm"], results=["results/a.json"])
    result = evaluate(fails, root)
    assert result.answers == ["yes", "no"] and "delta: 6/6 seeds learned nothing" in result.cells[0]
    assert evaluate(Claim("c", "t", kind="untestable", untestable="no GPU"), root).verdict == "not testable here: no GPU"
    assert evaluate(Claim("c", "t", against=["ssm"], results=["results/none.json"]), root).verdict == "not run yet"
    mixed = evaluate(Claim("c", "t", against=["ssm"], results=["results/b.json"]), root)
    assert mixed.answers == ["refused"] and "code versions" in mixed.cells[0]


def _refused(path, text, message):
    """A claims file with ``text`` is refused with a line matching ``message``."""
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        claims.load_claims(str(path))


def test_the_shipped_claims_load_and_bad_files_get_one_line(tmp_path):
    preamble, shipped = claims.load_claims()
    assert "Scale" in preamble and len(shipped) >= 7
    assert {c.kind for c in shipped} <= set(claims.KINDS)
    bad = tmp_path / "c.yaml"
    _refused(bad, "claims:\n  - {claim: x, test: y, kind: as_much, seeds: 5, against: [vq], results: [r.json]}\n",
             "kind as_much needs a margin > 0")
    _refused(bad, "claims:\n  - {claim: x, test: y, kind: untestable}\n", "says why")
    _refused(bad, "claims:\n  - {claim: x, test: 10 seeds, seeds: 5, against: [vq], results: [r.json]}\n",
             "its test says 10 seeds, seeds is 5")
    _refused(bad, "claims:\n  - {claim: x, test: y, against: [vq], results: [r.json]}\n", "seeds .* is missing")


def test_a_verdict_waits_for_the_declared_pairs(root):
    # a.json has 6 seeds of ovq and ssm: declared 6 gives the verdict, declared 8 keeps it pending
    assert evaluate(Claim("c", "t", against=["ssm"], results=["results/a.json"], seeds=6), root).verdict == "reproduced"
    waiting = evaluate(Claim("c", "t", against=["ssm", "vq"], results=["results/a.json"], seeds=8), root)
    assert waiting.verdict == "pending (6 of 8 pairs in the comparison with fewest)"
    assert waiting.cells[0].startswith("vs ssm: +0.275 [")           # the numbers so far are still shown
    short = evaluate(Claim("c", "t", against=["ssm", "nothing"], results=["results/a.json"], seeds=6), root)
    assert short.verdict.startswith("pending (0 of 6")                 # a mixer without runs holds it too
    fails = Claim("c", "t", kind="fails_to_learn", against=["delta"], results=["results/a.json"], seeds=7)
    assert evaluate(fails, root).verdict == "pending (6 of 7 seeds in the comparison with fewest)"
    # a refused comparison (vq of another code) does not let a short one (ssm, 3 of 6 pairs) be read
    runs = ([_run("ovq", s, 0.6 + 0.01 * s) for s in range(6)] + [_run("ssm", s, 0.3 + 0.02 * s) for s in range(3)]
            + [_run("vq", s, 0.9, version="code-b") for s in range(6)])
    (Path(root) / "results" / "c.json").write_text(json.dumps(runs))
    both = evaluate(Claim("c", "t", against=["vq", "ssm"], results=["results/c.json"], seeds=6), root)
    assert both.answers[0] == "refused" and both.verdict == "pending (3 of 6 pairs in the comparison with fewest)"


def _curve_run(layers, seed, scores, bpb, slots=None, chance=0.0):
    """A run with a capacity curve (scores at 16 and 64 facts) and a prose position curve (last bucket bpb);
    skill = (score - chance) / (1 - chance), as the probes compute it."""
    r = _run(layers, seed, 0.5)
    if slots:
        r["params"]["after_meta.model.mixers.ovq.num_slots"] = slots
    skills = [(x - chance) / (1 - chance) for x in scores]
    r["capacity"] = {"curve": {"metric": "accuracy", "points": [{"facts": 16, "score": scores[0], "skill": skills[0]},
                                                                {"facts": 64, "score": scores[1], "skill": skills[1]}]}}
    r["position"] = {"curves": {"prose": {"buckets": [{"lo": 0, "hi": 64, "bits_per_byte": 9.0},
                                                      {"lo": 64, "hi": 256, "bits_per_byte": bpb}]}}}
    return r


def test_capacity_and_position_endpoints_read_the_curves(tmp_path):
    runs = []
    for s in range(5):
        runs += [_curve_run("ovq", s, (1.0, 0.5 + 0.01 * s), 2.0 + 0.01 * s, slots="128"),
                 _curve_run("ovq", s, (1.0, 0.8 + 0.01 * s + (0.002 if s % 2 else -0.002)), 2.0 + 0.01 * s, slots="2048"),
                 _curve_run("full", s, (1.0, 0.9), 3.0 + 0.02 * s)]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "c.json").write_text(json.dumps(runs))
    big = "ovq | after_meta.model.mixers.ovq.num_slots=2048"
    small = "ovq | after_meta.model.mixers.ovq.num_slots=128"
    at64 = evaluate(Claim("c", "t", ours=big, against=[small], results=["results/c.json"], endpoint="capacity@64"), str(tmp_path))
    assert at64.answers == ["yes"] and at64.cells[0].startswith("vs " + small + ": +0.300 [+0.29")
    # at a probe's point each side's mean skill there (not its score) is said, whether either recalls at
    # all; not at other endpoints, and an "as much" says the reference's alone, named
    chanced = [dict(r, capacity=_curve_run("ovq", 0, tuple(p["score"] for p in r["capacity"]["curve"]["points"]),
                                           2.0, chance=0.5)["capacity"]) for r in runs]
    (tmp_path / "results" / "chance.json").write_text(json.dumps(chanced))
    skilled = evaluate(Claim("c", "t", ours=big, against=[small], results=["results/chance.json"],
                             endpoint="capacity@64"), str(tmp_path))
    assert "skill there 0.64 vs 0.04" in skilled.cells[0] and "+0.300" in skilled.cells[0]
    final = evaluate(Claim("c", "t", ours=big, against=[small], results=["results/c.json"]), str(tmp_path))
    assert "skill there" not in final.cells[0]
    for r in chanced:                       # one side's skill not measured: nothing said, never "nan"
        if r["params"].get("after_meta.model.mixers.ovq.num_slots") == "128":
            del r["capacity"]["curve"]["points"][1]["skill"]
    (tmp_path / "results" / "chance.json").write_text(json.dumps(chanced))
    unskilled = evaluate(Claim("c", "t", ours=big, against=[small], results=["results/chance.json"],
                               endpoint="capacity@64"), str(tmp_path))
    assert "+0.300" in unskilled.cells[0] and "skill there" not in unskilled.cells[0]
    (tmp_path / "results" / "chance.json").write_text(json.dumps(
        [dict(r, capacity=_curve_run("ovq", 0, tuple(p["score"] for p in r["capacity"]["curve"]["points"]),
                                     2.0, chance=0.5)["capacity"]) for r in runs]))
    much = evaluate(Claim("c", "t", kind="as_much", ours=big, against=["full"], results=["results/chance.json"],
                          endpoint="capacity@64", margin=0.05), str(tmp_path))
    assert "full's skill there 0.80" in much.cells[0] and " vs " not in much.cells[0].split("skill there")[1]
    # the mean over the curve halves the gap: (1 + 0.8) / 2 - (1 + 0.5) / 2 = 0.15
    mean = evaluate(Claim("c", "t", ours=big, against=[small], results=["results/c.json"], endpoint="capacity_mean"), str(tmp_path))
    assert "+0.150" in mean.cells[0]
    at16 = evaluate(Claim("c", "t", kind="as_much", ours=big, against=[small], results=["results/c.json"],
                          endpoint="capacity@16", margin=0.01), str(tmp_path))
    assert at16.answers == ["yes"]
    # bits per byte: lower is better, so ovq's 1.0 lower reads as a win, against full's last bucket
    prose = evaluate(Claim("c", "t", ours=small, against=["full"], results=["results/c.json"], endpoint="position@prose"), str(tmp_path))
    assert prose.answers == ["yes"] and "-1.020" in prose.cells[0]
    one = [r for r in runs if r["seed"] == 0]
    (tmp_path / "results" / "one.json").write_text(json.dumps(one))
    single = evaluate(Claim("c", "t", ours=big, against=[small], results=["results/one.json"], endpoint="capacity@64"), str(tmp_path))
    assert single.answers == ["too few pairs"] and single.verdict == "too few pairs" and "nan" not in single.cells[0]
    nobody = evaluate(Claim("c", "t", ours=small, against=["vq"], results=["results/c.json"]), str(tmp_path))
    assert nobody.verdict == "not run yet (no runs of vq)"
    absent = evaluate(Claim("c", "t", ours=small, against=["full"], results=["results/c.json"], endpoint="capacity@999"), str(tmp_path))
    assert absent.answers == ["not measured"] and absent.verdict == "not measured (capacity@999)"
    # runs measured over different positions or ladders are not paired
    for r in runs:
        if r["params"]["model.layers"] == "['full']":
            r["position"]["curves"]["prose"]["buckets"][-1]["hi"] = 1024
            r["capacity"]["curve"]["points"] = r["capacity"]["curve"]["points"][:1]
    (tmp_path / "results" / "c.json").write_text(json.dumps(runs))
    for endpoint in ("position@prose", "capacity_mean"):
        moved = evaluate(Claim("c", "t", ours=small, against=["full"], results=["results/c.json"], endpoint=endpoint), str(tmp_path))
        assert moved.answers == ["not measured"], endpoint


def test_bad_endpoints_get_one_line(tmp_path):
    bad = tmp_path / "c.yaml"
    _refused(bad, "claims:\n  - {claim: x, test: y, against: [vq], results: [r.json], endpoint: 'capacity@many'}\n",
             "capacity@N needs a whole number")
    for endpoint in ("final average", "final_averge"):
        _refused(bad, f"claims:\n  - {{claim: x, test: y, against: [vq], results: [r.json], endpoint: '{endpoint}'}}\n",
                 "is not a summary name")
    _refused(bad, "claims:\n  - {claim: x, test: y, against: [vq], results: [r.json], endpoint: 'position@'}\n", "needs a domain")


def test_every_row_of_the_table_has_six_cells_even_with_a_pattern_separator(root):
    import re
    (Path(root) / "claims.yaml").write_text(
        "preamble: p\nclaims:\n  - claim: c\n    test: t\n    seeds: 2\n    ours: 'ovq | seed=0'\n"
        "    results: [results/a.json]\n    against: ['ssm | seed=0']\n")
    rows = [line for line in claims.claims_section(root, str(Path(root) / "claims.yaml")).splitlines()
            if line.startswith("| c ")]
    assert len(rows) == 1 and len(re.split(r"(?<!\\)\|", rows[0])) == 8 and "ssm \\| seed=0" in rows[0]
    assert rows[0].endswith("| exploratory, 2 seeds | not checked |")   # the evidence class, with its seeds


def test_fails_to_learn_means_learned_nothing_not_failed_the_gate(tmp_path):
    # "fail to learn even one function": a run that missed the learned gate (held-out skill 0.5) with a
    # held-out skill of 0.44 learned something, so the claim is not borne out by it
    runs = [_run("ovq", s, 0.6) for s in range(3)] + [_run("vq", s, 0.1, learned=False, skill=0.02) for s in range(2)]
    runs.append(_run("vq", 2, 0.2, learned=False, skill=0.44))
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "f.json").write_text(json.dumps(runs))
    result = evaluate(Claim("c", "t", kind="fails_to_learn", against=["vq"], results=["results/f.json"], seeds=3),
                      str(tmp_path))
    assert result.answers == ["no"] and "2/3 seeds learned nothing" in result.cells[0] and "0.44" in result.cells[0]
    assert result.verdict == "not reproduced"


def _write(tmp_path, name, runs):
    (tmp_path / "results").mkdir(exist_ok=True)
    (tmp_path / "results" / name).write_text(json.dumps(runs))
    return str(tmp_path)


def test_mixed_code_versions_pair_within_the_version_with_most_pairs_and_never_read_not_reproduced(tmp_path):
    # seeds 0-1 of ovq and ssm by code-old, all five seeds of both again by code-new: code-new pairs 5
    runs = [_run("ovq", s, 0.6 + 0.01 * s, version="code-old") for s in range(2)]
    runs += [_run("ssm", s, 0.9, version="code-old") for s in range(2)]
    runs += [_run("ovq", s, 0.6 + 0.01 * s, version="code-new") for s in range(5)]
    runs += [_run("ssm", s, 0.3 + 0.02 * s, version="code-new") for s in range(5)]
    root = _write(tmp_path, "m.json", runs)
    result = evaluate(Claim("c", "t", against=["ssm"], results=["results/m.json"], seeds=5), root)
    assert result.answers == ["yes"] and "code code-new (4 runs of other code versions not paired)" in result.cells[0]
    assert result.verdict == "reproduced"
    # every comparison refused (no seed shared within one version): incomplete, never "not reproduced"
    alone = [_run("ovq", s, 0.6, version="code-old") for s in range(5)] + [_run("ssm", s, 0.3, version="code-new")
                                                                          for s in range(5)]
    root = _write(tmp_path, "r.json", alone)
    refused = evaluate(Claim("c", "t", against=["ssm"], results=["results/r.json"], seeds=5), root)
    assert refused.answers == ["refused"] and refused.verdict.startswith("incomplete: 1 of 1 comparisons refused")
    # ... and a refused comparison stays in the declared Holm family, as p = 1: the other's p is doubled
    alone += [_run("vq", s, 0.3 + 0.02 * s, version="code-old") for s in range(5)]
    root = _write(tmp_path, "r.json", alone)
    pair = evaluate(Claim("c", "t", against=["ssm", "vq"], results=["results/r.json"], seeds=5), root)
    single = evaluate(Claim("c", "t", against=["vq"], results=["results/r.json"], seeds=5), root)
    p_pair = float(pair.cells[1].split("Holm p ")[1].split(",")[0])
    p_single = float(single.cells[0].split("Holm p ")[1].split(",")[0])
    assert pair.answers[0] == "refused" and p_pair == pytest.approx(2 * p_single, rel=0.05)
    assert pair.verdict.startswith("incomplete: 1 of 2")


def test_two_memories_that_both_failed_the_gates_are_not_read_as_evidence(tmp_path):
    runs = [_run("ovq", s, 0.15 + 0.01 * s, learned=False, skill=0.4) for s in range(5)]
    runs += [_run("linear", s, 0.03, learned=False) for s in range(5)]
    runs += [_run("delta", s, 0.10 + 0.005 * s, learned=True) for s in range(5)]
    root = _write(tmp_path, "g.json", runs)
    both = evaluate(Claim("c", "t", against=["linear", "delta"], results=["results/g.json"], seeds=5), root)
    # ovq's lead over linear is large and significant, but neither passed its gates: not a "yes"; over
    # delta, which learned, ovq leads too, but a task ours never learned credits it with nothing
    assert both.answers == ["neither learned", "ours did not learn"] and "learned 0/5 vs 0/5" in both.cells[0]
    assert both.verdict == "not testable here: ovq did not pass the learned gates on most seeds"
    only = evaluate(Claim("c", "t", against=["linear"], results=["results/g.json"], seeds=5), root)
    assert only.verdict.startswith("not testable here: neither side passed the learned gates")


def test_as_much_needs_a_reference_that_recalls_at_the_point(tmp_path):
    # ovq and full both near chance at 8,192 facts: their difference sits inside any margin, which says
    # nothing about matching full attention; at 16 facts full recalls, and the match can be read
    runs = []
    for s in range(5):
        runs += [_curve_run("ovq", s, (0.95 + 0.002 * s, 0.03 + 0.001 * s), 2.0),
                 _curve_run("full", s, (0.96 + 0.001 * s, 0.031), 2.0)]
    root = _write(tmp_path, "floor.json", runs)
    floor = evaluate(Claim("c", "t", kind="as_much", against=["full"], results=["results/floor.json"],
                           endpoint="capacity@64", margin=0.05, seeds=5), root)
    assert floor.answers == ["reference does not recall here"] and "full's skill there 0.03" in floor.cells[0]
    assert floor.verdict.startswith("not testable here: the reference does not recall at this point")
    # short of its declared pairs, the reference's floor is not read either: more seeds could lift it
    short = evaluate(Claim("c", "t", kind="as_much", against=["full"], results=["results/floor.json"],
                           endpoint="capacity@64", margin=0.05, seeds=10), root)
    assert short.answers == ["pending"] and "5 of 10 pairs: no word read" in short.cells[0]
    assert "full's skill there 0.03" in short.cells[0] and short.verdict.startswith("pending")
    near = evaluate(Claim("c", "t", kind="as_much", against=["full"], results=["results/floor.json"],
                          endpoint="capacity@16", margin=0.05, seeds=5), root)
    assert near.answers == ["yes"] and near.verdict == "reproduced"


def test_claims_of_one_family_share_one_holm_adjustment(tmp_path):
    runs = [_run("ovq", s, 0.6 + 0.01 * s) for s in range(5)]
    runs += [_run("ssm", s, 0.55 + 0.01 * s + (0.01 if s % 2 else -0.01)) for s in range(5)]
    runs += [_run("vq", s, 0.5 + 0.012 * s + (0.02 if s % 2 else -0.02)) for s in range(5)]
    root = _write(tmp_path, "h.json", runs)
    apart = [Claim("a", "t", against=["ssm"], results=["results/h.json"], seeds=5),
             Claim("b", "t", against=["vq"], results=["results/h.json"], seeds=5)]
    together = [claims.replace(c, family="section 21") for c in apart]
    p = lambda results: [float(r.cells[0].split("Holm p ")[1].split(",")[0]) for r in results]
    raw, joint = p(claims.evaluate_claims(apart, root)), p(claims.evaluate_claims(together, root))
    from experiments.stats.multiple import holm
    assert joint == pytest.approx(holm(raw), rel=0.05) and min(joint) > min(raw)


def test_a_comparison_reads_one_scoring_for_all_its_pairs(tmp_path):
    # one run of the pair lacks the facts-in-force scoring: the whole comparison reads R's, not a mix
    runs = [{**_run("ovq", s, 0.6 + 0.01 * s), "summary_current": {"final_average": 0.1}} for s in range(3)]
    runs += [_run("ssm", s, 0.5 + 0.01 * s + (0.002 if s % 2 else 0)) for s in range(3)]
    root = _write(tmp_path, "s.json", runs)
    result = evaluate(Claim("c", "t", against=["ssm"], results=["results/s.json"], seeds=3), root)
    assert result.cells[0].startswith("vs ssm: +0.09")


def _capacity_run(layers, seed, score, version, skill=0.9):
    r = _run(layers, seed, 0.5, version=version)
    if score is not None:
        r["capacity"] = {"curve": {"metric": "accuracy", "points": [{"facts": 64, "score": score, "skill": skill}]}}
    return r


def test_the_version_chosen_is_the_one_with_most_pairs_that_measured_the_endpoint(tmp_path):
    # code-old ran seeds 0-4 of both without the 64-fact point; code-new ran seeds 0-2 with it
    runs = [_capacity_run(m, s, None, "code-old") for m in ("ovq", "full") for s in range(5)]
    runs += [_capacity_run("ovq", s, 0.9 + 0.01 * s, "code-new") for s in range(3)]
    runs += [_capacity_run("full", s, 0.9 + 0.01 * s + (0.002 if s % 2 else -0.002), "code-new") for s in range(3)]
    root = _write(tmp_path, "v.json", runs)
    result = evaluate(Claim("c", "t", kind="as_much", against=["full"], results=["results/v.json"],
                            endpoint="capacity@64", margin=0.05, seeds=3), root)
    assert result.answers == ["yes"] and "code code-new (10 runs of other code versions not paired)" in result.cells[0]


def test_comparisons_not_made_or_not_read_never_make_not_reproduced(tmp_path):
    runs = [_run("ovq", s, 0.6 + 0.01 * s) for s in range(3)]
    runs += [_run("linear", s, 0.3 - 0.01 * s, learned=False) for s in range(3)]
    runs += [{**_run("vq", s, 0.5), "summary": {}} for s in range(3)]          # never measured the endpoint
    runs += [_run("ssm", s, 0.2 + 0.01 * s + (0.002 if s % 2 else 0)) for s in range(3)]
    root = _write(tmp_path, "n.json", runs)
    nothing = evaluate(Claim("c", "t", against=["linear", "vq"], results=["results/n.json"], seeds=3), root)
    assert nothing.answers == ["against a non-learner", "not measured"]
    assert nothing.verdict == "not testable here: no comparison could be read (against a non-learner, not measured)"
    some = evaluate(Claim("c", "t", against=["ssm", "vq"], results=["results/n.json"], seeds=3), root)
    assert some.answers == ["yes", "not measured"]
    assert some.verdict == "partly (1 of 2); 1 of 2 comparisons not read (not measured)"


def test_fails_to_learn_counts_seeds_not_runs(tmp_path):
    # seeds 0-2 of vq by two codes (or rerun) are 3 seeds, not 6: a declared 5 is not met
    runs = [_run("ovq", s, 0.6, version=v) for s in range(3) for v in ("code-a", "code-b")]
    runs += [_run("vq", s, 0.1, learned=False, version=v) for s in range(3) for v in ("code-a", "code-b")]
    root = _write(tmp_path, "f2.json", runs)
    result = evaluate(Claim("c", "t", kind="fails_to_learn", against=["vq"], results=["results/f2.json"], seeds=5), root)
    assert result.verdict == "pending (3 of 5 seeds in the comparison with fewest)"
    assert "3/3 seeds learned nothing" in result.cells[0] and "ovq: 3/3 learned" in result.cells[0]


def test_a_family_counts_a_member_without_runs_and_waits_for_it(tmp_path):
    runs = [_run("ovq", s, 0.6 + 0.01 * s) for s in range(5)]
    runs += [_run("ssm", s, 0.55 + 0.01 * s + (0.01 if s % 2 else -0.01)) for s in range(5)]
    root = _write(tmp_path, "w.json", runs)
    a = Claim("a", "t", against=["ssm"], results=["results/w.json"], seeds=5, family="F")
    b = Claim("b", "t", against=["vq"], results=["results/none.json"], seeds=5, family="F")   # not run yet
    alone, joint = claims.evaluate_claims([claims.replace(a, family="")], root)[0], claims.evaluate_claims([a, b], root)
    p = lambda r: float(r.cells[0].split("Holm p ")[1].split(",")[0])
    assert p(joint[0]) == pytest.approx(2 * p(alone), rel=0.05)           # b's comparison counts as p = 1
    assert alone.verdict == "reproduced" and joint[0].verdict == "pending (its Holm family, F, waits for 1 of its 2 rows)"
    assert joint[1].verdict == "not run yet"
    # a fails_to_learn claim in the same family changes no one's adjustment
    c = Claim("c", "t", kind="fails_to_learn", against=["ssm"], results=["results/w.json"], seeds=5, family="F")
    with_c = claims.evaluate_claims([claims.replace(a, family="G"), claims.replace(c, family="G")], root)
    assert p(with_c[0]) == pytest.approx(p(alone))


def test_most_seeds_means_more_than_half_and_the_latest_rerun_counts(tmp_path):
    # ours and theirs each learned on exactly 2 of 4 seeds: neither learned on most
    runs = [_run("ovq", s, 0.6 + 0.01 * s, learned=s < 2) for s in range(4)]
    runs += [_run("ssm", s, 0.3 + 0.02 * s, learned=s >= 2) for s in range(4)]
    root = _write(tmp_path, "m2.json", runs)
    half = evaluate(Claim("c", "t", against=["ssm"], results=["results/m2.json"], seeds=4), root)
    assert half.answers == ["neither learned"]
    # seed 0 of ssm run again by the same code, later in the list: the later run is the one paired
    runs.append(_run("ssm", 0, 0.9))
    root = _write(tmp_path, "m2.json", runs)
    later = evaluate(Claim("c", "t", against=["ssm"], results=["results/m2.json"], seeds=4), root)
    assert "learned 2/4 vs 3/4" in later.cells[0]


def test_an_as_much_interval_in_a_family_is_read_at_the_familys_share_of_five_percent(tmp_path):
    runs = [_run("ovq", s, 0.60 + 0.01 * s) for s in range(6)]
    runs += [_run("full", s, 0.60 + 0.01 * s + (0.012 if s % 2 else -0.012)) for s in range(6)]
    runs += [_run("ssm", s, 0.3 + 0.02 * s) for s in range(6)]
    root = _write(tmp_path, "e.json", runs)
    match = Claim("m", "t", kind="as_much", against=["full"], results=["results/e.json"], margin=0.02, seeds=6)
    more = Claim("b", "t", against=["ssm"], results=["results/e.json"], seeds=6)
    alone = evaluate(match, root)
    together = claims.evaluate_claims([claims.replace(match, family="F"), claims.replace(more, family="F")], root)[0]
    assert alone.answers == ["yes"] and "interval" not in alone.cells[0].split("(margin")[0]
    assert "97.5% interval: a family of 2" in together.cells[0]
    def width(cell):
        low, high = (float(x) for x in cell.split("[")[1].split("]")[0].split(", "))
        return high - low
    assert width(together.cells[0]) > width(alone.cells[0])


def test_a_replicate_in_two_result_files_is_read_from_the_later_file(tmp_path):
    # the same seeds of ssm rerun by the same code, listed in the second file: the second is the later
    first = [_run("ovq", s, 0.6 + 0.01 * s) for s in range(3)] + [_run("ssm", s, 0.9) for s in range(3)] * 3
    second = [_run("ssm", s, 0.3 + 0.01 * s + (0.002 if s % 2 else 0)) for s in range(3)]
    _write(tmp_path, "one.json", first)
    root = _write(tmp_path, "two.json", second)
    result = evaluate(Claim("c", "t", against=["ssm"], results=["results/one.json", "results/two.json"], seeds=3), root)
    assert result.cells[0].startswith("vs ssm: +0.29")


@pytest.mark.parametrize("endpoint, ours_better", [("forgetting_max", True), ("bwt", True), ("final_average", False)])
def test_forgetting_endpoints_are_lower_is_better_whatever_the_metric(tmp_path, endpoint, ours_better):
    # ovq forgets 0.10, ssm 0.50 (bwt the negatives) while ssm's final average is higher: "more" on
    # forgetting means forgetting less, on bwt a higher bwt, on the final average a higher score
    def run(layers, s, forgetting, final):
        r = _run(layers, s, final)
        r["summary"].update({"forgetting_max": forgetting + 0.01 * (s % 2), "bwt": -forgetting - 0.01 * (s % 2)})
        return r
    runs = [run("ovq", s, 0.10 + 0.01 * s, 0.5) for s in range(4)] + [run("ssm", s, 0.50, 0.8 + 0.01 * s) for s in range(4)]
    root = _write(tmp_path, "g.json", runs)
    result = evaluate(Claim("c", "t", against=["ssm"], results=["results/g.json"], endpoint=endpoint, seeds=4), root)
    assert result.answers == (["yes"] if ours_better else ["opposite"])


def test_secondary_endpoints_are_shown_on_the_same_pairs_and_never_read(tmp_path):
    # ovq holds more at the end (final average 0.6 + 0.01 s against 0.3) but learned less (learning
    # average 0.6 against 0.95) and forgets less (0.05 against 0.60, one ssm run without the measurement):
    # the answer is the final average's alone, the cell shows the other two on the same pairs
    def run(layers, s, final, learning, forgetting):
        r = _run(layers, s, final)
        r["summary"].update({"learning_average": learning + 0.01 * (s % 2)})
        if forgetting is not None:
            r["summary"]["forgetting_learned"] = forgetting + 0.02 * s
        return r
    runs = ([run("ovq", s, 0.6 + 0.01 * s, 0.6, 0.05) for s in range(4)]
            + [run("ssm", s, 0.3, 0.95 - 0.004 * s, None if s == 3 else 0.6 + 0.01 * s) for s in range(4)])
    # a fifth seed whose primary endpoint ovq did not measure: not a pair of the comparison, so not of its
    # secondaries either (they are read on the primary's pairs only)
    runs += [run("ovq", 4, 0.0, 0.0, 0.9), run("ssm", 4, 0.3, 0.95, 0.6)]
    runs[-2]["summary"]["final_average"] = None
    root = _write(tmp_path, "s.json", runs)
    plain = Claim("c", "t", against=["ssm"], results=["results/s.json"], seeds=4)
    shown = replace(plain, secondary=["forgetting_learned", "learning_average"])
    a, b = evaluate(plain, root), evaluate(shown, root)
    assert a.answers == b.answers == ["yes"] and a.verdict == b.verdict == "reproduced"
    assert b.cells[0].startswith(a.cells[0] + ". Beside it, not read (95% CI, unadjusted): ")
    # forgetting: ours - theirs = -0.55 - 0.01 s on the 3 pairs that measured it; learning: -0.35 + 0.004 s
    assert "forgetting_learned (lower is better) -0.560 [-0.585, -0.535] over 3 pairs" in b.cells[0]
    assert "learning_average (higher is better) -0.344 [" in b.cells[0]
    assert "Beside" not in a.cells[0] and "4 pairs" in a.cells[0] and "over 5" not in b.cells[0]
    # every pair differing by the same amount shows no interval (as the primary's rule would not)
    for r in runs:
        r["summary"]["learning_average"] = 0.5 if r["params"]["model.layers"] == "['ovq']" else 0.25
    root = _write(tmp_path, "s.json", runs)
    same = evaluate(shown, root)
    assert "learning_average (higher is better) +0.250 in every one of 4 pairs (zero variance, no interval)" in same.cells[0]


def test_secondary_endpoints_are_validated_like_the_endpoint(tmp_path):
    bad = tmp_path / "c.yaml"
    head = "claims:\n  - {claim: x, test: y, seeds: 5, against: [vq], results: [r.json], "
    _refused(bad, head + "secondary: [forgeting]}\n", "secondary endpoint 'forgeting' is not a summary name")
    _refused(bad, head + "secondary: [final_average]}\n", "distinct and not the endpoint")
    _refused(bad, head + "secondary: forgetting_max}\n", "secondary is a list")
    _refused(bad, head + "kind: fails_to_learn, secondary: [forgetting_max]}\n", "not on a fails_to_learn claim")


def test_an_as_much_no_says_whether_the_interval_is_beyond_the_margin_or_only_too_wide(tmp_path):
    # ssm: ovq - ssm = +0.30 +- 0.01 (beyond a 0.05 margin); vq: -0.02 with a spread of +-0.06 (too wide)
    runs = [_run("ovq", s, 0.6 + 0.01 * s) for s in range(4)]
    runs += [_run("ssm", s, 0.3 + 0.01 * s + (0.005 if s % 2 else -0.005)) for s in range(4)]
    runs += [_run("vq", s, 0.62 + 0.01 * s + (0.06 if s % 2 else -0.06)) for s in range(4)]
    root = _write(tmp_path, "w.json", runs)
    result = evaluate(Claim("c", "t", kind="as_much", against=["ssm", "vq"], results=["results/w.json"],
                            margin=0.05, seeds=4), root)
    assert result.answers == ["no", "no"] and result.verdict == "not reproduced"
    assert ": no (the whole interval beyond the margin); two one-sided tests p " in result.cells[0]
    assert (": no (the interval reaches past the margin: a match is not shown, nor a difference beyond it); two "
            "one-sided tests p ") in result.cells[1]


def _neutral_run(layers, seed, scores, slots=None, skills=None):
    """A run whose neutral interference curve scores ``scores`` at 0 and 32,768 items (skill = score
    unless given: chance 0 here)."""
    r = _run(layers, seed, 0.5)
    if slots:
        r["params"]["after_meta.model.mixers.ovq.num_slots"] = slots
    skills = skills or scores
    r["interference"] = {"metric": "accuracy", "tokens_per_item": 2, "curves": {"neutral": [
        {"items": n, "tokens": 2 * n, "score": sc, "standard_error": 0.01, "chance": 0.0, "skill": sk, "episodes": 16}
        for n, sc, sk in zip((0, 32768), scores, skills)]}}
    return r


def test_an_interference_point_is_read_and_matching_needs_a_reference_that_recalls_there(tmp_path):
    # length alone: ovq recalls 0.90 + 0.01 s after 65,536 separator tokens, full attention 0.92 + 0.01 s
    # (+-0.002): the difference is -0.02 and inside a 0.05 margin; at 0 items both are near 1
    runs = []
    for s in range(5):
        runs += [_neutral_run("ovq", s, (0.99, 0.90 + 0.01 * s), slots="2048"),
                 _neutral_run("full", s, (1.0, 0.92 + 0.01 * s + (0.002 if s % 2 else -0.002)))]
    root = _write(tmp_path, "n.json", runs)
    ours = "ovq | after_meta.model.mixers.ovq.num_slots=2048"
    far = evaluate(Claim("c", "t", kind="as_much", ours=ours, against=["full"], results=["results/n.json"],
                         endpoint="interference@neutral@32768", margin=0.05, seeds=5), root)
    assert far.answers == ["yes"] and far.cells[0].startswith("vs full: -0.020 [") and "full's skill there 0.94" in far.cells[0]
    more = evaluate(Claim("c", "t", ours=ours, against=["full"], results=["results/n.json"],
                          endpoint="interference@neutral@32768", seeds=5), root)
    assert more.answers == ["opposite"]
    absent = evaluate(Claim("c", "t", ours=ours, against=["full"], results=["results/n.json"],
                            endpoint="interference@repeat@32768", seeds=5), root)
    assert absent.answers == ["not measured"]
    # full attention at chance after the filler (skill 0.02): matching it says nothing
    for r in runs:
        if r["params"]["model.layers"] == "['full']":
            r["interference"]["curves"]["neutral"][1].update(score=0.1, skill=0.02)
        else:
            r["interference"]["curves"]["neutral"][1].update(score=0.1 + 0.001 * r["seed"], skill=0.02)
    root = _write(tmp_path, "n.json", runs)
    floor = evaluate(Claim("c", "t", kind="as_much", ours=ours, against=["full"], results=["results/n.json"],
                           endpoint="interference@neutral@32768", margin=0.05, seeds=5), root)
    assert floor.answers == ["reference does not recall here"]
    assert floor.verdict.startswith("not testable here: the reference does not recall at this point")


def test_interference_endpoints_are_validated(tmp_path):
    bad = tmp_path / "c.yaml"
    head = "claims:\n  - {claim: x, test: y, seeds: 5, against: [vq], results: [r.json], "
    for endpoint in ("interference@neutral", "interference@@64", "interference@neutral@many"):
        _refused(bad, head + f"endpoint: '{endpoint}'}}\n", "interference@KIND@ITEMS needs a filler kind")


def test_a_family_counts_each_test_once_and_the_tests_no_row_shows(tmp_path):
    """Two rows of one declared family that both show ours against ssm count it once; a test no row shows
    (family_also) counts in the adjustment: a family of {ssm, vq, linear} here, three tests, not four or two."""
    runs = [_run("ovq", s, 0.6 + 0.01 * s) for s in range(5)]
    runs += [_run("ssm", s, 0.55 + 0.01 * s + (0.01 if s % 2 else -0.01)) for s in range(5)]
    runs += [_run("vq", s, 0.5 + 0.012 * s + (0.02 if s % 2 else -0.02)) for s in range(5)]
    runs += [_run("linear", s, 0.58 + 0.01 * s + (0.015 if s % 2 else -0.015)) for s in range(5)]
    root = _write(tmp_path, "f.json", runs)
    p = lambda cell: float(cell.split("Holm p ")[1].split(",")[0])
    alone = {name: p(evaluate(Claim("x", "t", against=[name], results=["results/f.json"], seeds=5), root).cells[0])
             for name in ("ssm", "vq", "linear")}
    rows = [Claim("a", "t", against=["ssm", "vq"], results=["results/f.json"], seeds=5, family="F", family_also=["linear"]),
            Claim("b", "t", against=["ssm"], results=["results/f.json"], seeds=5, family="F")]
    a, b = claims.evaluate_claims(rows, root)
    from experiments.stats.multiple import holm
    expected = dict(zip(alone, holm(list(alone.values()))))
    assert p(a.cells[0]) == pytest.approx(expected["ssm"], rel=0.05) and p(b.cells[0]) == p(a.cells[0])
    assert p(a.cells[1]) == pytest.approx(expected["vq"], rel=0.05)
    assert len(a.cells) == 2 and not any("linear" in cell for cell in a.cells)       # counted, not shown


def test_the_shipped_families_match_their_studies_declarations():
    """The claims rows of a confirmatory study adjust over the family it declared, of the size it declared."""
    import re
    import shlex

    from experiments.study_specs import load_study
    from experiments.sweep import parse_grid

    def declared(name):
        """(mixers other than the study's baseline, seeds) of its sweep command, as the sweep reads its grid."""
        spec = load_study(name)
        grids = [parse_grid([a[i + 1] for i, x in enumerate(a) if x == "--grid"]) for a in map(shlex.split, spec.commands)]
        layers = next(v for grid in grids for k, v in grid.items() if k.split("&")[0] == "model.layers")
        mixers = {"+".join(re.match(r"\[([\w,]+)\]", v).group(1).split(",")) for v in layers} - {spec.baseline.split("|")[0].strip()}
        return mixers, max(len(grid.get("seed", [])) for grid in grids)

    _, shipped = claims.load_claims()
    mixers, seeds = declared("confirm_icr")
    of13 = [c for c in shipped if c.family == "section 13"]
    assert {name for c in of13 for name in c.against + c.family_also} == mixers and len(mixers) == 7
    assert all(c.seeds == seeds == 10 for c in of13)
    (of14,) = [c for c in shipped if c.family == "section 14"]
    mixers, seeds = declared("confirm_text")
    assert set(of14.against + of14.family_also) == mixers and len(of14.against + of14.family_also) == 7
    assert of14.seeds == seeds
    (of24,) = [c for c in shipped if c.family == "section 24"]
    mixers, seeds = declared("cicr_regions")
    assert set(of24.against + of24.family_also) == mixers == {"vq", "delta", "ssm", "full"} and of24.seeds == seeds == 5
    mixers, seeds = declared("why_forget_confirm")
    (long_horizon,) = [c for c in shipped if c.results == ["results/why_forget_confirm.json"]]
    assert set(long_horizon.against) == mixers and long_horizon.seeds == seeds == 10 and not long_horizon.family


def _capacity_pairs(tmp_path, full_skill, full_learned=5, ours_score=0.80, full_score=0.82):
    """Five pairs at capacity@64 (ours 0.80 + 0.01 s, full attention 0.82 + 0.01 s +- 0.002, chance 0.25:
    the skill is not the score), full attention's skill at the point ``full_skill`` (a number or a list)."""
    skills = full_skill if isinstance(full_skill, list) else [full_skill] * 5
    runs = []
    for s in range(5):
        ours = _capacity_run("ovq", s, ours_score + 0.01 * s, "code-a", skill=0.7)
        full = _capacity_run("full", s, full_score + 0.01 * s + (0.002 if s % 2 else -0.002), "code-a", skill=skills[s])
        if skills[s] is None:
            del full["capacity"]["curve"]["points"][0]["skill"]
        full["learned"] = s < full_learned
        runs += [ours, full]
    root = _write(tmp_path, "k.json", runs)
    return evaluate(Claim("c", "t", kind="as_much", against=["full"], results=["results/k.json"],
                          endpoint="capacity@64", margin=0.05, seeds=5), root)


def test_as_much_reads_the_reference_skill_not_its_score_at_the_bar_of_the_learned_gate(tmp_path):
    """The endpoint is the point's score (the difference -0.02 is the scores'); whether the reference recalls
    is its skill there, at the learned gate's bar of 0.5 inclusive, over the pairs, every one measured."""
    at_bar = _capacity_pairs(tmp_path, 0.5)
    assert at_bar.answers == ["yes"] and at_bar.cells[0].startswith("vs full: -0.020 [")
    assert _capacity_pairs(tmp_path, 0.49).answers == ["reference does not recall here"]     # scores 0.82: skill reads
    assert _capacity_pairs(tmp_path, 0.2).answers == ["reference does not recall here"]      # not the stream gate's 0.1
    missing = _capacity_pairs(tmp_path, [0.9, 0.9, 0.9, 0.9, None])                          # one run without it
    assert missing.answers == ["reference's skill not measured here"]
    assert missing.verdict == "not testable here: the reference has no measured skill at this point"


def test_as_much_needs_a_reference_that_learned_on_most_seeds_and_half_is_not_most(tmp_path):
    assert _capacity_pairs(tmp_path, 0.9, full_learned=2).answers == ["reference did not learn"]
    assert _capacity_pairs(tmp_path, 0.9, full_learned=3).answers == ["yes"]
    runs = [_run("ovq", s, 0.6 + 0.01 * s) for s in range(4)]
    runs += [{**_run("full", s, 0.61 + 0.01 * s + (0.002 if s % 2 else -0.002)), "learned": s < 2} for s in range(4)]
    root = _write(tmp_path, "h.json", runs)
    half = evaluate(Claim("c", "t", kind="as_much", against=["full"], results=["results/h.json"], margin=0.05, seeds=4), root)
    assert half.answers == ["yes"]                                    # 2 of 4 failed: not most, read


def test_as_much_inside_the_margin_is_inclusive_and_a_near_zero_spread_makes_no_test(tmp_path):
    runs = [_run("ovq", s, 0.6 + 0.01 * s + (0.01 if s % 2 else -0.01)) for s in range(5)]
    runs += [_run("full", s, 0.6 + 0.01 * s) for s in range(5)]
    root = _write(tmp_path, "m.json", runs)
    claim = Claim("c", "t", kind="as_much", against=["full"], results=["results/m.json"], seeds=5, margin=0.05)
    result = evaluate(claim, root)
    c = paired_comparison([0.6 + 0.01 * s + (0.01 if s % 2 else -0.01) for s in range(5)], [0.6 + 0.01 * s for s in range(5)])
    edge = max(abs(c.low), abs(c.high))
    assert result.answers == ["yes"] and evaluate(replace(claim, margin=edge), root).answers == ["yes"]
    # differences equal to within rounding (no t-test, an interval ~1e-16 wide): never "inside the margin"
    theirs = [0.1, 0.2, 0.7, 0.33]
    runs = [_run("ovq", s, t + 0.03) for s, t in enumerate(theirs)] + [_run("full", s, t) for s, t in enumerate(theirs)]
    root = _write(tmp_path, "z.json", runs)
    flat = evaluate(Claim("c", "t", kind="as_much", against=["full"], results=["results/z.json"], seeds=4, margin=0.05), root)
    assert flat.answers == ["no t-test"] and flat.verdict.startswith("undecided")


DIFFS = [0.022, -0.008, 0.032, 0.002, 0.027, -0.003, 0.022, 0.012, 0.017, -0.008]     # ours - theirs: raw p 0.036


def test_a_comparison_short_of_its_pairs_reads_no_word_nor_one_its_family_could_still_move(tmp_path):
    """A declared family of two, 10 pairs each: ssm complete at raw p 0.036, vq at 3 of 10 pairs. vq's cell
    shows its numbers and raw p and no word; ssm's word waits, since with vq still to come its Holm p lies
    between 0.036 (vq at p = 0: 'yes') and 0.073 (vq at p = 1: 'no difference'). Once vq has its 10 pairs
    (far from significant) both are read over the family of two."""
    runs = [_run("ovq", s, 0.6 + d) for s, d in enumerate(DIFFS)] + [_run("ssm", s, 0.6) for s in range(10)]
    vq = [_run("vq", s, 0.6 + d + 0.02 * (-1) ** s) for s, d in enumerate(DIFFS)]
    claim = Claim("c", "t", against=["ssm", "vq"], results=["results/p.json"], seeds=10)
    root = _write(tmp_path, "p.json", runs + vq[:3])
    result = evaluate(claim, root)
    assert result.answers == ["pending", "pending"] and result.verdict.startswith("pending (3 of 10 pairs")
    assert result.cells[0].endswith("pending (tests of its Holm family still to come could move its p)")
    assert "Holm p 0.036-0.073, 10 pairs" in result.cells[0]
    assert "unadjusted, 3 pairs" in result.cells[1] and result.cells[1].endswith("pending (3 of 10 pairs: no word read)")
    # an "as much" comparison short of its pairs reads no word either
    near = evaluate(replace(claim, kind="as_much", against=["vq"], margin=1.0), root)
    assert near.answers == ["pending"] and near.cells[0].endswith("pending (3 of 10 pairs: no word read)")
    (tmp_path / "done").mkdir()
    done = evaluate(claim, _write(tmp_path / "done", "p.json", runs + vq))
    assert done.answers == ["no difference detected", "no difference detected"] and "Holm p 0.073" in done.cells[0]
    assert done.verdict.startswith("not reproduced: no difference detected (a difference of about ")


def test_a_complete_comparison_waits_for_an_unshown_test_of_its_family_still_to_come(tmp_path):
    """A claim against ssm (complete, raw p 0.036) whose declared family also holds vq (family_also, 3 of 10
    pairs): its word and its verdict wait; a short comparison without a t-test so far says so, no word."""
    runs = [_run("ovq", s, 0.6 + d) for s, d in enumerate(DIFFS)] + [_run("ssm", s, 0.6) for s in range(10)]
    runs += [_run("vq", s, 0.6 + d + 0.02 * (-1) ** s) for s, d in enumerate(DIFFS)][:3]
    root = _write(tmp_path, "f.json", runs)
    claim = Claim("c", "t", against=["ssm"], family_also=["vq"], results=["results/f.json"], seeds=10)
    result = evaluate(claim, root)
    assert result.answers == ["pending"]
    assert result.verdict == "pending (tests of its Holm family still to come could move a comparison's word)"
    flat = [_run("ovq", s, 0.5) for s in range(3)] + [_run("ssm", s, 0.25) for s in range(3)]      # 0.25 on each
    short = evaluate(Claim("c", "t", against=["ssm"], results=["results/g.json"], seeds=5), _write(tmp_path, "g.json", flat))
    assert short.answers == ["pending"] and "no t-test so far" in short.cells[0]
    assert short.cells[0].endswith("pending (3 of 5 pairs: no word read)") and short.verdict.startswith("pending (3 of 5")


# --- readings that cannot say more than the runs (issue 63) ---------------------------------------------

def _stream_run(layers, seed, diagonal, final, learned=True):
    """A run whose R has ``diagonal`` as its learning scores (chance 0 on every experience, stream gate's
    threshold 0.1), so that stopping to learn can be read from it; its final average is ``final``."""
    r = _run(layers, seed, final, learned=learned)
    k = len(diagonal)
    r["R"] = [[diagonal[i] if i == j else (final if i == k - 1 else 0.0) for j in range(k)] for i in range(k)]
    r["stream_gate"] = {"skill": 0.3 if learned else 0.0, "chances": [0.0] * k, "threshold": 0.1,
                        "learned": learned}
    return r


def test_a_baseline_that_did_not_learn_cannot_give_a_win(tmp_path):
    # ovq learned; vq failed its gates on every seed: a large, significant lead is not read as a win
    runs = [_run("ovq", s, 0.6 + 0.01 * s) for s in range(5)] + [_run("vq", s, 0.1 + 0.005 * s, learned=False)
                                                                  for s in range(5)]
    runs += [_run("ssm", s, 0.3 + 0.02 * s) for s in range(5)]
    root = _write(tmp_path, "nl.json", runs)
    alone = evaluate(Claim("c", "t", against=["vq"], results=["results/nl.json"], seeds=5), root)
    assert alone.answers == ["against a non-learner"] and "learned 5/5 vs 0/5" in alone.cells[0]
    assert alone.verdict.startswith("not testable here: every baseline failed the learned gates")
    both = evaluate(Claim("c", "t", against=["vq", "ssm"], results=["results/nl.json"], seeds=5), root)
    assert both.answers == ["against a non-learner", "yes"]
    assert both.verdict == "partly (1 of 2); 1 of 2 comparisons not read (against a non-learner)"
    # a loss to a mixer that learned, where ours did not, still counts against the claim
    runs = [_run("ovq", s, 0.1 + 0.01 * s, learned=False) for s in range(5)] + [_run("ssm", s, 0.6 + 0.02 * s)
                                                                                 for s in range(5)]
    lost = evaluate(Claim("c", "t", against=["ssm"], results=["results/lost.json"], seeds=5),
                    _write(tmp_path, "lost.json", runs))
    assert lost.answers == ["opposite"] and lost.verdict == "not reproduced"


def test_a_winner_that_stopped_learning_is_named_in_the_word_and_the_verdict(tmp_path):
    runs = []
    for s in range(5):
        # ovq takes in the first two experiences, then nothing (skill below 0.1 from exp 2), and keeps them;
        # the ssm learns every experience and keeps none
        runs += [_stream_run("ovq", s, [0.5, 0.2, 0.05, 0.04], 0.22 + 0.01 * s),
                 _stream_run("ssm", s, [0.2, 0.2, 0.2, 0.2], 0.08 + 0.005 * s)]
    root = _write(tmp_path, "st.json", runs)
    result = evaluate(Claim("c", "t", against=["ssm"], results=["results/st.json"], seeds=5), root)
    assert result.answers == ["yes"]
    assert result.cells[0].endswith(": yes; ovq stopped learning on 5/5 seeds (from exp 2)")
    assert result.verdict == "reproduced; won by a memory that stopped learning (ovq: 5/5 seeds, from exp 2)"
    # a winner that kept learning carries no such words
    keeps = [_stream_run("ovq", s, [0.5, 0.4, 0.4, 0.4], 0.4 + 0.01 * s) for s in range(5)]
    keeps += [_stream_run("ssm", s, [0.2, 0.2, 0.2, 0.2], 0.08 + 0.005 * s) for s in range(5)]
    kept = evaluate(Claim("c", "t", against=["ssm"], results=["results/k.json"], seeds=5), _write(tmp_path, "k.json", keeps))
    assert kept.verdict == "reproduced" and kept.cells[0].endswith(": yes")


def test_no_difference_says_the_smallest_effect_the_test_could_detect(root):
    from experiments.stats.power import detectable_difference

    result = evaluate(Claim("c", "t", against=["linear"], results=["results/a.json"]), root)
    assert result.answers == ["no difference detected"]
    sd = 0.002 * (6 / 5) ** 0.5          # differences +-0.002 alternating over 6 seeds: sample SD
    assert f"80% power to detect {detectable_difference(sd, 6):.3f} at 5%; paired SD {sd:.3f}" in result.cells[0]
    # in a family, also at Holm's first step (5% / the family's size), a larger effect
    family = evaluate(Claim("c", "t", against=["linear", "ssm"], results=["results/a.json"]), root)
    assert f"{detectable_difference(sd, 6, alpha=0.025):.3f} at Holm's first step (5%/2)" in family.cells[0]
    # known answers of the power computation: n = 10 pairs at SD 0.1 detects about 0.0996; more seeds, less
    assert detectable_difference(0.1, 10) == pytest.approx(0.0996, abs=2e-4)
    # a verdict of no detected differences says what they could not have seen, not only "not reproduced"
    assert result.verdict == (f"not reproduced: no difference detected (a difference of about "
                              f"{detectable_difference(sd, 6):.2f} would have been found with 80% power at the family's "
                              "level; smaller ones may have been missed; equivalence not shown)")
    assert detectable_difference(0.1, 40) < detectable_difference(0.1, 10) < detectable_difference(0.1, 5)


def test_an_equivalence_reads_differently_inside_and_outside_its_margin(root):
    inside = evaluate(Claim("c", "t", kind="as_much", against=["linear"], results=["results/a.json"], margin=0.01), root)
    outside = evaluate(Claim("c", "t", kind="as_much", against=["linear"], results=["results/a.json"], margin=0.001), root)
    assert inside.answers == ["yes"] and outside.answers == ["no"]
    assert "yes (equivalent: the whole interval inside +-0.01); two one-sided tests p " in inside.cells[0]
    p_in = float(inside.cells[0].rsplit("two one-sided tests p ", 1)[1].split()[0])
    p_out = float(outside.cells[0].rsplit("two one-sided tests p ", 1)[1].split()[0])
    assert p_in < 0.05 < p_out
    assert inside.verdict == "reproduced" and outside.verdict == "not reproduced"


def test_floor_against_floor_at_the_point_read_is_not_testable(tmp_path):
    runs = []
    for s in range(5):
        runs += [_curve_run("ovq", s, (0.95, 0.10 + 0.01 * s), 2.0), _curve_run("ssm", s, (0.9, 0.02), 2.0)]
    root = _write(tmp_path, "fl.json", runs)
    floor = evaluate(Claim("c", "t", against=["ssm"], results=["results/fl.json"], endpoint="capacity@64", seeds=5), root)
    assert floor.answers == ["both at the floor"] and "skill there 0.12 vs 0.02" in floor.cells[0]
    assert floor.verdict.startswith("not testable here: neither side recalls at the point read")
    up = evaluate(Claim("c", "t", against=["ssm"], results=["results/fl.json"], endpoint="capacity@16", seeds=5), root)
    assert up.answers == ["no t-test"]          # both recall at 16 facts: read (here, every pair differs by 0.05)


def test_a_row_that_awaits_a_declared_study_is_not_decided_until_its_runs_are_in(root):
    claim = Claim("c", "t", against=["ssm"], results=["results/a.json"], awaits="cicr_fresh_long")
    waiting = claims.evaluate_claims([claim], root)[0]
    assert waiting.verdict == ("not decided: waits for the declared study cicr_fresh_long (section 31: "
                               "results/cicr_fresh_long.json (not written)); its own comparisons read so far: reproduced")
    done = claims.evaluate_claims([claim], root, unfinished=lambda name: [])[0]
    assert done.verdict == "reproduced"


def test_evidence_class_is_declared_and_checked(tmp_path):
    import re

    assert Claim("c", "t", seeds=10, confirmatory=True).evidence == "confirmatory, 10 seeds"
    assert Claim("c", "t", seeds=5).evidence == "exploratory, 5 seeds"
    bad = tmp_path / "c.yaml"
    _refused(bad, "claims:\n  - {claim: x, test: y, seeds: 5, confirmatory: true, against: [vq], results: [r.json]}\n",
             "confirmatory row is a paired comparison declared with at least 10 seeds")
    _refused(bad, "claims:\n  - {claim: x, test: y, seeds: 5, awaits: no_such_study, against: [vq], results: [r.json]}\n",
             "awaits study 'no_such_study' not found")
    _, shipped = claims.load_claims()
    # the shipped rows of the declared confirmatory studies (13, 14, 16, 23, 26, 32) are marked so
    assert {re.findall(r"section (\d+)", c.test)[-1] for c in shipped if c.confirmatory} == {"13", "14", "16", "23", "26", "32"}


def test_the_findings_table_reads_the_claims_rows_with_a_headline_and_goes_between_its_markers(root):
    (Path(root) / "claims.yaml").write_text(
        "preamble: p\nclaims:\n  - claim: c\n    headline: 'OVQ beats the SSM'\n    test: 't, 6 seeds (section 9)'\n"
        "    seeds: 6\n    results: [results/a.json]\n    against: [ssm]\n"
        "  - claim: d\n    test: t\n    seeds: 6\n    results: [results/a.json]\n    against: [vq]\n")
    table = claims.findings_table(root, str(Path(root) / "claims.yaml"), state=lambda c: "verified")
    assert table.splitlines()[2] == "| OVQ beats the SSM | section 9 | reproduced | 6 | exploratory | verified |"
    assert len(table.splitlines()) == 3                      # the row without a headline is not in it
    readme = f"# t\n\n{claims.FINDINGS_START}\nold\n{claims.FINDINGS_END}\n\nrest\n"
    assert claims.replace_findings(readme, table) == f"# t\n\n{claims.FINDINGS_START}\n{table}{claims.FINDINGS_END}\n\nrest\n"
    with pytest.raises(ValueError, match="no findings markers"):
        claims.replace_findings("# t\n", table)


def test_the_readme_findings_table_is_the_generated_one():
    """README's table is what `ovq-cl report` writes from the project's runs (never edited by hand)."""
    from experiments import report

    root = report.PROJECT_DIR
    text = Path(root, "README.md").read_text()
    table = claims.findings_table(root, unfinished=lambda name: report.unfinished_sweeps(claims.awaited_study(name), root),
                                  state=report._claim_state(root))
    assert claims.replace_findings(text, table) == text


def test_a_more_claim_with_a_declared_margin_reads_difference_equivalence_or_not_decided(tmp_path):
    from experiments.stats.power import equivalence_p

    runs = [_run("ovq", s, 0.60 + 0.01 * s) for s in range(10)]
    runs += [_run("delta", s, 0.60 + 0.01 * s + 0.004 * (-1) ** s) for s in range(10)]      # within +-0.05
    runs += [_run("ssm", s, 0.60 + 0.01 * s + 0.08 * (-1) ** s) for s in range(10)]         # too spread to say
    runs += [_run("vq", s, 0.30 + 0.01 * s + 0.004 * (-1) ** s) for s in range(10)]         # a difference
    root = _write(tmp_path, "m.json", runs)
    same = evaluate(Claim("c", "t", against=["delta"], results=["results/m.json"], seeds=10, margin=0.05), root)
    p = equivalence_p([0.60 + 0.01 * s for s in range(10)], [0.60 + 0.01 * s + 0.004 * (-1) ** s for s in range(10)], 0.05)
    assert same.answers == ["equivalent"] and f"equivalent within +-0.05 (two one-sided tests p {p:.2g} < 0.05)" in same.cells[0]
    assert same.verdict == "not reproduced: equivalent within +-0.05 in 1 of 1 comparisons"
    assert "Wilcoxon p " in same.cells[0]                                                    # the rank test beside the t-test
    short = evaluate(Claim("c", "t", against=["delta", "ssm", "vq"], results=["results/m.json"], seeds=10, margin=0.05), root)
    assert short.answers == ["equivalent", "no difference detected", "yes"]
    assert "equivalence within +-0.05 not shown (two one-sided tests p " in short.cells[1]
    assert "< 0.017)" in short.cells[0]                      # 5% / 3 in a family of three
    assert "at Holm's first step (5%/3)" in short.cells[1]      # what the undecided one could have seen
    assert short.verdict == "not decided: neither a difference nor equivalence within +-0.05 shown in 1 of 3 comparisons (power fell short)"
    # without a declared margin the same runs never read "equivalent"
    plain = evaluate(Claim("c", "t", against=["delta"], results=["results/m.json"], seeds=10), root)
    assert plain.answers == ["no difference detected"] and plain.verdict.startswith("not reproduced: no difference detected")


def test_a_claims_row_shows_the_rerun_check_of_its_configurations(root, monkeypatch):
    """The claims table and README's findings table read results/verification.json per configuration."""
    from experiments import report
    from experiments.rerun_check import configuration_label

    runs = json.loads((Path(root) / "results" / "a.json").read_text())
    ovq, ssm = (next(r for r in runs if r["label"] == f"{m}-s0") for m in ("ovq", "ssm"))
    entries = {configuration_label(ovq): {"status": "verified", "code_version": "code-a"},
               configuration_label(ssm): {"status": "unverified", "reason": "no code version recorded", "code_version": "code-a"}}
    (Path(root) / "results" / "verification.json").write_text(json.dumps({"results/a.json": entries}))
    state = report._claim_state(root)
    claim = Claim("c", "t", against=["ssm"], results=["results/a.json"], seeds=6)
    assert state(claim).startswith("unverified: 1 of 2")
    entries[configuration_label(ssm)] = {"status": "verified", "code_version": "code-a"}
    (Path(root) / "results" / "verification.json").write_text(json.dumps({"results/a.json": entries}))
    assert report._claim_state(root)(claim) == "verified (2 of 2 configurations: one seed each rerun bit for bit)"
    assert report._claim_state(root)(replace(claim, against=["vq"])).startswith("unverified: 1 of 2: not checked")
    assert report._claim_state(root)(Claim("c", "t", kind="untestable", untestable="x")) == "-"
    # an entry of another code version's record (the label leaves the code out) says nothing of these runs
    entries[configuration_label(ssm)] = {"status": "verified", "code_version": "code-b"}
    (Path(root) / "results" / "verification.json").write_text(json.dumps({"results/a.json": entries}))
    assert report._claim_state(root)(claim) == "unverified: 1 of 2: not checked"


def test_a_significant_loss_reads_as_one_whatever_the_other_side_learned_and_whatever_the_margin(tmp_path):
    # ours learned; vq did not, yet holds more: a loss, not "against a non-learner"; and in a claim with
    # an equivalence margin, the loss is said before what power could not decide (lower-is-better too)
    runs = [_run("ovq", s, 0.30 + 0.01 * s) for s in range(5)] + [_run("vq", s, 0.62 + 0.01 * s + 0.002 * (-1) ** s,
                                                                        learned=False) for s in range(5)]
    runs += [_run("ssm", s, 0.30 + 0.01 * s + 0.08 * (-1) ** s) for s in range(5)]
    root = _write(tmp_path, "loss.json", runs)
    lost = evaluate(Claim("c", "t", against=["vq"], results=["results/loss.json"], seeds=5), root)
    assert lost.answers == ["opposite"] and lost.verdict == "not reproduced"
    both = evaluate(Claim("c", "t", against=["vq", "ssm"], results=["results/loss.json"], seeds=5, margin=0.1), root)
    assert both.answers == ["opposite", "no difference detected"]
    assert both.verdict == ("not reproduced: ours holds less in 1, neither shown in 1 (power fell short) of 2 comparisons")
    mse = [_run("ovq", s, 0.9 + 0.01 * s, metric="mse") for s in range(5)] + [
        _run("vq", s, 0.3 + 0.01 * s + 0.002 * (-1) ** s, metric="mse", learned=False) for s in range(5)]
    worse = evaluate(Claim("c", "t", against=["vq"], results=["results/mse.json"], seeds=5), _write(tmp_path, "mse.json", mse))
    assert worse.answers == ["opposite"]                      # higher MSE is worse: a loss
