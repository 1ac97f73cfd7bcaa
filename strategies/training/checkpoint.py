"""Checkpoints after every experience: weights, optimizer, persistent memory, metrics, RNG, progress.

Written atomically (a temporary file, then a rename), so a crash mid-write leaves the previous
checkpoint intact and usable; the one before is kept as ``prev.pt`` beside ``last.pt``, and
:func:`load_latest` falls back to it when the last one cannot be read (a truncated disk write, a
file damaged by hand), saying so.
"""
from __future__ import annotations

import errno
import os
import random
import shutil
from typing import Any, Dict, Optional

import numpy as np
import torch

# a checkpoint may hold Avalanche objects (a stock plugin's attributes, strategies.plugins): unpickling them
# imports Avalanche, which needs the torchvision shim first
import ovq_cl.base.avalanche_compat  # noqa: F401,E402


def rng_state() -> Dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save_checkpoint(path: str, *, model, optimizer, states, next_experience: int, metrics: Dict[str, Any],
                    extra: Optional[Dict[str, Any]] = None) -> str:
    """states: the carried per-block states (list of MixerState or None)."""
    payload = {
        "model": model.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "states": None if states is None else [None if s is None else s.state_dict() for s in states],
        "next_experience": next_experience,
        "metrics": metrics,
        "rng": rng_state(),
        "extra": extra or {},
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    try:
        torch.save(payload, tmp)
    except (RuntimeError, OSError) as err:
        # a full disk reaches torch's zip writer as "enforce fail ... file write failed": said as what it is;
        # the last complete checkpoint is untouched (only the temporary file was being written)
        folder = os.path.dirname(os.path.abspath(path))
        full = isinstance(err, OSError) and err.errno == errno.ENOSPC or "write failed" in str(err)
        if os.path.exists(tmp):
            os.remove(tmp)
        if not full:
            raise
        raise CheckpointWriteError(errno.ENOSPC, f"no space left on the device of {folder} to write a checkpoint "
                                   f"({shutil.disk_usage(folder).free:,} B free); the last checkpoint is "
                                   "kept and the run resumes from it once there is room") from err
    if os.path.exists(path):
        os.replace(path, previous_path(path))
    os.replace(tmp, path)
    return path


class CheckpointError(ValueError):
    """A checkpoint that cannot be read; the message names it and how to start over."""


class CheckpointWriteError(OSError):
    """A checkpoint that could not be written (no space left): the message says where and what is kept."""


def previous_path(path: str) -> str:
    return os.path.join(os.path.dirname(path), "prev.pt")


def load_checkpoint(path: str) -> Dict[str, Any]:
    """The checkpoint at ``path``; CheckpointError (naming the path) if it cannot be read."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, weights_only=False, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same problem for the user
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(err).__name__}: {err})") from err
    if not isinstance(payload, dict) or "next_experience" not in payload:
        raise CheckpointError(f"checkpoint {path} is not a checkpoint of ovq-cl")
    return payload


def load_latest(path: str, warn=print) -> Optional[Dict[str, Any]]:
    """``last.pt`` at ``path``, or the previous one when the last cannot be read (with a warning);
    None when there is none. Both unreadable: CheckpointError with the way out."""
    if not os.path.exists(path):
        return None
    try:
        return load_checkpoint(path)
    except CheckpointError as err:
        prev = previous_path(path)
        if os.path.exists(prev):
            try:
                ckpt = load_checkpoint(prev)
            except CheckpointError:
                pass
            else:
                warn(f"ovq-cl: {err}; resuming from the previous checkpoint {prev}")
                return ckpt
        raise CheckpointError(f"{err}; delete {os.path.dirname(path)} or pass checkpoint.resume=false "
                              "to start over") from err
