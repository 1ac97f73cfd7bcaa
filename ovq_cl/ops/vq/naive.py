"""VQ attention (Lingle 2023, Transformer-VQ), PyTorch reference: a compressive cache over a fixed codebook.

Keys are quantised to a global codebook C [H, S, Dk] (learned by the layer during training, fixed
here). Per lane and head the state keeps, for every code s, the count c_s of earlier tokens whose key
quantised to s and the mean u_s of their values; the previous block of L tokens is kept as tokens.
A chunk reads, with the same function as OVQ,

    softmax([beta Q C^T + log c | beta Q [K_prev ; K]^T (causal)]) [U ; V_prev ; V]

which equals exact causal softmax attention over the quantised keys (tested). After the chunk, the
previous block is folded into the counts and means, and the chunk becomes the previous block.
The only difference from OVQ is where the key dictionary comes from: a static codebook, not one
learned online per sequence.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Tuple

import torch

from ovq_cl.ops.common import check_head_vector, check_qkv, compute_dtype
from ovq_cl.ops.recompute import recomputed, segment_runs
from ovq_cl.ops.dictionary import dictionary_chunk_read, scatter_mean_update
from ovq_cl.state import MixerState

STATE_GRAD_KINDS = ("full", "detach")


@dataclasses.dataclass
class VQState(MixerState):
    """counts: [B, H, S]; values: [B, H, S, Dv] mean value per code (cache of blocks before the previous);
    prev_keys / prev_values / prev_codes: [B, H, P, *] the previous full block (P = L, or 0 at the start);
    pending_keys / pending_values / pending_codes: [B, H, p, *] the unfinished chunk (p < L);
    seen: tokens in full chunks so far."""

    counts: torch.Tensor
    values: torch.Tensor
    prev_keys: torch.Tensor
    prev_values: torch.Tensor
    prev_codes: torch.Tensor
    pending_keys: torch.Tensor
    pending_values: torch.Tensor
    pending_codes: torch.Tensor
    seen: int = 0


def empty_vq_state(B: int, H: int, S: int, Dk: int, Dv: int, device=None, dtype=torch.float32) -> VQState:
    z = lambda *shape: torch.zeros(*shape, device=device, dtype=dtype)  # noqa: E731
    codes = lambda: torch.zeros(B, H, 0, device=device, dtype=torch.int64)  # noqa: E731
    return VQState(
        counts=z(B, H, S), values=z(B, H, S, Dv), prev_keys=z(B, H, 0, Dk), prev_values=z(B, H, 0, Dv),
        prev_codes=codes(), pending_keys=z(B, H, 0, Dk), pending_values=z(B, H, 0, Dv), pending_codes=codes(),
    )


def quantize(k: torch.Tensor, codebook: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Nearest code by cosine. k: [B, T, H, Dk] (unit rows); codebook: [H, S, Dk] (unit rows).
    Returns the quantised keys [B, T, H, Dk] and the codes [B, T, H] int64."""
    codes = torch.einsum("bthd,hsd->bths", k, codebook.to(k.dtype)).argmax(-1)
    H = codebook.shape[0]
    heads = torch.arange(H, device=k.device).view(1, 1, H)
    return codebook.to(k.dtype)[heads, codes], codes


