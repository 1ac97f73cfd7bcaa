"""Extension points, used as a user would: a package outside ovq_cl (tests/plugins/extension.py) adds a
mixer with its own options, a stream, a metric and a checkpointed strategy plugin, and ``ovq-cl run``
runs them with options from YAML and the command line, killed mid-run and resumed.

The runs are subprocesses: registering the user's names into this test process would leak them into
other tests' registries.
"""
import glob
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from ovq_cl.base import Registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = textwrap.dedent("""
    plugins: [plugins.extension]
    stream: {name: cipher, options: {n_experiences: 3, train_episodes: 8, test_episodes: 4}}
    model:
      d_model: 16
      n_layers: 1
      n_heads: 2
      layers: [ema]
      mixers: {ema: {decay: 0.5}}
    strategy: {name: anchor, lr: 0.01, train_mb_size: 4, options: {strength: 0.05}}
    meta_train: {steps: 0}
""")


def ovq_cl(tmp, *args, env=None):
    environment = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "tests"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "experiments.cli", *args], cwd=tmp, env=environment,
                          capture_output=True, text=True, timeout=300)


def final_R(ckpt_dir):
    from strategies.training.checkpoint import load_checkpoint

    (path,) = glob.glob(os.path.join(ckpt_dir, "*", "last.pt"))
    ckpt = load_checkpoint(path)
    return ckpt["next_experience"], ckpt["metrics"]["results"]["R"]


