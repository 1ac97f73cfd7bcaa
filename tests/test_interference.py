"""Interference and capacity curves: the ICR probes' layout, and known answers with three oracle
memories (perfect, a window of tokens, the last K bindings), which the filler kinds must tell apart
and whose capacities are known."""
import math

import pytest
import torch

from experiments.probes.interference import before_capacity, before_capacity_table, half_point, interference_table
from ovq_cl.base import IGNORE, SEP
from strategies.evaluation.capacity import CapacityCurve, CapacityPoint, measure_capacity
from strategies.evaluation.interference import InterferenceCurves, InterferencePoint, item_ladder, measure_interference
from streams import icr_data
from streams.icr import INTERFERENCE_KINDS, key_regions

OPTIONS = {"n_experiences": 4, "n_keys": 64, "facts_per_experience": 16, "facts_per_episode": 8,
           "queries_per_episode": 4}


class BindingOracle(torch.nn.Module):
    """Answers a key with the value it holds for it; holds, per rule: every binding ever (``perfect``),
    the bindings whose value token is among the last ``window`` tokens (``window``), or the ``k`` most
    recent bindings (``last_k``: a new key evicts the oldest). Reads the sequence from a fresh state."""

    def __init__(self, vocab_size: int, n_keys: int, rule: str, size: int = 0) -> None:
        super().__init__()
        self.vocab_size, self.n_keys, self.rule, self.size = vocab_size, n_keys, rule, size

    def forward(self, x, states=None):
        B, T = x.shape
        out = torch.zeros(B, T, self.vocab_size)
        for b in range(B):
            held = {}                                      # key -> (value, position of the value token)
            for t in range(T):
                token = int(x[b, t])
                if 2 <= token < 2 + self.n_keys:
                    if token in held and (self.rule != "window" or t - held[token][1] <= self.size):
                        out[b, t, held[token][0]] = 1.0
                    nxt = int(x[b, t + 1]) if t + 1 < T else -1
                    if nxt >= 2 + self.n_keys:
                        held.pop(token, None)              # re-inserted as the most recent
                        held[token] = (nxt, t + 1)
                        if self.rule == "last_k" and len(held) > self.size:
                            held.pop(next(iter(held)))
        return out, None


def _probe():
    return icr_data(OPTIONS).interference_probe


@pytest.mark.parametrize("kind", INTERFERENCE_KINDS)
def test_each_kind_puts_two_tokens_per_item_between_the_facts_and_only_the_queries_are_scored(kind):
    probe, P, Q = _probe(), 8, 4
    regions = key_regions(icr_data(OPTIONS).info.config)
    for i in range(4):
        x, y = probe(kind, 12, 4)[i]
        assert x.shape == y.shape == (2 * P + 2 * 12 + 1 + 2 * Q,)
        assert (y[: 2 * P + 24] == IGNORE).all() and int((y != IGNORE).sum()) == Q
        facts = dict(zip(x[: 2 * P: 2].tolist(), x[1: 2 * P: 2].tolist()))
        lo, hi = regions[i % 4]
        assert all(lo <= k < hi for k in facts), "the facts come from the item's region"
        middle = x[2 * P: 2 * P + 24]
        keys, values = middle[0::2].tolist(), middle[1::2].tolist()
        if kind == "neutral":
            assert (middle == SEP).all()
        elif kind == "repeat":
            assert all(facts[k] == v for k, v in zip(keys, values))
        else:
            lo2, hi2 = regions[i % 4] if kind == "same_region" else regions[(i + 1) % 4]
            assert all(lo2 <= k < hi2 and k not in facts for k in keys)
        asked = x[2 * P + 25:: 2].tolist()
        assert [facts[k] for k in asked] == y[y != IGNORE].tolist()
    assert torch.equal(probe(kind, 12, 4)[1][0], probe(kind, 12, 4)[1][0])        # a pure function of its item


def test_kinds_the_stream_cannot_make_are_refused():
    probe = _probe()
    with pytest.raises(ValueError, match="kind must be one of"):
        probe("noise", 1, 1)
    with pytest.raises(ValueError, match="other_region needs n_experiences >= 2"):
        icr_data({**OPTIONS, "n_experiences": 1}).interference_probe("other_region", 1, 1)


def _curves(rule: str, size: int = 0) -> InterferenceCurves:
    data = icr_data(OPTIONS)
    model = BindingOracle(data.info.vocab_size, 64, rule, size)
    return measure_interference(model, data.interference_probe, INTERFERENCE_KINDS, [0, 4, 16, 64], "accuracy",
                                episodes=16, batch_size=16)


def test_a_perfect_memory_recalls_everything_whatever_comes_between():
    curves = _curves("perfect")
    assert all(p.score == 1.0 for points in curves.curves.values() for p in points)
    assert all(curves.half_point(k) is None for k in INTERFERENCE_KINDS)


