"""A state budget sizes every mixer that has a knob: the largest knob whose state fits."""
import dataclasses

import pytest

from ovq_cl import DecoderLM, model_config
from ovq_cl.layers import MIXERS
from ovq_cl.layers.budget import size_to_budget, state_bytes

SIZED = {"ovq": "num_slots", "vq": "codebook_size", "swa": "window", "linear": "head_dim", "delta": "head_dim",
         "deltanet": "head_dim", "ssm": "head_dim"}


@pytest.mark.parametrize("budget", [32768, 67840, 270592])
@pytest.mark.parametrize("name", sorted(SIZED))
def test_the_largest_knob_that_fits(name, budget):
    assert MIXERS.get(name).cls.budget_knob == SIZED[name]
    options = size_to_budget(name, 64, 4, budget)
    knob = SIZED[name]
    value = getattr(options, knob)
    assert state_bytes(name, 64, 4, options) <= budget
    assert state_bytes(name, 64, 4, dataclasses.replace(options, **{knob: value + 1})) > budget


def test_known_answers_and_mixers_without_a_knob():
    # OVQ: N (2 Dk + 1) floats per head, 4 heads of 16: 67,584 B at N = 128 (study 1's size)
    assert size_to_budget("ovq", 64, 4, 67840).num_slots == 128
    assert size_to_budget("ovq", 64, 4, 67583).num_slots == 127
    full = size_to_budget("full", 64, 4, 1000)                       # the KV cache is not matched
    assert full == MIXERS.get("full").options_type()


def test_the_model_config_sizes_its_mixers_and_refuses_two_answers():
    cfg = model_config({"layers": ["swa", "ovq"], "state_budget": 67840, "mixers": {"ovq": {"chunk_size": 8}}})
    assert cfg.mixers["ovq"]["num_slots"] == 128 and cfg.mixers["ovq"]["chunk_size"] == 8
    assert cfg.mixers["swa"]["window"] == 133
    model = DecoderLM(cfg)
    assert model.mixers[1].options.num_slots == 128
    with pytest.raises(ValueError, match=r"num_slots is set \(64\) and model.state_budget sizes it.*"
                                         r"model.mixers.ovq.num_slots=null frees it"):
        model_config({"layers": ["ovq"], "state_budget": 67840, "mixers": {"ovq": {"num_slots": 64}}})


def test_a_null_budget_knob_is_unset_so_a_command_line_budget_can_size_what_a_yaml_pins():
    """`model.state_budget=16960 model.mixers.ovq.num_slots=null` on a config that pins 128 slots: the
    budget sizes OVQ (32 slots), as if the knob had never been set; without a budget, null is the default."""
    freed = model_config({"layers": ["ovq"], "state_budget": 16960, "mixers": {"ovq": {"num_slots": None, "chunk_size": 8}}})
    assert freed == model_config({"layers": ["ovq"], "state_budget": 16960, "mixers": {"ovq": {"chunk_size": 8}}})
    assert freed.mixers["ovq"]["num_slots"] == 32
    default = model_config({"layers": ["ovq"], "mixers": {"ovq": {"num_slots": None}}})
    assert default.mixers["ovq"]["num_slots"] == MIXERS.get("ovq").options_type().num_slots
    with pytest.raises(ValueError, match="below the smallest ovq state"):
        model_config({"layers": ["ovq"], "state_budget": 10})


@pytest.mark.parametrize("layers", [["ovq"], ["linear"], ["swa", "delta"]])
def test_a_resolved_config_resolves_to_itself(layers):
    """The runner checks a config that run_config already resolved: sizing twice changes nothing and is
    not mistaken for a knob given beside the budget."""
    once = model_config({"layers": layers, "state_budget": 67840})
    assert once.resolved() == once


def test_state_sizes_cli_prints_the_sizing(capsys):
    from experiments.cli import main

    assert main(["state-sizes", "--budget", "67840", "--d-model", "64", "--lengths", "800"]) == 0
    out = capsys.readouterr().out
    assert "num_slots=128" in out and "window=133" in out and "parameters" in out


@pytest.mark.parametrize("typed, meant", [("gated_deltanet", "'delta': Gated DeltaNet"), ("DeltaNet", None),
                                          ("delta-net", "'deltanet': DeltaNet"), ("mamba2", "'ssm'")])
def test_a_mixer_name_people_guess_says_which_name_it_has_here(typed, meant):
    """Gated DeltaNet is `delta` and DeltaNet `deltanet`: everyone guesses wrong once, so the refusal says."""
    if typed == "DeltaNet":                       # a registered name in another case: the list says it
        with pytest.raises(ValueError, match="unknown mixer 'DeltaNet' in layers; known: "):
            model_config({"layers": [typed]})
        return
    with pytest.raises(ValueError, match=f"did you mean {meant}"):
        model_config({"layers": [typed]})
