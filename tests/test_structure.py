"""The shape of the code a newcomer reads: capability packages in one order, no import cycle, small interfaces.

Read from the source with ``ast`` (nothing is imported): every ``import`` counts, also one inside a
function, since a cycle there still means two modules that cannot be understood apart, and an import
that points up the package order (however lazily) is an arrow a reader has to follow back.
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


#: tfgpu's packages (and its two top-level modules) from the bottom up: each may import only itself and those
#: before it. The README's "How the code is laid out" gives each one's job in this order.
ORDER = ["errors", "version", "utils", "config", "cluster", "devices", "model", "data", "tracking", "launch",
         "training", "serving", "experiments", "cli"]
#: The public API (``tfgpu/__init__.py``: setup, Setup, load_config, ...) and ``python -m tfgpu`` sit on top.
TOP = {"tfgpu", "tfgpu.__main__"}


def layer(module: str) -> str:
    """``tfgpu.devices.plan`` -> ``devices``; ``tfgpu.errors`` -> ``errors``; the top -> ``""``."""
    return "" if module in TOP else module.split(".")[1]


def upward_imports(graph: dict[str, set[str]], order: list[str]) -> list[str]:
    """Every import of a module from a package above its own in ``order``, and of the top."""
    rank = {name: i for i, name in enumerate(order)}
    found = []
    for module, targets in sorted(graph.items()):
        if module in TOP:
            continue
        for target in sorted(targets):
            if target in TOP or rank[layer(target)] > rank[layer(module)]:
                found.append(f"{module} -> {target}")
    return found


def test_the_upward_import_finder_finds_one():
    graph = {"tfgpu.utils.a": {"tfgpu.errors"}, "tfgpu.config.b": {"tfgpu.utils.a", "tfgpu.devices.c"},
             "tfgpu.devices.c": {"tfgpu"}, "tfgpu": {"tfgpu.devices.c"}}
    assert upward_imports(graph, ["errors", "utils", "config", "devices"]) == [
        "tfgpu.config.b -> tfgpu.devices.c", "tfgpu.devices.c -> tfgpu"]


def test_tfgpu_is_its_packages_and_two_modules_each_package_saying_what_it_owns():
    entries = sorted(p.name for p in PACKAGE.iterdir() if not p.name.startswith((".", "__pycache__")))
    packages = [name for name in ORDER if (PACKAGE / name).is_dir()]
    assert entries == sorted([*packages, "errors.py", "version.py", "__init__.py", "__main__.py"])
    assert [name for name in ORDER if name not in packages] == ["errors", "version"]
    for name in packages:
        init = PACKAGE / name / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 25, f"tfgpu/{name}/__init__.py does not say what the package owns"


def test_every_module_belongs_to_a_package_in_the_order():
    assert {layer(module) for module in import_graph()} - {""} == set(ORDER)


def test_no_package_imports_one_above_it_in_the_order():
    graph = import_graph()
    assert "tfgpu.training.preflight" in graph["tfgpu.experiments.sweep"]  # lazy imports are read: an arrow down
    assert upward_imports(graph, ORDER) == []


def test_no_two_modules_share_a_name_a_reader_confuses():
    """Outside the command line (whose modules are named after the commands they run), a module's name is
    unique, and none is another's name with a suffix (``plan``/``planning``, ``result``/``results``)."""
    names = [path.stem for path in PACKAGE.rglob("*.py")
             if path.stem not in ("__init__", "__main__") and "cli" not in path.relative_to(PACKAGE).parts[:-1]]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
    confusable = [(a, b) for a in names for b in names if a != b and b.startswith(a) and b[len(a):] in
                  ("s", "ing", "er", "ed", "ion", "ions")]
    assert confusable == []


def test_tests_mirror_the_packages():
    tests = ROOT / "tests"
    folders = sorted(p.name for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert set(folders) - {"containers"} <= set(ORDER)
    assert {"config", "devices", "data", "model", "training", "serving", "cluster", "launch", "tracking",
            "experiments", "cli"} <= set(folders)


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_tfgpu_is_part_of_an_import_cycle():
    graph = import_graph()
    assert "tfgpu.devices.plan_base" in graph["tfgpu.devices.jax_plan"]  # the graph is read, lazy imports included
    assert cycles(graph) == []


@pytest.mark.parametrize("module", ["training/runner.py", "training/loops/__init__.py", "training/loops/fit.py",
                                    "training/loops/custom.py"])
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
    assert "tfgpu.devices.plan" not in graph["tfgpu.devices.jax_plan"]
    assert "tfgpu.devices.plan_base" in graph["tfgpu.devices.plan"]


def test_import_tfgpu_and_its_help_load_neither_pydantic_nor_tensorflow_and_the_api_comes_on_first_use():
    """``import tfgpu`` (and ``tfgpu --help``) cost 0.05-0.08 s, not the config's 0.2 s of pydantic models (PEP 562)."""
    from .conftest import run_python
    result = run_python("""
        import sys, tfgpu, tfgpu.cli
        print("LOADED", sorted(m for m in ("pydantic", "tensorflow", "keras", "numpy") if m in sys.modules))
        print("DIR", all(name in dir(tfgpu) for name in tfgpu.__all__))
        from tfgpu import *
        print("API", setup.__module__, Config.__module__, "pydantic" in sys.modules)
        try:
            tfgpu.no_such_name
        except AttributeError as exc:
            print("MISSING", exc)
    """)
    assert "LOADED []" in result.stdout, result.stdout + result.stderr[-2000:]
    assert "DIR True" in result.stdout
    assert "API tfgpu.devices.setup tfgpu.config.schema True" in result.stdout
    assert "MISSING module 'tfgpu' has no attribute 'no_such_name'" in result.stdout
