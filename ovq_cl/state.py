"""Typed per-layer mixer states.

Every mixer returns ``(y, state)``. A state is a small dataclass whose fields are tensors (or
``None``) plus plain Python ints (counters kept on the host so that the hot path never has to read
a number back from the device). The base class gives all of them the same behaviour:

- ``detach()`` / ``clone()`` / ``to(device)``: new states, the original is untouched;
- ``state_dict()`` / ``from_state_dict(d)``: a flat ``{name: tensor}`` dict that ``torch.save`` can
  write; ints are stored as 0-dim int64 tensors;
- ``nbytes``: bytes held by the state's tensors (the memory the mixer carries between calls).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Dict, Optional, Type, TypeVar

import torch

S = TypeVar("S", bound="MixerState")


@dataclasses.dataclass
class MixerState:
    """Base class of all mixer states. Subclasses are dataclasses of tensors and ints.

    Tensors hold lanes on dim 0. An int field is a summary over the lanes: the same for every lane
    (``seen``) unless ``LANE_REDUCTIONS`` says how the lanes' values combine (``"max"``, ``"sum"``),
    which is what joining the lanes of several states (data-parallel ranks) has to know."""

    LANE_REDUCTIONS: ClassVar[Dict[str, str]] = {}

    def _map(self: S, fn: Callable[[torch.Tensor], torch.Tensor]) -> S:
        changes: Dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                changes[f.name] = fn(value)
            elif isinstance(value, MixerState):
                changes[f.name] = value._map(fn)
        return dataclasses.replace(self, **changes)

    def detach(self: S) -> S:
        """The same state, cut from the autograd graph (truncated BPTT across calls)."""
        return self._map(lambda t: t.detach())

    def clone(self: S) -> S:
        """A deep copy: writing to the clone never changes the original."""
        return self._map(lambda t: t.detach().clone())

    def to(self: S, device: Any = None, dtype: Optional[torch.dtype] = None) -> S:
        """Moves the tensors; ``dtype`` only applies to floating-point tensors."""

        def move(t: torch.Tensor) -> torch.Tensor:
            if dtype is not None and t.is_floating_point():
                return t.to(device=device, dtype=dtype)
            return t.to(device=device)

        return self._map(move)

    @property
    def nbytes(self) -> int:
        """Bytes held by the state's tensors."""
        total = 0
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
            elif isinstance(value, MixerState):
                total += value.nbytes
        return total

    def state_dict(self) -> Dict[str, torch.Tensor]:
        out: Dict[str, torch.Tensor] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, torch.Tensor):
                out[f.name] = value.detach().clone()
            elif isinstance(value, MixerState):
                out.update({f"{f.name}.{k}": t for k, t in value.state_dict().items()})
            elif isinstance(value, (bool, int)):
                out[f.name] = torch.tensor(int(value), dtype=torch.int64)
            else:
                raise TypeError(f"{type(self).__name__}.{f.name}: cannot serialise {type(value).__name__}")
        return out

    @classmethod
    def from_state_dict(cls: Type[S], d: Dict[str, torch.Tensor]) -> S:
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(d) - set(names)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown keys in state dict: {sorted(unknown)}")
        kwargs: Dict[str, Any] = {}
        for name, f in names.items():
            if name not in d:
                kwargs[name] = None
                continue
            value = d[name]
            if f.type in ("int", int):
                kwargs[name] = int(value.item())
            else:
                kwargs[name] = value
        return cls(**kwargs)
