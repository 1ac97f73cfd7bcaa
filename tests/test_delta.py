"""Gated DeltaNet (and DeltaNet, its g = 0 case): our chunked form against our recurrence and against
flash-linear-attention's naive references (an independent implementation), outputs, final state and
every gradient."""
import pytest
import torch

from ovq_cl.ops.delta import gated_delta_rule, gated_delta_rule_chunked, gated_delta_rule_recurrent

from conftest import rel_err



def fla(module: str):
    """An fla module for the tests that compare against fla's naive references (skipped without fla;
    the other tests of this file need no fla)."""
    return pytest.importorskip(module)


def inputs(B, T, H, D, Dv=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    Dv = D if Dv is None else Dv
    q = torch.randn(B, T, H, D, generator=g, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, T, H, Dv, generator=g, dtype=dtype)
    decay = -0.5 * torch.rand(B, T, H, generator=g, dtype=dtype)
    beta = torch.rand(B, T, H, generator=g, dtype=dtype)
    s0 = 0.1 * torch.randn(B, H, D, Dv, generator=g, dtype=dtype)
    return q, k, v, decay, beta, s0


@pytest.mark.parametrize("T,D,chunk", [(63, 60, 16), (500, 60, 64), (17, 8, 1)])
def test_matches_fla_naive_reference(T, D, chunk):
    q, k, v, decay, beta, s0 = inputs(2, T, 3, D)
    o, S = gated_delta_rule_chunked(q, k, v, decay, beta, initial_state=s0, chunk_size=chunk)
    fla_naive = fla("fla.ops.gated_delta_rule.naive")
    o_ref, S_ref = fla_naive.naive_recurrent_gated_delta_rule(q, k, v, beta, decay, initial_state=s0, output_final_state=True)
    assert rel_err(o, o_ref) < 1e-4 and rel_err(S, S_ref) < 1e-4
    o_rec, S_rec = gated_delta_rule_recurrent(q, k, v, decay, beta, initial_state=s0)
    assert rel_err(o_rec, o_ref) < 1e-4 and rel_err(S_rec, S_ref) < 1e-4


@pytest.mark.parametrize("T,D,chunk", [(63, 16, 16), (40, 8, 64), (9, 4, 1)])
def test_ungated_rule_matches_fla_delta_rule(T, D, chunk):
    """DeltaNet's op (our gated rule with g = 0) against fla's delta_rule_recurrence, an independent
    un-gated reference: layout [B, H, T, D], beta [B, H, T], q scaled by Dk^-1/2 inside (our default),
    initial_state added to its own zeros. Outputs and final state, float32."""
    delta_rule_recurrence = fla("fla.ops.delta_rule.naive").delta_rule_recurrence

    q, k, v, _, beta, s0 = inputs(2, T, 3, D, Dv=D + 2)
    zeros = torch.zeros_like(beta)
    qh, kh, vh, bh = (x.transpose(1, 2).contiguous() for x in (q, k, v, beta))
    o_ref, S_ref = delta_rule_recurrence(qh, kh, vh, bh, initial_state=s0.clone(), output_final_state=True)
    o_ref = o_ref.transpose(1, 2)
    for fn in (gated_delta_rule_chunked, gated_delta_rule_recurrent):
        o, S = fn(q, k, v, zeros, beta, initial_state=s0, chunk_size=chunk)
        assert rel_err(o, o_ref) < 1e-4 and rel_err(S, S_ref) < 1e-4


def test_gradients_of_chunked_and_recurrent_agree():
    tensors = [t.double().requires_grad_(True) for t in inputs(2, 63, 2, 12, Dv=10)]
    out = {}
    for name, fn in (("chunk", gated_delta_rule_chunked), ("rec", gated_delta_rule_recurrent)):
        o, S = fn(*tensors[:5], initial_state=tensors[5], chunk_size=16)
        loss = (o * torch.linspace(-1, 1, o.shape[-1], dtype=o.dtype)).sum() + S.square().sum()
        out[name] = torch.autograd.grad(loss, tensors)
    for g_chunk, g_rec in zip(out["chunk"], out["rec"]):
        assert rel_err(g_chunk, g_rec) < 1e-10


def test_split_calls_carry_the_state():
    q, k, v, decay, beta, _ = inputs(1, 50, 2, 16)
    o, S = gated_delta_rule(q, k, v, decay, beta, chunk_size=16)
    o1, S1 = gated_delta_rule(q[:, :21], k[:, :21], v[:, :21], decay[:, :21], beta[:, :21], chunk_size=16)
    o2, S2 = gated_delta_rule(q[:, 21:], k[:, 21:], v[:, 21:], decay[:, 21:], beta[:, 21:], initial_state=S1, chunk_size=16)
    assert rel_err(torch.cat([o1, o2], 1), o) < 1e-5 and rel_err(S2, S) < 1e-5


def test_delta_rule_overwrites_a_key_with_beta_one():
    """With no decay and beta = 1, writing (k, v2) after (k, v1) replaces v1: S^T k = v2 exactly."""
    D = 4
    k = torch.nn.functional.normalize(torch.randn(1, 1, 1, D), dim=-1).repeat(1, 2, 1, 1)
    v = torch.randn(1, 2, 1, D)
    zeros, ones = torch.zeros(1, 2, 1), torch.ones(1, 2, 1)
    _, S = gated_delta_rule(k, k, v, zeros, ones)
    assert rel_err(torch.einsum("kv,k->v", S[0, 0], k[0, 0, 0]), v[0, 1, 0]) < 1e-5


def test_bad_shapes():
    q, k, v, decay, beta, s0 = inputs(1, 8, 2, 4)
    with pytest.raises(ValueError, match="beta must be"):
        gated_delta_rule(q, k, v, decay, beta[..., :1])
    with pytest.raises(ValueError, match="initial_state"):
        gated_delta_rule(q, k, v, decay, beta, initial_state=s0[:, :1])
    with pytest.raises(ValueError, match="backend"):
        gated_delta_rule(q, k, v, decay, beta, backend="cuda")
    with pytest.raises(ValueError, match="CUDA"):
        gated_delta_rule(q, k, v, decay, beta, backend="fla")


def test_chunked_gradients_match_finite_differences():
    tensors = [t.double()[:, :7, :1, :3].contiguous().requires_grad_(True) for t in inputs(1, 7, 1, 3)[:3]]
    decay = (-0.3 * torch.rand(1, 7, 1, dtype=torch.float64)).requires_grad_(True)
    beta = torch.rand(1, 7, 1, dtype=torch.float64).requires_grad_(True)
    fn = lambda q, k, v, g, b: gated_delta_rule_chunked(q, k, v, g, b, chunk_size=3)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (*tensors, decay, beta), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("capability, triton_version, nvidia, sound", [
    ((9, 0), "3.6.0", True, False),       # the H200 of the GPU check: fla raises in backward
    ((9, 0), "3.4", True, False),
    ((9, 0), "3.4.0rc1", True, True),     # a pre-release of 3.4.0 is below 3.4.0
    ((9, 0), "3.7.1.dev20250101", True, False),
    ((9, 0), "3.7.1", True, True),
    ((9, 0), "3.3.1", True, True),
    ((9, 0), "3.6.0+git1234", True, False),
    ((9, 4), "3.6.0", False, True),       # AMD MI300 reports (9, 4): not Hopper
    ((8, 0), "3.6.0", True, True),
    ((10, 0), "3.5.0", True, True),
])
def test_fla_backward_guard_matches_fla_refusal(capability, triton_version, nvidia, sound):
    from ovq_cl.ops.delta import fla_backward_is_sound

    assert fla_backward_is_sound(capability, triton_version, nvidia) is sound


@pytest.mark.parametrize("T,L", [(37, 8), (64, 64), (5, 16)])
def test_ssm_op_matches_fla_naive_simple_gla(T, L):
    """The SSM baseline's op (simple GLA) against flash-linear-attention's naive references, and its
    chunked form against its recurrence in float64 (outputs, every gradient, the final state)."""
    simple_gla = fla("fla.ops.simple_gla.naive")
    naive_chunk_simple_gla, naive_recurrent_simple_gla = simple_gla.naive_chunk_simple_gla, simple_gla.naive_recurrent_simple_gla

    from ovq_cl.ops.ssm import simple_gla_chunked, simple_gla_recurrent

    torch.manual_seed(0)
    q, k = torch.randn(2, T, 3, 5), torch.randn(2, T, 3, 5)
    v, g = torch.randn(2, T, 3, 7), -torch.rand(2, T, 3)
    o, s = simple_gla_chunked(q, k, v, g, chunk_size=L)
    o_fla, s_fla = naive_recurrent_simple_gla(q, k, v, g, output_final_state=True)
    o_fla_chunk, _ = naive_chunk_simple_gla(q, k, v, g, output_final_state=True, chunk_size=L)
    assert rel_err(o, o_fla) < 1e-5 and rel_err(o, o_fla_chunk) < 1e-5 and rel_err(s.S, s_fla) < 1e-5
    q64, k64, v64, g64 = (t.double().requires_grad_() for t in (q, k, v, g))
    s0 = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    from ovq_cl.ops.ssm import SSMState

    outs = []
    for fn in (lambda: simple_gla_chunked(q64, k64, v64, g64, initial_state=SSMState(s0), chunk_size=L),
               lambda: simple_gla_recurrent(q64, k64, v64, g64, initial_state=SSMState(s0))):
        o_, s_ = fn()
        loss = (o_ * torch.cos(torch.arange(o_.numel(), dtype=torch.float64)).view(o_.shape)).sum() + s_.S.sum()
        outs.append((o_, s_.S, torch.autograd.grad(loss, [q64, k64, v64, g64])))
    (oa, sa, ga), (ob, sb, gb) = outs
    assert rel_err(oa, ob) < 1e-10 and rel_err(sa, sb) < 1e-10
    assert all(rel_err(a, b) < 1e-10 for a, b in zip(ga, gb))
