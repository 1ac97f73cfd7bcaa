"""One training step, shared by the Avalanche strategies, meta-training and the demo.

    loss, out, states = train_step(model, optimizer, x, y, grad_clip=1.0)

The objective is the sequence loss over scored positions (cross-entropy, or MSE for regression) plus,
in training, the model's auxiliary loss (VQ's commitment); a non-finite value is a FloatingPointError
that says where it happened, raised before any weight moves.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from strategies.scores import sequence_loss


def training_objective(model: torch.nn.Module, out: torch.Tensor, y: torch.Tensor, where: str = "") -> torch.Tensor:
    """sequence_loss(out, y) + model.aux_loss() (when the model has one); finite or FloatingPointError."""
    loss = sequence_loss(out, y)
    if hasattr(model, "aux_loss"):
        loss = loss + model.aux_loss()
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite loss {float(loss.detach())}{' ' + where if where else ''}")
    return loss


def clip_gradients(model: torch.nn.Module, grad_clip: Optional[float]) -> None:
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               grad_clip: Optional[float] = 1.0, states=None, where: str = "") -> Tuple[torch.Tensor, torch.Tensor, list]:
    """Forward from ``states`` (None: fresh), objective, backward, clip, optimizer step.
    x [B, T] tokens or [B, T, d_in]; returns (loss, out, new_states)."""
    out, new_states = model(x, states)
    loss = training_objective(model, out, y, where)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    clip_gradients(model, grad_clip)
    optimizer.step()
    return loss, out, new_states
