"""Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024), chunked (PyTorch): the fast form, equal to the
recurrent oracle (``naive.py``) in tests.

Per head, with S [Dk, Dv], a_t = exp(g_t) in (0, 1] and b_t in [0, 1]:

    S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,      o_t = scale * S_t^T q_t

Chunked form (ours, derived directly; same answers as fla's references). Inside a chunk with start
state S_0 and cumulative log-decay G_i = g_1 + ... + g_i, write the state as
``S_i = exp(G_i) S_0 + sum_{j<=i} exp(G_i - G_j) k_j u_j^T``. The recurrence gives
``u_i = b_i (v_i - exp(G_i) S_0^T k_i - sum_{j<i} exp(G_i - G_j) (k_i . k_j) u_j)``, a unit
lower-triangular system ``(I + A) U = diag(b) (V - diag(exp G) K S_0)`` solved in one call.
The update is dense: every token rewrites the whole [Dk, Dv] state.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ovq_cl.ops.common import compute_dtype
from ovq_cl.ops.delta.naive import check_inputs


def gated_delta_rule_chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = True, chunk_size: int = 64,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; g (log decay, <= 0), beta: [B, T, H];
    initial_state: [B, H, Dk, Dv]. Returns o [B, T, H, Dv] and the final state [B, H, Dk, Dv]."""
    check_inputs(q, k, v, g, beta, initial_state, "gated_delta_rule")
    if chunk_size < 1:
        raise ValueError(f"gated_delta_rule: chunk_size must be >= 1, got {chunk_size}")
    dtype = compute_dtype(q.dtype)
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    scale = Dk ** -0.5 if scale is None else scale
    qt, kt, vt = (x.to(dtype).transpose(1, 2) for x in (q, k, v))          # [B, H, T, D]
    gt, bt = g.to(dtype).transpose(1, 2), beta.to(dtype).transpose(1, 2)  # [B, H, T]
    S = qt.new_zeros(B, H, Dk, Dv) if initial_state is None else initial_state.to(dtype)
    outputs = []
    # split once: slicing per chunk would make the backward O(T^2 / chunk) (one full-size grad per slice)
    chunks = zip(*(x.split(chunk_size, 2) for x in (qt, kt, vt, bt, gt)))
    for qc, kc, vc, bc, gc in chunks:
        C = qc.shape[2]
        G = gc.cumsum(-1)                                                    # [B, H, C]
        diff = G.unsqueeze(-1) - G.unsqueeze(-2)                             # G_i - G_j
        lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        decay = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()  # exp(G_i - G_j), j <= i
        A = (bc.unsqueeze(-1) * decay * (kc @ kc.transpose(-1, -2))).tril(-1)
        rhs = bc.unsqueeze(-1) * (vc - G.exp().unsqueeze(-1) * (kc @ S))
        eye = torch.eye(C, dtype=dtype, device=q.device)
        U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        o = G.exp().unsqueeze(-1) * (qc @ S) + (decay * (qc @ kc.transpose(-1, -2))) @ U
        outputs.append(o * scale)
        G_last = G[:, :, -1:]
        S = G_last.exp().unsqueeze(-1) * S + (kc * (G_last - G).exp().unsqueeze(-1)).transpose(-1, -2) @ U
    o = torch.cat(outputs, dim=2).transpose(1, 2).to(q.dtype)
    return o, (S if output_final_state else None)
