"""OVQ attention: ``ovq_attention(q, k, v, beta, params, initial_state, output_final_state)``.

``backend="auto"`` picks the fastest implementation available for the inputs' device (for now the
chunked PyTorch reference everywhere); "naive" and "recurrent" force the references.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ovq_cl.ops.ovq.naive import (
    OVQParams,
    OVQState,
    absorb_chunk,
    dictionary_chunk_read,
    empty_ovq_state,
    growth_curve,
    growth_target,
    ovq_attention_chunked,
    ovq_attention_recurrent,
)

BACKENDS = ("auto", "naive", "recurrent")


def ovq_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, params: OVQParams,
    initial_state: Optional[OVQState] = None, output_final_state: bool = True, backend: str = "auto",
) -> Tuple[torch.Tensor, Optional[OVQState]]:
    """q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; beta: [H]. Returns o [B, T, H, Dv] and the final state."""
    if backend not in BACKENDS:
        raise ValueError(f"ovq_attention: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "recurrent":
        return ovq_attention_recurrent(q, k, v, beta, params, initial_state, output_final_state)
    return ovq_attention_chunked(q, k, v, beta, params, initial_state, output_final_state)


__all__ = [
    "BACKENDS", "OVQParams", "OVQState", "absorb_chunk", "dictionary_chunk_read", "empty_ovq_state",
    "growth_curve", "growth_target", "ovq_attention", "ovq_attention_chunked", "ovq_attention_recurrent",
]
