"""OVQ attention, chunked, in fast PyTorch: the CPU path, and the loop the Triton kernels plug into.

Notation in :mod:`ovq_cl.ops.ovq.common`. Active slots are a prefix ``[0, n_active)`` of the
dictionary, so every read can slice instead of masking. The plain oracle these are tested against is
:mod:`ovq_cl.ops.ovq.naive`.

A chunk of L queries reads ``softmax([beta Q D_k^T + log c | beta Q K^T (causal)]) [D_v ; V]``; after
the read the chunk is absorbed: growth -> spread-maximising init of the new slots -> hard assignment
of every other key -> one online batch k-means step (:mod:`~ovq_cl.ops.ovq.update`). All pieces are
small pure functions so that tests can check each one against a known answer.

Chunk boundaries are aligned to tokens absorbed (multiples of L counted from the first token the
state ever saw), which is why one call, several calls split anywhere, and token-by-token decoding
all give the same outputs.

The chunk loop (:func:`ovq_chunk_loop`) takes its per-chunk work from a bundle of primitives
(:class:`OVQPrimitives`: the read, the max / argmax over the dictionary, the k-means merge);
:data:`REFERENCE` is the PyTorch one (:mod:`~ovq_cl.ops.ovq.primitives`), ``ovq_cl.ops.ovq.triton.TRITON``
the kernels; the update after each chunk's read is :mod:`~ovq_cl.ops.ovq.update`.
The loop runs once per chunk, batched over lanes and heads, never per token. Without autograd
(inference) the dictionary is copied once per call and then updated in place, touching only the
rows the chunk's keys hit; with autograd every update is functional, so gradients flow through the
state across chunks (``state_grad="full"``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Tuple

import torch

from ovq_cl.ops.common import check_head_vector, check_qkv, check_state_shape, compute_dtype, l2norm
from ovq_cl.ops.ovq.common import OVQParams, OVQState, empty_ovq_state
from ovq_cl.ops.ovq.primitives import REFERENCE, OVQPrimitives
from ovq_cl.ops.ovq.threads import loop_threads
from ovq_cl.ops.ovq.update import absorb, absorb_static
from ovq_cl.ops.recompute import recomputed, segment_runs

# ------------------------------------------------------------------------------------ entry points

def _prepare(q, k, v, beta, params, initial_state, op):
    check_qkv(q, k, v, op)
    bsz, _, heads, dk = q.shape
    dv = v.shape[-1]
    check_head_vector(beta, heads, "beta", op)
    dtype = compute_dtype(q.dtype)
    if initial_state is None:
        state = empty_ovq_state(bsz, heads, params.num_slots, dk, dv, device=q.device, dtype=dtype)
    else:
        n = params.num_slots
        check_state_shape("keys", initial_state.keys, (bsz, heads, n, dk), op)
        check_state_shape("values", initial_state.values, (bsz, heads, n, dv), op)
        check_state_shape("counts", initial_state.counts, (bsz, heads, n), op)
        if initial_state.pending_keys.shape[2] >= params.chunk_size:
            raise ValueError(
                f"{op}: initial_state has {initial_state.pending_keys.shape[2]} pending tokens, "
                f"but chunk_size is {params.chunk_size}"
            )
        state = initial_state.detach().to(dtype=dtype)
    if _updates_in_place(q, k, v, beta):
        # no autograd: one heads-first copy per tensor, normalised in place (each full-sequence
        # temporary is a fresh allocation, i.e. page faults, once T x H x D passes ~32 MB)
        qn, kn = _heads_first(q, dtype), _heads_first(k, dtype)
        qn.div_(qn.norm(dim=-1, keepdim=True).clamp_min_(1e-6))
        kn.div_(kn.norm(dim=-1, keepdim=True).clamp_min_(1e-6))
    else:
        qn = l2norm(q.to(dtype)).transpose(1, 2).contiguous()
        kn = l2norm(k.to(dtype)).transpose(1, 2).contiguous()
    return state, qn, kn, _heads_first(v, dtype), beta.to(dtype)


def _heads_first(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, T, H, D] -> a new contiguous [B, H, T, D] in ``dtype`` (one pass, never a view of x)."""
    out = torch.empty(x.shape[0], x.shape[2], x.shape[1], x.shape[3], dtype=dtype, device=x.device)
    return out.copy_(x.transpose(1, 2))


