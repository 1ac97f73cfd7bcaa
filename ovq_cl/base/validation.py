"""Structured configs: a dataclass schema, user values merged onto its defaults by omegaconf."""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Dict, Hashable, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

#: validated results by (schema, user values): a sweep validates the same mixer, stream and strategy options
#: hundreds of times (every config of a grid, every size a budget search tries), and omegaconf takes
#: milliseconds each; a result is copied out, so callers never share one. Bounded: cleared when full.
_VALIDATED: Dict[Hashable, Any] = {}
_VALIDATED_MAX = 4096
_SCALARS = (str, int, float, bool, type(None))


def _frozen(value: Any) -> Optional[Hashable]:
    """A hashable key for plain user values (dicts, lists, tuples of str/int/float/bool/None), with each
    value's type in it (omegaconf treats 1, 1.0, True and "1" differently) and dict keys in their order;
    None for anything else (a DictConfig, a dataclass: those are validated without the cache)."""
    if isinstance(value, _SCALARS):
        return (type(value).__name__, value)
    if type(value) is dict:
        items = []
        for k, v in value.items():
            frozen = _frozen(v)
            if frozen is None or not isinstance(k, _SCALARS):
                return None
            items.append(((type(k).__name__, k), frozen))
        return ("dict", tuple(items))
    if type(value) in (list, tuple):
        parts = tuple(_frozen(v) for v in value)
        return None if any(p is None for p in parts) else (type(value).__name__, parts)
    return None


def validate(schema: type, user: Any, what: str = "config"):
    """Merges ``user`` (dict, DictConfig, dataclass or None) onto ``schema``'s defaults.

    Returns an instance of ``schema`` (a new one each call). Unknown keys and type errors raise ValueError
    naming the key (omegaconf's message, prefixed by ``what``).
    """
    frozen = _frozen(user)
    key = None if frozen is None else (schema, frozen)
    if key is not None and key in _VALIDATED:
        return copy.deepcopy(_VALIDATED[key])
    result = _merge(schema, user, what)
    if key is not None:
        if len(_VALIDATED) >= _VALIDATED_MAX:
            _VALIDATED.clear()
        _VALIDATED[key] = copy.deepcopy(result)
    return result


#: each schema's defaults as a structured config, built once: ``OmegaConf.merge`` copies its first argument
#: and never changes it, and building one takes as long as the merge itself
_STRUCTURED: Dict[type, DictConfig] = {}


def _merge(schema: type, user: Any, what: str):
    try:
        if schema not in _STRUCTURED:
            _STRUCTURED[schema] = OmegaConf.structured(schema)
        base = _STRUCTURED[schema]
        if user is not None:
            if not isinstance(user, (DictConfig, dict)) and not dataclasses.is_dataclass(user):
                raise ValueError(f"{what}: expected a mapping, got {type(user).__name__}")
            base = OmegaConf.merge(base, user)
        return OmegaConf.to_object(base)
    except OmegaConfBaseException as err:
        hint = " (a list is written in brackets: key=[a,b])" if "is not a ListConfig" in str(err) else ""
        raise ValueError(f"{what}: {err}".strip() + hint) from err
