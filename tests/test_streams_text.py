"""Text stream: determinism, held-out text disjoint from training text, lanes, domains, errors."""
import pytest
import torch

from streams.common import stack_items
from streams.text import text_data

TINY = dict(seq_len=32, train_episodes=8, test_episodes=4, max_bytes=60_000, block_bytes=512)


def all_tensors(data):
    return [t for d in list(data.train) + list(data.test) for t in stack_items(d)]


@pytest.fixture(scope="module")
def default_data():
    return text_data(TINY)


def test_default_domains_load_and_differ(default_data):
    info = default_data.info
    assert [d.name for d in info.domains] == ["prose", "code", "tables"]
    assert info.vocab_size == 256 and info.metric == "bits_per_byte" and info.seq_len == info.test_seq_len == 32
    texts = [d.train_text for d in info.domains]
    assert b"def " in texts[1] and b"0x" in texts[2] and b" the " in texts[0]
    freq = [torch.bincount(torch.tensor(list(t)), minlength=256).double() / len(t) for t in texts]
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert (freq[a] - freq[b]).abs().sum() / 2 > 0.1, "byte distributions differ (total variation)"


def test_same_seed_same_tensors_other_seed_different(default_data):
    a, b = all_tensors(default_data), all_tensors(text_data(TINY))
    c = all_tensors(text_data({**TINY, "seed": 2}))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not all(torch.equal(u, v) for u, v in zip(a, c))


def test_held_out_blocks_are_disjoint_from_training_blocks(default_data):
    for j, dom in enumerate(default_data.info.domains):
        n_blocks = -(-dom.n_bytes // 512)
        assert not set(dom.train_blocks) & set(dom.test_blocks)
        assert sorted(dom.train_blocks + dom.test_blocks) == list(range(n_blocks))
        assert len(dom.test_blocks) == round(0.1 * n_blocks)
        for split, text, starts in ((default_data.train[j], dom.train_text, dom.train_starts),
                                    (default_data.test[j], dom.test_text, dom.test_starts)):
            x, y = stack_items(split)
            assert x.dtype == y.dtype == torch.int64 and x.shape[1] == 32
            assert torch.equal(x[:, 1:], y[:, :-1]), "labels are the next byte"
            for xe, ye, s in zip(x, y, starts):
                assert bytes(xe.tolist()) + bytes([ye[-1]]) == text[s: s + 33]


def test_training_and_held_out_texts_are_made_of_their_own_blocks(tmp_path):
    body = bytes(range(256)) * 40                           # 10240 bytes: 20 blocks of 512, every block distinct
    (tmp_path / "a.txt").write_bytes(body)
    data = text_data({**TINY, "domains": [str(tmp_path / "a.txt")], "test_fraction": 0.25})
    dom = data.info.domains[0]
    blocks = [body[b * 512: (b + 1) * 512] for b in range(20)]
    assert dom.train_text == b"".join(blocks[b] for b in dom.train_blocks)
    assert dom.test_text == b"".join(blocks[b] for b in dom.test_blocks)
    assert len(dom.test_blocks) == 5


def test_lanes_read_contiguous_text():
    data = text_data({**TINY, "lanes": 4})
    x, y = stack_items(data.train[1])
    L = 4
    for b in range(L):
        lane_x, lane_y = x[b::L], y[b::L]
        assert torch.equal(lane_x[1:, 0], lane_y[:-1, -1]), "window k+1 starts where window k's inputs end"
        starts = data.info.domains[1].train_starts[b::L]
        assert all(s2 - s1 == 32 for s1, s2 in zip(starts, starts[1:]))


def test_split_does_not_depend_on_domain_order(default_data):
    swapped = text_data({**TINY, "domains": ["tables", "prose"]}).info.domains
    assert swapped[1].test_blocks == default_data.info.domains[0].test_blocks
    assert swapped[0].test_starts == default_data.info.domains[2].test_starts


def test_user_directories_and_meta_domains(tmp_path):
    for name, text in (("one", "alpha beta gamma\n" * 300), ("two", "0,1,2,3\n" * 600), ("meta", "zzz yyy\n" * 200)):
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "sub" / "t.txt").write_text(text)
        (tmp_path / name / "skip.bin").write_bytes(b"\0" * 1000)
    dirs = [str(tmp_path / n) for n in ("one", "two")]
    data = text_data({**TINY, "domains": dirs, "meta_domains": [str(tmp_path / "meta")], "meta_train_episodes": 5})
    assert [d.n_files for d in data.info.domains] == [1, 1]
    assert b"\0" not in data.info.domains[0].train_text
    x, y = stack_items(data.meta_train)
    assert x.shape == (5, 32) and set(bytes(x.flatten().tolist())) <= set(b"zy \n")
    assert text_data({**TINY, "domains": dirs}).meta_train is None


@pytest.mark.parametrize("make, words", [
    (lambda p: {"domains": [str(p / "nowhere")]}, "nowhere"),
    (lambda p: {"domains": ["prose", str(p / "empty.txt")]}, "empty.txt.*is empty"),
    (lambda p: {"domains": [str(p / "bins")]}, "no files with suffixes"),
    (lambda p: {"domains": [str(p / "small.txt")]}, "small.txt"),
    (lambda p: {"domains": []}, "domains"),
    (lambda p: {"domains": ["prose", "prose"]}, "twice"),
    (lambda p: {"meta_domains": ["code"]}, "meta_domains"),
    (lambda p: {"train_episodes": 6, "lanes": 4}, "lanes"),
    (lambda p: {"test_fraction": 0.0}, "test_fraction"),
    (lambda p: {"seq_len": "long"}, "seq_len"),
    (lambda p: {"domain": ["prose"]}, "domain"),
])
def test_impossible_configs_raise_clear_errors(tmp_path, make, words):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "small.txt").write_bytes(b"x" * 300)
    (tmp_path / "bins").mkdir()
    (tmp_path / "bins" / "data.bin").write_bytes(b"x" * 2000)
    with pytest.raises(ValueError, match=words):
        text_data({**TINY, **make(tmp_path)})
