"""ICL stream: determinism, targets = W_f x, functions owned by their experience, both encodings, errors."""
import pytest
import torch

from streams.common import scored_mask, stack_items
from streams.icl import icl_data
from streams.recall import IGNORE, SEP

TINY = dict(n_experiences=3, functions_per_experience=2, d_x=3, d_y=2, examples_per_episode=6,
            queries_per_episode=2, train_episodes=8, test_episodes=4, test_queries=5, meta_train_episodes=16)
TOKENS = dict(TINY, encoding="tokens", n_bins=16)


def all_tensors(data):
    sets = list(data.train) + list(data.test) + [data.meta_train]
    return [t for d in sets for t in stack_items(d)]


def same(a, b):
    return all(torch.equal(u.nan_to_num(7.0), v.nan_to_num(7.0)) for u, v in zip(a, b))


@pytest.mark.parametrize("cfg", [TINY, TOKENS], ids=["continuous", "tokens"])
def test_same_seed_same_tensors_other_seed_different(cfg):
    a, b, c = all_tensors(icl_data(cfg)), all_tensors(icl_data(cfg)), all_tensors(icl_data({**cfg, "seed": 3}))
    assert same(a, b) and not same(a, c)


def split_channels(x, info):
    n_ids, d_x = 6, 3
    return x[..., :n_ids], x[..., n_ids: n_ids + d_x], x[..., n_ids + d_x: -1], x[..., -1]


def test_continuous_layout_and_targets():
    data = icl_data(TINY)
    info = data.info
    assert info.d_in == 6 + 3 + 2 + 1 and info.d_out == 2 and info.vocab_size is None
    for j in range(3):
        x, y = stack_items(data.train[j])
        assert x.shape == (8, 8, info.d_in) and y.shape == (8, 8, 2) and x.dtype == y.dtype == torch.float32
        onehot, xs, ys, shown = split_channels(x, info)
        fid = onehot.argmax(-1)
        assert set(fid.unique().tolist()) == set(info.function_ids[j]), "only (and all) of experience j's functions"
        truth = torch.einsum("btij,btj->bti", info.weights[fid], xs)
        mask = scored_mask(y)
        assert (shown[:, :6] == 1).all() and (shown[:, 6:] == 0).all()
        assert torch.equal(mask, shown == 0)
        assert torch.allclose(ys[:, :6], truth[:, :6], atol=1e-5), "presented y = W_f x"
        assert (ys[:, 6:] == 0).all(), "queries hide y"
        assert torch.allclose(y[mask], truth[mask], atol=1e-5), "target = W_f x"
        xt, yt = stack_items(data.test[j])
        assert xt.shape == (4, 5, info.d_in) and info.test_seq_len == 5
        assert (split_channels(xt, info)[3] == 0).all() and scored_mask(yt).all(), "test episodes: queries only"
        assert set(split_channels(xt, info)[0].argmax(-1).unique().tolist()) <= set(info.function_ids[j])


def test_tokens_layout_and_targets():
    data = icl_data(TOKENS)
    info = data.info
    width = 1 + 3 + 2
    assert info.vocab_size == 2 + 6 + 16 and info.seq_len == 8 * width + 1
    for j in range(3):
        for split, n_shown in ((data.train[j], 6), (data.test[j], 0)):
            x, y = stack_items(split)
            assert x.dtype == y.dtype == torch.int64
            for xe, ye in zip(x, y):
                sep = n_shown * width
                assert xe[sep] == SEP
                rows = xe[sep + 1:].view(-1, width)
                assert set((rows[:, 0] - 2).tolist()) <= set(info.function_ids[j])
                scored = (ye != IGNORE).nonzero().flatten()
                assert len(scored) == 2 * len(rows)
                assert torch.equal(ye[scored], xe[scored + 1]), "labels are the next (value) tokens"
                xs = info.dequantize(rows[:, 1:4])
                truth = torch.einsum("nij,nj->ni", info.weights[rows[:, 0] - 2], xs)
                got = info.dequantize(ye[scored].view(-1, 2))
                step = 2 * 3.0 / 16
                # x is quantised too: allow its error through W, plus the target's own half bin
                bound = step / 2 + info.weights[rows[:, 0] - 2].abs().sum(-1) * step / 2
                assert ((got - truth.clamp(-3, 3)).abs() <= bound + 1e-5).all()


def test_meta_train_uses_fresh_functions():
    data = icl_data(TINY)
    x, y = stack_items(data.meta_train)
    assert x.shape == (16, 8, data.info.d_in)
    onehot, xs, ys, shown = split_channels(x, data.info)
    fid = onehot.argmax(-1)
    stream_truth = torch.einsum("btij,btj->bti", data.info.weights[fid], xs)
    assert not torch.allclose(ys[:, :6], stream_truth[:, :6], atol=1e-3), "not the stream's functions"
    assert len(fid.unique()) > 2, "ids from the whole id space"


@pytest.mark.parametrize("user, words", [
    ({"d_z": 1}, "d_z"),
    ({"d_x": 1.5}, "d_x"),
    ({"n_experiences": 0}, "n_experiences"),
    ({"encoding": "bits"}, "encoding"),
    ({"examples_per_episode": 1}, "episode too short"),
    ({"seq_len": 10}, "episode too short"),
    ({"clip": 0.0}, "clip"),
])
def test_impossible_configs_raise_clear_errors(user, words):
    with pytest.raises(ValueError, match=words):
        icl_data(user)
