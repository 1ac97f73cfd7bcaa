"""What the command line writes: results and tables on stdout; messages and progress on stderr, as bars
on a terminal and as plain lines in a log; nothing but the result under ``--quiet`` (the libraries'
INFO lines included, whatever the config's ``progress``); ``state-sizes`` sizes what the demo sizes."""
import os
import subprocess
import sys

import pytest
import yaml

from experiments.cli import main, shown_progress
from test_runner import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ovq_cl(tmp, *args):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "experiments.cli", *args], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=300)


def test_quiet_prints_the_result_alone_and_a_log_gets_lines_not_bars(tmp_path):
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({**TINY, "meta_train": {"steps": 4, "batch_size": 8}}))
    # a fresh store (MLflow says INFO when it creates one) and progress asked for in the config: --quiet wins
    quiet = ovq_cl(tmp_path, "run", "cfg.yaml", "progress=true", "--quiet")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stderr == "" and "R[2]" in quiet.stdout
    # not quiet, stderr a pipe (a log): one plain line per phase, no carriage returns, no bar
    loud = ovq_cl(tmp_path, "run", "cfg.yaml", "--rerun", "tracking.experiment=loud", "checkpoint.share_meta=false")
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert "\r" not in loud.stderr and "it/s" not in loud.stderr
    lines = loud.stderr.splitlines()
    assert any(line.startswith("meta-train: 4/4 steps in ") for line in lines), loud.stderr
    assert [line.split(" in ")[0] for line in lines if line.startswith("experience ")] == [
        f"experience {j}: train: 2/2 minibatches" for j in range(3)]
    assert any(line.startswith("experiences: 3/3 experiences in ") for line in lines)
    # a sweep under --quiet: its table on stdout, nothing on stderr
    sweep = ovq_cl(tmp_path, "sweep", "cfg.yaml", "--grid", "seed=0;1", "--name", "s", "--out", "out", "--quiet",
                   "tracking.experiment=sweep")
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    assert sweep.stderr == "" and "| all runs |" in sweep.stdout


def test_the_progress_rule():
    assert shown_progress(None, quiet=False) and shown_progress(True, quiet=False)
    assert not shown_progress(False, quiet=False)
    assert not shown_progress(True, quiet=True) and not shown_progress(None, quiet=True)


def test_progress_in_a_log_is_a_line_per_phase(capsys):
    from ovq_cl.base.progress import PlainProgress, progress

    for _ in progress(range(5), desc="phase", unit="steps"):       # captured stderr is not a terminal
        pass
    bar = progress(total=3, desc="resumed", initial=1)
    assert isinstance(bar, PlainProgress)
    bar.update()
    bar.update()
    bar.close()
    bar.close()                                                     # said once
    for _ in progress(range(2), desc="hidden", show=False):
        pass
    err = capsys.readouterr().err.splitlines()
    assert [line.split(" in ")[0] for line in err] == ["phase: 5/5 steps", "resumed: 3/3 steps (from 1)"]


def test_state_sizes_sizes_every_mixer_the_demo_sizes_to_the_demos_bytes(capsys):
    """``--as-demo``: the demo's dimensions, options and budget; each mixer's bytes there plus the token
    shift are the bytes of the demo's own model (measured on a real state); without the demo's options,
    a mixer that cannot fit is a row saying so, not an error."""
    import torch

    from experiments.demo import DemoConfig
    from ovq_cl import DecoderLM, model_config
    from streams.recall import recall_batch

    assert main(["state-sizes", "--budget", "16960", "--d-model", "64"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[3:]}
    assert "does not fit" in rows["vq"] and "17680 B at codebook_size=1" in rows["vq"]
    assert "does not fit" not in rows["ovq"]

    assert main(["state-sizes", "--as-demo"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[3:]}
    demo = DemoConfig()
    x, _ = recall_batch(demo.task, 2, torch.Generator().manual_seed(0))
    for name in ("ovq", "vq", "linear", "deltanet", "ssm", "swa"):
        model = DecoderLM(model_config({
            "vocab_size": demo.task.vocab_size, "d_model": demo.d_model, "n_layers": 1, "n_heads": demo.n_heads,
            "layers": [name], "state_budget": demo.state_budget,
            "mixers": {k: v for k, v in demo.mixer_options.items() if k == name}}))
        _, (state,) = model(x)
        assert int(rows[name][0].replace(",", "")) + 4 * demo.d_model == state.nbytes // x.shape[0], name


def test_state_sizes_options_are_checked(capsys):
    assert main(["state-sizes", "--option", "vq.chunk_size"]) == 2
    assert "expected MIXER.OPTION=VALUE" in capsys.readouterr().err
    assert main(["state-sizes", "--option", "mamba.chunk_size=8"]) == 2
    assert "unknown mixer(s) ['mamba']" in capsys.readouterr().err


@pytest.mark.parametrize("quiet", [True, False])
def test_library_logging_follows_quiet(quiet, monkeypatch):
    import logging

    from experiments import cli

    for name in cli.LIBRARY_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    monkeypatch.delenv("MLFLOW_LOGGING_LEVEL", raising=False)
    if quiet:
        cli.quiet_libraries()
        assert os.environ["MLFLOW_LOGGING_LEVEL"] == "WARNING"
        monkeypatch.delenv("MLFLOW_LOGGING_LEVEL")
    assert all((logging.getLogger(n).level == logging.WARNING) == quiet for n in cli.LIBRARY_LOGGERS)


def test_the_forgetting_curve_plot_has_whole_experiences_and_starts_at_zero():
    """Eight points of a stable memory (0.81-1.0) once filled the whole height of the plot and read as a
    collapse: a score in [0, 1] is drawn on all of [0, 1], others from 0, and experiences are whole ticks."""
    from experiments.artifacts import forgetting_plot

    stable = [[1.0, None, None], [0.95, 0.99, None], [0.81, 0.9, 0.98]]
    fig = forgetting_plot(stable, [100, 200, 300], "accuracy", "stable")
    assert fig.axes[0].get_ylim() == (0.0, 1.02) and fig.axes[1].get_ylim() == (0.0, 1.02)
    assert all(float(t).is_integer() for t in fig.axes[0].get_xticks())
    bits = forgetting_plot([[2.5, None], [3.1, 2.0]], [10, 20], "bits_per_byte", "text")
    assert bits.axes[0].get_ylim()[0] == 0.0 and bits.axes[0].get_ylim()[1] > 3.1
