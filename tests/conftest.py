"""Shared helpers: real subprocesses for anything that configures TensorFlow, and runs trained once per session.

The suite runs on pytest-xdist workers (pyproject.toml), a test file per worker; what several files read
(a trained run, MNIST written as PNGs) is made once per session by :func:`shared`, whichever worker asks first.
"""

from __future__ import annotations

import compileall
import fcntl
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import pytest

T = TypeVar("T")

#: The most pytest-xdist workers ``-n auto`` starts: each runs TensorFlow processes of a GB or two.
MAX_WORKERS = 4
#: Seconds each of the slowest test files took in a full run on 2 cores (its tests' durations summed per file:
#: issue 33's profiled run, 37 minutes, both images built in it). The workers take them in this order, so the light
#: ones fill in at the end; files not listed come after, in order. The container tests come first, longest as they
#: are: most of their time is the image builds' wait for the package index, and started first that wait overlaps
#: the other workers' training instead of becoming the suite's tail.
HEAVY_FILES = {
    "containers/test_container.py": 590, "data/test_data_e2e.py": 735, "training/test_faults.py": 645,
    "model/test_transfer.py": 360, "launch/test_multiworker.py": 325, "test_jax.py": 305,
    "training/test_state.py": 290, "experiments/test_sweep.py": 265, "training/test_speed.py": 255,
    "model/test_schedules.py": 250, "training/test_gradients.py": 250, "cluster/test_slurm.py": 200,
    "tracking/test_mlflow.py": 205, "training/test_callbacks.py": 190, "training/test_disk_full.py": 190,
    "serving/test_predict.py": 185, "test_docs.py": 165, "model/test_backbone.py": 155, "serving/test_export.py": 125,
    "data/test_pipeline_teardown.py": 115, "cli/test_bad_input.py": 115, "training/test_e2e.py": 90,
    "launch/test_supervisor.py": 80, "data/test_class_weight.py": 75, "training/test_remat.py": 75,
    "devices/test_apply.py": 70, "data/test_augment.py": 70,
}


def pytest_configure(config: Any) -> None:
    """Compile tfgpu's bytecode once, before the workers start (in the controller only).

    An editable install writes no ``__pycache__`` of its own, and where ``PYTHONDONTWRITEBYTECODE`` is set (as on
    this machine and CI's) no process writes one either: each of the suite's few hundred ``tfgpu`` processes would
    compile tfgpu's modules from source again (0.15 s for ``tfgpu plan``, more for a run). ``compileall`` writes
    them explicitly; they stay valid until a source file changes (``.gitignore`` and ``.dockerignore`` keep them
    out of git and the image).
    """
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "tfgpu"), quiet=1)


