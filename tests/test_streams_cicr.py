"""Continuous-key ICR: the encoding of ICR's facts as key vectors from regions meta-training never
covered; known answers with a perfect memory and a codebook-only memory fitted in meta-training."""
import math

import numpy as np
import pytest
import torch

from ovq_cl.base import IGNORE
from streams import cicr_data, icr_data, stream_benchmark
from streams.cicr import cicr_config, describe_episode

OPTIONS = {"n_experiences": 4, "n_keys": 64, "facts_per_experience": 16, "train_episodes": 32}


def _read_pairs(x, y, d_key, key_of):
    """Walks an encoded item like a memory: (key, value) pairs bind, a scored query asks its key."""
    for t in range(x.shape[0] - 1):
        if float(x[t, :d_key].abs().sum()) > 0 and x[t + 1, -1] == 1:
            yield key_of(x[t, :d_key]), int(x[t + 1, d_key:-2].argmax()), (None if int(y[t]) == IGNORE else int(y[t]))


def _accuracy(dataset, d_key, key_of):
    right = n = 0
    for i in range(len(dataset)):
        x, y = dataset[i]
        memory = {}
        for key, value, asked in _read_pairs(x, y, d_key, key_of):
            if asked is not None:
                n += 1
                right += memory.get(key) == asked
            memory[key] = value
    return right / n


def test_the_encoding_carries_icrs_facts_and_labels():
    data, tokens = cicr_data(OPTIONS), icr_data(OPTIONS)
    d_key = data.info.config.d_key
    for j in (0, 3):
        for i in (0, 5):
            x, y = data.train[j][i]
            xt, yt = tokens.train[j][i]
            assert x.shape == (len(xt), data.info.d_in) and y.shape == yt.shape
            keys = (xt >= 2) & (xt < 66)
            assert torch.equal(data.info.key_tokens(x)[keys], xt[keys]), "each key token has one vector"
            assert torch.allclose(x[keys, :d_key].norm(dim=-1), torch.ones(int(keys.sum())))
            assert torch.equal(y[yt != IGNORE], yt[yt != IGNORE] - 66) and bool((y[yt == IGNORE] == IGNORE).all())
    printed = describe_episode(*data.train[0][0], data.info)
    assert printed[16].split()[1] == "SEP" and "-> v" in printed[17]


@pytest.mark.parametrize("shift", [0, 45])
def test_no_stream_key_is_a_vector_meta_training_drew_even_from_its_own_region(shift):
    # at 90 degrees the regions are far apart and this cannot fail; at 0 (study 22's setting) the stream
    # draws from meta-training's own cap, and only distinct random numbers keep the vectors apart
    data = cicr_data({**OPTIONS, "shift_degrees": shift})
    d_key = data.info.config.d_key
    meta = torch.cat([data.meta_train[i][0][:, :d_key] for i in range(len(data.meta_train))])
    meta = meta[meta.abs().sum(-1) > 0]
    keys = data.info.key_vectors
    assert float((meta @ keys.T).max()) < 0.999
    if shift == 0:   # the same region: as close as two independent draws from one cap are
        assert float((meta @ data.info.centers[0]).mean()) > 0.8 and float((keys @ data.info.centers[0]).mean()) > 0.8


def test_a_memory_that_persists_across_episodes_answers_the_test_episodes_from_the_stream_alone():
    """Test episodes present nothing (``SEP q ...``): a memory that keeps every pair the training episodes
    of experiences 0..j bound (the newest value per key vector) answers experience j's test queries, scored
    against the facts in force, perfectly; one that keeps only the last training episode does not."""
    data = cicr_data({**OPTIONS, "rebind_fraction": 0.25, "test_rebound_keys": True})
    d_key = data.info.config.d_key
    key_of = lambda v: tuple(v.tolist())
    memory: dict = {}
    for j in range(4):
        last: dict = {}
        for i in range(len(data.train[j])):
            last = {}
            for key, value, _ in _read_pairs(*data.train[j][i], d_key, key_of):
                memory[key] = last[key] = value
        right = {"all": [0, 0], "last episode": [0, 0]}
        for i in range(len(data.test[j])):
            x, y = data.test[j][i]
            y = data.info.labels_in_force(j, j, x[None], y[None])[0]
            for key, _, asked in _read_pairs(x, y, d_key, key_of):
                if asked is not None:
                    for name, m in (("all", memory), ("last episode", last)):
                        right[name][0] += m.get(key) == asked
                        right[name][1] += 1
        assert right["all"][0] == right["all"][1] > 0, (j, right)
        assert right["last episode"][0] < right["last episode"][1], (j, right)


