"""OVQ Triton kernels against the PyTorch reference: outputs, every gradient, the final state.

On a machine without a GPU the kernels run under the Triton interpreter, switched on here before
triton is first imported by our kernels (the interpreter is slow: small, deliberately awkward shapes:
T not a multiple of L, head dims that are not powers of two, N not a power of two, n_active < N).
On a CUDA machine the same tests run the compiled kernels on the GPU.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    # must precede the first import of our kernels (triton.jit picks the interpreter at decoration)
    os.environ["TRITON_INTERPRET"] = "1"

import torch.nn.functional as F

from ovq_cl.ops.dictionary import dictionary_chunk_read
from ovq_cl.ops.ovq import OVQParams, ovq_attention
from ovq_cl.ops.ovq.primitives import chunk_read, first_argmax, max_similarity, sparse_kmeans_merge
from ovq_cl.ops.ovq.naive import assign_to_slots, kmeans_merge

from conftest import rel_err

try:
    import triton  # noqa: F401
except ImportError:            # the only reason to skip: triton is not installed (e.g. not Linux)
    ovq_triton, SKIP = None, "triton is not installed"
else:                          # anything else failing here is a bug in our kernels: let it fail
    from ovq_cl.ops.ovq import triton as ovq_triton

    SKIP = None

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
TOL = {torch.float32: 1e-4, torch.float64: 1e-10}
READ_ARGS = ("q", "k", "v", "dict_keys", "dict_values", "log_counts", "beta")


def read_inputs(B, H, Lq, Lc, n, D, Dv, dtype, empty_slots=0):
    g = torch.Generator().manual_seed(Lq * 1000 + n)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    counts = torch.randint(1, 9, (B, H, n), generator=g).to(dtype)
    counts[..., :empty_slots] = 0                                       # log count -inf: no weight
    inputs = dict(
        q=F.normalize(rnd(B, H, Lq, D), dim=-1), k=F.normalize(rnd(B, H, Lc, D), dim=-1), v=rnd(B, H, Lc, Dv),
        dict_keys=F.normalize(rnd(B, H, n, D), dim=-1), dict_values=rnd(B, H, n, Dv), log_counts=counts.log(),
        beta=torch.linspace(2.0, 12.0, H, dtype=dtype),
    )
    return {name: t.to(DEVICE).requires_grad_(name != "log_counts" or empty_slots == 0) for name, t in inputs.items()}


def read_and_grads(fn, inputs, q_offset):
    o = fn(*(inputs[a] for a in READ_ARGS), q_offset=q_offset)
    weights = torch.randn(o.shape, generator=torch.Generator().manual_seed(7), dtype=o.dtype).to(o.device)
    wanted = [inputs[a] for a in READ_ARGS if inputs[a].requires_grad]
    return o, torch.autograd.grad((o * weights).sum(), wanted, allow_unused=True, materialize_grads=True)


# Lq, Lc, q_offset, n, D, Dv, empty slots
READ_CASES = [
    (16, 16, 0, 37, 60, 24, 0),        # a whole chunk, n and D not powers of two
    (5, 16, 11, 100, 32, 48, 7),       # the tail of a chunk (q_offset > 0, Lq < Lc), two dictionary tiles, empty slots
    (20, 20, 0, 0, 17, 9, 0),          # empty dictionary: plain causal softmax attention over the chunk
    (70, 70, 0, 130, 16, 16, 3),       # more than one block of queries and of local keys
]


def test_fast_torch_read_matches_shared_read():
    """The reference's own read (fewer passes over the scores) against the read VQ shares."""
    for case in READ_CASES:
        Lq, Lc, off, n, D, Dv, empty = case
        inputs = read_inputs(2, 3, Lq, Lc, n, D, Dv, torch.float64, empty)
        o, grads = read_and_grads(chunk_read, inputs, off)
        o_ref, grads_ref = read_and_grads(dictionary_chunk_read, inputs, off)
        assert rel_err(o, o_ref) < 1e-12, case
        for g, g_ref in zip(grads, grads_ref):
            assert g_ref.numel() == 0 or rel_err(g, g_ref) < 1e-12, case


