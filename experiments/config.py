"""The run config: one structured config (dataclasses) for a whole run, validated by omegaconf.

A YAML file under ``experiments/configs/`` plus ``key=value`` overrides (omegaconf dotlist) resolve to
a :class:`RunConfig`; unknown keys and wrong types are ValueErrors naming the key. The stream's own
options are validated by that stream's config (``streams.icr.ICRConfig`` etc.).
"""
from __future__ import annotations

import copy
import dataclasses as dc
import hashlib
import io
import json
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
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
    checkpoint_every: int = 100            # meta-training steps between checkpoints (0 = never)
    tbptt: int = 0                         # tokens per truncated-BPTT segment of a meta-training item (0 = whole item)
    retention_loss: float = 0.0            # weight of the auxiliary loss on answers recalled from earlier episodes


DELAY_GATES = ("none", "experience")


@dataclass
class GateSection:
    """The learned gate (``strategies.evaluation.gate``): skill = (score - chance) / (perfect - chance)."""
    episodes: int = 256                    # held-out meta-training episodes, each from a fresh state
    batch_size: int = 64
    min_skill: float = 0.5                 # held-out skill to count as learned
    min_stream_skill: float = 0.1          # skill of the mean learning score R[j][j] on the stream
    delay_episodes: int = 64               # probe episodes per point of the delay-recall curve (0 = no curve)
    delay: str = "none"                    # none: the delay curve is reported; experience: it is also a gate
    span_level: float = 0.5                # the curve's span: the first delay whose score falls below this
    delay_max_tokens: Optional[int] = None # the curve's longest delay; None: the stream's longest (all experiences)
    # interference curves (strategies.evaluation.interference): recall of facts presented once against
    # the number of intervening items of each kind the stream's probe knows (ICR: neutral, same_region,
    # other_region, repeat); empty: none measured
    interference: List[str] = field(default_factory=list)
    interference_max_items: int = 256      # the ladder 0, 1, 2, 4, ... up to this many items
    interference_episodes: int = 64        # probe episodes per point (interference and capacity curves)
    # the capacity curve (strategies.evaluation.capacity): recall of N facts bound once, for each N here
    # (the stream's capacity probe; ICR: N <= n_keys); empty: not measured
    capacity_facts: List[int] = field(default_factory=list)
    # the position curve (strategies.evaluation.position): bits per byte against the position in held-out
    # documents of this many tokens, after the stream, one curve per experience's domain (text with
    # long_bytes); 0: not measured
    position_length: int = 0
    position_episodes: int = 8             # documents per domain
    position_chunk: int = 1024             # tokens per forward call, the state carried between them


@dataclass
class TrackingSection:
    enabled: bool = True
    experiment: str = "ovq-cl"
    tracking_uri: Optional[str] = None     # None: $MLFLOW_TRACKING_URI, else sqlite:///mlruns.db
    run_name: Optional[str] = None
    # Avalanche loggers beside MLflow (experiments.tracking.lifecycle.avalanche_loggers): text, csv,
    # tensorboard or package.module:factory; written under {output_dir}/loggers/{label}-{config id}
    loggers: List[str] = field(default_factory=list)


@dataclass
class CheckpointSection:
    enabled: bool = True
    dir: Optional[str] = None              # None -> {output_dir}/checkpoints
    resume: bool = True                    # resume (or reuse, when finished) the run of the same config and code
    share_meta: bool = True                # reuse the meta-trained weights of any run with the same meta-training


AFTER_META_MODEL_KEYS = ("mixers",)


