"""Segments of a chunk loop run without keeping their graph, rerun in the backward.

A chunked memory op (OVQ, VQ) reads, in every chunk, the state that the previous chunk left; the read
saves that state for its backward, so training memory grows by one state per chunk. Running S
chunks at a time through :class:`RecomputedSegment` keeps only the state at each segment's start
(and the segment's inputs) and reruns the S chunks with a graph when the backward reaches them.

``torch.utils.checkpoint`` does the same in principle, but on CPU (torch 2.13, both of its modes) a
loop of out-of-place state updates under it stayed resident after every output was freed
(``benchmarks/checkpoint_memory_repro.py``), so this is a small Function of our own.
"""
from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import torch


class RecomputedSegment(torch.autograd.Function):
    """``RecomputedSegment.apply(run, non_differentiable, *inputs) -> run(*inputs)``.

    run: a deterministic function of tensors returning a tuple of tensors.
    non_differentiable: indices of run's outputs that never carry gradient (e.g. counts).
    Saves only ``inputs``; the backward reruns ``run`` under the forward's autocast state and
    back-propagates through the rerun. On CUDA, scatter-adds with repeated indices use atomics, so
    the rerun can differ from the forward in the last bits (as with any activation checkpointing).
    No double backward (``create_graph=True``): it raises.
    """

    @staticmethod
    def forward(ctx, run: Callable[..., Tuple[torch.Tensor, ...]], non_differentiable: Sequence[int], *inputs):
        ctx.run = run
        ctx.device_type = next(t.device.type for t in inputs if isinstance(t, torch.Tensor))
        ctx.autocast = (torch.is_autocast_enabled(ctx.device_type), torch.get_autocast_dtype(ctx.device_type))
        ctx.save_for_backward(*inputs)
        outputs = tuple(run(*inputs))
        ctx.mark_non_differentiable(*[outputs[i] for i in non_differentiable])
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError("recomputed segments (recompute_chunks) do not support double backward "
                               "(create_graph=True); use recompute_chunks=0")
        needs = ctx.needs_input_grad[2:]
        inputs = [t.detach().requires_grad_(n) if n else t for t, n in zip(ctx.saved_tensors, needs)]
        enabled, dtype = ctx.autocast
        with torch.enable_grad(), torch.autocast(ctx.device_type, dtype=dtype, enabled=enabled):
            outputs = ctx.run(*inputs)
        pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
        wanted = [t for t, n in zip(inputs, needs) if n]
        found = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
                     if pairs and wanted else [])
        return (None, None) + tuple(next(found) if n else None for n in needs)


def recomputed(run: Callable[..., Tuple[torch.Tensor, ...]], *inputs: torch.Tensor,
               non_differentiable: Sequence[int] = ()) -> Tuple[torch.Tensor, ...]:
    """``run(*inputs)`` through :class:`RecomputedSegment` (see there)."""
    return RecomputedSegment.apply(run, tuple(non_differentiable), *inputs)


def segment_runs(eligible: Sequence[bool], size: int) -> List[Tuple[int, int, bool]]:
    """Chunk index ranges ``(start, end, recompute)`` covering all chunks in order: consecutive
    eligible chunks in runs of at most ``size`` (recompute=True), every other chunk alone (False).
    ``size`` = 0 puts every chunk alone."""
    runs, i = [], 0
    while i < len(eligible):
        j = i
        while size and j < len(eligible) and j - i < size and eligible[j]:
            j += 1
        runs.append((i, j, True) if j > i else (i, i + 1, False))
        i = max(j, i + 1)
    return runs