def _maybe_detach(state: OVQState, params: OVQParams) -> OVQState:
    return state.detach() if params.state_grad == "detach" else state


def _updates_in_place(*tensors: torch.Tensor) -> bool:
    """True when no autograd graph is being recorded for this call: the dictionary may then be
    updated in place (after one private copy per call), so the update touches only the rows hit."""
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def _under_loop_threads(fn):
    """Runs ``fn(q, ...)`` under the CPU thread policy of :mod:`~ovq_cl.ops.ovq.threads` for q's device."""
    @functools.wraps(fn)
    def wrapper(q, *args, **kwargs):
        with loop_threads(q.device):
            return fn(q, *args, **kwargs)
    return wrapper


@_under_loop_threads
def ovq_chunk_loop(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, params: OVQParams,
    initial_state: Optional[OVQState] = None, output_final_state: bool = True,
    prims: OVQPrimitives = REFERENCE, static: bool = False, block_chunks: int = 0,
    capture: Optional[bool] = None,
) -> Tuple[torch.Tensor, Optional[OVQState]]:
    """The chunked OVQ op on the given per-chunk primitives (see :func:`ovq_attention_chunked`).

    ``static``: every chunk reads and updates the whole dictionary [B, H, N, *] with the inactive
    slots masked (log count -inf), so all full chunks run the same kernels on the same shapes and no
    per-chunk value depends on the data (:func:`absorb_static`); the result equals the dynamic
    path's, which slices the active prefix (cheaper while the dictionary grows).

    ``block_chunks`` = S > 0 (with ``static``, in inference, schedule growth and "spread" init; see
    :mod:`~ovq_cl.ops.ovq.graphs`): runs of S aligned full chunks go through one block, a CUDA graph
    replay when ``capture`` (default: on CUDA devices), the same steps eagerly otherwise. Anything a
    block cannot take runs as above.

    No loop per token: one iteration per chunk of L tokens, batched over lanes and heads. Without
    autograd (inference, ``torch.no_grad``, or no input requiring grad) the state is copied once per
    call (only if a chunk is absorbed) and then updated in place; with autograd every update is
    functional, so the graph of ``state_grad="full"`` runs through all chunks (with
    ``params.recompute_chunks`` = S, only one chunk in S keeps its part of that graph).

    On CPU the loop runs under the thread policy of :mod:`~ovq_cl.ops.ovq.threads` (single-threaded
    while other processes hold cores: its many small ops would stall at OpenMP barriers); a backward
    pass runs later, under torch's own setting.
    """
    state, qn, kn, vt, beta = _prepare(q, k, v, beta, params, initial_state, "ovq_attention")
    inplace = _updates_in_place(q, k, v, beta)
    n_pending = state.pending_keys.shape[2]
    k_all = torch.cat([state.pending_keys, kn], dim=2) if n_pending else kn
    v_all = torch.cat([state.pending_values, vt], dim=2) if n_pending else vt
    total, L = k_all.shape[2], params.chunk_size
    starts = range(0, total, L)
    # one split per tensor (not a slice per chunk): autograd then joins the chunks' gradients once,
    # where per-chunk slices would each scatter into a zero tensor of the whole sequence (O(T^2))
    k_chunks, v_chunks = k_all.split(L, dim=2), v_all.split(L, dim=2)
    q_chunks = qn.split([min(s + L, total) - max(s, n_pending) for s in starts], dim=2)
    # the output, time-major [B, T, H, Dv] so that the caller's reshape to [B, T, H * Dv] is a view:
    # without autograd each chunk is copied into one buffer (a cat of 1000s of transposed chunks is
    # several times slower); with autograd the chunks are joined by one cat at the end
    out = q.new_empty(q.shape[:3] + (vt.shape[-1],)) if inplace else None
    chunks = [(max(start, n_pending) - start, qc, kc, vc)
              for start, qc, kc, vc in zip(starts, q_chunks, k_chunks, v_chunks)]
    step = functools.partial(_chunk_step, beta=beta, params=params, prims=prims, inplace=inplace, static=static)
    outputs = []
    if inplace:
        if total >= L:                            # a chunk will be absorbed: one private copy, then in place
            state = state.clone()
        q_pos, i = 0, 0
        blocks = _block_runs(chunks, L, block_chunks if static else 0, params, prims, q.device, capture)
        while i < len(chunks):
            if i in blocks:                         # S aligned full chunks x n: replays of one block
                n_c, replay = blocks[i]
                a, b = i * L, (i + n_c) * L          # no pending tokens before an aligned chunk: same positions
                o_seg, state = replay(state, qn[:, :, a - n_pending:b - n_pending], k_all[:, :, a:b], v_all[:, :, a:b], beta)
                out[:, q_pos:q_pos + b - a].copy_(o_seg.transpose(1, 2))
                q_pos, i = q_pos + b - a, i + n_c
                continue
            q_offset, qc, kc, vc = chunks[i]
            o_c, state = step(state, q_offset, qc, kc, vc)
            out[:, q_pos:q_pos + qc.shape[2]].copy_(o_c.transpose(1, 2))
            q_pos, i = q_pos + qc.shape[2], i + 1
    elif params.recompute_chunks:
        outputs, state = _recomputed_loop(state, chunks, beta, params, prims, static)
    else:
        for q_offset, qc, kc, vc in chunks:
            o_c, state = step(state, q_offset, qc, kc, vc)
            outputs.append(o_c)
    if total % L == 0:
        # fresh (empty) tensors: a view of k_all would keep the whole sequence's keys alive with the state
        state = dataclasses.replace(state, pending_keys=k_all.new_empty(k_all.shape[:2] + (0, k_all.shape[3])),
                                    pending_values=v_all.new_empty(v_all.shape[:2] + (0, v_all.shape[3])))
    o = out if out is not None else torch.cat([o_c.transpose(1, 2) for o_c in outputs], dim=1).to(q.dtype)
    return o, (state if output_final_state else None)


