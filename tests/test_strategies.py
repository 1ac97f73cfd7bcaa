"""Strategies with persistent memory: state persistence, eval isolation, frozen weights, regularisers."""
import copy

import pytest
import torch
from torch.utils.data import TensorDataset

import ovq_cl.base.avalanche_compat  # noqa: F401
from avalanche.core import SupervisedPlugin
from avalanche.training.plugins import EvaluationPlugin

from ovq_cl import DecoderLM, model_config
from strategies.memory import PersistentMemoryPlugin
from strategies.evaluation.metrics import sequence_loss
from strategies.training.meta import meta_train
from strategies.evaluation.results import ResultMatrix
from strategies.regularizers import LanguageDistillationPlugin, SequenceEWCPlugin, SequenceReplayPlugin
from strategies.sequence import FrozenWeights, SequenceTemplate
from streams.common import StreamData, StreamInfo, to_benchmark
from streams.recall import IGNORE, SEP, RecallSpec, recall_batch

class LossCapture(SupervisedPlugin):
    """Records, after every backward, the loss minus the plain sequence loss (what plugins added)."""

    def __init__(self):
        super().__init__()
        self.extra = []

    def after_backward(self, strategy, **kwargs):
        total = float(strategy.loss.detach())
        self.extra.append(total - float(sequence_loss(strategy.mb_output, strategy.mb_y).detach()))


SPEC = RecallSpec(n_pairs=8, n_queries=8, n_keys=32, n_values=32)
LANES = 8


@pytest.fixture(scope="module")
def recall_model():
    """Full attention (no positions: the causal mask and the token shift are enough) meta-trained on
    single-episode recall. ~10 s."""
    torch.manual_seed(0)
    model = DecoderLM(model_config({"vocab_size": SPEC.vocab_size, "layers": ["full"], "mixers": {"full": {"rope": False}}}))
    x, y = recall_batch(SPEC, 32 * 60, torch.Generator().manual_seed(1))
    meta_train(model, TensorDataset(x, y, torch.zeros(len(x), dtype=torch.long)), steps=350, batch_size=32,
               lr=3e-3, metric="accuracy")
    return model.eval()


