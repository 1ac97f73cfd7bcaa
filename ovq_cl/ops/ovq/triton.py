"""OVQ attention, Triton kernels: the chunk read (forward and backward) and the dictionary argmax.

The chunk loop (growth, spread init, k-means merge as gather/scatter-add) is the one of
:mod:`ovq_cl.ops.ovq.chunk`; this module only swaps its per-chunk primitives (:data:`TRITON`):

- :func:`triton_chunk_read` (an autograd Function) computes, per lane and head,
  ``softmax([beta Q D_k^T + log c | beta Q K^T (causal)]) [D_v ; V]`` flash-attention style: one
  program per block of queries runs ONE online softmax over tiles of dictionary rows and then over
  tiles of the chunk's keys (up to the causal limit), keeping the running max and sum in registers;
  no [Lq, n + Lc] score matrix is ever written to memory. The forward saves the row logsumexp; the
  backward recomputes the scores tile by tile from it (one kernel over key tiles for dK, dV and
  d log c, one over query blocks for dQ); d beta follows from dQ: ``d beta = sum Q . dQ_scaled``.
- :func:`triton_max_similarity`: ``max_n k_i . D_k[n]`` and the first argmax, with a running max
  over tiles, never materialising the [L, n] similarities.

A read that fills the GPU: one chunk of 64 queries for 4 heads is 4 programs, on a chip with 132
SMs. With ``splits`` (flash-decoding; auto on CUDA when the grid is smaller than the SM count), grid
axis 2 splits the dictionary: program s folds rows [s R, (s + 1) R) into a partial (max, sum,
unnormalised output), one more program folds the chunk's own keys, and a small combine in PyTorch
gives the read and its logsumexp, from which the backward runs unchanged (its dQ kernel is split the
same way, partial dQ summed; its dK / dV kernel is already one program per 64 dictionary rows). The
dictionary argmax splits the same way; the first split holding the max wins, so the first index
still wins ties.

Numerics: every dot product uses ``tl.dot`` in IEEE precision by default (``precision="tf32"`` for
TF32 on float32 inputs: its own tolerance test) with fp32 accumulation (fp64 when the inputs are
fp64, which only the interpreter is used for); block sizes are >= 16 and the head dimensions are
padded to a power of two with masks, so any Dk, Dv, n, Lq, Lc work.

On CPU the kernels run under the Triton interpreter: set ``TRITON_INTERPRET=1`` before this module
(or anything that imports triton) is imported. :data:`INTERPRET` records what was in force.
"""
from __future__ import annotations

import functools
import os
from typing import Tuple

import torch
import triton
import triton.language as tl

from ovq_cl.ops.ovq.primitives import OVQPrimitives, sparse_kmeans_merge

#: whether the kernels were built for the interpreter (TRITON_INTERPRET=1 when this module was imported)
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _pow2(x: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(int(x)))


def _acc_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _rows(t: torch.Tensor) -> torch.Tensor:
    """Kernels address [B, H, rows, cols] with a unit stride on the last dim."""
    return t if t.stride(-1) == 1 else t.contiguous()


# -------------------------------------------------------------------------------- kernel helpers

@triton.jit
def _offsets(start, BLOCK: tl.constexpr, LIMIT):
    """Positions start .. start + BLOCK - 1 and which of them are inside [0, LIMIT)."""
    offs = start + tl.arange(0, BLOCK)
    return offs, offs < LIMIT


@triton.jit
def _program_tile(H, BLOCK: tl.constexpr, LIMIT, BLOCK_DK: tl.constexpr, KEY_DIM, BLOCK_DV: tl.constexpr, VALUE_DIM):
    """This program's (lane, head) pair and tile: (pid_bh, b, h, offs, ok, offs_kdim, kdim_ok, offs_vdim,
    vdim_ok) for a grid (tiles along a length of LIMIT, B * H)."""
    pid_bh = tl.program_id(1)
    offs, ok = _offsets(tl.program_id(0) * BLOCK, BLOCK, LIMIT)
    offs_kdim, kdim_ok = _offsets(0, BLOCK_DK, KEY_DIM)
    offs_vdim, vdim_ok = _offsets(0, BLOCK_DV, VALUE_DIM)
    return pid_bh, pid_bh // H, pid_bh % H, offs, ok, offs_kdim, kdim_ok, offs_vdim, vdim_ok


