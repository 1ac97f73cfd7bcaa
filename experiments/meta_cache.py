"""Meta-trained weights shared between runs whose meta-training is the same.

Runs that differ only in what happens after meta-training (the stream's length, the strategy, the
memory policy, the gate) meta-train the same weights: the long-context study streams 4k to 64k tokens
per lane after one meta-training per (mixer, seed). The first such run stores, under
``{checkpoint.dir}/meta/{key}.pt``, the weights, the meta-training history and the global RNG state
right after meta-training; a later run with the same key loads all three instead of meta-training, so
everything after is bitwise what it would have computed itself (tested).

The key hashes everything meta-training reads: the seed, the model config (vocabulary included), the
meta-training section (``checkpoint_every`` aside: it does not change the numbers), the device and
precision, the plugins, the meta-training *data* (every item's tokens and labels, so any stream option
that changes meta-training changes the key and none that does not, such as the stream's length, its
tables or its test episodes), and the *content* of the code meta-training runs (:data:`META_CODE`: the
models, the streams, the meta-training loop and what it imports, the pinned dependencies), not the git
commit: a commit that touches only the strategies of the stream or the reports keeps sharing. The
runner (which calls meta-training) and this module are part of META_CODE, so no version number is
kept by hand; a test checks that the meta-training loop imports nothing outside it. Plugins loaded by
the run (``plugins``, entry points) enter the key by their source
(:func:`experiments.code_version.plugin_source_hash`), not only their names.
``checkpoint.share_meta: false`` turns the sharing off. The runner holds
:func:`experiments.run_lock.meta_training_lock` on an entry from looking it up until it has stored it,
so runs of one key started together meta-train it once.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Optional

import torch

from experiments.code_version import plugin_source_hash
from strategies.training.checkpoint import rng_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
META_CODE = ("ovq_cl", "streams", "strategies/__init__.py", "strategies/training", "strategies/evaluation/__init__.py",
             "strategies/evaluation/metrics.py", "experiments/runner.py", "experiments/meta_cache.py",
             "pyproject.toml", "constraints.txt")
_CODE_HASH: Optional[str] = None


def meta_code_hash() -> str:
    """A hash of the files of :data:`META_CODE` (Python sources under its folders), read once per process."""
    global _CODE_HASH
    if _CODE_HASH is None:
        h = hashlib.sha256()
        for entry in META_CODE:
            path = os.path.join(ROOT, entry)
            files = [path] if os.path.isfile(path) else sorted(
                os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".py"))
            for f in files:
                h.update(os.path.relpath(f, ROOT).encode())
                with open(f, "rb") as fh:
                    h.update(fh.read())
        _CODE_HASH = h.hexdigest()[:16]
    return _CODE_HASH


def meta_key(cfg, meta_dataset, version: Optional[str] = None, world_size: int = 1) -> str:
    """A hex digest of what meta-training of ``cfg`` reads (module docstring); ``meta_dataset`` yields
    items (x, y, ...) of tensors; ``version``: the code's (default :func:`meta_code_hash`);
    ``world_size``: the data-parallel ranks that meta-train (not in the key of one process)."""
    d = cfg.to_dict()
    what = {
        "seed": d["seed"], "model": d["model"], "stream": cfg.stream.name, "plugins": d.get("plugins"),
        "meta_train": {k: v for k, v in d["meta_train"].items() if k != "checkpoint_every"},
        "device": cfg.resolved_device(), "precision": cfg.precision, "code": version or meta_code_hash(),
    }
    plugins = plugin_source_hash(cfg.plugins)
    if plugins:                 # the source of the user's code, not only its module names
        what["plugins_code"] = plugins
    if world_size > 1:          # ranks sum in another order: their weights are not bitwise one process's
        what["world_size"] = world_size
    h = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode())
    n = 0 if meta_dataset is None else len(meta_dataset)
    h.update(f"items={n}".encode())
    for i in range(n):
        x, y = meta_dataset[i][:2]
        for t in (x, y):
            h.update(str((t.dtype, tuple(t.shape))).encode())
            h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


def meta_path(cfg, key: str) -> str:
    return os.path.join(cfg.checkpoint.dir, "meta", f"{key}.pt")


def load_meta(path: str) -> Optional[Dict[str, Any]]:
    """The stored {"model", "history", "rng"} or None when absent or unreadable (then meta-train again)."""
    if not os.path.exists(path):
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception:           # a torn or foreign file: meta-training again is always correct
        return None


def save_meta(path: str, model: torch.nn.Module, history: List[Dict[str, Any]]) -> None:
    """Stores the weights, history and the current RNG state, atomically (concurrent runs may race)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    torch.save({"model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                "history": history, "rng": rng_state()}, tmp)
    os.replace(tmp, path)
