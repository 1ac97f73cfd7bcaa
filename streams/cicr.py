"""Continuous-key ICR shift: in-context recall where the keys are continuous vectors, each one no model
or codebook has seen; with ``shift_degrees`` > 0, from regions of key space that meta-training never
covered (with 0, fresh vectors from meta-training's own region: what study 22 runs, since with 90 degrees
no mixer, full attention included, learned the stream).

The facts, episodes, experiences and probes are ICR's (``streams.icr``: fact tables per experience,
training and test episodes, rebinding, facts in force, long-horizon meta-training, delay, interference
and capacity probes); this module *encodes* them. Every key token becomes a unit vector in R^d_key, every
value a class (``values: discrete``, scored by accuracy) or a unit vector in R^d_value (``values:
continuous``, scored by mean squared error). A key's vector comes from a **region**, a spherical cap::

    key = normalize(center + key_spread * g / sqrt(d_key)),   g ~ N(0, I_d_key)

- meta-training (and every meta-training item) draws **fresh** key vectors (and, with continuous values,
  fresh value vectors) for each item from the meta region, centred on m0: no key or value of
  meta-training is ever met again, so the model learns to store arbitrary keys, not a key set. With
  ``meta_regions: random`` each item has a region of its own, a random centre at least
  ``meta_exclusion_degrees`` from every experience's centre: the key projection learns every direction
  (with one meta region it learns one cap, and keys from elsewhere defeat it, whatever the memory),
  while no item comes near the stream's regions. This is the paper's regime: a codebook fitted in
  meta-training has spread its codes over directions the stream's keys do not come from;
- experience j's keys are fixed vectors (one per key token of its table, a pure function of the seed)
  from a cap centred on ``c_j = cos(shift) m0 + sin(shift) u_j``, u_j orthonormal directions orthogonal
  to m0 (random, from the seed): with ``shift_degrees`` 90 every experience's region lies where
  meta-training never drew a key, and the regions of different experiences are far apart too; with 0
  they are meta-training's region. At 90 degrees a key codebook fitted in meta-training (VQ's) has
  never seen anything like them, and an online dictionary (OVQ's) must place its centroids during the
  stream; at 0 the vectors are new but their distribution is the one the codebook was fitted on;
- ICR's ``key_overlap`` shares key tokens, hence key vectors, between consecutive experiences;
- the probes (delay, interference, capacity) draw fresh key vectors per item from the region of the
  experience whose key tokens they use (``other_region``: the next experience's region).

Encoding (one position per token of the ICR layout; d_in = d_key + V + 2, V = n_values or d_value)::

    x[t] = [key vector | 0 | 0 0]            a key (presented or queried)
           [0 | one-hot(value) or vector | 0 1]   a value (presented, or a teacher-forced answer)
           [0 | 0 | 1 0]                     SEP
           [0 | 0 | 0 0]                     PAD
    y[t] = the answer's class (int64, -100 elsewhere) or its vector (float32 [d_value], NaN elsewhere),
           at the query's position

Scoring against the facts in force works as in ICR: a test query's key vector is matched to its key token
(the nearest stream key), whose latest value is the answer.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ovq_cl.base import IGNORE, SEP, scored_mask
from streams.common import EpisodeDataset, StreamData, StreamInfo, load_config, require, seeded_rng, to_benchmark
from streams.icr import ICRConfig, ICRInfo, icr_config, icr_data, key_regions

VALUE_KINDS = ("discrete", "continuous")
META_REGIONS = ("one", "random")


@dataclass
class CICRConfig(ICRConfig):
    d_key: int = 16                        # key vectors live in R^d_key (unit norm)
    key_spread: float = 0.5                # a region's spread around its centre (0: every key the centre)
    shift_degrees: float = 90.0            # angle between meta-training's region and each experience's
    meta_regions: str = "one"              # one: every meta-training item from the meta region (centre m0);
    #                                        random: each item from a region of its own, a random centre at
    #                                        least meta_exclusion_degrees from every experience's centre
    meta_exclusion_degrees: float = 60.0   # random: how far a meta-training centre stays from the stream's
    values: str = "discrete"               # discrete (classes, accuracy) | continuous (unit vectors, MSE)
    d_value: int = 16                      # continuous values: their dimension


@dataclass(frozen=True)
class CICRInfo(StreamInfo):
    """StreamInfo plus the discrete facts (``icr``: the ICRInfo of the token stream this one encodes),
    the stream's key vectors and, for continuous values, the value vectors."""

    icr: ICRInfo
    d_in: int
    d_out: int
    key_vectors: torch.Tensor            # [n_keys, d_key] float32: key token k's vector at row k - 2
    value_vectors: Optional[torch.Tensor]   # [n_values, d_value] float32 (continuous values), else None
    centers: torch.Tensor                # [K + 1, d_key]: the meta region's centre, then each experience's

    @property
    def facts_change(self) -> bool:
        return self.icr.facts_change

    def key_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The key token of every position of x [..., T, d_in] (the nearest stream key; meaningful at key
        positions only)."""
        d_key = self.key_vectors.shape[1]
        return (x[..., :d_key] @ self.key_vectors.T).argmax(-1) + 2

    def labels_in_force(self, exp: int, after: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Labels of experience ``exp``'s test items under the bindings in force after experience ``after``:
        each scored query's key vector is matched to its key token, whose latest value is the answer."""
        tokens = self.key_tokens(x)
        latest = self.icr.bindings_after(max(exp, after))
        scored = scored_mask(y)
        out = y.clone()
        v0 = 2 + self.icr.config.n_keys
        for idx in scored.nonzero().tolist():
            value = latest[int(tokens[tuple(idx)])] - v0
            out[tuple(idx)] = value if self.value_vectors is None else self.value_vectors[value]
        return out


