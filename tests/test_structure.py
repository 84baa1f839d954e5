"""The shape of the code a newcomer reads: no import cycle, and small interfaces in the run's hub.

Read from the source with ``ast`` (nothing is imported): every ``import`` counts, also one inside a
function, since a cycle there still means two modules that cannot be understood apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import ROOT

PACKAGE = ROOT / "tfgpu"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """``module -> the tfgpu modules it imports`` (``from . import x`` of a submodule counts as that submodule)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
                targets = subs + ([target] if len(subs) < len(node.names) else [])
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_tfgpu_is_part_of_an_import_cycle():
    graph = import_graph()
    assert "tfgpu.planning" in graph["tfgpu.backends.jax_plan"]  # the graph is read, lazy imports included
    assert cycles(graph) == []


@pytest.mark.parametrize("module", ["runner.py", "loops/__init__.py", "loops/fit.py", "loops/custom.py"])
def test_no_function_in_the_run_hub_takes_more_than_six_parameters(module):
    tree = ast.parse((PACKAGE / module).read_text())
    wide = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            names = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if a.arg not in ("self", "cls")]
            names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
            if len(names) > 6:
                wide.append(f"{node.name}({', '.join(names)})")
    assert wide == []


def test_tfgpu_plan_and_the_jax_plan_share_their_parts_from_below():
    graph = import_graph()
    assert "tfgpu.plan" not in graph["tfgpu.backends.jax_plan"]
    assert "tfgpu.planning" in graph["tfgpu.plan"]
