"""Text shift: byte-level language modelling over domains of real text, one domain per experience.

Tokens are bytes (``vocab_size = 256``, no specials). A training or test episode is a window of
``seq_len + 1`` consecutive bytes of one domain::

    x = window[:-1]   [T] int64 bytes
    y = window[1:]    [T] int64, the next byte at every position (all scored); metric: bits per byte

**Domains.** ``domains`` lists one entry per experience, each a built-in name or a path (a file, or a
directory read recursively: files whose suffix is in ``suffixes``, sorted by relative path, hidden
entries skipped). Built-in domains read files that ship with every CPython install
(``sysconfig.get_paths()["stdlib"]``):

- ``prose``: the reference documentation pydoc shows (the topic texts of ``pydoc_data/topics.py``);
- ``code``: Python source of the ``json``, ``email``, ``http``, ``urllib``, ``logging`` and ``html`` packages;
- ``tables``: the charmap codec tables of ``encodings/`` (``cp*.py``, ``iso8859_*.py``, ``mac_*.py``, ``koi8_*.py``);
- ``license``: ``LICENSE.txt`` (absent from some distributions' builds).

A domain's text is its files concatenated in order, cut at ``max_bytes``; a missing or empty domain is
a ValueError naming it.

**Held-out text.** The text is cut into blocks of ``block_bytes``; a seeded choice (a function of the
seed and the domain's name, not of its position in the list) of ``test_fraction`` of the blocks is
held out (at least one block each way). Training episodes read only the training blocks, test
episodes only the held-out blocks, so the two never share a byte position of the domain's text
(``info.domains[j]``: block lists and both texts).

**Lanes.** ``lanes`` = L (the batch size of an unshuffled loader): item ``k * L + b`` is window k of
lane b, and lane b reads contiguous text (window k + 1 starts where window k's inputs end), so a model
that carries lane b's state from batch to batch reads on where it stopped. Lanes start at seeded
offsets (a function of the seed and the domain's name), one in each L-th of the text.

**Long held-out text** (``long_bytes`` > 0): the last ``long_bytes`` of each domain are cut off before
the blocks, in neither split, and read whole by the position probe (``position_probe(domain, length,
n)``: n documents of ``length`` bytes, evenly spaced), which measures bits per byte against the
position in a long document (``strategies.evaluation.position``).

**Meta-training**: random windows (one fresh window per episode) of the ``meta_domains`` (none by
default, then ``meta_train`` is None); a meta domain may not also be a stream domain.
"""
from __future__ import annotations

import ast
import os
import sysconfig
import zlib
from dataclasses import dataclass, field
from functools import partial
from typing import Any, List, Optional, Tuple

import numpy as np
import torch

from streams.common import EpisodeDataset, EpisodeStreamConfig, StreamData, StreamInfo, load_config, require, seeded_rng, to_benchmark

CODE_PACKAGES = ("json", "email", "http", "urllib", "logging", "html")
TABLE_PATTERNS = ("cp", "iso8859_", "mac_", "koi8_")
BUILTIN_DOMAINS = ("prose", "code", "tables", "license")


@dataclass
class TextConfig(EpisodeStreamConfig):
    domains: List[str] = field(default_factory=lambda: ["prose", "code", "tables"])   # one per experience
    seq_len: int = 64
    lanes: int = 1                        # windows per batch that continue each other (see module doc)
    test_fraction: float = 0.1            # share of blocks held out
    block_bytes: int = 1024
    max_bytes: Optional[int] = 1_000_000  # per domain; None -> everything
    suffixes: List[str] = field(default_factory=lambda: [".txt", ".rst", ".md", ".py", ".csv", ".json", ".html"])
    meta_domains: List[str] = field(default_factory=list)
    long_bytes: int = 0                   # the last bytes of each domain, held out whole for the position probe


@dataclass(frozen=True)
class TextDomain:
    """One domain as read and split. Texts are the blocks concatenated in order."""

    name: str
    n_files: int
    n_bytes: int
    train_blocks: List[int]
    test_blocks: List[int]
    train_text: bytes
    test_text: bytes
    train_starts: List[int]               # offset in train_text of each training item's window
    test_starts: List[int]                # offset in test_text of each test item's window
    long_text: bytes = b""                # the domain's last long_bytes, in neither split (position probe)


@dataclass(frozen=True)
class TextInfo(StreamInfo):
    domains: List[TextDomain]

    @staticmethod
    def token_name(token: int) -> str:
        return chr(token) if 32 <= token < 127 else f"\\x{token:02x}"


def text_config(user: Any = None) -> TextConfig:
    """The validated text config (see ``icr_config``); reading the domains happens in ``text_data``."""
    cfg = load_config(TextConfig, user, "text config")
    _check(cfg)
    return cfg


