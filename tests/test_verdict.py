"""The verdict cannot be won by a memory that stops learning, counts each piece of evidence once, and
adjusts each family of tests for their number (Holm) before it says a word."""
import json
import math
import shutil
import statistics

import pytest

from conftest import study_file
from scipy import stats

from experiments import compare, report, sections, study_specs
from experiments.stats import learning
from experiments.studies.why_forget_confirm import analysis as changes
from experiments.stats.intervals import paired_comparison
from experiments.stats.multiple import benjamini_hochberg, holm
from test_report import _run

CHANCE = 0.1


def _memory(layers, seed, R):
    """A run record on a 3-experience stream whose chance score is 0.1 (stream gate threshold 0.1)."""
    d = _run(layers, seed, R)
    d["stream_gate"] = {"skill": 0.5, "chance": CHANCE, "threshold": 0.1, "learned": True, "chances": []}
    return d


def _ovq(seed):
    """Learns every experience (0.9) and forgets part of the older ones (0.6 at the end)."""
    e = 0.01 * seed
    return _memory("ovq", seed, [[0.9, 0.1, 0.1], [0.7 + e, 0.9, 0.1], [0.6 + 2 * e, 0.6 - e, 0.9]])


def _write_once(seed):
    """Learns experience 0 and never writes again: later experiences at chance, experience 0 kept whole."""
    return _memory("frozenstate", seed, [[0.9, 0.1, 0.1], [0.9, 0.1 + 0.002 * seed, 0.1], [0.9, 0.1, 0.1]])


def _never(seed):
    """Never writes at all: chance everywhere (nothing learned, nothing forgotten)."""
    return _memory("noop", seed, [[0.1, 0.1, 0.1], [0.1, 0.1, 0.1], [0.1, 0.1, 0.1 + 0.001 * seed]])


def test_holm_and_bh_equal_a_hand_computation():
    p = [0.01, 0.04, 0.03, 0.005, math.nan]
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> monotone 0.06)
    assert holm(p)[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(holm(p)[4])
    # BH: 0.005*4/1 = 0.02, 0.01*4/2 = 0.02, 0.03*4/3 = 0.04, 0.04*4/4 = 0.04
    assert benjamini_hochberg(p)[:4] == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert holm([0.2]) == [0.2] and holm([]) == []


def test_holm_and_bh_equal_statsmodels_on_random_families():
    """The hand-written Holm (called for every table) against statsmodels' ``multipletests``, and BH too,
    on families of 1-12 tests with ties and p-values near 0 and 1."""
    import random

    from statsmodels.stats.multitest import multipletests

    rng = random.Random(3)
    for _ in range(20):
        p = [round(rng.random() ** 3, rng.choice([2, 6])) for _ in range(rng.randint(1, 12))]
        assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]), abs=1e-15)
        assert benjamini_hochberg(p) == pytest.approx(list(multipletests(p, method="fdr_bh")[1]), abs=1e-12)


def test_holm_ignores_untested_entries_wherever_they_stand():
    # NaN (or None) in the middle once scrambled the sort: holm([0.03, nan, 0.01]) gave [0.06, nan, 0.06]
    assert holm([0.03, math.nan, 0.01])[::2] == pytest.approx([0.03, 0.02])
    tested = [0.5, 0.01, 0.02, 0.001]
    expected = holm(tested)
    for spread in ([0.5, math.nan, 0.01, 0.02, None, 0.001], [math.nan, 0.5, 0.01, math.nan, 0.02, 0.001, None]):
        got = holm(spread)
        assert [g for g, p in zip(got, spread) if p is not None and p == p] == pytest.approx(expected)
        assert all(math.isnan(g) for g, p in zip(got, spread) if p is None or p != p)


def test_five_seeds_cannot_reach_5_percent_with_an_exact_wilcoxon_test():
    c = paired_comparison([1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 0.1, 0.2, 0.3, 0.4])
    assert c.p_wilcoxon == pytest.approx(2 / 2 ** 5) and c.p_t < 0.05
    assert c.boot_low <= c.mean_difference <= c.boot_high


def test_a_write_once_or_never_writing_memory_is_not_reported_as_the_better_memory():
    runs = [_ovq(s) for s in range(5)] + [_write_once(s) for s in range(5)] + [_never(s) for s in range(5)]
    records = [compare.record_from_json(d) for d in runs]
    rows = {r.other: r for r in compare.verdict_rows(records, "ovq")}
    once, never = rows["frozenstate"], rows["noop"]
    # what forgetting alone says (the trap): the write-once memory forgets nothing, OVQ forgets
    assert once.forgetting.mean_difference < 0 and once.verdict == "**OVQ forgets more**"
    # the primary endpoint sees what each holds at the end: OVQ holds more
    assert once.primary.mean_difference == pytest.approx(0.7 - 0.9 * 1 / 3 - 0.2 / 3, abs=0.02)
    assert once.primary_verdict == "OVQ holds more"
    assert never.primary_verdict == "OVQ holds more"
    # plasticity beside stability: the write-once memory stopped learning at experience 1, on every seed
    assert once.stopped == ("0/5", "5/5 (from exp 1)")
    assert once.late_learning.mean_difference == pytest.approx(0.8, abs=0.01)
    assert learning.stopped_learning_at(records[5]) == 1 and learning.stopped_learning_at(records[0]) is None
    assert learning.stopped_learning_at(records[10]) is None          # never learned at all: its gates say so
    assert never.stopped == ("0/5", "0/5 (5 never learned exp 0)")   # ... and its count does not hide it


