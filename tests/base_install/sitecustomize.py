"""The suite's subprocesses see tfgpu's base install: the optional packages named in BASE_INSTALL_HIDES are hidden.

``tests/conftest.py:child_env`` puts this folder first on PYTHONPATH of every ``tfgpu`` and Python process a test
starts, with ``BASE_INSTALL_HIDES`` naming the top-level packages the test extra installs but the base install
(``pip install tfgpu``: TensorFlow, Keras, pydantic, click, PyYAML) lacks. Importing one of them then fails as
it would on a user's machine without the extra, which checks two things at once:

- a core command (``run``, ``evaluate``, ``predict``, ``plan``, ...) that starts importing one of these
  packages fails its tests, as it would fail for a user without the extra;
- TensorFlow's and Keras's own optional imports (scikit-learn for ``keras.wrappers``, pandas for Keras's data
  adapters, matplotlib for ``keras.visualization``, JAX for ``tf.lite``, SciPy for TensorFlow's legacy Keras)
  are skipped as on that machine: about 2 of the 4 CPU seconds of each TensorFlow start here.

A test whose process needs one of them (Keras on JAX, ``compare --plot``, the MLflow server) names its extra in
``child_env(needs=...)``, which leaves those visible. Only their import is hidden: their distributions
stay listed by ``importlib.metadata`` (after ``pip uninstall`` they would not be), so a check that reads
versions is tested with the extra visible.
"""
import importlib.machinery
import os
import sys

_HIDDEN = frozenset(filter(None, os.environ.get("BASE_INSTALL_HIDES", "").split(",")))


class _BaseInstallPathFinder(importlib.machinery.PathFinder):
    """sys.meta_path's PathFinder, blind to the hidden top-level packages: ``import`` raises ModuleNotFoundError
    and :func:`importlib.util.find_spec` returns None, as where they are not installed. The rest is PathFinder's
    (``find_distributions`` among it: ``importlib.metadata`` sees every distribution)."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if path is None and fullname in _HIDDEN:
            return None
        return super().find_spec(fullname, path, target)


if _HIDDEN:
    sys.meta_path[:] = [_BaseInstallPathFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
