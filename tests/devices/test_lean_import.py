"""tfgpu's own processes import TensorFlow and Keras without the optional packages they only probe for
(tfgpu/devices/lean_import.py): hidden from those libraries' top-level imports, real for everyone else."""

from __future__ import annotations

import json
import sys

import pytest

from tfgpu.devices import lean_import
from tests.conftest import run_python

FINDER = lean_import.HideOptionalImports()


def _asked_at_module_level(module: str, wanted: str) -> str:
    """Ask the finder for ``wanted`` from the top level of code whose ``__name__`` is ``module``, as an
    ``import`` statement there would: ``hidden`` or ``looked up`` (the next finder's turn)."""
    namespace = {"__name__": module, "finder": FINDER, "wanted": wanted}
    exec("try:\n    found = finder.find_spec(wanted) and 'spec'\n    found = 'looked up'\n"
         "except ModuleNotFoundError as exc:\n    found = 'hidden' if exc.name == wanted else repr(exc)\n",
         namespace)
    return namespace["found"]


@pytest.mark.parametrize("module", ["tensorflow", "tensorflow.lite.python.util", "keras",
                                    "keras.src.trainers.data_adapters.array_slicing"])
@pytest.mark.parametrize("wanted", ["pandas", "sklearn.base", "matplotlib.pyplot", "jax"])
def test_each_optional_package_is_hidden_from_tensorflow_and_keras_top_level(module, wanted):
    assert _asked_at_module_level(module, wanted) == "hidden"


@pytest.mark.parametrize("module", ["tfgpu.training.runner", "__main__", "mlflow", "tensorflow_datasets.core",
                                    "keras_hub.src.models", "my_recipes.builder"])
def test_every_other_importer_gets_the_real_package(module):
    assert _asked_at_module_level(module, "pandas") == "looked up"


def test_an_import_inside_a_keras_function_is_left_alone():
    namespace = {"__name__": "keras.src.utils.dataset_utils", "finder": FINDER}
    exec("def load():\n    return finder.find_spec('pandas')\n", namespace)
    assert namespace["load"]() is None


def test_keras_on_jax_gets_jax_and_only_jax(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert _asked_at_module_level("keras.src.backend.jax.core", "jax") == "looked up"
    assert _asked_at_module_level("keras.src.trainers.data_adapters.array_slicing", "pandas") == "hidden"


def test_install_is_refused_when_turned_off_or_too_late(monkeypatch):
    monkeypatch.setenv(lean_import.ENV, "0")
    assert lean_import.install() is False
    monkeypatch.setenv(lean_import.ENV, "1")
    monkeypatch.setitem(sys.modules, "keras", sys.modules.get("keras") or object())
    assert lean_import.install() is False
    assert not any(isinstance(f, lean_import.HideOptionalImports) for f in sys.meta_path)


def test_tensorflow_and_keras_start_without_the_four_and_each_still_imports_afterwards():
    """One real start, as ``tfgpu run`` makes it: the libraries take their "not installed" branches (Keras's
    array adapters know no ``DataFrame``), none of the four is loaded, and an import by anyone else after that
    gets the installed package."""
    code = ("import json, sys\nfrom tfgpu.devices import lean_import\nassert lean_import.install()\n"
            "import tensorflow, keras\nfrom keras.src.trainers.data_adapters import array_slicing\n"
            "loaded = sorted(n for n in lean_import.HIDDEN if n in sys.modules)\n"
            "import pandas, sklearn.base, matplotlib\n"
            "print(json.dumps({'loaded': loaded, 'keras_pandas': array_slicing.pandas is not None,"
            " 'dataframe': hasattr(pandas, 'DataFrame'), 'estimator': hasattr(sklearn.base, 'BaseEstimator'),"
            " 'sum': float(tensorflow.reduce_sum(tensorflow.ones([3])))}))\n")
    result = run_python(code, needs=("pandas", "sklearn", "matplotlib", "jax"))
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts == {"loaded": [], "keras_pandas": False, "dataframe": True, "estimator": True, "sum": 3.0}