@dataclass
class AfterMetaSection:
    """What changes once meta-training is over, its weights kept.

    ``model``: options merged into ``model`` for everything after meta-training (the learned gate, the
    delay curve, the stream), e.g. ``after_meta.model.mixers.ovq.growth=novelty``. Only mixer options
    (``mixers.<mixer in layers>.<option>``) that leave every parameter's name and shape as they are:
    rules of how the memory evolves, not what is learned (checked before meta-training). Meta-training,
    and the meta-trained weights runs share (``checkpoint.share_meta``), are those of ``model`` alone,
    so runs that differ only here compare memory rules on the same weights.
    """
    model: Dict[str, Any] = field(default_factory=dict)


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
    after_meta: AfterMetaSection = field(default_factory=AfterMetaSection)
    output_dir: str = "outputs"
    progress: Optional[bool] = None        # bars on a terminal, lines in a log; None: on under the CLI (not --quiet), off from Python
    plugins: List[str] = field(default_factory=list)   # modules that register user mixers, streams, ... (imported first)
    device: str = "auto"                   # auto (cuda when available) | cpu | cuda | cuda:N
    precision: str = "fp32"                # fp32 | bf16 | fp16 (torch.autocast on the device; fp16 on CUDA only)
    # user probes asked for, each with its options (experiments.probes; the built-ins are configured under gate)
    probes: Dict[str, Any] = field(default_factory=dict)

    def check(self) -> "RunConfig":
        """A validated copy with every option filled in (a ValueError naming the first bad key): mixers,
        stream, strategy, the checkpoint folder. This config is left as it is. Nothing runs before this
        passes."""
        import dataclasses as dc

        cfg = copy.deepcopy(self)

        from strategies.registry import STRATEGIES, strategy_options

        from experiments.tracking.lifecycle import LOGGER_NAMES, logger_factory

        for name in cfg.tracking.loggers:                # a logger that cannot be made: said before any compute
            if name not in LOGGER_NAMES:
                logger_factory(name)
        if cfg.strategy.name not in STRATEGIES:
            raise ValueError(f"run config: unknown strategy {cfg.strategy.name!r}; known: {STRATEGIES.names()}")
        cfg.strategy.options = dc.asdict(strategy_options(cfg.strategy.name, cfg.strategy.options))
        if cfg.strategy.train_mb_size < 1:
            raise ValueError(f"run config: strategy.train_mb_size must be >= 1, got {cfg.strategy.train_mb_size}")
        from strategies.memory import POLICIES

        if cfg.memory.policy not in POLICIES:
            raise ValueError(f"run config: memory.policy must be one of {POLICIES}, got {cfg.memory.policy!r}")
        if cfg.strategy.options.get("minibatches_per_forward", 1) > 1 and cfg.memory.policy == "reset_episode":
            raise ValueError("run config: strategy.options.minibatches_per_forward > 1 joins episodes into one "
                             "forward, which memory.policy=reset_episode (a fresh state per episode) forbids")
        cfg.model = cfg.model.resolved()
        from streams import check_stream_options

        check_stream_options(cfg.stream.name, cfg.stream.options)
        if cfg.gate.episodes < 1 or cfg.gate.batch_size < 1:
            raise ValueError(f"run config: gate.episodes and gate.batch_size must be >= 1, got "
                             f"{cfg.gate.episodes}, {cfg.gate.batch_size}")
        _require(cfg.seed >= 0, "seed", ">= 0 (it seeds numpy, torch and the stream's data)", cfg.seed)
        _require(cfg.strategy.epochs >= 1, "strategy.epochs", ">= 1", cfg.strategy.epochs)
        _require(cfg.strategy.lr > 0, "strategy.lr", "> 0", cfg.strategy.lr)
        _require(cfg.strategy.grad_clip is None or cfg.strategy.grad_clip > 0, "strategy.grad_clip",
                 "> 0 or null", cfg.strategy.grad_clip)
        _require(cfg.meta_train.steps >= 0, "meta_train.steps", ">= 0", cfg.meta_train.steps)
        _require(cfg.meta_train.batch_size >= 1, "meta_train.batch_size", ">= 1", cfg.meta_train.batch_size)
        _require(cfg.meta_train.lr > 0, "meta_train.lr", "> 0", cfg.meta_train.lr)
        _require(cfg.meta_train.tbptt >= 0, "meta_train.tbptt", ">= 0 (0 = backpropagate through the whole item)",
                 cfg.meta_train.tbptt)
        _require(cfg.gate.position_length >= 0, "gate.position_length", ">= 0 (0 = no position curve)",
                 cfg.gate.position_length)
        _require(cfg.gate.position_episodes >= 1 and cfg.gate.position_chunk >= 1,
                 "gate.position_episodes and gate.position_chunk", ">= 1",
                 (cfg.gate.position_episodes, cfg.gate.position_chunk))
        _require(cfg.meta_train.retention_loss >= 0, "meta_train.retention_loss",
                 ">= 0 (0 = no auxiliary retention loss)", cfg.meta_train.retention_loss)
        _require(cfg.gate.delay_max_tokens is None or cfg.gate.delay_max_tokens >= 1, "gate.delay_max_tokens",
                 ">= 1 or null (the stream's longest delay)", cfg.gate.delay_max_tokens)
        _require(cfg.gate.delay_episodes >= 0, "gate.delay_episodes", ">= 0 (0 = no delay curve)", cfg.gate.delay_episodes)
        _require(cfg.gate.delay in DELAY_GATES, "gate.delay", f"one of {DELAY_GATES}", cfg.gate.delay)
        _require(cfg.gate.interference_max_items >= 1, "gate.interference_max_items", ">= 1",
                 cfg.gate.interference_max_items)
        _require(cfg.gate.interference_episodes >= 1, "gate.interference_episodes", ">= 1", cfg.gate.interference_episodes)
        _require(len(set(cfg.gate.interference)) == len(cfg.gate.interference), "gate.interference",
                 "kinds without repeats", cfg.gate.interference)
        _require(all(isinstance(n, int) and n >= 1 for n in cfg.gate.capacity_facts), "gate.capacity_facts",
                 "numbers of facts >= 1", cfg.gate.capacity_facts)
        _require(cfg.meta_train.checkpoint_every >= 0, "meta_train.checkpoint_every", ">= 0 (0 = never)",
                 cfg.meta_train.checkpoint_every)
        import torch

        if not (cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:")):
            raise ValueError(f"run config: device must be auto, cpu, cuda or cuda:N, got {cfg.device!r}")
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"run config: device={cfg.device} but no CUDA device is available here (use auto or cpu)")
        if cfg.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"run config: precision must be fp32, bf16 or fp16, got {cfg.precision!r}")
        if cfg.precision == "fp16" and not cfg.resolved_device().startswith("cuda"):
            raise ValueError("run config: precision=fp16 needs a CUDA device (use bf16 on the CPU)")
        if cfg.checkpoint.dir is None:
            cfg.checkpoint.dir = os.path.join(cfg.output_dir, "checkpoints")
        cfg.stream_model()                    # after_meta.model: validated before anything runs
        _mark_checked(cfg)
        return cfg

    def _fingerprint(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)

    def checked(self) -> "RunConfig":
        """A validated copy, as :meth:`check` gives: a copy of this config when it is one :meth:`check`
        returned and nothing in it changed since (no second validation), else :meth:`check`'s."""
        entry = _CHECKED.get(id(self))
        if entry is not None and entry[0]() is self and entry[1] == self._fingerprint():
            return copy.deepcopy(self)
        return self.check()

    def stream_model(self) -> ModelConfig:
        """The model config of everything after meta-training: ``model`` with ``after_meta.model``
        merged in, resolved (``model`` itself when there is nothing to merge). ValueError naming the key."""
        extra = self.after_meta.model
        if not extra:
            return self.model
        what = "run config: after_meta.model"
        for key in extra:
            if key not in AFTER_META_MODEL_KEYS:
                raise ValueError(f"{what}.{key}: only {', '.join(AFTER_META_MODEL_KEYS)} can change after "
                                 "meta-training (the mixers' options; the architecture is the meta-trained one)")
        used = set(self.model.layers)
        for name, options in (extra.get("mixers") or {}).items():
            if name not in used:
                raise ValueError(f"{what}.mixers.{name}: {name!r} is not in model.layers {list(self.model.layers)}, "
                                 "so its options would change nothing")
            if not hasattr(options, "keys"):
                raise ValueError(f"{what}.mixers.{name} must be a mapping of options, got {options!r}")
        try:
            merged = OmegaConf.merge(OmegaConf.structured(self.model), OmegaConf.create(dict(extra)))
            return OmegaConf.to_object(merged).resolved()
        except (OmegaConfBaseException, ValueError) as err:
            raise ValueError(f"{what}: {str(err).splitlines()[0]}") from err

    def resolved_delay_gate(self) -> bool:
        """Whether recall at one experience's delay is a gate (``gate.delay: experience``). Not by default:
        facts recur within an experience, so a memory shorter than one experience can still learn it
        (R[j][j] high) and then lose it, and that loss is forgetting to report, with its span beside it
        (excluding it would hide exactly the forgetting under study). As a gate it asks for more: that
        every mixer compared holds a single presentation for a whole experience."""
        return self.gate.delay == "experience"

    def resolved_device(self) -> str:
        """The torch device the run uses: ``auto`` is cuda when available, else cpu."""
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def check_locations(self) -> None:
        """Every place the run will write, checked before any compute: the checkpoint folder and the
        tracking store's folder (for a local SQLite or file store)."""
        if self.checkpoint.enabled:
            check_writable(self.checkpoint.dir, "checkpoint.dir")
        if self.tracking.enabled:
            from experiments.tracking import default_tracking_uri

            uri = default_tracking_uri(self.tracking.tracking_uri)
            for scheme in ("sqlite:///", "file://"):
                if uri.startswith(scheme):
                    path = uri[len(scheme):]
                    folder = os.path.dirname(os.path.abspath(path)) if scheme == "sqlite:///" else path
                    if os.path.exists(path) and scheme == "sqlite:///" and os.path.isdir(path):
                        raise ValueError(f"tracking store {uri}: {path} is a folder, not a database file")
                    check_writable(folder, f"tracking store {uri}")

    @property
    def data_seed(self) -> Optional[int]:
        """The seed of the stream's data: ``stream.options.seed`` (set from ``seed`` by :func:`run_config`
        unless given explicitly); None for a stream whose options have no seed."""
        seed = self.stream.options.get("seed")
        return None if seed is None else int(seed)

    def to_dict(self) -> Dict[str, Any]:
        """Every option as plain Python (dicts, lists, scalars): what ``OmegaConf.to_container`` of the
        structured config gives, without building one (see :func:`plain_dict`)."""
        return plain_dict(self)

    def identity(self) -> str:
        """A short hash of everything that changes the results (not tracking, checkpoints, progress)."""
        d = self.to_dict()
        # A section at its default that changes nothing (no plugins, nothing after meta-training, fp32) is
        # left out, so a config that does not use it hashes as one written without the key: runs recorded
        # with such configs stay reusable when a new section is added.
        if not d.get("plugins"):
            d.pop("plugins", None)
        if not d.get("probes"):                          # no user probe: as before probes were plugins
            d.pop("probes", None)
        for key in ("tracking", "checkpoint", "output_dir", "progress", "device"):
            d.pop(key, None)
        if not d.get("after_meta", {}).get("model"):
            d.pop("after_meta", None)
        if not d["gate"].get("interference"):            # no interference curves: as before they existed
            # ... but the capacity curve also scores interference_episodes items a point: kept where it runs
            keys = ("interference", "interference_max_items") + (() if d["gate"].get("capacity_facts")
                                                                 else ("interference_episodes",))
            for key in keys:
                d["gate"].pop(key, None)
        if not d["gate"].get("capacity_facts"):          # no capacity curve: as before it existed
            d["gate"].pop("capacity_facts", None)
        if not d["gate"].get("position_length"):         # no position curve: as before it existed
            for key in ("position_length", "position_episodes", "position_chunk"):
                d["gate"].pop(key, None)
        if d.get("precision") == "fp32":
            d.pop("precision")
        if self.resolved_device() != "cpu":
            d["device"] = self.resolved_device()          # another device can change the numbers
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size > 1 and self.trains_weights():
            # ranks sum gradients in another order: float32 differences that training grows (R up to 0.078
            # apart after 240 steps), so a run that trains weights under torchrun is not the one-process run
            d["world_size"] = world_size
        d["meta_train"].pop("checkpoint_every", None)    # when to save does not change what is computed
        if not d["meta_train"].get("retention_loss"):    # no retention loss: as before it existed
            d["meta_train"].pop("retention_loss", None)
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    def trains_weights(self) -> bool:
        """Whether the run trains weights anywhere: meta-training steps, or a strategy that trains them."""
        from strategies.registry import STRATEGIES

        return self.meta_train.steps > 0 or (self.strategy.name in STRATEGIES and STRATEGIES.get(self.strategy.name).trains_weights)

    def label(self) -> str:
        layers = "+".join(self.model.layers)
        return f"{self.stream.name}-{layers}-{self.strategy.name}-{self.memory.policy}-s{self.seed}"


