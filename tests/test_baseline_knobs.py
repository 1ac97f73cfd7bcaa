"""The dense-state baselines' design choices as knobs: the short causal convolution (and its carried
cache), the per-head output norm, Based's Taylor feature map, and DeltaNet (Gated DeltaNet without the
decay). Checked against independent references and known answers; the mixer contract itself (split
calls, causality, save/load, gradients) runs on these settings in test_mixers.py's VARIANTS."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ovq_cl import DecoderLM, model_config
from ovq_cl.layers import MIXERS, DeltaNet, GatedDeltaNet, build_mixer
from ovq_cl.layers.budget import size_to_budget, state_bytes
from ovq_cl.layers.conv import ShortConv
from ovq_cl.ops.linear import feature_dim, linear_attention_chunked, linear_attention_recurrent, taylor_feature_map

from conftest import rel_err

D_MODEL, HEADS = 24, 3


def explicit_conv(x, w):
    """y_t[c] = silu(sum_j w[c, j] x_{t-K+1+j}[c]), zeros before the first token; x [B, T, C], w [C, K]."""
    T, K = x.shape[1], w.shape[1]
    y = torch.zeros_like(x)
    for t in range(T):
        for j in range(K):
            s = t - K + 1 + j
            if s >= 0:
                y[:, t] += w[:, j] * x[:, s]
    return F.silu(y)


def padded_conv(x, w):
    """fla's ShortConvolution without a cache: nn.Conv1d with padding K-1, cut to T; x [B, T, C], w [C, 1, K]."""
    T = x.shape[1]
    return F.silu(F.conv1d(x.transpose(1, 2), w, padding=w.shape[-1] - 1, groups=w.shape[0])[..., :T].transpose(1, 2))


# --- the short convolution -------------------------------------------------------------------------------

@pytest.mark.parametrize("K", [1, 2, 4])
def test_short_conv_matches_the_explicit_sum_and_the_padded_form(K):
    conv = ShortConv(5, K).double()
    x = torch.randn(2, 11, 5, dtype=torch.float64)
    y, cache = conv(x)
    assert rel_err(y, explicit_conv(x, conv.weight[:, 0])) < 1e-12
    assert rel_err(y, padded_conv(x, conv.weight)) < 1e-12
    assert cache.shape == (2, K - 1, 5) and torch.equal(cache, x[:, 11 - (K - 1):])


def test_short_conv_cache_carries_split_calls_and_short_calls():
    """Calls of 1, 2 (< K-1) and more tokens continue one sequence exactly; the cache of a fresh call
    shorter than K-1 is zero-padded on the left."""
    conv = ShortConv(6, 4).double()
    x = torch.randn(2, 13, 6, dtype=torch.float64)
    y, cache = conv(x)
    outs, c, prev = [], None, 0
    for cut in (1, 3, 4, 9, 13):
        yc, c = conv(x[:, prev:cut], c)
        outs.append(yc)
        prev = cut
    assert rel_err(torch.cat(outs, 1), y) < 1e-12 and torch.equal(c, cache)
    _, short = conv(x[:, :2])
    assert torch.equal(short[:, 0], torch.zeros(2, 6, dtype=torch.float64)) and torch.equal(short[:, 1:], x[:, :2])


def test_short_conv_refuses_a_bad_cache():
    conv = ShortConv(6, 4)
    with pytest.raises(ValueError, match="cache must be"):
        conv(torch.randn(2, 5, 6), torch.zeros(2, 2, 6))
    with pytest.raises(ValueError, match="channels and kernel_size"):
        ShortConv(6, 0)


class ConvProjection(nn.Module):
    """proj(x) then the padded (fla-style, cache-free) causal conv + SiLU: the reference's q/k/v path."""

    def __init__(self, proj, weight):
        super().__init__()
        self.proj, self.weight = proj, weight

    def forward(self, x):
        return padded_conv(self.proj(x), self.weight)


