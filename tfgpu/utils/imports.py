"""``"package.module:function"`` names in a recipe (``model.builder``, ``data.builder``) -> the function.

The current directory is importable, as with ``python -m``: the ``tfgpu``
console script does not put it on ``sys.path`` itself. :func:`find_module`
(``tfgpu plan``) finds a module without running any of its code or its parent
packages'; :func:`import_function` (``tfgpu run``) imports it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import TfgpuError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0].rstrip(".") if text else "") or type(exc).__name__


def find_spec(name: str) -> importlib.machinery.ModuleSpec:
    """The spec of the module ``name`` (dotted or not), found level by level without importing anything.

    :func:`importlib.util.find_spec` imports the parent packages of a dotted
    name, running their ``__init__.py``. This asks the finders instead: the
    top level as ``import`` would (:func:`importlib.util.find_spec`, which
    imports nothing for a name without dots: ``sys.meta_path``, so also
    built-in and editable-install modules), each next level with
    :class:`importlib.machinery.PathFinder` in its parent's folders (a folder
    without ``__init__.py`` is a namespace package). A module already in
    ``sys.modules`` is used as it is (its ``__path__``); ``None`` there (an
    import hook's block) is not found.

    Raises:
        ModuleNotFoundError: a level is not found (``No module named 'a.b'``) or is not a package.
        ImportError: a finder raised it.
    """
    parts = name.split(".")
    spec, folders = _find_level(parts[0], None)
    for depth in range(2, len(parts) + 1):
        parent, current = ".".join(parts[:depth - 1]), ".".join(parts[:depth])
        if folders is None and current not in sys.modules:  # os.path: in sys.modules, though os is no package
            raise ModuleNotFoundError(f"No module named '{current}'; '{parent}' is not a package")
        spec, folders = _find_level(current, folders)
    return spec


def _find_level(name: str, folders: Optional[list[str]]) -> tuple[importlib.machinery.ModuleSpec, Optional[list[str]]]:
    """One level of :func:`find_spec`: the spec of ``name`` and its folders (``None``: not a package), looked up in
    ``sys.modules``, then in the parent's ``folders`` (``None``: a top-level name)."""
    if not name.rpartition(".")[2]:  # 'a..b', 'a.'
        raise ModuleNotFoundError(f"No module named '{name}'")
    if name in sys.modules:
        module = sys.modules[name]
        if module is None:  # an import hook's block
            raise ModuleNotFoundError(f"No module named '{name}'")
        path = getattr(module, "__path__", None)
        spec = getattr(module, "__spec__", None)
        if spec is None:  # __main__, a module made by hand
            spec = importlib.machinery.ModuleSpec(name, None, is_package=path is not None)
    else:
        found = (importlib.util.find_spec(name) if folders is None
                 else importlib.machinery.PathFinder.find_spec(name, folders))
        if found is None:
            raise ModuleNotFoundError(f"No module named '{name}'")
        spec, path = found, found.submodule_search_locations
    return spec, None if path is None else list(path)


def importable(name: str) -> bool:
    """Whether the module ``name`` can be found in this process, without importing it or its parents
    (:func:`find_spec`; ``False`` where it is not installed, a parent package is missing, or an import hook
    blocks it: ``sys.modules[name] = None``)."""
    try:
        find_spec(name)
    except (ImportError, ValueError):
        return False
    return True


def package_folders(name: str) -> list[Path]:
    """The folders of the installed package ``name``, found by :func:`find_spec` without importing it
    (``[]``: not installed, or not a package)."""
    try:
        spec = find_spec(name)
    except (ImportError, ValueError):
        return []
    return [Path(folder) for folder in spec.submodule_search_locations or []]


def _importable_cwd() -> None:
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def _cannot_import(spec: str, key: str, error: type[TfgpuError], exc: BaseException) -> TfgpuError:
    module_name = spec.partition(":")[0]
    return error(
        f"{key}: cannot import module '{module_name}' (received '{spec}'): {_first_line(exc)}.",
        "check the module name and that it is importable (the current directory, PYTHONPATH or an "
        "installed package).",
    )


def _import_failed(spec: str, key: str, error: type[TfgpuError], exc: BaseException) -> TfgpuError:
    module_name = spec.partition(":")[0]
    return error(
        f"{key}: importing module '{module_name}' (received '{spec}') failed: "
        f"{type(exc).__name__}: {_first_line(exc)}.",
        f"fix the error in '{module_name}' (run with --debug for the traceback).",
    )


def find_module(spec: str, key: str, error: type[TfgpuError]) -> None:
    """Check that the module of ``spec`` (``"package.module:function"``) can be found, without running any code.

    Wraps :func:`find_spec`: neither the module nor its parent packages are
    imported (``tfgpu plan`` runs nothing of the user's), so a package whose
    ``__init__.py`` fails or imports TensorFlow is found here and imported by
    :func:`import_function` (``tfgpu run``), which also checks the function.
    The messages are :func:`import_function`'s.

    Raises:
        ``error``: the module or a parent package cannot be found.
    """
    _importable_cwd()
    try:
        find_spec(spec.partition(":")[0])
    except (ImportError, ValueError) as exc:  # ValueError: a finder's refusal of the name
        raise _cannot_import(spec, key, error, exc) from None


def import_function(spec: str, key: str, error: type[TfgpuError], returns: str) -> Callable[..., Any]:
    """Import ``spec`` (``"package.module:function"``).

    Args:
        spec: the recipe's value.
        key: the recipe key, for messages (``model.builder``).
        error: the error class to raise (``ConfigError``, ``DataError``).
        returns: what the function must return, in words, for the fix.

    Raises:
        ``error``: the module cannot be imported, fails while importing, or has no such function.
    """
    _importable_cwd()
    module_name, _, func_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _cannot_import(spec, key, error, exc) from None
    except Exception as exc:  # the module itself fails while it is imported
        raise _import_failed(spec, key, error, exc) from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise error(
            f"{key}: module '{module_name}' has no function '{func_name}' (received '{spec}')." if func is None else
            f"{key}: '{func_name}' in module '{module_name}' is a {type(func).__name__}, not a function "
            f"(received '{spec}').",
            f"name a function that returns {returns}, as 'package.module:function'.",
        )
    return func


def keyword_arguments(func: Callable[..., Any], offered: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` plus those of ``offered`` the function takes (all of them with ``**kwargs``); ``given`` wins."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        params = {}
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in offered.items() if takes_all or k in params}
    kwargs.update(given)
    return kwargs
