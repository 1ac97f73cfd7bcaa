"""The measurement layer: seeds that reach the data, scoring against the facts in force, the learned
gate, per-cell standard errors, the result matrix's stream, and the regressions found in review."""
import copy
import dataclasses
import math

import pytest
import torch

import ovq_cl.base.avalanche_compat  # noqa: F401
from avalanche.training.plugins import EvaluationPlugin

from experiments.config import run_config
from ovq_cl import DecoderLM, model_config
from ovq_cl.state import MixerState
from strategies.evaluation import forgetting as fg
from strategies.evaluation.gate import measure_gate
from strategies.evaluation.metrics import chance_score, skill
from strategies.memory import PersistentMemoryPlugin
from strategies.evaluation.results import ResultMatrix
from strategies.evaluation.metrics import SequenceScore
from strategies.sequence import FrozenWeights
from streams import icr_benchmark, icr_data
from streams.common import IGNORE, held_out

# ----------------------------------------------------------------------------------------- seeds


def test_the_run_seed_seeds_the_data_unless_the_stream_seed_is_set():
    base = {"stream": {"name": "icr", "options": {"n_experiences": 2}}}
    c0, c1 = run_config(base, ["seed=0"]), run_config(base, ["seed=1"])
    assert (c0.data_seed, c1.data_seed) == (0, 1)
    t0, t1 = icr_data(c0.stream.options), icr_data(c1.stream.options)
    assert t0.info.tables != t1.info.tables, "facts differ with the run seed"
    assert not torch.equal(t0.meta_train[0][0], t1.meta_train[0][0]), "so does meta-training"
    assert not torch.equal(t0.test[0][0][0], t1.test[0][0][0]), "and the test episodes"
    pinned = run_config(base, ["seed=1", "stream.options.seed=0"])
    assert pinned.seed == 1 and pinned.data_seed == 0
    assert icr_data(pinned.stream.options).info.tables == t0.info.tables
    assert len({c0.identity(), c1.identity(), pinned.identity()}) == 3


def test_the_items_a_probe_point_scores_are_part_of_the_run_identity():
    """The capacity curve scores ``gate.interference_episodes`` items a point: two runs that differ only
    there measured different things and are not one run (once they were, when no interference curve
    ran, so a rerun at more items would have been "reused" from the fewer). Where neither curve runs,
    the option changes nothing and still hashes as a config written without it."""
    base = {"stream": {"name": "icr", "options": {"n_experiences": 2}}}
    capacity = ["gate.capacity_facts=[16,64]"]
    assert (run_config(base, capacity + ["gate.interference_episodes=16"]).identity()
            != run_config(base, capacity + ["gate.interference_episodes=64"]).identity())
    assert (run_config(base, ["gate.interference_episodes=16"]).identity()
            == run_config(base, ["gate.interference_episodes=64"]).identity() == run_config(base).identity())
    curves = ["gate.interference=[neutral]"]
    assert (run_config(base, curves + ["gate.interference_episodes=16"]).identity()
            != run_config(base, curves + ["gate.interference_episodes=64"]).identity())


# ------------------------------------------------------------------------------ facts that change


@dataclasses.dataclass
class TableState(MixerState):
    table: torch.Tensor          # [B, vocab] int64: the value each lane holds for each key, -1 = none


class TableOracle(torch.nn.Module):
    """A hand-written memory for ICR: reads every ``key value`` pair and answers a key with the value it
    holds. ``latest`` overwrites (a perfect tracker of the facts in force); ``first`` never updates a key
    it knows (remembers every fact exactly as first learned)."""

    def __init__(self, vocab_size: int, n_keys: int, rule: str):
        super().__init__()
        self.vocab_size, self.n_keys, self.rule = vocab_size, n_keys, rule
        self.unused = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x, states=None):
        B, T = x.shape
        table = torch.full((B, self.vocab_size), -1) if states is None else states[0].table.clone()
        out = torch.zeros(B, T, self.vocab_size)
        is_key = (x >= 2) & (x < 2 + self.n_keys)
        is_value = x >= 2 + self.n_keys
        for b in range(B):
            for t in range(T):
                if not is_key[b, t]:
                    continue
                held = int(table[b, x[b, t]])
                if held >= 0:
                    out[b, t, held] = 1.0
                if t + 1 < T and is_value[b, t + 1] and (self.rule == "latest" or held < 0):
                    table[b, x[b, t]] = x[b, t + 1]
        return out, [TableState(table)]


