"""Forgetting, BWT and the forgetting curve: known answers, and Avalanche's own metrics as a cross-check."""
import math

import pytest
import torch

from strategies import forgetting as fg

R = [
    [0.9, 0.1, 0.0],
    [0.7, 0.8, 0.1],
    [0.8, 0.5, 0.6],
]


def test_known_answers():
    assert fg.forgetting(R, 0, 1) == pytest.approx(0.2)
    assert fg.forgetting(R, 0, 2) == pytest.approx(0.1)          # max over l in [0, 2) is R[0][0] = 0.9
    assert fg.forgetting(R, 1, 2) == pytest.approx(0.3)
    assert math.isnan(fg.forgetting(R, 2, 2))
    assert fg.average_forgetting(R) == pytest.approx((0.1 + 0.3) / 2)
    assert fg.backward_transfer(R) == pytest.approx(((0.8 - 0.9) + (0.5 - 0.8)) / 2)
    assert fg.learning_accuracy(R) == [0.9, 0.8, 0.6]
    assert fg.average_score(R) == pytest.approx((0.8 + 0.5 + 0.6) / 3)


def test_chaudhry_and_learning_based_forgetting_differ_when_a_score_recovers():
    """After a dip and a partial recovery the max-based definition looks at the best earlier score."""
    R2 = [[0.5, None, None], [0.9, 0.7, None], [0.6, 0.7, 0.8]]       # exp 0 improves after exp 1
    assert fg.forgetting(R2, 0, 2) == pytest.approx(0.3)
    assert fg.forgetting_from_learning(R2, 0, 2) == pytest.approx(-0.1)


def test_lower_is_better_flips_sign():
    mse = [[1.0, 9.0], [3.0, 2.0]]
    assert fg.forgetting(mse, 0, 1, higher_is_better=False) == pytest.approx(2.0)
    assert fg.backward_transfer(mse, higher_is_better=False) == pytest.approx(-2.0)


def test_forgetting_curve_uses_tokens_since_each_experience():
    rows = fg.forgetting_curve(R, tokens_after=[100, 250, 400])
    row = next(r for r in rows if r["evaluated_on"] == 0 and r["trained_on"] == 2)
    assert row["tokens_since"] == 300 and row["experiences_since"] == 2 and row["score"] == 0.8
    assert len(rows) == 6


def test_matches_avalanche_forgetting_and_bwt_on_a_classification_stream():
    """Where Avalanche's metrics apply ([B, C] outputs), our matrix gives Avalanche's numbers."""
    import strategies.avalanche_compat  # noqa: F401
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.utils import make_avalanche_dataset
    from avalanche.evaluation.metrics import bwt_metrics, forgetting_metrics
    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.training.supervised import Naive
    from torch.utils.data import TensorDataset

    from strategies.metrics import ResultMatrix

    g = torch.Generator().manual_seed(0)

    def task(shift):
        x = torch.randn(96, 6, generator=g)
        y = ((x[:, 0] + shift * x[:, 1]) > 0).long()
        ds = TensorDataset(x, y)
        ds.targets = y.tolist()
        return make_avalanche_dataset(ds)

    bench = benchmark_from_datasets(train=[task(0.0), task(-3.0), task(3.0)], test=[task(0.0), task(-3.0), task(3.0)])
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 2)
    matrix = ResultMatrix("accuracy", 3)
    evaluator = EvaluationPlugin(matrix, forgetting_metrics(experience=True), bwt_metrics(experience=True), loggers=[])
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), train_mb_size=16,
                     train_epochs=3, eval_mb_size=32, evaluator=evaluator)
    for exp in bench.train_stream:
        strategy.train(exp, shuffle=False)
        strategy.eval(bench.test_stream)
    metrics = evaluator.get_last_metrics()
    K = 3
    for i in range(K - 1):
        theirs = metrics[f"ExperienceForgetting/eval_phase/test_stream/Exp{i:03d}"]
        assert fg.forgetting_from_learning(matrix.R, i, K - 1) == pytest.approx(theirs, abs=1e-6)
        theirs_bwt = metrics[f"ExperienceBWT/eval_phase/test_stream/Exp{i:03d}"]
        assert -fg.forgetting_from_learning(matrix.R, i, K - 1) == pytest.approx(theirs_bwt, abs=1e-6)
    assert any(abs(fg.forgetting_from_learning(matrix.R, i, K - 1)) > 0.01 for i in range(K - 1))  # not vacuous
