"""The run config: one structured config (dataclasses) for a whole run, validated by omegaconf.

A YAML file under ``experiments/configs/`` plus ``key=value`` overrides (omegaconf dotlist) resolve to
a :class:`RunConfig`; unknown keys and wrong types are ValueErrors naming the key. The stream's own
options are validated by that stream's config (``streams.icr.ICRConfig`` etc.).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ovq_cl.base import load_plugins, validate
from ovq_cl.config import ModelConfig, check_moved_keys

@dataclass
class StreamSection:
    name: str = "icr"                      # icr | icl | text
    options: Dict[str, Any] = field(default_factory=dict)


@dataclass
class StrategySection:
    name: str = "frozen"                   # a registered strategy: frozen | naive | ewc | replay | lwf | yours
    lr: float = 1e-3
    train_mb_size: int = 8                 # lanes: lane b of minibatch m+1 continues lane b of minibatch m
    epochs: int = 1
    grad_clip: Optional[float] = 1.0
    options: Dict[str, Any] = field(default_factory=dict)   # the strategy's own options (its dataclass)


@dataclass
class MemorySection:
    policy: str = "persist"                # persist | reset_experience | reset_episode


@dataclass
class MetaTrainSection:
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3


@dataclass
class GateSection:
    """The learned gate (``strategies.gate``): skill = (score - chance) / (perfect - chance)."""
    episodes: int = 256                    # held-out meta-training episodes, each from a fresh state
    batch_size: int = 64
    min_skill: float = 0.5                 # held-out skill to count as learned
    min_stream_skill: float = 0.1          # skill of the mean learning score R[j][j] on the stream


@dataclass
class TrackingSection:
    enabled: bool = True
    experiment: str = "ovq-cl"
    tracking_uri: Optional[str] = None     # None: $MLFLOW_TRACKING_URI, else sqlite:///mlruns.db
    run_name: Optional[str] = None


@dataclass
class CheckpointSection:
    enabled: bool = True
    dir: str = "outputs/checkpoints"
    resume: bool = True                    # resume from the last checkpoint of the same config


@dataclass
class RunConfig:
    seed: int = 0
    stream: StreamSection = field(default_factory=StreamSection)
    model: ModelConfig = field(default_factory=ModelConfig)
    strategy: StrategySection = field(default_factory=StrategySection)
    memory: MemorySection = field(default_factory=MemorySection)
    meta_train: MetaTrainSection = field(default_factory=MetaTrainSection)
    gate: GateSection = field(default_factory=GateSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    output_dir: str = "outputs"
    progress: bool = False
    plugins: List[str] = field(default_factory=list)   # modules that register user mixers, streams, ... (imported first)

    def check(self) -> "RunConfig":
        """Validates every section against its registry and fills the options in (a ValueError naming the
        first bad key): mixers, stream, strategy. Nothing runs before this passes."""
        import dataclasses as dc

        from strategies.registry import STRATEGIES, strategy_options

        if self.strategy.name not in STRATEGIES:
            raise ValueError(f"run config: unknown strategy {self.strategy.name!r}; known: {STRATEGIES.names()}")
        self.strategy.options = dc.asdict(strategy_options(self.strategy.name, self.strategy.options))
        if self.strategy.train_mb_size < 1:
            raise ValueError(f"run config: strategy.train_mb_size must be >= 1, got {self.strategy.train_mb_size}")
        from strategies.memory import POLICIES

        if self.memory.policy not in POLICIES:
            raise ValueError(f"run config: memory.policy must be one of {POLICIES}, got {self.memory.policy!r}")
        self.model = self.model.resolved()
        from streams import check_stream_options

        check_stream_options(self.stream.name, self.stream.options)
        if self.gate.episodes < 1 or self.gate.batch_size < 1:
            raise ValueError(f"run config: gate.episodes and gate.batch_size must be >= 1, got "
                             f"{self.gate.episodes}, {self.gate.batch_size}")
        return self

    @property
    def data_seed(self) -> Optional[int]:
        """The seed of the stream's data: ``stream.options.seed`` (set from ``seed`` by :func:`run_config`
        unless given explicitly); None for a stream whose options have no seed."""
        seed = self.stream.options.get("seed")
        return None if seed is None else int(seed)

    def to_dict(self) -> Dict[str, Any]:
        return OmegaConf.to_container(OmegaConf.structured(self), resolve=True)

    def identity(self) -> str:
        """A short hash of everything that changes the results (not tracking, checkpoints, progress)."""
        d = self.to_dict()
        if not d.get("plugins"):
            d.pop("plugins", None)          # configs without plugins keep the identity they always had
        for key in ("tracking", "checkpoint", "output_dir", "progress"):
            d.pop(key, None)
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    def label(self) -> str:
        layers = "+".join(self.model.layers)
        return f"{self.stream.name}-{layers}-{self.strategy.name}-{self.memory.policy}-s{self.seed}"


def run_config(user: Any = None, overrides: Optional[List[str]] = None, plugins: Sequence[str] = ()) -> RunConfig:
    """``user``: a YAML path, a mapping or None; ``overrides``: ["model.layers=[full]", "seed=3", ...];
    ``plugins``: modules to import first (``--plugin``), added to the config's own ``plugins``. Every
    module named is imported before validation, so user mixers, streams, strategies and metrics
    validate like built-in ones."""
    if isinstance(user, (str, os.PathLike)):
        if not os.path.exists(user):
            raise FileNotFoundError(f"run config file not found: {user}")
        user = OmegaConf.load(user)
    if overrides:
        try:
            extra = OmegaConf.from_dotlist(list(overrides))
        except OmegaConfBaseException as err:
            raise ValueError(f"run config overrides: {err}") from err
        user = OmegaConf.merge(OmegaConf.create(user or {}), extra)
    listed = list(user.get("plugins") or []) if user is not None and hasattr(user, "get") else []
    modules = list(dict.fromkeys([*listed, *plugins]))
    load_plugins(modules)
    if modules:
        user = OmegaConf.merge(OmegaConf.create(user or {}), {"plugins": modules})
    if user is not None and hasattr(user, "get") and user.get("model") is not None:
        check_moved_keys(user.get("model"))
    if user is not None and hasattr(user, "get") and hasattr(user.get("strategy"), "keys"):
        moved = {k: v for k, v in MOVED_STRATEGY_KEYS.items() if k in user.get("strategy").keys()}
        if moved:
            raise ValueError("run config: strategy options live under strategy.options now: "
                             + ", ".join(f"strategy.{k} -> strategy.options.{v}" for k, v in moved.items()))
    cfg = validate(RunConfig, user, "run config").check()
    return with_data_seed(cfg)


MOVED_STRATEGY_KEYS = {"ewc_lambda": "ewc_lambda", "ewc_mode": "mode", "ewc_decay": "decay_factor",
                       "replay_mem_size": "mem_size", "replay_policy": "policy", "lwf_alpha": "alpha",
                       "lwf_temperature": "temperature", "lwf_positions": "positions"}

SEED_KEYS = ("seed", "stream.options.seed", "stream.options.meta_seed")
"""Config keys that are seeds: runs that differ only in these are replicates of one configuration."""


def with_data_seed(cfg: RunConfig) -> RunConfig:
    """The run seed seeds the data too, unless the stream's own seed is set: ``stream.options.seed``
    defaults to ``seed``, so ``seed=1`` changes the facts, episodes and meta-training set as well as the
    initialisation (every stream's ``meta_seed`` defaults to its ``seed``). Pin
    ``stream.options.seed`` to vary the model seed alone, or set both to vary them separately."""
    import dataclasses

    from streams import STREAMS

    has_seed = "seed" in {f.name for f in dataclasses.fields(STREAMS.get(cfg.stream.name).options_type)}
    if has_seed and "seed" not in cfg.stream.options:
        cfg.stream.options = {**cfg.stream.options, "seed": cfg.seed}
    return cfg


def as_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


__all__ = ["RunConfig", "SEED_KEYS", "as_yaml", "run_config", "with_data_seed"]