def vq_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, codes: torch.Tensor, beta: torch.Tensor,
    codebook: torch.Tensor, chunk_size: int, state_grad: str = "full",
    initial_state: Optional[VQState] = None, output_final_state: bool = True, recompute_chunks: int = 0,
) -> Tuple[torch.Tensor, Optional[VQState]]:
    """q: [B, T, H, Dk] unit queries; k: [B, T, H, Dk] quantised keys (straight-through in training);
    v: [B, T, H, Dv]; codes: [B, T, H] the code of every key; beta: [H]; codebook: [H, S, Dk].
    recompute_chunks: 0 = off; S > 0 = with autograd, runs of S full chunks keep no graph and are
    rerun in the backward (as OVQ's option of that name; same values and gradients).
    Returns o [B, T, H, Dv] and the final state."""
    op = "vq_attention"
    check_qkv(q, k, v, op)
    B, T, H, Dk = q.shape
    check_head_vector(beta, H, "beta", op)
    if tuple(codes.shape) != (B, T, H):
        raise ValueError(f"{op}: codes must be [B, T, H] = {(B, T, H)}, got {tuple(codes.shape)}")
    if codebook.dim() != 3 or codebook.shape[0] != H or codebook.shape[2] != Dk:
        raise ValueError(f"{op}: codebook must be [H, S, Dk] = [{H}, S, {Dk}], got {tuple(codebook.shape)}")
    if chunk_size < 1:
        raise ValueError(f"{op}: chunk_size must be >= 1, got {chunk_size}")
    if state_grad not in STATE_GRAD_KINDS:
        raise ValueError(f"{op}: state_grad must be one of {STATE_GRAD_KINDS}, got {state_grad!r}")
    if int(recompute_chunks) < 0:
        raise ValueError(f"{op}: recompute_chunks must be >= 0 (0 = off), got {recompute_chunks}")
    dtype = compute_dtype(q.dtype)
    S = codebook.shape[1]
    if initial_state is None:
        state = empty_vq_state(B, H, S, Dk, v.shape[-1], device=q.device, dtype=dtype)
    else:
        if tuple(initial_state.counts.shape) != (B, H, S):
            raise ValueError(f"{op}: initial_state.counts has shape {tuple(initial_state.counts.shape)}, expected {(B, H, S)}")
        state = initial_state.detach().to(dtype=dtype)
    qt = q.to(dtype).transpose(1, 2)
    k_all = torch.cat([state.pending_keys, k.to(dtype).transpose(1, 2)], dim=2)
    v_all = torch.cat([state.pending_values, v.to(dtype).transpose(1, 2)], dim=2)
    c_all = torch.cat([state.pending_codes, codes.transpose(1, 2)], dim=2)
    dict_keys = codebook.to(dtype).unsqueeze(0).expand(B, -1, -1, -1)
    beta = beta.to(dtype)
    n_pending, total, L = state.pending_keys.shape[2], k_all.shape[2], chunk_size
    counts, values = state.counts, state.values
    prev_k, prev_v, prev_c = state.prev_keys, state.prev_values, state.prev_codes
    seen, outputs = state.seen, []
    # split once: slicing per chunk would make the backward O(T^2 / L) (one full-size grad per slice);
    # the queries are padded in front so that their chunks line up with the keys'
    q_padded = torch.cat([qt.new_zeros(B, H, n_pending, Dk), qt], dim=2) if n_pending else qt
    chunks = list(zip(q_padded.split(L, 2), k_all.split(L, 2), v_all.split(L, 2), c_all.split(L, 2)))
    needs_graph = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, beta))
    group = int(recompute_chunks) if needs_graph else 0
    eligible = [i * L >= n_pending and c[1].shape[2] == L for i, c in enumerate(chunks)]
    for index, run_end, recompute in segment_runs(eligible, group):
        if recompute:                             # full chunks from their first query: recomputed segment
            q_seg, k_seg, v_seg, c_seg = (torch.cat([c[n] for c in chunks[index:run_end]], dim=2) for n in range(4))
            run = functools.partial(_vq_segment, L, state_grad)
            o_seg, values, counts, prev_k, prev_v, prev_c = recomputed(
                run, values, counts, prev_k, prev_v, prev_c, dict_keys, beta, q_seg, k_seg, v_seg, c_seg,
                non_differentiable=(2, 5))
            outputs.append(o_seg)
            seen += (run_end - index) * L
            continue
        qc, kc, vc, cc = chunks[index]
        start = index * L
        end = start + kc.shape[2]
        q_start = max(start, n_pending)
        o_c, values, counts, prev_k, prev_v, prev_c = _vq_chunk(
            values, counts, prev_k, prev_v, prev_c, dict_keys, beta, qc[:, :, q_start - start:], kc, vc, cc,
            q_start - start, state_grad, absorb=end - start == L)
        outputs.append(o_c)
        seen += L if end - start == L else 0
    pending = (total // L) * L
    # copies, not views: a view of k_all / v_all would keep the whole sequence alive with the state
    final = VQState(
        counts=counts, values=values, prev_keys=prev_k.clone(), prev_values=prev_v.clone(), prev_codes=prev_c.clone(),
        pending_keys=k_all[:, :, pending:].clone(), pending_values=v_all[:, :, pending:].clone(),
        pending_codes=c_all[:, :, pending:].clone(), seen=seen,
    )
    return torch.cat(outputs, dim=2).transpose(1, 2).to(q.dtype), (final if output_final_state else None)


def _vq_chunk(values, counts, prev_k, prev_v, prev_c, dict_keys, beta, qc, kc, vc, cc, q_skip: int,
              state_grad: str, absorb: bool):
    """One chunk: the read of its queries (from local position q_skip) over [codes | previous block |
    this chunk], then, for a full chunk, the previous block goes into the per-code means and this
    chunk becomes the previous block. Returns (read, values, counts, prev_k, prev_v, prev_c)."""
    if state_grad == "detach":
        values, prev_k, prev_v = values.detach(), prev_k.detach(), prev_v.detach()
    n_prev = prev_k.shape[2]
    o = dictionary_chunk_read(qc, torch.cat([prev_k, kc], 2), torch.cat([prev_v, vc], 2),
                              dict_keys, values, counts.log(), beta, q_offset=n_prev + q_skip)
    if absorb:
        values, counts = scatter_mean_update(values, counts, prev_c, prev_v)
        prev_k, prev_v, prev_c = kc, vc, cc
    return o, values, counts, prev_k, prev_v, prev_c


def _vq_segment(L: int, state_grad: str, values, counts, prev_k, prev_v, prev_c, dict_keys, beta,
                q_seg, k_seg, v_seg, c_seg):
    """Full chunks [B, H, S L, *] in a row (for :func:`~ovq_cl.ops.recompute.recomputed`)."""
    outs = []
    for qc, kc, vc, cc in zip(q_seg.split(L, 2), k_seg.split(L, 2), v_seg.split(L, 2), c_seg.split(L, 2)):
        o, values, counts, prev_k, prev_v, prev_c = _vq_chunk(
            values, counts, prev_k, prev_v, prev_c, dict_keys, beta, qc, kc, vc, cc, 0, state_grad, absorb=True)
        outs.append(o)
    # the previous block is returned as its own tensors, not as views of this segment's inputs
    return torch.cat(outs, dim=2), values, counts, prev_k.clone(), prev_v.clone(), prev_c.clone()
