"""Shared helpers: real subprocesses for anything that configures TensorFlow."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"


def data_dir() -> Path:
    """The offline data root (TFGPU_DATA_DIR, else ../shared/data beside the checkout)."""
    return Path(os.environ.get("TFGPU_DATA_DIR") or ROOT.parent / "shared" / "data").resolve()


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFGPU_", "CUDA_", "TF_", "KERAS_", "XLA_", "JAX_"))}
    env["TFGPU_DATA_DIR"] = str(data_dir())
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_python(code: str, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    """Run a Python snippet in a fresh interpreter (TensorFlow is configured once per process)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=child_env(**env), cwd=ROOT)


def run_cli(*args: str, cwd: Path = ROOT, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    """Run ``tfgpu ARGS`` as a user would, in a subprocess."""
    return subprocess.run([sys.executable, "-m", "tfgpu.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=child_env(**env), cwd=cwd)


def one_paragraph(text: str) -> None:
    """A message a user can read at once: not empty, no blank line, no traceback."""
    assert text.strip(), "empty message"
    assert "\n\n" not in text.strip(), f"more than one paragraph:\n{text}"
    assert "Traceback (most recent call last)" not in text, text


def recipe_with(tmp_path: Path, name: str, section: str, **values) -> Path:
    """``recipes/<name>`` with ``values`` set in its ``section``, written to ``tmp_path/recipe.yaml``."""
    import yaml  # noqa: PLC0415

    cfg = yaml.safe_load((RECIPES / name).read_text())
    cfg.setdefault(section, {}).update(values)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def only_run_dir(parent: Path) -> Path:
    dirs = [p for p in parent.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


TWO_REPLICAS = ["--set", "devices.cpu_logical_devices=2", "--set", "train.epochs=2",
                "--set", "train.batch_size_per_replica=128"]


@pytest.fixture(scope="session")
def two_replica_runs(tmp_path_factory):
    """One real 2-replica run per loop (128 per replica, 2 epochs): ``{loop: (result, run_dir)}``.

    Shared by test_e2e.py and test_speed.py, so the suite trains these runs once.
    """
    out = {}
    for loop in ("fit", "custom"):
        parent = tmp_path_factory.mktemp(loop)
        result = run_cli("run", "recipes/mnist.yaml", *TWO_REPLICAS, "--set", f"train.loop={loop}",
                         "--output-dir", str(parent))
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-4000:]}"
        out[loop] = (result, only_run_dir(parent))
    return out


@pytest.fixture
def mnist_dir() -> Path:
    path = data_dir() / "mnist"
    if not path.is_dir():
        pytest.fail(f"MNIST is not at {path}; set TFGPU_DATA_DIR (CI sets it to ../shared/data)")
    return path


@pytest.fixture(autouse=True)
def _no_env_leak():
    """Fail any test that leaves an environment variable changed."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {k for k in before.keys() | after.keys()
               if before.get(k) != after.get(k) and k != "PYTEST_CURRENT_TEST"}
    assert not changed, f"test leaked environment changes: {sorted(changed)}"


@pytest.fixture(scope="session")
def mnist_png(tmp_path_factory) -> Path:
    """The real offline MNIST as a PNG class folder: ``<dir>/{train,test}/<digit>/<n>.png`` (Pillow, no TensorFlow)."""
    from recipes.make_examples import write_png_folder  # noqa: PLC0415

    return write_png_folder(tmp_path_factory.mktemp("mnist_png"))


@pytest.fixture(scope="session")
def mnist_tfrecord(tmp_path_factory) -> Path:
    """The real offline MNIST as 8 TFRecord shards per split (PNG-encoded ``image``, int64 ``label``)."""
    out = tmp_path_factory.mktemp("mnist_tfrecord")
    result = run_python(f"""
        from pathlib import Path
        from recipes.make_examples import write_tfrecords
        write_tfrecords(Path({str(out)!r}), shards=8)
    """, TF_CPP_MIN_LOG_LEVEL="3")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def mnist_tfds(tmp_path_factory) -> Path:
    """The real offline MNIST as a prepared TFDS dataset ``tfgpu_mnist`` in the returned data_dir."""
    out = tmp_path_factory.mktemp("tensorflow_datasets")
    result = run_python(f"""
        from pathlib import Path
        from recipes.make_examples import write_tfds
        write_tfds(Path({str(out)!r}))
    """, TF_CPP_MIN_LOG_LEVEL="3")
    assert result.returncode == 0, result.stderr[-3000:]
    return out
