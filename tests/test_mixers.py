"""The mixer contract, for every registered mixer: chunked = token by token = split calls, causality,
state size, save/load, gradients, bad input."""
import pytest
import torch

from ovq_cl.layers import MIXERS, build_mixer
from ovq_cl.ops.linear import linear_attention_chunked, linear_attention_recurrent
from ovq_cl.ops.softmax import softmax_attention

from conftest import rel_err, state_storage_bytes

D_MODEL, HEADS = 24, 3
OPTIONS = {
    "ovq": {"num_slots": 6, "chunk_size": 5},
    "full": {},
    "linear": {"chunk_size": 7},
    "vq": {"codebook_size": 6, "chunk_size": 5},
    "delta": {"chunk_size": 6},
    "deltanet": {"chunk_size": 6},
    "swa": {"window": 6},
    "ssm": {"chunk_size": 6},
}
# the baselines' design knobs (short conv, Taylor map, output norm, gate) through the same contract:
# variant name -> (registered mixer, options)
VARIANTS = {
    "linear_taylor_conv": ("linear", {"chunk_size": 7, "feature_map": "taylor", "short_conv": 4, "output_norm": True}),
    "delta_conv": ("delta", {"chunk_size": 6, "short_conv": 4, "output_gate": True}),
    "deltanet_conv": ("deltanet", {"chunk_size": 5, "short_conv": 3, "output_norm": False}),
    "ssm_conv": ("ssm", {"chunk_size": 6, "short_conv": 2, "output_norm": False}),
}


def make(kind, dtype=torch.float64):
    """A mixer in eval mode (VQ's codebook moves in training mode, see test_vq.py)."""
    torch.manual_seed(1)
    name, options = VARIANTS.get(kind, (kind, OPTIONS.get(kind, {})))
    return build_mixer(name, D_MODEL, HEADS, options).to(dtype).eval()


def run_split(mixer, x, cuts):
    outs, state, prev = [], None, 0
    for cut in list(cuts) + [x.shape[1]]:
        y, state = mixer(x[:, prev:cut], state)
        outs.append(y)
        prev = cut
    return torch.cat(outs, 1), state


@pytest.fixture(params=sorted(OPTIONS) + sorted(VARIANTS))
def kind(request):
    return request.param


def test_every_registered_mixer_is_covered():
    assert set(MIXERS) == set(OPTIONS)


def test_one_call_equals_token_by_token_and_split_calls(kind):
    mixer = make(kind)
    x = torch.randn(2, 33, D_MODEL, dtype=torch.float64)
    y, state = mixer(x)
    y_tok, state_tok = run_split(mixer, x, range(1, 33))
    assert rel_err(y_tok, y) < 1e-10
    for cuts in ([10, 20], [3, 4, 25]):
        y_split, state_split = run_split(mixer, x, cuts)
        assert rel_err(y_split, y) < 1e-10
        assert state_split.nbytes == state.nbytes
    for a, b in zip(state.state_dict().values(), state_tok.state_dict().values()):
        assert a.shape == b.shape and (a.numel() == 0 or rel_err(a.double(), b.double()) < 1e-10)


def test_causality(kind):
    mixer = make(kind)
    x = torch.randn(1, 30, D_MODEL, dtype=torch.float64)
    y, _ = mixer(x)
    for t in (0, 4, 5, 17):
        x2 = x.clone()
        x2[:, t + 1:] += torch.randn_like(x2[:, t + 1:])
        y2, _ = mixer(x2)
        assert torch.allclose(y2[:, : t + 1], y[:, : t + 1], rtol=0, atol=1e-12)
        assert not torch.allclose(y2[:, t + 1:], y[:, t + 1:])


def test_state_nbytes_matches_the_state_and_scales_as_designed(kind):
    mixer = make(kind, torch.float32)
    sizes = {}
    for T in (20, 64):
        with torch.no_grad():
            _, state = mixer(torch.randn(2, T, D_MODEL))
        assert state.nbytes == mixer.state_nbytes(T, batch_size=2)
        sizes[T] = mixer.state_nbytes(T * 100, batch_size=2)
    grows = kind == "full"
    assert (sizes[64] > sizes[20]) == grows      # only full attention's state grows with T


