"""TensorFlow and Keras imported without the optional packages they only probe for, in tfgpu's own processes.

On import, TensorFlow 2.21 and Keras 3 try a few packages that tfgpu never uses through them, and import
each one that is installed: pandas (Keras's array adapters accept a ``DataFrame``), scikit-learn
(``keras.wrappers``), matplotlib (``keras.visualization``) and JAX (``tf.lite``'s JAX converter, which
``import tensorflow`` loads through ``tf.compat.v1``). In an environment that has all four (any with
``tfgpu[test]``, most data-science images) that is about half the CPU time of ``import tensorflow, keras``:
10.3 against 5.3 CPU seconds here (2 cores, median of 3), paid by every ``tfgpu run``, ``evaluate``,
``predict``, worker and device probe before its first step.

:func:`install` adds a :data:`sys.meta_path` finder (https://docs.python.org/3/reference/import.html#the-meta-path)
to tfgpu's own command-line processes: an ``import`` of one of :data:`HIDDEN` *written at module level in a
``tensorflow`` or ``keras`` module* finds nothing, as if the package were not installed, so each library
takes its documented "not installed" branch. Every other importer (tfgpu, MLflow, a recipe's
``model.builder``, a callback) gets the real package, and a package already imported is never hidden. On
``backend: jax`` (``KERAS_BACKEND=jax``) JAX is Keras's backend and is not hidden. ``tfgpu.setup()`` in a
user's own script never installs it: such a script may hand Keras a ``DataFrame``. ``TFGPU_LEAN_IMPORT=0``
turns it off (a builder that uses ``keras.wrappers`` or ``keras.visualization``).
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from typing import Any, Optional

#: The optional packages hidden from TensorFlow's and Keras's module-level imports.
HIDDEN = frozenset({"pandas", "sklearn", "matplotlib", "jax"})

#: The importers they are hidden from (a module named so, or inside one of these packages).
IMPORTERS = ("tensorflow", "keras")

#: ``TFGPU_LEAN_IMPORT=0``: hide nothing.
ENV = "TFGPU_LEAN_IMPORT"

#: Frames of the import machinery itself, skipped to find the module whose ``import`` statement asked.
_MACHINERY = ("importlib", "_frozen_importlib", "_frozen_importlib_external")


def _importer(frame: Any) -> Optional[Any]:
    """The first frame outside the import machinery, walking out from ``frame``."""
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _MACHINERY:
        frame = frame.f_back
    return frame


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


class HideOptionalImports(importlib.abc.MetaPathFinder):
    """The :data:`sys.meta_path` finder :func:`install` adds; see the module's docstring."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        """Raise :class:`ModuleNotFoundError` for a hidden package asked for by a TensorFlow/Keras module's
        top level; ``None`` (let the next finder look) for everything else."""
        top = fullname.partition(".")[0]
        if top not in HIDDEN or (top == "jax" and os.environ.get("KERAS_BACKEND") == "jax"):
            return None
        frame = _importer(sys._getframe(1))
        if frame is None or frame.f_code.co_name != "<module>" or not _within(frame.f_globals.get("__name__", ""),
                                                                              IMPORTERS):
            return None
        raise ModuleNotFoundError(f"No module named {fullname!r} (hidden by tfgpu from {IMPORTERS[0]}/"
                                  f"{IMPORTERS[1]}'s start-up; {ENV}=0 shows it)", name=fullname)


def install() -> bool:
    """Add the finder to :data:`sys.meta_path` (first), once; ``False`` when ``TFGPU_LEAN_IMPORT=0`` or
    TensorFlow/Keras is already imported (too late to save anything)."""
    if os.environ.get(ENV, "1") == "0" or any(name in sys.modules for name in IMPORTERS):
        return False
    if not any(isinstance(finder, HideOptionalImports) for finder in sys.meta_path):
        sys.meta_path.insert(0, HideOptionalImports())
    return True
