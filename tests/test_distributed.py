"""Data-parallel runs under torchrun (strategies.training.distributed): two gloo processes give the result
matrix, the carried memory and the weights of one process, and a run resumes with another world size.

Four launches of one tiny config: one process; two processes; one process killed after experience 1
and resumed by two (its lanes re-sharded). Agreement is within float32 tolerance (relative 1e-4 for R:
the ranks' sums of gradients and statistics are ordered differently from one process's; measured
differences are ~1e-6). The config exercises meta-training, weight training with a plugin that has
state, OVQ with novelty growth and merges (ints summarising the lanes: the longest prefix, summed merge
counts), VQ's EMA codebook (its statistics all-reduced), and a last partial eval minibatch that leaves
rank 1 no lane to compute.
"""
import glob
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from test_extensions import ROOT, ovq_cl

CONFIG = textwrap.dedent("""
    plugins: [plugins.extension]
    stream:
      name: icl
      options: {encoding: continuous, n_experiences: 3, functions_per_experience: 2, d_x: 2, d_y: 1,
                examples_per_episode: 6, queries_per_episode: 2, train_episodes: 8, test_episodes: 6}
    model:
      d_model: 16
      n_layers: 2
      n_heads: 2
      layers: [ovq, vq]
      mixers:
        ovq: {num_slots: 4, chunk_size: 4, growth: novelty, novelty_threshold: 0.9, when_full: merge}
        vq: {codebook_size: 8, chunk_size: 4}
    strategy: {name: anchor, lr: 0.01, train_mb_size: 4, options: {strength: 0.05}}
    meta_train: {steps: 4, batch_size: 4, lr: 3.0e-3}
    gate: {episodes: 4}
""")


def torchrun(tmp, *args, env=None):
    environment = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "tests"), "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "experiments.cli", *args]
    return subprocess.run(cmd, cwd=tmp, env=environment, capture_output=True, text=True, timeout=300)


def checkpoint(tmp, store):
    import ovq_cl.base.avalanche_compat  # noqa: F401
    from strategies.training.checkpoint import load_checkpoint

    (path,) = glob.glob(os.path.join(tmp, "ckpt", store, "*", "last.pt"))
    return load_checkpoint(path)


def assert_same_run(a, b):
    """R, every lane's carried state (ints exactly) and the weights of two checkpoints, within float32
    tolerance."""
    np.testing.assert_allclose(np.array(a["metrics"]["results"]["R"], dtype=float),
                               np.array(b["metrics"]["results"]["R"], dtype=float), rtol=1e-4, atol=1e-6)
    for sa, sb in zip(a["states"], b["states"]):              # flat {name: tensor}: ints are 0-d int64
        assert sa.keys() == sb.keys()
        for key, ta in sa.items():
            tb = sb[key]
            if ta.is_floating_point():
                assert ta.shape == tb.shape and ta.shape[0] == 4, key          # every lane, gathered
                np.testing.assert_allclose(ta.numpy(), tb.numpy(), rtol=1e-3, atol=1e-4, err_msg=key)
            else:
                assert ta.tolist() == tb.tolist(), key
    for key, wa in a["model"].items():
        np.testing.assert_allclose(wa.float().numpy(), b["model"][key].float().numpy(), rtol=1e-3, atol=1e-3,
                                   err_msg=key)