REBINDING = {"n_experiences": 3, "n_keys": 48, "facts_per_experience": 8, "facts_per_episode": 8,
             "queries_per_episode": 2, "train_episodes": 2, "test_episodes": 2, "test_queries": 8,
             "rebind_fraction": 0.25, "test_rebound_keys": True}


def test_rebinding_option_of_icr_shift():
    info = icr_data(REBINDING).info
    assert info.config.rebind_across == 2 and info.facts_change
    for j in (1, 2):
        assert len(info.rebound[j]) == 2
        for key, (old, new) in info.rebound[j].items():
            assert old != new and info.tables[j - 1][key] == old and info.tables[j][key] == new
            assert key in info.test_keys[j - 1], "test_rebound_keys: the earlier experience still tests it"
    x, y = icr_data(REBINDING).test[0][0]
    x, y = x[None], y[None]
    now = info.labels_in_force(0, 2, x, y)
    for t in torch.nonzero(y[0] != IGNORE).flatten().tolist():
        key = int(x[0, t])
        assert int(now[0, t]) == info.bindings_after(2)[key]
        assert int(y[0, t]) == info.tables[0][key]
    assert not icr_data({**REBINDING, "rebind_fraction": 0.0}).info.facts_change
    with pytest.raises(ValueError, match="not both"):
        icr_data({**REBINDING, "rebind_across": 2})


def _stream_with(rule: str):
    bench = icr_benchmark(REBINDING)
    info = bench.info
    matrix = ResultMatrix("accuracy", 3, labels_in_force=info.labels_in_force)
    model = TableOracle(info.vocab_size, info.config.n_keys, rule)
    strategy = FrozenWeights(model=model, train_mb_size=1, plugins=[PersistentMemoryPlugin("persist")],
                             evaluator=EvaluationPlugin(matrix, loggers=[]))
    for exp in bench.train_stream:
        strategy.train(exp)
        strategy.eval(bench.test_stream)
    return matrix


def test_scoring_against_the_facts_in_force_ranks_the_two_oracles_correctly():
    """A perfect tracker loses points against labels fixed when learned (it answers the new value) and
    none against the facts in force; a never-updating memory is the opposite. R_current ranks them."""
    tracker, stale = _stream_with("latest"), _stream_with("first")
    # against the labels fixed when learned, the tracker looks like it forgets and the stale one not
    assert fg.average_forgetting_max(tracker.R) == pytest.approx(0.25)
    assert fg.average_forgetting_max(stale.R) == 0.0
    # against the facts in force, the tracker is perfect and the stale memory loses the changed facts
    assert all(tracker.R_current[j][i] == 1.0 for j in range(3) for i in range(j + 1))
    assert fg.average_forgetting_max(tracker.R_current) == 0.0
    assert fg.average_forgetting_max(stale.R_current) > 0.1
    assert fg.average_score(tracker.R_current) > fg.average_score(stale.R_current)
    # the breakdown of the changed answers
    cells = [(j, i) for j in range(3) for i in range(j + 1) if tracker.changed[j][i]]
    assert cells and all(tracker.updated[j][i] == 1.0 and tracker.stale[j][i] == 0.0 for j, i in cells)
    assert all(stale.updated[j][i] == 0.0 and stale.stale[j][i] == 1.0 for j, i in cells)
    # the frontier's two axes: the tracker keeps every fact that did not change and updates every one
    # that did; the never-updating memory updates none, keeps experience 0's facts, and misses the
    # later experiences' rebindings (its first value answers them), which count as not retained
    final = tracker.changed_fractions(2)
    assert final["retained_fraction"] == 1.0 and final["updated_fraction"] == 1.0
    assert all(tracker.kept[j][i] == 1.0 and tracker.unchanged[j][i] > 0 for j in range(3) for i in range(j + 1))
    final = stale.changed_fractions(2)
    assert final["updated_fraction"] == 0.0 and all(stale.kept[j][0] == 1.0 for j in range(3))
    assert stale.kept[2][1] < 1.0 and final["retained_fraction"] < 1.0