def facts_then_queries(seed=0):
    """Training experience: 4 minibatches of LANES lanes, each presenting 8 facts (32 distinct keys per
    lane over the 4 minibatches). Test experience: one minibatch querying the facts of minibatch 1."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.rand(LANES, SPEC.n_keys, generator=g).argsort(-1) + 2                 # [lanes, 32] distinct
    values = torch.randint(0, SPEC.n_values, (LANES, SPEC.n_keys), generator=g) + 2 + SPEC.n_keys
    train_x = []
    for m in range(4):
        k, v = keys[:, 8 * m: 8 * m + 8], values[:, 8 * m: 8 * m + 8]
        train_x.append(torch.stack([k, v], -1).flatten(1))                          # [lanes, 16]
    train_x = torch.cat(train_x)                                                     # item m*LANES + b
    train_y = torch.full_like(train_x, IGNORE)
    order = torch.randperm(8, generator=g)
    q, a = keys[:, :8][:, order], values[:, :8][:, order]
    test_x = torch.cat([torch.full((LANES, 1), SEP), torch.stack([q, a], -1).flatten(1)], 1)
    test_y = torch.full_like(test_x, IGNORE)
    test_y[:, 1::2] = a
    info = StreamInfo("handmade", "accuracy", 1, train_x.shape[1], test_x.shape[1], SPEC.vocab_size, None)
    data = StreamData([TensorDataset(train_x, train_y)], [TensorDataset(test_x, test_y)], None, info)
    return to_benchmark(data)


def run_frozen(model, policy):
    matrix = ResultMatrix("accuracy", 1)
    strategy = FrozenWeights(model=model, train_mb_size=LANES, plugins=[PersistentMemoryPlugin(policy)],
                             evaluator=EvaluationPlugin(matrix, loggers=[]))
    bench = facts_then_queries()
    strategy.train(bench.train_stream[0])
    return strategy, matrix, bench


def test_a_fact_from_minibatch_1_is_recalled_at_minibatch_5_only_with_persistent_state(recall_model):
    strategy, matrix, bench = run_frozen(recall_model, "persist")
    assert strategy.clock.train_exp_iterations == 4
    strategy.eval(bench.test_stream)
    recalled = matrix.R[0][0]
    strategy_reset, matrix_reset, bench_reset = run_frozen(recall_model, "reset_episode")
    strategy_reset.eval(bench_reset.test_stream)
    assert recalled > 0.8, recalled
    assert matrix_reset.R[0][0] < 0.2            # chance is 1/32: nothing to recall from a fresh state
    assert strategy.states[0].mixer.keys.shape[2] == 4 * 16    # the KV cache holds all 4 minibatches


def test_eval_leaves_the_carried_state_bitwise_unchanged(recall_model):
    strategy, _, bench = run_frozen(recall_model, "persist")
    before = [s.state_dict() for s in strategy.states]
    strategy.eval(bench.test_stream)
    strategy.eval(bench.train_stream)
    after = [s.state_dict() for s in strategy.states]
    for b, a in zip(before, after):
        assert b.keys() == a.keys()
        for key in b:
            assert torch.equal(b[key], a[key]), key


def test_frozen_weights_change_no_parameter_or_buffer():
    torch.manual_seed(0)
    model = DecoderLM(model_config({"vocab_size": SPEC.vocab_size, "layers": ["vq", "ovq"],
                                    "mixers": {"vq": {"codebook_size": 8, "chunk_size": 4}, "ovq": {"chunk_size": 4}}}))
    before = copy.deepcopy(model.state_dict())
    strategy, _, _ = run_frozen(model, "persist")
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert strategy.states[1].mixer.seen > 0          # ... while the OVQ memory did learn


def test_memory_policies():
    torch.manual_seed(0)
    model = DecoderLM(model_config({"vocab_size": SPEC.vocab_size, "layers": ["ovq"], "mixers": {"ovq": {"chunk_size": 4}}}))
    seen = {}
    for policy in ("persist", "reset_experience", "reset_episode"):
        strategy, _, bench = run_frozen(model, policy)
        strategy.train(bench.train_stream[0])          # a second pass over the experience
        seen[policy] = strategy.states[0].mixer.tokens_seen
    assert seen == {"persist": 8 * 16, "reset_experience": 4 * 16, "reset_episode": 16}
    with pytest.raises(ValueError, match="memory policy"):
        PersistentMemoryPlugin("forever")


def _two_experience_bench():
    from streams import icr_benchmark

    return icr_benchmark({"n_experiences": 2, "train_episodes": 16, "test_episodes": 8})


@pytest.mark.parametrize("plugin_name", ["naive", "ewc", "replay", "lwf"])
def test_weight_strategies_run_with_persistent_state(plugin_name):
    bench = _two_experience_bench()
    model = DecoderLM(model_config({"vocab_size": bench.info.vocab_size, "d_model": 32, "layers": ["ovq"],
                                    "mixers": {"ovq": {"chunk_size": 4, "num_slots": 16}}}))
    extra = {"naive": [], "ewc": [SequenceEWCPlugin(ewc_lambda=10.0)], "replay": [SequenceReplayPlugin(mem_size=8)],
             "lwf": [LanguageDistillationPlugin(alpha=1.0)]}[plugin_name]
    matrix = ResultMatrix("accuracy", 2)
    strategy = SequenceTemplate(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), train_mb_size=4,
                                plugins=[PersistentMemoryPlugin("persist"), *extra],
                                evaluator=EvaluationPlugin(matrix, loggers=[]))
    losses = []
    for exp in bench.train_stream:
        strategy.train(exp)
        losses.append(float(strategy.loss))
        strategy.eval(bench.test_stream)
    assert all(v is not None for v in matrix.R[1]) and all(torch.isfinite(torch.tensor(losses)))
    assert strategy.states[0].mixer.seen > 0
    if plugin_name == "replay":
        assert len(extra[0].storage.buffer) == 8
        assert strategy.clock.train_exp_iterations == (16 + 8) // 4      # the buffer joined the lanes
    if plugin_name == "ewc":
        assert extra[0].importances and any(float(imp.data.abs().sum()) > 0 for imp in extra[0].importances[0].values())
    if plugin_name == "lwf":
        assert extra[0].old_model is not None


def test_distillation_adds_a_loss_term_after_the_first_experience():
    bench = _two_experience_bench()
    torch.manual_seed(0)
    model = DecoderLM(model_config({"vocab_size": bench.info.vocab_size, "d_model": 32, "layers": ["full"]}))
    plugin, capture = LanguageDistillationPlugin(alpha=5.0, temperature=2.0), LossCapture()
    strategy = SequenceTemplate(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), train_mb_size=4,
                                plugins=[plugin, capture], evaluator=EvaluationPlugin(loggers=[]))
    strategy.train(bench.train_stream[0])
    assert all(abs(x) < 1e-6 for x in capture.extra)                   # no old model yet: no extra term
    with torch.no_grad():                                                # make the old model disagree
        for p in plugin.old_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    capture.extra.clear()
    strategy.train(bench.train_stream[1])
    assert capture.extra and all(x > 1e-4 for x in capture.extra)


def test_nan_loss_is_a_clear_error():
    bench = _two_experience_bench()
    model = DecoderLM(model_config({"vocab_size": bench.info.vocab_size, "d_model": 32, "layers": ["linear"]}))
    with torch.no_grad():
        model.embed.weight.fill_(float("nan"))
    strategy = SequenceTemplate(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train_mb_size=4,
                                evaluator=EvaluationPlugin(loggers=[]))
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        strategy.train(bench.train_stream[0])


def test_too_few_episodes_for_the_lanes_is_a_clear_error():
    bench = _two_experience_bench()
    model = DecoderLM(model_config({"vocab_size": bench.info.vocab_size, "d_model": 32, "layers": ["linear"]}))
    strategy = SequenceTemplate(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train_mb_size=64,
                                evaluator=EvaluationPlugin(loggers=[]))
    with pytest.raises(ValueError, match="fewer than train_mb_size"):
        strategy.train(bench.train_stream[0])


def test_ewc_adds_a_penalty_that_grows_as_weights_leave_the_old_optimum():
    bench = _two_experience_bench()
    torch.manual_seed(0)
    model = DecoderLM(model_config({"vocab_size": bench.info.vocab_size, "d_model": 32, "layers": ["ovq"],
                                    "mixers": {"ovq": {"chunk_size": 4}}}))
    ewc, capture = SequenceEWCPlugin(ewc_lambda=100.0), LossCapture()
    strategy = SequenceTemplate(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                train_mb_size=4, plugins=[ewc, capture], evaluator=EvaluationPlugin(loggers=[]))
    strategy.train(bench.train_stream[0])
    assert all(abs(x) < 1e-6 for x in capture.extra)                 # nothing to protect yet
    capture.extra.clear()
    strategy.train(bench.train_stream[1])
    assert capture.extra[0] == pytest.approx(0.0, abs=1e-6)          # still at the old optimum
    assert capture.extra[-1] > capture.extra[1] > 0                   # grows as the weights move


@pytest.mark.parametrize("fisher", ["per_sample", "minibatch"])
def test_ewc_fisher_is_the_mean_of_squared_per_episode_gradients(fisher):
    """Known answer: the per-sample estimate equals mean_i (grad of episode i's loss)^2, computed here one
    episode at a time; the minibatch estimate squares each minibatch's mean-loss gradient instead."""
    bench = _two_experience_bench()
    torch.manual_seed(0)
    model = DecoderLM(model_config({"vocab_size": bench.info.vocab_size, "d_model": 32, "layers": ["delta"],
                                    "mixers": {"delta": {"chunk_size": 4}}}))
    dataset = bench.train_stream[0].dataset
    plugin = SequenceEWCPlugin(ewc_lambda=1.0, fisher=fisher)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    got = plugin.compute_importances(model, None, opt, dataset, "cpu", batch_size=4)

    def grads(items):
        model.zero_grad()
        x = torch.stack([dataset[i][0] for i in items])
        y = torch.stack([dataset[i][1] for i in items])
        sequence_loss(model(x)[0], y).backward()
        return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    n = len(dataset)
    groups = [[i] for i in range(n)] if fisher == "per_sample" else [list(range(i, min(i + 4, n))) for i in range(0, n, 4)]
    expected = {}
    for g in groups:
        for name, grad in grads(g).items():
            expected[name] = expected.get(name, 0) + grad.pow(2) / len(groups)
    model.eval()
    for name, value in expected.items():
        torch.testing.assert_close(got[name].data, value, rtol=1e-4, atol=1e-10)
    if fisher == "per_sample":          # the minibatch estimate is smaller: averaging cancels gradient noise
        small = SequenceEWCPlugin(fisher="minibatch").compute_importances(model, None, opt, dataset, "cpu", batch_size=4)
        total = lambda imp: sum(float(v.data.sum()) for v in imp.values())
        assert total(small) < 0.7 * total(got)
