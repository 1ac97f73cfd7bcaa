"""Long memory: meta-training sequences whose queries reach back D episodes (with rebinding), truncated
BPTT, the delay probe, the delay-recall curve and the delay gate."""
import math
import re

import pytest
import torch

from experiments.config import run_config
from experiments.runner import run
from ovq_cl import DecoderLM, model_config
from ovq_cl.base import IGNORE
from strategies.evaluation.delay import DelayCurve, DelayPoint, delay_gate, filler_ladder, measure_delay_curve
from strategies.training.step import train_step
from streams.icr import _meta_episode, icr_config, icr_data, train_len

from test_measurement import TableOracle, TableState
from test_runner import TINY

LONG = {"meta_sequence_episodes": 6, "meta_reach_back": 3, "meta_rebind_fraction": 0.25, "n_keys": 64,
        "facts_per_episode": 8, "queries_per_episode": 4}


def _episodes(x, y, T):
    return list(zip(x.split(T), y.split(T)))


def test_one_episode_per_sequence_is_the_original_meta_training_item():
    data = icr_data({})
    cfg = icr_config({})
    for i in (0, 7):
        x, y = data.meta_train[i]
        x0, y0 = _meta_episode(cfg, train_len(cfg), i)
        assert torch.equal(x, x0) and torch.equal(y, y0)


@pytest.mark.parametrize("variant", ["basic", "positional"])
def test_meta_sequences_ask_the_newest_binding_at_most_D_episodes_back(variant):
    cfg = icr_config({**LONG, "variant": variant})
    data = icr_data(cfg)
    T, E, D = train_len(cfg), cfg.meta_sequence_episodes, cfg.meta_reach_back
    reach, rebound = [], 0
    for i in range(40):
        x, y = data.meta_train[i]
        assert x.shape == (E * T,)
        history = {}                                    # key -> [(episode, value)] in order of presentation
        for e, (xe, ye) in enumerate(_episodes(x, y, T)):
            sep = int((xe == 1).nonzero()[0])
            keys_here = xe[:sep:2].tolist()
            rebound += sum(k in history and history[k][-1][0] >= e - D for k in set(keys_here))
            for k, v in zip(xe[:sep:2].tolist(), xe[1:sep:2].tolist()):
                history.setdefault(k, []).append((e, v))
            for t in (ye != IGNORE).nonzero().flatten().tolist():
                key, label = int(xe[t]), int(ye[t])
                last_episode, newest = history[key][-1]
                assert label == newest, "the answer is the key's newest binding"
                assert e - D <= last_episode <= e, "a query reaches back at most D episodes"
                reach.append(e - last_episode)
    assert max(reach) == D and min(reach) == 0
    assert rebound > 0, "some keys are rebound across episodes"


def test_a_memory_that_keeps_the_first_binding_fails_rebound_queries_and_a_tracker_does_not():
    data = icr_data(LONG)
    x, y = map(torch.stack, zip(*[data.meta_train[i] for i in range(16)]))
    vocab = data.info.vocab_size
    scored = y != IGNORE
    for rule, perfect in (("latest", True), ("first", False)):
        out, _ = TableOracle(vocab, 64, rule)(x)
        acc = float((out.argmax(-1)[scored] == y[scored]).float().mean())
        assert (acc == 1.0) == perfect, (rule, acc)


@pytest.mark.parametrize("filler", [0, 1, 3])
def test_the_delay_probe_scores_only_the_first_facts_after_the_filler(filler):
    cfg = icr_config({"n_keys": 64})
    data = icr_data(cfg)
    T, P, Q = train_len(cfg), cfg.facts_per_episode, cfg.queries_per_episode
    for i in range(5):
        x, y = data.delay_probe(filler, 5)[i]
        assert x.shape == (2 * P + filler * T + 1 + 2 * Q,)
        facts = dict(zip(x[:2 * P:2].tolist(), x[1:2 * P:2].tolist()))
        filler_keys = set(x[2 * P:2 * P + filler * T].tolist()) & set(range(2, 66))
        assert not filler_keys & set(facts), "the filler uses other keys"
        scored = (y != IGNORE).nonzero().flatten()
        assert len(scored) == Q and int(scored[0]) == 2 * P + filler * T + 1
        assert all(int(y[t]) == facts[int(x[t])] for t in scored)