def test_retention_of_unchanged_facts_counts_what_a_write_once_memory_never_learned():
    """A memory that stops writing after experience 0 keeps experience 0's facts but never held the later
    ones: its retained share is what it holds of the earlier experiences' unchanged facts, by hand."""
    bench = icr_benchmark(REBINDING)
    info = bench.info
    matrix = ResultMatrix("accuracy", 3, labels_in_force=info.labels_in_force)
    model = TableOracle(info.vocab_size, info.config.n_keys, "first")
    strategy = FrozenWeights(model=model, train_mb_size=1, plugins=[PersistentMemoryPlugin("persist")],
                             evaluator=EvaluationPlugin(matrix, loggers=[]))
    for j, exp in enumerate(bench.train_stream):
        if j == 0:
            strategy.train(exp)
        else:                                    # the stream goes on, the memory takes nothing new
            matrix.trained = j + 1
        strategy.eval(bench.test_stream)
    final = matrix.changed_fractions(2)
    assert matrix.kept[2][0] == 1.0 and matrix.kept[2][1] < 0.2       # exp 1's facts were never written
    by_hand = (matrix.kept[2][0] * matrix.unchanged[2][0] + matrix.kept[2][1] * matrix.unchanged[2][1]) / (
        matrix.unchanged[2][0] + matrix.unchanged[2][1])
    assert final["retained_fraction"] == pytest.approx(by_hand) and final["retained_fraction"] < 0.7


# ------------------------------------------------------------------------------------- the gate


def test_chance_is_the_best_context_free_predictor():
    y = torch.tensor([[5, 5, 5, 7, IGNORE], [7, 9, 5, IGNORE, IGNORE]])
    assert chance_score("accuracy", y) == pytest.approx(4 / 7)          # always answer 5
    counts = torch.tensor([4.0, 2.0, 1.0]) / 7
    assert chance_score("bits_per_byte", y) == pytest.approx(float(-(counts * counts.log2()).sum()))
    yf = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [math.nan, math.nan]]])
    assert chance_score("mse", yf) == pytest.approx((1.0 + 1.0) / 2)   # variance per dim around the mean
    assert skill("accuracy", 1.0, 0.25) == 1.0 and skill("accuracy", 0.25, 0.25) == 0.0
    assert skill("mse", 0.5, 1.0) == pytest.approx(0.5) and skill("bits_per_byte", 8.0, 4.0) == pytest.approx(-1.0)


def test_the_gate_reads_held_out_episodes_from_a_fresh_state():
    data = icr_data({"n_experiences": 2, "meta_train_episodes": 64})
    gate_set = held_out(data.meta_train, 32)
    assert len(gate_set) == 32 and torch.equal(gate_set[0][0], data.meta_train.fn(*data.meta_train.args, 64)[0])
    info = data.info
    perfect = measure_gate(TableOracle(info.vocab_size, info.config.n_keys, "latest"), gate_set, "accuracy", 0.5)
    assert perfect.learned and perfect.score == 1.0 and perfect.skill == 1.0
    model = DecoderLM(model_config({"vocab_size": info.vocab_size, "d_model": 16, "n_heads": 2, "layers": ["linear"]}))
    untrained = measure_gate(model, gate_set, "accuracy", 0.5)
    assert untrained.learned is False and untrained.skill < 0.2 and untrained.episodes == 32
    assert model.training, "the gate leaves the model's mode as it was"


# ---------------------------------------------------------------------------- standard errors


