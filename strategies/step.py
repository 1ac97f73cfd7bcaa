"""One training step, shared by the Avalanche strategies, meta-training and the demo.

    loss, out, states = train_step(model, optimizer, x, y, grad_clip=1.0)
    loss, out, states = train_step(model, optimizer, x, y, grad_clip=1.0, tbptt=64)   # truncated BPTT

The objective is the sequence loss over scored positions (cross-entropy, or MSE for regression) plus,
in training, the model's auxiliary loss (VQ's commitment); a non-finite value is a FloatingPointError
that says where it happened, raised before any weight moves. Under torchrun (``strategies.distributed``)
each rank's sequence loss is weighted by its share of the answers and the gradients are averaged across
ranks before clipping: the step of one process on the whole batch.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ovq_cl.base import scored_mask
from strategies import distributed
from strategies.scores import sequence_loss


def n_answers(y: torch.Tensor) -> int:
    """The number of scored target elements (what the sequence loss averages over)."""
    mask = scored_mask(y)
    return int(mask.sum()) * (int(y.shape[-1]) if y.is_floating_point() and y.dim() == mask.dim() + 1 else 1)


def training_objective(model: torch.nn.Module, out: torch.Tensor, y: torch.Tensor, where: str = "",
                       weight: float = 1.0) -> torch.Tensor:
    """weight * sequence_loss(out, y) + model.aux_loss() (when the model has one); finite or
    FloatingPointError. ``weight``: a data-parallel rank's share (``distributed.loss_weight``)."""
    loss = sequence_loss(out, y) * weight if weight != 1.0 else sequence_loss(out, y)
    if hasattr(model, "aux_loss"):
        loss = loss + model.aux_loss()
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite loss {float(loss.detach())}{' ' + where if where else ''}")
    return loss


def clip_gradients(model: torch.nn.Module, grad_clip: Optional[float]) -> None:
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               grad_clip: Optional[float] = 1.0, states=None, where: str = "",
               tbptt: int = 0) -> Tuple[torch.Tensor, torch.Tensor, list]:
    """Forward from ``states`` (None: fresh), objective, backward, clip, optimizer step.
    x [B, T] tokens or [B, T, d_in]; returns (loss, out, new_states).

    ``tbptt`` > 0 (truncated backpropagation through time): the forward runs in segments of ``tbptt``
    tokens, each from the previous one's state *detached*, each segment's objective backpropagated
    before the next is computed (memory holds one segment's graph), and one optimizer step at the end.
    Segments are weighted by their share of the scored answers, so the summed gradient is that of the
    same mean objective, cut at the segment borders; with ``tbptt >= T`` it equals the full step."""
    optimizer.zero_grad(set_to_none=True)
    T = x.shape[1]
    weight = distributed.loss_weight(n_answers(y))         # 1.0 in a single process
    if tbptt <= 0 or tbptt >= T:
        out, new_states = model(x, states)
        loss = training_objective(model, out, y, where, weight)
        loss.backward()
    else:
        scored = scored_mask(y)
        total = max(int(scored.sum()), 1)
        outs, loss = [], torch.zeros(())
        for lo in range(0, T, tbptt):
            seg_out, states = model(x[:, lo:lo + tbptt], states)
            share = int(scored[:, lo:lo + tbptt].sum()) / total
            seg_loss = training_objective(model, seg_out, y[:, lo:lo + tbptt], where, weight) * share
            seg_loss.backward()
            states = [None if s is None else s.detach() for s in states]
            outs.append(seg_out.detach())
            loss = loss + seg_loss.detach().cpu()
        out, new_states = torch.cat(outs, 1), states
    distributed.average_gradients(model)
    clip_gradients(model, grad_clip)
    optimizer.step()
    return loss, out, new_states
