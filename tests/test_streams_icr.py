"""ICR stream: determinism, disjoint key regions, test episodes from memory only, latest bindings, errors."""
import numpy as np
import pytest
import torch

from streams.common import stack_items
from streams.icr import icr_config, icr_data
from streams.recall import IGNORE, PAD, SEP

TINY = dict(n_experiences=3, n_keys=24, n_values=10, facts_per_experience=6, facts_per_episode=4,
            queries_per_episode=3, train_episodes=8, test_episodes=4, test_queries=3, meta_train_episodes=16)
POSITIONAL = dict(TINY, variant="positional", rebind_within=1, rebind_across=2)


def all_tensors(data):
    sets = list(data.train) + list(data.test) + [data.meta_train]
    return [t for d in sets for t in stack_items(d)]


def queries(x, y):
    """(key, answer) of every scored position of one episode: the key is the token AT t, the answer y[t]."""
    where = (y != IGNORE).nonzero().flatten().tolist()
    for t in where:
        assert x[t + 1] == y[t], "the answer is the next token (teacher forced)"
    return [(int(x[t]), int(y[t])) for t in where]


def presented(x):
    """The (key, value) pairs before SEP, in order."""
    sep = (x == SEP).nonzero()[0, 0].item()
    return [(int(x[t]), int(x[t + 1])) for t in range(0, sep, 2)]


@pytest.mark.parametrize("cfg", [TINY, POSITIONAL], ids=["basic", "positional"])
def test_same_seed_same_tensors_other_seed_different(cfg):
    a, b, c = all_tensors(icr_data(cfg)), all_tensors(icr_data(cfg)), all_tensors(icr_data({**cfg, "seed": 1}))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not all(torch.equal(u, v) for u, v in zip(a, c))


def test_items_are_pure_functions_of_their_index():
    data = icr_data(TINY)
    late_first = data.train[1][5]
    _ = [data.train[1][i] for i in range(8)]
    assert all(torch.equal(u, v) for u, v in zip(late_first, data.train[1][5]))


def test_key_regions_disjoint_and_train_episodes_present_their_own_table():
    data = icr_data(TINY)
    info = data.info
    ranges = [set(range(lo, hi)) for lo, hi in info.regions]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not ranges[i] & ranges[j]
    for j, table in enumerate(info.tables):
        assert len(table) == 6 and set(table) <= ranges[j]
        x, y = stack_items(data.train[j])
        assert x.shape == y.shape == (8, info.seq_len) and x.dtype == y.dtype == torch.int64
        for xe, ye in zip(x, y):
            shown = presented(xe)
            assert len(shown) == 4 and all(table[k] == v for k, v in shown)
            asked = queries(xe, ye)
            assert len(asked) == 3 and len({k for k, _ in asked}) == 3
            assert all(table[k] == a and k in dict(shown) for k, a in asked)


def test_overlapping_regions_share_keys_with_the_same_values():
    info = icr_data({**TINY, "key_overlap": 0.5}).info
    (lo0, hi0), (lo1, hi1) = info.regions[:2]
    assert lo1 < hi0 and hi1 > hi0, "consecutive windows overlap and move on"
    shared = set(info.tables[0]) & set(info.tables[1])
    assert all(info.tables[0][k] == info.tables[1][k] for k in shared)


@pytest.mark.parametrize("cfg", [TINY, POSITIONAL], ids=["basic", "positional"])
def test_test_episodes_only_query_their_table(cfg):
    data = icr_data(cfg)
    info = data.info
    for i, table in enumerate(info.tables):
        x, y = stack_items(data.test[i])
        assert x.shape == (4, 1 + 2 * 3) == (4, info.test_seq_len)
        assert (x[:, 0] == SEP).all() and not (x[:, 1:] == SEP).any(), "no presentation before the queries"
        for xe, ye in zip(x, y):
            asked = queries(xe, ye)
            assert len({k for k, _ in asked}) == 3
            assert all(k in info.test_keys[i] and table[k] == a for k, a in asked)


def test_positional_answers_are_the_latest_binding_within_an_episode():
    data = icr_data(POSITIONAL)
    rebound_seen = 0
    for j, table in enumerate(data.info.tables):
        for xe, ye in zip(*stack_items(data.train[j])):
            shown = presented(xe)
            latest = dict(shown)                           # later pairs overwrite earlier ones
            twice = {k for k, _ in shown if sum(k == k2 for k2, _ in shown) == 2}
            assert len(twice) == 1
            first = {}
            for k, v in shown:
                first.setdefault(k, v)
            assert all(first[k] != latest[k] for k in twice), "the stale value differs"
            for k, a in queries(xe, ye):
                assert a == latest[k] == table[k]
                rebound_seen += k in twice
    assert rebound_seen == 3 * 8, "every rebound key is queried"


def test_positional_rebinding_across_experiences():
    data = icr_data(POSITIONAL)
    info = data.info
    assert info.rebound[0] == {}
    for j in (1, 2):
        assert len(info.rebound[j]) == 2
        for k, (old, new) in info.rebound[j].items():
            assert info.tables[j - 1][k] == old != new == info.tables[j][k]
            assert info.bindings_after(j - 1)[k] == old and info.bindings_after(j)[k] == new
            assert k not in info.test_keys[j - 1], "an earlier test never grades against a binding that changes"
            assert k in info.test_keys[j]
    asked = [qa for xe, ye in zip(*stack_items(data.test[1])) for qa in queries(xe, ye)]
    asked_new = [(k, a) for k, a in asked if k in info.rebound[1]]
    assert asked_new and all(a == info.rebound[1][k][1] for k, a in asked_new)
    final = info.bindings_after(2)
    for i in range(3):
        assert all(final[k] == info.tables[i][k] for k in info.test_keys[i]), "test labels are the latest binding"


