"""VQ attention: the compressive cache is exact softmax attention over quantised keys; the codebook
learns in training and stays fixed in eval."""
import pytest
import torch
import torch.nn.functional as F

from ovq_cl.layers import VQAttention
from ovq_cl.ops.vq import quantize, vq_attention

from conftest import rel_err


def exact_attention_over_quantised_keys(q, k_hat, v, beta):
    s = torch.einsum("bthd,bshd->bhts", q, k_hat) * beta.view(1, -1, 1, 1)
    T = q.shape[1]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhts,bshd->bthd", s.softmax(-1), v)


@pytest.mark.parametrize("T,D,L,S", [(63, 60, 8, 5), (500, 16, 64, 32)])
def test_compressive_cache_equals_softmax_over_quantised_keys(T, D, L, S):
    B, H = 2, 3
    codebook = F.normalize(torch.randn(H, S, D, dtype=torch.float64), dim=-1)
    q = F.normalize(torch.randn(B, T, H, D, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(B, T, H, D, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, 7, dtype=torch.float64)
    beta = torch.tensor([2.0, 6.0, 12.0], dtype=torch.float64)
    k_hat, codes = quantize(k, codebook)
    o, state = vq_attention(q, k_hat, v, codes, beta, codebook, chunk_size=L)
    assert rel_err(o, exact_attention_over_quantised_keys(q, k_hat, v, beta)) < 1e-10
    full_chunks = T // L
    assert torch.all(state.counts.sum(-1) == max(full_chunks - 1, 0) * L)   # cache holds all but the last full block
    assert state.prev_keys.shape[2] == (L if full_chunks else 0) and state.pending_keys.shape[2] == T % L


def test_codebook_fixed_in_eval_and_learns_in_training():
    torch.manual_seed(0)
    layer = VQAttention(d_model=16, n_heads=2, codebook_size=8, chunk_size=4)
    x = torch.randn(4, 32, 16)
    before = layer.codebook.clone()
    layer.eval()
    with torch.no_grad():
        layer(x)
    assert torch.equal(layer.codebook, before)
    layer.train()
    layer(x)
    assert not torch.equal(layer.codebook, before)
    assert torch.allclose(layer.codebook.norm(dim=-1), torch.ones(()), atol=1e-5)
    # EMA k-means pulls the codes towards the keys: quantisation error falls over repeated batches
    errors = []
    for _ in range(30):
        layer(x)
        errors.append(float(layer.aux_loss.detach()))
    assert errors[-1] < errors[0]


def test_training_backward_after_the_ema_update_at_benchmark_size():
    """The EMA update runs inside forward; the graph must not depend on the codebook it replaced."""
    torch.manual_seed(0)
    layer = VQAttention(d_model=64, n_heads=4, codebook_size=256, chunk_size=32).train()
    before = layer.codebook.clone()
    y, _ = layer(torch.randn(1, 256, 64))
    y.square().mean().backward()
    assert layer.k_proj.weight.grad is not None and not torch.equal(layer.codebook, before)


def test_straight_through_and_commitment_loss_reach_the_key_projection():
    torch.manual_seed(0)
    layer = VQAttention(d_model=16, n_heads=2, codebook_size=8, chunk_size=4, commitment_weight=1.0)
    y, _ = layer(torch.randn(2, 12, 16))
    y.sum().backward()
    grad_from_output = layer.k_proj.weight.grad.clone()
    assert grad_from_output.abs().sum() > 0
    layer.zero_grad()
    layer(torch.randn(2, 12, 16))
    layer.aux_loss.backward()
    assert layer.k_proj.weight.grad.abs().sum() > 0 and layer.q_proj.weight.grad is None


def test_vq_and_ovq_share_the_read():
    from ovq_cl.ops import dictionary
    from ovq_cl.ops.ovq import naive as ovq_naive
    from ovq_cl.ops.vq import naive as vq_naive
    assert ovq_naive.dictionary_chunk_read is vq_naive.dictionary_chunk_read is dictionary.dictionary_chunk_read


def test_bad_input():
    codebook = F.normalize(torch.randn(2, 4, 8), dim=-1)
    q = torch.randn(1, 5, 2, 8)
    codes = torch.zeros(1, 5, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="codebook"):
        vq_attention(q, q, q, codes, torch.ones(2), codebook[:1], chunk_size=4)
    with pytest.raises(ValueError, match="codes"):
        vq_attention(q, q, q, codes[:, :3], torch.ones(2), codebook, chunk_size=4)
    with pytest.raises(ValueError, match="codebook_size"):
        VQAttention(16, 2, codebook_size=0)


def test_gradients_match_finite_differences():
    H, S, D, T = 2, 3, 4, 9
    codebook = F.normalize(torch.randn(H, S, D, dtype=torch.float64), dim=-1)
    q = F.normalize(torch.randn(1, T, H, D, dtype=torch.float64), dim=-1).requires_grad_(True)
    k_raw = F.normalize(torch.randn(1, T, H, D, dtype=torch.float64), dim=-1)
    k_hat, codes = quantize(k_raw, codebook)
    k_hat.requires_grad_(True)
    v = torch.randn(1, T, H, 3, dtype=torch.float64, requires_grad=True)
    beta = torch.tensor([2.0, 3.0], dtype=torch.float64, requires_grad=True)
    fn = lambda q, k, v, b: vq_attention(q, k, v, codes, b, codebook, chunk_size=3)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k_hat, v, beta), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("group, state_grad, T, pending", [(2, "full", 61, 0), (3, "full", 61, 3), (4, "detach", 61, 3),
                                                           (50, "full", 40, 0)])
def test_recomputed_chunks_give_the_same_values_and_gradients(group, state_grad, T, pending):
    """recompute_chunks: outputs, final state and every gradient (q, straight-through k, v, beta)
    equal the plain graph's, with pending tokens carried in and a partial last chunk."""
    B, H, D, S, L = 2, 2, 6, 5, 8
    g = torch.Generator().manual_seed(T + pending)
    codebook = F.normalize(torch.randn(H, S, D, generator=g, dtype=torch.float64), dim=-1)
    unit = lambda n: F.normalize(torch.randn(B, n, H, D, generator=g, dtype=torch.float64), dim=-1)  # noqa: E731
    s0 = None
    if pending:
        k0 = unit(L + pending)
        k0_hat, c0 = quantize(k0, codebook)
        _, s0 = vq_attention(unit(L + pending), k0_hat, torch.randn(B, L + pending, H, D, generator=g, dtype=torch.float64),
                             c0, torch.full((H,), 4.0, dtype=torch.float64), codebook, chunk_size=L)
    q, k, v = unit(T), unit(T), torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    k_hat, codes = quantize(k, codebook)

    def run(recompute):
        leaves = [t.clone().requires_grad_() for t in (q, k_hat, v)]
        beta = torch.tensor([3.0, 7.0], dtype=torch.float64, requires_grad=True)
        o, state = vq_attention(*leaves, codes, beta, codebook, chunk_size=L, state_grad=state_grad,
                                initial_state=s0, recompute_chunks=recompute)
        loss = (o * torch.linspace(-1, 1, D, dtype=torch.float64)).sum() + state.values.square().sum()
        return o, state, torch.autograd.grad(loss, leaves + [beta], materialize_grads=True)

    o_ref, s_ref, g_ref = run(0)
    o_rc, s_rc, g_rc = run(group)
    assert rel_err(o_rc, o_ref) < 1e-12
    for a, b in zip(s_rc.state_dict().values(), s_ref.state_dict().values()):
        assert a.shape == b.shape and (a.numel() == 0 or rel_err(a.double(), b.double()) < 1e-12)
    for name, a, b in zip(("q", "k", "v", "beta"), g_rc, g_ref):
        assert rel_err(a, b) < 1e-10, name
    assert all(t.abs().sum() > 0 for t in g_ref)