def _check(cfg: TextConfig) -> None:
    what = "text config"
    require(len(cfg.domains) >= 1, what, "domains must name at least one domain (K = len(domains) >= 1)")
    require(len(set(cfg.domains)) == len(cfg.domains), what, f"a domain is listed twice in {list(cfg.domains)}")
    both = sorted(set(cfg.domains) & set(cfg.meta_domains))
    require(not both, what, f"meta_domains {both} are also stream domains (their held-out text would leak)")
    for key in ("seq_len", "train_episodes", "test_episodes", "lanes", "block_bytes", "meta_train_episodes"):
        require(getattr(cfg, key) >= 1, what, f"{key} must be >= 1, got {getattr(cfg, key)}")
    for key in ("seed", "meta_seed", "long_bytes"):
        require(getattr(cfg, key) >= 0, what, f"{key} must be >= 0, got {getattr(cfg, key)}")
    require(cfg.max_bytes is None or cfg.max_bytes >= 1, what, f"max_bytes must be >= 1 or null, got {cfg.max_bytes}")
    require(0 < cfg.test_fraction < 1, what, f"test_fraction must be in (0, 1), got {cfg.test_fraction}")
    for key in ("train_episodes", "test_episodes"):
        require(getattr(cfg, key) % cfg.lanes == 0, what,
                f"{key}={getattr(cfg, key)} must be a multiple of lanes={cfg.lanes}")


def _stdlib() -> str:
    return sysconfig.get_paths()["stdlib"]


def _files_under(root: str, keep) -> List[str]:
    found = []
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        found += [os.path.join(here, f) for f in files if not f.startswith(".") and keep(f)]
    return sorted(found, key=lambda p: os.path.relpath(p, root).replace(os.sep, "/"))


def _read(paths: List[str], limit: Optional[int]) -> bytes:
    parts, total = [], 0
    for path in paths:
        with open(path, "rb") as fh:
            parts.append(fh.read() if limit is None else fh.read(limit - total))
        total += len(parts[-1])
        if limit is not None and total >= limit:
            break
    return b"".join(parts)