@pytest.mark.slow
def test_two_processes_give_one_process_run_and_a_run_resumes_with_another_world_size(tmp_path, new_store):
    from experiments.tracking import runs_table

    (tmp_path / "cfg.yaml").write_text(CONFIG)
    for store in ("one", "two", "mixed", "frozen"):
        new_store(tmp_path / (store + ".db"))

    def args(store, config="cfg.yaml"):
        return ["run", config, f"tracking.tracking_uri=sqlite:///{tmp_path / (store + '.db')}",
                f"checkpoint.dir=ckpt/{store}", "--quiet"]

    one = ovq_cl(tmp_path, *args("one"))
    assert one.returncode == 0, one.stderr[-2000:]
    two = torchrun(tmp_path, *args("two"))
    assert two.returncode == 0, (two.stdout + two.stderr)[-3000:]
    assert two.stdout.count("MLflow run:") == 1                        # rank 0 alone prints the result
    # Avalanche warns of plugins that do not declare supports_distributed: the user's, none of ours
    assert "plugins.extension.AnchorPlugin" in two.stderr and "<class 'strategies." not in two.stderr
    # a run that trains nothing (no meta-training, weights frozen) is one run whatever its world size: killed
    # in one process, it resumes under two; one that trains weights is not (its identity holds the world size)
    (tmp_path / "frozen.yaml").write_text(CONFIG.replace(
        "strategy: {name: anchor, lr: 0.01, train_mb_size: 4, options: {strength: 0.05}}",
        "strategy: {name: frozen_hooks, train_mb_size: 4}"))
    untrained = ["meta_train.steps=0"]

    frozen_one = ovq_cl(tmp_path, *args("frozen", "frozen.yaml"), *untrained)
    assert frozen_one.returncode == 0, frozen_one.stderr[-2000:]
    killed = ovq_cl(tmp_path, *args("mixed", "frozen.yaml"), *untrained, env={"EXTENSION_KILL_BEFORE": "2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert checkpoint(tmp_path, "mixed")["next_experience"] == 2      # rows 0-1 by one process
    resumed = torchrun(tmp_path, *args("mixed", "frozen.yaml"), *untrained)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]

    reference = checkpoint(tmp_path, "one")
    ovq_state = reference["states"][0]
    assert int(ovq_state["mixer.merges"]) > 0 and int(ovq_state["mixer.n_active"]) == 4    # the rules acted
    assert_same_run(checkpoint(tmp_path, "two"), reference)          # here, within float32 tolerance
    assert_same_run(checkpoint(tmp_path, "mixed"), checkpoint(tmp_path, "frozen"))
    one_id, = {r["tags"]["config_id"] for r in runs_table("ovq-cl", f"sqlite:///{tmp_path / 'one.db'}")}
    two_id, = {r["tags"]["config_id"] for r in runs_table("ovq-cl", f"sqlite:///{tmp_path / 'two.db'}")}
    assert one_id != two_id                                           # training under two ranks: another run
    # one MLflow run per store (rank 1 tracks nothing), finished, with the world size of its last attempt
    for store, tags in (("mixed", {"world_size": "2", "resumed_at_experience": "2"}), ("two", {"world_size": "2"})):
        runs = runs_table("ovq-cl", f"sqlite:///{tmp_path / (store + '.db')}")
        assert [r["status"] for r in runs] == ["FINISHED"], runs
        assert all(runs[0]["tags"].get(k) == v for k, v in tags.items()), runs[0]["tags"]


def test_batches_must_split_across_the_ranks_and_sweeps_are_refused_under_torchrun(tmp_path, monkeypatch, capsys):
    from experiments.cli import main
    from strategies.training import distributed

    assert distributed.DataParallel(1, 2, 1, "gloo").lane_range(4, 4) == (2, 4)
    assert distributed.DataParallel(1, 2, 1, "gloo").lane_range(2, 4) == (2, 2)     # a partial batch: none
    assert distributed.DataParallel(0, 2, 0, "gloo").lane_range(3, 4) == (0, 2)
    monkeypatch.setattr(distributed, "_ACTIVE", distributed.DataParallel(0, 3, 0, "gloo"))
    with pytest.raises(ValueError, match="strategy.train_mb_size=4 does not split across 3 processes"):
        distributed.check_divisible(**{"strategy.train_mb_size": 4})
    monkeypatch.setattr(distributed, "_ACTIVE", None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "cfg.yaml", "--grid", "seed=0;1"]) == 2
    assert "under torchrun" in capsys.readouterr().err


