"""OVQ's plasticity rules (novelty growth, merge / evict when full, count discount and cap): the
batched update against the per-lane oracle (outputs, every gradient, final state), the op's contract
(one call = split calls = token by token), the rules off = the paper's update, and known answers."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from ovq_cl.ops.ovq import OVQParams, empty_ovq_state, ovq_attention
from ovq_cl.ops.ovq.update import absorb_chunk
from ovq_cl.ops.ovq.naive import absorb_chunk_naive

from conftest import rel_err

F64 = torch.float64

RULES = [
    dict(count_cap=4.0),
    dict(count_decay=0.8),
    dict(novelty_threshold=0.3),                                   # novelty on top of the plateau schedule
    dict(growth="novelty", novelty_threshold=0.1),
    dict(novelty_threshold=0.4, when_full="merge"),
    dict(novelty_threshold=0.4, when_full="evict", count_decay=0.9),
    dict(growth="novelty", novelty_threshold=0.5, when_full="merge", count_cap=3.0, state_grad="detach"),
]
IDS = ["-".join(f"{k}={v}" for k, v in r.items()) for r in RULES]


def qkv(B, T, H, D, Dv, requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, D, generator=g, dtype=F64), torch.randn(B, T, H, D, generator=g, dtype=F64)
    v = torch.randn(B, T, H, Dv, generator=g, dtype=F64)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def assert_states_equal(a, b, tol=1e-10):
    assert (a.seen, a.n_active, a.merges, a.evictions) == (b.seen, b.n_active, b.merges, b.evictions)
    for name in ("keys", "values", "counts", "pending_keys", "pending_values"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        if x.numel():
            assert (x - y).abs().max() <= tol, name


@pytest.mark.parametrize("rules", RULES, ids=IDS)
def test_batched_rules_equal_the_per_lane_oracle(rules):
    """Outputs, every gradient (through the final state too) and the final state, from a fresh state
    and from a carried one with pending tokens; awkward shapes (T = 53, Dk 5, Dv 7, 3 heads, N = 7)."""
    params = OVQParams(num_slots=7, chunk_size=4, **rules)
    q, k, v = qkv(2, 53, 3, 5, 7, requires_grad=True)
    beta = torch.tensor([3.0, 5.0, 8.0], dtype=F64, requires_grad=True)
    _, carried = ovq_attention(*(t.detach() for t in qkv(2, 11, 3, 5, 7, seed=1)), beta.detach(), params, backend="naive")
    for initial in (None, carried):
        runs = {}
        for backend in ("naive", "chunk"):
            o, state = ovq_attention(q, k, v, beta, params, initial_state=initial, backend=backend)
            weights = torch.cos(torch.arange(o.numel(), dtype=F64)).view(o.shape)
            loss = (o * weights).sum() + state.keys.sum() + state.values.pow(2).sum()
            grads = torch.autograd.grad(loss, [q, k, v, beta], allow_unused=True, materialize_grads=True)
            runs[backend] = (o, state, grads)
        (o_ref, s_ref, g_ref), (o_fast, s_fast, g_fast) = runs["naive"], runs["chunk"]
        assert rel_err(o_fast, o_ref) < 1e-10
        assert_states_equal(s_fast, s_ref)
        for name, a, b in zip(("q", "k", "v", "beta"), g_fast, g_ref):
            assert rel_err(a, b) < 1e-10, name


@pytest.mark.parametrize("rules", RULES, ids=IDS)
def test_rules_keep_the_contract_one_call_split_calls_token_by_token(rules):
    params = OVQParams(num_slots=7, chunk_size=4, **rules)
    q, k, v = qkv(2, 45, 2, 6, 6, seed=2)
    beta = torch.tensor([4.0, 9.0], dtype=F64)
    o, state = ovq_attention(q, k, v, beta, params)
    o_rec, s_rec = ovq_attention(q, k, v, beta, params, backend="recurrent")
    assert rel_err(o_rec, o) < 1e-10
    assert_states_equal(s_rec, state)
    pieces, s, prev = [], None, 0
    for cut in (1, 9, 10, 30, 45):
        out, s = ovq_attention(q[:, prev:cut], k[:, prev:cut], v[:, prev:cut], beta, params, initial_state=s)
        pieces.append(out)
        prev = cut
    assert rel_err(torch.cat(pieces, 1), o) < 1e-10
    assert_states_equal(s, state)
    short = ovq_attention(q[:, :5], k[:, :5], v[:, :5], beta, params)[1]   # state size fixed: same shapes after 5 tokens
    assert (state.keys.shape, state.values.shape, state.counts.shape) == (short.keys.shape, short.values.shape, short.counts.shape)
    if params.when_full != "none":                                      # the rule did act on this stream
        assert state.merges + state.evictions > 0


def test_rules_off_by_default_and_an_idle_rule_is_the_papers_update():
    """Default params run the paper's update; the batched rule path with a cap no count reaches gives
    bitwise the same outputs, gradients and state as that update (the one-hot writes are exact)."""
    assert not OVQParams().plastic
    plain, capped = OVQParams(num_slots=9, chunk_size=4), OVQParams(num_slots=9, chunk_size=4, count_cap=1e30)
    assert capped.plastic
    q, k, v = qkv(2, 41, 2, 5, 5, requires_grad=True, seed=3)
    beta = torch.tensor([3.0, 6.0], dtype=F64, requires_grad=True)
    out = []
    for params in (plain, capped):
        o, s = ovq_attention(q, k, v, beta, params)
        out.append((o, s, torch.autograd.grad(o.sum() + s.keys.sum() + s.values.sum(), [q, k, v, beta])))
    (o1, s1, g1), (o2, s2, g2) = out
    assert torch.equal(o1, o2)
    assert_states_equal(s1, s2, tol=0.0)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


def unit(*rows):
    return F.normalize(torch.tensor(rows, dtype=F64), dim=-1).view(1, 1, len(rows), -1)


def test_novelty_growth_known_answer():
    """growth 'novelty': the first chunk's keys (empty dictionary: all novel) open slots; a later key
    close to a centroid (cosine >= tau) is merged into it, an orthogonal one opens a new slot."""
    params = OVQParams(num_slots=4, chunk_size=2, growth="novelty", novelty_threshold=0.5)
    state = empty_ovq_state(1, 1, 4, 3, 1, dtype=F64)
    state = absorb_chunk(state, unit([1, 0, 0], [0, 1, 0]), torch.tensor([[[[1.0], [2.0]]]], dtype=F64), params)
    assert state.n_active == 2 and state.counts[0, 0].tolist() == [1, 1, 0, 0]
    state = absorb_chunk(state, unit([1, 0.1, 0], [0, 0, 1]), torch.tensor([[[[3.0], [5.0]]]], dtype=F64), params)
    assert state.counts[0, 0].tolist() == [2, 1, 1, 0]                 # first key merged into slot 0, second opened slot 2
    assert state.values[0, 0, :3, 0].tolist() == [2.0, 2.0, 5.0]        # running mean (1 + 3) / 2
    assert state.n_active == 3
    # the plateau schedule alone would have opened slots for both keys of the second chunk
    plateau = OVQParams(num_slots=4, chunk_size=2)
    s = absorb_chunk(empty_ovq_state(1, 1, 4, 3, 1, dtype=F64), unit([1, 0, 0], [0, 1, 0]),
                     torch.ones(1, 1, 2, 1, dtype=F64), plateau)
    assert s.n_active == 2


def full_state(counts, keys):
    n = len(counts)
    state = empty_ovq_state(1, 1, n, len(keys[0]), 1, dtype=F64)
    return dataclasses.replace(state, keys=unit(*keys), values=torch.arange(n, dtype=F64).view(1, 1, n, 1),
                               counts=torch.tensor(counts, dtype=F64).view(1, 1, n), n_active=n, seen=100)


KEYS = [[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0]]              # slots 0 and 1 are the closest pair


def test_evict_gives_a_novel_key_the_lowest_count_slot():
    params = OVQParams(num_slots=3, chunk_size=1, novelty_threshold=0.5, when_full="evict")
    state = absorb_chunk(full_state([5.0, 3.0, 2.0], KEYS), unit([0, 0, 1]), torch.tensor([[[[9.0]]]], dtype=F64), params)
    assert state.counts[0, 0].tolist() == [5.0, 3.0, 1.0] and state.values[0, 0, :, 0].tolist() == [0.0, 1.0, 9.0]
    assert (state.evictions, state.merges) == (1, 0)
    # a familiar key is merged as usual: no eviction
    again = absorb_chunk(state, unit([1, 0, 0]), torch.tensor([[[[6.0]]]], dtype=F64), params)
    assert again.counts[0, 0].tolist() == [6.0, 3.0, 1.0] and again.evictions == 1


def test_merge_frees_the_closest_pair_count_weighted():
    params = OVQParams(num_slots=3, chunk_size=1, novelty_threshold=0.5, when_full="merge")
    before = full_state([3.0, 1.0, 2.0], KEYS)
    state = absorb_chunk(before, unit([0, 0, 1]), torch.tensor([[[[9.0]]]], dtype=F64), params)
    assert state.counts[0, 0].tolist() == [4.0, 1.0, 2.0]
    assert state.values[0, 0, :, 0].tolist() == pytest.approx([(3 * 0 + 1 * 1) / 4, 9.0, 2.0])
    expected_key = F.normalize(3 * before.keys[0, 0, 0] + 1 * before.keys[0, 0, 1], dim=-1)
    assert torch.allclose(state.keys[0, 0, 0], expected_key) and torch.allclose(state.keys[0, 0, 1], unit([0, 0, 1])[0, 0, 0])
    assert (state.merges, state.evictions) == (1, 0)
    # without the rule the novel key is merged into its nearest centroid and nothing is freed
    plain = absorb_chunk(before, unit([0, 0, 1]), torch.tensor([[[[9.0]]]], dtype=F64),
                         OVQParams(num_slots=3, chunk_size=1, novelty_threshold=0.5))
    assert plain.counts[0, 0].sum() == before.counts[0, 0].sum() + 1 and plain.merges == 0


def test_count_discount_and_cap_known_answers():
    """Discount: a slot no key hits decays by gamma per chunk. Cap: the value step of a capped slot is
    m / (cap + m), so a centroid keeps moving (without the cap: m / (c + m) -> 0)."""
    decay = OVQParams(num_slots=3, chunk_size=1, count_decay=0.5)
    state = absorb_chunk(full_state([8.0, 4.0, 2.0], KEYS), unit([0, 1, 0]), torch.tensor([[[[2.0]]]], dtype=F64), decay)
    assert state.counts[0, 0].tolist() == [4.0, 2.0, 2.0]              # slot 2: 2 * 0.5 + 1
    cap = OVQParams(num_slots=3, chunk_size=1, count_cap=4.0)
    state = absorb_chunk(full_state([100.0, 1.0, 1.0], KEYS), unit([1, 0, 0]), torch.tensor([[[[1.0]]]], dtype=F64), cap)
    assert state.counts[0, 0, 0] == 4.0
    state = absorb_chunk(state, unit([1, 0, 0]), torch.tensor([[[[10.0]]]], dtype=F64), cap)
    v0 = (100 * 0 + 1) / 101                                           # first step: count 100 before the cap
    assert state.values[0, 0, 0, 0].item() == pytest.approx(v0 + (10 - v0) / 5)
    # a long decay never empties a used slot (count 0 would mean "unused")
    s = full_state([1.0, 1.0, 1.0], KEYS)
    for _ in range(200):
        s = absorb_chunk(s, unit([1, 0, 0]), torch.zeros(1, 1, 1, 1, dtype=F64), OVQParams(num_slots=3, chunk_size=1, count_decay=0.5))
    assert (s.counts > 0).all() and s.n_active == 3


def test_naive_and_batched_agree_chunk_by_chunk_on_the_maintenance_rules():
    g = torch.Generator().manual_seed(0)
    for rule in ("merge", "evict"):
        params = OVQParams(num_slots=5, chunk_size=3, novelty_threshold=0.6, when_full=rule, count_decay=0.95)
        a = b = empty_ovq_state(3, 2, 5, 4, 2, dtype=F64)
        for _ in range(12):
            k = F.normalize(torch.randn(3, 2, 3, 4, generator=g, dtype=F64), dim=-1)
            v = torch.randn(3, 2, 3, 2, generator=g, dtype=F64)
            a, b = absorb_chunk(a, k, v, params), absorb_chunk_naive(b, k, v, params)
            assert_states_equal(a, b)
        assert a.merges + a.evictions > 0


@pytest.mark.parametrize("bad, match", [
    (dict(growth="novelty"), "needs novelty_threshold"),
    (dict(when_full="merge"), "needs novelty_threshold"),
    (dict(when_full="split", novelty_threshold=0.5), "when_full must be one of"),
    (dict(novelty_threshold=0.5, init="random"), "needs init 'spread'"),
    (dict(novelty_threshold=1.5), r"cosine in \[-1, 1\)"),
    (dict(count_decay=0.0), r"count_decay must be in \(0, 1\]"),
    (dict(count_decay=1.5), r"count_decay must be in \(0, 1\]"),
    (dict(count_cap=0.5), "count_cap must be >= 1"),
])
def test_bad_rule_settings_raise_one_clear_line(bad, match):
    with pytest.raises(ValueError, match=match):
        OVQParams(**bad)


def test_layer_reports_used_slots_and_maintenance_per_lane():
    from ovq_cl.layers.ovq import OVQAttention

    torch.manual_seed(0)
    layer = OVQAttention(d_model=16, n_heads=2, num_slots=6, chunk_size=4, growth="novelty",
                         novelty_threshold=0.6, when_full="evict").double()
    _, state = layer(torch.randn(3, 64, 16, dtype=F64))
    stats = layer.state_stats(state)
    used = (state.counts > 0).sum(-1).double()
    assert stats["active_slots"] == pytest.approx(float(used.mean()))
    assert stats["evictions"] == pytest.approx(state.evictions / 3) and stats["evictions"] > 0
    assert stats["merges"] == 0.0
    restored = type(state).from_state_dict(state.state_dict())
    assert (restored.merges, restored.evictions) == (state.merges, state.evictions)


def test_recomputed_chunks_under_the_rules_give_the_same_values_gradients_and_counters():
    rules = dict(novelty_threshold=0.4, when_full="merge", count_decay=0.9)
    q, k, v = qkv(2, 45, 2, 5, 5, requires_grad=True, seed=4)
    beta = torch.tensor([3.0, 6.0], dtype=F64, requires_grad=True)
    out = []
    for s in (0, 3):
        params = OVQParams(num_slots=6, chunk_size=4, recompute_chunks=s, **rules)
        o, state = ovq_attention(q, k, v, beta, params)
        out.append((o, state, torch.autograd.grad((o * o).sum() + state.values.sum(), [q, k, v, beta])))
    (o1, s1, g1), (o2, s2, g2) = out
    assert rel_err(o2, o1) < 1e-12 and s1.merges > 0
    assert_states_equal(s2, s1, tol=1e-12)
    for a, b in zip(g1, g2):
        assert rel_err(b, a) < 1e-12
