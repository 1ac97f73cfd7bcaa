"""The data-dependent scalar decay that Gated DeltaNet and the SSM share (Mamba-2's parametrisation):
``g_t = -exp(A_log) softplus(W_a x_t + dt_bias)``, a log-decay per head and token."""
from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn


def decay_parameters(n_heads: int, dt_min: float, dt_max: float) -> Tuple[nn.Parameter, nn.Parameter]:
    """(A_log, dt_bias), each [H]: A uniform in [1, 16]; initial step sizes log-uniform in
    [dt_min, dt_max] (fla's defaults 0.001, 0.1; smaller starts the per-token decay exp(-A dt) closer to
    1, i.e. a longer memory), stored through the inverse softplus."""
    A_log = nn.Parameter(torch.empty(n_heads).uniform_(1, 16).log())
    dt = torch.exp(torch.rand(n_heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    return A_log, nn.Parameter(dt + torch.log(-torch.expm1(-dt)))


def log_decay(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """a = W_a x [B, T, H] -> g [B, T, H] (float32, <= 0)."""
    return -A_log.exp() * F.softplus(a.float() + dt_bias)