def test_a_window_forgets_with_time_whatever_fills_it_except_the_same_facts_again():
    curves = _curves("window", 64)
    at = {k: {p.items: p.score for p in v} for k, v in curves.curves.items()}
    for kind in ("neutral", "same_region", "other_region"):
        assert at[kind][0] == 1.0 and at[kind][16] == 1.0 and at[kind][64] == 0.0, (kind, at[kind])
        assert curves.half_point(kind) == 64
    assert at["repeat"][64] > 0.9 and curves.half_point("repeat") is None


def test_a_last_k_memory_loses_facts_to_new_bindings_not_to_time():
    curves = _curves("last_k", 12)
    at = {k: {p.items: p.score for p in v} for k, v in curves.curves.items()}
    assert all(s == 1.0 for s in at["neutral"].values()) and curves.half_point("neutral") is None
    assert all(s == 1.0 for s in at["repeat"].values())
    assert at["other_region"][64] == 0.0 and curves.half_point("other_region") in (16, 64)
    # the region's other keys are only 8 here: they can never fill 12 slots, so some facts always stay
    assert at["same_region"][64] > 0.0


def test_the_half_point_and_the_ladder_by_hand():
    assert item_ladder(256) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256] and item_ladder(5) == [0, 1, 2, 4, 5]
    pts = [InterferencePoint(items=n, tokens=2 * n, score=s, standard_error=0.0, chance=0.1, skill=sk, episodes=8)
           for n, s, sk in ((0, 1.0, 1.0), (4, 0.6, 0.55), (8, 0.5, 0.45))]
    flat = InterferencePoint(items=0, tokens=0, score=0.1, standard_error=0, chance=0.1, skill=0.0, episodes=8)
    curves = InterferenceCurves("accuracy", 2, {"a": pts, "b": pts[:2], "c": [flat]})
    assert curves.half_point("a") == 8 and curves.half_point("b") is None and curves.half_point("c") is None
    again = InterferenceCurves.from_dict(curves.as_dict())
    assert again == curves and "half at" in curves.table() and not math.isnan(pts[1].score)


def test_the_capacity_probe_binds_distinct_keys_once_and_queries_among_all_of_them():
    probe = icr_data(OPTIONS).capacity_probe
    x, y = probe(40, 2)[1]
    assert x.shape == (2 * 40 + 1 + 2 * 4,) and int(x[80]) == SEP and int((y != IGNORE).sum()) == 4
    facts = dict(zip(x[:80:2].tolist(), x[1:80:2].tolist()))
    assert len(facts) == 40 and [facts[k] for k in x[81::2].tolist()] == y[y != IGNORE].tolist()
    with pytest.raises(ValueError, match="facts must be in \\[1, n_keys=64\\]"):
        probe(65, 1)


@pytest.mark.parametrize("rule, size, held", [("perfect", 0, 64), ("last_k", 16, 16), ("window", 32, 16)])
def test_capacity_of_oracle_memories_by_hand(rule, size, held):
    """A perfect memory holds all 64 keys; the last 16 bindings hold 16 facts (32 facts: half recalled,
    skill just under 0.5); a 32-token window holds the last ~16 bindings."""
    data = icr_data(OPTIONS)
    model = BindingOracle(data.info.vocab_size, 64, rule, size)
    curve = measure_capacity(model, data.capacity_probe, [4, 8, 16, 32, 64], "accuracy", episodes=16, batch_size=16)
    assert curve.capacity() == held, curve.table()
    assert CapacityCurve.from_dict(curve.as_dict()) == curve
    low = CapacityCurve("accuracy", [CapacityPoint(facts=n, score=s, standard_error=0, chance=0.1, skill=k, episodes=8)
                                     for n, s, k in ((4, 0.2, 0.1), (8, 1.0, 1.0))])
    assert low.capacity() is None                      # counted up from the fewest, stopped at the first below


def test_each_mixers_capacity_bound_comes_from_its_shapes():
    """What the capacity curve is compared with: slots, codes, the bindings a window sees, the key width
    of an outer-product state (Based's Taylor features: 1 + d + d(d+1)/2), none for a growing cache."""
    from ovq_cl.layers import build_mixer

    d_model, heads = 32, 2                                 # head_dim 16
    assert build_mixer("ovq", d_model, heads, {"num_slots": 24}).fact_capacity_bound() == 24
    assert build_mixer("vq", d_model, heads, {"codebook_size": 40}).fact_capacity_bound() == 40
    assert build_mixer("swa", d_model, heads, {"window": 9}).fact_capacity_bound() == 4
    assert build_mixer("full", d_model, heads).fact_capacity_bound() is None
    assert build_mixer("delta", d_model, heads).fact_capacity_bound() == 16
    assert build_mixer("deltanet", d_model, heads).fact_capacity_bound() == 16
    assert build_mixer("ssm", d_model, heads).fact_capacity_bound() == 16
    assert build_mixer("linear", d_model, heads, {"feature_map": "taylor"}).fact_capacity_bound() == 1 + 16 + 16 * 17 // 2