def test_first_argmax_matches_torch_max():
    """The reference's blocked argmax (first index on ties), odd widths, ties across blocks."""
    for n in (1, 63, 64, 65, 200, 1000):
        s = torch.randn(3, 5, n, dtype=torch.float64).round(decimals=1)    # many exact ties
        best, arg = first_argmax(s)
        ref_best, ref_arg = s.max(dim=-1)
        assert torch.equal(best, ref_best) and torch.equal(arg, ref_arg), n


def test_sparse_merge_in_place_equals_functional_and_a_loop():
    """The k-means step, in place and functional, against a plain loop over slots (duplicates, skips)."""
    g = torch.Generator().manual_seed(0)
    B, H, N, L, D, Dv = 2, 3, 10, 16, 6, 5
    keys = F.normalize(torch.randn(B, H, N, D, generator=g, dtype=torch.float64), dim=-1)
    values = torch.randn(B, H, N, Dv, generator=g, dtype=torch.float64)
    counts = torch.randint(1, 6, (B, H, N), generator=g).to(torch.float64)
    counts[..., 8:] = 0
    slot = torch.randint(0, 8, (B, H, L), generator=g)
    slot[..., ::5] = N                                                  # skipped keys (new centroids)
    k = F.normalize(torch.randn(B, H, L, D, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, H, L, Dv, generator=g, dtype=torch.float64)
    ek, ev, ec = keys.clone(), values.clone(), counts.clone()
    for b in range(B):
        for h in range(H):
            for n in range(N):
                hit = slot[b, h] == n
                if hit.any():
                    c, m = counts[b, h, n], hit.sum()
                    ek[b, h, n] = F.normalize(c * keys[b, h, n] + k[b, h][hit].sum(0), dim=0)
                    ev[b, h, n] = (c * values[b, h, n] + v[b, h][hit].sum(0)) / (c + m)
                    ec[b, h, n] = c + m
    functional = kmeans_merge(keys, values, counts, slot, k, v)
    state = (keys.clone(), values.clone(), counts.clone())
    in_place = sparse_kmeans_merge(*state, slot, k, v, inplace=True)
    assert in_place[0] is state[0]
    strided = [t.transpose(0, 1).contiguous().transpose(0, 1) for t in (keys, values, counts)]   # not contiguous
    via_scatter = sparse_kmeans_merge(*strided, slot, k, v, inplace=True)
    for got in (functional, in_place, via_scatter):
        for a, b in zip(got, (ek, ev, ec)):
            assert rel_err(a, b) < 1e-12
        untouched = ~torch.isin(torch.arange(N), slot)
        assert torch.equal(got[0][..., untouched, :], keys[..., untouched, :])


@needs_triton
@pytest.mark.parametrize(
    "case,dtype",
    [(c, torch.float32) for c in READ_CASES] + [(c, torch.float64) for c in READ_CASES[:2]],   # (interpreter time)
    ids=lambda x: "Lq{}-Lc{}-off{}-n{}-D{}-Dv{}-empty{}".format(*x) if isinstance(x, tuple) else str(x)[6:],
)
def test_read_kernel_matches_reference(case, dtype):
    Lq, Lc, off, n, D, Dv, empty = case
    inputs = read_inputs(2, 3, Lq, Lc, n, D, Dv, dtype, empty)
    o, grads = read_and_grads(ovq_triton.triton_chunk_read, inputs, off)
    o_ref, grads_ref = read_and_grads(dictionary_chunk_read, inputs, off)
    assert rel_err(o, o_ref) < TOL[dtype]
    names = [a for a in READ_ARGS if inputs[a].requires_grad]
    for name, g, g_ref in zip(names, grads, grads_ref):
        if g_ref.numel():
            assert rel_err(g, g_ref) < TOL[dtype], name


@needs_triton
def test_read_kernel_log_count_gradient_and_no_grad_inputs():
    """d log c (when asked for), and inputs that need no gradient."""
    inputs = read_inputs(1, 2, 16, 16, 40, 24, 24, torch.float64)
    for name in ("q", "dict_values", "beta"):
        inputs[name].requires_grad_(False)
    o, grads = read_and_grads(ovq_triton.triton_chunk_read, inputs, 0)
    o_ref, grads_ref = read_and_grads(dictionary_chunk_read, inputs, 0)
    assert rel_err(o, o_ref) < 1e-10
    assert len(grads) == 4
    for g, g_ref in zip(grads, grads_ref):
        assert rel_err(g, g_ref) < 1e-10


@needs_triton
@pytest.mark.parametrize("n", [1, 45, 150])
def test_max_similarity_kernel_matches_assignment(n):
    """Random unit keys: the kernel's slot is a maximiser and its value the max (float32). Two rows whose
    float64 similarities are within rounding of each other may be ordered either way by two summation
    orders (a blocked GEMM does not promise bitwise-equal dots for equal rows at different positions),
    so the indices must agree only where the top two are clearly apart; exact ties are the next test."""
    g = torch.Generator().manual_seed(n)
    k = F.normalize(torch.randn(2, 3, 33, 60, generator=g), dim=-1).to(DEVICE)
    dict_keys = F.normalize(torch.randn(2, 3, n, 60, generator=g), dim=-1).to(DEVICE)
    best, arg = ovq_triton.triton_max_similarity(k, dict_keys)
    s64 = k.double() @ dict_keys.double().transpose(-1, -2)
    top = s64.topk(min(2, n), dim=-1).values
    assert (s64.gather(-1, arg.unsqueeze(-1)).squeeze(-1) >= top[..., 0] - 1e-6).all()
    assert rel_err(best.double(), top[..., 0]) < 1e-6
    clear = (top[..., 0] - top[..., -1] > 1e-5) if n > 1 else torch.ones_like(arg, dtype=torch.bool)
    assert clear.float().mean() > 0.9                                  # the check below is not vacuous
    assert torch.equal(arg[clear], assign_to_slots(k, dict_keys)[clear])
    assert torch.equal(arg[clear], max_similarity(k, dict_keys)[1][clear])


@needs_triton
@pytest.mark.parametrize("n", [1, 45, 150])
def test_max_similarity_kernel_breaks_exact_ties_by_first_index(n):
    """Keys on a dyadic grid (entries in {-1, -1/2, 0, 1/2, 1}): every dot product and partial sum is
    exact in float32 whatever the summation order, so ties are real ties, and many of them. The first
    index must win, inside a 64-row tile and across tiles (row 140 a copy of row 5)."""
    g = torch.Generator().manual_seed(n)
    k = torch.randint(-2, 3, (2, 3, 33, 60), generator=g).float() / 2
    dict_keys = torch.randint(-2, 3, (2, 3, n, 60), generator=g).float() / 2
    dict_keys[:, :, n // 2] = dict_keys[:, :, 0]                        # a tie inside the first tile
    if n > 140:
        dict_keys[:, :, 140] = dict_keys[:, :, 5]                       # a tie across tiles
        k[:, :, 3] = dict_keys[:, :, 5]
    k, dict_keys = k.to(DEVICE), dict_keys.to(DEVICE)
    best, arg = ovq_triton.triton_max_similarity(k, dict_keys)
    s = k @ dict_keys.transpose(-1, -2)
    assert torch.equal(best, s.amax(-1))                                # exact values
    assert torch.equal(arg, assign_to_slots(k, dict_keys))              # torch's argmax: first index on ties
    assert torch.equal(arg, max_similarity(k, dict_keys)[1])
    if n > 1:
        assert ((s == best.unsqueeze(-1)).sum(-1) > 1).any()            # the grid does produce ties
    if n > 140:
        assert (arg[:, :, 3] == 5).all()


OP_CASES = [
    # T, L, D, Dv, params
    (63, 16, 60, 24, OVQParams(num_slots=37, chunk_size=16, growth_alpha=20.0)),                  # n_active < N
    (45, 8, 20, 20, OVQParams(num_slots=12, chunk_size=8, growth="linear", growth_rate=0.5, init="random")),
    (40, 7, 16, 12, OVQParams(num_slots=9, chunk_size=7, state_grad="detach")),                    # saturates
    (45, 8, 20, 20, OVQParams(num_slots=12, chunk_size=8, recompute_chunks=2)),                    # recomputed
    # the plasticity rules: lanes with different used prefixes (count-0 slots inside n_active), maintenance
    (45, 8, 12, 12, OVQParams(num_slots=10, chunk_size=8, growth="novelty", novelty_threshold=0.3,
                              when_full="merge", count_decay=0.9)),
    (45, 8, 12, 12, OVQParams(num_slots=10, chunk_size=8, novelty_threshold=0.3, when_full="evict", count_cap=5.0)),
]


def run_op(backend, q, k, v, beta, params, initial_state=None, static=False):
    o, state = ovq_attention(q, k, v, beta, params, initial_state=initial_state, backend=backend, static=static)
    weights = torch.randn(o.shape, generator=torch.Generator().manual_seed(3), dtype=o.dtype).to(o.device)
    loss = (o * weights).sum()
    if params.state_grad == "full":                                    # gradients through the final state too
        loss = loss + 0.3 * state.keys.sum() + 0.7 * state.values.square().sum()
    grads = torch.autograd.grad(loss, (q, k, v, beta))
    return o, state, grads


@needs_triton
@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: f"T{c[0]}-L{c[1]}-D{c[2]}-N{c[4].num_slots}-{c[4].init}-{c[4].state_grad}-r{c[4].recompute_chunks}-{c[4].growth}-{c[4].when_full}")
def test_op_triton_matches_reference(case):
    T, L, D, Dv, params = case
    dtype = torch.float32
    g = torch.Generator().manual_seed(T)
    q, k = (torch.randn(2, T, 3, D, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(2, T, 3, Dv, generator=g, dtype=dtype)
    q, k, v = (t.to(DEVICE).requires_grad_() for t in (q, k, v))
    beta = torch.tensor([3.0, 6.0, 9.0], dtype=dtype, device=DEVICE, requires_grad=True)
    o_ref, s_ref, g_ref = run_op("naive", q, k, v, beta, params)
    o, s, grads = run_op("triton", q, k, v, beta, params)
    assert (s.n_active, s.seen, s.merges, s.evictions) == (s_ref.n_active, s_ref.seen, s_ref.merges, s_ref.evictions)
    if params.plastic and params.when_full != "none":
        assert s.merges + s.evictions > 0                              # the maintenance rule acted
    if params.num_slots == 37:
        assert 0 < s.n_active < params.num_slots
    assert rel_err(o, o_ref) < 1e-4
    for name, a, b in zip("q k v beta".split(), grads, g_ref):
        assert rel_err(a, b) < 1e-4, name
    for name in ("keys", "values", "counts", "pending_keys", "pending_values"):
        a, b = getattr(s, name), getattr(s_ref, name)
        assert a.shape == b.shape, name
        if b.numel():
            assert rel_err(a, b) < 1e-4, name


@needs_triton
@pytest.mark.parametrize("case", [OP_CASES[0], OP_CASES[1], OP_CASES[4]], ids=["plateau", "linear-random", "novelty-merge"])
def test_op_triton_static_shapes_match_the_oracle(case):
    """The static chunk loop on the kernels: the read over all N slots (empty ones at log count -inf),
    the masked similarity in PyTorch, the kernels' k-means step."""
    T, L, D, Dv, params = case
    g = torch.Generator().manual_seed(T + 1)
    q, k = (torch.randn(2, T, 3, D, generator=g, dtype=torch.float32) for _ in range(2))
    v = torch.randn(2, T, 3, Dv, generator=g, dtype=torch.float32)
    q, k, v = (t.to(DEVICE).requires_grad_() for t in (q, k, v))
    beta = torch.tensor([3.0, 6.0, 9.0], dtype=torch.float32, device=DEVICE, requires_grad=True)
    o_ref, s_ref, g_ref = run_op("naive", q, k, v, beta, params)
    o, s, grads = run_op("triton", q, k, v, beta, params, static=True)
    assert (s.n_active, s.seen, s.merges, s.evictions) == (s_ref.n_active, s_ref.seen, s_ref.merges, s_ref.evictions)
    assert rel_err(o, o_ref) < 1e-4
    for name, a, b in zip("q k v beta".split(), grads, g_ref):
        assert rel_err(a, b) < 1e-4, name
    for name in ("keys", "values", "counts"):
        assert rel_err(getattr(s, name), getattr(s_ref, name)) < 1e-4, name


@needs_triton
def test_op_triton_continues_a_state_with_pending_tokens():
    """A second call that starts from a state with a pending half-chunk (q_offset > 0 in the read)."""
    params = OVQParams(num_slots=20, chunk_size=16)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 40, 2, 24, generator=g, dtype=torch.float64).to(DEVICE) for _ in range(3))
    beta = torch.tensor([4.0, 7.0], dtype=torch.float64, device=DEVICE)
    with torch.no_grad():
        outs = {}
        for backend in ("naive", "triton"):
            o1, s1 = ovq_attention(q[:, :21], k[:, :21], v[:, :21], beta, params, backend=backend)
            o2, s2 = ovq_attention(q[:, 21:], k[:, 21:], v[:, 21:], beta, params, initial_state=s1, backend=backend)
            outs[backend] = (torch.cat([o1, o2], 1), s2)
    assert rel_err(outs["triton"][0], outs["naive"][0]) < 1e-10
    for name in ("keys", "values", "counts", "pending_keys"):
        assert rel_err(getattr(outs["triton"][1], name), getattr(outs["naive"][1], name)) < 1e-10


@needs_triton
def test_dispatch():
    q = k = v = torch.randn(1, 8, 2, 4, dtype=torch.float64)
    beta = torch.ones(2, dtype=torch.float64)
    p = OVQParams(num_slots=4, chunk_size=4)
    o_auto, _ = ovq_attention(q, k, v, beta, p)                         # CPU tensors: auto = the chunked form
    o_chunk, _ = ovq_attention(q, k, v, beta, p, backend="chunk")
    assert torch.equal(o_auto, o_chunk)
    with pytest.raises(ValueError, match="backend must be one of"):
        ovq_attention(q, k, v, beta, p, backend="fast")
    if DEVICE == "cpu":
        ovq_triton.INTERPRET = False                                    # as if the interpreter were off
        try:
            with pytest.raises(ValueError, match="TRITON_INTERPRET"):
                ovq_attention(q, k, v, beta, p, backend="triton")
        finally:
            ovq_triton.INTERPRET = True


# ------------------------------------------------- the dictionary split across programs (flash-decoding)

SPLIT_CASES = [
    # Lq, Lc, q_offset, n, D, Dv, empty slots, splits
    (16, 16, 0, 150, 24, 20, 0, 3),      # three splits of 64 rows, the last partial
    (5, 16, 11, 200, 32, 48, 70, 4),     # q_offset > 0; the first split holds only empty slots (weight 0)
    (70, 70, 0, 130, 16, 16, 3, 2),      # two query blocks and two local key tiles
    (16, 16, 0, 40, 24, 24, 0, 5),       # fewer rows than one split: one dictionary split and the local one
]


@needs_triton
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: "Lq{}-Lc{}-off{}-n{}-D{}-Dv{}-empty{}-splits{}".format(*c))
def test_split_read_matches_reference_outputs_and_every_gradient(case):
    """Partial softmaxes over slices of the dictionary, combined: the same read and gradients (the dQ
    kernel is split the same way) as the reference, in float64."""
    Lq, Lc, off, n, D, Dv, empty, splits = case
    inputs = read_inputs(2, 3, Lq, Lc, n, D, Dv, torch.float64, empty)
    read = lambda *a, q_offset: ovq_triton.triton_chunk_read(*a, q_offset=q_offset, splits=splits)  # noqa: E731
    o, grads = read_and_grads(read, inputs, off)
    o_ref, grads_ref = read_and_grads(dictionary_chunk_read, inputs, off)
    assert ovq_triton._split_rows(n, 1, torch.device("cpu"), splits)[0]     # the split path ran
    assert rel_err(o, o_ref) < 1e-10
    names = [a for a in READ_ARGS if inputs[a].requires_grad]
    for name, g, g_ref in zip(names, grads, grads_ref):
        assert rel_err(g, g_ref) < 1e-10, name


