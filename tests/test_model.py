"""The decoder LM: hybrids, state threading, configs."""
import pytest
import torch

from ovq_cl import DecoderLM, model_config

from conftest import rel_err, state_storage_bytes

SMALL = {
    "vocab_size": 31, "d_model": 24, "n_heads": 3, "mixers": {
        "ovq": {"num_slots": 6, "chunk_size": 4}, "vq": {"codebook_size": 5, "chunk_size": 4},
        "swa": {"window": 5}, "delta": {"chunk_size": 4}},
}


@pytest.mark.parametrize("layers", [
    ["ovq"], ["full"], ["linear"], ["vq"], ["delta"], ["swa"], ["full", "ovq"], ["linear", "ovq", "full"],
    ["swa", "ovq", "delta"], ["vq", "swa", "linear"],
])
def test_split_calls_equal_one_call(layers):
    cfg = model_config({**SMALL, "layers": layers, "n_layers": 3 if len(layers) == 3 else 2})
    model = DecoderLM(cfg).double().eval()
    tokens = torch.randint(0, 31, (2, 21))
    logits, states = model(tokens)
    assert logits.shape == (2, 21, 31)
    assert [type(s.mixer).__name__ for s in states] == [m.state_type.__name__ for m in model.mixers]
    parts, s = [], None
    for a, b in [(0, 8), (8, 9), (9, 21)]:
        out, s = model(tokens[:, a:b], s)
        parts.append(out)
    assert rel_err(torch.cat(parts, 1), logits) < 1e-10
    assert [x.nbytes for x in s] == model.state_nbytes(21, batch_size=2)
    restored = model.states_from_state_dicts([x.state_dict() for x in s])
    more = torch.randint(0, 31, (2, 5))
    assert torch.equal(model(more, restored)[0], model(more, s)[0])


@pytest.mark.parametrize("token_shift", [True, False])
def test_token_by_token_equals_one_call_with_and_without_shift(token_shift):
    model = DecoderLM(model_config({**SMALL, "layers": ["ovq", "full"], "token_shift": token_shift})).double()
    tokens = torch.randint(0, 31, (2, 11))
    logits, _ = model(tokens)
    parts, s = [], None
    for t in range(11):
        out, s = model(tokens[:, t:t + 1], s)
        parts.append(out)
    assert rel_err(torch.cat(parts, 1), logits) < 1e-10
    assert (s[0].shift is not None) == token_shift


def test_hybrid_swa_ovq_pattern_as_in_the_paper():
    model = DecoderLM(model_config({**SMALL, "layers": ["swa", "ovq"], "n_layers": 4}))
    assert [type(m).__name__ for m in model.mixers] == ["SlidingWindowAttention", "OVQAttention"] * 2
    assert model.mixers[0].rope and not hasattr(model.mixers[1], "rope")   # position lives in the SWA layers


def test_aux_loss_collects_vq_commitment():
    model = DecoderLM(model_config({**SMALL, "layers": ["vq", "ovq"]}))
    model(torch.randint(0, 31, (2, 9)))
    aux = model.aux_loss()
    assert aux.requires_grad and float(aux.detach()) > 0
    assert float(DecoderLM(model_config({**SMALL, "layers": ["ovq"]})).aux_loss()) == 0.0


def test_layer_pattern_repeats_and_must_divide():
    cfg = model_config({**SMALL, "layers": ["full", "ovq"], "n_layers": 4})
    assert cfg.layer_kinds() == ["full", "ovq", "full", "ovq"]
    with pytest.raises(ValueError, match="does not divide"):
        DecoderLM(model_config({**SMALL, "layers": ["full", "ovq"], "n_layers": 3}))
    with pytest.raises(ValueError, match="unknown mixer"):
        DecoderLM(model_config({**SMALL, "layers": ["transformer"]}))


def test_config_rejects_unknown_keys_and_bad_types():
    with pytest.raises(ValueError, match="num_slotz"):
        model_config({"mixers": {"ovq": {"num_slotz": 4}}})
    with pytest.raises(ValueError, match="use model.mixers.ovq"):
        model_config({"ovq": {"num_slots": 4}})
    with pytest.raises(ValueError, match="unknown mixer 'transformer' in mixers"):
        model_config({"mixers": {"transformer": {}}})
    with pytest.raises(ValueError, match="growth must be one of"):
        model_config({"mixers": {"ovq": {"growth": "exponential"}}})


def test_the_resolved_config_holds_the_full_options_of_the_mixers_it_runs():
    cfg = model_config({**SMALL, "layers": ["swa", "ovq"]})
    assert sorted(cfg.mixers) == ["ovq", "swa"]                      # vq, delta validated, then dropped
    assert cfg.mixers["ovq"]["num_slots"] == 6 and cfg.mixers["ovq"]["growth"] == "plateau"
    assert cfg.mixers["swa"] == {"head_dim": None, "rope": True, "rope_base": 10000.0, "window": 5}
    model = DecoderLM(cfg)
    assert model.mixers[1].options.num_slots == 6 and model.mixers[0].options.window == 5
    with pytest.raises(ValueError, match="d_model"):
        model_config({"d_model": "wide"})


def test_tied_and_untied_heads():
    tied = DecoderLM(model_config({**SMALL, "tie_embeddings": True}))
    untied = DecoderLM(model_config({**SMALL, "tie_embeddings": False}))
    assert tied.head.weight is tied.embed.weight
    assert untied.head.weight is not untied.embed.weight
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == 31 * 24


def test_bad_tokens():
    model = DecoderLM(model_config(SMALL))
    with pytest.raises(ValueError, match="rank 2"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="integers"):
        model(torch.zeros(1, 5))
    with pytest.raises(ValueError, match="states"):
        model(torch.zeros(1, 5, dtype=torch.long), [None])


def test_a_few_steps_of_training_lower_the_loss():
    torch.manual_seed(0)
    model = DecoderLM(model_config({**SMALL, "layers": ["ovq"]}))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 31, (8, 16))
    losses = []
    for _ in range(30):
        logits, _ = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 31), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


@pytest.mark.parametrize("layers", [["ovq"], ["vq"], ["swa"], ["delta"], ["linear"]])
def test_model_states_keep_only_themselves_alive(layers):
    """Every block's state (mixer state and token shift) is its own memory: carrying states between
    calls must not keep the call's activations alive (a view such as h[:, -1:] would)."""
    model = DecoderLM(model_config({**SMALL, "layers": layers})).train()
    _, states = model(torch.randint(0, 31, (2, 97)))
    for state, expected in zip(states, model.state_nbytes(97, batch_size=2)):
        assert state_storage_bytes(state) <= expected + 4096