def test_a_non_finite_answer_makes_the_score_nan_not_the_mean_of_the_rest():
    """A lane whose logits diverged (NaN) is a broken run, not a better one: the score is NaN (torchmetrics'
    default drops NaN and averages the rest, which for bits per byte looked like a good score)."""
    score = SequenceScore("bits_per_byte")
    out = torch.zeros(2, 3, 5)
    out[1] = math.nan
    score.update(out, torch.ones(2, 3, dtype=torch.long))
    assert math.isnan(score.result())
    from strategies.evaluation import forgetting
    # and the max-based forgetting does not answer by where a NaN stands among the earlier scores
    for R in ([[math.nan, 0.0], [0.5, 0.5]], [[0.5, 0.0, 0.0], [math.nan, 0.5, 0.0], [0.2, 0.2, 0.5]]):
        assert math.isnan(forgetting.forgetting_max(R, 0, len(R) - 1))
    # an unmeasured cell (None, as the docstring allows) is NaN in every summary that reads it, not an error
    holed = [[0.9, None], [None, 0.8]]
    s = forgetting.summary(holed)
    assert math.isnan(s["forgetting_max"]) and math.isnan(s["forgetting_learned"]) and math.isnan(s["final_average"])


def test_episode_clustered_standard_error_known_answers():
    score = SequenceScore("accuracy")
    # 4 episodes, one answer each: 3 right -> p = 0.75, s.e. = sqrt(p (1 - p) / (N - 1))
    out = torch.zeros(4, 2, 3)
    out[:3, 0, 1] = 1.0
    y = torch.full((4, 2), IGNORE)
    y[:, 0] = 1
    score.update(out, y)
    assert score.result() == 0.75 and score.n_answers == 4 and score.n_episodes == 4
    assert score.standard_error() == pytest.approx(math.sqrt(0.75 * 0.25 / 3))
    # two episodes of 2 answers, one all right, one all wrong: s.e. from the 2 episode means
    score.reset()
    out = torch.zeros(2, 2, 3)
    out[0, :, 1] = 1.0
    score.update(out, torch.ones(2, 2, dtype=torch.long))
    m = 0.5
    expected = math.sqrt(2 / 1 * ((2 - m * 2) ** 2 + (0 - m * 2) ** 2)) / 4
    assert score.result() == 0.5 and score.standard_error() == pytest.approx(expected)


def _oracle_after_one_experience():
    """The perfect tracker streamed through experience 0 of the rebinding stream, then evaluated."""
    bench = icr_benchmark(REBINDING)
    info = bench.info
    matrix = ResultMatrix("accuracy", 3)
    strategy = FrozenWeights(model=TableOracle(info.vocab_size, info.config.n_keys, "latest"), train_mb_size=1,
                             plugins=[PersistentMemoryPlugin("persist")], evaluator=EvaluationPlugin(matrix, loggers=[]))
    strategy.train(bench.train_stream[0])
    strategy.eval(bench.test_stream)
    return strategy, matrix, bench


def test_the_result_matrix_has_a_standard_error_for_every_measured_cell():
    _, matrix, _ = _oracle_after_one_experience()
    assert matrix.R_n[0] == [16, 16, 16] and all(se is not None for se in matrix.R_se[0])
    assert matrix.R_se[0][0] == 0.0                      # all right: no spread


# --------------------------------------------------------------------------------- regressions


def test_only_the_test_stream_fills_the_result_matrix():
    """Review finding: strategy.eval(train_stream) overwrote R[0][1]."""
    strategy, matrix, bench = _oracle_after_one_experience()
    before = copy.deepcopy(matrix.R)
    strategy.eval(bench.train_stream)
    assert matrix.R == before


def test_a_model_with_vq_layers_deep_copies_after_a_forward():
    """Review finding: VQ kept its commitment loss (with its graph) on the layer, so LwF's deepcopy failed."""
    model = DecoderLM(model_config({"vocab_size": 20, "d_model": 16, "n_heads": 2, "layers": ["vq"],
                                    "mixers": {"vq": {"codebook_size": 8, "chunk_size": 4}}}))
    out, _ = model(torch.randint(0, 20, (2, 8)))
    twin = copy.deepcopy(model)
    assert twin.mixers[0].aux_loss is None and model.mixers[0].aux_loss is not None
    (out.sum() + model.aux_loss()).backward()          # the original's loss still has its graph
    for a, b in zip(model.state_dict().values(), twin.state_dict().values()):
        assert torch.equal(a, b)