@pytest.mark.parametrize("name,options", [
    ("linear", {"feature_map": "taylor", "chunk_size": 5}),
    ("delta", {"chunk_size": 5, "output_gate": True}),
    ("deltanet", {"chunk_size": 5}),
    ("ssm", {"chunk_size": 5}),
])
def test_short_conv_is_applied_to_q_k_v_and_nothing_else(name, options):
    """A mixer with short_conv=4 equals the same mixer without it whose q, k, v projections are followed
    by an independent (padded, cache-free) causal conv + SiLU: outputs and input gradients, float64."""
    torch.manual_seed(0)
    mixer = build_mixer(name, D_MODEL, HEADS, {**options, "short_conv": 4}).double()
    ref = build_mixer(name, D_MODEL, HEADS, {**options, "short_conv": 0}).double()
    missing, unexpected = ref.load_state_dict(mixer.state_dict(), strict=False)
    assert not missing and unexpected == ["conv.weight"]
    width = HEADS * mixer.head_dim
    w = mixer.conv.weight.detach()
    ref.q_proj = ConvProjection(ref.q_proj, w[:width])
    ref.k_proj = ConvProjection(ref.k_proj, w[width:2 * width])
    ref.v_proj = ConvProjection(ref.v_proj, w[2 * width:])
    x = torch.randn(2, 17, D_MODEL, dtype=torch.float64, requires_grad=True)
    y, state = mixer(x)
    y_ref, _ = ref(x)
    assert rel_err(y, y_ref) < 1e-10
    probe = torch.randn_like(y)
    (g,) = torch.autograd.grad((y * probe).sum(), x)
    (g_ref,) = torch.autograd.grad((y_ref * probe).sum(), x)
    assert rel_err(g, g_ref) < 1e-10
    assert state.conv.shape == (2, 3, 3 * width)


@pytest.mark.parametrize("name", ["linear", "delta", "deltanet", "ssm"])
def test_short_conv_cache_is_counted_and_must_match_the_mixer(name):
    plain = build_mixer(name, D_MODEL, HEADS, {"short_conv": 0})
    conv = build_mixer(name, D_MODEL, HEADS, {"short_conv": 4})
    x = torch.randn(2, 7, D_MODEL)
    with torch.no_grad():
        _, s_plain = plain(x)
        _, s_conv = conv(x)
    assert s_plain.conv is None and "conv" not in s_plain.state_dict()
    cache_bytes = 2 * 3 * (3 * D_MODEL) * 4                         # B (K-1) 3 H Dk float32
    assert s_conv.nbytes - s_plain.nbytes == cache_bytes
    assert conv.state_nbytes(7, 2) - plain.state_nbytes(7, 2) == cache_bytes
    with pytest.raises(ValueError, match="short_conv=0"):
        plain(x, s_conv)
    with pytest.raises(ValueError, match="no short-conv cache"):
        conv(x, s_plain)


def test_model_with_the_knobs_saves_and_restores_its_states():
    """Through the LM: configs carry the knobs, and BlockState.from_state_dict restores the nested conv
    cache (prefixed mixer.conv) so that a restored run continues exactly."""
    cfg = model_config({
        "vocab_size": 31, "d_model": D_MODEL, "n_heads": HEADS, "n_layers": 3, "layers": ["linear", "deltanet", "ssm"],
        "mixers": {"linear": {"feature_map": "taylor", "short_conv": 4, "output_norm": True, "chunk_size": 8},
                   "deltanet": {"short_conv": 4, "chunk_size": 8}, "ssm": {"short_conv": 3, "chunk_size": 8}},
    })
    model = DecoderLM(cfg).double().eval()
    tokens = torch.randint(0, 31, (2, 20))
    logits, _ = model(tokens)
    _, states = model(tokens[:, :9])
    dicts = [s.state_dict() for s in states]
    assert all("mixer.conv" in d for d in dicts)
    restored = model.states_from_state_dicts(dicts)
    logits_b, _ = model(tokens[:, 9:], restored)
    assert rel_err(logits_b, logits[:, 9:]) < 1e-10


