"""README's "Your own stream in ten minutes", run as written there: its two files are taken from the README
(so the section cannot drift from what works), put in a folder outside the repository, and `ovq-cl run`
runs the variant stream with its own defaults (8 experiences) on tiny sizes."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_blocks():
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Your own stream in ten minutes", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"```(?:python|yaml)\n# (\S+)[^\n]*\n(.*?)```", section, re.S))


def test_the_readme_quickstart_runs_a_variant_stream_with_its_own_defaults(tmp_path):
    blocks = _readme_blocks()
    assert set(blocks) == {"my_streams.py:", "my.yaml:"}
    (tmp_path / "my_streams.py").write_text(blocks["my_streams.py:"])
    (tmp_path / "my.yaml").write_text(blocks["my.yaml:"])
    tiny = ["meta_train.steps=2", "stream.options.train_episodes=8", "stream.options.test_episodes=2",
            "gate.episodes=4", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}", "--quiet"]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
                          "from experiments.cli import main; sys.exit(main())", "run", "my.yaml", *tiny],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "icr8-ovq-frozen-persist-s0" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith("R[")]
    assert len(rows) == 8 and all(len(r.split()) == 9 for r in rows)     # the variant's 8 experiences, not ICR's 4
