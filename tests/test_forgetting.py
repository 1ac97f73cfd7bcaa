"""Forgetting, BWT and the forgetting curve: known answers, and Avalanche's own metrics as a cross-check."""
import math

import pytest
import torch

from strategies.evaluation import forgetting as fg

R = [
    [0.9, 0.1, 0.0],
    [0.7, 0.8, 0.1],
    [0.8, 0.5, 0.6],
]


def test_known_answers():
    assert fg.forgetting_max(R, 0, 1) == pytest.approx(0.2)
    assert fg.forgetting_max(R, 0, 2) == pytest.approx(0.1)          # max over l in [0, 2) is R[0][0] = 0.9
    assert fg.forgetting_max(R, 1, 2) == pytest.approx(0.3)
    assert math.isnan(fg.forgetting_max(R, 2, 2))
    assert fg.average_forgetting_max(R) == pytest.approx((0.1 + 0.3) / 2)
    assert fg.average_forgetting_learned(R) == pytest.approx((0.1 + 0.3) / 2)   # R[0][0] is the max here
    assert fg.backward_transfer(R) == pytest.approx(((0.8 - 0.9) + (0.5 - 0.8)) / 2)
    assert fg.learning_accuracy(R) == [0.9, 0.8, 0.6]
    assert fg.average_score(R) == pytest.approx((0.8 + 0.5 + 0.6) / 3)
    s = fg.summary(R)
    assert s["forgetting_max"] == pytest.approx(0.2) and s["forgetting_learned"] == pytest.approx(0.2)
    assert s["bwt"] == pytest.approx(-s["forgetting_learned"])


def test_the_two_definitions_differ_when_a_score_improves_after_learning():
    """Hand-computed: experience 0 improves after experience 1 (0.5 -> 0.9), then drops to 0.6."""
    R2 = [[0.5, None, None], [0.9, 0.7, None], [0.6, 0.7, 0.8]]
    assert fg.forgetting_max(R2, 0, 2) == pytest.approx(0.3)            # best earlier 0.9 - 0.6
    assert fg.forgetting_learned(R2, 0, 2) == pytest.approx(-0.1)       # 0.5 when learned - 0.6
    s = fg.summary(R2)
    assert s["forgetting_max"] == pytest.approx((0.3 + 0.0) / 2)
    assert s["forgetting_learned"] == pytest.approx((-0.1 + 0.0) / 2)
    assert set(fg.DEFINITIONS) >= {"forgetting_max", "forgetting_learned", "bwt"}


def test_max_based_is_never_below_learning_based():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        M = torch.rand(5, 5, generator=g).tolist()
        for j in range(1, 5):
            for i in range(j):
                assert fg.forgetting_max(M, i, j) >= fg.forgetting_learned(M, i, j) - 1e-12


def test_lower_is_better_flips_sign():
    mse = [[1.0, 9.0], [3.0, 2.0]]
    assert fg.forgetting_max(mse, 0, 1, higher_is_better=False) == pytest.approx(2.0)
    assert fg.forgetting_learned(mse, 0, 1, higher_is_better=False) == pytest.approx(2.0)
    assert fg.backward_transfer(mse, higher_is_better=False) == pytest.approx(-2.0)


def test_forgetting_curve_uses_tokens_since_each_experience():
    rows = fg.forgetting_curve(R, tokens_after=[100, 250, 400])
    row = next(r for r in rows if r["evaluated_on"] == 0 and r["trained_on"] == 2)
    assert row["tokens_since"] == 300 and row["experiences_since"] == 2 and row["score"] == 0.8
    assert len(rows) == 6


def _avalanche_classification_run(shifts):
    """Avalanche's Naive on linearly separable tasks (one per shift), our ResultMatrix beside Avalanche's
    forgetting and BWT metrics. Returns (R, Avalanche's last metrics)."""
    import ovq_cl.base.avalanche_compat  # noqa: F401
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.utils import make_avalanche_dataset
    from avalanche.evaluation.metrics import bwt_metrics, forgetting_metrics
    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.training.supervised import Naive
    from torch.utils.data import TensorDataset

    from strategies.evaluation.results import ResultMatrix

    def task(shift, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(96, 6, generator=g)
        y = ((x[:, 0] + shift * x[:, 1]) > 0).long()
        ds = TensorDataset(x, y)
        ds.targets = y.tolist()
        return make_avalanche_dataset(ds)

    bench = benchmark_from_datasets(train=[task(s, 10 + k) for k, s in enumerate(shifts)],
                                    test=[task(s, 20 + k) for k, s in enumerate(shifts)])
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 2)
    matrix = ResultMatrix("accuracy", len(shifts))
    evaluator = EvaluationPlugin(matrix, forgetting_metrics(experience=True), bwt_metrics(experience=True), loggers=[])
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), train_mb_size=16,
                     train_epochs=3, eval_mb_size=32, evaluator=evaluator)
    for exp in bench.train_stream:
        strategy.train(exp, shuffle=False)
        strategy.eval(bench.test_stream)
    return matrix.R, evaluator.get_last_metrics()


@pytest.mark.parametrize("shifts", [(0.0, -3.0, 3.0), (0.0, -3.0, -3.0, 3.0)], ids=["three-domains", "domain-recurs"])
def test_learning_based_forgetting_and_bwt_equal_avalanches(shifts):
    """Avalanche's ExperienceForgetting is R[i][i] - R[j][i] (forgetting_learned), on every stream,
    including one where domain 1 comes back as experience 2."""
    R, metrics = _avalanche_classification_run(shifts)
    K = len(shifts)
    for i in range(K - 1):
        theirs = metrics[f"ExperienceForgetting/eval_phase/test_stream/Exp{i:03d}"]
        assert fg.forgetting_learned(R, i, K - 1) == pytest.approx(theirs, abs=1e-6)
        theirs_bwt = metrics[f"ExperienceBWT/eval_phase/test_stream/Exp{i:03d}"]
        assert -fg.forgetting_learned(R, i, K - 1) == pytest.approx(theirs_bwt, abs=1e-6)
    assert any(abs(fg.forgetting_learned(R, i, K - 1)) > 0.01 for i in range(K - 1))  # not vacuous


def test_max_based_forgetting_is_not_avalanches_when_a_domain_recurs():
    """When domain 1 recurs as experience 2, experience 1's score rises above its score when learned:
    the max-based forgetting of experience 1 counts that best score, Avalanche's the score when learned."""
    R, metrics = _avalanche_classification_run((0.0, -3.0, -3.0, 3.0))
    K = 4
    theirs = [metrics[f"ExperienceForgetting/eval_phase/test_stream/Exp{i:03d}"] for i in range(K - 1)]
    ours_max = [fg.forgetting_max(R, i, K - 1) for i in range(K - 1)]
    assert any(abs(a - b) > 0.01 for a, b in zip(ours_max, theirs)), (R, ours_max, theirs)
    assert all(a >= b - 1e-6 for a, b in zip(ours_max, theirs))
