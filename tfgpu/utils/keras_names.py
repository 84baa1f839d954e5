"""The names Keras exports, read from its package files without importing Keras (or TensorFlow).

``import keras`` imports its backend (TensorFlow: seconds), so ``tfgpu plan``
cannot ask the modules which layers, optimizers, losses and metrics exist. Keras 3
generates one ``__init__.py`` per public package (``keras/layers/__init__.py``,
...) made of ``from keras.src.<module> import Name as Name`` lines; this module
finds the installed package with :func:`importlib.util.find_spec` (which does not
import it) and reads those lines with :mod:`ast`. :func:`name_table`
turns the class names into the spellings a recipe may use; ``tests/training/test_preflight.py``
checks in a process that imports Keras that they equal the imported modules' classes.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Iterable, Optional

from .imports import package_folders

#: kind -> (Keras package, its base class): the classes of a kind are the package's exported subclasses of the base.
KINDS = {
    "layer": ("keras.layers", "Layer"),
    "optimizer": ("keras.optimizers", "Optimizer"),
    "loss": ("keras.losses", "Loss"),
    "metric": ("keras.metrics", "Metric"),
    "schedule": ("keras.optimizers.schedules", "LearningRateSchedule"),
    "callback": ("keras.callbacks", "Callback"),
    "application": ("keras.applications", "Model"),  # functions returning a keras.Model (ResNet50, ...)
}

#: Capitalised names the packages export that are not subclasses of the kind's base (Keras 3.15): a function
#: (``keras.layers.Input``) and helper classes. ``tests/training/test_preflight.py`` keeps this list true.
NOT_SUBCLASSES = frozenset({"Input", "InputSpec", "OptimizerMap"})


@functools.lru_cache(maxsize=None)
def keras_root() -> Optional[Path]:
    """The installed ``keras`` package's folder (found, not imported), or ``None`` where there is none."""
    folders = package_folders("keras")
    return folders[0] if folders else None


@functools.lru_cache(maxsize=None)
def exported(package: str) -> Optional[dict[str, str]]:
    """The names a Keras package's generated ``__init__.py`` exports: ``{name: "keras.src.module"}``.

    Args:
        package: ``"keras.layers"``, ``"keras.optimizers.schedules"``, ...

    Returns:
        Each exported name (``as`` name) with the module it comes from, or
        ``None`` where Keras or the file is missing or cannot be parsed (then
        the names are not checked before TensorFlow starts).
    """
    root = keras_root()
    if root is None:
        return None
    init = root.joinpath(*package.split(".")[1:], "__init__.py")
    try:
        tree = ast.parse(init.read_text(encoding="utf-8"), str(init))
    except (OSError, SyntaxError, ValueError):
        return None
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = node.module
    return names or None


def class_names(kind: str) -> Optional[list[str]]:
    """The class names of ``kind`` (``"layer"``, ``"optimizer"``, ``"loss"``, ``"metric"``, ``"schedule"``,
    ``"callback"``, ``"application"``) that Keras exports, sorted; ``None`` where they cannot be read (:func:`exported`).

    A class is an exported capitalised name other than the base class itself and
    :data:`NOT_SUBCLASSES`; lower-case names are Keras's functions (``keras.losses.mse``).
    """
    package, base = KINDS[kind]
    names = exported(package)
    if names is None:
        return None
    return sorted(n for n, module in names.items()
                  if n[:1].isupper() and n != base and n not in NOT_SUBCLASSES and module.startswith("keras.src"))


def snake(name: str) -> str:
    """``CosineDecay`` -> ``cosine_decay``, ``SGD`` -> ``sgd``: Keras's snake_case form of a class name."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def name_table(kind: str, classes: Iterable[str]) -> dict[str, str]:
    """The spellings a recipe may use for the Keras classes of ``kind`` -> the class's exported name.

    Layers: the class names only (``Conv2D``). Optimizers, losses, metrics: also
    the lower-case and snake_case forms (``adam``, ``sparse_categorical_crossentropy``);
    the first class (in sorted order) keeps a form two classes share. Both the
    check before TensorFlow starts (:func:`tfgpu.model.keras_model.check_names`, with the names read from
    Keras's files: :func:`class_names`) and the build (:func:`tfgpu.model.keras_model.imported_names`,
    with the imported modules) use this table, so they accept and refuse the same names.
    """
    table: dict[str, str] = {}
    for attr in sorted(classes):
        table[attr] = attr
        if kind != "layer":
            table.setdefault(attr.lower(), attr)
            table.setdefault(snake(attr), attr)
    return table
