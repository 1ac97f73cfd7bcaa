"""after_meta.model: memory rules that take effect after meta-training, on the same meta-trained weights."""
import os

import pytest

from experiments.config import run_config
from experiments.runner import run
from strategies.training.checkpoint import load_checkpoint
from test_runner import TINY, checkpoint_file, in_tmp, store  # noqa: F401  (in_tmp and store are fixtures)

# the plateau growth's options as the OVQ mixer defaults them: an override that changes nothing
SAME = {"mixers": {"ovq": {"growth": "plateau", "count_decay": 1.0}}}
# a rule that changes what the dictionary does with the same weights: counts forget fast
OTHER = {"mixers": {"ovq": {"count_decay": 0.5}}}


def cfg(root, name, after=None, share=True, **extra):
    """A tiny frozen ICR run; its checkpoints in a folder of its own, the meta cache shared (``share``)."""
    user = {**TINY, "strategy": {**TINY["strategy"], "name": "frozen"}, "tracking": {"experiment": name},
            "checkpoint": {"dir": str(root / "ckpt" / name), "share_meta": share}, **extra}
    if after is not None:
        user["after_meta"] = {"model": after}
    return run_config(user)


def final_counts(run_cfg):
    """The OVQ slot counts [B, H, N] carried at the end of the stream (the run's last checkpoint)."""
    return _counts_at(checkpoint_file(run_cfg))


def _counts_at(path):
    (block,) = load_checkpoint(path)["states"]
    return block["mixer.counts"]


def test_an_override_that_changes_nothing_computes_the_same_run(in_tmp):
    root, _ = in_tmp
    plain = run(cfg(root, "am_plain"))
    same = run(cfg(root, "am_same", SAME, share=False))
    assert cfg(root, "x", SAME).identity() != cfg(root, "x").identity()          # a run of its own
    assert same.R == plain.R and same.gate == plain.gate and same.meta_history == plain.meta_history
    assert final_counts(cfg(root, "am_same", SAME)).equal(final_counts(cfg(root, "am_plain")))
    assert cfg(root, "x", {}).identity() == cfg(root, "x").identity()             # nothing to merge: the old identity


def test_a_rule_after_meta_training_keeps_the_meta_training_and_changes_the_stream(in_tmp):
    root, uri = in_tmp
    meta = root / "ckpt" / "meta_shared"
    plain = run(cfg(root, "am_plain2", checkpoint={"dir": str(meta)}))
    other = run(cfg(root, "am_other", OTHER, checkpoint={"dir": str(meta)}))   # loads plain's meta-training
    assert len([f for f in os.listdir(meta / "meta") if f.endswith(".pt")]) == 1
    alone = run(cfg(root, "am_other_alone", OTHER, share=False))               # meta-trains itself
    assert other.meta_history == plain.meta_history == alone.meta_history       # meta-training is model's alone
    assert other.R == alone.R and other.gate == alone.gate
    # the rule acts in the stream: counts discounted by 0.5 a chunk stay below 1 / (1 - 0.5) chunks' keys
    # (plain's own last checkpoint: this test must not read what another test left behind)
    counts, plain_counts = final_counts(cfg(root, "am_other_alone", OTHER)), _counts_at(plain.checkpoint)
    chunk = TINY["model"]["mixers"]["ovq"]["chunk_size"]
    assert counts.max() <= 2 * chunk < plain_counts.max()


    from experiments.tracking import runs_table
    (row,) = runs_table("am_other", uri)
    assert row["params"]["after_meta.model.mixers.ovq.count_decay"] == "0.5"
    assert row["tags"]["after_meta.model"] == '{"mixers": {"ovq": {"count_decay": 0.5}}}'


def test_a_run_resumed_in_the_stream_resumes_with_the_stream_model(in_tmp):
    root, _ = in_tmp
    import time

    began = time.perf_counter()
    straight = run(cfg(root, "am_straight", OTHER, share=False))
    took = time.perf_counter() - began
    # its wall time counts meta-training too, done before the stream model's session was made
    assert 0.5 * took < straight.wall_seconds <= took and straight.attempts == 1
    resumed_cfg = cfg(root, "am_resumed", OTHER, share=False)
    assert run(resumed_cfg, stop_after=0).after_experience == 0
    resumed = run(resumed_cfg)
    assert resumed.R == straight.R and resumed.gate == straight.gate and resumed.attempts == 2


