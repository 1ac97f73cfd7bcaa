"""Configs as MLflow params: the tracking URI rule, flattening, MLflow's limits on keys and values."""
from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any, Dict, Mapping, Optional

DEFAULT_TRACKING_URI = "sqlite:///mlruns.db"
"""The default store: a SQLite file in the current directory (``mlflow ui --backend-store-uri sqlite:///mlruns.db``)."""

MAX_PARAM_VALUE_LENGTH = 6000   # MLflow's limit on a param value (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH)
MAX_TAG_VALUE_LENGTH = 8000     # ... on a tag value
MAX_KEY_LENGTH = 250            # ... on a param, metric or tag key
TRUNCATED_MARKER = "...[truncated]"

_PACKAGES = {"torch": "torch", "avalanche": "avalanche-lib", "mlflow": "mlflow", "ovq-cl": "ovq-cl"}
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- ]" if os.name == "nt" else r"[^/\w.\- :]")
_BATCH_METRICS = 1000           # MLflow's per-request limits
_BATCH_PARAMS = 100

log = logging.getLogger(__name__)


def default_tracking_uri(explicit: Optional[str] = None) -> str:
    """The tracking URI to use: ``explicit`` if given, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlruns.db``.

    The default SQLite file is relative to the current directory. A tracking server is simply
    ``http://host:5000``. A plain ``file:`` store is refused by MLflow 3 unless
    ``MLFLOW_ALLOW_FILE_STORE=true``; prefer SQLite.
    """
    if explicit:
        return str(explicit)
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def _to_container(cfg: Any) -> Any:
    """A resolved omegaconf config / dataclass / mapping as plain Python containers."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(cfg, (DictConfig, ListConfig)):
            return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if isinstance(cfg, Mapping):
        return {k: _to_container(v) if _is_config_like(v) else v for k, v in cfg.items()}
    return cfg


def _is_config_like(v: Any) -> bool:
    return isinstance(v, Mapping) or (dataclasses.is_dataclass(v) and not isinstance(v, type)) or \
        type(v).__name__ in ("DictConfig", "ListConfig")


def _truncate(value: str, limit: int, what: str) -> str:
    if len(value) <= limit:
        return value
    log.warning("%s is %d characters, over MLflow's limit of %d: truncated (the full value is in config.yaml)",
                what, len(value), limit)
    return value[: limit - len(TRUNCATED_MARKER)] + TRUNCATED_MARKER


def _safe_key(name: str) -> str:
    """``name`` if MLflow accepts it as a param/metric key, else a sanitised version of it.

    MLflow keys may hold alphanumerics, ``_ - . / space`` and (not on Windows) ``:``, must be at most
    250 characters, and must be normalised paths (no ``//``, no leading or trailing ``/``, no ``.``/``..``).
    """
    name = str(name)
    if not _BAD_KEY_CHARS.search(name) and len(name) <= MAX_KEY_LENGTH and _normalised(name):
        return name
    s = re.sub(r"/+", "/", _BAD_KEY_CHARS.sub("_", name)).strip("/")
    s = "/".join("_" if part in (".", "..") else part for part in s.split("/")) or "_"
    return s[:MAX_KEY_LENGTH].rstrip("/")


def _normalised(name: str) -> bool:
    import posixpath

    norm = posixpath.normpath(name)
    return bool(name) and norm == name and norm != "." and not norm.startswith("..") and not norm.startswith("/")


def flatten_config(cfg: Any, prefix: str = "") -> Dict[str, str]:
    """Flatten a config into MLflow params: dotted keys, ``str`` values.

    ``cfg`` may be an omegaconf ``DictConfig`` (interpolations are resolved), a dataclass or a
    mapping, nested to any depth: ``{"model": {"ovq": {"num_slots": 64}}}`` gives
    ``{"model.ovq.num_slots": "64"}``. A list or tuple stays one param, the ``repr`` of it as a plain
    list (``"[64, 128]"``, as omegaconf and ``config.yaml`` have it); an empty mapping becomes ``"{}"``;
    ``None`` becomes ``"None"``.

    A value longer than MLflow's limit (6000 characters) is truncated and ends with
    ``TRUNCATED_MARKER`` (a warning is logged; :meth:`RunTracker.log_config` also stores the
    whole config as ``config.yaml``). Keys MLflow would reject are sanitised (bad characters -> ``_``).
    """
    container = _to_container(cfg)
    if not isinstance(container, Mapping):
        raise TypeError(f"flatten_config needs a mapping-like config, got {type(cfg).__name__}")
    out: Dict[str, str] = {}

    def walk(node: Mapping, path: str) -> None:
        for k, v in node.items():
            key = f"{path}.{k}" if path else str(k)
            v = _to_container(v) if _is_config_like(v) else v
            if isinstance(v, Mapping) and v:
                walk(v, key)
            else:
                text = "{}" if isinstance(v, Mapping) else (repr(_plain(v)) if isinstance(v, (list, tuple)) else str(v))
                out[_safe_key(key)] = _truncate(text, MAX_PARAM_VALUE_LENGTH, f"param {key!r}")

    walk(container, prefix)
    return out


def _plain(obj: Any) -> Any:
    """Plain YAML/JSON-safe Python: containers recursed, numbers/str/bool/None kept, tensors/arrays as
    lists or scalars, anything else as ``str``."""
    if _is_config_like(obj):
        obj = _to_container(obj)
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "tolist"):          # numpy arrays/scalars, torch tensors
        return _plain(obj.tolist())
    return str(obj)


def _scalar(value: Any) -> Optional[float]:
    """``value`` as a float if it is one number (int, float, bool, numpy scalar, one-element tensor), else None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    try:
        n = numel() if callable(numel) else numel
        if n == 1 and hasattr(value, "item"):
            item = value.item()
            if isinstance(item, (bool, int, float)):
                return float(item)
    except Exception:  # noqa: BLE001 - anything that is not a number is simply not a scalar
        pass
    return None


def store_key(uri: Optional[str]) -> str:
    """A short name of a tracking store, for paths that must differ between stores (a run's checkpoint
    folder): ``untracked`` for None, else a hash of the URI with a local SQLite or file store's path made
    absolute (``sqlite:///mlruns.db`` in two folders is two stores)."""
    if uri is None:
        return "untracked"
    import hashlib

    for scheme in ("sqlite:///", "file://"):
        if uri.startswith(scheme):
            uri = scheme + os.path.abspath(uri[len(scheme):])
    return "store-" + hashlib.sha1(uri.encode()).hexdigest()[:8]