class WindowOracle(TableOracle):
    """The table oracle that only remembers bindings made in the last ``window`` tokens."""

    def __init__(self, vocab_size, n_keys, window):
        super().__init__(vocab_size, n_keys, "latest")
        self.window = window

    def forward(self, x, states=None):
        B, T = x.shape
        out = torch.zeros(B, T, self.vocab_size)
        for t in range(T):
            ctx = x[:, max(0, t - self.window):t + 1]
            full, _ = super().forward(ctx)
            out[:, t] = full[:, -1]
        return out, [TableState(torch.zeros(B, 1, dtype=torch.long))]


def test_delay_curve_known_answers_for_a_perfect_and_a_windowed_memory():
    data = icr_data({"n_keys": 64})
    T = data.info.seq_len
    vocab = data.info.vocab_size
    fillers = filler_ladder(4 * T, T)
    assert fillers == [0, 1, 2, 4]
    perfect = measure_delay_curve(TableOracle(vocab, 64, "latest"), data.delay_probe, fillers, T, "accuracy", episodes=8)
    assert [p.delay for p in perfect.points] == [0, T, 2 * T, 4 * T]
    assert all(p.score == 1.0 for p in perfect.points) and perfect.span() is None
    assert delay_gate(perfect, 2 * T, 0.5).learned is True
    windowed = measure_delay_curve(WindowOracle(vocab, 64, 40), data.delay_probe, fillers, T, "accuracy", episodes=8)
    scores = [p.score for p in windowed.points]
    assert scores[0] == 1.0 and scores[2] == scores[3] == 0.0
    assert windowed.span() == (T if scores[1] < 0.5 else 2 * T)
    assert delay_gate(windowed, 2 * T, 0.5).learned is False
    assert delay_gate(windowed, 0, 0.5).learned is True
    assert delay_gate(windowed, 100 * T, 0.5).learned is None, "past the curve: not measured"
    assert DelayCurve.from_dict(windowed.as_dict()).points == windowed.points


def test_filler_ladder_reaches_the_longest_delay():
    assert filler_ladder(0, 25) == [0]
    assert filler_ladder(800, 25) == [0, 1, 2, 4, 8, 16, 32]
    assert filler_ladder(801, 25)[-1] == 64
    with pytest.raises(ValueError):
        filler_ladder(10, 0)


def test_the_span_reads_skill_whatever_the_metric():
    """MSE 0.03 / 0.04 / 0.05 against a chance of 0.06 is skill 0.5 / 0.33 / 0.17: the span is the second
    point's delay (the raw score, always below 0.5, once gave "never"); accuracy reads skill the same way."""
    from strategies.evaluation.metrics import skill

    def curve(metric, chance, scores):
        return DelayCurve(metric, [DelayPoint(filler_episodes=f, delay=f * 10, score=s, standard_error=0.0, chance=chance,
                                              skill=skill(metric, s, chance), episodes=4) for f, s in enumerate(scores)])
    assert curve("mse", 0.06, [0.03, 0.04, 0.05]).span(0.5) == 10
    assert curve("accuracy", 0.2, [1.0, 0.65, 0.5]).span(0.5) == 20          # skill 1.0, 0.5625, 0.375


# ------------------------------------------------------------------------------------ truncated BPTT


def _model_and_batch(seed=0):
    torch.manual_seed(seed)
    model = DecoderLM(model_config({"vocab_size": 100, "d_model": 32, "n_layers": 2, "n_heads": 2, "layers": ["delta"]}))
    data = icr_data(LONG)
    x, y = map(torch.stack, zip(*[data.meta_train[i] for i in range(4)]))
    return model, x, y


