"""The model config: a structured dataclass validated by omegaconf.

``layers`` picks the mixer of every block (a pattern repeated over ``n_layers``); ``mixers`` holds
each mixer's options by name, validated against the options dataclass the mixer registered
(``ovq_cl.layers.register_mixer``), so a user's mixer is configured exactly like a built-in one::

    model:
      layers: [swa, ovq]
      mixers:
        ovq: {num_slots: 128, chunk_size: 8}
        swa: {window: 32}

:func:`model_config` resolves a config: unknown keys, unknown mixers and bad option values are
ValueErrors naming them, and every mixer in ``layers`` gets its full options (defaults filled in), so
the resolved config (and the MLflow params) says exactly what ran: only the mixers in ``layers``
are kept after validation.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ovq_cl.base import validate


@dataclass
class ModelConfig:
    vocab_size: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    layers: List[str] = field(default_factory=lambda: ["ovq"])
    mlp_ratio: float = 4.0
    tie_embeddings: bool = True
    token_shift: bool = True           # mixer input mixes in the previous token (see model.Block)
    mixers: Dict[str, Any] = field(default_factory=dict)   # mixer name -> its options (see module doc)
    state_budget: Optional[int] = None     # bytes per layer and lane: sizes every mixer that has a budget knob

    def layer_kinds(self) -> List[str]:
        """The mixer name of every block: ``layers`` itself, or repeated if it divides n_layers."""
        if not self.layers:
            raise ValueError("model config: layers must name at least one mixer")
        if self.n_layers < 1:
            raise ValueError(f"model config: n_layers must be >= 1, got {self.n_layers}")
        if self.n_layers % len(self.layers):
            raise ValueError(
                f"model config: the layer pattern {list(self.layers)} (length {len(self.layers)}) "
                f"does not divide n_layers={self.n_layers}"
            )
        return list(self.layers) * (self.n_layers // len(self.layers))

    def mixer_options(self, name: str):
        """The options instance of mixer ``name`` (its ``mixers`` entry validated, defaults filled in)."""
        from ovq_cl.layers import mixer_options

        return mixer_options(name, self.mixers.get(name))

    def resolved(self) -> "ModelConfig":
        """A new config: every mixer's options validated (a typo in an unused mixer's options is an error
        too), then ``mixers`` reduced to the mixers of ``layers``, each with its full options: the
        resolved config says exactly what runs. Raises ValueError naming the first bad key."""
        from ovq_cl.layers import MIXERS, mixer_options

        self.layer_kinds()
        # a budget knob set to null is unset (its default, or the budget's size): how a command line frees a
        # knob its YAML pins, e.g. `model.state_budget=16960 model.mixers.ovq.num_slots=null`
        mixers = {name: ({k: v for k, v in opts.items()
                          if not (v is None and name in MIXERS and k == MIXERS.get(name).cls.budget_knob)}
                         if hasattr(opts, "items") else opts)
                  for name, opts in self.mixers.items()}
        for name in self.layers:
            if name not in MIXERS:
                raise ValueError(f"model config: unknown mixer {name!r} in layers; known: {MIXERS.names()}"
                                 + _did_you_mean(name))
            mixers.setdefault(name, {})
        for name in mixers:
            if name not in MIXERS:
                raise ValueError(f"model config: unknown mixer {name!r} in mixers; known: {MIXERS.names()}"
                                 + _did_you_mean(name))
        full = {name: dataclasses.asdict(mixer_options(name, mixers[name])) for name in sorted(mixers)}
        if self.state_budget is not None:
            full.update(self._sized(full, mixers))
        return dataclasses.replace(self, mixers={name: full[name] for name in sorted(set(self.layers))})


    def _sized(self, full: Dict[str, Dict[str, Any]], given: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
        """The options of the mixers in ``layers`` sized to ``state_budget`` (ovq_cl.layers.budget)."""
        from ovq_cl.layers import MIXERS
        from ovq_cl.layers.budget import size_to_budget

        if self.state_budget < 1:
            raise ValueError(f"model config: state_budget must be >= 1 byte, got {self.state_budget}")
        sized = {}
        for name in sorted(set(self.layers)):
            knob = MIXERS.get(name).cls.budget_knob
            set_value = None if knob is None else dict(given.get(name) or {}).get(knob)
            free = dict(full[name]) if knob is None else {**full[name], knob: getattr(MIXERS.get(name).options_type(), knob)}
            options = size_to_budget(name, self.d_model, self.n_heads, self.state_budget, free)
            # a knob already equal to the budget's value is a resolved config resolved again (idempotent)
            if set_value is not None and set_value != getattr(options, knob):
                raise ValueError(f"model config: model.mixers.{name}.{knob} is set ({set_value}) and model.state_budget "
                                 f"sizes it: give one of the two (model.mixers.{name}.{knob}=null frees it)")
            sized[name] = dataclasses.asdict(options)
        return sized


#: names people type for a mixer, and its name here (Gated DeltaNet is ``delta``, DeltaNet ``deltanet``)
MIXER_ALIASES = {"gated_deltanet": "delta", "gated_delta": "delta", "gdn": "delta", "gateddeltanet": "delta",
                 "delta_net": "deltanet", "mamba": "ssm", "mamba2": "ssm", "gla": "ssm", "attention": "full",
                 "softmax": "full", "sliding_window": "swa", "based": "linear"}


def _did_you_mean(name: str) -> str:
    """`` (did you mean 'delta', Gated DeltaNet?)`` for a name people use for a mixer of another name here."""
    key = str(name).lower().replace("-", "_")
    if key in MIXER_ALIASES:
        meant = MIXER_ALIASES[key]
        what = {"delta": "Gated DeltaNet (delta rule with decay)", "deltanet": "DeltaNet (the delta rule, no decay)",
                "ssm": "the Mamba-2-style SSM", "full": "causal softmax attention", "swa": "sliding-window attention",
                "linear": "linear attention (Based: feature_map taylor)"}[meant]
        return f" (did you mean {meant!r}: {what}?)"
    return ""


def check_moved_keys(user: Any, where: str = "model") -> None:
    """A clear error for configs written before mixers owned their options (``model.ovq.num_slots``)."""
    from ovq_cl.layers import MIXERS

    if hasattr(user, "keys"):
        moved = [k for k in user.keys() if k in MIXERS]
        if moved:
            raise ValueError(f"{where}: mixer options live under {where}.mixers.NAME now: got "
                             + ", ".join(f"{where}.{k} (use {where}.mixers.{k})" for k in moved))


def model_config(user: Any = None) -> ModelConfig:
    """The resolved model config of ``user`` (mapping, DictConfig, ModelConfig or None)."""
    if user is not None and not dataclasses.is_dataclass(user):
        check_moved_keys(user)
    return validate(ModelConfig, user, "model config").resolved()