def test_the_meta_training_set_is_the_task_not_the_facts():
    """What the docstring now says: meta-training facts are random pairs over the whole key vocabulary,
    so a stream fact occurs there only at about the chance rate 1/n_values per presented key."""
    data = icr_data({"n_experiences": 2, "meta_train_episodes": 512})
    facts = {(k, v) for table in data.info.tables for k, v in table.items()}
    keys = {k for k, _ in facts}
    pairs = seen = 0
    for i in range(len(data.meta_train)):
        x, _ = data.meta_train[i]
        for t in range(0, 16, 2):
            k, v = int(x[t]), int(x[t + 1])
            if k in keys:
                seen += 1
                pairs += (k, v) in facts
    rate = pairs / seen
    assert abs(rate - 1 / data.info.config.n_values) < 0.02, rate


def test_binned_mse_scores_quantised_answers_by_their_bin_centres():
    """ICL with encoding=tokens (review finding: it crashed): the predicted bin's centre against the
    target bin's centre; chance is the variance of the targets' centres."""
    centers = torch.tensor([-1.0, 0.0, 2.0])
    context = {"bin_centers": centers, "first_value_token": 10}
    score = SequenceScore("binned_mse", context)
    out = torch.zeros(1, 2, 13)
    out[0, 0, 12] = 1.0                       # predicts bin 2 (2.0) where the target is bin 0 (-1.0): error 9
    out[0, 1, 11] = 1.0                       # predicts bin 1 (0.0), target bin 1: error 0
    score.update(out, torch.tensor([[10, 11]]))
    assert score.result() == pytest.approx(4.5)
    assert chance_score("binned_mse", torch.tensor([[10, 12]]), context) == pytest.approx(2.25)


def test_the_stream_gate_scores_each_experience_against_its_own_chance():
    """Two experiences whose labels are 3/4 'x' and 3/4 'y': each one's chance is 0.75, the pooled 0.5. A
    memory that answers each experience's majority label scores 0.75 on both: no skill against its own
    experience (not learned), although against the pooled chance it had skill 0.5 (the rule until
    2026-12-04 let it pass)."""
    from strategies.evaluation.gate import experience_chances, stream_gate

    x, y = 3, 5
    labels = [torch.tensor([x, x, x, y] * 2), torch.tensor([y, y, y, x] * 2)]
    assert experience_chances(labels, "accuracy") == [0.75, 0.75]
    assert chance_score("accuracy", torch.cat(labels)) == 0.5
    gate = stream_gate([0.75, 0.75], labels, "accuracy", 0.1)
    assert gate.skill == pytest.approx(0.0) and gate.learned is False and gate.chance == 0.75
    learned = stream_gate([1.0, 0.9], labels, "accuracy", 0.1)
    assert learned.skill == pytest.approx((1.0 + 0.6) / 2) and learned.learned is True


def test_a_stored_record_is_rescored_by_its_stored_per_experience_chances():
    """A record's stream gate is re-read by the current rule from the per-experience chances it stores;
    an old record without them that schema 3 requires is refused in one line naming the migrating commit."""
    from experiments import compare
    from experiments.records import MIGRATING_COMMIT

    own = [0.5, 0.25, 0.75]
    R = [[own[0], 0, 0], [0, own[1], 0], [0, 0, own[2]]]
    record = {"schema_version": 3, "label": "x", "params": {}, "metric": "accuracy", "summary": {}, "R": R,
              "shared_bytes_per_layer": [0], "learned_buffers": 0, "gate": {"learned": True},
              "stream_gate": {"learned": True, "chance": sum(own) / 3, "threshold": 0.1, "skill": 0.2, "chances": own}}
    # R[j][j] at each experience's own chance: the stored gate said learned, the current rule does not
    assert compare.record_from_json(record).learned is False
    assert compare.record_from_json(record).stream_chances == pytest.approx(own)
    old = {k: v for k, v in record.items() if k != "schema_version"}
    old["stream_gate"] = {k: v for k, v in record["stream_gate"].items() if k != "chances"}
    with pytest.raises(ValueError, match=rf"run record x: made before records stored stream_gate.chances; .*{MIGRATING_COMMIT}"):
        compare.record_from_json(old)
    assert compare.record_from_json({**old, "stream_gate": record["stream_gate"]}).learned is False, \
        "a pinned checkout's record that stores them moves up as it is"
