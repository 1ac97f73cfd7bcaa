"""Structured model configs (dataclasses), validated by omegaconf.

One dataclass per mixer kind, whose fields are that layer's keyword arguments; ``ModelConfig`` holds
one of each, and ``layers`` picks the mixer of every block (a pattern repeated over ``n_layers``).
Unknown keys and wrong types are errors, raised as ``ValueError`` naming the key.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, List, Optional

from ovq_cl.base import validate


@dataclass
class OVQConfig:
    head_dim: Optional[int] = None
    num_slots: int = 256
    chunk_size: int = 32
    growth: str = "plateau"            # plateau | linear
    growth_alpha: Optional[float] = None  # plateau speed; None -> num_slots
    growth_rate: float = 1.0           # slope of linear growth
    init: str = "spread"               # spread | random
    state_grad: str = "full"           # full | detach
    beta_init: float = 8.0
    learn_beta: bool = True
    init_seed: int = 0
    backend: str = "auto"
    recompute_chunks: int = 0          # training: keep the graph of 1 in S chunks, recompute the rest (0 = off)


@dataclass
class FullAttentionConfig:
    head_dim: Optional[int] = None
    rope: bool = True
    rope_base: float = 10000.0


@dataclass
class LinearAttentionConfig:
    head_dim: Optional[int] = None
    feature_map: str = "elu1"          # elu1 | relu | identity
    normalize: bool = True
    chunk_size: int = 64


@dataclass
class VQAttentionConfig:
    head_dim: Optional[int] = None
    codebook_size: int = 256
    chunk_size: int = 32
    beta_init: float = 8.0
    learn_beta: bool = True
    ema_decay: float = 0.99
    commitment_weight: float = 1e-4
    state_grad: str = "full"           # full | detach
    recompute_chunks: int = 0          # training: keep the graph of 1 in S chunks, recompute the rest (0 = off)


@dataclass
class GatedDeltaNetConfig:
    head_dim: Optional[int] = None
    chunk_size: int = 64
    backend: str = "auto"              # auto | naive | recurrent | fla
    dt_min: float = 0.001              # initial decay step sizes, log-uniform in [dt_min, dt_max]
    dt_max: float = 0.1


@dataclass
class SlidingWindowConfig:
    head_dim: Optional[int] = None
    window: int = 64
    rope: bool = True
    rope_base: float = 10000.0


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
    ovq: OVQConfig = field(default_factory=OVQConfig)
    full: FullAttentionConfig = field(default_factory=FullAttentionConfig)
    linear: LinearAttentionConfig = field(default_factory=LinearAttentionConfig)
    vq: VQAttentionConfig = field(default_factory=VQAttentionConfig)
    delta: GatedDeltaNetConfig = field(default_factory=GatedDeltaNetConfig)
    swa: SlidingWindowConfig = field(default_factory=SlidingWindowConfig)

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

    def mixer_options(self, name: str) -> dict:
        """Keyword options of mixer ``name`` (its sub-config as a dict; {} if it has none)."""
        sub = getattr(self, name, None)
        if sub is None or not dataclasses.is_dataclass(sub):
            return {}
        return dataclasses.asdict(sub)


def model_config(user: Any = None) -> ModelConfig:
    return validate(ModelConfig, user, "model config")