@pytest.mark.parametrize("after, message", [
    ({"d_model": 16}, "after_meta.model.d_model: only mixers can change after meta-training"),
    ({"mixers": {"delta": {"chunk_size": 4}}}, "'delta' is not in model.layers"),
    ({"mixers": {"ovq": {"growth": "sometimes"}}}, "growth"),
    ({"mixers": {"ovq": {"no_such_option": 1}}}, "no_such_option"),
])
def test_bad_after_meta_options_are_one_line_before_anything_runs(tmp_path, after, message):
    with pytest.raises(ValueError, match=message) as err:
        cfg(tmp_path, "bad", after)
    assert "\n" not in str(err.value)


def test_an_override_that_changes_the_weights_is_refused_before_meta_training(tmp_path, monkeypatch):
    import experiments.runner as runner

    monkeypatch.setattr(runner, "MetaTraining", lambda *a, **k: pytest.fail("meta-training started"))
    bad = cfg(tmp_path, "weights", {"mixers": {"ovq": {"head_dim": 8}}}, tracking={"enabled": False})
    with pytest.raises(ValueError, match=r"changes the weights \(blocks.0.mixer.k_proj.weight: \(32, 32\) after meta-training, \(16, 32\) in the stream"):
        run(bad)


def test_a_rule_after_meta_training_on_a_budget_sized_model_keeps_the_meta_training(in_tmp):
    """Sizing a mixer to ``model.state_budget`` builds one, which draws from the global RNG: resolving the
    stream's model (after_meta merged) must not shift what meta-training draws, or the weights shared
    between rules (checkpoint.share_meta) would differ from each rule's own."""
    root, _ = in_tmp
    model = {**TINY["model"], "state_budget": 4000, "mixers": {"ovq": {"chunk_size": 4}}}
    plain = run(cfg(root, "am_budget_plain", share=False, model=model))
    other = run(cfg(root, "am_budget_other", OTHER, share=False, model=model))
    assert other.meta_history == plain.meta_history and other.gate == plain.gate


def test_a_larger_dictionary_at_test_time_keeps_the_weights_and_grows_the_state_and_its_schedule(in_tmp):
    """Eval-time N (issue 30): ``after_meta.model.mixers.ovq.num_slots`` grows OVQ's dictionary after
    meta-training. The meta-training, the weights' count and the parameters are those of the trained
    model; the dictionary in the state carried (and the capacity bound) grows 4x; the run is a configuration
    of its own. It is not only more room: the plateau schedule G(t) = N t / (N + t) ties the rate at which
    slots open to N, so from the first tokens a larger N has more slots open (known answers below)."""
    from ovq_cl.ops.ovq.common import OVQParams, growth_target

    assert [growth_target(100, OVQParams(num_slots=n)) for n in (128, 2048)] == [57, 96]
    assert [growth_target(800, OVQParams(num_slots=n)) for n in (128, 2048)] == [111, 576]
    root, _ = in_tmp
    shared = {"checkpoint": {"dir": str(root / "ckpt" / "slots_shared")}}
    plain = run(cfg(root, "slots16", **shared))
    wider = run(cfg(root, "slots64", {"mixers": {"ovq": {"num_slots": 64}}}, gate={"capacity_facts": [2]}, **shared))
    assert wider.meta_history == plain.meta_history and wider.parameters == plain.parameters
    assert wider.probes["capacity"]["bound_per_layer"] == [64]
    # the dictionary (keys, values, counts per slot) grows 4x; what does not scale with N stays
    assert all(3 * b < w < 4 * b for b, w in zip(plain.state_bytes_per_lane, wider.state_bytes_per_lane))
    assert cfg(root, "x", {"mixers": {"ovq": {"num_slots": 64}}}).identity() != cfg(root, "x").identity()