def test_a_run_whose_learning_cannot_be_read_is_unmeasured_not_counted_as_still_learning():
    import dataclasses
    once = [compare.record_from_json(_write_once(s)) for s in range(3)]
    # a record whose learning scores cannot be read: no R matrix, no stream chance
    blind = [dataclasses.replace(r, R=[], stream_chances=[], stream_chance=float("nan")) for r in once]
    assert learning.stopped_summary(blind) == "unmeasured"
    assert learning.stopped_summary(once[:1] + blind[1:]) == "1/1 (from exp 1; 2 unmeasured)"
    assert learning.stopped_summary(once) == "3/3 (from exp 1)"


def _spec_files(tmp_path, monkeypatch, specs):
    (tmp_path / "results").mkdir()
    studies = tmp_path / "studies"
    studies.mkdir()
    for name, (runs, family) in specs.items():
        (tmp_path / "results" / f"{name}.json").write_text(json.dumps(runs))
        study_file(studies, name).write_text(
            f"title: '{name}'\ncommands: [\"ovq-cl sweep cfg.yaml --name {name} --out results\"]\n"
            f"results: [results/{name}.json]\nbaseline: ovq\nverdict: '{name} stream'\nfamily: '{family}'\n")
    monkeypatch.setattr(study_specs, "STUDIES_DIR", str(studies))
    monkeypatch.setattr(report, "PROJECT_DIR", str(tmp_path))
    monkeypatch.setattr(sections, "PROJECT_DIR", str(tmp_path))


def test_duplicate_evidence_is_one_row_and_holm_counts_each_test_once(tmp_path, monkeypatch):
    base = [_ovq(s) for s in range(5)] + [_write_once(s) for s in range(5)]
    for i, d in enumerate(base):
        d["config_id"] = f"id{i}"
    # a second study listing the same runs again, and a third with the same results under other ids
    # (a run repeated with a setting that changes no number): both point to the first row
    again = [dict(d) for d in base]
    repeated = [{**d, "config_id": d["config_id"] + "-probe64"} for d in base]
    other = [_ovq(s) for s in range(5)] + [_never(s) for s in range(5)]
    _spec_files(tmp_path, monkeypatch, {"a": (base, "F"), "b": (again, "F"), "c": (repeated, "F"),
                                        "d": (other, "F")})
    entries = report.verdict_entries(study_specs.all_studies())
    assert [e.same_as for e in entries] == [None, 1, 1, None]
    first, last = entries[0].row, entries[3].row
    raw = [first.primary.p_t, last.primary.p_t]
    # the family has two tests, not four: the duplicates are not counted
    assert [first.p_primary_adjusted, last.p_primary_adjusted] == pytest.approx(holm(raw))
    table = report.verdict_table(study_specs.all_studies())
    assert table.count("same runs as row 1") == 2


def test_families_are_adjusted_apart(tmp_path, monkeypatch):
    _spec_files(tmp_path, monkeypatch, {"a": ([_ovq(s) for s in range(5)] + [_write_once(s) for s in range(5)], "F"),
                                        "b": ([_ovq(s) for s in range(5)] + [_never(s) for s in range(5)], "G")})
    entries = report.verdict_entries(study_specs.all_studies())
    for e in entries:                                  # one test per family: Holm leaves p as it is
        assert e.row.p_primary_adjusted == pytest.approx(e.row.primary.p_t)


def test_a_declared_endpoint_is_checked(tmp_path, monkeypatch):
    (tmp_path / "x.yaml").write_text("title: x\nendpoint: forgetting_max\n")
    with pytest.raises(ValueError, match="endpoint 'forgetting_max' is not one of"):
        study_specs.load_study(str(tmp_path / "x.yaml"))


def test_scipy_agrees_with_the_exact_wilcoxon_it_is_asked_for():
    a, b = [0.3, 0.5, 0.2, 0.9, 0.4, 0.8], [0.1, 0.2, 0.25, 0.3, 0.35, 0.15]
    c = paired_comparison(a, b)
    assert c.p_wilcoxon == pytest.approx(stats.wilcoxon(a, b, method="exact").pvalue)