def plain_dict(cfg: Any) -> Any:
    """A validated config (a dataclass, with dict, list and tuple values) as plain dicts, lists and scalars:
    equal, and equal in JSON, to ``OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)`` for
    every config a study makes (tests/test_config_dict.py checks), ~50x faster. Run identities hash this,
    and a run calls it several times (a study's smoke test spent a tenth of its time in OmegaConf here).
    Tuples become lists, as OmegaConf makes them; a value of another type is refused, since OmegaConf
    could convert it in a way this does not."""
    import dataclasses

    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: plain_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, dict):
        return {key: plain_dict(value) for key, value in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [plain_dict(value) for value in cfg]
    if cfg is None or isinstance(cfg, (bool, int, float, str)):
        return cfg
    raise TypeError(f"config value {cfg!r} of type {type(cfg).__name__}: not a plain config value")


def _require(ok: bool, key: str, allowed: str, got: Any) -> None:
    if not ok:
        raise ValueError(f"run config: {key} must be {allowed}, got {got!r}")


def check_writable(folder: str, what: str) -> str:
    """Checks, creating nothing, that a file can be written in ``folder``: it exists and takes a probe
    file, or the nearest folder above it that exists is one this process may create folders in
    (ValueError otherwise). A run refused later by another check leaves no folder behind."""
    path = os.path.abspath(folder)
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{what}: cannot write to {folder!r} ({existing} is a file, not a folder)")
    if existing != path:
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(f"{what}: cannot write to {folder!r} (cannot create a folder in {existing}: "
                             "permission denied)")
        return folder
    try:
        probe = os.path.join(path, f".ovq-cl-write-test-{os.getpid()}")
        with open(probe, "w") as fh:
            fh.write("")
        os.remove(probe)
    except OSError as err:
        raise ValueError(f"{what}: cannot write to {folder!r} ({err.strerror or err})") from err
    return folder


#: what an override string and a config file (by its content) parse to, as plain
#: values: a sweep builds hundreds of configs from one file and a few dozen distinct overrides, and
#: omegaconf takes ~10 ms to read either. Copied out, so callers never share one; bounded.
_PARSED: Dict[Any, Any] = {}
_PARSED_MAX = 1024


def _kept(key: Any, make):
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = make()
    return copy.deepcopy(_PARSED[key])


def _override(item: str) -> Dict[str, Any]:
    """One ``KEY=VALUE`` override as nested plain values (``{"model": {"layers": ["full"]}}``)."""
    key, equals, _ = str(item).partition("=")
    if not equals or not key.strip() or any(not part.strip() for part in key.split(".")):
        raise ValueError(f"override {item!r}: expected KEY=VALUE with a dotted KEY, e.g. model.layers=[ovq]")
    try:
        return _kept(("override", str(item)),
                     lambda: OmegaConf.to_container(OmegaConf.from_dotlist([str(item)]), resolve=False))
    except Exception as err:  # noqa: BLE001 - yaml's and omegaconf's errors: one line naming the item
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"override {item!r}: its value is not valid YAML ({problem}; quote the whole "
                         "item for the shell, e.g. 'model.layers=[ovq, full]')") from err


