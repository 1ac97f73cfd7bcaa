"""What a run is and who runs it (issue 27): the source of a user's plugin in the run's identity and in
the shared meta-training's key, one line per decision about a run, and runs moved between checkpoint
folders said so."""
import os
import subprocess
import sys
import textwrap

from experiments.config import run_config
from experiments.runner import run
from test_runner import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_plugin_source_hash_follows_the_code_of_the_whole_plugin_package(tmp_path, monkeypatch):
    from experiments.code_version import plugin_source_hash

    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mixers.py").write_text("from userpkg.helpers import SCALE\n")
    (pkg / "helpers.py").write_text("SCALE = 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = plugin_source_hash(["userpkg.mixers"])
    assert first and plugin_source_hash(["userpkg.mixers"]) == first
    (pkg / "helpers.py").write_text("SCALE = 0.0\n")                # a helper the plugin imports changed
    assert plugin_source_hash(["userpkg.mixers"]) not in ("", first)
    assert plugin_source_hash([]) == "" and plugin_source_hash(["experiments.runner"]) == ""   # ours: the code version


CONFIG = textwrap.dedent("""
    plugins: [userext.extension]
    stream: {name: cipher, options: {n_experiences: 3, train_episodes: 8, test_episodes: 4}}
    model: {d_model: 16, n_layers: 1, n_heads: 2, layers: [ema], mixers: {ema: {decay: 0.5}}}
    strategy: {name: anchor, lr: 0.01, train_mb_size: 4, options: {strength: 0.05}}
    meta_train: {steps: 0}
""")
ZERO_THE_OUTPUT = textwrap.dedent("""

    _forward = EMAMixer.forward


    def _zeroed(self, x, state=None):           # the edit: the mixer's output zeroed
        y, new_state = _forward(self, x, state)
        return y * 0, new_state


    EMAMixer.forward = _zeroed
""")


def test_editing_a_plugin_makes_a_new_run_not_a_reused_one(tmp_path, new_store):
    """The documented way to extend ovq-cl (tests/plugins/extension.py, copied as a user's package): after
    the plugin's code changed, the same command runs again (one line says the code changed) and gets the
    new result; before the change, the same command reuses the finished run."""
    pkg = tmp_path / "userext"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    source = open(os.path.join(ROOT, "tests", "plugins", "extension.py")).read()
    (pkg / "extension.py").write_text(source)
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    args = [sys.executable, "-m", "experiments.cli", "run", "cfg.yaml",
            f"tracking.tracking_uri={new_store(tmp_path / 'mlruns.db')}"]
    first = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    again = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "reusing finished run" in again.stderr                         # same code: reused
    (pkg / "extension.py").write_text(source + ZERO_THE_OUTPUT)
    edited = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert edited.returncode == 0, edited.stderr[-2000:]
    assert "reusing finished run" not in edited.stderr and "the code changed since this config last ran" in edited.stderr
    rows = lambda out: [line for line in out.splitlines() if line.startswith("R[")]     # noqa: E731
    assert rows(edited.stdout) != rows(first.stdout) and len(rows(edited.stdout)) == 3


def test_the_shared_meta_training_key_has_the_plugins_source(tmp_path, monkeypatch):
    from experiments import meta_cache

    pkg = tmp_path / "keyplug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = run_config({**TINY, "tracking": {"enabled": False}, "checkpoint": {"enabled": False}}, plugins=["keyplug"])
    before = meta_cache.meta_key(cfg, None)
    (pkg / "__init__.py").write_text("X = 2\n")
    assert meta_cache.meta_key(cfg, None) != before


def test_a_reused_meta_training_and_a_moved_checkpoint_folder_are_each_said_in_one_line(tmp_path, monkeypatch, new_store):
    monkeypatch.chdir(tmp_path)
    uri = new_store(tmp_path / "mlruns.db")

    def cfg(folder, **extra):
        return run_config({**TINY, "tracking": {"experiment": "said", "tracking_uri": uri},
                           "checkpoint": {"dir": str(tmp_path / folder)}, **extra})

    said = []
    run(cfg("a"), announce=said.append)
    run(cfg("a", seed=0, strategy={**TINY["strategy"], "name": "frozen"}), announce=said.append)
    assert sum("reusing the meta-training of an identical config" in s for s in said) == 1
    stopped = run(cfg("b", seed=1), stop_after=0, announce=said.append)
    n = len(said)
    moved = run(cfg("c", seed=1), announce=said.append)                  # output moved between kill and resume
    assert moved.run_id != stopped.run_id
    assert any(f"unfinished run {stopped.run_id} of this config keeps its checkpoint under {tmp_path / 'b'}" in s
               for s in said[n:])


def test_compare_counts_one_seed_once_and_shows_code_versions_apart(tmp_path, monkeypatch, capsys, new_store):
    """Runs repeated by --rerun are one seed; runs of one configuration made by different code are not
    pooled: both said on stderr, the table counts what is left."""
    import experiments.runner as runner
    from experiments.cli import main

    monkeypatch.chdir(tmp_path)
    uri = new_store(tmp_path / "mlruns.db")

    def cfg(seed):
        return run_config({**TINY, "seed": seed, "tracking": {"experiment": "dups", "tracking_uri": uri},
                           "checkpoint": {"dir": str(tmp_path / "ckpt")}})

    monkeypatch.setattr(runner, "code_version", lambda: "code-aaaa")
    run(cfg(0))
    run(cfg(0), rerun=True)                                   # the same seed again
    capsys.readouterr()
    assert main(["compare", "--experiment", "dups", "--tracking-uri", uri]) == 0
    out, err = capsys.readouterr()
    assert "1 repeated run(s) of the same config, seeds and code left out" in err
    row = next(line for line in out.splitlines() if line.startswith("| all runs"))
    assert row.split("|")[3].strip() == "1"                   # n: one seed, counted once
    monkeypatch.setattr(runner, "code_version", lambda: "code-bbbb")
    run(cfg(1))
    assert main(["compare", "--experiment", "dups", "--tracking-uri", uri]) == 0
    out, err = capsys.readouterr()
    assert "runs of 2 code versions, shown apart: code-aaaa (n=1), code-bbbb (n=1)" in err, err
    assert "code_version=code-aaaa" in out and "code_version=code-bbbb" in out
