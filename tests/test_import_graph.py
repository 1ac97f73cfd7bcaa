"""The one-way flow of dependencies: experiments -> streams, strategies -> ovq_cl.

ovq_cl imports no Avalanche, MLflow, streams, strategies or experiments; streams import no model or
training code (from ovq_cl only the shared ``ovq_cl.base``); strategies import no streams or
experiments; nothing but experiments imports MLflow. Imports inside functions count too.
"""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def imports_of(package: str):
    """{module file: [imported module names]} for every .py file of a top-level package."""
    out = {}
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            tree = ast.parse(open(path).read(), path)
            names = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names += [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.append(node.module)
            out[os.path.relpath(path, ROOT)] = names
    return out


def top(name: str) -> str:
    return name.split(".")[0]


RULES = {
    "ovq_cl": lambda m: top(m) not in {"avalanche", "mlflow", "streams", "strategies", "experiments"},
    "streams": lambda m: top(m) not in {"strategies", "experiments", "mlflow"}
    and (top(m) != "ovq_cl" or m == "ovq_cl.base" or m.startswith("ovq_cl.base.")),
    "strategies": lambda m: top(m) not in {"streams", "experiments", "mlflow"},
}


@pytest.mark.parametrize("package", sorted(RULES))
def test_imports_flow_one_way(package):
    allowed = RULES[package]
    bad = {f: [m for m in names if not allowed(m)] for f, names in imports_of(package).items()}
    bad = {f: m for f, m in bad.items() if m}
    assert not bad, f"imports against the one-way flow: {bad}"


def test_the_rules_catch_a_violation():
    assert not RULES["streams"]("ovq_cl.model") and not RULES["streams"]("strategies.metrics")
    assert RULES["streams"]("ovq_cl.base.tokens") and not RULES["ovq_cl"]("avalanche.core")


def test_importing_the_shared_base_or_the_streams_loads_no_model_code():
    code = ("import sys, ovq_cl.base, streams; "
            "bad = [m for m in sys.modules if m.startswith(('ovq_cl.model', 'ovq_cl.layers', 'ovq_cl.ops', "
            "'strategies', 'experiments', 'avalanche', 'mlflow', 'triton'))]; print(bad); assert not bad")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