@needs_triton
@pytest.mark.parametrize("splits", [2, 3])
def test_split_max_similarity_keeps_the_first_index_across_splits(splits):
    """Dyadic keys (exact dots): exact max, and the first index on ties inside and across splits."""
    g = torch.Generator().manual_seed(splits)
    k = torch.randint(-2, 3, (2, 3, 33, 60), generator=g).float() / 2
    dict_keys = torch.randint(-2, 3, (2, 3, 150, 60), generator=g).float() / 2
    dict_keys[:, :, 140] = dict_keys[:, :, 5]                       # rows 5 and 140 in different splits
    k[:, :, 3] = dict_keys[:, :, 5]
    k, dict_keys = k.to(DEVICE), dict_keys.to(DEVICE)
    best, arg = ovq_triton.triton_max_similarity(k, dict_keys, splits=splits)
    s = k @ dict_keys.transpose(-1, -2)
    assert torch.equal(best, s.amax(-1)) and torch.equal(arg, assign_to_slots(k, dict_keys))
    assert (arg[:, :, 3] == 5).all()


@needs_triton
def test_op_on_split_kernels_matches_the_oracle():
    from ovq_cl.ops.ovq.chunk import ovq_chunk_loop

    T, L, D, Dv, params = 120, 16, 16, 12, OVQParams(num_slots=150, chunk_size=16, growth="linear", growth_rate=1.0)
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, T, 3, d, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_() for d in (D, D, Dv))
    beta = torch.tensor([3.0, 6.0, 9.0], dtype=torch.float64, device=DEVICE, requires_grad=True)
    prims = ovq_triton.make_triton_primitives(splits=2)
    o, s = ovq_chunk_loop(q, k, v, beta, params, prims=prims)
    o_ref, s_ref = ovq_attention(q, k, v, beta, params, backend="naive")
    assert s.n_active == s_ref.n_active > 64                           # the later reads span two splits
    assert rel_err(o, o_ref) < 1e-10 and rel_err(s.keys, s_ref.keys) < 1e-10
    g1 = torch.autograd.grad(o.square().sum(), (q, k, v, beta))
    g2 = torch.autograd.grad(o_ref.square().sum(), (q, k, v, beta))
    assert all(rel_err(a, b) < 1e-10 for a, b in zip(g1, g2))