# --- output norm -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,default", [("linear", True), ("delta", True), ("deltanet", True), ("ssm", True)])
def test_output_norm_is_a_per_head_rmsnorm_before_o_proj(name, default):
    """With output_norm the input of o_proj is RMSNorm(the unnormalised one) head by head (weight 1 at
    init); without it there is no o_norm and no parameter."""
    assert build_mixer(name, D_MODEL, HEADS).options.output_norm is default
    torch.manual_seed(0)
    normed = build_mixer(name, D_MODEL, HEADS, {"output_norm": True}).double()
    plain = build_mixer(name, D_MODEL, HEADS, {"output_norm": False}).double()
    assert plain.o_norm is None and not any(n.startswith("o_norm") for n, _ in plain.named_parameters())
    plain.load_state_dict({k: v for k, v in normed.state_dict().items() if not k.startswith("o_norm")})
    seen = {}
    for key, mixer in (("normed", normed), ("plain", plain)):
        mixer.o_proj.register_forward_hook(lambda m, inp, out, key=key: seen.__setitem__(key, inp[0]))
        mixer(torch.randn(2, 9, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    heads = seen["plain"].view(2, 9, HEADS, -1)
    expected = heads * torch.rsqrt(heads.square().mean(-1, keepdim=True) + torch.finfo(torch.float64).eps)
    assert rel_err(seen["normed"], expected.reshape(2, 9, -1)) < 1e-10


# --- Based's Taylor feature map --------------------------------------------------------------------------

def test_taylor_feature_map_gives_the_second_order_taylor_kernel():
    d = 7
    q, k = torch.randn(5, d, dtype=torch.float64), torch.randn(5, d, dtype=torch.float64)
    s = (q * k).sum(-1) / d ** 0.5
    phi_q, phi_k = taylor_feature_map(q), taylor_feature_map(k)
    assert phi_q.shape == (5, feature_dim("taylor", d)) == (5, 1 + d + d * (d + 1) // 2)
    assert rel_err((phi_q * phi_k).sum(-1), 1 + s + s * s / 2) < 1e-12
    assert feature_dim("elu1", d) == d


def dense_taylor_attention(q, k, v, eps=1e-6):
    """Known answer: weights 1 + s + s^2/2, s = q.k / sqrt(d), causal, normalised; [B, T, H, D] layout."""
    s = torch.einsum("bthd,bshd->bhts", q, k) / q.shape[-1] ** 0.5
    w = (1 + s + s * s / 2).tril()
    return torch.einsum("bhts,bshd->bthd", w, v) / (w.sum(-1).transpose(1, 2).unsqueeze(-1) + eps)


@pytest.mark.parametrize("T,chunk", [(37, 8), (16, 64)])
def test_taylor_linear_attention_matches_fla_based_and_the_dense_answer(T, chunk):
    """fla's naive_parallel_based(q, k, v) multiplies q by its default scale d^-1/2 and then uses
    1 + a + a^2/2 with a = q.k: the same kernel as our map at scale=1.0 (query_scale "none"), and the
    same eps (1e-6) in the denominator. Its layout is [B, H, T, D]."""
    from fla.ops.based.naive import naive_parallel_based

    g = torch.Generator().manual_seed(T)
    q, k = (torch.randn(2, T, 3, 6, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, T, 3, 5, generator=g, dtype=torch.float64)
    o, state = linear_attention_chunked(q, k, v, "taylor", normalize=True, chunk_size=chunk)
    o_rec, state_rec = linear_attention_recurrent(q, k, v, "taylor", normalize=True)
    assert state.S.shape == (2, 3, 1 + 6 + 21, 5) and state.z.shape == (2, 3, 28)
    assert rel_err(o, o_rec) < 1e-10 and rel_err(state.S, state_rec.S) < 1e-10
    assert rel_err(o, dense_taylor_attention(q, k, v)) < 1e-10
    qf, kf, vf = (x.transpose(1, 2).float() for x in (q, k, v))
    o_fla = naive_parallel_based(qf, kf, vf, use_norm=True).transpose(1, 2)
    assert rel_err(o.float(), o_fla) < 1e-5
    o_fla_raw = naive_parallel_based(qf, kf, vf, use_norm=False).transpose(1, 2)
    o_raw, _ = linear_attention_chunked(q, k, v, "taylor", normalize=False, chunk_size=chunk)
    assert rel_err(o_raw.float(), o_fla_raw) < 1e-5


def test_taylor_state_size_and_the_budget_sizer():
    """S [B, H, F, d] and z [B, H, F], F = 1+d+d(d+1)/2: at 65,536 B for 4 heads (4,096 floats a head),
    F (d+1) <= 4096 gives d = 18 (3,610; d = 19 needs 4,200); elu1's d(d+1) gives d = 63."""
    mixer = build_mixer("linear", D_MODEL, HEADS, {"feature_map": "taylor"})
    d = mixer.head_dim
    assert mixer.state_nbytes(100, batch_size=2) == 2 * HEADS * (1 + d + d * (d + 1) // 2) * (d + 1) * 4
    assert size_to_budget("linear", 64, 4, 65536, {"feature_map": "taylor"}).head_dim == 18
    assert size_to_budget("linear", 64, 4, 65536, {"feature_map": "elu1"}).head_dim == 63
    with_conv = size_to_budget("linear", 64, 4, 65536, {"feature_map": "taylor", "short_conv": 4})
    assert with_conv.head_dim == 18                       # + the cache, 3 (K-1) d a head: 3,772 floats
    assert state_bytes("linear", 64, 4, with_conv) <= 65536


# --- DeltaNet --------------------------------------------------------------------------------------------

def test_deltanet_is_registered_and_has_no_decay_parameters():
    assert MIXERS.get("deltanet").cls is DeltaNet and DeltaNet.budget_knob == "head_dim"
    mixer = build_mixer("deltanet", D_MODEL, HEADS)
    assert isinstance(mixer, GatedDeltaNet) and mixer.options.decay is False
    names = {n for n, _ in mixer.named_parameters()}
    assert not names & {"a_proj.weight", "A_log", "dt_bias"}
    assert {"a_proj.weight", "A_log", "dt_bias"} <= {n for n, _ in build_mixer("delta", D_MODEL, HEADS).named_parameters()}
    assert size_to_budget("deltanet", 64, 4, 65536).head_dim == size_to_budget("delta", 64, 4, 65536).head_dim == 64


def test_deltanet_equals_gated_deltanet_with_its_decay_switched_off():
    """A_log = -inf makes Gated DeltaNet's g = -exp(A_log) softplus(.) exactly 0: the layers agree."""
    torch.manual_seed(0)
    gated = build_mixer("delta", D_MODEL, HEADS, {"chunk_size": 5}).double()
    plain = build_mixer("deltanet", D_MODEL, HEADS, {"chunk_size": 5}).double()
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if k in plain.state_dict()})
    with torch.no_grad():
        gated.A_log.fill_(float("-inf"))
    x = torch.randn(2, 13, D_MODEL, dtype=torch.float64)
    (y_g, s_g), (y_p, s_p) = gated(x), plain(x)
    assert rel_err(y_p, y_g) < 1e-12 and rel_err(s_p.S, s_g.S) < 1e-12
    assert rel_err(y_p, build_mixer("delta", D_MODEL, HEADS, {"chunk_size": 5}).double()(x)[0]) > 1e-3


# --- validation ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["linear", "delta", "deltanet", "ssm"])
@pytest.mark.parametrize("field,value,message", [
    ("short_conv", -1, "short_conv must be an int >= 0"),
    ("short_conv", True, "short_conv must be an int >= 0"),
    ("output_norm", 1, "output_norm must be True or False"),
])
def test_bad_knob_values(name, field, value, message):
    cls = MIXERS.get(name).cls
    with pytest.raises(ValueError, match=message):
        cls(D_MODEL, HEADS, **{field: value})


def test_bad_knob_values_from_a_config():
    with pytest.raises(ValueError, match="short_conv"):
        build_mixer("ssm", D_MODEL, HEADS, {"short_conv": -2})
    with pytest.raises(ValueError, match="decay must be True or False"):
        DeltaNet(D_MODEL, HEADS, decay="no")
    with pytest.raises(ValueError, match="DeltaNet: chunk_size"):
        DeltaNet(D_MODEL, HEADS, chunk_size=0)
