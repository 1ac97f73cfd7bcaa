import os

import pytest
import torch

os.environ.setdefault("MLFLOW_TRACKING_URI", "sqlite:///" + os.path.join(os.path.dirname(__file__), "..", ".pytest_mlruns.db"))
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (the relative-error check used for every reference comparison)."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
