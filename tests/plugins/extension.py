"""A user's extension of ovq-cl, written as a user would write it, outside the package.

Importing this module registers a mixer (``ema``, with its own options), a stream (``cipher``), a
metric (``error_rate``), a strategy (``anchor``, a plugin with state that survives a resume) and one of
Avalanche's stock plugins (``si``: Synaptic Intelligence, saved by its attributes), so
that ``ovq-cl run CONFIG --plugin plugins.extension`` (or ``plugins: [plugins.extension]`` in the
config) runs them like built-in ones. ``tests/test_extensions.py`` does exactly that.

Test hook: with ``EXTENSION_KILL_BEFORE=j`` in the environment the process kills itself (SIGKILL)
before training experience j, i.e. after the checkpoint of experience j - 1 was written; with
``EXTENSION_KILL_MARKER=path`` too, only the first process to get there does (it creates the file).
With ``EXTENSION_WAIT_BEFORE=j`` and ``EXTENSION_WAIT_MARKER=path`` a process appends its PID to the
marker file before training experience j and then waits (up to two minutes) for a signal: a test can
signal a run, a sweep or a Ray driver while its trials are mid-stream.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Optional

import numpy as np
import torch

from ovq_cl.base import validate
from ovq_cl.layers import Mixer, MixerOptions, register_mixer
from ovq_cl.layers.base import elem_size
from ovq_cl.state import MixerState
import ovq_cl.base.avalanche_compat  # noqa: F401  (before avalanche)
from avalanche.core import SupervisedPlugin
from avalanche.training.plugins import SynapticIntelligencePlugin

from strategies.plugins import CheckpointedPlugin
from strategies.registry import register_strategy
from strategies.evaluation.metrics import MetricSpec, register_metric
from streams import EpisodeDataset, StreamData, StreamInfo, register_stream
from streams.common import seeded_rng

# ------------------------------------------------------------------------------------------- mixer


@dataclasses.dataclass(frozen=True)
class EMAOptions(MixerOptions):
    """decay: how much of the running mean each token keeps."""

    decay: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"ema: decay must be in (0, 1), got {self.decay}")


@dataclasses.dataclass
class EMAState(MixerState):
    """mean: [B, H, D] the running mean of the values; seen: tokens absorbed."""

    mean: torch.Tensor
    seen: int = 0


class EMAMixer(Mixer):
    """A running mean of the values per head, read through a sigmoid gate of the queries."""

    state_type = EMAState
    Options = EMAOptions

    def __init__(self, d_model: int, n_heads: int, options: Optional[EMAOptions] = None, **overrides) -> None:
        super().__init__(d_model, n_heads, options, **overrides)
        self.add_qkvo_projections()

    def forward(self, x: torch.Tensor, state: Optional[EMAState] = None):
        self.check_input(x, state)
        B, T, _ = x.shape
        q, _, v = self.project_qkv(x)
        mean = v.new_zeros(B, self.n_heads, self.head_dim) if state is None else state.mean
        outputs = []
        for t in range(T):
            mean = self.options.decay * mean + (1 - self.options.decay) * v[:, t]
            outputs.append(torch.sigmoid(q[:, t]) * mean)
        o = torch.stack(outputs, 1).reshape(B, T, -1)
        return self.o_proj(o), EMAState(mean, (0 if state is None else state.seen) + T)

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        return batch_size * self.n_heads * self.head_dim * elem_size(dtype)


register_mixer("ema", EMAMixer)

# ------------------------------------------------------------------------------------------ stream


@dataclasses.dataclass
class CipherConfig:
    """Experience j: every token t must be answered with (t + j + 1) mod vocab (a new cipher each time)."""

    n_experiences: int = 3
    vocab: int = 12
    seq_len: int = 10
    train_episodes: int = 16
    test_episodes: int = 4
    seed: int = 0


def _cipher_episode(cfg: CipherConfig, purpose: str, exp: int, i: int):
    rng = seeded_rng("cipher", purpose, cfg.seed, exp, i)
    x = rng.integers(0, cfg.vocab, cfg.seq_len)
    y = (x + exp + 1) % cfg.vocab
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


def cipher_data(options) -> StreamData:
    cfg = validate(CipherConfig, options, "cipher stream")
    train = [EpisodeDataset(_cipher_episode, (cfg, "train", j), cfg.train_episodes) for j in range(cfg.n_experiences)]
    test = [EpisodeDataset(_cipher_episode, (cfg, "test", j), cfg.test_episodes) for j in range(cfg.n_experiences)]
    info = StreamInfo(name="cipher", metric="error_rate", n_experiences=cfg.n_experiences, seq_len=cfg.seq_len,
                      test_seq_len=cfg.seq_len, vocab_size=cfg.vocab, config=cfg)
    return StreamData(train, test, None, info)


register_stream("cipher", cipher_data, CipherConfig)

# ------------------------------------------------------------------------------------------ metric


def _error_chance(target: torch.Tensor) -> float:
    counts = torch.bincount(target.reshape(-1)).double()
    return float(1 - counts.max() / counts.sum())          # always answering the most frequent label


register_metric("error_rate", MetricSpec(
    values=lambda pred, target: (pred.argmax(-1) != target).float(), chance=_error_chance,
    higher_is_better=False, perfect=0.0))

# ---------------------------------------------------------------------------------------- strategy


@dataclasses.dataclass(frozen=True)
class AnchorOptions:
    """strength: weight of ``|theta - theta_previous|^2`` (theta_previous: the weights after the last experience)."""

    strength: float = 0.1


class AnchorPlugin(CheckpointedPlugin):
    def __init__(self, strength: float) -> None:
        super().__init__()
        self.strength = strength
        self.anchor: Optional[dict] = None

    def before_training_exp(self, strategy, **kwargs):
        test_hooks(strategy.experience.current_experience)

    def before_backward(self, strategy, **kwargs):
        if self.anchor is None:
            return
        penalty = sum(((p - self.anchor[name]) ** 2).sum() for name, p in strategy.model.named_parameters())
        strategy.loss = strategy.loss + self.strength * penalty

    def after_training_exp(self, strategy, **kwargs):
        self.anchor = {name: p.detach().clone() for name, p in strategy.model.named_parameters()}

    def state_dict(self):
        return {"anchor": self.anchor}

    def load_state_dict(self, state):
        self.anchor = state["anchor"]


register_strategy("anchor", AnchorOptions, lambda options, seed: [AnchorPlugin(options.strength)])


def test_hooks(experience: int) -> None:
    """The module docstring's EXTENSION_KILL_* and EXTENSION_WAIT_* hooks, before training ``experience``."""
    if os.environ.get("EXTENSION_KILL_BEFORE") == str(experience):
        marker = os.environ.get("EXTENSION_KILL_MARKER")
        if marker:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))      # atomic: one process only
            except FileExistsError:
                return
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("EXTENSION_WAIT_BEFORE") == str(experience):
        with open(os.environ["EXTENSION_WAIT_MARKER"], "a") as fh:
            fh.write(f"{os.getpid()}\n")
        for _ in range(1200):                                        # interruptible: a signal ends it
            time.sleep(0.1)


class HooksPlugin(SupervisedPlugin):
    """The test hooks alone, beside a stock plugin (no state)."""

    def before_training_exp(self, strategy, **kwargs):
        test_hooks(strategy.experience.current_experience)


@dataclasses.dataclass(frozen=True)
class SIOptions:
    """si_lambda: the penalty weight of Avalanche's Synaptic Intelligence (a stock plugin, not a CheckpointedPlugin)."""

    si_lambda: float = 1.0


register_strategy("si", SIOptions, lambda options, seed: [HooksPlugin(), SynapticIntelligencePlugin(si_lambda=options.si_lambda)])

# weights frozen, the test hooks on: a run that trains nothing is one run whatever its world size
register_strategy("frozen_hooks", plugins=lambda options, seed: [HooksPlugin()], trains_weights=False)
