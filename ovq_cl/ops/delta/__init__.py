"""Gated delta rule: ``gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state)``.

``backend="auto"`` uses flash-linear-attention's Triton kernel on CUDA when ``fla`` is installed
(the optional extra ``ovq-cl[cuda]``), the chunked PyTorch reference otherwise.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ovq_cl.ops.delta.naive import gated_delta_rule_chunked, gated_delta_rule_recurrent

BACKENDS = ("auto", "naive", "recurrent", "fla")


def _fla_kernel():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception:  # fla missing, or its import fails on this machine
        return None
    return chunk_gated_delta_rule


def gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = True, chunk_size: int = 64, backend: str = "auto",
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; g, beta: [B, T, H]; initial_state [B, H, Dk, Dv]."""
    if backend not in BACKENDS:
        raise ValueError(f"gated_delta_rule: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "recurrent":
        return gated_delta_rule_recurrent(q, k, v, g, beta, scale, initial_state, output_final_state)
    if backend == "fla" or (backend == "auto" and q.is_cuda):
        kernel = _fla_kernel()
        if kernel is None and backend == "fla":
            raise ValueError("gated_delta_rule: backend 'fla' needs flash-linear-attention (pip install 'ovq-cl[cuda]')")
        if kernel is not None and q.is_cuda:
            state = None if initial_state is None else initial_state.float()
            o, final = kernel(q, k, v, g.float(), beta, scale=scale, initial_state=state, output_final_state=output_final_state)
            return o, final
        if backend == "fla":
            raise ValueError("gated_delta_rule: backend 'fla' runs on CUDA tensors only")
    return gated_delta_rule_chunked(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)


__all__ = ["BACKENDS", "gated_delta_rule", "gated_delta_rule_chunked", "gated_delta_rule_recurrent"]
