"""OVQ attention: ``ovq_attention(q, k, v, beta, params, initial_state, output_final_state, backend)``.

The op laid out as flash-linear-attention lays out its ops: ``common.py`` (params, state, growth),
``naive.py`` (the plain oracle), ``chunk.py`` (the chunked form, fast on CPU, and the chunk loop the
kernels plug into), ``recurrent.py`` (token by token), ``triton.py`` (the kernels), and this
dispatcher. Backends (all give the same outputs, gradients and final state, up to float rounding):

- ``"auto"`` (default): the Triton kernels on CUDA tensors when triton is installed, the chunked
  PyTorch form otherwise (the CPU path).
- ``"chunk"``: the chunked PyTorch form (:func:`~ovq_cl.ops.ovq.chunk.ovq_attention_chunk`).
- ``"naive"``: the plain oracle (:func:`~ovq_cl.ops.ovq.naive.ovq_attention_naive`), slow; for tests.
- ``"recurrent"``: token-by-token decoding, an independent code path for tests.
- ``"triton"``: forces the Triton kernels (:mod:`ovq_cl.ops.ovq.triton`); on CPU tensors only when
  the Triton interpreter is on (``TRITON_INTERPRET=1`` set before triton is imported), otherwise a
  ValueError says why.

The Triton module is imported lazily, so importing ``ovq_cl`` never imports triton on a CPU machine.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ovq_cl.ops.ovq.chunk import ovq_attention_chunk, ovq_chunk_loop
from ovq_cl.ops.ovq.common import OVQParams, OVQState, empty_ovq_state, growth_curve, growth_target
from ovq_cl.ops.ovq.naive import ovq_attention_naive
from ovq_cl.ops.ovq.primitives import REFERENCE, OVQPrimitives, chunk_read
from ovq_cl.ops.ovq.recurrent import ovq_attention_recurrent
from ovq_cl.ops.ovq.update import absorb_chunk

BACKENDS = ("auto", "chunk", "naive", "recurrent", "triton")


def triton_primitives() -> Optional[OVQPrimitives]:
    """The Triton primitives, or None when the triton package is not installed. Any other error while
    loading our kernels is a bug and is raised, never silently replaced by the reference."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return None
    from ovq_cl.ops.ovq.triton import TRITON

    return TRITON


def _triton_usable(q: torch.Tensor) -> Tuple[Optional[OVQPrimitives], str]:
    prims = triton_primitives()
    if prims is None:
        return None, "triton cannot be imported here (pip install triton, Linux only)"
    if q.is_cuda:
        return prims, ""
    from ovq_cl.ops.ovq import triton as triton_module

    if not triton_module.INTERPRET:
        return None, (
            f"the inputs are on {q.device.type}, and the Triton interpreter is off: set TRITON_INTERPRET=1 "
            "before triton is first imported to run the kernels on CPU, or use backend='chunk'"
        )
    return prims, ""


def ovq_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, params: OVQParams,
    initial_state: Optional[OVQState] = None, output_final_state: bool = True, backend: str = "auto",
    static: bool = False, block_chunks: int = 0, capture: Optional[bool] = None,
) -> Tuple[torch.Tensor, Optional[OVQState]]:
    """q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; beta: [H]. Returns o [B, T, H, Dv] and the final state.

    ``static``: the chunk loop with the same shapes in every chunk (the whole dictionary, inactive
    slots masked; :func:`~ovq_cl.ops.ovq.chunk.ovq_chunk_loop`), same result; for the chunked
    backends (auto, chunk, triton) only. ``block_chunks`` = S > 0 with ``static``: in inference, runs
    of S full chunks replay one captured CUDA graph (``capture``, default on CUDA) or run the same
    steps eagerly (:mod:`~ovq_cl.ops.ovq.graphs`)."""
    if backend not in BACKENDS:
        raise ValueError(f"ovq_attention: backend must be one of {BACKENDS}, got {backend!r}")
    if block_chunks and not static:
        raise ValueError("ovq_attention: block_chunks (graphed blocks of chunks) needs static=True")
    if static and backend in ("naive", "recurrent"):
        raise ValueError(f"ovq_attention: static shapes are a form of the chunk loop; backend {backend!r} has none "
                         "(use 'chunk', 'triton' or 'auto')")
    if backend == "recurrent":
        return ovq_attention_recurrent(q, k, v, beta, params, initial_state, output_final_state)
    if backend == "naive":
        return ovq_attention_naive(q, k, v, beta, params, initial_state, output_final_state)
    prims = REFERENCE
    if backend == "triton":
        prims, why = _triton_usable(q)
        if prims is None:
            raise ValueError(f"ovq_attention: backend 'triton' is not available: {why}")
    elif backend == "auto" and q.is_cuda:
        prims = triton_primitives() or REFERENCE
    return ovq_chunk_loop(q, k, v, beta, params, initial_state, output_final_state, prims, static=static,
                          block_chunks=block_chunks, capture=capture)


__all__ = [
    "BACKENDS", "OVQParams", "OVQPrimitives", "OVQState", "REFERENCE", "absorb_chunk", "chunk_read",
    "empty_ovq_state", "growth_curve", "growth_target", "ovq_attention", "ovq_attention_chunk",
    "ovq_attention_naive", "ovq_attention_recurrent", "ovq_chunk_loop", "triton_primitives",
]
