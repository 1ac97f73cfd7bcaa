"""``validate`` keeps what it validated (a sweep validates the same options hundreds of times): a kept result
must be exactly what omegaconf would give, never shared between callers, and keyed by type as well as
value (omegaconf refuses True and 1.0 for an int where it takes 1)."""
from dataclasses import dataclass, field
from typing import List, Optional

import pytest
from omegaconf import OmegaConf

from ovq_cl.base import validation
from ovq_cl.base.validation import validate


@dataclass
class Schema:
    n: int = 2
    rate: float = 0.5
    name: Optional[str] = None
    xs: List[int] = field(default_factory=list)


def test_a_kept_result_is_keyed_by_type_not_only_by_value():
    assert validate(Schema, {"n": 1}).n == 1                       # kept under ("int", 1)
    for wrong in (True, 1.0):                                     # equal to 1 and with its hash, not an int
        with pytest.raises(ValueError, match="could not be converted to Integer"):
            validate(Schema, {"n": wrong})
    assert validate(Schema, {"rate": 1}).rate == 1.0 and validate(Schema, {"name": 1}).name == "1"


def test_callers_never_share_a_result_and_errors_are_raised_every_time():
    computed = validate(Schema, {"xs": [1, 2]})                    # computed (and kept)
    computed.xs.append(3)
    kept = validate(Schema, {"xs": [1, 2]})                        # from what was kept
    assert kept.xs == [1, 2]
    kept.xs.append(4)
    again = validate(Schema, {"xs": [1, 2]})
    assert again.xs == [1, 2] and again is not kept
    for _ in range(2):
        with pytest.raises(ValueError, match="nope"):
            validate(Schema, {"nope": 1})


def test_kept_results_equal_omegaconfs_for_every_mixer_and_values_it_cannot_key_bypass_it():
    from ovq_cl.layers import MIXERS, mixer_options

    for name in MIXERS.names():
        spec = MIXERS.get(name)
        for _ in range(2):                                            # computed, then kept
            assert mixer_options(name, {}) == validation._merge(spec.options_type, {}, name)
    ovq = {"num_slots": 64, "growth": "novelty", "novelty_threshold": 0.5}
    assert mixer_options("ovq", ovq) == mixer_options("ovq", dict(ovq)) == validation._merge(
        MIXERS.get("ovq").options_type, ovq, "ovq")
    before = len(validation._VALIDATED)
    assert validate(Schema, OmegaConf.create({"n": 7})).n == 7          # a DictConfig: validated, not kept
    assert len(validation._VALIDATED) == before


def test_a_config_file_and_overrides_are_parsed_once_yet_an_edit_is_always_read(tmp_path):
    """run_config keeps what a file and an override parse to (a sweep reads one file hundreds of times):
    kept by content, so a file rewritten within the clock's tick at the same size is read anew; a config
    never shares a value with another; a bad override is said every time."""
    from experiments.config import run_config

    path = tmp_path / "cfg.yaml"
    path.write_text("seed: 1\nstream: {name: icr, options: {n_experiences: 3}}\n")
    first = run_config(str(path), ["model.layers=[full]"])
    path.write_text("seed: 2\nstream: {name: icr, options: {n_experiences: 3}}\n")      # same size, at once
    second = run_config(str(path), ["model.layers=[full]"])
    assert (first.seed, second.seed) == (1, 2) and second.model.layers == ["full"]
    second.stream.options["n_experiences"] = 99
    second.model.layers.append("ovq")
    third = run_config(str(path), ["model.layers=[full]"])
    assert third.stream.options["n_experiences"] == 3 and third.model.layers == ["full"]
    for _ in range(2):
        with pytest.raises(ValueError, match="its value is not valid YAML"):
            run_config(str(path), ["model.layers=[full"])