def test_stream_keys_come_from_shifted_regions_and_meta_training_draws_fresh_keys():
    data = cicr_data({**OPTIONS, "shift_degrees": 90})
    info = data.info
    keys, centers = info.key_vectors, info.centers
    for j, (lo, hi) in enumerate(info.icr.regions):
        cos = keys[lo - 2: hi - 2] @ centers.T
        assert int(cos.argmax(-1).eq(1 + j).sum()) == hi - lo, "a key is nearest its own experience's centre"
        assert float(cos[:, 0].abs().max()) < 0.6, "far from meta-training's region"
    a, b = data.meta_train[0][0], data.meta_train[1][0]
    d_key = info.config.d_key
    ka, kb = a[:, :d_key][a[:, :d_key].abs().sum(-1) > 0], b[:, :d_key][b[:, :d_key].abs().sum(-1) > 0]
    assert float((ka @ centers[0]).mean()) > 0.8 and float((kb @ centers[0]).mean()) > 0.8
    assert float((ka @ kb.T).max()) < 0.999, "no key vector of one meta-training item recurs in another"
    assert float((ka @ keys.T).max()) < 0.999, "nor is any stream key"
    again = data.meta_train[0][0]
    assert torch.equal(a, again), "items are pure functions of their index"


def test_a_codebook_fitted_in_meta_training_fails_shifted_keys_and_a_perfect_memory_does_not():
    """A memory that quantises keys to a codebook of meta-training keys (64 codes) and keeps one value per
    code answers the meta-training region's keys well; on keys of a region it never saw, many keys share
    a code and it fails. A memory that matches the key vector itself is perfect on both."""
    scores = {}
    for shift in (0, 90):
        data = cicr_data({**OPTIONS, "shift_degrees": shift})
        d_key = data.info.config.d_key
        meta = torch.cat([data.meta_train[i][0][:, :d_key] for i in range(40)])
        meta = meta[meta.abs().sum(-1) > 0]
        codes = meta[torch.randperm(len(meta), generator=torch.Generator().manual_seed(0))[:64]]
        perfect = [_accuracy(data.train[j], d_key, lambda v: tuple(v.tolist())) for j in range(4)]
        codebook = [_accuracy(data.train[j], d_key, lambda v: int((codes @ v).argmax())) for j in range(4)]
        assert perfect == [1.0] * 4
        scores[shift] = float(np.mean(codebook))
    assert scores[0] > 0.8 and scores[90] < 0.5, scores


def test_facts_in_force_follow_the_rebound_key_vectors():
    options = {**OPTIONS, "rebind_fraction": 0.25, "test_rebound_keys": True, "test_queries": 8}
    data, tokens = cicr_data(options), icr_data(options)
    assert data.info.facts_change
    for exp, after in ((0, 1), (1, 3), (2, 2)):
        xs, ys = map(torch.stack, zip(*[data.test[exp][i] for i in range(4)]))
        xt, yt = map(torch.stack, zip(*[tokens.test[exp][i] for i in range(4)]))
        expected = tokens.info.labels_in_force(exp, after, xt, yt)
        got = data.info.labels_in_force(exp, after, xs, ys)
        scored = yt != IGNORE
        assert torch.equal(got[scored], expected[scored] - 66)
        changed = expected[scored] != yt[scored]
        assert after == exp or bool(changed.any()) == bool((got[scored] != ys[scored]).any())


def test_continuous_values_are_vectors_scored_by_mse_and_the_probes_encode():
    data = cicr_data({**OPTIONS, "values": "continuous", "d_value": 8})
    x, y = data.train[1][2]
    assert data.info.metric == "mse" and data.info.d_out == 8 and y.shape == (x.shape[0], 8)
    scored = ~torch.isnan(y).any(-1)
    assert int(scored.sum()) == data.info.config.queries_per_episode
    assert torch.allclose(y[scored].norm(dim=-1), torch.ones(int(scored.sum())))
    for probe in (data.delay_probe(2, 3), data.interference_probe("other_region", 4, 3), data.capacity_probe(8, 3)):
        px, py = probe[1]
        assert px.shape[-1] == data.info.d_in and py.shape == (px.shape[0], 8)
    bench = stream_benchmark("cicr", OPTIONS)
    assert len(bench.train_stream) == 4 and bench.info.name == "cicr"


@pytest.mark.parametrize("options, message", [
    ({"d_key": 4}, "d_key=4 must be >= n_experiences + 1"),
    ({"shift_degrees": 200}, "shift_degrees must be in [0, 180]"),
    ({"values": "tokens"}, "values must be one of"),
    ({"key_spread": -1}, "key_spread must be > 0"),
    ({"key_spread": 0}, "key_spread must be > 0"),
    ({"facts_per_episode": 40}, "facts_per_episode=40 exceeds the table size"),
])
def test_bad_options_get_one_line(options, message):
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        cicr_config({**OPTIONS, **options})


