"""Sequence mixers, all behind one contract (``y, state = mixer(x, state)``), and their registry.

A mixer is a :class:`Mixer` subclass with an ``Options`` dataclass (frozen, the single home of its
defaults). ``register_mixer(name, cls)`` makes it available to models and configs: the model config's
``mixers: {name: {...}}`` is validated against ``cls.Options``, from YAML or the command line
(``model.mixers.NAME.FIELD=...``), exactly as for the built-in ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Type

from ovq_cl.base import Registry, validate
from ovq_cl.layers.base import Mixer, MixerOptions
from ovq_cl.layers.delta import DeltaNet, DeltaNetOptions, GatedDeltaNet, GatedDeltaNetOptions
from ovq_cl.layers.linear import LinearAttention, LinearAttentionOptions
from ovq_cl.layers.ovq import OVQAttention, OVQOptions
from ovq_cl.layers.ssm import SSMMixer, SSMOptions
from ovq_cl.layers.softmax import FullAttentionOptions, SlidingWindowAttention, SlidingWindowOptions, SoftmaxAttention
from ovq_cl.layers.vq import VQAttention, VQAttentionOptions


@dataclass(frozen=True)
class MixerSpec:
    """A registered mixer: its class and its options dataclass."""

    cls: Type[Mixer]
    options_type: type


MIXERS: Registry[MixerSpec] = Registry("mixer", "ovq_cl.mixers")


def register_mixer(name: str, cls: Type[Mixer], options_type: Optional[type] = None) -> Type[Mixer]:
    """Makes ``cls`` available to models and configs as ``name``; its options are ``options_type``
    (default ``cls.Options``, which must be a dataclass subclassing :class:`MixerOptions`)."""
    options_type = options_type or cls.Options
    if not (isinstance(options_type, type) and issubclass(options_type, MixerOptions)):
        raise ValueError(f"register_mixer({name!r}): options must be a dataclass subclassing MixerOptions, "
                         f"got {options_type!r}")
    MIXERS.register(name, MixerSpec(cls, options_type))
    return cls


def mixer_options(name: str, user: Any = None):
    """The options of mixer ``name``: ``user`` (mapping, or an options instance) validated against its
    options dataclass, defaults filled in. Unknown keys and bad values are ValueErrors naming them."""
    spec = MIXERS.get(name)
    if isinstance(user, spec.options_type):
        return user
    return validate(spec.options_type, dict(user or {}), f"model.mixers.{name}")


def build_mixer(name: str, d_model: int, n_heads: int, options: Any = None) -> Mixer:
    """Builds the mixer registered as ``name`` (options: a mapping or its options instance)."""
    spec = MIXERS.get(name)
    return spec.cls(d_model=d_model, n_heads=n_heads, options=mixer_options(name, options))


register_mixer("ovq", OVQAttention)
register_mixer("full", SoftmaxAttention)
register_mixer("linear", LinearAttention)
register_mixer("vq", VQAttention)
register_mixer("delta", GatedDeltaNet)
register_mixer("deltanet", DeltaNet)
register_mixer("swa", SlidingWindowAttention)
register_mixer("ssm", SSMMixer)

__all__ = [
    "DeltaNet", "DeltaNetOptions", "FullAttentionOptions", "GatedDeltaNet", "GatedDeltaNetOptions", "LinearAttention", "LinearAttentionOptions",
    "MIXERS", "Mixer", "MixerOptions", "MixerSpec", "OVQAttention", "OVQOptions", "SlidingWindowAttention",
    "SlidingWindowOptions", "SoftmaxAttention", "SSMMixer", "SSMOptions", "VQAttention", "VQAttentionOptions", "build_mixer", "mixer_options",
    "register_mixer",
]
