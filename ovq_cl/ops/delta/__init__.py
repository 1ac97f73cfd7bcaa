"""Gated delta rule: ``gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state)``.

``backend="auto"`` uses flash-linear-attention's Triton kernel on CUDA when ``fla`` is installed
(the optional extra ``ovq-cl[cuda]``), the chunked PyTorch form (``chunk.py``) otherwise, and also for training
on NVIDIA Hopper GPUs with the Triton versions for which fla refuses its own gated backward.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ovq_cl.ops.delta.chunk import gated_delta_rule_chunked
from ovq_cl.ops.delta.naive import gated_delta_rule_recurrent

BACKENDS = ("auto", "chunk", "naive", "fla")          # chunk: the chunked form; naive: the token-by-token oracle


def _fla_kernel():
    """fla's kernel, or None when fla is not installed; any other import error is raised (a broken
    install must not silently fall back to the reference)."""
    try:
        import fla  # noqa: F401
    except ImportError:
        return None
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule


def fla_backward_is_sound(capability: Tuple[int, int], triton_version: str, is_nvidia: bool = True) -> bool:
    """False where fla's gated backward is known wrong and fla refuses it: NVIDIA Hopper (sm_90) with
    Triton >= 3.4.0 and < 3.7.1 (fla issue #640; seen on an H200 with Triton 3.6). fla can route
    around it with tilelang when that is usable; we do not rely on it and use our reference there."""
    if not is_nvidia or capability[0] != 9:
        return True
    from packaging.version import Version

    version = Version(triton_version)
    return not (Version("3.4.0") <= version < Version("3.7.1"))


def _fla_backward_ok(device: torch.device) -> bool:
    import triton

    return fla_backward_is_sound(torch.cuda.get_device_capability(device), triton.__version__,
                                 is_nvidia=torch.version.hip is None)


def gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = True, chunk_size: int = 64, backend: str = "auto",
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; g, beta: [B, T, H]; initial_state [B, H, Dk, Dv]."""
    if backend not in BACKENDS:
        raise ValueError(f"gated_delta_rule: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "naive":
        return gated_delta_rule_recurrent(q, k, v, g, beta, scale, initial_state, output_final_state)
    if backend == "fla" or (backend == "auto" and q.is_cuda):
        kernel = _fla_kernel()
        if kernel is None and backend == "fla":
            raise ValueError("gated_delta_rule: backend 'fla' needs flash-linear-attention (pip install 'ovq-cl[cuda]')")
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, g, beta, initial_state))
        if backend == "auto" and kernel is not None and q.is_cuda and needs_grad and not _fla_backward_ok(q.device):
            kernel = None                                     # fla would refuse the backward here: the reference
        if kernel is not None and q.is_cuda:
            state = None if initial_state is None else initial_state.float()
            o, final = kernel(q, k, v, g.float(), beta, scale=scale, initial_state=state, output_final_state=output_final_state)
            return o, final
        if backend == "fla":
            raise ValueError("gated_delta_rule: backend 'fla' runs on CUDA tensors only")
    return gated_delta_rule_chunked(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)


__all__ = ["BACKENDS", "fla_backward_is_sound", "gated_delta_rule", "gated_delta_rule_chunked", "gated_delta_rule_recurrent"]