def pytest_xdist_auto_num_workers(config: Any) -> int:
    """``-n auto``: one worker more than the cores this process may use, at most :data:`MAX_WORKERS`.

    A worker often waits on its test's processes (a run until its first epoch line before a signal, a server, a
    sweep's trials) while its core idles: on 2 cores, 3 workers ran the whole suite in 24.5 minutes, 2 workers in
    26 (one run each, issue 33; the run with 2 had 14 failures, since mended, that ended their tests early)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_WORKERS, cores + 1))


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    """The heaviest files first, in :data:`HEAVY_FILES`' order, the rest in theirs: xdist hands out whole files in
    this order, so no worker is left with a long file at the end while the others wait."""
    tests = Path(__file__).resolve().parent
    rank = {name: i for i, name in enumerate(HEAVY_FILES)}

    def weight(item: Any) -> int:
        try:
            return rank.get(Path(str(item.fspath)).resolve().relative_to(tests).as_posix(), len(rank))
        except ValueError:
            return len(rank)

    items.sort(key=weight)  # stable: within a file, and among unlisted files, the collected order stays


def shared(tmp_path_factory: Any, name: str, make: Callable[[Path], T]) -> T:
    """``make(folder)``'s value, made once per test session however many xdist workers ask.

    The first caller makes it in ``<session temp>/shared-NAME/`` under a file lock; the others wait on the lock
    and get the same value (pickled beside it). A test that changes what ``make`` wrote copies it first.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-of-USER/pytest-N: the session's, shared by its workers
    folder = base / f"shared-{name}"
    with open(base / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = folder / ".value.pickle"
        if made.exists():
            return pickle.loads(made.read_bytes())
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        value = make(folder)
        made.write_bytes(pickle.dumps(value))
        return value

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"


def data_dir() -> Path:
    """The offline data root (TFGPU_DATA_DIR, else ../shared/data beside the checkout)."""
    return Path(os.environ.get("TFGPU_DATA_DIR") or ROOT.parent / "shared" / "data").resolve()


#: The optional packages a child process cannot import unless its test names them (``needs``): the test extra
#: installs them, the base install (TensorFlow, Keras, pydantic, click, PyYAML) does not have them, and
#: TensorFlow and Keras import them when they find them (2 of the 4 CPU seconds of a TensorFlow start here).
#: ``tests/base_install/sitecustomize.py`` hides them.
OPTIONAL_IMPORTS = ("jax", "jaxlib", "matplotlib", "pandas", "pyarrow", "scipy", "sklearn")
#: What each extra's code imports of :data:`OPTIONAL_IMPORTS`, for ``needs=``.
EXTRA_IMPORTS = {"jax": ("jax", "jaxlib", "scipy"), "plots": ("matplotlib",),
                 "mlflow": ("matplotlib", "pandas", "pyarrow", "scipy", "sklearn")}  # the full mlflow's requirements
BASE_INSTALL = Path(__file__).resolve().parent / "base_install"


#: The ``XDG_CACHE_HOME`` of the processes tests start (:func:`child_env`), kept between sessions.
TEST_CACHE = Path(tempfile.gettempdir()) / f"tfgpu-test-cache-{os.getuid()}"


def child_env(*, needs: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """The environment of a process a test starts: no tfgpu, CUDA, TF, Keras, XLA or JAX variable of this
    process, the offline data root, and the base install's imports (:data:`OPTIONAL_IMPORTS` hidden except
    those of the extras in ``needs``, a key of :data:`EXTRA_IMPORTS` or a package name). ``extra`` is set last;
    a PYTHONPATH in it comes after the hiding folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFGPU_", "CUDA_", "TF_", "KERAS_", "XLA_", "JAX_"))}
    env["TFGPU_DATA_DIR"] = str(data_dir())
    env["PYTHONUNBUFFERED"] = "1"
    env["XDG_CACHE_HOME"] = str(TEST_CACHE)  # tfgpu's caches (the CPU's matmul peak): not the user's ~/.cache
    env.update(extra)
    visible = {name for need in needs for name in EXTRA_IMPORTS.get(need, (need,))}
    env["BASE_INSTALL_HIDES"] = ",".join(name for name in OPTIONAL_IMPORTS if name not in visible)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BASE_INSTALL), env.get("PYTHONPATH")]))
    return env


#: Appended to each :func:`run_python` snippet: the ``gc.freeze()`` the ``tfgpu`` command line does at its end
#: (tfgpu/cli/main.py), sparing the interpreter's shutdown a walk over TensorFlow's objects (0.8 CPU seconds).
FREEZE_AT_EXIT = "\nimport gc as _gc\n_gc.freeze()\n"


def run_python(code: str, timeout: int = 300, needs: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess:
    """Run a Python snippet in a fresh interpreter (TensorFlow is configured once per process)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code) + FREEZE_AT_EXIT], capture_output=True,
                          text=True, timeout=timeout, env=child_env(needs=needs, **env), cwd=ROOT)