def test_rank_weights_make_the_mean_of_local_losses_the_whole_batchs_loss(monkeypatch):
    """Two ranks simulated in one process: rank r's loss weighted by loss_weight (W n_r / N) and averaged
    over ranks (what averaging the gradients does) is the loss of the whole batch, also when the ranks'
    lanes hold different numbers of scored answers."""
    import torch

    from strategies.training import distributed
    from strategies.evaluation.metrics import sequence_loss
    from strategies.training.step import n_answers

    torch.manual_seed(0)
    out, y = torch.randn(4, 6, 5, dtype=torch.float64), torch.randint(0, 5, (4, 6))
    y[0, :5] = -100                                    # rank 0's lanes: 7 answers, rank 1's: 12
    halves = [(out[:2], y[:2]), (out[2:], y[2:])]
    counts = [n_answers(h[1]) for h in halves]
    assert counts == [7, 12]
    weighted = []
    for rank, (o, t) in enumerate(halves):
        monkeypatch.setattr(distributed, "_ACTIVE", distributed.DataParallel(rank, 2, rank, "gloo"))
        monkeypatch.setattr(distributed, "all_reduce_sum", lambda t, other=counts[1 - rank]: t + other)
        weighted.append(distributed.loss_weight(n_answers(t)) * sequence_loss(o, t))
    torch.testing.assert_close(sum(weighted) / 2, sequence_loss(out, y))
    yf = torch.randn(4, 6, 3, dtype=torch.float64)
    yf[1, 2:] = float("nan")                           # regression targets: answers count every output dim
    assert n_answers(yf[:2]) == 8 * 3 and n_answers(yf[2:]) == 12 * 3


@pytest.mark.parametrize("tbptt", [0, 3])
def test_a_step_on_two_simulated_ranks_is_the_one_process_step(monkeypatch, tbptt):
    """train_step on each half of the lanes (two ranks simulated in one process, each on its own copy
    of the model), gradients averaged, equals train_step on all lanes: with and without truncated BPTT,
    with VQ's commitment loss and with the ranks' answers unevenly spread over the segments (float64)."""
    import copy

    import torch

    from ovq_cl import DecoderLM, model_config
    from strategies.training import distributed
    from strategies.training.step import n_answers, train_step

    from ovq_cl.layers.vq import VQAttention

    # the codebook's EMA step (summed over real ranks, end-to-end test above) would see half the lanes here
    monkeypatch.setattr(VQAttention, "_ema_update", lambda self, k, codes: None)
    torch.manual_seed(0)
    model = DecoderLM(model_config({"vocab_size": 11, "d_model": 16, "n_layers": 1, "n_heads": 2, "layers": ["vq"],
                                    "mixers": {"vq": {"codebook_size": 4, "chunk_size": 2}}})).double()
    x, y = torch.randint(0, 11, (4, 8)), torch.randint(0, 11, (4, 8))
    y[0, :6] = -100                                    # rank 0's lanes: few answers, none in early segments
    y[3, 4:] = -100

    def grads(m):
        return [p.grad.clone() for p in m.parameters() if p.requires_grad]

    whole = copy.deepcopy(model)
    train_step(whole, torch.optim.SGD(whole.parameters(), lr=0.0), x, y, None, tbptt=tbptt)
    halves = [(x[:2], y[:2]), (x[2:], y[2:])]
    starts = range(0, 8, tbptt) if tbptt else [0]
    width = tbptt or 8
    counts = [torch.tensor([float(n_answers(t[:, lo:lo + width])) for lo in starts], dtype=torch.float64)
              for _, t in halves]
    ranks = []
    for rank, (xr, yr) in enumerate(halves):
        replica = copy.deepcopy(model)
        monkeypatch.setattr(distributed, "_ACTIVE", distributed.DataParallel(rank, 2, rank, "gloo"))
        monkeypatch.setattr(distributed, "all_reduce_sum",
                            lambda t, other=counts[1 - rank]: t + (other if t.numel() == other.numel() else other.sum()))
        monkeypatch.setattr(distributed, "all_ranks", lambda flag: flag)
        monkeypatch.setattr(distributed, "average_gradients", lambda m: None)     # averaged below
        train_step(replica, torch.optim.SGD(replica.parameters(), lr=0.0), xr, yr, None, tbptt=tbptt)
        ranks.append(grads(replica))
    for g_whole, g0, g1 in zip(grads(whole), *ranks):
        torch.testing.assert_close((g0 + g1) / 2, g_whole)
