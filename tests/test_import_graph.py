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
    assert not RULES["streams"]("ovq_cl.model") and not RULES["streams"]("strategies.evaluation.results")
    assert RULES["streams"]("ovq_cl.base.tokens") and not RULES["ovq_cl"]("avalanche.core")


def test_importing_the_shared_base_or_the_streams_loads_no_model_code():
    code = ("import sys, ovq_cl.base, streams; "
            "bad = [m for m in sys.modules if m.startswith(('ovq_cl.model', 'ovq_cl.layers', 'ovq_cl.ops', "
            "'strategies', 'experiments', 'avalanche', 'mlflow', 'triton'))]; print(bad); assert not bad")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


PACKAGES = ("ovq_cl", "streams", "strategies", "experiments", "benchmarks")


def module_files():
    """{dotted module name: file} for every .py file of the project's packages (a package is its __init__)."""
    out = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    dotted = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
                    out[dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted] = os.path.join(folder, name)
    return out


def _runtime_nodes(tree):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (imports for annotations only, which
    never run: a module may name a type of a module that imports it)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                stack.extend(child.orelse)
                continue
            stack.append(child)


def import_edges(modules):
    """{module: modules it imports}, imports inside functions included. ``from P import N`` is an edge to
    P.N when that is a module (P, its package, is then already loaded), else to P; ``import a.b`` to a.b.
    A package's __init__ imported on the way to one of its modules is not an edge: it is loaded before
    its modules by Python itself, and counting it would make every package a circle with its modules."""
    edges = {}
    for mod, path in modules.items():
        package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        targets = set()
        for node in _runtime_nodes(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets |= {full} if full in modules else ({base} if base in modules else set())
        edges[mod] = targets - {mod}
    return edges


def cycles(edges):
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_anywhere_in_the_packages():
    found = cycles(import_edges(module_files()))
    assert not found, f"import cycles (each a set of modules that import each other, in functions too): {found}"


def test_the_cycle_finder_finds_a_circle_through_a_function_level_import(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "x.py").write_text("from p.y import f\n")
    (pkg / "y.py").write_text("def f():\n    from p import x\n")
    files = {"p": str(pkg / "__init__.py"), "p.x": str(pkg / "x.py"), "p.y": str(pkg / "y.py")}
    assert cycles(import_edges(files)) == [["p.x", "p.y"]]
    # an import for annotations only (under ``if TYPE_CHECKING:``) never runs: not an edge; its else branch runs
    (pkg / "y.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import x\n")
    assert cycles(import_edges(files)) == []
    (pkg / "y.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    from p import x\n")
    assert cycles(import_edges(files)) == [["p.x", "p.y"]]


BENEATH_THE_STRATEGIES = ("strategies.training", "strategies.evaluation")


def test_training_and_evaluation_sit_beneath_the_strategies():
    """strategies/training and strategies/evaluation are what the strategies (and the runner) use: they
    import nothing of the strategies themselves (templates, regularisers, registry, plugins)."""
    edges = import_edges(module_files())
    beneath = lambda m: m.startswith(BENEATH_THE_STRATEGIES)      # noqa: E731
    bad = {m: sorted(t for t in targets if t.startswith("strategies") and not beneath(t) and t != "strategies")
           for m, targets in edges.items() if beneath(m)}
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"training/evaluation importing the strategies above them: {bad}"
    assert "strategies.training.step" in edges["strategies.sequence"]          # the rule sees real edges
