"""``"package.module:function"`` names in a recipe (``model.builder``, ``data.builder``) -> the function.

The current directory is importable, as with ``python -m``: the ``tfgpu``
console script does not put it on ``sys.path`` itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable

from ..errors import TfgpuError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0].rstrip(".") if text else "") or type(exc).__name__


def importable(name: str) -> bool:
    """Whether the module ``name`` can be imported in this process, looked up with
    :func:`importlib.util.find_spec` without importing it (``False`` where it is not installed, a parent
    package is missing, or an import hook blocks it: ``sys.modules[name] = None``)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def package_folders(name: str) -> list[Path]:
    """The folders of the installed package ``name``, found by :func:`importlib.util.find_spec`
    without importing it (``[]``: not installed, or not a package)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(folder) for folder in spec.submodule_search_locations]


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
    """Check that the module of ``spec`` (``"package.module:function"``) can be found, without importing it.

    :func:`importlib.util.find_spec` imports the parent packages of a dotted
    name (as Python must, to search them), not the module itself, so a module
    that imports TensorFlow is not run; whether it has the function is left to
    :func:`import_function`. The messages are :func:`import_function`'s.

    Raises:
        ``error``: the module cannot be found (or a parent package fails while it is imported).
    """
    _importable_cwd()
    module_name = spec.partition(":")[0]
    try:
        found = importlib.util.find_spec(module_name)
    except ImportError as exc:
        raise _cannot_import(spec, key, error, exc) from None
    except Exception as exc:  # a parent package fails while it is imported
        raise _import_failed(spec, key, error, exc) from exc
    if found is None:
        raise _cannot_import(spec, key, error, ModuleNotFoundError(f"No module named '{module_name}'"))


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
