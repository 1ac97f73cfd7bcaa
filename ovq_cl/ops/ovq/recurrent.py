"""OVQ attention token by token (decoding): an independent code path for the read, used in tests.

Each token reads the dictionary plus the pending buffer plus itself; the buffer is absorbed (with the
chunked path's update) when it holds L tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from ovq_cl.ops.ovq.chunk import _maybe_detach, _prepare, _updates_in_place
from ovq_cl.ops.ovq.primitives import REFERENCE
from ovq_cl.ops.ovq.update import absorb
from ovq_cl.ops.ovq.common import OVQParams, OVQState


def ovq_attention_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, params: OVQParams,
    initial_state: Optional[OVQState] = None, output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[OVQState]]:
    """Token-by-token OVQ decoding (same signature as the chunked op).

    Each token reads the dictionary plus the pending buffer plus itself; the buffer is absorbed when
    it holds L tokens. An independent code path for the read, used to test the chunked one.
    """
    state, qn, kn, vt, beta = _prepare(q, k, v, beta, params, initial_state, "ovq_attention")
    inplace, owned = _updates_in_place(q, k, v, beta), False
    b = beta.view(1, -1, 1)
    outputs = []
    for t in range(qn.shape[2]):
        pk = torch.cat([state.pending_keys, kn[:, :, t:t + 1]], dim=2)
        pv = torch.cat([state.pending_values, vt[:, :, t:t + 1]], dim=2)
        read_state = _maybe_detach(state, params)
        n = read_state.n_active
        qt = qn[:, :, t]                                                     # [B, H, Dk]
        s_loc = b * torch.einsum("bhd,bhpd->bhp", qt, pk)
        s_dict = b * torch.einsum("bhd,bhnd->bhn", qt, read_state.keys[:, :, :n]) + read_state.counts[:, :, :n].log()
        p = torch.softmax(torch.cat([s_dict, s_loc], dim=-1), dim=-1)
        o = torch.einsum("bhn,bhnd->bhd", p[..., :n], read_state.values[:, :, :n])
        o = o + torch.einsum("bhp,bhpd->bhd", p[..., n:], pv)
        outputs.append(o)
        if pk.shape[2] == params.chunk_size:
            if params.state_grad == "detach":
                pk, pv = pk.detach(), pv.detach()
            if inplace and not owned:
                read_state, owned = read_state.clone(), True
            state = absorb(read_state, pk, pv, params, REFERENCE, inplace)
            state = dataclasses.replace(state, pending_keys=pk[:, :, :0], pending_values=pv[:, :, :0])
        else:
            state = dataclasses.replace(state, pending_keys=pk, pending_values=pv)
    o = torch.stack(outputs, dim=2).transpose(1, 2).to(q.dtype)
    return o, (state if output_final_state else None)
