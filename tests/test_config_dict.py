"""``RunConfig.to_dict`` (what a run's identity hashes) builds plain dicts itself instead of through
omegaconf: it must give exactly omegaconf's result, in JSON too (1 and 1.0 hash apart), or finished runs
would stop being reused and records made before would stop matching their configs."""
import json

import pytest
from omegaconf import OmegaConf

from experiments import study, study_specs
from experiments.arguments import build_parser, parse_args
from experiments.config import plain_dict, run_config
from experiments.sweep import expand, parse_grid
from test_runner import TINY


def omegaconf_dict(cfg):
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def assert_same(cfg):
    ours, theirs = cfg.to_dict(), omegaconf_dict(cfg)
    assert json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True)
    assert ours == theirs


@pytest.mark.parametrize("layers", [["ovq"], ["full"], ["swa"], ["linear"], ["deltanet"], ["delta"], ["ssm"], ["vq"],
                                    ["ovq", "full"]])
def test_each_mixer_sized_to_a_budget_or_not_gives_omegaconfs_dict(layers):
    model = {**TINY["model"], "layers": layers, "n_layers": len(layers)}
    assert_same(run_config({**TINY, "model": model}))
    sized = {key: value for key, value in model.items() if key != "mixers"}
    assert_same(run_config({**TINY, "model": {**sized, "state_budget": 20000}}))


@pytest.mark.parametrize("strategy", [{"name": "ewc", "options": {"ewc_lambda": 3}}, {"name": "replay"},
                                      {"name": "lwf"}, {"name": "frozen"}])
def test_strategies_curves_after_meta_and_rules_give_omegaconfs_dict(strategy):
    cfg = run_config({**TINY, "strategy": {**TINY["strategy"], **strategy}, "precision": "bf16",
                      "gate": {"capacity_facts": [4, 8], "interference": ["episodes"], "delay": "experience"},
                      "after_meta": {"model": {"mixers": {"ovq": {"growth": "novelty", "novelty_threshold": 0.5}}}},
                      "meta_train": {"steps": 3, "lr": 1, "retention_loss": 1}})
    assert cfg.meta_train.lr == 1.0 and isinstance(cfg.meta_train.lr, float)     # omegaconf made the int a float
    assert_same(cfg)


def test_each_studys_first_configuration_gives_omegaconfs_dict():
    """The streams, recipes and rules the studies use: each study's first configuration, and the first of
    each config file (a check over every config of every study's full grid, 2,102 of them, found none
    apart when this was written; it takes two minutes)."""
    names = study_specs.study_names()
    chosen, files = [], set()
    for name in names:
        for k, (_, argv) in enumerate(study.sweep_commands(study_specs.load_study(name))):
            if k == 0 or argv[1] not in files:
                chosen.append(argv)
                files.add(argv[1])
    for argv in chosen:
        args = parse_args(build_parser(), argv)
        first = {key: values[:1] for key, values in parse_grid(args.grid).items()}
        (cfg,) = expand(args.config, args.overrides, first, plugins=args.plugin)
        assert_same(cfg)
    assert len(chosen) >= 20 and len(files) >= 5                 # (two studies only run searches)


def test_a_value_omegaconf_might_convert_differently_is_refused():
    cfg = run_config(TINY)
    cfg.stream.options["where"] = {1, 2}                        # a set: not a config value
    with pytest.raises(TypeError, match="not a plain config value"):
        cfg.to_dict()
    assert plain_dict({"a": (1, 2.0, None, "x", True)}) == {"a": [1, 2.0, None, "x", True]}   # tuples as lists


def test_a_config_is_checked_once_unless_it_changes(monkeypatch):
    """The runner resolves what run_config already validated without validating it again; a config changed
    since (or built by hand) is validated again, and its mistakes are still one line."""
    import pytest

    from experiments.config import RunConfig, run_config

    cfg = run_config({"stream": {"name": "icr", "options": {}}})
    calls = []
    real = RunConfig.check
    monkeypatch.setattr(RunConfig, "check", lambda self: calls.append(1) or real(self))
    again = cfg.checked()
    assert calls == [] and again == cfg and again is not cfg and again.model is not cfg.model
    cfg.strategy.lr = -1.0
    with pytest.raises(ValueError, match="strategy.lr"):
        cfg.checked()
    assert calls == [1]
    assert RunConfig().checked().stream.name == RunConfig().stream.name and calls == [1, 1]


def test_a_frozen_config_refuses_writes_and_stays_frozen_through_copies_and_pickles():
    """experiments.config.freeze: what a resolved run's phases read cannot change under them; it is still
    the same config (fields, identity, asdict), and a copy or a checkpoint's pickle of it is frozen too."""
    import copy
    import dataclasses
    import pickle

    from experiments.config import freeze

    cfg = run_config(TINY).checked()
    frozen = freeze(copy.deepcopy(cfg))
    assert isinstance(frozen, type(cfg)) and frozen.identity() == cfg.identity()
    assert dataclasses.asdict(frozen) == dataclasses.asdict(cfg)
    for again in (copy.deepcopy(frozen), pickle.loads(pickle.dumps(frozen))):
        assert again.identity() == cfg.identity()
        with pytest.raises(dataclasses.FrozenInstanceError, match="StrategySection.lr cannot change"):
            again.strategy.lr = 1.0
    cfg.strategy.lr = 1.0                              # the caller's own config is not touched
