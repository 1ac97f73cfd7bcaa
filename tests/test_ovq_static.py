"""The OVQ chunk loop with static shapes (whole dictionary, inactive slots masked) against the dynamic
one (active prefix sliced): the same outputs, every gradient and the same final state, in float64, on
awkward shapes (T not a multiple of L, N filled mid-sequence, N not a multiple of anything), for every
growth schedule and init, one call, split calls, inference (in place), recomputed chunks, and the
plasticity rules; and the property that makes it static: every full chunk runs on the same shapes."""
import dataclasses

import pytest
import torch

from ovq_cl.ops.ovq import OVQParams, ovq_attention
from ovq_cl.ops.ovq import chunk as chunk_module
from ovq_cl.ops.ovq import primitives

from conftest import rel_err
from test_ovq_op import assert_states_equal

F64 = torch.float64

PARAMS = {
    "plateau-spread": OVQParams(num_slots=11, chunk_size=5),
    "plateau-alpha": OVQParams(num_slots=9, chunk_size=4, growth_alpha=3.0),
    "linear-fills-mid-sequence": OVQParams(num_slots=13, chunk_size=6, growth="linear", growth_rate=0.7),
    "random-init": OVQParams(num_slots=10, chunk_size=5, init="random", init_seed=3),
    "detach": OVQParams(num_slots=8, chunk_size=3, state_grad="detach"),
    "one-slot": OVQParams(num_slots=1, chunk_size=4),
}


def inputs(B=2, T=47, H=2, Dk=3, Dv=5, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, Dk, generator=g, dtype=F64), torch.randn(B, T, H, Dk, generator=g, dtype=F64)
    v = torch.randn(B, T, H, Dv, generator=g, dtype=F64)
    beta = torch.tensor([3.0, 7.0], dtype=F64)[:H].clone()
    return [t.requires_grad_(grad) for t in (q, k, v, beta)]