def cicr_config(user: Any = None) -> CICRConfig:
    """The validated continuous-key ICR config (ICR's options and checks, plus the key space's)."""
    cfg = load_config(CICRConfig, user, "cicr config")
    what = "cicr config"
    require(cfg.d_key >= 2, what, f"d_key must be >= 2 (a centre and a direction orthogonal to it), got {cfg.d_key}")
    require(cfg.d_key >= cfg.n_experiences + 1, what,
            f"d_key={cfg.d_key} must be >= n_experiences + 1 = {cfg.n_experiences + 1} (one direction per "
            "experience orthogonal to the meta region's centre)")
    require(cfg.key_spread > 0, what, f"key_spread must be > 0 (at 0 every key of a region is the same vector), "
            f"got {cfg.key_spread}")
    require(0 <= cfg.shift_degrees <= 180, what, f"shift_degrees must be in [0, 180], got {cfg.shift_degrees}")
    require(cfg.values in VALUE_KINDS, what, f"values must be one of {VALUE_KINDS}, got {cfg.values!r}")
    require(cfg.meta_regions in META_REGIONS, what, f"meta_regions must be one of {META_REGIONS}, got {cfg.meta_regions!r}")
    require(0 <= cfg.meta_exclusion_degrees < 90, what,
            f"meta_exclusion_degrees must be in [0, 90) (a random centre must be able to avoid every experience's), "
            f"got {cfg.meta_exclusion_degrees}")
    require(cfg.d_value >= 1, what, f"d_value must be >= 1, got {cfg.d_value}")
    icr_config(_icr_options(cfg))          # ICR's own checks, with its messages
    return cfg


def _icr_options(cfg: CICRConfig) -> Dict[str, Any]:
    own = {f.name for f in fields(CICRConfig)} - {f.name for f in fields(ICRConfig)}
    return {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in own}


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _centers(cfg: CICRConfig) -> np.ndarray:
    """[K + 1, d_key]: the meta region's centre m0 (e_0), then c_j = cos(shift) m0 + sin(shift) u_j with
    u_j orthonormal, orthogonal to m0, random from the seed."""
    rng = seeded_rng("cicr", "centers", cfg.seed)
    q, _ = np.linalg.qr(rng.standard_normal((cfg.d_key - 1, cfg.d_key - 1)))
    m0 = np.eye(cfg.d_key)[0]
    u = np.concatenate([np.zeros((cfg.d_key - 1, 1)), q.T], 1)[: cfg.n_experiences]      # rows orthogonal to m0
    theta = np.deg2rad(cfg.shift_degrees)
    return np.concatenate([m0[None], np.cos(theta) * m0[None] + np.sin(theta) * u], 0)


def _draw_keys(cfg: CICRConfig, rng: np.random.Generator, center: np.ndarray, n: int) -> np.ndarray:
    g = rng.standard_normal((n, cfg.d_key)) / np.sqrt(cfg.d_key)
    return _unit(center[None] + cfg.key_spread * g)


