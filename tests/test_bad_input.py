"""Bad input, as a user types it: one line on stderr, exit status 2, and nothing left behind (no
tracking store, no MLflow run, no checkpoint or output folder), whatever the mistake: a malformed
override, a plugin that does not import (raises, has a syntax error, needs a package that is not
installed, is not where Python looks), a model its mixers refuse; under torchrun, one line from rank 0."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "experiments/configs/icr_frozen.yaml")

PLUGINS = {
    "plugin_that_raises": "raise RuntimeError('no licence server')\n",
    "plugin_with_a_syntax_error": "def broken(:\n    pass\n",
    "plugin_with_a_missing_dependency": "import a_package_nobody_installed  # noqa\n",
}


@pytest.mark.parametrize("extra,message", [
    (["model.layers=[ovq"], "override 'model.layers=[ovq': its value is not valid YAML (did not find expected ',' or ']'"),
    (["model.layers"], "override 'model.layers': expected KEY=VALUE"),
    (["--plugin", "plugin_that_raises"],
     "--plugin plugin_that_raises: importing it raised RuntimeError: no licence server (" ),
    (["--plugin", "plugin_with_a_syntax_error"], "--plugin plugin_with_a_syntax_error: syntax error in "),
    (["--plugin", "plugin_with_a_missing_dependency"],
     "--plugin plugin_with_a_missing_dependency: it imports a_package_nobody_installed, which is not installed"),
    (["--plugin", "plugin_nowhere"], "--plugin plugin_nowhere: no module 'plugin_nowhere' found in the current folder"),
    # a user's folder named like a package of ovq-cl (streams/mine.py beside the config): one line, not an
    # ImportError from the framework's own streams shadowed by the user's
    (["--plugin", "streams.mine"], "--plugin streams.mine: 'streams' is one of ovq-cl's own packages"),
    (["model.d_model=65"], "model: OVQAttention: d_model=65 is not divisible by n_heads=4"),
    (["after_meta.model.mixers.ovq.num_slots=0"], "after_meta.model"),
])
def test_a_mistake_is_one_line_and_leaves_nothing_behind(tmp_path, monkeypatch, capsys, extra, message):
    from experiments.cli import main

    monkeypatch.chdir(tmp_path)                 # the default store (sqlite:///mlruns.db) and outputs/ go here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))                 # the plugin folder added for this test only
    for name, source in PLUGINS.items():
        (tmp_path / f"{name}.py").write_text(source)
    before = set(os.listdir(tmp_path))
    code = main(["run", CONFIG, *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("ovq-cl: error: "), err
    assert message in err, err
    assert set(os.listdir(tmp_path)) - before - {"__pycache__"} == set()     # no mlruns.db, mlruns/, outputs/
    for name in PLUGINS:
        sys.modules.pop(name, None)


def test_the_plugin_mistakes_keep_their_traceback_for_debug(tmp_path, monkeypatch):
    from experiments.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "plugin_that_raises.py").write_text(PLUGINS["plugin_that_raises"])
    with pytest.raises(ValueError) as caught:
        main(["run", CONFIG, "--plugin", "plugin_that_raises", "--debug"])
    assert isinstance(caught.value.__cause__, RuntimeError)           # the user's own error, chained
    sys.modules.pop("plugin_that_raises", None)


@pytest.mark.slow
def test_under_torchrun_a_mistake_is_said_once_by_rank_0(tmp_path):
    pytest.importorskip("torch.distributed.run")
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
                           "experiments.cli", "run", CONFIG, "model.d_model=65"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    ours = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith(("ovq-cl", "[rank"))]
    assert ours == ["ovq-cl: error: model: OVQAttention: d_model=65 is not divisible by n_heads=4; set head_dim  "
                    "(--debug for the traceback)"], done.stderr[-3000:]
    # torchrun's own failure summary names our line as the root cause, not a link to its docs
    assert "traceback : ovq-cl: error: model: OVQAttention" in done.stderr
    assert os.listdir(tmp_path) == []


def test_a_plugin_folder_beside_a_folder_named_like_a_framework_package_does_not_shadow_it(tmp_path):
    """`ovq-cl` (a script: the current folder is not on sys.path) adds the current folder for --plugin last,
    so a user's `streams/` there does not replace ovq-cl's `streams` (it did: a raw ImportError)."""
    (tmp_path / "streams").mkdir()
    (tmp_path / "streams" / "__init__.py").write_text("raise ImportError('the user folder shadowed the framework')\n")
    (tmp_path / "my_plugin.py").write_text("LOADED = True\n")
    script = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
              "from ovq_cl.base import load_plugins\n"
              "load_plugins(['my_plugin'])\n"
              "import streams, my_plugin\n"
              "print(streams.__file__, my_plugin.LOADED)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.split() == [os.path.join(ROOT, "streams", "__init__.py"), "True"]


@pytest.mark.parametrize("store, said", [
    ("foo://bar", "the tracking store (MLflow): "),
    ("corrupt", "the tracking store (its database): (sqlite3.DatabaseError) file is not a database"),
])
def test_a_broken_tracking_store_is_one_line_not_a_traceback(tmp_path, capsys, store, said):
    """An unsupported store URI and a corrupted SQLite file (each ~60-100 lines of MLflow and SQLAlchemy
    traceback before) are one line, exit status 2."""
    from experiments.cli import main

    if store == "corrupt":
        (tmp_path / "mlruns.db").write_text("not a database\n")
        store = f"sqlite:///{tmp_path / 'mlruns.db'}"
    assert main(["compare", "--tracking-uri", store]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("ovq-cl: error: ") and said in err, err


def test_a_full_disk_at_a_checkpoint_is_one_line_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    """torch's writer on a full disk says "enforce fail ... file write failed" in 48 lines; now: no space
    left, where, how much is free, and the last complete checkpoint untouched."""
    import errno

    import torch

    import experiments.cli as cli
    from strategies.training import checkpoint

    model = torch.nn.Linear(2, 2)
    path = str(tmp_path / "ckpt" / "last.pt")
    checkpoint.save_checkpoint(path, model=model, optimizer=None, states=None, next_experience=1, metrics={})
    before = open(path, "rb").read()

    def full_disk(obj, f):
        open(f, "wb").write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(checkpoint.CheckpointWriteError) as caught:
        checkpoint.save_checkpoint(path, model=model, optimizer=None, states=None, next_experience=2, metrics={})
    assert caught.value.errno == errno.ENOSPC and "no space left on the device of" in str(caught.value)
    assert open(path, "rb").read() == before and not os.path.exists(path + ".tmp")

    monkeypatch.setattr(cli, "_dispatch", lambda args, parser: (_ for _ in ()).throw(caught.value))
    assert cli.main(["report"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("ovq-cl: error: no space left on the device of"), err
