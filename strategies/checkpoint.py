"""Checkpoints after every experience: weights, optimizer, persistent memory, metrics, RNG, progress.

Written atomically (a temporary file, then a rename), so a crash mid-write leaves the previous
checkpoint intact and usable.
"""
from __future__ import annotations

import os
import random
from typing import Any, Dict, Optional

import numpy as np
import torch


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
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str) -> Dict[str, Any]:
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return torch.load(path, weights_only=False)