def _block_runs(chunks, L: int, block_chunks: int, params: OVQParams, prims: OVQPrimitives, device,
                capture: Optional[bool]):
    """{index of a chunk: (chunks taken, replay)} for the runs of aligned full chunks a graphed block
    of ``block_chunks`` takes (multiples of it); {} when blocks are off or cannot be used here."""
    from ovq_cl.ops.ovq import graphs

    S = int(block_chunks)
    if S <= 0 or not graphs.block_usable(params, grad=False)[0]:
        return {}
    capture = graphs.capture_available(device) if capture is None else bool(capture)
    if capture and not graphs.capture_available(device):
        raise ValueError(f"ovq_attention: CUDA graph capture needs a CUDA device, the inputs are on {device}")
    runs, i = {}, 0
    while i < len(chunks):
        j = i
        while j < len(chunks) and chunks[j][0] == 0 and chunks[j][1].shape[2] == chunks[j][2].shape[2] == L:
            j += 1
        n = (j - i) // S * S
        if n:
            runs[i] = (n, functools.partial(graphs.run_blocks, params=params, prims=prims, n_chunks=S, capture=capture))
        i = max(j, i + 1)
    return runs


def _chunk_step(
    state: OVQState, q_offset: int, qc: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, *,
    beta: torch.Tensor, params: OVQParams, prims: OVQPrimitives, inplace: bool, static: bool = False,
) -> Tuple[torch.Tensor, OVQState]:
    """One chunk: the read of its queries (local positions q_offset ..), then, for a full chunk, its
    absorption into the dictionary; a partial chunk becomes the pending buffer.
    qc: [B, H, Lq, Dk]; kc, vc: [B, H, Lc, *]. Returns (read [B, H, Lq, Dv], state after the chunk).
    ``static``: the read spans all N slots (empty ones have log count -inf, no weight) and the update
    is :func:`absorb_static`."""
    read_state = _maybe_detach(state, params)
    n = params.num_slots if static else read_state.n_active
    o_c = prims.read(
        qc, kc, vc,
        read_state.keys[:, :, :n], read_state.values[:, :, :n], read_state.counts[:, :, :n].log(),
        beta, q_offset=q_offset,
    )
    if kc.shape[2] < params.chunk_size:                 # a copy: a view would keep the whole sequence alive
        return o_c, dataclasses.replace(state, pending_keys=kc.clone(), pending_values=vc.clone())
    if params.state_grad == "detach":
        kc, vc = kc.detach(), vc.detach()
    update = absorb_static if static else absorb
    return o_c, update(read_state, kc, vc, params, prims, inplace)