def _region_of(cfg: CICRConfig) -> np.ndarray:
    """[n_keys]: the experience whose key region holds key token k (row k - 2); the first when regions
    overlap."""
    out = np.zeros(cfg.n_keys, np.int64)
    for j, (lo, hi) in reversed(list(enumerate(key_regions(cfg)))):
        out[lo - 2: hi - 2] = j
    return out


def _world_keys(cfg: CICRConfig, centers: np.ndarray) -> np.ndarray:
    """The stream's key vectors [n_keys, d_key]: key token k from its experience's region."""
    rng = seeded_rng("cicr", "world_keys", cfg.seed)
    region = _region_of(cfg)
    keys = np.zeros((cfg.n_keys, cfg.d_key))
    for j in range(cfg.n_experiences):
        rows = np.flatnonzero(region == j)
        keys[rows] = _draw_keys(cfg, rng, centers[1 + j], len(rows))
    return keys


def _encode(cfg: CICRConfig, tokens: torch.Tensor, labels: torch.Tensor, keys: np.ndarray,
            values: Optional[np.ndarray]):
    """ICR's token layout as vectors (module docstring). tokens, labels [T] int64; keys [n_keys, d_key] the
    vector of every key token; values [n_values, d_value] (continuous) or None (discrete)."""
    t = tokens.numpy()
    v0 = 2 + cfg.n_keys
    V = cfg.n_values if values is None else cfg.d_value
    x = np.zeros((len(t), cfg.d_key + V + 2), np.float32)
    is_key = (t >= 2) & (t < v0)
    is_value = t >= v0
    x[is_key, : cfg.d_key] = keys[t[is_key] - 2]
    if values is None:
        x[np.flatnonzero(is_value), cfg.d_key + t[is_value] - v0] = 1.0
    else:
        x[is_value, cfg.d_key: cfg.d_key + V] = values[t[is_value] - v0]
    x[t == SEP, -2] = 1.0
    x[is_value, -1] = 1.0
    lab = labels.numpy()
    scored = lab != IGNORE
    if values is None:
        y = np.where(scored, lab - v0, IGNORE).astype(np.int64)
    else:
        y = np.full((len(t), V), np.nan, np.float32)
        y[scored] = values[lab[scored] - v0]
    return torch.from_numpy(x), torch.from_numpy(y)


def _meta_center(cfg: CICRConfig, rng: np.random.Generator, centers: np.ndarray) -> np.ndarray:
    """A meta-training item's region centre: m0 (``meta_regions: one``), or a uniformly random direction at
    least ``meta_exclusion_degrees`` from every experience's centre (``random``; rejection sampling: in
    d_key >= 8 dimensions almost every draw is accepted)."""
    if cfg.meta_regions == "one":
        return centers[0]
    limit = np.cos(np.deg2rad(cfg.meta_exclusion_degrees))
    for _ in range(10_000):
        c = _unit(rng.standard_normal(cfg.d_key))
        if float((centers[1:] @ c).max()) < limit:
            return c
    raise ValueError(f"cicr: no direction {cfg.meta_exclusion_degrees} degrees from every experience's centre "
                     f"in d_key={cfg.d_key} (lower meta_exclusion_degrees or raise d_key)")


def _fresh_vectors(cfg: CICRConfig, rng: np.random.Generator, centers: np.ndarray, regions: Optional[np.ndarray]):
    """Fresh key vectors for every key token (from a meta-training region, or from each token's experience
    region when ``regions`` is given) and fresh value vectors (continuous values)."""
    if regions is None:
        keys = _draw_keys(cfg, rng, _meta_center(cfg, rng, centers), cfg.n_keys)
    else:
        keys = np.zeros((cfg.n_keys, cfg.d_key))
        for j in range(cfg.n_experiences):
            rows = np.flatnonzero(regions == j)
            keys[rows] = _draw_keys(cfg, rng, centers[1 + j], len(rows))
    values = None if cfg.values == "discrete" else _unit(rng.standard_normal((cfg.n_values, cfg.d_value)))
    return keys, values


def _stream_item(cfg: CICRConfig, keys: np.ndarray, values: Optional[np.ndarray], inner: EpisodeDataset, i: int):
    tokens, labels = inner[i][:2]
    return _encode(cfg, tokens, labels, keys, values)


def _fresh_item(cfg: CICRConfig, centers: np.ndarray, use_regions: bool, tag: tuple, inner_fn, inner_args, i: int):
    """Item i of an inner ICR dataset, encoded with vectors drawn for this item alone (meta-training: the
    meta region; probes: each key token's experience region)."""
    tokens, labels = inner_fn(*inner_args, i)[:2]
    rng = seeded_rng("cicr", "fresh", cfg.meta_seed, *tag, i)
    keys, values = _fresh_vectors(cfg, rng, centers, _region_of(cfg) if use_regions else None)
    return _encode(cfg, tokens, labels, keys, values)


