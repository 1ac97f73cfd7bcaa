"""The position curve: bits per byte against the position in a long held-out document, with known
answers from oracle models, and the text stream's long held-out span."""
import math

import pytest
import torch

from streams import text_data
from strategies.evaluation.position import PositionCurve, measure_position_curve, position_edges
from experiments.probes.position import position_paired_table, position_table


class CopyAfter(torch.nn.Module):
    """Predicts the byte ``period`` positions back with certainty once it has read that far, uniform
    before: on a text of period ``period`` it is right at every position >= period. Carries its window."""

    def __init__(self, period: int):
        super().__init__()
        self.period = period

    def forward(self, x, states=None):
        seen = x if states is None else torch.cat([states[0], x], 1)
        B, T = x.shape
        out = torch.zeros(B, T, 256)
        offset = seen.shape[1] - T
        for t in range(T):
            p = offset + t + 1 - self.period            # the next byte equals seen[p] on a periodic text
            if p >= 0:
                out[torch.arange(B), t, seen[:, p]] = 50.0
        return out, [seen]


def _periodic(n_docs, length, period):
    base = torch.randint(0, 256, (n_docs, period), generator=torch.Generator().manual_seed(0))
    text = base.repeat(1, length // period + 2)
    return [(text[i, :length], text[i, 1:length + 1]) for i in range(n_docs)]


def test_edges_and_known_answers_of_a_copying_memory_and_a_uniform_model():
    assert position_edges(16384) == [0, 64, 256, 1024, 4096, 16384]
    assert position_edges(100) == [0, 64, 100]
    docs = _periodic(3, 1024, 200)
    curve = measure_position_curve(CopyAfter(200), docs, 1024, chunk=100, batch_size=2)
    bits = [b.bits_per_byte for b in curve.buckets]
    assert [(b.lo, b.hi) for b in curve.buckets] == [(0, 64), (64, 256), (256, 1024)]
    assert bits[0] == pytest.approx(8.0, abs=1e-3), "uniform over 256 bytes before it has read a period"
    assert bits[2] == pytest.approx(0.0, abs=1e-3), "certain and right after it"
    assert 0 < bits[1] < 8 and curve.buckets[0].documents == 3
    same = measure_position_curve(CopyAfter(200), docs, 1024, chunk=1024, batch_size=3)
    assert [b.bits_per_byte for b in same.buckets] == pytest.approx(bits), "chunking changes nothing"
    assert PositionCurve.from_dict(curve.as_dict()) == curve


def test_the_text_streams_long_span_is_held_out_whole():
    plain = text_data({"domains": ["prose", "code"]})
    data = text_data({"domains": ["prose", "code"], "long_bytes": 20000})
    for d0, d in zip(plain.info.domains, data.info.domains):
        assert len(d.long_text) == 20000 and d.n_bytes == d0.n_bytes - 20000
        assert d.long_text not in d.train_text and d.long_text[:512] not in d.test_text
    docs = data.position_probe(1, 4096, 3)
    x, y = docs[2]
    assert x.shape == y.shape == (4096,) and torch.equal(x[1:], y[:-1])
    with pytest.raises(ValueError, match="set stream.options.long_bytes"):
        plain.position_probe(0, 4096, 1)
    assert plain.info.domains[0].train_text == text_data({"domains": ["prose", "code"]}).info.domains[0].train_text


def test_a_run_logs_position_curves_per_domain(tmp_path):
    from experiments import compare
    from experiments.config import run_config
    from experiments.runner import run

    base = {"stream": {"name": "text", "options": {"domains": ["prose", "code"], "seq_len": 32, "lanes": 2,
                                                   "train_episodes": 4, "test_episodes": 2, "long_bytes": 3000}},
            "model": {"d_model": 16, "n_layers": 2, "n_heads": 2, "layers": ["swa", "ovq"],
                      "mixers": {"ovq": {"num_slots": 8, "chunk_size": 8}, "swa": {"window": 16}}},
            "strategy": {"name": "naive", "train_mb_size": 2}, "meta_train": {"steps": 0},
            "tracking": {"enabled": False}, "checkpoint": {"enabled": False}, "output_dir": str(tmp_path)}
    cfg = run_config({**base, "gate": {"position_length": 300, "position_episodes": 2, "position_chunk": 64}})
    result = run(cfg)
    curves = result.probes["position"]["curves"]
    assert list(curves) == ["prose", "code"] and [b["hi"] for b in curves["prose"]["buckets"]] == [64, 256, 300]
    assert all(math.isfinite(b["bits_per_byte"]) for c in curves.values() for b in c["buckets"])
    table = position_table([compare.record_from_json(result.record())])
    assert "| prose | 1 |" in table and "[256, 300)" in table
    assert run_config(base).identity() == run_config({**base, "gate": {"position_length": 0}}).identity()
    with pytest.raises(ValueError, match="gate.position_length"):
        run(run_config({**base, "gate": {"position_length": 5000}}))


def test_the_last_bucket_is_paired_against_the_baseline():
    from experiments import compare

    def record(layers, seed, last):
        return compare.RunRecord(
            label=f"{layers}-s{seed}", params={"model.layers": f"['{layers}']"}, metric="bits_per_byte", summary={},
            seed=seed, data_seed=seed,
            probes={"position": {"curves": {"prose": {"buckets": [{"lo": 0, "hi": 64, "bits_per_byte": 5.0, "standard_error": 0.1,
                                                        "documents": 8},
                                                       {"lo": 64, "hi": 300, "bits_per_byte": last, "standard_error": 0.1,
                                                        "documents": 8}]}}}})

    records = [record("swa+ovq", s, 2.0 + 0.01 * s) for s in range(4)] + [record("swa", s, 2.5 + 0.02 * s) for s in range(4)]
    records += [record("vq", s, 2.25 + 0.01 * s) for s in range(4)]       # +0.25 on every pair: no t-test
    table = position_paired_table(records, "swa+ovq")
    row = next(line for line in table.splitlines() if "swa']" in line and "prose" in line)
    assert "| [64, 300) | 4 | +0.515 [" in row            # 0.5 + 0.01 * mean(s)
    flat = next(line for line in table.splitlines() if "vq']" in line and "prose" in line)
    assert "| +0.250 [" in flat and "| - | - |" in flat and "nan" not in flat
