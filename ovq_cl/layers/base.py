"""The mixer contract shared by every sequence mixer.

``y, state = mixer(x, state=None)`` with x [B, T, d_model] and y of the same shape; ``state`` is a
:class:`~ovq_cl.state.MixerState` (None = fresh). Passing the returned state to the next call
continues the sequence: one call over T tokens equals the same tokens split across calls.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict, Optional, Tuple, Type

import torch
from torch import nn

from ovq_cl.state import MixerState


@dataclasses.dataclass(frozen=True)
class MixerOptions:
    """Options every mixer has. A mixer's own options dataclass subclasses this (frozen), and is the
    one place its defaults live: configs, the layer and its op all read them from there.

    head_dim: width of each head; None -> d_model // n_heads.
    """

    head_dim: Optional[int] = None


class Mixer(nn.Module):
    """Base class: options, input checks, and the size of the state the mixer carries.

    ``Mixer(d_model, n_heads, options=None, **overrides)``: ``options`` is an instance of the class's
    ``Options`` dataclass (None -> its defaults); keyword overrides replace single fields, so
    ``OVQAttention(d_model=256, n_heads=4, num_slots=1024)`` works. An unknown keyword is a ValueError.
    """

    #: the dataclass of this mixer's state
    state_type: Type[MixerState] = MixerState
    #: the dataclass of this mixer's options (frozen; subclass of MixerOptions)
    Options: ClassVar[type] = MixerOptions
    #: the option a state budget sizes (``model.state_budget``); None: the state is not sized (it grows
    #: with T, like full attention's KV cache, and is reported, not matched)
    budget_knob: ClassVar[Optional[str]] = None
    #: buffers learned from data that the layer reads at every call, shared by all lanes: memory about
    #: the data kept outside the per-lane state (VQ's key codebook). Counted apart from the state
    #: (``shared_memory_nbytes``) and, with every learned buffer (``learned_buffers``), beside parameters
    shared_memory_buffers: ClassVar[Tuple[str, ...]] = ()
    #: every buffer the layer learns from data (the shared memory and what updates it, e.g. VQ's EMA
    #: statistics): parameters in all but name, counted as such (``strategies.evaluation.results``)
    learned_buffers: ClassVar[Tuple[str, ...]] = ()
    #: the auxiliary loss of the last forward (VQ's commitment loss), summed by ``DecoderLM.aux_loss``
    #: into the training loss; None: this mixer has none
    aux_loss: Optional[torch.Tensor] = None

    def __init__(self, d_model: int, n_heads: int, options: Optional[Any] = None, **overrides: Any) -> None:
        super().__init__()
        self.options = self.resolve_options(options, overrides)
        head_dim = self.options.head_dim
        if d_model < 1 or n_heads < 1:
            raise ValueError(f"{type(self).__name__}: d_model and n_heads must be >= 1, got {d_model}, {n_heads}")
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(
                    f"{type(self).__name__}: d_model={d_model} is not divisible by n_heads={n_heads}; set head_dim"
                )
            head_dim = d_model // n_heads
        if head_dim < 1:
            raise ValueError(f"{type(self).__name__}: head_dim must be >= 1, got {head_dim}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim

    @classmethod
    def resolve_options(cls, options: Optional[Any], overrides: Dict[str, Any]):
        """``options`` (or the defaults) with ``overrides`` applied; type and field names checked."""
        if options is None:
            options = cls.Options()
        elif not isinstance(options, cls.Options):
            raise TypeError(f"{cls.__name__}: options must be {cls.Options.__name__}, got {type(options).__name__}")
        if overrides:
            known = {f.name for f in dataclasses.fields(cls.Options)}
            unknown = sorted(set(overrides) - known)
            if unknown:
                raise ValueError(f"{cls.__name__}: unknown option(s) {unknown}; known: {sorted(known)}")
            options = dataclasses.replace(options, **overrides)
        return options

    def add_qkvo_projections(self) -> None:
        """q_proj, k_proj, v_proj: d_model -> n_heads * head_dim; o_proj back (no biases)."""
        inner = self.n_heads * self.head_dim
        self.q_proj = nn.Linear(self.d_model, inner, bias=False)
        self.k_proj = nn.Linear(self.d_model, inner, bias=False)
        self.v_proj = nn.Linear(self.d_model, inner, bias=False)
        self.o_proj = nn.Linear(inner, self.d_model, bias=False)

    def project_qkv(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [B, T, d_model] -> q, k, v: [B, T, H, head_dim]."""
        shape = (x.shape[0], x.shape[1], self.n_heads, self.head_dim)
        return self.q_proj(x).view(shape), self.k_proj(x).view(shape), self.v_proj(x).view(shape)

    def check_input(self, x: torch.Tensor, state: Optional[MixerState]) -> None:
        if x.dim() != 3:
            raise ValueError(f"{type(self).__name__}: x must be [B, T, d_model] (rank 3), got shape {tuple(x.shape)}")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"{type(self).__name__}: x has width {x.shape[-1]}, expected d_model={self.d_model}")
        if state is not None and not isinstance(state, self.state_type):
            raise ValueError(
                f"{type(self).__name__}: state must be {self.state_type.__name__} or None, got {type(state).__name__}"
            )

    def forward(self, x: torch.Tensor, state: Optional[MixerState] = None) -> Tuple[torch.Tensor, MixerState]:
        raise NotImplementedError

    def state_nbytes(self, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
        """Bytes of the state after ``seq_len`` tokens (analytic; equals ``state.nbytes``)."""
        raise NotImplementedError

    def fact_capacity_bound(self) -> Optional[int]:
        """About how many key-value facts one head's state can hold at once, from its shapes alone (what
        the capacity curve is compared with): None when the state grows with the sequence or the bound
        is unknown (a user mixer that does not say)."""
        return None

    def shared_memory_nbytes(self) -> int:
        """Bytes of the shared memory about the data (``shared_memory_buffers``): 0 for most mixers."""
        return sum(int(getattr(self, name).nbytes) for name in self.shared_memory_buffers)

    def learned_buffer_numel(self) -> int:
        """Numbers in the buffers the layer learns from data (``learned_buffers``)."""
        return sum(int(getattr(self, name).numel()) for name in self.learned_buffers)

    def state_stats(self, state: Optional[MixerState]) -> Dict[str, float]:
        """Mixer-specific numbers about a state (e.g. OVQ's active slots); empty by default."""
        return {}

    @property
    def sizing_chunk(self) -> int:
        """Tokens the state grows by at a time: budget sizing (``ovq_cl.layers.budget``) measures the state
        after a whole number of them. Default: the ``chunk_size`` option where the mixer has one, else 1."""
        return int(getattr(self.options, "chunk_size", 1) or 1)

    def data_parallel_problem(self) -> Optional[str]:
        """Why this mixer, as configured, would compute something else with its lanes sharded over
        data-parallel ranks (refused under torchrun before any compute), or None: it shards exactly."""
        return None

    def set_process_group(self, group: Any) -> None:
        """Under torchrun: the data-parallel group, for a mixer whose training updates statistics of
        the batch (VQ's EMA codebook sums them over the group so replicas agree). Default: nothing."""


def elem_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