def _step(tbptt):
    model, x, y = _model_and_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss, out, _ = train_step(model, opt, x, y, grad_clip=None, tbptt=tbptt)
    return loss, out, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_truncated_bptt_computes_the_same_forward_and_cuts_only_the_gradient():
    T = _model_and_batch()[1].shape[1]
    loss_full, out_full, w_full = _step(0)
    loss_long, _, w_long = _step(T)
    assert torch.equal(w_full, w_long), "a segment as long as the item is the full step"
    loss_cut, out_cut, w_cut = _step(T // 3)
    # the forward is the same computation split across calls (the mixer contract), so the loss is too
    assert torch.allclose(out_cut, out_full.detach(), atol=1e-4)
    assert abs(float(loss_cut.detach()) - float(loss_full.detach())) < 1e-4
    assert not torch.allclose(w_cut, w_full, atol=1e-7), "the gradient through the segment borders is cut"


# ------------------------------------------------------------------------------------------- runner


@pytest.mark.parametrize("strategy,delay,required", [("frozen", "none", False), ("frozen", "experience", True),
                                                    ("naive", "experience", True)])
def test_the_runner_measures_the_delay_curve_and_gates_on_it_when_asked(tmp_path, strategy, delay, required):
    cfg = run_config({**TINY, "tracking": {"enabled": False}, "checkpoint": {"enabled": False},
                      "strategy": {**TINY["strategy"], "name": strategy}, "meta_train": {"steps": 2, "batch_size": 4},
                      "gate": {"delay_episodes": 4, "delay": delay}, "output_dir": str(tmp_path)})
    result = run(cfg)
    d = result.probes["delay"]
    T = d["episode"]
    assert d["learning"] == 2 * T and d["longest"] == 3 * 2 * T     # 8 episodes / 4 lanes, 3 experiences
    points = d["curve"]["points"]
    assert points[0]["delay"] == 0 and points[-1]["delay"] >= d["longest"]
    assert d["required"] is required
    flags = [result.gate["learned"], result.stream_gate["learned"]] + ([d["gate"]["learned"]] if required else [])
    assert result.learned == all(flags)
    assert math.isfinite(d["gate"]["skill"])


def test_the_stream_delays_count_only_the_episodes_training_streams():
    from types import SimpleNamespace

    from experiments.probes.delay import stream_delays
    exps = [SimpleNamespace(dataset=[0] * n) for n in (9, 8, 11)]      # 9 and 11 leave a partial minibatch
    cfg = SimpleNamespace(strategy=SimpleNamespace(train_mb_size=4))
    bench = SimpleNamespace(train_stream=exps, info=SimpleNamespace(seq_len=10))
    assert stream_delays(cfg, bench) == {"learning": 20, "longest": 60, "episode": 10}   # 2 episodes per lane each


def test_the_cli_prints_the_delay_curve_and_every_gate(tmp_path, capsys):
    import yaml

    from experiments.cli import main

    cfg = {**TINY, "meta_train": {"steps": 2, "batch_size": 4}, "gate": {"delay_episodes": 4},
           "tracking": {"enabled": False}, "checkpoint": {"enabled": False}, "output_dir": str(tmp_path)}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "delay-recall curve (fresh state, before the stream; span:" in out
    assert "delay gate (skill at the learning delay, 26 tokens)" in out      # 2 episodes of 13 tokens a lane
    assert "(informative, not a gate here)" in out and "held-out gate (held-out episodes" in out
    assert "learned (every gate that applies" in out


# ---------------------------------------------------------------- long-horizon meta-training in blocks

BLOCKS = {"n_experiences": 4, "n_keys": 64, "facts_per_experience": 16, "facts_per_episode": 8,
          "queries_per_episode": 4, "meta_sequence_episodes": 40, "meta_reach_back": 31,
          "meta_block_episodes": 8, "meta_rebind_fraction": 0.25, "meta_train_episodes": 64}


@pytest.mark.parametrize("variant", ["basic", "positional"])
def test_block_sequences_ask_the_newest_binding_and_reach_back_across_blocks(variant):
    """Known answers of the generator: every answer is the key's newest presented value, every recalled
    answer (the mask) is a key the episode did not present, last presented at most D episodes before, the
    other answers keys it presented; episodes present facts of their block's table only; queries reach
    back across blocks (to ~D episodes) and some rebind a key of the previous block."""
    cfg = icr_config({**BLOCKS, "variant": variant})
    data = icr_data(cfg)
    T, E, D, B = train_len(cfg), cfg.meta_sequence_episodes, cfg.meta_reach_back, cfg.meta_block_episodes
    reach, n_recalled, n_answers, rebound = [], 0, 0, 0
    for i in range(12):
        x, y = data.meta_train[i]
        recalled, episodes_back = data.meta_recalled[i], data.meta_reach[i]
        assert x.shape == y.shape == recalled.shape == episodes_back.shape == (E * T,)
        assert torch.equal(episodes_back > 0, recalled), "a reach-back at every recalled answer, and only there"
        history, block_keys, in_input = {}, {}, {}       # in_input: the episode a key was last in the input
        for e, (xe, ye) in enumerate(_episodes(x, y, T)):
            sep = int((xe == 1).nonzero()[0])
            presented = xe[:sep:2].tolist()
            block_keys.setdefault(e // B, set()).update(presented)
            rebound += sum(k in block_keys.get(e // B - 1, ()) for k in set(presented)) if e % B == 0 else 0
            for k, v in zip(presented, xe[1:sep:2].tolist()):
                history.setdefault(k, []).append((e, v))
            for t in (ye != IGNORE).nonzero().flatten().tolist():
                key, label = int(xe[t]), int(ye[t])
                last, newest = history[key][-1]
                assert label == newest, "the answer is the key's newest binding"
                is_recalled = bool(recalled[e * T + t])
                assert is_recalled == (key not in presented)
                if is_recalled:
                    assert e - D <= last < e
                    # presented, or asked with its answer (teacher forcing): the fact was in front of the model
                    assert int(episodes_back[e * T + t]) == e - in_input[key] <= e - last
                    reach.append(e - last)
                n_recalled += is_recalled
                n_answers += 1
            assert not (recalled[e * T:(e + 1) * T] & (ye == IGNORE)).any(), "only answers are marked"
            in_input.update((k, e) for k in presented + [int(xe[t]) for t in (ye != IGNORE).nonzero().flatten()])
        assert all(len(keys) <= cfg.facts_per_experience for keys in block_keys.values()), "one table per block"
    assert max(reach) >= 3 * B, "queries reach back across blocks"
    assert 0.3 < n_recalled / n_answers < 0.5        # half of the queries after the first episode
    assert rebound > 0


def test_a_one_episode_memory_fails_exactly_the_recalled_answers_and_a_tracker_fails_none():
    data = icr_data(BLOCKS)
    T = data.info.seq_len
    x, y = map(torch.stack, zip(*[data.meta_train[i] for i in range(3)]))
    recalled = torch.stack([data.meta_recalled[i] for i in range(3)])
    vocab = data.info.vocab_size
    scored = y != IGNORE
    out, _ = TableOracle(vocab, 64, "latest")(x)
    assert bool((out.argmax(-1)[scored] == y[scored]).all())
    # a memory of the current episode only: the tracker from a fresh state at every episode
    out = torch.cat([TableOracle(vocab, 64, "latest")(xe)[0] for xe in x.split(T, dim=1)], 1)
    right = (out.argmax(-1) == y) & (out.max(-1).values > 0)
    assert bool(right[scored & ~recalled].all()) and not bool(right[recalled].any())


@pytest.mark.parametrize("options, drawer", [(BLOCKS, "_draw_meta_block_items"), (LONG, "_draw_meta_sequence_items")])
def test_an_item_is_drawn_once_for_its_tokens_mask_and_reach_and_equals_a_fresh_draw(monkeypatch, options, drawer):
    """Meta-training reads x, y, the recalled mask and the reach-back of each item in a row: one draw
    serves all three, and the kept item equals what a fresh draw gives (the memo changes no value); for
    the long-horizon blocks and for the plain multi-episode layout (the standard recipe's)."""
    import streams.icr as icr

    data = icr_data(options)
    draws = []
    real = getattr(icr, drawer)
    monkeypatch.setattr(icr, drawer, lambda *a: draws.append(a[2]) or real(*a))
    for i in (3, 4, 3):
        x, y = data.meta_train[i]
        mask, reach = data.meta_recalled[i], data.meta_reach[i]
        fx, fy, fmask = real(data.info.config, data.info.seq_len, i)
        assert torch.equal(x, fx) and torch.equal(y, fy) and torch.equal(mask, fmask)
        assert bool((reach > 0).eq(mask).all()) and bool(mask.any())
    assert draws == [3, 4, 3]


def test_recalled_masks_of_sequences_without_blocks_mark_answers_to_earlier_episodes():
    cfg = icr_config(LONG)
    data = icr_data(cfg)
    T = train_len(cfg)
    for i in range(5):
        x, y = data.meta_train[i]
        mask = data.meta_recalled[i]
        for e, (xe, ye) in enumerate(_episodes(x, y, T)):
            sep = int((xe == 1).nonzero()[0])
            presented = set(xe[:sep:2].tolist())
            for t in range(T):
                assert bool(mask[e * T + t]) == (int(ye[t]) != IGNORE and int(xe[t]) not in presented)
    assert int(icr_data({}).meta_recalled[0].sum()) == 0, "single episodes recall nothing"


@pytest.mark.parametrize("options, message", [
    ({"meta_block_facts": 16}, "applies to meta_block_episodes > 0 only"),
    ({**BLOCKS, "meta_block_facts": 40}, "n_keys=64 must be >= 70"),
    ({**BLOCKS, "meta_block_facts": 4}, "must be in [facts_per_episode=8"),
    ({**BLOCKS, "meta_reach_back": 0, "meta_rebind_fraction": 0.0}, "meta_recall_fraction > 0 needs meta_reach_back >= 1"),
    ({**BLOCKS, "meta_recall_fraction": 1.5}, "meta_recall_fraction must be in [0, 1]"),
])
def test_bad_block_options_get_one_line(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        icr_config(options)


def test_the_retention_loss_is_the_mean_loss_plus_lambda_times_the_mean_over_recalled_answers():
    from strategies.evaluation.metrics import sequence_loss
    from strategies.training.step import retention_weights
    gen = torch.Generator().manual_seed(0)
    out = torch.randn(3, 11, 7, generator=gen)
    y = torch.randint(0, 7, (3, 11), generator=gen)
    y[:, ::3] = IGNORE
    recalled = (torch.rand(3, 11, generator=gen) < 0.4) & (y != IGNORE)
    ce = torch.nn.functional.cross_entropy(out[y != IGNORE], y[y != IGNORE], reduction="none")
    ce_recalled = torch.nn.functional.cross_entropy(out[recalled], y[recalled])
    for lam in (0.0, 0.5, 2.0):
        got = sequence_loss(out, y, retention_weights(y, recalled, lam))
        assert torch.allclose(got, ce.mean() + lam * ce_recalled), lam
    none = torch.zeros_like(recalled)
    assert torch.equal(retention_weights(y, none, 2.0), torch.ones(3, 11))


def test_truncated_bptt_with_answer_weights_computes_the_same_objective():
    """Segments weighted by their share of the answers: the summed segment losses equal the full
    objective with the same per-answer weights (values; gradients differ only by the truncation)."""
    from strategies.training.step import retention_weights
    data = icr_data(BLOCKS)
    x, y = map(torch.stack, zip(*[data.meta_train[i] for i in range(2)]))
    recalled = torch.stack([data.meta_recalled[i] for i in range(2)])
    weights = retention_weights(y, recalled, 1.0)
    losses = []
    for tbptt in (0, 64):
        torch.manual_seed(0)
        model = DecoderLM(model_config({"vocab_size": data.info.vocab_size, "d_model": 16, "n_layers": 1,
                                        "n_heads": 2, "layers": ["delta"]}))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        loss, _, _ = train_step(model, opt, x, y, None, tbptt=tbptt, answer_weights=weights)
        losses.append(float(loss))
    assert math.isclose(losses[0], losses[1], rel_tol=1e-5)


def test_the_retention_loss_trains_differently_and_zero_is_the_plain_objective():
    """meta_train.retention_loss: 0 trains exactly as before the option existed (same identity, same
    weights), > 0 changes the weights; a stream without recalled masks is refused before anything runs."""
    from strategies.training.meta import MetaTraining
    data = icr_data({**BLOCKS, "meta_sequence_episodes": 10, "meta_reach_back": 6})

    def trained(**options):
        torch.manual_seed(0)
        model = DecoderLM(model_config({"vocab_size": data.info.vocab_size, "d_model": 16, "n_layers": 1,
                                        "n_heads": 2, "layers": ["delta"]}))
        for _ in MetaTraining(model, data.meta_train, steps=3, batch_size=4, lr=1e-2, metric="accuracy", **options):
            pass
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    plain = trained()
    assert torch.equal(plain, trained(recalled=data.meta_recalled, retention_loss=0.0))
    # measuring the recalled answers by reach-back changes nothing the model sees
    assert torch.equal(plain, trained(recalled=data.meta_recalled, reach=data.meta_reach))
    assert not torch.allclose(plain, trained(recalled=data.meta_recalled, retention_loss=1.0))
    with pytest.raises(ValueError, match="needs the stream's recalled-answer masks"):
        MetaTraining(torch.nn.Linear(1, 1), data.meta_train, steps=1, batch_size=1, lr=1.0, metric="accuracy",
                     retention_loss=1.0)
    base = {**TINY, "tracking": {"enabled": False}, "checkpoint": {"enabled": False}}
    assert run_config(base).identity() == run_config({**base, "meta_train": {**TINY["meta_train"],
                                                                             "retention_loss": 0.0}}).identity()
    with pytest.raises(ValueError, match="meta_train.retention_loss: stream 'text' does not mark"):
        run(run_config({**base, "stream": {"name": "text", "options": {}},
                        "meta_train": {**TINY["meta_train"], "retention_loss": 1.0}}))
    with pytest.raises(ValueError, match="meta_train.retention_loss"):
        run_config({**base, "meta_train": {**TINY["meta_train"], "retention_loss": -1.0}})


def test_meta_training_splits_the_recalled_score_by_reach_back():
    """A memory of the last 4 episodes (the tracker restarted 4 episodes back for every episode) gets every
    recalled answer of 1-4 episodes back and none further: the split says what the overall score hides."""
    from strategies.training.meta import MetaTraining, logged_metrics
    data = icr_data({**BLOCKS, "meta_sequence_episodes": 24, "meta_reach_back": 23})
    T, vocab = data.info.seq_len, data.info.vocab_size

    class LastEpisodes(TableOracle):
        def __init__(self, k):
            super().__init__(vocab, 64, "latest")
            self.k = k

        def forward(self, x, states=None):
            parts = x.split(T, dim=1)
            outs = [TableOracle.forward(self, torch.cat(parts[max(0, e - self.k):e + 1], 1))[0][:, -T:]
                    for e in range(len(parts))]
            return torch.cat(outs, 1) + 0.0 * self.unused, [TableState(torch.zeros(x.shape[0], 1, dtype=torch.long))]

    training = MetaTraining(LastEpisodes(4), data.meta_train, steps=1, batch_size=16, lr=1e-3, metric="accuracy",
                            log_every=1, recalled=data.meta_recalled, reach=data.meta_reach, grad_clip=None)
    row = [done.logged for done in training][0]
    assert row["accuracy_recalled_1_4"] == 1.0 and row["accuracy_recalled_5_16"] == 0.0
    assert row["accuracy_recalled_17_up"] == 0.0
    assert 0.0 < row["accuracy_recalled"] < 1.0
    assert logged_metrics(row, "accuracy")["meta_train/accuracy_recalled_5_16"] == 0.0
    with pytest.raises(ValueError, match="reach-back"):
        MetaTraining(LastEpisodes(4), data.meta_train, steps=1, batch_size=4, lr=1e-3, metric="accuracy",
                     reach=data.meta_reach)


def test_meta_training_logs_the_metric_on_recalled_answers_and_a_tracker_gets_them_all():
    """The logged rows carry ``accuracy_recalled`` (the answers to facts not presented in the episode)
    where the stream marks them: a perfect tracker scores 1 on them, a memory of one episode 0; single
    episodes (nothing recalled) log no such column."""
    from strategies.training.meta import MetaTraining, logged_metrics
    data = icr_data({**BLOCKS, "meta_sequence_episodes": 10, "meta_reach_back": 6})
    T = data.info.seq_len
    vocab = data.info.vocab_size

    class Tracker(TableOracle):           # its output carries a (zero) gradient, so a training step runs
        def forward(self, x, states=None):
            out, new = super().forward(x, states)
            return out + 0.0 * self.unused, new

    class Episodic(Tracker):              # the tracker from a fresh state at every episode
        def forward(self, x, states=None):
            outs = [Tracker.forward(self, xe)[0] for xe in x.split(T, dim=1)]
            return torch.cat(outs, 1), [TableState(torch.zeros(x.shape[0], 1, dtype=torch.long))]

    for oracle, expected in ((Tracker(vocab, 64, "latest"), 1.0), (Episodic(vocab, 64, "latest"), 0.0)):
        training = MetaTraining(oracle, data.meta_train, steps=2, batch_size=4, lr=1e-3, metric="accuracy",
                                log_every=1, recalled=data.meta_recalled, grad_clip=None)
        rows = [done.logged for done in training]
        assert [row["accuracy_recalled"] for row in rows] == [expected, expected]
        assert logged_metrics(rows[0], "accuracy")["meta_train/accuracy_recalled"] == expected
    single = icr_data({})
    training = MetaTraining(Tracker(single.info.vocab_size, 64, "latest"), single.meta_train, steps=1,
                            batch_size=4, lr=1e-3, metric="accuracy", recalled=single.meta_recalled, grad_clip=None)
    assert "accuracy_recalled" not in [done.logged for done in training][0]
