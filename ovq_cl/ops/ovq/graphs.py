"""Blocks of S full chunks of the static OVQ loop as one replayable unit: a captured CUDA graph on a GPU,
so that the per-chunk host work (kernel launches from a Python loop, 48 per chunk in the dynamic path)
becomes one replay per S chunks.

Only inference (no autograd) with the schedule's growth and the "spread" init: the plasticity rules
read values back to the host, the "random" init seeds a generator from the host per chunk, and
autograd through a replayed graph needs its own capture of the backward (not built). The chunk loop
falls back to the eager static path for everything else, and for the chunks a block cannot take (a
first chunk continuing pending tokens, a last partial chunk, fewer than S full chunks left).

A block owns static buffers: the S chunks' normalised q, k and v ([B, H, S L, *]), the dictionary
([B, H, N, *], carried from block to block inside the buffers), beta, and the plan ([S] active slots
before each chunk and slots it opens: the schedule is a function of tokens absorbed, so the host
computes it before the replay). ``replay`` copies a block's inputs in, runs the S chunk steps (the
graph, or the same Python function eagerly: ``capture=False``, which is what the CPU tests exercise),
and leaves the outputs in ``out``. A graph is captured once per (shapes, dtype, device, params,
primitives, S) and cached.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List, Tuple

import torch

from ovq_cl.ops.ovq.common import OVQParams, OVQState
from ovq_cl.ops.ovq.primitives import above_diagonal, cached_arange
from ovq_cl.ops.ovq.update import absorb_static_tensors, new_slots

_CACHE: Dict[tuple, "ChunkBlock"] = {}
_CACHE_SIZE = 8


def block_usable(params: OVQParams, grad: bool) -> Tuple[bool, str]:
    """(usable, why not) for a graphed block of the static loop."""
    if grad:
        return False, "autograd is recording (graphed blocks are for inference)"
    if params.plastic:
        return False, "a plasticity rule is on (it reads two values back to the host per chunk)"
    if params.init != "spread":
        return False, "init 'random' seeds a generator from the host per chunk"
    return True, ""


def growth_plan(seen: int, n_active: int, n_chunks: int, params: OVQParams) -> List[Tuple[int, int]]:
    """(active slots before, slots opened) for each of the next n_chunks full chunks."""

    plan, L = [], params.chunk_size
    for _ in range(n_chunks):
        n_new = new_slots(seen, n_active, L, params)
        plan.append((n_active, n_new))
        seen, n_active = seen + L, n_active + n_new
    return plan


class ChunkBlock:
    """S full chunks of the static loop on static buffers (module docstring).

    state_like: an OVQState whose keys/values/counts give the dictionary's shape, dtype and device;
    q_like, v_like: one chunk's [B, H, L, Dk] / [B, H, L, Dv]; beta_like: [H]."""

    def __init__(self, state_like: OVQState, q_like: torch.Tensor, v_like: torch.Tensor, beta_like: torch.Tensor,
                 params: OVQParams, prims, n_chunks: int, capture: bool) -> None:
        B, H, L, Dk = q_like.shape
        Dv, S = v_like.shape[-1], int(n_chunks)
        self.params, self.prims, self.S, self.L = params, prims, S, L
        # plain tensors whatever the caller's mode: inference tensors made here under inference_mode
        # could not be written by a later call under no_grad
        with torch.inference_mode(False), torch.no_grad(), _on(q_like.device):
            new = functools.partial(torch.zeros, dtype=q_like.dtype, device=q_like.device)
            self.q, self.k, self.v = new(B, H, S * L, Dk), new(B, H, S * L, Dk), new(B, H, S * L, Dv)
            self.out = new(B, H, S * L, Dv)
            self.keys, self.values = torch.zeros_like(state_like.keys), torch.zeros_like(state_like.values)
            self.counts = torch.zeros_like(state_like.counts)
            self.beta = torch.zeros_like(beta_like)
            self.plan = torch.zeros(2, S, dtype=torch.int64, device=q_like.device)
            self.graph = None
            self._constants = ()
            if capture:
                self._capture()

    def _steps(self) -> None:
        """The S chunk steps on the buffers: read, then absorb (in place into the dictionary buffers)."""

        L = self.L
        keys, values, counts = self.keys, self.values, self.counts
        for i in range(self.S):
            part = slice(i * L, (i + 1) * L)
            qc, kc, vc = (t[:, :, part].contiguous() for t in (self.q, self.k, self.v))
            self.out[:, :, part].copy_(self.prims.read(qc, kc, vc, keys, values, counts.log(), self.beta, q_offset=0))
            keys, values, counts = absorb_static_tensors(
                keys, values, counts, kc, vc, self.plan[0, i], self.plan[1, i], self.params, self.prims, inplace=True)
        for buffer, value in ((self.keys, keys), (self.values, values), (self.counts, counts)):
            if value is not buffer:
                buffer.copy_(value)

    def _capture(self) -> None:
        """Warm-up (fills the op's caches of masks and index tensors outside the capture), then capture.

        The graph keeps raw pointers to the cached index tensors and masks the steps use; the block
        holds references to them so that an eviction from those caches never frees their memory."""
        saved = [t.clone() for t in (self.keys, self.values, self.counts)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._steps()
        torch.cuda.current_stream().wait_stream(stream)
        dev = self.q.device
        self._constants = (cached_arange(self.params.num_slots, dev), cached_arange(self.L, dev), above_diagonal(self.L, self.L, 0, dev))
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._steps()
        for buffer, value in zip((self.keys, self.values, self.counts), saved):
            buffer.copy_(value)

    def load_state(self, state: OVQState) -> None:
        self.keys.copy_(state.keys)
        self.values.copy_(state.values)
        self.counts.copy_(state.counts)

    def replay(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
               plan: torch.Tensor) -> torch.Tensor:
        """Runs S chunks from the dictionary in the buffers. q, k: [B, H, S L, Dk]; v: [B, H, S L, Dv];
        plan: [2, S] int64 on the device (active before, opened). Returns the reads [B, H, S L, Dv]
        (the ``out`` buffer, overwritten by the next replay)."""
        with _on(self.q.device):
            self.q.copy_(q)
            self.k.copy_(k)
            self.v.copy_(v)
            self.beta.copy_(beta)
            self.plan.copy_(plan)
            if self.graph is not None:
                self.graph.replay()
            else:
                self._steps()
        return self.out


def _on(device: torch.device):
    """The CUDA device of the tensors as the current one (streams and graphs follow the current device)."""
    import contextlib

    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def chunk_block(state: OVQState, q_like, v_like, beta, params: OVQParams, prims, n_chunks: int,
                capture: bool) -> ChunkBlock:
    """The cached block for these shapes (captured on first use when ``capture``)."""
    key = (tuple(state.keys.shape), tuple(state.values.shape), tuple(q_like.shape), tuple(v_like.shape),
           q_like.dtype, str(q_like.device), params, prims.name, int(n_chunks), bool(capture))
    block = _CACHE.pop(key, None)
    if block is None:
        block = ChunkBlock(state, q_like, v_like, beta, params, prims, n_chunks, capture)
    _CACHE[key] = block                                   # most recently used last
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    return block


def run_blocks(state: OVQState, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
               params: OVQParams, prims, n_chunks: int, capture: bool) -> Tuple[torch.Tensor, OVQState]:
    """Full chunks [B, H, C L, *] (C a multiple of n_chunks, aligned to tokens absorbed, no pending
    tokens) through blocks of n_chunks. Returns the reads [B, H, C L, Dv] and the state after them
    (new tensors: the block's buffers are reused by the next call)."""
    L, S = params.chunk_size, int(n_chunks)
    total = q.shape[2] // L
    block = chunk_block(state, q[:, :, :L], v[:, :, :L], beta, params, prims, S, capture)
    block.load_state(state)
    plan = growth_plan(state.seen, state.n_active, total, params)
    # the whole plan on the device at once: a per-replay copy from host memory would wait for the
    # previous replay to finish (no overlap of launching and computing)
    plan_dev = torch.tensor(plan, dtype=torch.int64).t().contiguous().to(q.device)
    out = q.new_empty(q.shape[:3] + (v.shape[-1],))
    for b in range(total // S):
        part = slice(b * S * L, (b + 1) * S * L)
        out[:, :, part].copy_(block.replay(q[:, :, part], k[:, :, part], v[:, :, part], beta, plan_dev[:, b * S:(b + 1) * S]))
    n_active = plan[-1][0] + plan[-1][1] if plan else state.n_active
    state = dataclasses.replace(state, keys=block.keys.clone(), values=block.values.clone(),
                                counts=block.counts.clone(), seen=state.seen + total * L, n_active=n_active)
    return out, state


def capture_available(device: torch.device) -> bool:
    """CUDA graphs need a CUDA device."""
    return device.type == "cuda" and torch.cuda.is_available()


__all__ = ["ChunkBlock", "block_usable", "capture_available", "chunk_block", "growth_plan", "run_blocks"]