def test_the_before_capacity_table_tells_interference_from_a_full_memory():
    """Known answers: P + h < C is 'forgets before its capacity is used'; a curve that never halves, or
    one that halves only once P + h reaches C, is not; a run without a capacity is 'n/a'. Both are read
    between their rungs: the half point h lies in (previous rung, h], the capacity C in [C, next rung)."""
    from experiments import compare

    def record(layers, seed, half, capacity, top=128):
        curve = [{"items": n, "score": 1.0, "se": 0.0, "n": 8} for n in (0, 8, 16, 32, 64)]
        return compare.RunRecord(
            label=f"{layers}-s{seed}", params={"model.layers": f"['{layers}']", "stream.options.facts_per_episode": "8"},
            metric="accuracy", summary={}, seed=seed, data_seed=seed, state_bytes=[67840.0],
            probes={"interference": {"curves": {"other_region": curve}, "half_items": {"other_region": half}},
                    "capacity": {"curve": {"points": [{"facts": 8, "score": 1.0}, {"facts": 16, "score": 1.0},
                                           {"facts": 32, "score": 0.9}, {"facts": 48, "score": 0.8},
                                           {"facts": top, "score": 0.1}]},
                      "capacity": capacity, "bound_per_layer": [64]}})

    # delta s0: 8 + 16 < 32 whatever the rungs allow (h <= 16, C >= 32): yes. s1: h in (32, 64], C in
    # [48, 128): 8 + 33 = 41 < 127 may hold and 8 + 64 < 48 may not: unknown (once read as "no")
    records = [record("delta", 0, 16, 32), record("delta", 1, 64, 48), record("ovq", 0, None, 16),
               record("ssm", 0, 4, None)]
    table = before_capacity_table(records)
    rows = {line.split(" | ")[0]: line for line in table.splitlines()[2:]}
    assert "| 16, 64 | 32, 48 | 1 of 1 seeds; 1 seed(s) unknown (beyond the ladders) |" in rows["| layers=['delta']"]
    # never halves up to 64 items (h >= 65), holds 16 but not 32 facts (C <= 31): 8 + 65 >= 31, no
    assert "| >64 | 16 | 0 of 1 seeds |" in rows["| layers=['ovq']"]
    assert "| 4 | <8 | n/a (no capacity) |" in rows["| layers=['ssm']"]
    assert before_capacity(8, 64, 32, 256, 48, 64) is None          # h may be 33: 41 < 63 may hold
    assert before_capacity(8, 16, 8, 256, 8, 16) is False           # 8 + 9 >= 15 at the least
    # a capacity at the ladder's top is a lower bound: P + h < C is then known only when P + h is below it
    records = [record("delta", 0, 16, 128, top=128), record("delta", 1, 64, 48, top=64), record("ovq", 0, None, 64, top=64)]
    for r in records[1:]:
        r.probes["capacity"]["curve"]["points"][-1]["score"] = 0.9
    rows = {line.split(" | ")[0]: line for line in before_capacity_table(records).splitlines()[2:]}
    assert "| 16, 64 | >=128, 48 | 1 of 1 seeds; 1 seed(s) unknown (beyond the ladders) |" in rows["| layers=['delta']"]
    assert "| >64 | >=64 | 1 seed(s) unknown (beyond the ladders) |" in rows["| layers=['ovq']"]
    assert before_capacity_table([record("delta", 0, 16, 64).__class__(label="x", params={}, metric="accuracy",
                                                                               summary={})]) == ""


def test_a_curve_without_skill_at_0_items_has_no_half_point_not_an_infinite_one():
    """'Never halves' (>N, the most robust memory) and 'nothing to halve' (no skill at 0 items) are told
    apart: the second is n/a in the tables and NaN for study 17's rule (which drops that seed's pair)."""
    from experiments import compare
    from experiments.studies.why_forget import analysis as horizon_answer

    def record(skill0):
        curve = [{"items": n, "score": 0.01, "chance": 0.02, "skill": s, "standard_error": 0.0, "episodes": 8, "tokens": 2 * n}
                 for n, s in ((0, skill0), (64, skill0))]
        return compare.RunRecord(label="x", params={"model.layers": "['ssm']"}, metric="accuracy", summary={}, seed=0,
                                 data_seed=0, probes={"interference": {"curves": {"other_region": curve},
                                                                             "half_items": {"other_region": None}}})
    none, robust = record(-0.01), record(1.0)
    assert math.isnan(half_point(none, "other_region")) and half_point(robust, "other_region") == math.inf
    assert math.isnan(horizon_answer._half(none, "other_region"))
    assert "n/a (no skill at 0)" in interference_table([none])
    assert "| >64 |" in interference_table([robust])