def test_a_run_on_the_continuous_key_stream(tmp_path):
    """End to end: a RegressionLM (continuous input, one logit per value) meta-trains, runs the stream
    and scores R; a memory that learned nothing is at chance (1/32), so R is a probability."""
    from experiments.config import run_config
    from experiments.runner import run

    cfg = run_config({
        "stream": {"name": "cicr", "options": {"n_experiences": 2, "n_keys": 16, "facts_per_experience": 6,
                                               "facts_per_episode": 4, "queries_per_episode": 2, "test_queries": 3,
                                               "train_episodes": 8, "test_episodes": 4, "meta_train_episodes": 32,
                                               "d_key": 8}},
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "layers": ["ovq"], "mixers": {"ovq": {"num_slots": 8, "chunk_size": 4}}},
        "strategy": {"name": "frozen", "train_mb_size": 4}, "meta_train": {"steps": 3, "batch_size": 8},
        "gate": {"interference": ["neutral", "other_region"], "interference_max_items": 2, "capacity_facts": [2, 4],
                 "episodes": 8, "interference_episodes": 2},
        "tracking": {"enabled": False}, "checkpoint": {"enabled": False}, "output_dir": str(tmp_path)})
    result = run(cfg)
    assert len(result.R) == 2 and all(0.0 <= v <= 1.0 for row in result.R for v in row if v is not None)
    assert set(result.probes["interference"]["curves"]) == {"neutral", "other_region"}
    assert math.isfinite(result.summary["final_average"])


def test_random_meta_regions_cover_many_directions_and_keep_away_from_the_streams():
    """``meta_regions: random``: each meta-training item draws its keys around a centre of its own, at
    least ``meta_exclusion_degrees`` from every experience's centre. Its keys scatter over the sphere (the
    key projection must learn every direction) and none comes near a stream region; a codebook fitted on
    them spreads its codes over every direction, so keys of one stream region share codes: within-episode
    recall 0.53 here (8 facts an episode, 64 codes), far below the 0.8+ of a codebook fitted on the stream's
    own cap (shift 0, one region); a memory of the vectors themselves is perfect."""
    data = cicr_data({**OPTIONS, "shift_degrees": 90, "meta_regions": "random"})
    d_key, centers = data.info.config.d_key, data.info.centers
    items = [data.meta_train[i][0][:, :d_key] for i in range(40)]
    items = [k[k.abs().sum(-1) > 0] for k in items]
    item_centres = torch.stack([torch.nn.functional.normalize(k.mean(0), dim=0) for k in items])
    assert float((item_centres @ centers[1:].T).max()) < np.cos(np.deg2rad(60)) + 0.15   # the cap's own spread
    off_diagonal = (item_centres @ item_centres.T)[~torch.eye(len(items), dtype=torch.bool)]
    assert float(off_diagonal.abs().mean()) < 0.4, "centres spread over the sphere, not one cap"
    meta = torch.cat(items)
    codes = meta[torch.randperm(len(meta), generator=torch.Generator().manual_seed(0))[:64]]
    codebook = [_accuracy(data.train[j], d_key, lambda v: int((codes @ v).argmax())) for j in range(4)]
    perfect = [_accuracy(data.train[j], d_key, lambda v: tuple(v.tolist())) for j in range(4)]
    same_cap = cicr_data({**OPTIONS, "shift_degrees": 0})
    fitted = torch.cat([same_cap.meta_train[i][0][:, :d_key] for i in range(40)])
    fitted = fitted[fitted.abs().sum(-1) > 0]
    fitted = fitted[torch.randperm(len(fitted), generator=torch.Generator().manual_seed(0))[:64]]
    covered = [_accuracy(same_cap.train[j], d_key, lambda v: int((fitted @ v).argmax())) for j in range(4)]
    assert perfect == [1.0] * 4 and float(np.mean(codebook)) < float(np.mean(covered)) - 0.2, (codebook, covered)
    # the default draws every item from m0's cap, as before (the same items: no extra random numbers)
    one, default = cicr_data({**OPTIONS, "meta_regions": "one"}), cicr_data(OPTIONS)
    assert torch.equal(one.meta_train[3][0], default.meta_train[3][0])


@pytest.mark.parametrize("options, message", [({"meta_regions": "many"}, "meta_regions must be one of"),
                                              ({"meta_exclusion_degrees": 90}, r"meta_exclusion_degrees must be in \[0, 90\)")])
def test_bad_meta_region_options_get_one_line(options, message):
    with pytest.raises(ValueError, match=message):
        cicr_data({**OPTIONS, **options})


def test_random_region_meta_training_items_are_the_ones_earlier_code_drew():
    # Known answer: the sha256 of meta-training items 0-19 (vectors and labels) of a random-region stream, as
    # drawn by the code that made studies 24, 27 and 28's meta-training sets (before 2026-12-06's faster key
    # draw, which must draw the same numbers). A change here changes what those studies meta-trained on.
    import hashlib

    bench = stream_benchmark("cicr", dict(n_experiences=4, n_keys=1024, facts_per_experience=16, facts_per_episode=8,
                                          queries_per_episode=4, train_episodes=4, test_episodes=2,
                                          meta_sequence_episodes=4, meta_reach_back=3, meta_rebind_fraction=0.25,
                                          shift_degrees=90, meta_regions="random", meta_train_episodes=64, seed=5))
    source = getattr(bench, "meta_train_episodes", bench.meta_train)
    h = hashlib.sha256()
    for i in range(20):
        for t in source[i][:2]:
            h.update(t.numpy().tobytes())
    assert h.hexdigest()[:16] == "7a384db5aab11ed4"