def test_meta_train_draws_fresh_facts_from_the_whole_vocabulary():
    data = icr_data(TINY)
    x, y = stack_items(data.meta_train)
    assert x.shape == (16, data.info.seq_len)
    keys = {k for xe in x for k, _ in presented(xe)}
    width = data.info.regions[0][1] - data.info.regions[0][0]
    assert len(keys) > width and max(keys) - min(keys) > width
    # the same key has different values in different episodes: facts are fresh per episode
    values = {}
    for xe in x:
        for k, v in presented(xe):
            values.setdefault(k, set()).add(v)
    assert any(len(v) > 1 for v in values.values())
    other = stack_items(icr_data({**TINY, "meta_seed": 5}).meta_train)[0]
    assert not torch.equal(x, other) and torch.equal(x, stack_items(icr_data(TINY).meta_train)[0])


def test_seq_len_pads_with_unscored_pad():
    data = icr_data({**TINY, "seq_len": 20})
    x, y = stack_items(data.train[0])
    assert x.shape == (8, 20) and data.info.test_seq_len == 20
    assert (x[:, 15:] == PAD).all() and (y[:, 15:] == IGNORE).all()


def test_config_resolution():
    cfg = icr_config({"variant": "positional"})
    assert (cfg.rebind_within, cfg.rebind_across, cfg.meta_seed) == (2, 4, 0)
    assert icr_config(cfg) == cfg
    assert icr_config(None).rebind_across == 0


@pytest.mark.parametrize("user, words", [
    ({"n_kyes": 3}, "n_kyes"),
    ({"n_keys": "many"}, "n_keys"),
    ({"n_experiences": 0}, "n_experiences"),
    ({"variant": "fuzzy"}, "variant"),
    ({"n_keys": 20, "facts_per_experience": 6}, "more facts than keys"),
    ({"facts_per_episode": 13}, "facts_per_episode"),
    ({"queries_per_episode": 9}, "queries_per_episode"),
    ({"seq_len": 20}, "episode too short for its facts"),
    ({"rebind_within": 1}, "positional"),
    ({"variant": "positional", "key_overlap": 0.2}, "key_overlap"),
    ({"variant": "positional", "rebind_across": 7}, "rebind_across"),
    ({"variant": "positional", "test_queries": 9}, "test_queries"),
    ({"key_overlap": 1.0}, "key_overlap"),
])
def test_impossible_configs_raise_clear_errors(user, words):
    with pytest.raises(ValueError, match=words):
        icr_data(user)


@pytest.mark.parametrize("variant, E, D, B, digest", [("basic", 12, 7, 4, "d5121d8c5fed2172"),
                                                      ("positional", 9, 5, 3, "a3d14e9af3197d3a")])
def test_long_horizon_items_are_the_ones_earlier_code_drew(variant, E, D, B, digest):
    # Known answer: the sha256 of items 0-19 (tokens, labels, recalled mask) as drawn by the code that made
    # studies 17 and 23's meta-training sets, before the draw was rewritten to write items in place. A change
    # here changes every long-horizon meta-training set, and with it what earlier runs' records mean.
    from streams import icr

    assert meta_items_digest(icr._meta_block_items, variant=variant, n_keys=32, meta_sequence_episodes=E,
                             meta_reach_back=D, meta_block_episodes=B) == digest


def meta_items_digest(items, **options) -> str:
    """The sha256 (16 hex digits) of meta-training items 0-19 (every tensor ``items(cfg, length, i)``
    returns) of a small ICR config with ``options``."""
    import hashlib

    cfg = icr_config(dict(n_values=16, facts_per_experience=8, facts_per_episode=6, queries_per_episode=4,
                          meta_rebind_fraction=0.25, seed=11, **options))
    length = 2 * (6 + cfg.rebind_within) + 1 + 2 * 4
    h = hashlib.sha256()
    for i in range(20):
        for t in items(cfg, length, i):
            h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("variant, digest", [("basic", "78b2164d5d5caa09"), ("positional", "b704b493cb523ce3")])
def test_meta_sequence_items_are_the_ones_earlier_code_drew(variant, digest):
    # Known answer: the sha256 of items 0-19 of the episodes-in-a-row meta-training set (meta_sequence_episodes
    # > 1, no blocks: the continuous-key stream's) as drawn before the keys outside a window were taken by a
    # mask instead of np.setdiff1d (2026-12-06). A change here changes those meta-training sets.
    from streams import icr

    assert meta_items_digest(icr._meta_sequence_items, variant=variant, n_keys=512, meta_sequence_episodes=5,
                             meta_reach_back=3) == digest


def test_keys_outside_is_setdiff1d_of_the_key_space():
    from streams import icr

    rng = np.random.default_rng(0)
    for taken in ([], [2], [2, 3, 513], rng.choice(np.arange(2, 514), 40, replace=False).tolist()):
        want = np.setdiff1d(np.arange(2, 514), taken)
        got = icr._keys_outside(512, taken)
        assert got.dtype == np.int64 and np.array_equal(got, want)