def test_a_user_mixer_stream_metric_and_strategy_run_from_the_cli_and_resume(tmp_path, new_store):
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    uri = new_store(tmp_path / "mlruns.db")
    common = ["run", "cfg.yaml", "--plugin", "plugins.extension", "model.mixers.ema.decay=0.7",
              f"tracking.tracking_uri={uri}"]
    killed = ovq_cl(tmp_path, *common, "checkpoint.dir=ckpt/resumed", env={"EXTENSION_KILL_BEFORE": "1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert final_R(tmp_path / "ckpt" / "resumed")[0] == 1                  # experience 0 checkpointed
    resumed = ovq_cl(tmp_path, *common, "checkpoint.dir=ckpt/resumed")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    straight = ovq_cl(tmp_path, *common, "checkpoint.dir=ckpt/straight", "tracking.experiment=straight")
    assert straight.returncode == 0, straight.stderr[-2000:]
    (n_a, R_resumed), (n_b, R_straight) = final_R(tmp_path / "ckpt" / "resumed"), final_R(tmp_path / "ckpt" / "straight")
    assert n_a == n_b == 3 and R_resumed == R_straight
    assert "metric: error_rate" in resumed.stdout

    from experiments.tracking import runs_table

    (run,) = runs_table("ovq-cl", uri)
    assert run["status"] == "FINISHED" and run["tags"]["resumed_at_experience"] == "1"
    assert run["params"]["model.mixers.ema.decay"] == "0.7"                 # the command line won over YAML
    assert run["params"]["strategy.options.strength"] == "0.05"             # from YAML
    assert run["params"]["plugins"] == "['plugins.extension']"
    assert run["tags"]["metric"] == "error_rate"


def test_bad_user_options_and_missing_plugins_fail_before_anything_runs(tmp_path):
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    bad = ovq_cl(tmp_path, "run", "cfg.yaml", "model.mixers.ema.decay=1.5", "tracking.enabled=false")
    assert bad.returncode != 0 and "ema: decay must be in (0, 1), got 1.5" in bad.stderr
    missing = ovq_cl(tmp_path, "run", "cfg.yaml", "--plugin", "plugins.nope", "tracking.enabled=false")
    assert missing.returncode != 0 and "--plugin plugins.nope: no module 'plugins.nope' found in the current folder or on PYTHONPATH" in missing.stderr


def test_entry_points_are_loaded_when_a_registry_misses_a_name(tmp_path, monkeypatch):
    """A package declares ``[project.entry-points."GROUP"] name = "module:function"``; the registry
    calls it the first time it is asked for a name it does not know."""
    dist = tmp_path / "user_extension-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: user-extension\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[ovq_cl_test.things]\nwidget = user_extension_module:register\n")
    (tmp_path / "user_extension_module.py").write_text(
        "from test_extensions import THINGS\n\ndef register():\n    THINGS.register('widget', 42)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from ovq_cl.base import registry

    monkeypatch.setattr(registry, "ENTRY_POINT_MODULES", [])    # this process's other runs keep their code version
    assert THINGS.get("widget") == 42 and "widget" in THINGS.names()
    assert registry.ENTRY_POINT_MODULES == ["user_extension_module"]     # its source joins a run's code version
    with pytest.raises(ValueError, match="unknown thing 'gadget'.*entry point in group 'ovq_cl_test.things'"):
        THINGS.get("gadget")


THINGS = Registry("thing", "ovq_cl_test.things")


def test_a_stock_avalanche_plugin_resumes_with_its_state(tmp_path, new_store):
    """Synaptic Intelligence (Avalanche's plugin, no state_dict) keeps its importances across a kill and a
    resume: the resumed run's R is the uninterrupted run's, bit for bit. Before, its state restarted empty
    and nothing said so."""
    (tmp_path / "cfg.yaml").write_text(CONFIG.replace("strategy: {name: anchor, lr: 0.01, train_mb_size: 4, options: {strength: 0.05}}",
                                                      "strategy: {name: si, lr: 0.01, train_mb_size: 4, options: {si_lambda: 100.0}}"))
    uri = new_store(tmp_path / "mlruns.db")
    common = ["run", "cfg.yaml", f"tracking.tracking_uri={uri}"]
    killed = ovq_cl(tmp_path, *common, "checkpoint.dir=ckpt/resumed", env={"EXTENSION_KILL_BEFORE": "2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = ovq_cl(tmp_path, *common, "checkpoint.dir=ckpt/resumed")
    assert resumed.returncode == 0 and "resuming run" in resumed.stderr, resumed.stderr[-2000:]
    assert "could not save" not in resumed.stderr
    straight = ovq_cl(tmp_path, *common, "checkpoint.dir=ckpt/straight", "tracking.experiment=straight")
    assert straight.returncode == 0, straight.stderr[-2000:]
    (n_a, R_resumed), (n_b, R_straight) = final_R(tmp_path / "ckpt" / "resumed"), final_R(tmp_path / "ckpt" / "straight")
    assert n_a == n_b == 3 and R_resumed == R_straight
    # the checkpoint holds SI's attributes (with them left out, the resumed R differs: the test sees a lost state)
    from strategies.training.checkpoint import load_checkpoint

    (path,) = glob.glob(os.path.join(tmp_path / "ckpt" / "resumed", "*", "last.pt"))
    assert any(k.endswith("SynapticIntelligencePlugin") and "__attributes__" in v
               for k, v in load_checkpoint(path)["extra"]["plugins"].items())


def test_a_plugin_whose_state_cannot_be_saved_is_named_not_dropped_in_silence():
    """A plugin holding something pickle cannot write (a lambda) is recorded as unsaved with the reason;
    the rest are saved by their attributes and restored into a fresh strategy's plugins."""
    import ovq_cl.base.avalanche_compat  # noqa: F401
    from avalanche.core import SupervisedPlugin
    from avalanche.training.plugins import SynapticIntelligencePlugin

    from strategies.plugins import load_plugin_states, plugin_states, unsaved_plugins

    class Opaque(SupervisedPlugin):
        def __init__(self):
            super().__init__()
            self.fn = lambda: 0

    si = SynapticIntelligencePlugin(si_lambda=0.5)
    si.syn_data["trajectory"]["w"] = torch.ones(3)
    states = plugin_states([si, Opaque()])
    assert set(unsaved_plugins(states)) == {"1.Opaque"} and "pickle" in unsaved_plugins(states)["1.Opaque"].lower()
    fresh = [SynapticIntelligencePlugin(si_lambda=0.5), Opaque()]
    load_plugin_states(fresh, states)
    assert torch.equal(fresh[0].syn_data["trajectory"]["w"], torch.ones(3))
