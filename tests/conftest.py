import os

# Triton reads TRITON_INTERPRET once, when it is first imported, and several modules import it
# (fla, ovq_cl's Triton kernels): set it before any of them so that the kernels run on the CPU in
# every test worker. An explicit TRITON_INTERPRET=0 (GPU runs, benchmarks/gpu_check.sh) wins.
os.environ.setdefault("TRITON_INTERPRET", "1")
# MLflow telemetry off before any test imports mlflow (experiments/__init__.py says why)
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("MLFLOW_TRACKING_URI", "sqlite:///" + os.path.join(os.path.dirname(__file__), "..", ".pytest_mlruns.db"))
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (the relative-error check used for every reference comparison)."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def state_storage_bytes(state) -> int:
    """Bytes of the distinct storages behind a (possibly nested) MixerState's tensors: what keeping
    the state keeps alive (a view into a sequence-sized buffer counts that whole buffer)."""
    import dataclasses

    from ovq_cl.state import MixerState

    storages = {}

    def walk(s):
        for f in dataclasses.fields(s):
            value = getattr(s, f.name)
            if isinstance(value, torch.Tensor):
                storages[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
            elif isinstance(value, MixerState):
                walk(value)

    walk(state)
    return sum(storages.values())