def test_the_fast_wilcoxon_is_scipys_on_ties_zeros_and_every_size():
    """wilcoxon_test gives scipy.stats.wilcoxon's statistic and p on the inputs where scipy would permute
    (ties, zeros, n <= 13: scores on a grid of 1/512 make them common), where it is exact, and where it
    approximates (ties, n > 13), and on zeros only (p = 1)."""
    import random
    import warnings

    from experiments.stats.intervals import wilcoxon_test

    rng = random.Random(0)
    kinds = {"permuted": 0, "exact": 0, "approximated": 0}
    for _ in range(200):
        n = rng.randint(14, 16) if rng.random() < 0.15 else rng.randint(2, 11)    # (scipy's own 2**13 is slow)
        grid = rng.choice([4, 16, 512, None])                 # coarse grids tie, None (continuous) does not
        a = [rng.random() if grid is None else rng.randrange(grid) / grid for _ in range(n)]
        b = [rng.random() if grid is None else rng.randrange(grid) / grid for _ in range(n)]
        if rng.random() < 0.3:
            b[0] = a[0]                                        # a zero difference
        d = [x - y for x, y in zip(a, b)]
        exact = all(x != 0 for x in d) and len({abs(x) for x in d}) == n
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = stats.wilcoxon(a, b, method="exact" if exact else "auto")
            got = wilcoxon_test(a, b)
        kinds["exact" if exact else "permuted" if n <= 13 else "approximated"] += 1
        assert got[0] == want.statistic and got[1] == pytest.approx(want.pvalue, rel=1e-12, abs=0), (a, b)
    assert min(kinds.values()) >= 20, kinds
    assert wilcoxon_test([0.5, 0.5], [0.5, 0.5]) == (0.0, 1.0)


def test_pairs_made_by_other_code_are_refused(tmp_path, monkeypatch):
    runs = [_ovq(s) for s in range(5)] + [_write_once(s) for s in range(5)]
    for d in runs[5:]:
        d["code_version"] = "code-new"
    _spec_files(tmp_path, monkeypatch, {"a": (runs, "F")})
    (entry,) = report.verdict_entries(study_specs.all_studies())
    assert entry.row is None and "refused (frozenstate)" in entry.note and "code-new, not recorded" in entry.note
    for d in runs[5:]:                    # one code version on both sides: read
        d["code_version"] = None
    (tmp_path / "results" / "a.json").write_text(json.dumps(runs))
    (entry,) = report.verdict_entries(study_specs.all_studies())
    assert entry.row is not None and entry.row.code_versions == {"not recorded"}


