"""The OVQ op: known answers, equivalences and invariants of the PyTorch reference."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from ovq_cl.ops.ovq import OVQParams, growth_target, ovq_attention
from ovq_cl.ops.ovq.common import OVQState, empty_ovq_state, growth_curve
from ovq_cl.ops.ovq.naive import assign_to_slots, kmeans_merge, spread_init_select

from conftest import rel_err

F64 = torch.float64


def qkv(B, T, H, D, Dv=None, dtype=F64, requires_grad=False):
    Dv = D if Dv is None else Dv
    q, k = torch.randn(B, T, H, D, dtype=dtype), torch.randn(B, T, H, D, dtype=dtype)
    v = torch.randn(B, T, H, Dv, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def exact_softmax_attention(q, k, v, beta):
    """Independent reference: causal softmax over normalised q, k with scale beta, one matrix per head."""
    qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    s = torch.einsum("bthd,bshd->bhts", qn, kn) * beta.view(1, -1, 1, 1)
    T = q.shape[1]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhts,bshd->bthd", s.softmax(-1), v)


def assert_states_equal(a: OVQState, b: OVQState, tol=1e-10):
    assert a.seen == b.seen and a.n_active == b.n_active
    for name in ("keys", "values", "counts", "pending_keys", "pending_values"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        if x.numel():
            assert (x - y).abs().max() <= tol, name


@pytest.mark.parametrize("T,D,L", [(63, 60, 16), (500, 32, 64)])
def test_unsaturated_dictionary_equals_exact_softmax_attention(T, D, L):
    q, k, v = qkv(2, T, 3, D)
    beta = torch.tensor([2.0, 5.0, 11.0], dtype=F64)
    params = OVQParams(num_slots=T + 5, chunk_size=L, growth="linear", growth_rate=1.0)
    o, state = ovq_attention(q, k, v, beta, params)
    assert rel_err(o, exact_softmax_attention(q, k, v, beta)) < 1e-10
    assert state.n_active == (T // L) * L  # every absorbed key got its own slot


def test_saturated_dictionary_differs_from_softmax_attention():
    """The equivalence above is not vacuous: with N < T the outputs change."""
    q, k, v = qkv(1, 63, 2, 16)
    beta = torch.tensor([4.0, 4.0], dtype=F64)
    o, _ = ovq_attention(q, k, v, beta, OVQParams(num_slots=8, chunk_size=8))
    assert rel_err(o, exact_softmax_attention(q, k, v, beta)) > 1e-3


CONFIGS = [
    OVQParams(num_slots=12, chunk_size=8),
    OVQParams(num_slots=12, chunk_size=8, growth="linear", growth_rate=0.5, init="random", init_seed=3),
    OVQParams(num_slots=40, chunk_size=7, growth_alpha=5.0, state_grad="detach"),
    OVQParams(num_slots=5, chunk_size=1),
]


@pytest.mark.parametrize("params", CONFIGS, ids=lambda p: f"N{p.num_slots}-L{p.chunk_size}-{p.growth}-{p.init}-{p.state_grad}")
def test_chunked_equals_token_by_token_and_split_calls(params):
    q, k, v = qkv(2, 63, 3, 60, Dv=20)
    beta = torch.tensor([3.0, 6.0, 9.0], dtype=F64)
    o, state = ovq_attention(q, k, v, beta, params)
    o_rec, state_rec = ovq_attention(q, k, v, beta, params, backend="recurrent")
    assert rel_err(o_rec, o) < 1e-10
    assert_states_equal(state_rec, state)
    L = params.chunk_size
    for cuts in ([2 * L, 5 * L], [1, 17, 18, 40]):          # at chunk boundaries, then anywhere
        pieces, s, prev = [], None, 0
        for cut in cuts + [63]:
            out, s = ovq_attention(q[:, prev:cut], k[:, prev:cut], v[:, prev:cut], beta, params, initial_state=s)
            pieces.append(out)
            prev = cut
        assert rel_err(torch.cat(pieces, 1), o) < 1e-10
        assert_states_equal(s, state)


@pytest.mark.parametrize("params", CONFIGS, ids=lambda p: f"N{p.num_slots}-L{p.chunk_size}-{p.growth}-{p.init}-{p.state_grad}")
def test_the_fast_chunked_path_equals_the_plain_oracle(params):
    """Outputs, every gradient (through the final state too) and the final state, from a fresh state and
    from a carried one with pending tokens; awkward shapes (T = 37, Dk 5, Dv 7, 3 heads)."""
    q, k, v = qkv(2, 37, 3, 5, Dv=7, requires_grad=True)
    beta = torch.tensor([3.0, 5.0, 8.0], dtype=F64, requires_grad=True)
    _, carried = ovq_attention(*(t.detach() for t in qkv(2, 11, 3, 5, Dv=7)), beta.detach(), params, backend="naive")
    for initial in (None, carried):
        runs = {}
        for backend in ("naive", "chunk"):
            o, state = ovq_attention(q, k, v, beta, params, initial_state=initial, backend=backend)
            weights = torch.cos(torch.arange(o.numel(), dtype=F64)).view(o.shape)
            loss = (o * weights).sum() + state.keys.sum() + state.values.pow(2).sum()
            runs[backend] = (o, state, torch.autograd.grad(loss, [q, k, v, beta]))
        (o_ref, s_ref, g_ref), (o_fast, s_fast, g_fast) = runs["naive"], runs["chunk"]
        assert rel_err(o_fast, o_ref) < 1e-10
        assert_states_equal(s_fast, s_ref)
        for name, a, b in zip("qkv", g_fast, g_ref):
            assert rel_err(a, b) < 1e-10, name
        assert rel_err(g_fast[3], g_ref[3]) < 1e-10


def test_random_init_differs_from_spread_init():
    q, k, v = qkv(1, 64, 1, 8)
    beta = torch.ones(1, dtype=F64)
    spread = ovq_attention(q, k, v, beta, OVQParams(num_slots=16, chunk_size=32))[1]
    rand = ovq_attention(q, k, v, beta, OVQParams(num_slots=16, chunk_size=32, init="random"))[1]
    assert not torch.equal(spread.keys, rand.keys)


@pytest.mark.parametrize("causal_mode", ["recurrent", "auto"])
def test_causality(causal_mode):
    q, k, v = qkv(1, 40, 2, 8)
    beta = torch.tensor([5.0, 5.0], dtype=F64)
    params = OVQParams(num_slots=6, chunk_size=8)
    o, _ = ovq_attention(q, k, v, beta, params, backend=causal_mode)
    for t in (0, 7, 8, 21, 38):
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        for x in (q2, k2, v2):
            x[:, t + 1:] = torch.randn_like(x[:, t + 1:])
        o2, _ = ovq_attention(q2, k2, v2, beta, params, backend=causal_mode)
        assert torch.allclose(o2[:, : t + 1], o[:, : t + 1], rtol=0, atol=1e-12)
        assert not torch.allclose(o2[:, t + 1:], o[:, t + 1:])


@pytest.mark.parametrize("growth", ["plateau", "linear"])
def test_state_invariants(growth):
    params = OVQParams(num_slots=24, chunk_size=8, growth=growth, growth_alpha=30.0, growth_rate=0.4)
    q, k, v = qkv(2, 8, 2, 16, dtype=torch.float32)
    beta = torch.full((2,), 5.0)
    state, prev_active = None, 0
    for _ in range(40):
        q, k, v = qkv(2, 8, 2, 16, dtype=torch.float32)
        _, state = ovq_attention(q, k, v, beta, params, initial_state=state)
        assert torch.all(state.counts.sum(-1) == state.seen)                   # counts sum to tokens absorbed
        assert state.n_active == growth_target(state.seen, params) <= params.num_slots
        assert state.n_active >= prev_active
        prev_active = state.n_active
        active = state.keys[:, :, : state.n_active]
        assert torch.allclose(active.norm(dim=-1), torch.ones(()), atol=1e-5)   # unit-norm key rows
        assert torch.all(state.counts[:, :, : state.n_active] >= 1)
        assert torch.all(state.counts[:, :, state.n_active:] == 0)
    if growth == "linear":                                  # 0.4 x 320 tokens > 24 slots: full
        assert state.n_active == params.num_slots
    else:                                                   # the plateau approaches N and stays below it
        expected = math.ceil(24 * (1 - (1 + state.seen / 30.0) ** (-30.0 / 24)))
        assert state.n_active == expected < params.num_slots


def test_growth_function_shape():
    p = OVQParams(num_slots=1024, chunk_size=64)          # alpha = N: G(t) = N t / (N + t)
    for t in (1, 64, 1000, 10**6):
        assert math.isclose(growth_curve(t, p), 1024 * t / (1024 + t), rel_tol=1e-9)
    assert growth_target(64, p) == 61 and growth_target(10**9, p) == 1024
    lin = OVQParams(num_slots=100, chunk_size=8, growth="linear", growth_rate=0.5)
    assert [growth_target(t, lin) for t in (8, 16, 1000)] == [4, 8, 100]


def test_state_size_independent_of_sequence_length():
    params = OVQParams(num_slots=32, chunk_size=64)
    beta = torch.full((2,), 5.0)
    sizes = {}
    for T in (256, 4096):
        q, k, v = qkv(1, T, 2, 16, dtype=torch.float32)
        with torch.no_grad():
            _, state = ovq_attention(q, k, v, beta, params)
        sizes[T] = state.nbytes
    assert sizes[256] == sizes[4096] == 2 * 32 * (16 + 16 + 1) * 4


def test_kmeans_step_is_newton_step_on_mixture_nll():
    """For one slot with c earlier points summarised by its mean mu and m new points x_i, the NLL
    0.5 * (c |mu - mu_old|^2 + sum |x_i - mu|^2) has its Newton step at mu_old equal to the batch
    k-means update (c mu_old + sum x_i) / (c + m)."""
    D, c, m = 5, 7.0, 4
    mu_old = torch.randn(D, dtype=F64)
    xs = torch.randn(m, D, dtype=F64)

    def nll(mu):
        return 0.5 * (c * (mu - mu_old).pow(2).sum() + (xs - mu).pow(2).sum())

    mu = mu_old.clone().requires_grad_(True)
    grad = torch.autograd.grad(nll(mu), mu)[0]
    hess = torch.autograd.functional.hessian(nll, mu_old)
    newton = mu_old - torch.linalg.solve(hess, grad)
    N = 3
    keys = F.normalize(torch.randn(1, 1, N, D, dtype=F64), dim=-1)
    values = torch.randn(1, 1, N, D, dtype=F64)
    values[0, 0, 1] = mu_old
    counts = torch.tensor([[[2.0, c, 0.0]]], dtype=F64)
    slot = torch.ones(1, 1, m, dtype=torch.long)
    new_k, new_v, new_c = kmeans_merge(keys, values, counts, slot, F.normalize(xs, dim=-1)[None, None], xs[None, None])
    assert rel_err(new_v[0, 0, 1], newton) < 1e-12
    assert new_c[0, 0].tolist() == [2.0, c + m, 0.0]
    assert torch.equal(new_k[0, 0, 0], keys[0, 0, 0]) and torch.equal(new_v[0, 0, 0], values[0, 0, 0])  # untouched row
    assert torch.allclose(new_k[0, 0, 1].norm(), torch.ones((), dtype=F64))


def test_spread_init_picks_keys_least_similar_to_centroids():
    D = 4
    centroids = torch.eye(D, dtype=F64)[:2][None, None]                       # e0, e1
    keys = torch.tensor([[1.0, 0, 0, 0], [0, 0, 1.0, 0], [0.7, 0.7, 0, 0], [0, 0, 0, 1.0], [0, 1.0, 0, 0]], dtype=F64)
    keys = F.normalize(keys, dim=-1)[None, None]
    chosen = spread_init_select(keys, centroids, 2)
    assert sorted(chosen[0, 0].tolist()) == [1, 3]                             # orthogonal to both centroids
    assert spread_init_select(keys, centroids[:, :, :0], 3)[0, 0].tolist() == [0, 1, 2]  # no centroids: by position
    assert assign_to_slots(keys, centroids)[0, 0].tolist() == [0, 0, 0, 0, 1]


def test_spread_init_and_kmeans_through_the_op_known_answer():
    """Three chunks of 4 keys, linear growth 0.25 (one new slot per chunk), no noise.

    chunk 1 [A A A A]: the first slot is A (count 4).
    chunk 2 [A B A C]: B is orthogonal to A, C is at 0.5 from A: B wins the new slot; C joins A.
    chunk 3 [C A B C]: C (max similarity 0.5) wins the new slot; the rest join their own slot.
    """
    A, B = torch.tensor([1.0, 0, 0], dtype=F64), torch.tensor([0, 1.0, 0], dtype=F64)
    C = torch.tensor([0.5, 0, math.sqrt(0.75)], dtype=F64)
    keys = torch.stack([A, A, A, A, A, B, A, C, C, A, B, C])[None, :, None]
    values = torch.arange(12, dtype=F64).view(1, 12, 1, 1)
    params = OVQParams(num_slots=3, chunk_size=4, growth="linear", growth_rate=0.25)
    _, state = ovq_attention(keys, keys, values, torch.ones(1, dtype=F64), params)
    assert state.counts[0, 0].tolist() == [8.0, 2.0, 2.0]
    assert rel_err(state.keys[0, 0, 1], B) < 1e-12 and rel_err(state.keys[0, 0, 2], C) < 1e-12
    after_chunk2 = F.normalize(4 * A + 2 * A + C, dim=0)                     # c_n D_k[n] + sum of new keys
    assert rel_err(state.keys[0, 0, 0], F.normalize(7 * after_chunk2 + A, dim=0)) < 1e-12
    # value means: A slot got tokens 0-4, 6, 7 (C joined A) and 9; B got 5 and 10; C got 8 and 11
    expected = torch.tensor([(0 + 1 + 2 + 3 + 4 + 6 + 7 + 9) / 8, (5 + 10) / 2, (8 + 11) / 2], dtype=F64)
    assert rel_err(state.values[0, 0, :, 0], expected) < 1e-12


def test_gradients_match_finite_differences_with_full_state_grad():
    q, k, v = qkv(1, 10, 2, 3, requires_grad=True)
    beta = torch.tensor([2.0, 3.0], dtype=F64, requires_grad=True)
    params = OVQParams(num_slots=3, chunk_size=3, state_grad="full")
    assert torch.autograd.gradcheck(lambda *a: ovq_attention(*a, params)[0], (q, k, v, beta), eps=1e-6, atol=1e-6)


def test_state_grad_full_lets_later_chunks_train_earlier_keys():
    q, k, v = qkv(1, 16, 1, 4, requires_grad=True)
    beta = torch.tensor([3.0], dtype=F64)
    grads = {}
    for mode in ("full", "detach"):
        o, _ = ovq_attention(q, k, v, beta, OVQParams(num_slots=4, chunk_size=8, state_grad=mode))
        grads[mode] = torch.autograd.grad(o[:, 8:].sum(), (k, v))              # second chunk only
    for g in grads["full"]:
        assert g[:, :8].abs().max() > 1e-6 and torch.isfinite(g).all()
    for g in grads["detach"]:
        assert g[:, :8].abs().max() == 0


def test_float32_and_gradients_finite_at_scale():
    q, k, v = qkv(2, 256, 4, 32, dtype=torch.float32, requires_grad=True)
    beta = torch.full((4,), 8.0, requires_grad=True)
    o, _ = ovq_attention(q, k, v, beta, OVQParams(num_slots=64, chunk_size=32))
    o.square().mean().backward()
    for t in (q, k, v, beta):
        assert torch.isfinite(t.grad).all()


def test_bad_input_raises_clear_errors():
    q, k, v = qkv(1, 8, 2, 4)
    beta = torch.ones(2, dtype=F64)
    p = OVQParams(num_slots=4, chunk_size=4)
    with pytest.raises(ValueError, match="rank 4"):
        ovq_attention(q[0], k, v, beta, p)
    with pytest.raises(ValueError, match="same shape"):
        ovq_attention(q, k[..., :3], v, beta, p)
    with pytest.raises(ValueError, match="beta"):
        ovq_attention(q, k, v, torch.ones(3), p)
    with pytest.raises(ValueError, match="chunk_size"):
        OVQParams(num_slots=4, chunk_size=0)
    with pytest.raises(ValueError, match="num_slots"):
        OVQParams(num_slots=0, chunk_size=4)
    with pytest.raises(ValueError, match="growth"):
        OVQParams(num_slots=4, chunk_size=4, growth="exponential")
    with pytest.raises(ValueError, match="backend"):
        ovq_attention(q, k, v, beta, p, backend="cuda-magic")
    _, s = ovq_attention(q, k, v, beta, p)
    with pytest.raises(ValueError, match="initial_state.keys"):
        ovq_attention(q, k, v, beta, OVQParams(num_slots=5, chunk_size=4), initial_state=s)


def test_state_dict_round_trip_and_clone_isolation(tmp_path):
    q, k, v = qkv(1, 13, 2, 4)
    beta = torch.ones(2, dtype=F64)
    p = OVQParams(num_slots=4, chunk_size=4)
    _, s = ovq_attention(q, k, v, beta, p)
    torch.save(s.state_dict(), tmp_path / "s.pt")
    s2 = OVQState.from_state_dict(torch.load(tmp_path / "s.pt"))
    assert_states_equal(s2, s, tol=0)
    c = s.clone()
    c.keys.add_(1.0)
    assert not torch.equal(c.keys, s.keys)
    o1, _ = ovq_attention(q, k, v, beta, p, initial_state=s)
    o2, _ = ovq_attention(q, k, v, beta, p, initial_state=s2)
    assert torch.equal(o1, o2)
    assert empty_ovq_state(1, 2, 4, 4, 4).nbytes == 2 * 4 * 9 * 4


@pytest.mark.parametrize("T, pending", [(200, 0), (131, 5)])
def test_inference_path_equals_autograd_path(T, pending):
    """Without autograd the op normalises in place, updates the dictionary in place and writes the
    output chunk by chunk into one time-major buffer; with autograd everything is functional. Same
    outputs (time-major and contiguous), same final state, whatever the pending tokens."""
    params = OVQParams(num_slots=24, chunk_size=16)
    beta = torch.tensor([4.0, 9.0], dtype=F64)
    q, k, v = qkv(2, T, 2, 12)
    s0 = None
    if pending:
        with torch.no_grad():
            _, s0 = ovq_attention(*(t[:, :16 + pending] for t in (q, k, v)), beta, params)
        q, k, v = (t[:, 16 + pending:] for t in (q, k, v))
    with torch.no_grad():
        o_inf, s_inf = ovq_attention(q, k, v, beta, params, initial_state=s0)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o_ag, s_ag = ovq_attention(*leaves, beta, params, initial_state=s0)
    assert o_inf.shape == o_ag.shape == (2, q.shape[1], 2, 12) and o_inf.is_contiguous()
    assert rel_err(o_inf, o_ag) < 1e-12
    for name in ("keys", "values", "counts", "pending_keys", "pending_values"):
        assert rel_err(getattr(s_inf, name), getattr(s_ag, name)) < 1e-12, name
    assert (s_inf.seen, s_inf.n_active) == (s_ag.seen, s_ag.n_active)


@pytest.mark.parametrize("group, state_grad, T, pending", [(1, "full", 100, 0), (3, "full", 137, 5), (4, "detach", 137, 5),
                                                           (50, "full", 64, 0)])
def test_recomputed_chunks_give_the_same_values_and_gradients(group, state_grad, T, pending):
    """recompute_chunks runs groups of chunks without their graph and again in the backward: outputs,
    final state and every gradient (q, k, v, beta; through the dictionary with state_grad="full")
    equal the plain graph's, with or without pending tokens carried in (the chunk that continues
    them, and a last partial chunk, run outside the groups)."""
    base = OVQParams(num_slots=20, chunk_size=8, state_grad=state_grad)
    s0 = None
    if pending:
        with torch.no_grad():
            _, s0 = ovq_attention(*qkv(2, 16 + pending, 2, 6), torch.full((2,), 5.0, dtype=F64), base)

    def run(params):
        torch.manual_seed(3)
        q, k, v = qkv(2, T, 2, 6, requires_grad=True)
        beta = torch.tensor([3.0, 7.0], dtype=F64, requires_grad=True)
        o, state = ovq_attention(q, k, v, beta, params, initial_state=s0)
        loss = (o * torch.linspace(-1, 1, o.shape[-1], dtype=F64)).sum() + state.values.square().sum()
        return o, state, torch.autograd.grad(loss, [q, k, v, beta], materialize_grads=True)

    o_ref, s_ref, g_ref = run(base)
    o_rc, s_rc, g_rc = run(dataclasses.replace(base, recompute_chunks=group))
    assert rel_err(o_rc, o_ref) < 1e-12
    for name in ("keys", "values", "counts", "pending_keys", "pending_values"):
        a, b = getattr(s_rc, name), getattr(s_ref, name)
        assert a.shape == b.shape and (b.numel() == 0 or rel_err(a, b) < 1e-12), name
    assert (s_rc.seen, s_rc.n_active) == (s_ref.seen, s_ref.n_active)
    for name, a, b in zip(("q", "k", "v", "beta"), g_rc, g_ref):
        assert rel_err(a, b) < 1e-10, name
    assert all(g.abs().sum() > 0 for g in g_ref)


def test_recomputed_chunks_keep_less_for_the_backward():
    """What the forward keeps for the backward (saved tensors, by storage): about one dictionary per
    chunk without recomputation, one per group of chunks with it."""
    q, k, v = qkv(1, 256, 2, 16, dtype=torch.float32, requires_grad=True)
    beta = torch.full((2,), 5.0, requires_grad=True)

    def saved_bytes(params):
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            ovq_attention(q, k, v, beta, params)
        return sum(storages.values())

    dictionary = 2 * 64 * (16 + 16 + 1) * 4                 # keys, values, counts of 2 heads
    plain = saved_bytes(OVQParams(num_slots=64, chunk_size=8))
    recomputed = saved_bytes(OVQParams(num_slots=64, chunk_size=8, recompute_chunks=8))
    assert plain > 40 * dictionary                          # 32 chunks: a dictionary and more per chunk
    assert recomputed < plain / 3                           # 4 groups' dictionaries, plus q, k, v


@pytest.mark.parametrize("T", [256, 250])
@pytest.mark.parametrize("grad", [False, True])
def test_returned_state_does_not_hold_the_sequence(T, grad):
    """The pending buffer is its own small tensor, never a view of the call's whole key sequence
    (which would keep all of it alive with the state)."""
    params = OVQParams(num_slots=16, chunk_size=16)
    q, k, v = qkv(1, T, 2, 8, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        _, state = ovq_attention(q, k, v, torch.full((2,), 5.0, dtype=F64), params)
    limit = 2 * params.chunk_size * 8 * 8                   # heads x L x D x 8 bytes
    for t in (state.pending_keys, state.pending_values):
        assert t.shape[2] == T % params.chunk_size
        assert t.untyped_storage().nbytes() <= limit


def test_recomputed_chunks_follow_autocast_and_refuse_double_backward():
    """The rerun in the backward happens under the forward's autocast (bf16 here), so gradients equal
    the plain graph's under the same autocast; create_graph=True raises instead of being wrong."""
    def grads(params):
        torch.manual_seed(1)
        q, k, v = qkv(1, 64, 2, 16, dtype=torch.float32, requires_grad=True)
        beta = torch.full((2,), 6.0, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            o, _ = ovq_attention(q, k, v, beta, params)
        return torch.autograd.grad(o.float().square().sum(), [q, k, v, beta])

    base = OVQParams(num_slots=24, chunk_size=8)
    for a, b in zip(grads(dataclasses.replace(base, recompute_chunks=2)), grads(base)):
        assert rel_err(a, b) < 1e-6
    q, k, v = qkv(1, 32, 2, 8, requires_grad=True)
    o, _ = ovq_attention(q, k, v, torch.full((2,), 4.0, dtype=F64), dataclasses.replace(base, recompute_chunks=2))
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(o.sum(), q, create_graph=True)


def test_segment_runs_cover_every_chunk_once_in_order():
    from ovq_cl.ops.recompute import segment_runs

    eligible = [False, True, True, True, False, True, True]
    assert segment_runs(eligible, 2) == [(0, 1, False), (1, 3, True), (3, 4, True), (4, 5, False), (5, 7, True)]
    assert segment_runs(eligible, 0) == [(i, i + 1, False) for i in range(7)]
    assert segment_runs([], 3) == []