def _config_file(path: Any) -> Dict[str, Any]:
    """A YAML config file as plain values, read by omegaconf's loader (its YAML: ``1e-3`` is a float);
    interpolations are kept as written. Kept by content (read each time: a file rewritten within the
    clock's tick at the same size is still read anew)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"run config file not found: {path}")
    with open(path, "rb") as fh:
        content = fh.read()
    try:
        text = content.decode("utf-8")
        loaded = _kept(("file", hashlib.sha256(content).hexdigest()),
                       lambda: OmegaConf.to_container(OmegaConf.load(io.StringIO(text)), resolve=False))
    except Exception as err:  # noqa: BLE001 - yaml's errors: one message naming the file
        raise ValueError(f"run config file {path}: not valid YAML ({str(err).splitlines()[0]})") from err
    if loaded is not None and not isinstance(loaded, dict):
        raise ValueError(f"run config file {path}: expected a mapping of options, got {type(loaded).__name__}")
    return loaded


def run_config(user: Any = None, overrides: Optional[List[str]] = None, plugins: Sequence[str] = ()) -> RunConfig:
    """``user``: a YAML path, a mapping or None; ``overrides``: ["model.layers=[full]", "seed=3", ...];
    ``plugins``: modules to import first (``--plugin``), added to the config's own ``plugins``. Every
    module named is imported before validation, so user mixers, streams, strategies and metrics
    validate like built-in ones."""
    if isinstance(user, (str, os.PathLike)):
        user = _config_file(user)
    if overrides:
        user = OmegaConf.merge(OmegaConf.create(user or {}), *(_override(item) for item in overrides))
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
    if isinstance(user, DictConfig):
        # as plain values (interpolations kept as written), so that validating the same options again
        # (a study validates each sweep's grid, then runs it) is a lookup, not another ~40 ms omegaconf merge
        user = OmegaConf.to_container(user, resolve=False)
    cfg = with_data_seed(validate(RunConfig, user, "run config").check())
    _mark_checked(cfg)                                  # the data seed is a valid option: checked as it is
    return cfg


#: the configs :meth:`RunConfig.check` returned, as they were then (id -> (weak reference, fingerprint)), so
#: that one checked and not changed since is not checked again (the runner resolves what run_config
#: checked); kept beside the config, not in it, so that ``vars(cfg)`` stays its fields
_FROZEN_CLASSES: Dict[type, type] = {}


def _refuse(self, name, value=None):
    raise dc.FrozenInstanceError(f"a resolved run config is frozen: {type(self).__name__}.{name} cannot change "
                                 "(what is logged is what runs); change the config before the run resolves it")


def freeze(cfg: Any) -> Any:
    """``cfg`` (a dataclass, e.g. a resolved :class:`RunConfig`) and every dataclass inside it made read-only
    in place: setting or deleting a field raises ``dataclasses.FrozenInstanceError``. Each instance's class
    becomes a subclass of its own that refuses writes, so isinstance, fields, ``asdict`` and copies work as
    before (a deep copy, and a pickled one read back, is frozen too). Mappings and lists inside (e.g. ``stream.options``) are left as they
    are: a phase reads them, never writes them (the fingerprint of the checked config covers them)."""
    if dc.is_dataclass(cfg) and not isinstance(cfg, type):
        for f in dc.fields(cfg):
            freeze(getattr(cfg, f.name))
        cls = type(cfg)
        if cls not in _FROZEN_CLASSES.values():
            if cls not in _FROZEN_CLASSES:
                _FROZEN_CLASSES[cls] = type(cls.__name__, (cls,), {
                    "__setattr__": _refuse, "__delattr__": _refuse, "__module__": cls.__module__,
                    "__qualname__": cls.__qualname__,
                    # pickled (a checkpoint, a Ray task) and copied as its own class, frozen again when read
                    "__reduce_ex__": lambda self, protocol, base=cls: (_frozen_instance, (base, dict(self.__dict__)))})
            object.__setattr__(cfg, "__class__", _FROZEN_CLASSES[cls])
    elif isinstance(cfg, dict):
        for v in cfg.values():
            freeze(v)
    elif isinstance(cfg, (list, tuple)):
        for v in cfg:
            freeze(v)
    return cfg


def _frozen_instance(cls: type, state: Dict[str, Any]) -> Any:
    """A frozen instance of ``cls`` with ``state`` (how a frozen config is unpickled and copied)."""
    obj = object.__new__(cls)
    obj.__dict__.update(state)
    return freeze(obj)


_CHECKED: Dict[int, tuple] = {}


def _mark_checked(cfg: "RunConfig") -> None:
    key = id(cfg)
    _CHECKED[key] = (weakref.ref(cfg, lambda _, key=key: _CHECKED.pop(key, None)), cfg._fingerprint())


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
        stream = dataclasses.replace(cfg.stream, options={**cfg.stream.options, "seed": cfg.seed})
        return dataclasses.replace(cfg, stream=stream)      # a new config; ``cfg`` is left as it is
    return cfg


def as_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


__all__ = ["RunConfig", "SEED_KEYS", "as_yaml", "run_config", "with_data_seed"]