@pytest.mark.slow
def test_report_verify_reruns_one_seed_per_configuration_and_fails_on_an_altered_result(tmp_path, monkeypatch, capsys):
    import yaml

    from experiments.cli import main
    from experiments.sweep import expand, run_sweep
    from experiments.verify import configuration_label
    from test_runner import TINY
    from test_verify_rows import _own_claims

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({**TINY, "meta_train": {"steps": 4, "batch_size": 8},
                                                       "stream": {**TINY["stream"], "options": {
                                                           **TINY["stream"]["options"], "n_experiences": 2}}}))
    command = ("ovq-cl sweep cfg.yaml checkpoint.enabled=false --grid 'model.layers=[ovq];[linear]' "
               "--grid 'seed=0;1' --name toy --out results")
    studies = tmp_path / "studies"
    studies.mkdir()
    study_file(studies, "toy").write_text(yaml.safe_dump({
        "title": "Toy", "commands": [command], "results": ["results/toy.json"], "baseline": "ovq", "verdict": "toy"}))
    monkeypatch.setattr(study_specs, "STUDIES_DIR", str(studies))
    monkeypatch.setattr(report, "PROJECT_DIR", str(tmp_path))
    monkeypatch.setattr(sections, "PROJECT_DIR", str(tmp_path))
    grid = {"model.layers": ["[ovq]", "[linear]"], "seed": ["0", "1"]}
    configs = expand("cfg.yaml", ["checkpoint.enabled=false", f"tracking.tracking_uri=sqlite:///{tmp_path / 'm.db'}"], grid)
    run_sweep(configs, "toy", grid=grid, out="results", announce=lambda m: None, show=lambda t: None)
    (tmp_path / "claims.yaml").write_text("claims: []\n")
    _own_claims(monkeypatch, str(tmp_path / "claims.yaml"))
    out = tmp_path / "R.md"                 # not the project's own RESULTS.md path
    assert main(["report", "--verify", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count(" verified  Toy:") == 2 and "2 verified, 0 unverified, 0 differ" in err and out.exists()
    # one stored number moved by one part in ten million: the check fails, and names the configuration
    records = json.loads((tmp_path / "results" / "toy.json").read_text())
    victim = next(d for d in records if d["seed"] == 0 and "linear" in d["label"])
    victim["R"][0][0] += 1e-7
    (tmp_path / "results" / "toy.json").write_text(json.dumps(records))
    out.unlink()
    assert main(["report", "--verify", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"DIFFERS  Toy: {configuration_label(victim)} (seed 0, run {victim['label']})" in err
    assert "RESULTS.md not written" in err and not out.exists() and "recorded on" not in err
    # each record names the instruction set its float sums ran on; a difference from another one says so,
    # and is no code difference: unverified, and the check passes
    import torch

    assert victim["provenance"]["cpu_capability"] == str(torch.backends.cpu.get_cpu_capability())
    victim["provenance"]["cpu_capability"] = "OTHER_ISA"
    (tmp_path / "results" / "toy.json").write_text(json.dumps(records))
    assert main(["report", "--verify", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"unverified  Toy: {configuration_label(victim)} (seed 0, run {victim['label']})  recorded on OTHER_ISA, " \
           f"rerun on {torch.backends.cpu.get_cpu_capability()}" in err and out.exists()


def test_vq_codebook_is_counted_as_shared_memory_and_learned_buffers_beside_parameters():
    """VQ keeps memory about the keys outside its per-lane state: its codebook [H, S, Dk], shared by every
    lane. It is counted (bytes per layer) apart from the state, and its learned buffers (codebook and
    EMA statistics) beside the parameters."""
    from ovq_cl import DecoderLM, model_config
    from strategies.evaluation.results import n_learned_buffers, shared_memory_bytes

    user = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "layers": ["vq", "ovq"],
                      "mixers": {"vq": {"codebook_size": 24}}}}
    model = DecoderLM(model_config({**user["model"], "vocab_size": 50}))
    H, S, Dk = 2, 24, 16
    assert shared_memory_bytes(model) == [H * S * Dk * 4, 0]                 # OVQ's dictionary is per lane
    assert n_learned_buffers(model) == H * S * Dk * 2 + H * S               # codebook, EMA sums and counts


def test_equal_nonzero_differences_make_no_t_test_rather_than_p_zero():
    # two seeds whose scores (multiples of 1/512) differ by exactly the same amount: zero variance
    c = paired_comparison([0.845703125, 0.822265625], [0.201171875, 0.177734375])
    assert c.mean_difference == pytest.approx(0.64453125)
    assert math.isnan(c.p_t) and math.isnan(c.t_statistic) and math.isnan(c.effect_size_dz)
    assert c.p_wilcoxon == pytest.approx(0.5)                # the rank test still answers, honestly
    assert math.isnan(holm([c.p_t, 0.01])[0]) and holm([c.p_t, 0.01])[1] == pytest.approx(0.01)
    # one differing pair is enough for the t-test again
    d = paired_comparison([0.845703125, 0.822265625, 0.9], [0.201171875, 0.177734375, 0.2])
    assert 0 < d.p_t < 1 and math.isfinite(d.effect_size_dz)


def test_learned_pairs_without_the_forgetting_endpoint_are_too_few_not_no_t_test():
    """Three pairs where both learned, but forgetting measured on one only: "too few pairs" (the t-test is
    missing for lack of pairs, not because every pair differs by the same amount)."""
    f = paired_comparison([0.1, math.nan, math.nan], [0.2, 0.3, math.nan])
    row = compare.VerdictRow("ssm", 3, 0, f, paired_comparison([0.5, 0.6], [0.4, 0.45]), True, False, (1.0, 1.0), (1, 1))
    assert f.n == 1 and row.verdict == "too few pairs"
    row.forgetting = paired_comparison([0.1, 0.2, 0.3], [0.35, 0.45, 0.55])      # equal differences, 3 pairs
    assert row.verdict == compare.NO_T_TEST


DIFFS = [0.022, -0.008, 0.032, 0.002, 0.027, -0.003, 0.022, 0.012, 0.017, -0.008]     # OVQ - other: raw p 0.036


def _final(layers, seed, final, learned=True):
    """A two-experience run whose final average is ``final``."""
    return _run(layers, seed, [[1.0, 0.0], [final, final]], learned=learned)


def _confirmatory(tmp_path, monkeypatch, runs, mixers, seeds=10):
    """One confirmatory study whose command declares ``mixers`` against OVQ over ``seeds`` seeds."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "c.json").write_text(json.dumps(runs))
    studies = tmp_path / "studies"
    studies.mkdir()
    layers = ";".join(f"[{m}]" for m in ["ovq", *mixers])
    grid = ";".join(str(s) for s in range(seeds))
    study_file(studies, "c").write_text(
        f"title: 'c'\ncommands: [\"ovq-cl sweep cfg.yaml --grid 'model.layers={layers}' --grid 'seed={grid}' --name c --out results\"]\n"
        "results: [results/c.json]\nbaseline: ovq\nverdict: 'c stream'\nfamily: 'C'\nconfirmatory: true\n")
    monkeypatch.setattr(study_specs, "STUDIES_DIR", str(studies))
    monkeypatch.setattr(report, "PROJECT_DIR", str(tmp_path))
    monkeypatch.setattr(sections, "PROJECT_DIR", str(tmp_path))
    return {e.row.other.split(" ")[0]: e.row for e in report.verdict_entries(study_specs.all_studies()) if e.row}


def test_a_confirmatory_row_waits_for_its_declared_seeds_and_its_family(tmp_path, monkeypatch):
    """Gated DeltaNet at raw p 0.036 in a declared family of two whose SSM row has 3 of 10 seeds: 'holds
    more' with the SSM at p = 0, not at p = 1 (0.073): pending; the SSM row is pending on its seeds."""
    runs = [_final("ovq", s, 0.6 + d) for s, d in enumerate(DIFFS)] + [_final("delta", s, 0.6) for s in range(10)]
    ssm_runs = [_final("ssm", s, 0.6 + d + 0.02 * (-1) ** s) for s, d in enumerate(DIFFS)]   # far from significant
    runs += ssm_runs[:3]
    rows = _confirmatory(tmp_path, monkeypatch, runs, ["delta", "ssm"])
    delta, ssm = rows["delta"], rows["ssm"]
    assert delta.primary.p_t == pytest.approx(0.036, abs=0.001)
    assert delta.p_primary_low == pytest.approx(delta.primary.p_t) and delta.p_primary_adjusted == pytest.approx(2 * delta.primary.p_t)
    assert delta.primary_verdict == "pending (tests of its declared family still to come could move its Holm p)"
    assert ssm.primary_verdict == "pending (3 of 10 declared seeds)" and ssm.verdict.startswith("pending (3 of 10")
    assert math.isnan(ssm.p_primary_adjusted)
    # a declared mixer with no runs yet is a test still to come too
    (tmp_path / "x").mkdir()
    rows = _confirmatory(tmp_path / "x", monkeypatch, runs[:20], ["delta", "ssm"])
    assert rows["delta"].primary_verdict.startswith("pending (tests of its declared family")
    # once every declared test is in (the SSM's 10 seeds, its p large): read, over the family of two
    runs += ssm_runs[3:]
    (tmp_path / "y").mkdir()
    rows = _confirmatory(tmp_path / "y", monkeypatch, runs, ["delta", "ssm"])
    assert rows["ssm"].primary.p_t > 0.1 and rows["delta"].p_primary_adjusted == pytest.approx(2 * rows["delta"].primary.p_t)
    assert rows["delta"].primary_verdict.startswith("no difference detected") and rows["ssm"].primary_verdict.startswith("no difference detected")


def test_a_declared_test_without_a_t_test_counts_at_p_1(tmp_path, monkeypatch):
    grid = [round(d * 512) / 512 for d in DIFFS]                    # scores on a 1/512 grid: exact differences
    runs = [_final("ovq", s, 0.5 + d) for s, d in enumerate(grid)] + [_final("delta", s, 0.5) for s in range(10)]
    runs += [_final("ssm", s, 0.5 + d - 0.125) for s, d in enumerate(grid)]          # 0.125 on every seed
    rows = _confirmatory(tmp_path, monkeypatch, runs, ["delta", "ssm"])
    assert rows["ssm"].primary_verdict == compare.NO_T_TEST and 0.025 < rows["delta"].primary.p_t < 0.05
    assert rows["delta"].p_primary_adjusted == rows["delta"].p_primary_low == pytest.approx(2 * rows["delta"].primary.p_t)
    assert rows["delta"].primary_verdict.startswith("no difference detected")


def test_words_follow_the_adjusted_p_the_direction_the_gates_and_the_pairs_measured(tmp_path, monkeypatch):
    """An exploratory family of three: Gated DeltaNet's raw p 0.036 is 'no difference' after Holm, on the
    primary endpoint and on forgetting; bits per byte are lower-is-better; the primary endpoint reads every
    shared seed, forgetting only those where both learned; '(n seeds, fewer than 5)' counts the pairs tested."""
    ovq = [_final("ovq", s, 0.6 + d) for s, d in enumerate(DIFFS)]
    runs = ovq + [_final("delta", s, 0.6) for s in range(10)]
    runs += [_final("ssm", s, 0.6 + d + 0.02 * (-1) ** s) for s, d in enumerate(DIFFS)]
    runs += [_final("vq", s, 0.6 + d + 0.03 * (-1) ** (s // 2)) for s, d in enumerate(DIFFS)]
    _spec_files(tmp_path, monkeypatch, {"a": (runs, "F")})
    rows = {e.row.other.split(" ")[0]: e.row for e in report.verdict_entries(study_specs.all_studies())}
    delta = rows["delta"]
    order = ["delta", "ssm", "vq"]
    assert [rows[m].p_primary_adjusted for m in order] == pytest.approx(holm([rows[m].primary.p_t for m in order]))
    assert delta.p_primary_adjusted == pytest.approx(3 * delta.primary.p_t)          # the smallest of three
    assert delta.primary.p_t < 0.05 and delta.primary_verdict.startswith("no difference detected")
    f = paired_comparison([0.1 + d for d in DIFFS], [0.1] * 10)                          # forgetting, other - OVQ
    row = compare.VerdictRow("ssm", 10, 0, f, f, True, False, (1.0, 2.0), (1, 1), primary=f)
    assert row.verdict == "OVQ forgets less"
    row.p_forgetting_adjusted = 3 * f.p_t
    assert row.verdict == "no difference detected"
    # lower is better: OVQ's lower bits per byte hold more
    bpb = compare.VerdictRow("ssm", 10, 0, f, f, False, False, (1.0, 2.0), (1, 1),
                             primary=paired_comparison([1.9 - d for d in DIFFS], [2.0] * 10), learned_by=(10, 10))
    assert bpb.primary.mean_difference < 0 and bpb.primary_verdict == "OVQ holds more"
    # the same lead over a mixer that learned on 4 of 10 seeds is no win; a winner that stopped is named
    from dataclasses import replace as _replace
    assert _replace(bpb, learned_by=(10, 4)).primary_verdict == "OVQ holds more, against a non-learner (4/10 learned)"
    assert _replace(bpb, learned_by=(5, 10)).primary_verdict == "OVQ holds more, but did not learn (5/10 learned)"
    assert (_replace(bpb, stopped=("10/10 (from exp 2)", "0/10")).primary_verdict
            == "OVQ holds more; stopped learning 10/10 (from exp 2)")
    # no difference says what the test could have seen: 80% power at 5% for the spread of the differences
    flat = compare.VerdictRow("ssm", 10, 0, f, f, True, False, (1.0, 2.0), (1, 1), learned_by=(10, 10),
                              primary=paired_comparison([0.5 + 0.1 * (-1) ** s for s in range(10)], [0.5] * 10),
                              primary_sd=0.1)
    assert flat.primary_verdict == "no difference detected (a difference of 0.10 found with 80% power at 5%, before Holm)"
    assert _replace(bpb, learned_by=(3, 2)).primary_verdict == "neither learned (3/10 and 2/10)"
    # a loss to a mixer that did not learn is still a loss
    lost = _replace(bpb, primary=paired_comparison([2.1 + d for d in DIFFS], [2.0] * 10), learned_by=(10, 0))
    assert lost.primary_verdict == "**OVQ holds less**"
    # one seed where the SSM did not learn: in the primary endpoint's pairs, not in forgetting's
    runs = ovq[:5] + [_final("ssm", s, 0.3, learned=(s != 0)) for s in range(5)]
    (tmp_path / "b").mkdir()
    _spec_files(tmp_path / "b", monkeypatch, {"b": (runs, "G")})
    (entry,) = report.verdict_entries(study_specs.all_studies())
    assert entry.row.primary.n == 5 and entry.row.n_pairs == 4 and entry.row.n_not_learned == 1
    assert entry.row.forgetting.n == 4 and "(4 seeds, fewer than 5)" in entry.row.verdict
    # forgetting measured on 3 of 5 learned pairs: the note says 3
    three = paired_comparison([0.3, 0.31, 0.35, math.nan, math.nan], [0.1, 0.12, 0.11, 0.1, 0.1])
    row = compare.VerdictRow("ssm", 5, 0, three, three, True, False, (1.0, 2.0), (1, 1), primary=three)
    assert "(3 seeds, fewer than 5)" in row.verdict
    (tmp_path / "c").mkdir()
    runs = ovq[:5] + [{**_final("ssm", s, 0.3), "state_bytes_per_layer_lane": [20480.0, 20480.0]} for s in range(5)]
    _spec_files(tmp_path / "c", monkeypatch, {"c": (runs, "H")})
    assert "| 66K / 20K |" in report.verdict_table(study_specs.all_studies())          # OVQ's first, then the other's


def test_a_seed_run_again_by_a_later_code_pairs_within_one_version_whatever_the_files_order(tmp_path, monkeypatch):
    """OVQ's seeds run by code-a, then again by code-b; the other mixer's by code-a only: the row pairs
    within code-a, in either order of the records (once it was refused or not by the order)."""
    a = [{**_ovq(s), "code_version": "code-a"} for s in range(5)]
    b = [{**_ovq(s), "code_version": "code-b"} for s in range(5)]
    other = [{**_write_once(s), "code_version": "code-a"} for s in range(5)]
    for order in (a + b + other, b + a + other):
        (tmp_path / "results").mkdir(exist_ok=True)
        (tmp_path / "studies").mkdir(exist_ok=True)
        (tmp_path / "results" / "a.json").write_text(json.dumps(order))
        study_file(tmp_path / "studies", "a").write_text(
            "title: 'a'\ncommands: [\"ovq-cl sweep cfg.yaml --name a --out results\"]\n"
            "results: [results/a.json]\nbaseline: ovq\nverdict: 'a stream'\nfamily: 'F'\n")
        monkeypatch.setattr(study_specs, "STUDIES_DIR", str(tmp_path / "studies"))
        monkeypatch.setattr(report, "PROJECT_DIR", str(tmp_path))
        monkeypatch.setattr(sections, "PROJECT_DIR", str(tmp_path))
        entries = [e for e in report.verdict_entries(study_specs.all_studies()) if e.row or e.note.startswith("refused")]
        (entry,) = [e for e in entries if "frozenstate" in (e.row.other if e.row else e.note)]
        assert entry.row is not None and entry.row.code_versions == {"code-a"} and entry.row.primary.n == 5


def test_holm_bounds_hold_the_adjusted_p_whatever_the_unknown_p_values_turn_out_to_be():
    """The declared rules read a word only where it is the same at both bounds; that rests on Holm's
    adjusted p being nondecreasing in every p of the family: any values inside the ranges give adjusted
    p-values inside the bounds."""
    import random

    from experiments.stats.multiple import holm_bounds

    rng = random.Random(0)
    for _ in range(500):
        m = rng.randint(1, 7)
        ranges = []
        for _ in range(m):
            kind = rng.random()
            p = rng.random() ** 3
            ranges.append((p, p) if kind < 0.6 else (0.0, 1.0) if kind < 0.8 else (1.0, 1.0))
        low, high = holm_bounds(ranges)
        actual = holm([rng.uniform(lo, hi) for lo, hi in ranges])
        assert all(lo - 1e-12 <= a <= hi + 1e-12 for lo, a, hi in zip(low, actual, high))
    assert holm_bounds([(0.02, 0.02), (0.0, 1.0)]) == (pytest.approx([0.02, 0.0]), pytest.approx([0.04, 1.0]))


def test_what_changed_sets_each_mixers_row_beside_the_earlier_studys_unpaired(tmp_path, monkeypatch):
    """A study with the section ``verdict_changes: {since: NAME}`` (study 21-confirm's own renderer) prints, mixer by mixer, the earlier study's verdict row beside its own:
    the verdict table's words (each in its own family), the mean final averages over each row's pairs, the
    pairs each used; a mixer the earlier study lacks says "no row"; nothing pairs runs across the two."""
    earlier = ([_final("ovq", s, 0.6 + d) for s, d in enumerate(DIFFS)] + [_final("delta", s, 0.3) for s in range(10)]
               + [_final("full", s, 0.95) for s in range(10)])
    later = ([_final("ovq", s, 0.9) for s in range(5)] + [_final("delta", s, 0.9 + 0.01 * (-1) ** s) for s in range(5)]
             + [_final("ssm", s, 0.5 + 0.02 * s) for s in range(5)]
             + [{**_final("vq", s, 0.9), "code_version": "code-b"} for s in range(5)])     # refused: other code
    _spec_files(tmp_path, monkeypatch, {"a": (earlier, "F"), "b": (later, "G")})
    studies = tmp_path / "studies"
    study_file(studies, "a").write_text(study_file(studies, "a").read_text().replace("title: 'a'", "title: '13. a'"))
    study_file(studies, "b").write_text(study_file(studies, "b").read_text().replace("title: 'b'", "title: '23. b'")
                                    + "sections: [summary, {verdict_changes: {since: a}}]\n")
    shutil.copy(changes.__file__, studies / "b" / "analysis.py")
    spec = study_specs.load_study("b")
    rows = {e.row.other: e.row for e in report.verdict_entries(study_specs.all_studies()) if e.row}
    table = changes.changed_table(spec, "a").splitlines()
    assert table[0].startswith("| mixer | study 13: final average, OVQ / mixer") and "study 23: verdict" in table[0]
    assert [line.split(" | ")[0] for line in table[2:]] == ["| delta", "| full", "| ssm", "| vq"]   # either study's
    delta, full, ssm, vq = (line.split(" | ") for line in table[2:])
    assert full[1].endswith(" / 0.950") and full[6] == "no row"                   # only in the earlier study
    assert vq[1] == "no row" and vq[6] == "refused (see the verdict table)"
    assert delta[0] == "| delta" and delta[1] == f"{statistics.fmean(0.6 + d for d in DIFFS):.3f} / 0.300"
    assert delta[2].endswith("(10)") and delta[3].startswith("OVQ holds more (Holm p")
    assert delta[6] == "0.900 / 0.902" and delta[7].endswith("(5)")           # +0.01, -0.01, ... over 5 seeds
    assert delta[8].startswith("no difference detected")
    assert ssm[1] == "no row" and ssm[6] == "0.900 / 0.540"
    # the same words as the verdict table's rows, each in its own family
    assert rows["ssm"].primary_verdict == "OVQ holds more" and ssm[8].startswith("OVQ holds more (Holm p")
    assert rows["ssm"].final_means == pytest.approx((0.9, 0.54))
    # the section prints it; the section without verdict rows, or naming no study, is refused
    assert "What changed in the verdict: this study's verdict rows beside study 13's" in sections.section(spec)
    shutil.copy(changes.__file__, studies / "a" / "analysis.py")
    study_file(studies, "a").write_text("title: 'c'\nsections: [{verdict_changes: {since: b}}]\n")
    with pytest.raises(ValueError, match="needs verdict rows of its own"):
        study_specs.load_study("a")
    study_file(studies, "a").write_text("title: 'c'\nverdict: 'c'\nsections: [{verdict_changes: {since: nosuch}}]\n")
    with pytest.raises(ValueError, match="since names no study: 'nosuch'"):
        study_specs.load_study("a")


def test_a_param_a_run_does_not_list_is_named_by_its_absent_value_in_a_rows_label():
    base = compare.record_from_json({**_final("ovq", 0, 0.5), "params": {**_final("ovq", 0, 0.5)["params"],
                                                                         "meta_train.retention_loss": "1.0"}})
    other = compare.record_from_json(_final("linear", 0, 0.5))
    assert compare._describe(other, base) == "linear (retention_loss=0.0)"
    # a param one run lists at its absent value and the other does not list is no difference
    zero = compare.record_from_json({**_final("ovq", 0, 0.5), "params": {**_final("ovq", 0, 0.5)["params"],
                                                                         "meta_train.retention_loss": "0.0"}})
    assert compare._describe(other, zero) == "linear"


def test_the_verdict_words_count_who_learned_over_the_primarys_pairs_and_read_the_spread_of_the_data(tmp_path, monkeypatch):
    """From records: the other side's gates count only where learned is True and the pair measured the
    final average; "no difference detected" quotes the power at the data's own paired SD."""
    from experiments.stats.power import detectable_difference

    ovq = [_final("ovq", s, 0.6 + d) for s, d in enumerate(DIFFS)]
    ssm = [_final("ssm", s, 0.6 + d + 0.02 * (-1) ** s) for s, d in enumerate(DIFFS)]
    for r in ssm[:4]:
        r["learned"] = None                     # a gate never recorded is not a pass
        r.pop("gate", None)
        r.pop("stream_gate", None)
    _spec_files(tmp_path, monkeypatch, {"a": (ovq + ssm, "F")})
    (row,) = [e.row for e in report.verdict_entries(study_specs.all_studies()) if e.row]
    assert row.learned_primary == (10, 6)
    sd = statistics.stdev([0.6 + d - (0.6 + d + 0.02 * (-1) ** s) for s, d in enumerate(DIFFS)])
    assert row.primary_sd == pytest.approx(sd)
    assert row.primary.p_t > 0.05 and row.primary_verdict == "no difference detected" + (
        f" (a difference of {detectable_difference(sd, 10):.2f} found with 80% power at 5%, before Holm)")
    # the other side learned on 4 of 10 seeds: no difference against a non-learner is not read
    for r in ssm[4:6]:
        r["learned"] = None
        r.pop("gate", None)
        r.pop("stream_gate", None)
    (tmp_path / "results" / "a.json").write_text(json.dumps(ovq + ssm))
    (row,) = [e.row for e in report.verdict_entries(study_specs.all_studies()) if e.row]
    assert row.learned_primary == (10, 4)
    assert row.primary_verdict == "not read: against a non-learner (4/10 learned)"


@pytest.mark.parametrize("significant,better,ours,theirs,expected", [
    (True, True, True, True, "lead"), (True, False, True, True, "loss"), (False, True, True, True, "no difference detected"),
    (True, True, True, False, "lead over a non-learner"), (False, True, True, False, "not read: the other did not learn"),
    (True, True, False, True, "lead by a non-learner"), (False, False, False, True, "not read: ours did not learn"),
    (True, False, True, False, "loss"), (True, False, False, True, "loss"),                 # a loss counts whoever learned
    (True, True, False, False, "neither learned"), (True, False, False, False, "neither learned")])
def test_one_rule_reads_a_difference_by_who_learned(significant, better, ours, theirs, expected):
    """experiments.stats.reading: the verdict table and the claims table read a test by this one rule."""
    from experiments.stats.reading import READINGS, learned_on_most, read_difference

    assert read_difference(significant, better, ours, theirs) == expected and expected in READINGS
    assert learned_on_most(3, 5) and not learned_on_most(2, 4) and not learned_on_most(0, 0)   # half is not most
