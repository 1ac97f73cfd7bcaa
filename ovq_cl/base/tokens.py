"""Special tokens shared by every token stream, and which positions of a label tensor are scored.

Token streams reserve ``PAD = 0`` and ``SEP = 1`` (streams may add their own tokens after them);
labels use ``IGNORE = -100`` (PyTorch's cross-entropy default) where nothing is scored. Regression
streams mark unscored positions with NaN targets instead.
"""
from __future__ import annotations

import torch

PAD, SEP = 0, 1
IGNORE = -100


def scored_mask(y: torch.Tensor) -> torch.Tensor:
    """Bool mask of scored positions: [..., T] for int labels (!= -100) or float targets [..., T, d] (not NaN).

    Select scored positions BEFORE computing a loss on float targets: ``where`` over a NaN target
    still sends NaN into the gradient.
    """
    if y.is_floating_point():
        return ~torch.isnan(y).any(-1)
    return y != IGNORE
