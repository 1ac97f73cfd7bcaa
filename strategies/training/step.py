"""One training step, shared by the Avalanche strategies, meta-training and the demo.

    loss, out, states = train_step(model, optimizer, x, y, grad_clip=1.0)
    loss, out, states = train_step(model, optimizer, x, y, grad_clip=1.0, tbptt=64)   # truncated BPTT

The objective is the sequence loss over scored positions (cross-entropy, or MSE for regression) plus,
in training, the model's auxiliary loss (VQ's commitment); a non-finite value is a FloatingPointError
that says where it happened, raised before any weight moves. Under torchrun (``strategies.training.distributed``)
each rank's sequence loss is weighted by its share of the answers and the gradients are averaged across
ranks before clipping: the step of one process on the whole batch.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ovq_cl.base import scored_mask
from strategies.training import distributed
from strategies.evaluation.metrics import sequence_loss


def n_answers(y: torch.Tensor) -> int:
    """The number of scored target elements (what the sequence loss averages over)."""
    mask = scored_mask(y)
    return int(mask.sum()) * (int(y.shape[-1]) if y.is_floating_point() and y.dim() == mask.dim() + 1 else 1)


def training_objective(model: torch.nn.Module, out: torch.Tensor, y: torch.Tensor, where: str = "",
                       weight: float = 1.0, aux_weight: float = 1.0,
                       answer_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """weight * sequence_loss(out, y, answer_weights) + aux_weight * model.aux_loss() (when the model has
    one); finite or FloatingPointError (under torchrun on every rank at once, whichever rank's lanes
    overflowed). ``weight``: a data-parallel rank's share of the answers (``distributed.loss_weight``);
    ``answer_weights`` [B, T]: per-answer weights (the retention loss, :func:`retention_weights`)."""
    loss = sequence_loss(out, y, answer_weights)
    if weight != 1.0:
        loss = loss * weight
    if hasattr(model, "aux_loss"):
        aux = model.aux_loss()
        loss = loss + (aux * aux_weight if aux_weight != 1.0 else aux)
    finite = bool(torch.isfinite(loss))
    if not distributed.all_ranks(finite):
        raise FloatingPointError(f"non-finite loss {float(loss.detach()) if not finite else 'on another rank'}"
                                 f"{' ' + where if where else ''}")
    return loss


def retention_weights(y: torch.Tensor, recalled: torch.Tensor, retention_loss: float) -> torch.Tensor:
    """Per-answer weights [B, T] that turn the mean sequence loss into the mean over all answers plus
    ``retention_loss`` times the mean over the ``recalled`` ones (bool [B, T], answers to facts not
    presented in the same episode): ``1 + retention_loss * N / N_recalled`` on recalled answers, 1 elsewhere
    (N: the batch's scored answers). A batch without recalled answers gets weights of 1."""
    scored = scored_mask(y)
    n, n_recalled = int(scored.sum()), int((recalled & scored).sum())
    weights = torch.ones(scored.shape, dtype=torch.float32)
    if n_recalled and retention_loss:
        weights[recalled & scored] += retention_loss * n / n_recalled
    return weights


def clip_gradients(model: torch.nn.Module, grad_clip: Optional[float]) -> None:
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               grad_clip: Optional[float] = 1.0, states=None, where: str = "",
               tbptt: int = 0, answer_weights: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, list]:
    """Forward from ``states`` (None: fresh), objective, backward, clip, optimizer step.
    x [B, T] tokens or [B, T, d_in]; returns (loss, out, new_states). ``answer_weights`` [B, T]: per-answer
    weights of the sequence loss (:func:`retention_weights`), None for the plain mean.

    ``tbptt`` > 0 (truncated backpropagation through time): the forward runs in segments of ``tbptt``
    tokens, each from the previous one's state *detached*, each segment's objective backpropagated
    before the next is computed (memory holds one segment's graph), and one optimizer step at the end.
    Segments are weighted by their share of the scored answers, so the summed gradient is that of the
    same mean objective, cut at the segment borders; with ``tbptt >= T`` it equals the full step."""
    optimizer.zero_grad(set_to_none=True)
    T = x.shape[1]
    dp = distributed.active()
    if tbptt <= 0 or tbptt >= T:
        weight = distributed.loss_weight(n_answers(y)) if dp is not None else 1.0
        out, new_states = model(x, states)
        loss = training_objective(model, out, y, where, weight, answer_weights=answer_weights)
        loss.backward()
    else:
        scored = scored_mask(y)
        total = max(int(scored.sum()), 1)
        starts = list(range(0, T, tbptt))
        if dp is not None:
            # segment s weighs W n_rs / N in the sequence loss (n_rs: this rank's answers in it) and
            # n_s / N in the auxiliary loss (n_s: every rank's), as one process on all lanes would
            mine = torch.tensor([float(n_answers(y[:, lo:lo + tbptt])) for lo in starts], dtype=torch.float64)
            every = distributed.all_reduce_sum(mine)
            n_all = max(float(every.sum()), 1.0)
        outs, loss = [], torch.zeros(())
        for s, lo in enumerate(starts):
            seg_out, states = model(x[:, lo:lo + tbptt], states)
            seg_weights = None if answer_weights is None else answer_weights[:, lo:lo + tbptt]
            if dp is None:
                share = int(scored[:, lo:lo + tbptt].sum()) / total
                seg_loss = training_objective(model, seg_out, y[:, lo:lo + tbptt], where,
                                              answer_weights=seg_weights) * share
            else:
                seg_loss = training_objective(model, seg_out, y[:, lo:lo + tbptt], where,
                                              weight=dp.world_size * float(mine[s]) / n_all,
                                              aux_weight=float(every[s]) / n_all, answer_weights=seg_weights)
            seg_loss.backward()
            states = [None if s is None else s.detach() for s in states]
            outs.append(seg_out.detach())
            loss = loss + seg_loss.detach().cpu()
        out, new_states = torch.cat(outs, 1), states
    distributed.average_gradients(model)
    clip_gradients(model, grad_clip)
    optimizer.step()
    return loss, out, new_states
