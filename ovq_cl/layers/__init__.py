"""Sequence mixers, all behind one contract (``y, state = mixer(x, state)``), and a registry by name."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

from ovq_cl.layers.base import Mixer
from ovq_cl.layers.delta import GatedDeltaNet
from ovq_cl.layers.linear import LinearAttention
from ovq_cl.layers.ovq import OVQAttention
from ovq_cl.layers.softmax import SlidingWindowAttention, SoftmaxAttention
from ovq_cl.layers.vq import VQAttention

MIXERS: Dict[str, Type[Mixer]] = {}


def register_mixer(name: str, cls: Type[Mixer]) -> Type[Mixer]:
    """Makes ``cls`` available to models and configs as ``name``."""
    if name in MIXERS and MIXERS[name] is not cls:
        raise ValueError(f"mixer name {name!r} is already registered to {MIXERS[name].__name__}")
    MIXERS[name] = cls
    return cls


def build_mixer(name: str, d_model: int, n_heads: int, options: Optional[Mapping[str, Any]] = None) -> Mixer:
    """Builds the mixer registered as ``name`` with its keyword options."""
    if name not in MIXERS:
        raise ValueError(f"unknown mixer {name!r}; known mixers: {sorted(MIXERS)}")
    return MIXERS[name](d_model=d_model, n_heads=n_heads, **dict(options or {}))


register_mixer("ovq", OVQAttention)
register_mixer("full", SoftmaxAttention)
register_mixer("linear", LinearAttention)
register_mixer("vq", VQAttention)
register_mixer("delta", GatedDeltaNet)
register_mixer("swa", SlidingWindowAttention)

__all__ = [
    "MIXERS", "GatedDeltaNet", "LinearAttention", "Mixer", "OVQAttention", "SlidingWindowAttention",
    "SoftmaxAttention", "VQAttention", "build_mixer", "register_mixer",
]