@triton.jit
def _tile(PTR, b, h, s_b, s_h, s_row, offs_row, offs_col, row_ok, col_ok, ACC: tl.constexpr):
    """A [rows, cols] tile of a [B, H, rows, cols] tensor (unit stride on cols), zero outside the masks."""
    return tl.load(PTR + b * s_b + h * s_h + offs_row[:, None] * s_row + offs_col[None, :],
                   mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(ACC)


@triton.jit
def _log_counts(LOG_C, b, h, s_b, s_h, offs_n, col_ok, ACC: tl.constexpr):
    """The log-count bias of dictionary rows offs_n (-inf outside the dictionary: no weight)."""
    return tl.load(LOG_C + b * s_b + h * s_h + offs_n, mask=col_ok, other=float("-inf")).to(ACC)


@triton.jit
def _online_softmax_step(s, vv, m_i, l_i, acc, ACC: tl.constexpr, PREC: tl.constexpr):
    """Folds one tile of scores s [M, N] and values vv [N, Dv] into the running max, sum and output."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, vv, input_precision=PREC, out_dtype=ACC)
    return m_new, l_i, acc


@triton.jit
def _score_gradient(s, ok, lse, do, vv, delta, ACC: tl.constexpr, PREC: tl.constexpr):
    """(p, dS) of one tile: p from the scores and the saved logsumexp, dS = p (dO V^T - delta)."""
    p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(vv), input_precision=PREC, out_dtype=ACC)
    return p, p * (dp - delta[:, None])


# ----------------------------------------------------------------------------------------- forward

@triton.jit
def _read_fwd_kernel(
    Q, K, V, DICT_K, DICT_V, LOG_C, BETA, O, LSE, M_PART, L_PART, ACC_PART,
    sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l,
    sdict_k_b, sdict_k_h, sdict_k_n, sdict_v_b, sdict_v_h, sdict_v_n, slog_c_b, slog_c_h,
    so_b, so_h, so_l,
    H, LQ, LCH, NDICT, KEY_DIM, VALUE_DIM, Q_OFFSET, ROWS, N_SPLITS,
    ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, SPLIT: tl.constexpr, PREC: tl.constexpr,
):
    """Without SPLIT: one program per (query block, lane x head) over all dictionary rows then the
    chunk's keys; writes O and the row logsumexp. With SPLIT (flash-decoding, grid axis 2 of size
    N_SPLITS + 1): program s < N_SPLITS folds dictionary rows [s ROWS, (s + 1) ROWS), program N_SPLITS
    the chunk's keys; each writes its partial (max, sum, unnormalised output) for the combine."""
    pid_m = tl.program_id(0)
    split = tl.program_id(2)
    pid_bh, b, h, offs_m, row_ok, offs_kdim, kdim_ok, offs_vdim, vdim_ok = _program_tile(
        H, BLOCK_M, LQ, BLOCK_DK, KEY_DIM, BLOCK_DV, VALUE_DIM)
    beta = tl.load(BETA + h).to(ACC)
    q = _tile(Q, b, h, sq_b, sq_h, sq_l, offs_m, offs_kdim, row_ok, kdim_ok, ACC) * beta
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], ACC)
    # the dictionary: n rows with log-count bias (-inf = empty slot); with SPLIT, this program's rows
    lo_n = split * ROWS
    hi_n = tl.minimum(NDICT, lo_n + ROWS)
    for start_n in range(lo_n, hi_n, BLOCK_N):
        offs_n, col_ok = _offsets(start_n, BLOCK_N, hi_n)
        kk = _tile(DICT_K, b, h, sdict_k_b, sdict_k_h, sdict_k_n, offs_n, offs_kdim, col_ok, kdim_ok, ACC)
        bias = _log_counts(LOG_C, b, h, slog_c_b, slog_c_h, offs_n, col_ok, ACC)
        s = tl.dot(q, tl.trans(kk), input_precision=PREC, out_dtype=ACC) + bias[None, :]
        vv = _tile(DICT_V, b, h, sdict_v_b, sdict_v_h, sdict_v_n, offs_n, offs_vdim, col_ok, vdim_ok, ACC)
        m_i, l_i, acc = _online_softmax_step(s, vv, m_i, l_i, acc, ACC, PREC)
    # the chunk's own keys, count 1 each, causal: query i sees local positions j <= Q_OFFSET + i
    hi = tl.minimum(LCH, Q_OFFSET + (pid_m + 1) * BLOCK_M)
    if SPLIT:
        hi = hi * (split == N_SPLITS)                  # only the last program of the split axis
    for start_n in range(0, hi, BLOCK_N):
        offs_n, col_ok = _offsets(start_n, BLOCK_N, LCH)
        kk = _tile(K, b, h, sk_b, sk_h, sk_l, offs_n, offs_kdim, col_ok, kdim_ok, ACC)
        s = tl.dot(q, tl.trans(kk), input_precision=PREC, out_dtype=ACC)
        seen = col_ok[None, :] & (offs_n[None, :] <= (Q_OFFSET + offs_m)[:, None])
        s = tl.where(seen, s, float("-inf"))
        vv = _tile(V, b, h, sv_b, sv_h, sv_l, offs_n, offs_vdim, col_ok, vdim_ok, ACC)
        m_i, l_i, acc = _online_softmax_step(s, vv, m_i, l_i, acc, ACC, PREC)
    if SPLIT:                                          # partials [N_SPLITS + 1, B * H, LQ, *]
        row = (split * tl.num_programs(1) + pid_bh) * LQ + offs_m
        tl.store(M_PART + row, m_i, mask=row_ok)
        tl.store(L_PART + row, l_i, mask=row_ok)
        tl.store(ACC_PART + row[:, None] * VALUE_DIM + offs_vdim[None, :], acc, mask=row_ok[:, None] & vdim_ok[None, :])
    else:
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        out = acc / l_safe[:, None]
        tl.store(O + b * so_b + h * so_h + offs_m[:, None] * so_l + offs_vdim[None, :],
                 out.to(O.dtype.element_ty), mask=row_ok[:, None] & vdim_ok[None, :])
        lse = tl.where(l_i > 0, m_i + tl.log(l_safe), float("-inf"))
        tl.store(LSE + pid_bh * LQ + offs_m, lse, mask=row_ok)


