"""Structured configs: a dataclass schema, user values merged onto its defaults by omegaconf."""
from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


def validate(schema: type, user: Any, what: str = "config"):
    """Merges ``user`` (dict, DictConfig, dataclass or None) onto ``schema``'s defaults.

    Returns an instance of ``schema``. Unknown keys and type errors raise ValueError naming the key
    (omegaconf's message, prefixed by ``what``).
    """
    try:
        base = OmegaConf.structured(schema)
        if user is not None:
            if not isinstance(user, (DictConfig, dict)) and not dataclasses.is_dataclass(user):
                raise ValueError(f"{what}: expected a mapping, got {type(user).__name__}")
            base = OmegaConf.merge(base, user)
        return OmegaConf.to_object(base)
    except OmegaConfBaseException as err:
        hint = " (a list is written in brackets: key=[a,b])" if "is not a ListConfig" in str(err) else ""
        raise ValueError(f"{what}: {err}".strip() + hint) from err