def _prose(path: str) -> bytes:
    """The topic texts of pydoc_data/topics.py (a dict literal ``topics = {name: text}``), in name order."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
            return "\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    raise ValueError(f"text domain 'prose': no 'topics = {{...}}' literal in {path}")


def read_domain(name: str, cfg: TextConfig) -> Tuple[bytes, int]:
    """(text, number of files) of a domain, cut at cfg.max_bytes. ValueError if missing or empty."""
    lib = _stdlib()
    if name == "prose":
        path = os.path.join(lib, "pydoc_data", "topics.py")
        require(os.path.isfile(path), f"text domain {name!r}", f"{path} is missing from this Python install")
        text, paths = _prose(path), [path]
    elif name in ("code", "tables", "license"):
        if name == "code":
            paths = [p for pkg in CODE_PACKAGES if os.path.isdir(os.path.join(lib, pkg))
                     for p in _files_under(os.path.join(lib, pkg), lambda f: f.endswith(".py"))]
        elif name == "tables":
            paths = _files_under(os.path.join(lib, "encodings"),
                                 lambda f: f.endswith(".py") and f.startswith(TABLE_PATTERNS))
        else:
            paths = [p for p in [os.path.join(lib, "LICENSE.txt")] if os.path.isfile(p)]
        require(bool(paths), f"text domain {name!r}", f"none of its files exist under {lib}")
        text = _read(paths, cfg.max_bytes)
    elif os.path.isfile(name):
        paths = [name]
        text = _read(paths, cfg.max_bytes)
    elif os.path.isdir(name):
        paths = _files_under(name, lambda f: os.path.splitext(f)[1] in cfg.suffixes)
        require(bool(paths), f"text domain {name!r}", f"no files with suffixes {list(cfg.suffixes)} in this directory")
        text = _read(paths, cfg.max_bytes)
    else:
        raise ValueError(f"text domain {name!r}: neither a built-in domain {BUILTIN_DOMAINS} "
                         "nor an existing file or directory")
    if cfg.max_bytes is not None:
        text = text[: cfg.max_bytes]
    require(len(text) > 0, f"text domain {name!r}", "is empty")
    return text, len(paths)


def split_blocks(n_bytes: int, name: str, cfg: TextConfig) -> Tuple[List[int], List[int]]:
    """(train blocks, held-out blocks) of a text of n_bytes: seeded by (seed, the domain's name)."""
    n_blocks = -(-n_bytes // cfg.block_bytes)
    n_test = max(1, round(cfg.test_fraction * n_blocks))
    require(n_blocks - n_test >= 1, f"text domain {name!r}",
            f"{n_bytes} bytes make {n_blocks} block(s) of block_bytes={cfg.block_bytes}: too few to hold out "
            f"test_fraction={cfg.test_fraction} and keep a training block")
    rng = seeded_rng("text", "split", cfg.seed, zlib.crc32(name.encode("utf-8")))
    test = sorted(rng.choice(n_blocks, n_test, replace=False).tolist())
    held = set(test)
    return [b for b in range(n_blocks) if b not in held], test


def lane_starts(n_text: int, n_episodes: int, cfg: TextConfig, rng: np.random.Generator, what: str) -> List[int]:
    """Window offsets of items 0..n_episodes-1: item k * L + b is window k of lane b (module doc)."""
    L, T = cfg.lanes, cfg.seq_len
    per_lane = n_episodes // L
    need, share = per_lane * T + 1, n_text // L
    require(share >= need, what,
            f"{n_text} bytes are too few for {n_episodes} windows of seq_len={T} in lanes={L} "
            f"(each lane needs {need} contiguous bytes)")
    first = [b * share + int(rng.integers(0, share - need + 1)) for b in range(L)]
    return [first[b] + k * T for k in range(per_lane) for b in range(L)]


def _window(text: np.ndarray, starts: List[int], seq_len: int, i: int):
    w = torch.from_numpy(text[starts[i]: starts[i] + seq_len + 1].astype(np.int64))
    return w[:-1], w[1:]


def _meta_window(text: np.ndarray, cfg: TextConfig, i: int):
    rng = seeded_rng("text", "meta", cfg.meta_seed, i)
    start = int(rng.integers(0, len(text) - cfg.seq_len))
    return _window(text, [start], cfg.seq_len, 0)


def _domain(name: str, cfg: TextConfig) -> TextDomain:
    text, n_files = read_domain(name, cfg)
    long_text = b""
    if cfg.long_bytes:
        require(len(text) > cfg.long_bytes + 2 * cfg.block_bytes, f"text domain {name!r}",
                f"{len(text)} bytes cannot spare long_bytes={cfg.long_bytes} and keep two blocks of "
                f"block_bytes={cfg.block_bytes}")
        text, long_text = text[:-cfg.long_bytes], text[-cfg.long_bytes:]
    train_blocks, test_blocks = split_blocks(len(text), name, cfg)
    B = cfg.block_bytes
    train = b"".join(text[b * B: (b + 1) * B] for b in train_blocks)
    test = b"".join(text[b * B: (b + 1) * B] for b in test_blocks)
    tag = zlib.crc32(name.encode("utf-8"))
    starts = [lane_starts(len(t), n, cfg, seeded_rng("text", which, cfg.seed, tag), f"text domain {name!r} ({which})")
              for t, n, which in ((train, cfg.train_episodes, "train"), (test, cfg.test_episodes, "test"))]
    return TextDomain(name, n_files, len(text), train_blocks, test_blocks, train, test, starts[0], starts[1], long_text)


def position_probe(domains: List[TextDomain], domain: int, length: int, n: int) -> EpisodeDataset:
    """``n`` documents of ``length`` bytes (x, y: the next byte) from domain ``domain``'s held-out long
    text (``long_bytes``), evenly spaced over it (overlapping when it is shorter than n * length)."""
    what = "text position probe"
    require(0 <= domain < len(domains), what, f"domain must be in [0, {len(domains) - 1}], got {domain}")
    text = domains[domain].long_text
    require(len(text) >= length + 1, what,
            f"domain {domains[domain].name!r} holds {len(text)} long held-out bytes, fewer than length + 1 = "
            f"{length + 1} (set stream.options.long_bytes)")
    require(length >= 1 and n >= 1, what, f"length and n must be >= 1, got {length}, {n}")
    span = len(text) - length - 1
    starts = [0] if n == 1 else [k * span // (n - 1) for k in range(n)]
    return EpisodeDataset(_window, (np.frombuffer(text, np.uint8), starts, length), n)


def text_data(cfg: Any = None) -> StreamData:
    """The text stream without Avalanche: reads the domains; K train/test EpisodeDatasets, meta-training, TextInfo."""
    cfg = text_config(cfg)
    domains = [_domain(name, cfg) for name in cfg.domains]
    train, test = [], []
    for d in domains:
        train.append(EpisodeDataset(_window, (np.frombuffer(d.train_text, np.uint8), d.train_starts, cfg.seq_len),
                                    cfg.train_episodes))
        test.append(EpisodeDataset(_window, (np.frombuffer(d.test_text, np.uint8), d.test_starts, cfg.seq_len),
                                   cfg.test_episodes))
    meta = None
    if cfg.meta_domains:
        text = b"".join(read_domain(name, cfg)[0] for name in cfg.meta_domains)
        require(len(text) > cfg.seq_len, "text config", f"meta_domains hold {len(text)} bytes, fewer than "
                f"seq_len + 1 = {cfg.seq_len + 1}")
        meta = EpisodeDataset(_meta_window, (np.frombuffer(text, np.uint8), cfg), cfg.meta_train_episodes)
    info = TextInfo(name="text", metric="bits_per_byte", n_experiences=len(domains), seq_len=cfg.seq_len,
                    test_seq_len=cfg.seq_len, vocab_size=256, config=cfg, domains=domains)
    return StreamData(train, test, meta, info, position_probe=partial(position_probe, domains))


def text_benchmark(cfg: Any = None):
    """The text stream as an Avalanche benchmark, with ``.info`` (TextInfo) and ``.meta_train``."""
    return to_benchmark(text_data(cfg))