def run_cli(*args: str, cwd: Path = ROOT, timeout: int = 600, needs: tuple[str, ...] = (),
            **env: str) -> subprocess.CompletedProcess:
    """Run ``tfgpu ARGS`` as a user would, in a subprocess (``needs``: as :func:`child_env`'s)."""
    return subprocess.run([sys.executable, "-m", "tfgpu.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=child_env(needs=needs, **env), cwd=cwd)


def signal_when(folder: Path, pattern: str, *args: str, signum: int = signal.SIGTERM,
                timeout: int = 240) -> tuple[int, str]:
    """Start ``tfgpu ARGS``, send it ``signum`` as soon as ``folder`` holds a file matching ``pattern`` (a temporary
    file it writes), and wait for it to end: ``(exit code, stderr)``."""
    # SIGINT as a terminal's Ctrl-C reaches a process: with its default action (an xdist worker ignores it, and a
    # child would inherit that)
    process = subprocess.Popen([sys.executable, "-m", "tfgpu.cli", *args], cwd=ROOT, env=child_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + timeout
    while not list(folder.glob(pattern)) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(folder.glob(pattern)), f"{pattern} never appeared in {folder}: {process.communicate()[1][-2000:]}"
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr


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

    Shared by the files that only read such a run (test_e2e, test_speed, test_state, test_multiworker), so the
    suite trains these runs once.
    """
    def make(folder: Path) -> dict:
        out = {}
        for loop in ("fit", "custom"):
            parent = folder / loop
            result = run_cli("run", "recipes/mnist.yaml", *TWO_REPLICAS, "--set", f"train.loop={loop}",
                             "--output-dir", str(parent))
            assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-4000:]}"
            out[loop] = (result, only_run_dir(parent))
        return out

    return shared(tmp_path_factory, "two_replica_runs", make)


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

    return shared(tmp_path_factory, "mnist_png", write_png_folder)


def _python_writes(function: str) -> Callable[[Path], Path]:
    """A :func:`shared` maker: ``recipes.make_examples.FUNCTION(folder)`` run in a fresh interpreter (it imports
    TensorFlow)."""
    def make(out: Path) -> Path:
        result = run_python(f"""
            from pathlib import Path
            from recipes.make_examples import {function}
            {function}(Path({str(out)!r}){", shards=8" if function == "write_tfrecords" else ""})
        """, TF_CPP_MIN_LOG_LEVEL="3")
        assert result.returncode == 0, result.stderr[-3000:]
        return out
    return make


@pytest.fixture(scope="session")
def mnist_tfrecord(tmp_path_factory) -> Path:
    """The real offline MNIST as 8 TFRecord shards per split (PNG-encoded ``image``, int64 ``label``)."""
    return shared(tmp_path_factory, "mnist_tfrecord", _python_writes("write_tfrecords"))


@pytest.fixture(scope="session")
def mnist_tfds(tmp_path_factory) -> Path:
    """The real offline MNIST as a prepared TFDS dataset ``tfgpu_mnist`` in the returned data_dir."""
    return shared(tmp_path_factory, "mnist_tfds", _python_writes("write_tfds"))


def write_mnist_subset(folder: Path, train: int, test: int) -> Path:
    """A data folder (for TFGPU_DATA_DIR) whose ``mnist/mnist.npz`` holds the first ``train`` training and ``test``
    test digits of the real one (:func:`data_dir`), in the same layout: for tests that check what a run does
    (its resume, its signals, a script), not how far the full data takes it."""
    import numpy as np  # noqa: PLC0415

    (folder / "mnist").mkdir(parents=True, exist_ok=True)
    with np.load(data_dir() / "mnist" / "mnist.npz") as full:
        np.savez(folder / "mnist" / "mnist.npz", x_train=full["x_train"][:train], y_train=full["y_train"][:train],
                 x_test=full["x_test"][:test], y_test=full["y_test"][:test])
    return folder


#: Training and test digits in :func:`small_mnist`: 15 steps an epoch at 512 per replica, 8 at 1,024.
SMALL_MNIST = (7680, 2000)


def small_steps(batch: int) -> int:
    """Steps in an epoch of :func:`small_mnist` at ``batch`` per replica (one replica; the last batch partial)."""
    return -(-SMALL_MNIST[0] // batch)


@pytest.fixture(scope="session")
def small_mnist(tmp_path_factory) -> Path:
    """A data folder (for TFGPU_DATA_DIR) with the first 7,680 training and 2,000 test digits of the real MNIST
    (:func:`write_mnist_subset`), shared by the session."""
    return shared(tmp_path_factory, "small_mnist", lambda out: write_mnist_subset(out, *SMALL_MNIST))


#: MNIST images per split in :func:`small_png` (the serving tests' PNG folder).
SMALL_PNG = 1000


@pytest.fixture(scope="session")
def small_png(tmp_path_factory) -> Path:
    """1,000 + 1,000 real MNIST digits as PNGs: ``<dir>/{train,test}/<digit>/<n>.png`` (Pillow, no TensorFlow)."""
    from recipes.make_examples import write_png_folder  # noqa: PLC0415

    return shared(tmp_path_factory, "small_png", lambda out: write_png_folder(out, SMALL_PNG))


def _trained(*args: str) -> Callable[[Path], Path]:
    """A :func:`shared` maker: ``tfgpu run ARGS`` into the folder; the run directory."""
    def make(folder: Path) -> Path:
        result = run_cli("run", *args, "--output-dir", str(folder))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return only_run_dir(folder)
    return make


@pytest.fixture(scope="session")
def image_run(tmp_path_factory, small_png) -> Path:
    """The image-folder recipe, 1 epoch on :func:`small_png`'s training digits, its test digits the validation
    folder. Shared by the files that read a finished run (predict, export): one that writes into it copies it
    first (:func:`copy_run`)."""
    return shared(tmp_path_factory, "image_run", _trained(
        "recipes/mnist_images.yaml", "--set", f"data.path={small_png / 'train'}",
        "--set", f"data.validation_path={small_png / 'test'}", "--set", "data.validation_split=null",
        "--set", "data.test_path=null", "--set", "train.epochs=1", "--set", "train.batch_size_per_replica=64"))


@pytest.fixture(scope="session")
def breast_run(tmp_path_factory) -> Path:
    """The breast-cancer recipe, 5 epochs (a real CSV run), shared like :func:`image_run`."""
    return shared(tmp_path_factory, "breast_run", _trained("recipes/breast_cancer.yaml", "--set", "train.epochs=5"))


def copy_run(run_dir: Path, parent: Path) -> Path:
    """A copy of a shared run directory under ``parent`` (same name), for a test that writes into it."""
    target = parent / run_dir.name
    shutil.copytree(run_dir, target)
    return target
