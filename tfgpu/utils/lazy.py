"""A module imported where it is first used, not where it is named: ``from ..utils.lazy import numpy as np``.

``tfgpu plan`` imports the data sources to check a recipe's files and, where their headers say
enough, reads only the headers (:meth:`tfgpu.data.base.Source.check` with ``values=False``): NumPy's
import alone (0.1-0.2 s) would be most of its time. The data modules name NumPy through
:data:`numpy`, which imports it on the first attribute read and from then on holds its attributes,
so later reads cost what a plain module's do. Nothing is put in ``sys.modules``: other code that
imports NumPy gets NumPy itself.
"""

from __future__ import annotations

import importlib
import types
from typing import Any


class LazyModule(types.ModuleType):
    """A stand-in for the module ``name`` that imports it on the first attribute read."""

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self.__name__)
        self.__dict__.update(vars(module))  # later reads find the attribute without coming here
        return getattr(module, attr)


#: NumPy, imported on first use.
numpy = LazyModule("numpy")