def run_with_grads(params, static, T=47, splits=(), backend="chunk"):
    """Output, final state and the gradients of a fixed random projection of the output wrt q, k, v, beta,
    the sequence fed in one call or in pieces cut at ``splits`` (the state carried between calls)."""
    q, k, v, beta = inputs(T=T)
    cuts = [0, *splits, T]
    outs, state = [], None
    for a, b in zip(cuts[:-1], cuts[1:]):
        o, state = ovq_attention(q[:, a:b], k[:, a:b], v[:, a:b], beta, params, initial_state=state,
                                 backend=backend, static=static)
        outs.append(o)
    o = torch.cat(outs, dim=1)
    w = torch.randn(o.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    grads = torch.autograd.grad((o * w).sum(), (q, k, v, beta), allow_unused=True, materialize_grads=True)
    return o, state, grads


@pytest.mark.parametrize("name", list(PARAMS))
@pytest.mark.parametrize("splits", [(), (13, 14, 30)], ids=["one-call", "split-calls"])
def test_static_equals_dynamic_outputs_gradients_and_state(name, splits):
    params = PARAMS[name]
    o_d, s_d, g_d = run_with_grads(params, static=False, splits=splits)
    o_s, s_s, g_s = run_with_grads(params, static=True, splits=splits)
    assert rel_err(o_s, o_d) < 1e-12
    for which, a, b in zip("q k v beta".split(), g_s, g_d):
        assert rel_err(a, b) < 1e-11, which
    assert_states_equal(s_s, s_d, tol=1e-12)
    assert s_s.n_active > 0 and float(s_s.counts.sum()) == float(s_d.counts.sum())


@pytest.mark.parametrize("name", ["plateau-spread", "random-init"])
def test_static_inference_in_place_equals_dynamic(name):
    params = PARAMS[name]
    q, k, v, beta = inputs(grad=False)
    with torch.no_grad():
        o_d, s_d = ovq_attention(q, k, v, beta, params, backend="chunk")
        o_s, s_s = ovq_attention(q, k, v, beta, params, backend="chunk", static=True)
        # and continuing from the state, the pending tokens carried
        o_d2, s_d2 = ovq_attention(q[:, :9], k[:, :9], v[:, :9], beta, params, initial_state=s_d, backend="chunk")
        o_s2, s_s2 = ovq_attention(q[:, :9], k[:, :9], v[:, :9], beta, params, initial_state=s_s, backend="chunk",
                                   static=True)
    assert rel_err(o_s, o_d) < 1e-12 and rel_err(o_s2, o_d2) < 1e-12
    assert_states_equal(s_s, s_d, tol=1e-12)
    assert_states_equal(s_s2, s_d2, tol=1e-12)


@pytest.mark.parametrize("group", [1, 3])
def test_static_recomputed_chunks_equal_dynamic(group):
    params = dataclasses.replace(PARAMS["plateau-spread"], recompute_chunks=group)
    o_d, s_d, g_d = run_with_grads(params, static=False, splits=(7,))
    o_s, s_s, g_s = run_with_grads(params, static=True, splits=(7,))
    assert rel_err(o_s, o_d) < 1e-12
    assert all(rel_err(a, b) < 1e-11 for a, b in zip(g_s, g_d))
    assert_states_equal(s_s, s_d, tol=1e-12)


@pytest.mark.parametrize("rule", [dict(novelty_threshold=0.2, growth="novelty", when_full="merge"),
                                  dict(novelty_threshold=0.0, when_full="evict", count_decay=0.9),
                                  dict(count_cap=2.0)], ids=["novelty-merge", "evict-decay", "cap"])
def test_static_with_the_plasticity_rules_equals_dynamic(rule):
    params = OVQParams(num_slots=6, chunk_size=4, **rule)
    o_d, s_d, g_d = run_with_grads(params, static=False, T=41, splits=(10,))
    o_s, s_s, g_s = run_with_grads(params, static=True, T=41, splits=(10,))
    assert rel_err(o_s, o_d) < 1e-12
    assert all(rel_err(a, b) < 1e-11 for a, b in zip(g_s, g_d))
    assert_states_equal(s_s, s_d, tol=1e-12)
    assert (s_s.merges, s_s.evictions) == (s_d.merges, s_d.evictions)


def test_static_matches_the_plain_oracle():
    params = PARAMS["linear-fills-mid-sequence"]
    q, k, v, beta = inputs(grad=False)
    o_s, s_s = ovq_attention(q, k, v, beta, params, backend="chunk", static=True)
    o_n, s_n = ovq_attention(q, k, v, beta, params, backend="naive")
    assert rel_err(o_s, o_n) < 1e-12
    assert_states_equal(s_s, s_n, tol=1e-12)


def test_every_full_chunk_reads_and_updates_the_same_shapes(monkeypatch):
    """What makes the path static: the read sees all N slots in every chunk, and the k-means step gets
    the same shapes, while the dynamic path's read grows with the active prefix."""
    params = OVQParams(num_slots=12, chunk_size=4)
    seen = {"static": [], "dynamic": []}
    real_read, real_merge = primitives.chunk_read, primitives.sparse_kmeans_merge

    def spy(kind):
        def read(q, k, v, dict_keys, *rest, **kw):
            seen[kind].append(("read", tuple(q.shape), tuple(dict_keys.shape)))
            return real_read(q, k, v, dict_keys, *rest, **kw)

        def merge(keys, values, counts, slot, *rest):
            seen[kind].append(("merge", tuple(keys.shape), tuple(slot.shape)))
            return real_merge(keys, values, counts, slot, *rest)
        return primitives.OVQPrimitives("spy", read, primitives.max_similarity, merge)

    q, k, v, beta = inputs(T=40, grad=False)
    for kind, static in (("static", True), ("dynamic", False)):
        chunk_module.ovq_chunk_loop(q, k, v, beta, params, prims=spy(kind), static=static)
    assert len(set(seen["static"])) == 2                     # one read shape, one merge shape: 10 chunks alike
    assert len({s for s in seen["dynamic"] if s[0] == "read"}) > 1


def test_static_refuses_the_oracles_in_one_line():
    q, k, v, beta = inputs(T=8, grad=False)
    for backend in ("naive", "recurrent"):
        with pytest.raises(ValueError, match="static shapes are a form of the chunk loop"):
            ovq_attention(q, k, v, beta, PARAMS["plateau-spread"], backend=backend, static=True)


def test_exact_ties_follow_the_dynamic_rule():
    """Every key the same unit vector (exact similarities of 1): ties between an old slot and a new one
    go to the old slot, between slots to the first, as in the dynamic path and the oracle."""
    params = OVQParams(num_slots=12, chunk_size=4)
    q, k, v, beta = inputs(T=20, grad=False)
    k = torch.zeros_like(k)
    k[..., 0] = 1.0
    with torch.no_grad():
        o_s, s_s = ovq_attention(q, k, v, beta, params, backend="chunk", static=True)
        o_d, s_d = ovq_attention(q, k, v, beta, params, backend="chunk")
        o_n, s_n = ovq_attention(q, k, v, beta, params, backend="naive")
    assert rel_err(o_s, o_d) < 1e-12 and rel_err(o_s, o_n) < 1e-12
    assert_states_equal(s_s, s_d, tol=1e-12)
    assert_states_equal(s_s, s_n, tol=1e-12)
    assert float(s_s.counts[0, 0, 0]) > 1                 # the old slot 0 took the tied keys


# ------------------------------------------------------------------ blocks of chunks (CUDA graph path)

@pytest.mark.parametrize("S", [1, 3, 4])
@pytest.mark.parametrize("name", ["plateau-spread", "linear-fills-mid-sequence", "one-slot"])
def test_blocks_of_chunks_equal_the_dynamic_loop(name, S):
    """The graphed blocks' code run eagerly (capture off: what a CPU can check): the plan, the static
    buffers carried from block to block, the chunks a block cannot take (pending start, partial end,
    the remainder of fewer than S) all give the dynamic loop's outputs and state."""
    params = PARAMS[name]
    q, k, v, beta = inputs(T=61, grad=False)
    with torch.no_grad():
        ref, s_ref = None, None
        for static, blocks in ((False, 0), (True, S)):
            outs, state = [], None
            for a, b in ((0, 7), (7, 61)):                   # the second call starts with 7 pending tokens
                o, state = ovq_attention(q[:, a:b], k[:, a:b], v[:, a:b], beta, params, initial_state=state,
                                         backend="chunk", static=static, block_chunks=blocks, capture=False)
                outs.append(o)
            if ref is None:
                ref, s_ref = torch.cat(outs, 1), state
    assert rel_err(torch.cat(outs, 1), ref) < 1e-12
    assert_states_equal(state, s_ref, tol=1e-12)


def test_blocks_are_used_and_reused(monkeypatch):
    from ovq_cl.ops.ovq import graphs

    calls = []
    real = graphs.ChunkBlock.replay
    monkeypatch.setattr(graphs.ChunkBlock, "replay", lambda self, *a: calls.append(id(self)) or real(self, *a))
    params = PARAMS["plateau-spread"]
    q, k, v, beta = inputs(T=50, grad=False)                  # 10 chunks of 5: 3 blocks of 3, one left over
    with torch.no_grad():
        for _ in range(2):
            ovq_attention(q, k, v, beta, params, backend="chunk", static=True, block_chunks=3, capture=False)
    assert len(calls) == 6 and len(set(calls)) == 1           # one cached block for both calls


def test_a_cached_block_serves_calls_in_inference_mode_and_under_no_grad():
    """The block's buffers are plain tensors whichever mode created them (an inference tensor could
    not be written by a later call under no_grad)."""
    params = PARAMS["plateau-spread"]
    q, k, v, beta = inputs(T=40, grad=False)
    with torch.inference_mode():
        o1, _ = ovq_attention(q, k, v, beta, params, static=True, block_chunks=2, capture=False)
    with torch.no_grad():
        o2, _ = ovq_attention(q, k, v, beta, params, static=True, block_chunks=2, capture=False)
    assert torch.equal(o1, o2)


def test_blocks_fall_back_where_they_cannot_run():
    """Autograd, a plasticity rule or the random init: the blocks are skipped, the result is unchanged."""
    for params in (PARAMS["random-init"], OVQParams(num_slots=6, chunk_size=4, count_cap=2.0)):
        q, k, v, beta = inputs(T=30, grad=False)
        with torch.no_grad():
            o_b, s_b = ovq_attention(q, k, v, beta, params, static=True, block_chunks=2, capture=False)
            o_d, s_d = ovq_attention(q, k, v, beta, params)
        assert rel_err(o_b, o_d) < 1e-12
        assert_states_equal(s_b, s_d, tol=1e-12)
    q, k, v, beta = inputs(T=30)
    o_b, _ = ovq_attention(q, k, v, beta, PARAMS["plateau-spread"], static=True, block_chunks=2, capture=False)
    o_d, _ = ovq_attention(q, k, v, beta, PARAMS["plateau-spread"])
    g_b, g_d = (torch.autograd.grad(o.square().sum(), (q, k, v, beta)) for o in (o_b, o_d))
    assert rel_err(o_b, o_d) < 1e-12 and all(rel_err(a, b) < 1e-11 for a, b in zip(g_b, g_d))


def test_block_options_are_checked_in_one_line():
    q, k, v, beta = inputs(T=20, grad=False)
    with pytest.raises(ValueError, match="block_chunks .* needs static=True"):
        ovq_attention(q, k, v, beta, PARAMS["plateau-spread"], block_chunks=2)
    if not torch.cuda.is_available():
        with torch.no_grad(), pytest.raises(ValueError, match="CUDA graph capture needs a CUDA device"):
            ovq_attention(q, k, v, beta, PARAMS["plateau-spread"], static=True, block_chunks=2, capture=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU (benchmarks/gpu_check.sh runs this)")
@pytest.mark.parametrize("backend", ["chunk", "triton"])
def test_captured_blocks_equal_the_dynamic_loop_on_the_gpu(backend):
    params = OVQParams(num_slots=40, chunk_size=16)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 700, 4, 32, generator=g).cuda() for _ in range(3))
    beta = torch.tensor([3.0, 5.0, 7.0, 9.0], device="cuda")
    with torch.no_grad():
        o_d, s_d = ovq_attention(q, k, v, beta, params, backend=backend)
        for _ in range(2):                                             # captured, then replayed from the cache
            o_g, s_g = ovq_attention(q, k, v, beta, params, backend=backend, static=True, block_chunks=8, capture=True)
    assert rel_err(o_g, o_d) < 1e-4
    assert s_g.n_active == s_d.n_active and rel_err(s_g.keys, s_d.keys) < 1e-4 and rel_err(s_g.counts, s_d.counts) < 1e-6