def _recomputed_loop(state: OVQState, chunks, beta, params: OVQParams, prims: OVQPrimitives, static: bool = False):
    """The training loop with ``recompute_chunks`` = S: runs of up to S full chunks whose queries
    start at the chunk's first position go through :func:`~ovq_cl.ops.recompute.recomputed`; the
    others (a first chunk continuing pending tokens, a last partial chunk) run as usual.
    Returns (reads, state)."""
    L = params.chunk_size
    step = functools.partial(_chunk_step, beta=beta, params=params, prims=prims, inplace=False, static=static)
    outputs = []
    eligible = [q_offset == 0 and qc.shape[2] == kc.shape[2] == L for q_offset, qc, kc, _ in chunks]
    for i, j, recompute in segment_runs(eligible, int(params.recompute_chunks)):
        if not recompute:                                             # not a plain full chunk: as usual
            o_c, state = step(state, *chunks[i])
            outputs.append(o_c)
            continue
        q_seg, k_seg, v_seg = (torch.cat([c[n] for c in chunks[i:j]], dim=2) for n in (1, 2, 3))
        info: dict = {}
        run = functools.partial(_run_segment, state.seen, state.n_active, state.pending_keys,
                                state.pending_values, params, prims, info, static)
        o_seg, keys, values, counts = recomputed(run, state.keys, state.values, state.counts, beta,
                                                 q_seg, k_seg, v_seg, non_differentiable=(3,))
        state = dataclasses.replace(state, keys=keys, values=values, counts=counts,
                                    seen=info["seen"], n_active=info["n_active"],
                                    merges=state.merges + info["merges"], evictions=state.evictions + info["evictions"])
        outputs.extend(o_seg.split(L, dim=2))
    return outputs, state


def _run_segment(seen, n_active, pending_keys, pending_values, params, prims, info, static,
                 keys, values, counts, beta, q_seg, k_seg, v_seg):
    """Full chunks [B, H, S L, *] from the dictionary (keys, values, counts) after ``seen`` tokens.
    Returns (reads [B, H, S L, Dv], keys, values, counts); ``info`` gets the ints of the new state."""
    state = OVQState(keys=keys, values=values, counts=counts, pending_keys=pending_keys,
                     pending_values=pending_values, seen=seen, n_active=n_active)
    outs = []
    L = params.chunk_size
    for qc, kc, vc in zip(q_seg.split(L, dim=2), k_seg.split(L, dim=2), v_seg.split(L, dim=2)):
        o_c, state = _chunk_step(state, 0, qc, kc, vc, beta=beta, params=params, prims=prims, inplace=False,
                                 static=static)
        outs.append(o_c)
    info["seen"], info["n_active"] = state.seen, state.n_active
    info["merges"], info["evictions"] = state.merges, state.evictions          # made in this segment (it starts at 0)
    return torch.cat(outs, dim=2), state.keys, state.values, state.counts


def ovq_attention_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, params: OVQParams,
    initial_state: Optional[OVQState] = None, output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[OVQState]]:
    """Chunked OVQ attention (the reference the fast kernels are tested against).

    q, k: [B, T, H, Dk] (normalised inside); v: [B, T, H, Dv]; beta: [H] > 0.
    initial_state: the state returned by a previous call (detached here), or None for a fresh one.
    Returns o [B, T, H, Dv] (dtype of q) and the final state (None unless output_final_state).
    """
    return ovq_chunk_loop(q, k, v, beta, params, initial_state, output_final_state, REFERENCE)
