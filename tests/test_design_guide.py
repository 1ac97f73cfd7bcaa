"""The guide in docs/design.md (section 8) is a program: its code blocks, run in order, in a fresh
process (registering its names here would leak them into other tests' registries)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def guide_code() -> str:
    text = open(os.path.join(ROOT, "docs", "design.md")).read()
    section = text[text.index("## 8. How to add"):]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 5, "the guide shows a mixer, a stream, a metric, a strategy and a run"
    return "\n".join(blocks)


def test_the_guide_runs(tmp_path):
    script = tmp_path / "guide.py"
    script.write_text(guide_code())
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "final_average" in result.stdout