# ---------------------------------------------------------------------------------------- backward

@triton.jit
def _read_bwd_kv_kernel(
    Q, KEYS, VALS, BIAS, BETA, DO, LSE, DELTA, DKEYS, DVALS, DBIAS,
    sq_b, sq_h, sq_l, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sb_b, sb_h, sdo_b, sdo_h, sdo_l,
    H, LQ, NCOLS, KEY_DIM, VALUE_DIM, Q_OFFSET,
    IS_LOCAL: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, PREC: tl.constexpr,
):
    """One program per tile of key columns (dictionary rows, or the chunk's keys when IS_LOCAL):
    loops over the query blocks that see the tile, accumulating dK, dV (and d log c)."""
    pid_n = tl.program_id(0)
    pid_bh, b, h, offs_n, col_ok, offs_kdim, kdim_ok, offs_vdim, vdim_ok = _program_tile(
        H, BLOCK_N, NCOLS, BLOCK_DK, KEY_DIM, BLOCK_DV, VALUE_DIM)
    beta = tl.load(BETA + h).to(ACC)
    kk = _tile(KEYS, b, h, sk_b, sk_h, sk_n, offs_n, offs_kdim, col_ok, kdim_ok, ACC)
    vv = _tile(VALS, b, h, sv_b, sv_h, sv_n, offs_n, offs_vdim, col_ok, vdim_ok, ACC)
    if IS_LOCAL:
        bias = tl.zeros([BLOCK_N], ACC)
        lo = tl.maximum(pid_n * BLOCK_N - Q_OFFSET, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
    else:
        bias = _log_counts(BIAS, b, h, sb_b, sb_h, offs_n, col_ok, ACC)
        lo = 0
    grad_k_acc = tl.zeros([BLOCK_N, BLOCK_DK], ACC)
    grad_v_acc = tl.zeros([BLOCK_N, BLOCK_DV], ACC)
    db_acc = tl.zeros([BLOCK_N], ACC)
    for start_m in range(lo, LQ, BLOCK_M):
        offs_m, row_ok = _offsets(start_m, BLOCK_M, LQ)
        q = _tile(Q, b, h, sq_b, sq_h, sq_l, offs_m, offs_kdim, row_ok, kdim_ok, ACC) * beta
        do = _tile(DO, b, h, sdo_b, sdo_h, sdo_l, offs_m, offs_vdim, row_ok, vdim_ok, ACC)
        lse = tl.load(LSE + pid_bh * LQ + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + pid_bh * LQ + offs_m, mask=row_ok, other=0.0)
        s = tl.dot(q, tl.trans(kk), input_precision=PREC, out_dtype=ACC) + bias[None, :]
        ok = row_ok[:, None] & col_ok[None, :]
        if IS_LOCAL:
            ok = ok & (offs_n[None, :] <= (Q_OFFSET + offs_m)[:, None])
        p, ds = _score_gradient(s, ok, lse, do, vv, delta, ACC, PREC)
        grad_v_acc += tl.dot(tl.trans(p), do, input_precision=PREC, out_dtype=ACC)
        grad_k_acc += tl.dot(tl.trans(ds), q, input_precision=PREC, out_dtype=ACC)
        db_acc += tl.sum(ds, 0)
    # gradients are written to contiguous [B*H, NCOLS, D] buffers
    tl.store(DKEYS + (pid_bh * NCOLS + offs_n[:, None]) * KEY_DIM + offs_kdim[None, :],
             grad_k_acc, mask=col_ok[:, None] & kdim_ok[None, :])
    tl.store(DVALS + (pid_bh * NCOLS + offs_n[:, None]) * VALUE_DIM + offs_vdim[None, :],
             grad_v_acc, mask=col_ok[:, None] & vdim_ok[None, :])
    if not IS_LOCAL:
        tl.store(DBIAS + pid_bh * NCOLS + offs_n, db_acc, mask=col_ok)


@triton.jit
def _read_bwd_q_kernel(
    Q, K, V, DICT_K, DICT_V, LOG_C, BETA, DO, LSE, DELTA, DQS,
    sq_b, sq_h, sq_l, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l,
    sdict_k_b, sdict_k_h, sdict_k_n, sdict_v_b, sdict_v_h, sdict_v_n, slog_c_b, slog_c_h, sdo_b, sdo_h, sdo_l,
    H, LQ, LCH, NDICT, KEY_DIM, VALUE_DIM, Q_OFFSET, ROWS, N_SPLITS,
    ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, SPLIT: tl.constexpr, PREC: tl.constexpr,
):
    """One program per block of queries: the gradient of the beta-scaled queries, sum_j dS_ij K_j,
    over the dictionary tiles then the causal local tiles (scores recomputed from the logsumexp).
    With SPLIT, as the forward: program s < N_SPLITS takes rows [s ROWS, (s + 1) ROWS), program
    N_SPLITS the local tiles; each writes its partial sum to DQS[s] (summed by the launcher)."""
    pid_m = tl.program_id(0)
    split = tl.program_id(2)
    pid_bh, b, h, offs_m, row_ok, offs_kdim, kdim_ok, offs_vdim, vdim_ok = _program_tile(
        H, BLOCK_M, LQ, BLOCK_DK, KEY_DIM, BLOCK_DV, VALUE_DIM)
    beta = tl.load(BETA + h).to(ACC)
    q = _tile(Q, b, h, sq_b, sq_h, sq_l, offs_m, offs_kdim, row_ok, kdim_ok, ACC) * beta
    do = _tile(DO, b, h, sdo_b, sdo_h, sdo_l, offs_m, offs_vdim, row_ok, vdim_ok, ACC)
    lse = tl.load(LSE + pid_bh * LQ + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + pid_bh * LQ + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_DK], ACC)
    lo_n = split * ROWS
    hi_n = tl.minimum(NDICT, lo_n + ROWS)
    for start_n in range(lo_n, hi_n, BLOCK_N):
        offs_n, col_ok = _offsets(start_n, BLOCK_N, hi_n)
        kk = _tile(DICT_K, b, h, sdict_k_b, sdict_k_h, sdict_k_n, offs_n, offs_kdim, col_ok, kdim_ok, ACC)
        vv = _tile(DICT_V, b, h, sdict_v_b, sdict_v_h, sdict_v_n, offs_n, offs_vdim, col_ok, vdim_ok, ACC)
        bias = _log_counts(LOG_C, b, h, slog_c_b, slog_c_h, offs_n, col_ok, ACC)
        s = tl.dot(q, tl.trans(kk), input_precision=PREC, out_dtype=ACC) + bias[None, :]
        _, ds = _score_gradient(s, row_ok[:, None] & col_ok[None, :], lse, do, vv, delta, ACC, PREC)
        dq += tl.dot(ds, kk, input_precision=PREC, out_dtype=ACC)
    hi = tl.minimum(LCH, Q_OFFSET + (pid_m + 1) * BLOCK_M)
    if SPLIT:
        hi = hi * (split == N_SPLITS)
    for start_n in range(0, hi, BLOCK_N):
        offs_n, col_ok = _offsets(start_n, BLOCK_N, LCH)
        kk = _tile(K, b, h, sk_b, sk_h, sk_l, offs_n, offs_kdim, col_ok, kdim_ok, ACC)
        vv = _tile(V, b, h, sv_b, sv_h, sv_l, offs_n, offs_vdim, col_ok, vdim_ok, ACC)
        s = tl.dot(q, tl.trans(kk), input_precision=PREC, out_dtype=ACC)
        ok = row_ok[:, None] & col_ok[None, :] & (offs_n[None, :] <= (Q_OFFSET + offs_m)[:, None])
        _, ds = _score_gradient(s, ok, lse, do, vv, delta, ACC, PREC)
        dq += tl.dot(ds, kk, input_precision=PREC, out_dtype=ACC)
    row = (split * tl.num_programs(1) + pid_bh) * LQ + offs_m
    tl.store(DQS + row[:, None] * KEY_DIM + offs_kdim[None, :], dq, mask=row_ok[:, None] & kdim_ok[None, :])