def _fresh(cfg: CICRConfig, centers: np.ndarray, use_regions: bool, tag: tuple, inner: EpisodeDataset) -> EpisodeDataset:
    return EpisodeDataset(_fresh_item, (cfg, centers, use_regions, tag, inner.fn, inner.args), len(inner), inner.offset)


def _probe(cfg: CICRConfig, centers: np.ndarray, name: str, make, *args):
    """A probe of the ICR stream (its last argument n), encoded with fresh vectors from the regions."""
    inner = make(*args)
    return _fresh(cfg, centers, True, tuple(_probe_index(a) for a in (name, *args[:-1])), inner)


def _probe_index(value: Any) -> int:
    """A probe argument as an integer for the random stream's index (kinds by their name's bytes)."""
    if isinstance(value, str):
        return int.from_bytes(value.encode()[:8], "little")
    return int(value)


def cicr_data(cfg: Any = None) -> StreamData:
    """The continuous-key ICR stream without Avalanche (module docstring)."""
    cfg = cicr_config(cfg)
    inner = icr_data(_icr_options(cfg))
    centers = _centers(cfg)
    keys = _world_keys(cfg, centers)
    values = None if cfg.values == "discrete" else _unit(
        seeded_rng("cicr", "world_values", cfg.seed).standard_normal((cfg.n_values, cfg.d_value)))
    train = [EpisodeDataset(_stream_item, (cfg, keys, values, d), len(d)) for d in inner.train]
    test = [EpisodeDataset(_stream_item, (cfg, keys, values, d), len(d)) for d in inner.test]
    meta = _fresh(cfg, centers, False, (_probe_index("meta"),), inner.meta_train)
    V = cfg.n_values if values is None else cfg.d_value
    icr = inner.info
    info = CICRInfo(
        name="cicr", metric="accuracy" if values is None else "mse", n_experiences=icr.n_experiences,
        seq_len=icr.seq_len, test_seq_len=icr.test_seq_len, vocab_size=None, config=cfg, icr=icr,
        d_in=cfg.d_key + V + 2, d_out=V, key_vectors=torch.from_numpy(keys.astype(np.float32)),
        value_vectors=None if values is None else torch.from_numpy(values.astype(np.float32)),
        centers=torch.from_numpy(centers.astype(np.float32)),
    )
    return StreamData(
        train, test, meta, info,
        delay_probe=partial(_probe, cfg, centers, "delay", inner.delay_probe),
        interference_probe=partial(_probe, cfg, centers, "interference", inner.interference_probe),
        capacity_probe=partial(_probe, cfg, centers, "capacity", inner.capacity_probe),
        meta_recalled=inner.meta_recalled, meta_reach=inner.meta_reach,
    )


def cicr_benchmark(cfg: Any = None):
    """The continuous-key ICR stream as an Avalanche benchmark (``.info``: CICRInfo)."""
    return to_benchmark(cicr_data(cfg))


def describe_episode(x: torch.Tensor, y: torch.Tensor, info: CICRInfo, width: int = 3) -> List[str]:
    """One line per position of an encoded item: what it carries (key k<token> and its first ``width``
    coordinates, a value, SEP, PAD) and the label: for docs and debugging."""
    cfg = info.config
    d_key = cfg.d_key
    lines = []
    for t in range(x.shape[0]):
        row = x[t]
        if row[-2] == 1:
            what = "SEP"
        elif row[-1] == 1:
            part = row[d_key:-2]
            what = f"value v{int(part.argmax())}" if info.value_vectors is None else \
                "value [" + " ".join(f"{float(v):+.2f}" for v in part[:width]) + " ...]"
        elif float(row[:d_key].abs().sum()) > 0:
            what = "key [" + " ".join(f"{float(v):+.2f}" for v in row[:width]) + " ...]"
        else:
            what = "PAD"
        label = y[t]
        if label.dim() == 0:
            lab = "" if int(label) == IGNORE else f"-> v{int(label)}"
        else:
            lab = "" if bool(torch.isnan(label).any()) else "-> [" + " ".join(f"{float(v):+.2f}" for v in label[:width]) + " ...]"
        lines.append(f"{t:3d}  {what:40s} {lab}")
    return lines