@needs_triton
def test_tf32_precision_has_its_own_tolerance_and_bad_precisions_fail():
    """TF32 dots (float32 only; on the CPU interpreter they are exact): within 1e-2 of the reference
    read (TF32 keeps 10 mantissa bits: ~5e-4 per product); float64 inputs stay exact."""
    inputs = read_inputs(2, 3, 16, 16, 100, 32, 32, torch.float32)
    read = lambda *a, q_offset: ovq_triton.triton_chunk_read(*a, q_offset=q_offset, precision="tf32")  # noqa: E731
    o, grads = read_and_grads(read, inputs, 0)
    o_ref, grads_ref = read_and_grads(dictionary_chunk_read, inputs, 0)
    assert rel_err(o, o_ref) < 1e-2 and all(rel_err(a, b) < 1e-2 for a, b in zip(grads, grads_ref))
    assert ovq_triton._prec(torch.float64, "tf32") == "ieee"
    with pytest.raises(ValueError, match="precision must be one of"):
        ovq_triton.make_triton_primitives(precision="bf16x3")


@needs_triton
@pytest.mark.parametrize("n_active,splits", [(0, None), (1, None), (37, None), (100, 2), (150, 3)])
def test_masked_max_similarity_kernel_equals_the_reference(n_active, splits):
    """The static loop's argmax: only rows [0, n_active) count, read from a device scalar; dyadic keys
    (exact dots) so values and first-index ties must agree exactly with the PyTorch reference."""
    from ovq_cl.ops.ovq.primitives import masked_max_similarity

    g = torch.Generator().manual_seed(n_active)
    k = (torch.randint(-2, 3, (2, 3, 33, 24), generator=g).float() / 2).to(DEVICE)
    dict_keys = (torch.randint(-2, 3, (2, 3, 150, 24), generator=g).float() / 2).to(DEVICE)
    n = torch.tensor(n_active, device=DEVICE)
    best, arg = ovq_triton.triton_max_similarity(k, dict_keys, splits=splits, n_active=n)
    ref_best, ref_arg = masked_max_similarity(k, dict_keys, n)
    assert torch.equal(best, ref_best) and torch.equal(arg, ref_arg)
    if n_active:
        assert torch.equal(arg, ovq_triton.triton_max_similarity(k, dict_keys[:, :, :n_active])[1])
    else:
        assert torch.isinf(best).all() and (arg == 0).all()
