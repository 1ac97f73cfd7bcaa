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


@pytest.fixture(scope="session")
def _migrated_store(tmp_path_factory):
    """An MLflow SQLite file with its tables made and nothing else: what a new store is after MLflow's
    migrations (1-2 s a store, run on every new file), before MLflow writes anything into it."""
    import mlflow.store.db.utils as db_utils
    import sqlalchemy

    path = tmp_path_factory.mktemp("store-template") / "migrated.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    db_utils._initialize_tables(engine)
    engine.dispose()
    return path


@pytest.fixture
def new_store(_migrated_store):
    """``new_store(path)``: a new, empty tracking store at ``path`` (its URI), copied from a migrated file
    instead of migrated again, for tests that need a store of their own, not to watch one being created
    (test_tracking and test_output watch that)."""
    import shutil

    def make(path) -> str:
        shutil.copyfile(_migrated_store, path)
        return f"sqlite:///{path}"

    return make


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


def study_file(studies, name: str):
    """The spec file of study ``name`` in a folder of studies (``studies/NAME/study.yaml``), its folder made."""
    folder = studies / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "study.yaml"
