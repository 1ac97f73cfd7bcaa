"""Each stream as an Avalanche benchmark: task labels, (x, y, t) items, a Naive step; same tensors in a subprocess."""
import os
import pickle
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import ovq_cl.base.avalanche_compat  # noqa: F401  (before any avalanche import)
from avalanche.core import SupervisedPlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.supervised import Naive

from streams import IGNORE, scored_mask, stack_items, stream_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = {
    "icr": dict(n_experiences=2, n_keys=16, n_values=8, facts_per_experience=6, facts_per_episode=4,
                queries_per_episode=2, train_episodes=8, test_episodes=4, test_queries=2, meta_train_episodes=8),
    "icr-positional": dict(variant="positional", n_experiences=2, n_keys=16, n_values=8, facts_per_experience=6,
                           facts_per_episode=4, queries_per_episode=2, rebind_within=1, rebind_across=2,
                           train_episodes=8, test_episodes=4, test_queries=2, meta_train_episodes=8),
    "icl": dict(n_experiences=2, d_x=2, d_y=1, examples_per_episode=4, queries_per_episode=2, train_episodes=8,
                test_episodes=4, test_queries=3, meta_train_episodes=8),
    "icl-tokens": dict(encoding="tokens", n_experiences=2, d_x=2, d_y=1, examples_per_episode=4, n_bins=8,
                       queries_per_episode=2, train_episodes=8, test_episodes=4, test_queries=3, meta_train_episodes=8),
    "text": dict(domains=["prose", "code"], seq_len=16, train_episodes=8, test_episodes=4, max_bytes=20_000,
                 block_bytes=512),
}


class TinyLM(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, 8), nn.Linear(8, vocab)

    def forward(self, x):                     # [B, T] -> [B, T, V]
        return self.head(self.embed(x))


def token_loss(out, y):                       # out [B, T, V], y [B, T]
    return F.cross_entropy(out.flatten(0, 1), y.flatten(), ignore_index=IGNORE)


def masked_mse(out, y):                       # out, y [B, T, d]; select before subtracting (y is NaN elsewhere)
    mask = scored_mask(y)
    return F.mse_loss(out[mask], y[mask])


class Record(SupervisedPlugin):
    def __init__(self):
        super().__init__()
        self.train, self.eval = [], []

    def after_training_iteration(self, strategy, **kw):
        self.train.append((strategy.mb_x.detach().clone(), strategy.mb_task_id.tolist(), float(strategy.loss.detach())))

    def after_eval_iteration(self, strategy, **kw):
        self.eval.append((tuple(strategy.mb_x.shape), strategy.mb_task_id.tolist(), float(strategy.loss.detach())))


@pytest.mark.filterwarnings("ignore:No loggers specified")
@pytest.mark.parametrize("name", list(TINY))
def test_benchmark_plugs_into_a_naive_run(name):
    bench = stream_benchmark(name.split("-")[0], TINY[name])
    info = bench.info
    assert len(bench.train_stream) == len(bench.test_stream) == info.n_experiences == 2
    for stream in (bench.train_stream, bench.test_stream):
        for j, exp in enumerate(stream):
            assert exp.task_label == j and exp.task_labels == [j]
            x, y, t = exp.dataset[0]
            T = info.seq_len if stream is bench.train_stream else info.test_seq_len
            assert t == j and x.shape[0] == y.shape[0] == T
    if bench.meta_train is not None:
        assert bench.meta_train[0][2] == 0 and bench.meta_train[0][0].shape[0] == info.seq_len

    if info.vocab_size is None:
        model, criterion = nn.Linear(info.d_in, info.d_out), masked_mse
    else:
        model, criterion = TinyLM(info.vocab_size), token_loss
    record = Record()
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), criterion=criterion,
                     train_mb_size=4, train_epochs=1, eval_mb_size=4, evaluator=EvaluationPlugin(loggers=[]),
                     plugins=[record])
    strategy.train(bench.train_stream[1], shuffle=False)
    strategy.eval(bench.test_stream[:1])
    assert len(record.train) == 2 and all(t == [1] * 4 for _, t, _ in record.train)
    first = torch.stack([bench.train_stream[1].dataset[i][0] for i in range(4)])
    assert torch.equal(record.train[0][0], first), "an unshuffled loader streams the episodes in order"
    assert all(torch.isfinite(torch.tensor(loss)) for _, _, loss in record.train + record.eval)
    assert [t for _, t, _ in record.eval] == [[0] * 4]


def test_episode_datasets_pickle():
    for name in ("icr", "icl", "text"):
        data = stream_benchmark(name, TINY[name])
        ds = data.train_stream[0].dataset
        again = pickle.loads(pickle.dumps(ds))
        assert all(torch.equal(a.nan_to_num(0), b.nan_to_num(0)) for a, b in zip(ds[3][:2], again[3][:2]))


DIGEST = """
import hashlib
from streams.common import stack_items
from streams.icl import icl_data
from streams.icr import icr_data
from streams.text import text_data

def digest():
    h = hashlib.sha256()
    for data in (icr_data({"variant": "positional", "meta_train_episodes": 64}),
                 icl_data({"meta_train_episodes": 64}), icl_data({"encoding": "tokens", "meta_train_episodes": 64}),
                 text_data({"max_bytes": 50000, "block_bytes": 512})):
        for d in list(data.train) + list(data.test) + ([data.meta_train] if data.meta_train is not None else []):
            for t in stack_items(d):
                h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()
"""


def test_same_tensors_in_another_process():
    scope = {}
    exec(DIGEST, scope)
    here = scope["digest"]()
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", DIGEST + "\nprint(digest())"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == here


def test_stack_items_shapes():
    data = stream_benchmark("icr", TINY["icr"])
    x, y = stack_items(data.test_stream[1].dataset)
    assert x.shape == y.shape == (4, data.info.test_seq_len)