@pytest.mark.parametrize("grad", [False, True])
def test_state_keeps_only_itself_alive(kind, grad):
    """A state's tensors are not views into the call's sequence-sized buffers: what a state keeps
    alive is its own size (state_nbytes), not the whole sequence it was computed from."""
    mixer = make(kind, torch.float32)
    T = 203
    x = torch.randn(2, T, D_MODEL, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        _, state = mixer(x)
    assert state_storage_bytes(state) <= mixer.state_nbytes(T, batch_size=2) + 4096


def test_state_save_load_and_eval_from_a_copy(kind, tmp_path):
    mixer = make(kind)
    x = torch.randn(2, 12, D_MODEL, dtype=torch.float64)
    _, state = mixer(x)
    torch.save(state.state_dict(), tmp_path / "state.pt")
    loaded = type(state).from_state_dict(torch.load(tmp_path / "state.pt"))
    snapshot = {k: v.clone() for k, v in state.state_dict().items()}
    x2 = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    y_a, _ = mixer(x2, state.clone())
    y_b, _ = mixer(x2, loaded)
    assert torch.equal(y_a, y_b)
    for key, value in state.state_dict().items():                  # the carried state is untouched
        assert torch.equal(value, snapshot[key])


def test_gradients_finite_and_reach_every_parameter(kind):
    mixer = make(kind, torch.float32).train()
    x = torch.randn(2, 40, D_MODEL, requires_grad=True)
    y, _ = mixer(x)
    y.square().mean().backward()
    assert torch.isfinite(x.grad).all()
    for name, p in mixer.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_bad_input(kind):
    mixer = make(kind, torch.float32)
    with pytest.raises(ValueError, match="rank 3"):
        mixer(torch.randn(4, D_MODEL))
    with pytest.raises(ValueError, match="d_model"):
        mixer(torch.randn(1, 4, D_MODEL + 1))
    other = "full" if kind.startswith("linear") else "linear"
    _, foreign = make(other, torch.float32)(torch.randn(1, 4, D_MODEL))
    with pytest.raises(ValueError, match="state must be"):
        mixer(torch.randn(1, 4, D_MODEL), foreign)


def test_unknown_mixer_and_bad_options():
    with pytest.raises(ValueError, match="unknown mixer 'mamba9'"):
        build_mixer("mamba9", D_MODEL, HEADS)
    with pytest.raises(ValueError, match="chunk_size"):
        build_mixer("ovq", D_MODEL, HEADS, {"chunk_size": 0})
    with pytest.raises(ValueError, match="num_slots"):
        build_mixer("ovq", D_MODEL, HEADS, {"num_slots": 0})
    with pytest.raises(ValueError, match="divisible"):
        build_mixer("full", 25, HEADS)
    with pytest.raises(ValueError, match="feature_map"):
        build_mixer("linear", D_MODEL, HEADS, {"feature_map": "cosh"})
    with pytest.raises(ValueError, match="Did you mean: 'num_slots'"):
        build_mixer("ovq", D_MODEL, HEADS, {"slots": 5})
    from ovq_cl.layers import OVQAttention

    with pytest.raises(ValueError, match="unknown option"):
        OVQAttention(D_MODEL, HEADS, slots=5)
    with pytest.raises(TypeError, match="options must be OVQOptions"):
        OVQAttention(D_MODEL, HEADS, options=object())


@pytest.mark.parametrize("fmap,normalize", [("elu1", True), ("relu", True), ("identity", False)])
def test_linear_attention_chunked_equals_recurrence_and_explicit_sum(fmap, normalize):
    q, k, v = (torch.randn(2, 63, 3, 60, dtype=torch.float64) for _ in range(3))
    o, s = linear_attention_chunked(q, k, v, fmap, normalize, chunk_size=16)
    o_r, s_r = linear_attention_recurrent(q, k, v, fmap, normalize)
    assert rel_err(o, o_r) < 1e-10 and rel_err(s.S, s_r.S) < 1e-10 and rel_err(s.z, s_r.z) < 1e-10
    # independent quadratic form: o_t = sum_{s<=t} (phi(q_t).phi(k_s)) v_s [/ sum_{s<=t} phi(q_t).phi(k_s)]
    from ovq_cl.ops.linear import feature_map
    phi = feature_map(fmap)
    a = torch.einsum("bthd,bshd->bhts", phi(q), phi(k)).tril()
    ref = torch.einsum("bhts,bshd->bthd", a, v)
    if normalize:
        ref = ref / (a.sum(-1).transpose(1, 2).unsqueeze(-1) + 1e-6)
    assert rel_err(o, ref) < 1e-10


def test_sliding_window_softmax_attention_masks_old_tokens():
    q, k, v = (torch.randn(1, 20, 2, 8, dtype=torch.float64) for _ in range(3))
    o, _ = softmax_attention(q, k, v, window=4)
    t = 10
    s = (q[0, t] * k[0, t - 3: t + 1]).sum(-1) / 8 ** 0.5                 # [4, H]
    ref = torch.einsum("sh,shd->hd", s.softmax(0), v[0, t - 3: t + 1])
    assert rel_err(o[0, t], ref) < 1e-12


def test_sliding_window_equals_full_attention_within_the_window_and_stops_growing():
    torch.manual_seed(3)
    full = build_mixer("full", D_MODEL, HEADS).double()
    swa = build_mixer("swa", D_MODEL, HEADS, {"window": 16}).double()
    swa.load_state_dict(full.state_dict())
    x = torch.randn(1, 40, D_MODEL, dtype=torch.float64)
    y_full, _ = full(x)
    y_swa, state = swa(x)
    assert rel_err(y_swa[:, :16], y_full[:, :16]) < 1e-12
    assert rel_err(y_swa[:, 16:], y_full[:, 16:]) > 1e-6
    assert state.keys.shape[2] == 15 and swa.state_nbytes(10**6) == swa.state_nbytes(16)


@pytest.mark.parametrize("past,T,window", [(0, 37, 5), (11, 29, 6), (3, 4, 8), (0, 64, 16)])
def test_blocked_sliding_window_equals_the_dense_mask(past, T, window):
    """The O(T W) blocked path against one dense masked softmax over cache + sequence."""
    g = torch.Generator().manual_seed(past + T)
    q, k, v = (torch.randn(2, past + T, 3, 8, generator=g, dtype=torch.float64) for _ in range(3))
    _, cache = softmax_attention(q[:, :past], k[:, :past], v[:, :past], window=window) if past else (None, None)
    o, _ = softmax_attention(q[:, past:], k[:, past:], v[:, past:], window=window, initial_state=cache)
    s = torch.einsum("bthd,bshd->bhts", q, k) / 8 ** 0.5
    pos = torch.arange(past + T)
    allowed = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
    ref = torch.einsum("bhts,bshd->bthd", s.masked_fill(~allowed, float("-inf")).softmax(-1), v)[:, past:]
    assert rel_err(o, ref) < 1e-12


def test_baseline_layer_choices_are_knobs():
    """Gated DeltaNet's output gate and where linear attention's 1/sqrt(d) goes: both settings build and
    run; the defaults come from experiments/studies/baseline_choices/search.py (results/baseline_choices.json)."""
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    gated = build_mixer("delta", D_MODEL, HEADS, {"output_gate": True}).double()
    plain = build_mixer("delta", D_MODEL, HEADS).double()
    assert gated.g_proj is not None and plain.g_proj is None and not plain.options.output_gate
    assert gated(x)[0].shape == plain(x)[0].shape == x.shape
    torch.manual_seed(0)
    inside = build_mixer("linear", D_MODEL, HEADS, {"query_scale": "inside"}).double()
    torch.manual_seed(0)
    none = build_mixer("linear", D_MODEL, HEADS).double()
    assert none.options.query_scale == "none"
    assert not torch.allclose(inside(x)[0], none(x)[0])        # elu+1 is not scale-invariant