# -------------------------------------------------------------------------------- max similarity

@triton.jit
def _max_sim_kernel(
    K, DICT_K, BEST, ARG, N_ACTIVE,
    sk_b, sk_h, sk_l, sdict_k_b, sdict_k_h, sdict_k_n,
    H, L, NDICT, KEY_DIM, ROWS,
    ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, PREC: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Program (query block, lane x head, s): the max and first argmax over dictionary rows
    [s ROWS, (s + 1) ROWS), written to BEST[s], ARG[s] (the launcher keeps the first split holding the
    overall max, so the first index wins ties across splits too)."""
    split = tl.program_id(2)
    pid_bh, b, h, offs_m, row_ok, offs_kdim, kdim_ok, _, _ = _program_tile(H, BLOCK_M, L, BLOCK_DK, KEY_DIM, 1, 1)
    k = _tile(K, b, h, sk_b, sk_h, sk_l, offs_m, offs_kdim, row_ok, kdim_ok, ACC)
    best = tl.full([BLOCK_M], float("-inf"), ACC)
    arg = tl.zeros([BLOCK_M], tl.int32)
    lo_n = split * ROWS
    hi_n = tl.minimum(NDICT, lo_n + ROWS)
    if MASKED:                                          # rows >= n_active (read from the device) are empty
        hi_n = tl.minimum(hi_n, tl.maximum(tl.load(N_ACTIVE).to(tl.int32), lo_n))
    for start_n in range(lo_n, hi_n, BLOCK_N):
        offs_n, col_ok = _offsets(start_n, BLOCK_N, hi_n)
        dict_k = _tile(DICT_K, b, h, sdict_k_b, sdict_k_h, sdict_k_n, offs_n, offs_kdim, col_ok, kdim_ok, ACC)
        s = tl.dot(k, tl.trans(dict_k), input_precision=PREC, out_dtype=ACC)
        s = tl.where(col_ok[None, :], s, float("-inf"))
        tile_best = tl.max(s, 1)
        tile_arg = tl.argmax(s, 1, tie_break_left=True).to(tl.int32) + start_n
        better = tile_best > best                       # strict: earlier tiles win ties (first index)
        best = tl.where(better, tile_best, best)
        arg = tl.where(better, tile_arg, arg)
    row = (split * tl.num_programs(1) + pid_bh) * L + offs_m
    tl.store(BEST + row, best, mask=row_ok)
    tl.store(ARG + row, arg.to(tl.int64), mask=row_ok)


# ------------------------------------------------------------------------------------ launchers

def _blocks(lq: int, dk: int, dv: int) -> Tuple[int, int, int, int]:
    block_m = min(64, _pow2(lq))
    return block_m, 64, _pow2(dk), _pow2(dv)


def _check(*tensors: torch.Tensor) -> None:
    dev = tensors[0].device
    if dev.type != "cuda" and not INTERPRET:
        raise ValueError(
            "ovq triton kernels: tensors are on the CPU but the Triton interpreter is off; set "
            "TRITON_INTERPRET=1 before triton is imported, or use backend='chunk'"
        )
    for t in tensors:
        if t.device != dev:
            raise ValueError("ovq triton kernels: all tensors must be on one device")


def _nonempty(*ts: torch.Tensor):
    """An empty dictionary is never read (its loops run 0 times), but its pointers must still be valid."""
    return [t if t.numel() else torch.zeros((1,) * t.dim(), device=t.device, dtype=t.dtype) for t in ts]


PRECISIONS = ("ieee", "tf32")


def _prec(dtype: torch.dtype, precision: str) -> str:
    """The tl.dot input precision: TF32 only for float32 inputs when asked (fp64 stays exact)."""
    if precision not in PRECISIONS:
        raise ValueError(f"ovq triton kernels: precision must be one of {PRECISIONS}, got {precision!r}")
    return "tf32" if precision == "tf32" and dtype == torch.float32 else "ieee"


def _split_rows(n: int, programs: int, device: torch.device, splits) -> Tuple[bool, int, int]:
    """(split?, N_SPLITS, rows per split) of the dictionary for a grid of ``programs`` (query blocks x
    lanes x heads). ``splits`` None = auto: on a GPU, split when the grid alone leaves SMs idle (into up
    to 2 x SMs programs, at least 64 rows each); never on the CPU (the interpreter runs programs one
    after another). An int forces that many splits (tests)."""
    if splits is None:
        if device.type != "cuda" or n <= 128:
            return False, 1, max(n, 1)
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        splits = 1 if programs >= sms else min(triton.cdiv(n, 64), triton.cdiv(2 * sms, programs))
    if int(splits) <= 1 or n == 0:
        return False, 1, max(n, 1)
    rows = triton.cdiv(triton.cdiv(n, int(splits)), 64) * 64
    return True, triton.cdiv(n, rows), rows


def _read_forward(q, k, v, dict_keys, dict_values, log_counts, beta, q_offset, splits=None, precision="ieee"):
    bsz, heads, lq, key_dim = q.shape
    chunk_len, value_dim, n = k.shape[2], v.shape[-1], dict_keys.shape[2]
    if n == 0:
        dict_keys, dict_values, log_counts = _nonempty(dict_keys, dict_values, log_counts)
    acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
    o = torch.empty(bsz, heads, lq, value_dim, device=q.device, dtype=q.dtype)
    lse = torch.empty(bsz * heads, lq, device=q.device, dtype=acc_t)
    bm, bn, block_kdim, block_vdim = _blocks(lq, key_dim, value_dim)
    split, n_splits, rows = _split_rows(n, triton.cdiv(lq, bm) * bsz * heads, q.device, splits)
    parts = n_splits + 1 if split else 1
    m_part = torch.empty(parts, bsz * heads, lq, device=q.device, dtype=acc_t) if split else lse
    l_part = torch.empty_like(m_part) if split else lse
    acc_part = torch.empty(parts, bsz * heads, lq, value_dim, device=q.device, dtype=acc_t) if split else lse
    grid = (triton.cdiv(lq, bm), bsz * heads, parts)
    _read_fwd_kernel[grid](
        q, k, v, dict_keys, dict_values, log_counts, beta, o, lse, m_part, l_part, acc_part,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), dict_keys.stride(0), dict_keys.stride(1), dict_keys.stride(2),
        dict_values.stride(0), dict_values.stride(1), dict_values.stride(2), log_counts.stride(0), log_counts.stride(1),
        o.stride(0), o.stride(1), o.stride(2),
        heads, lq, chunk_len, n, key_dim, value_dim, q_offset, rows, n_splits,
        ACC=_acc_dtype(q.dtype), BLOCK_M=bm, BLOCK_N=bn, BLOCK_DK=block_kdim, BLOCK_DV=block_vdim,
        SPLIT=split, PREC=_prec(q.dtype, precision),
    )
    if split:                       # the combine: one softmax from the partial (max, sum, output) of each split
        m = m_part.amax(0)
        w = torch.exp(m_part - torch.where(torch.isinf(m), torch.zeros_like(m), m))
        l_sum = (w * l_part).sum(0)
        acc = (w.unsqueeze(-1) * acc_part).sum(0)
        l_safe = torch.where(l_sum > 0, l_sum, torch.ones_like(l_sum))
        o.copy_((acc / l_safe.unsqueeze(-1)).view(bsz, heads, lq, value_dim))
        lse.copy_(torch.where(l_sum > 0, m + l_safe.log(), torch.full_like(m, float("-inf"))))
    return o, lse


def _read_backward(q, k, v, dict_keys, dict_values, log_counts, beta, o, lse, do, q_offset, needs,
                   splits=None, precision="ieee"):
    bsz, heads, lq, key_dim = q.shape
    chunk_len, value_dim, n = k.shape[2], v.shape[-1], dict_keys.shape[2]
    acc_t = lse.dtype
    bh = bsz * heads
    delta = (do.to(acc_t) * o.to(acc_t)).sum(-1).reshape(bh, lq).contiguous()
    bm, bn, block_kdim, block_vdim = _blocks(lq, key_dim, value_dim)
    ACC, PREC = _acc_dtype(q.dtype), _prec(q.dtype, precision)
    dq = dk = dv = grad_dict_keys = grad_dict_values = grad_log_counts = dbeta = None
    empty = (dict_keys, dict_values, log_counts)
    if n == 0:
        dict_keys, dict_values, log_counts = _nonempty(dict_keys, dict_values, log_counts)
    if needs["q"] or needs["beta"]:
        split, n_splits, rows = _split_rows(n, triton.cdiv(lq, bm) * bh, q.device, splits)
        parts = n_splits + 1 if split else 1
        dqs = torch.empty(parts, bh, lq, key_dim, device=q.device, dtype=acc_t)
        _read_bwd_q_kernel[(triton.cdiv(lq, bm), bh, parts)](
            q, k, v, dict_keys, dict_values, log_counts, beta, do, lse, delta, dqs,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), dict_keys.stride(0), dict_keys.stride(1), dict_keys.stride(2),
            dict_values.stride(0), dict_values.stride(1), dict_values.stride(2), log_counts.stride(0), log_counts.stride(1),
            do.stride(0), do.stride(1), do.stride(2),
            heads, lq, chunk_len, n, key_dim, value_dim, q_offset, rows, n_splits,
            ACC=ACC, BLOCK_M=bm, BLOCK_N=bn, BLOCK_DK=block_kdim, BLOCK_DV=block_vdim, SPLIT=split, PREC=PREC,
        )
        dqs = (dqs.sum(0) if split else dqs[0]).view(bsz, heads, lq, key_dim)
        bshape = beta.view(1, -1, 1, 1).to(acc_t)
        if needs["q"]:
            dq = (dqs * bshape).to(q.dtype)
        if needs["beta"]:
            dbeta = (dqs * q.to(acc_t)).sum(dim=(0, 2, 3)).to(beta.dtype)
    for is_local, keys, vals, ncols, want_k, want_v in (
        (False, dict_keys, dict_values, n, needs["dict_keys"] or needs["log_counts"], needs["dict_values"]),
        (True, k, v, chunk_len, needs["k"], needs["v"]),
    ):
        if ncols == 0 or not (want_k or want_v):
            continue
        gk = torch.empty(bh, ncols, key_dim, device=q.device, dtype=acc_t)
        gv = torch.empty(bh, ncols, value_dim, device=q.device, dtype=acc_t)
        gb = torch.empty(bh, ncols, device=q.device, dtype=acc_t) if not is_local else gk
        _read_bwd_kv_kernel[(triton.cdiv(ncols, bn), bh)](
            q, keys, vals, log_counts, beta, do, lse, delta, gk, gv, gb,
            q.stride(0), q.stride(1), q.stride(2), keys.stride(0), keys.stride(1), keys.stride(2),
            vals.stride(0), vals.stride(1), vals.stride(2), log_counts.stride(0), log_counts.stride(1),
            do.stride(0), do.stride(1), do.stride(2),
            heads, lq, ncols, key_dim, value_dim, q_offset,
            IS_LOCAL=is_local, ACC=ACC, BLOCK_M=bm, BLOCK_N=bn, BLOCK_DK=block_kdim, BLOCK_DV=block_vdim, PREC=PREC,
        )
        gk = gk.view(bsz, heads, ncols, key_dim).to(q.dtype)
        gv = gv.view(bsz, heads, ncols, value_dim).to(q.dtype)
        if is_local:
            dk, dv = gk, gv
        else:
            grad_dict_keys, grad_dict_values = gk, gv
            grad_log_counts = gb.view(bsz, heads, ncols).to(log_counts.dtype)
    if n == 0:
        grad_dict_keys, grad_dict_values, grad_log_counts = (torch.zeros_like(t) for t in empty)
    return dq, dk, dv, grad_dict_keys, grad_dict_values, grad_log_counts, dbeta


class _ChunkRead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dict_keys, dict_values, log_counts, beta, q_offset, splits, precision):
        q, k, v, dict_keys, dict_values = (_rows(t) for t in (q, k, v, dict_keys, dict_values))
        log_counts = _rows(log_counts)
        beta = beta.contiguous()
        o, lse = _read_forward(q, k, v, dict_keys, dict_values, log_counts, beta, q_offset, splits, precision)
        ctx.save_for_backward(q, k, v, dict_keys, dict_values, log_counts, beta, o, lse)
        ctx.q_offset, ctx.splits, ctx.precision = q_offset, splits, precision
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, dict_keys, dict_values, log_counts, beta, o, lse = ctx.saved_tensors
        names = ("q", "k", "v", "dict_keys", "dict_values", "log_counts", "beta")
        needs = dict(zip(names, ctx.needs_input_grad[:7]))
        grads = _read_backward(
            q, k, v, dict_keys, dict_values, log_counts, beta, o, lse, _rows(do), ctx.q_offset, needs,
            ctx.splits, ctx.precision,
        )
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:7])) + (None, None, None)


def triton_chunk_read(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    dict_keys: torch.Tensor, dict_values: torch.Tensor, log_counts: torch.Tensor,
    beta: torch.Tensor, q_offset: int = 0, splits=None, precision: str = "ieee",
) -> torch.Tensor:
    """The OVQ chunk read on Triton kernels; contract of :func:`ovq_cl.ops.dictionary.dictionary_chunk_read`.

    q: [B, H, Lq, Dk]; k, v: [B, H, Lc, Dk], [B, H, Lc, Dv]; dict_keys, dict_values: [B, H, n, *]
    (n may be 0); log_counts: [B, H, n] (-inf = empty slot); beta: [H]; query i sits at local position
    q_offset + i (< Lc). Differentiable in every tensor argument. Returns [B, H, Lq, Dv].
    splits: the dictionary split across programs (flash-decoding; None = auto, see :func:`_split_rows`);
    precision: "ieee" (exact fp32 dots) or "tf32" (float32 inputs only; its own tolerance in the tests).
    """
    _check(q, k, v, dict_keys, dict_values, log_counts, beta)
    _prec(q.dtype, precision)
    dtype = q.dtype
    args = [t.to(dtype) for t in (q, k, v, dict_keys, dict_values, log_counts, beta)]
    return _ChunkRead.apply(*args, int(q_offset), splits, precision)


def triton_max_similarity(k: torch.Tensor, dict_keys: torch.Tensor, splits=None,
                          precision: str = "ieee", n_active=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """``max_n k_i . D_k[n]`` and its first argmax without materialising the [L, n] similarities.

    k: [B, H, L, Dk]; dict_keys: [B, H, n, Dk] (n >= 1). Returns ([B, H, L] dtype of k, [B, H, L] int64).
    Not differentiable (the assignment is a constant for autograd). splits, precision: as the read.
    n_active: a 0-d int64 device tensor: only rows [0, n_active) count ((-inf, 0) when it is 0), read
    by the kernel itself, so the launch does not depend on its value (the static loop, CUDA graphs).
    """
    _check(k, dict_keys)
    k, dict_keys = _rows(k.detach()), _rows(dict_keys.detach().to(k.dtype))
    bsz, heads, L, key_dim = k.shape
    n = dict_keys.shape[2]
    if n == 0:
        raise ValueError("triton_max_similarity: the dictionary is empty")
    bm = min(64, _pow2(L))
    _, parts, rows = _split_rows(n, triton.cdiv(L, bm) * bsz * heads, k.device, splits)
    best = torch.empty(parts, bsz, heads, L, device=k.device, dtype=k.dtype)
    arg = torch.empty(parts, bsz, heads, L, device=k.device, dtype=torch.int64)
    masked = n_active is not None
    n_act = n_active.reshape(1) if masked else arg                       # a valid pointer either way
    _max_sim_kernel[(triton.cdiv(L, bm), bsz * heads, parts)](
        k, dict_keys, best, arg, n_act,
        k.stride(0), k.stride(1), k.stride(2), dict_keys.stride(0), dict_keys.stride(1), dict_keys.stride(2),
        heads, L, n, key_dim, rows,
        ACC=_acc_dtype(k.dtype), BLOCK_M=bm, BLOCK_N=64, BLOCK_DK=_pow2(key_dim), PREC=_prec(k.dtype, precision),
        MASKED=masked,
    )
    if parts == 1:
        return best[0], arg[0]
    overall = best.amax(0)
    first = (best == overall).to(torch.int8).argmax(0, keepdim=True)     # the first split holding the max
    return overall, arg.gather(0, first).squeeze(0)


def make_triton_primitives(splits=None, precision: str = "ieee") -> OVQPrimitives:
    """The chunk loop's primitives on these kernels with a fixed dictionary split (None = auto) and dot
    precision ("ieee" or "tf32"); :data:`TRITON` is the default (auto, ieee)."""
    _prec(torch.float32, precision)
    if splits is None and precision == "ieee":
        return TRITON
    name = f"triton[splits={splits},precision={precision}]"
    sim = functools.partial(triton_max_similarity, splits=splits, precision=precision)
    return OVQPrimitives(name, functools.partial(triton_chunk_read, splits=splits, precision=precision), sim,
                         sparse_kmeans_merge, _masked(sim))


def _masked(sim):
    def masked_max_similarity(k, dict_keys, n_active):
        return sim(k, dict_keys, n_active=n_active)
    return masked_max_similarity


#: the chunk loop's primitives on Triton (the k-means merge stays a torch gather/scatter-add)
TRITON = OVQPrimitives("triton", triton_chunk_read, triton_max_similarity, sparse_kmeans_merge,
                       _masked(triton_max_similarity))

__all__ = ["INTERPRET", "PRECISIONS", "TRITON", "make_triton_primitives", "triton_chunk_read", "triton_max_similarity"]
