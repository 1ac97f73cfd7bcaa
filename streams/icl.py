"""ICL shift: in-context linear regression, new functions every experience.

Experience j adds ``functions_per_experience`` (F) random linear functions ``y = W_f x`` (W_f [d_y, d_x],
entries N(0, 1/d_x); x ~ N(0, I), so y has unit variance per channel); function ids are global,
experience j owns ids ``j*F .. (j+1)*F - 1`` (``info.function_ids[j]``, weights ``info.weights``
[K*F, d_y, d_x]). Noise N(0, noise_std^2) is added to every y.

**Training episode** of experience j: ``examples_per_episode`` (E) presented examples (f, x, y), the F
functions taking turns in random order, then ``queries_per_episode`` (Q) queries (f, x) for fresh x;
the target of a query is ``W_f x``. **Test episode** of experience i: ``test_queries`` queries only,
functions of experience i (the answer must come from memory). **Meta-training**: the same layout with
F fresh random functions (and random ids from the whole id space) in every episode.

Encoding ``continuous`` (one position per example or query; n_ids = K*F, d_in = n_ids + d_x + d_y + 1)::

    x: [T, d_in] float32, channels [onehot(f) | x | y | 1]  presented example (unscored)
                                   [onehot(f) | x | 0 | 0]  query
                                   [    0     | 0 | 0 | 0]  padding
    y: [T, d_y] float32, W_f x at a query, NaN elsewhere (``streams.common.scored_mask``)

    T = E + Q (train, meta-train), test_queries (test)

Encoding ``tokens`` (values quantised into ``n_bins`` uniform bins over [-clip, clip], values beyond
are clipped; vocabulary ``[PAD, SEP] + n_ids function tokens + n_bins value tokens``)::

    tokens: F x1 .. xd Y1 .. Ye  ...(E examples)  SEP  F x1 .. xd Y1 .. Ye  ...(Q queries)  [PAD ...]
    labels:  -  - ..  -  - ..  -                    -   -  - .. Y1 Y2 .. -                   [ -  ...]

    labels[t] = the token at t + 1 for the d_y value tokens of every query (teacher forced), -100 elsewhere
    T = (E + Q) * (1 + d_x + d_y) + 1 (train, meta-train), 1 + test_queries * (1 + d_x + d_y) (test)

For the MSE of the token encoding, map predicted and target tokens to bin centres with
``info.dequantize``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np
import torch

from streams.common import EpisodeDataset, EpisodeStreamConfig, StreamData, StreamInfo, load_config, require, seeded_rng, to_benchmark
from ovq_cl.base import IGNORE, PAD, SEP

ENCODINGS = ("continuous", "tokens")


@dataclass
class ICLConfig(EpisodeStreamConfig):
    encoding: str = "continuous"          # continuous | tokens
    n_experiences: int = 4                # K
    functions_per_experience: int = 2     # F new functions per experience
    d_x: int = 4
    d_y: int = 2
    noise_std: float = 0.0
    examples_per_episode: int = 16        # presented (f, x, y) examples of a training episode
    queries_per_episode: int = 4          # (f, x) queries after them
    test_queries: int = 8                 # queries of a test episode
    n_bins: int = 32                      # tokens: value bins
    clip: float = 3.0                     # tokens: bins cover [-clip, clip]
    seq_len: Optional[int] = None         # pad train and test episodes to this T; None -> their exact length


@dataclass(frozen=True)
class ICLInfo(StreamInfo):
    """StreamInfo plus the functions. d_in/d_out: continuous input/target channels (None for tokens)."""

    encoding: str
    d_in: Optional[int]
    d_out: Optional[int]
    weights: torch.Tensor                 # [K*F, d_y, d_x] float32
    function_ids: List[List[int]]         # the function ids of experience j
    bin_centers: torch.Tensor             # [n_bins] float32 (tokens)
    first_value_token: int                # token of bin 0 (tokens)

    @property
    def metric_context(self) -> dict:
        """For ``binned_mse`` (the tokens encoding): answers are scored as the squared error between the
        centres of the predicted and the target bins."""
        if self.encoding != "tokens":
            return {}
        return {"bin_centers": self.bin_centers, "first_value_token": self.first_value_token}

    def dequantize(self, tokens: torch.Tensor) -> torch.Tensor:
        """Value tokens -> bin centres (float32, same shape)."""
        return self.bin_centers[(tokens - self.first_value_token).clamp(0, len(self.bin_centers) - 1)]

    def token_name(self, token: int) -> str:
        if token == PAD:
            return "PAD"
        if token == SEP:
            return "SEP"
        return f"F{token - 2}" if token < self.first_value_token else f"b{token - self.first_value_token}"


def icl_config(user: Any = None) -> ICLConfig:
    """The validated ICL config (see ``icr_config``)."""
    cfg = load_config(ICLConfig, user, "icl config")
    _check(cfg)
    return cfg


def _n_ids(cfg: ICLConfig) -> int:
    return cfg.n_experiences * cfg.functions_per_experience


def _lengths(cfg: ICLConfig):
    per = 1 if cfg.encoding == "continuous" else 1 + cfg.d_x + cfg.d_y
    sep = 0 if cfg.encoding == "continuous" else 1
    return (cfg.examples_per_episode + cfg.queries_per_episode) * per + sep, cfg.test_queries * per + sep


def _check(cfg: ICLConfig) -> None:
    what = "icl config"
    require(cfg.encoding in ENCODINGS, what, f"encoding must be one of {ENCODINGS}, got {cfg.encoding!r}")
    for key in ("n_experiences", "functions_per_experience", "d_x", "d_y", "examples_per_episode",
                "queries_per_episode", "train_episodes", "test_episodes", "test_queries", "n_bins",
                "meta_train_episodes"):
        require(getattr(cfg, key) >= 1, what, f"{key} must be >= 1, got {getattr(cfg, key)}")
    for key in ("seed", "meta_seed"):
        require(getattr(cfg, key) >= 0, what, f"{key} must be >= 0, got {getattr(cfg, key)}")
    require(cfg.noise_std >= 0, what, f"noise_std must be >= 0, got {cfg.noise_std}")
    require(cfg.clip > 0, what, f"clip must be > 0, got {cfg.clip}")
    require(cfg.examples_per_episode >= cfg.functions_per_experience, what,
            f"episode too short for its functions: examples_per_episode={cfg.examples_per_episode} < "
            f"functions_per_experience={cfg.functions_per_experience} (each function is presented)")
    if cfg.seq_len is not None:
        need_train, need_test = _lengths(cfg)
        require(cfg.seq_len >= max(need_train, need_test), what,
                f"episode too short: seq_len={cfg.seq_len}, but training episodes need {need_train} positions "
                f"and test episodes {need_test}")


def _weights(cfg: ICLConfig, rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal((n, cfg.d_y, cfg.d_x)) / np.sqrt(cfg.d_x)


def _quantize(cfg: ICLConfig, v: np.ndarray) -> np.ndarray:
    b = np.floor((np.clip(v, -cfg.clip, cfg.clip) + cfg.clip) / (2 * cfg.clip) * cfg.n_bins)
    return np.minimum(b, cfg.n_bins - 1).astype(np.int64) + 2 + _n_ids(cfg)


def _encode(cfg: ICLConfig, ids: np.ndarray, xs: np.ndarray, ys: np.ndarray, n_shown: int, length: int):
    """The first ``n_shown`` rows are presented examples, the rest queries. ids [N], xs [N, d_x], ys [N, d_y]."""
    n = len(ids)
    if cfg.encoding == "continuous":
        n_ids = _n_ids(cfg)
        x = np.zeros((length, n_ids + cfg.d_x + cfg.d_y + 1), np.float32)
        y = np.full((length, cfg.d_y), np.nan, np.float32)
        x[np.arange(n), ids] = 1
        x[:n, n_ids: n_ids + cfg.d_x] = xs
        x[:n_shown, n_ids + cfg.d_x: n_ids + cfg.d_x + cfg.d_y] = ys[:n_shown]
        x[:n_shown, -1] = 1
        y[n_shown:n] = ys[n_shown:]
        return torch.from_numpy(x), torch.from_numpy(y)
    rows = np.concatenate([ids[:, None] + 2, _quantize(cfg, xs), _quantize(cfg, ys)], 1)   # [N, 1 + d_x + d_y]
    tokens = np.full(length, PAD, np.int64)
    labels = np.full(length, IGNORE, np.int64)
    shown, asked = rows[:n_shown].reshape(-1), rows[n_shown:]
    tokens[: len(shown)] = shown
    tokens[len(shown)] = SEP
    start = len(shown) + 1
    tokens[start: start + asked.size] = asked.reshape(-1)
    width = rows.shape[1]
    for q in range(len(asked)):
        first_y = start + q * width + 1 + cfg.d_x
        labels[first_y - 1: first_y - 1 + cfg.d_y] = asked[q, 1 + cfg.d_x:]
    return torch.from_numpy(tokens), torch.from_numpy(labels)


def _sample(cfg: ICLConfig, rng: np.random.Generator, W: np.ndarray, fids: np.ndarray, n_shown: int, n_asked: int,
            length: int):
    """Presented examples take the functions in turn (shuffled); queries pick functions at random.

    W [F, d_y, d_x] holds the weights of the functions whose ids are fids [F]."""
    F = len(fids)
    which = np.concatenate([rng.permutation(np.resize(np.arange(F), n_shown)), rng.integers(0, F, n_asked)])
    xs = rng.standard_normal((len(which), cfg.d_x))
    ys = np.einsum("nij,nj->ni", W[which], xs) + cfg.noise_std * rng.standard_normal((len(which), cfg.d_y))
    return _encode(cfg, fids[which], xs, ys, n_shown, length)


def _train_episode(cfg: ICLConfig, W: np.ndarray, fids: np.ndarray, length: int, exp: int, i: int):
    rng = seeded_rng("icl", "train", cfg.seed, exp, i)
    return _sample(cfg, rng, W, fids, cfg.examples_per_episode, cfg.queries_per_episode, length)


def _test_episode(cfg: ICLConfig, W: np.ndarray, fids: np.ndarray, length: int, exp: int, i: int):
    rng = seeded_rng("icl", "test", cfg.seed, exp, i)
    return _sample(cfg, rng, W, fids, 0, cfg.test_queries, length)


def _meta_episode(cfg: ICLConfig, length: int, i: int):
    rng = seeded_rng("icl", "meta", cfg.meta_seed, i)
    fids = rng.choice(_n_ids(cfg), cfg.functions_per_experience, replace=False)
    W = _weights(cfg, rng, len(fids))
    return _sample(cfg, rng, W, fids, cfg.examples_per_episode, cfg.queries_per_episode, length)


def icl_data(cfg: Any = None) -> StreamData:
    """The ICL stream without Avalanche: K train/test EpisodeDatasets, meta-training, ICLInfo."""
    cfg = icl_config(cfg)
    F, K = cfg.functions_per_experience, cfg.n_experiences
    W = _weights(cfg, seeded_rng("icl", "world", cfg.seed), K * F)
    need_train, need_test = _lengths(cfg)
    T_train, T_test = cfg.seq_len or need_train, cfg.seq_len or need_test
    train, test, ids = [], [], []
    for j in range(K):
        fids = np.arange(j * F, (j + 1) * F)
        ids.append(fids.tolist())
        train.append(EpisodeDataset(_train_episode, (cfg, W[fids], fids, T_train, j), cfg.train_episodes))
        test.append(EpisodeDataset(_test_episode, (cfg, W[fids], fids, T_test, j), cfg.test_episodes))
    meta = EpisodeDataset(_meta_episode, (cfg, T_train), cfg.meta_train_episodes)
    continuous = cfg.encoding == "continuous"
    step = 2 * cfg.clip / cfg.n_bins
    info = ICLInfo(
        name="icl", metric="mse" if continuous else "binned_mse", n_experiences=K, seq_len=T_train, test_seq_len=T_test,
        vocab_size=None if continuous else 2 + K * F + cfg.n_bins, config=cfg, encoding=cfg.encoding,
        d_in=K * F + cfg.d_x + cfg.d_y + 1 if continuous else None, d_out=cfg.d_y if continuous else None,
        weights=torch.from_numpy(W.astype(np.float32)), function_ids=ids,
        bin_centers=torch.from_numpy((-cfg.clip + step * (np.arange(cfg.n_bins) + 0.5)).astype(np.float32)),
        first_value_token=2 + K * F,
    )
    return StreamData(train, test, meta, info)


def icl_benchmark(cfg: Any = None):
    """The ICL stream as an Avalanche benchmark, with ``.info`` (ICLInfo) and ``.meta_train``."""
    return to_benchmark(icl_data(cfg))
