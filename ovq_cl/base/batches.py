"""Minibatches of episodes: every dataset item is ``(x, y)`` or ``(x, y, task)``."""
from __future__ import annotations

from typing import Sequence, Tuple

import torch


def collate_episodes(batch: Sequence[tuple]) -> Tuple[torch.Tensor, ...]:
    """Stacks items of equal length: ``x [B, T, ...]``, ``y [B, T, ...]`` and, when the items carry a
    task label, ``t [B]`` int64."""
    columns = list(zip(*batch))
    out = [torch.stack(columns[0]), torch.stack(columns[1])]
    if len(columns) > 2:
        out.append(torch.as_tensor(columns[2]))
    return tuple(out)
