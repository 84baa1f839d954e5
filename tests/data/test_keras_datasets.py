"""The Keras built-ins from every supported layout, and every way their files can be wrong (no TensorFlow)."""

from __future__ import annotations

import gzip
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from tfgpu.config import load_config
from tfgpu.data import LoadContext, source_for
from tfgpu.data.keras_datasets import IDX_FILES, read_idx
from tfgpu.errors import DataError

from ..conftest import run_python


def load_arrays(name: str = "mnist", path: str | None = None, **data):
    """The Keras source for ``data: {name, path, ...}``, checked and loaded (in memory: no TensorFlow)."""
    cfg = load_config({"data": {"kind": "mnist" if name == "mnist" else "keras", "name": name, "path": path, **data}})
    source = source_for(cfg.data, cfg.model.loss, cfg.tensorflow.seed)
    source.check()
    return source.load(LoadContext(global_batch_size=32, num_replicas=1))


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape) + array.tobytes()


def make_idx_dir(directory: Path, n_train: int = 12, n_test: int = 5, gz: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "y_train": rng.integers(0, 10, n_train, dtype=np.uint8),
        "x_test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "y_test": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for key, (stem, magic) in IDX_FILES.items():
        raw = idx_bytes(arrays[key], magic)
        (directory / (stem + ".gz" if gz else stem)).write_bytes(gzip.compress(raw) if gz else raw)
    return arrays


def test_shared_mnist_is_read_with_counts_from_the_headers(mnist_dir):
    data = load_arrays("mnist", str(mnist_dir / "idx"))
    assert data.train.x.shape == (22699, 28, 28) and data.train.x.dtype == np.uint8
    assert data.train.y.shape == (22699,) and data.validation.x.shape == (10000, 28, 28)
    assert data.validation_is_test and data.test is None  # without validation_split, the test split validates
    assert data.spec.num_classes == 10 and data.spec.input_shape == (28, 28, 1)
    assert data.spec.rescale == pytest.approx(1 / 255) and data.spec.task == "classification"
    npz = load_arrays("mnist", str(mnist_dir / "mnist.npz"))
    assert np.array_equal(npz.train.x, data.train.x) and np.array_equal(npz.validation.y, data.validation.y)


def test_tfgpu_data_dir_points_at_the_dataset_folder(monkeypatch, mnist_dir):
    monkeypatch.setenv("TFGPU_DATA_DIR", str(mnist_dir.parent))
    data = load_arrays("mnist")
    assert len(data.train.x) == 22699 and data.spec.source.endswith("mnist.npz")


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("sub", ["", "idx", "mnist", "mnist/idx"])
def test_idx_layouts(tmp_path, gz, sub):
    arrays = make_idx_dir(tmp_path / sub if sub else tmp_path, gz=gz)
    data = load_arrays("mnist", str(tmp_path))
    assert np.array_equal(data.train.x, arrays["x_train"]) and np.array_equal(data.validation.y, arrays["y_test"])


def test_npz_in_a_directory(tmp_path):
    arrays = make_idx_dir(tmp_path / "scratch")
    np.savez(tmp_path / "mnist.npz", **arrays)
    assert len(load_arrays("mnist", str(tmp_path)).train.x) == 12


def test_missing_path(tmp_path):
    with pytest.raises(DataError, match="does not exist") as info:
        load_arrays("mnist", str(tmp_path / "nowhere"))
    assert info.value.exit_code == 5


def test_directory_without_data(tmp_path):
    with pytest.raises(DataError, match="holds neither mnist.npz nor the four IDX files"):
        load_arrays("mnist", str(tmp_path))


def test_data_dir_without_the_dataset_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TFGPU_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match="there is no 'mnist' folder"):
        load_arrays("mnist")


def test_wrong_magic_number(tmp_path):
    make_idx_dir(tmp_path)
    images = tmp_path / "train-images-idx3-ubyte.gz"
    labels = tmp_path / "train-labels-idx1-ubyte.gz"
    swapped = tmp_path / "swap"
    shutil.move(images, swapped)
    shutil.move(labels, images)
    shutil.move(swapped, labels)
    with pytest.raises(DataError, match="magic number 2049; images files have 2051"):
        load_arrays("mnist", str(tmp_path))


def test_truncated_file(tmp_path):
    make_idx_dir(tmp_path, gz=False)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="holds 3820 data bytes, but its header .* needs 3920"):
        read_idx(path, 2051)


def test_count_mismatch(tmp_path):
    make_idx_dir(tmp_path)
    labels = np.zeros(11, dtype=np.uint8)
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(labels, 2049)))
    with pytest.raises(DataError, match="12 train images but 11 train labels"):
        load_arrays("mnist", str(tmp_path))


def test_partial_idx_set(tmp_path):
    make_idx_dir(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="not t10k-labels-idx1-ubyte"):
        load_arrays("mnist", str(tmp_path))


def test_npz_missing_arrays_and_garbage(tmp_path):
    np.savez(tmp_path / "bad.npz", x_train=np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(DataError, match="lacks the array"):
        load_arrays("mnist", str(tmp_path / "bad.npz"))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="cannot read .* as a .npz file"):
        load_arrays("mnist", str(tmp_path / "junk.npz"))


def test_corrupt_gzip(tmp_path):
    make_idx_dir(tmp_path)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b broken")
    with pytest.raises(DataError, match="cannot read IDX file"):
        load_arrays("mnist", str(tmp_path))


def test_data_dir_not_mounted_in_a_container_names_the_mount(tmp_path, monkeypatch):
    """In a container (told, not detected: this host is none), an empty or missing $TFGPU_DATA_DIR is a missing
    ``-v HOST_DIR:/data``; the message says so and shows the mount. tests/containers/test_container.py sees it for real."""
    from tfgpu.data.base import unmounted_data  # noqa: PLC0415

    root = tmp_path / "data"
    monkeypatch.setenv("TFGPU_DATA_DIR", str(root))
    what, fix = unmounted_data(root / "mnist", container=True)
    assert f"{root} does not exist" in what and "mounted" in what
    assert f"docker run -v /path/to/data:{root}:ro" in fix and "mnist/" in fix
    root.mkdir()
    what, _ = unmounted_data(root / "breast_cancer" / "breast_cancer.csv", container=True)
    assert f"{root} is empty" in what
    assert unmounted_data(root / "mnist", container=False) is None          # not a container: the usual message
    assert unmounted_data(tmp_path / "elsewhere", container=True) is None   # not under TFGPU_DATA_DIR
    (root / "cifar10").mkdir()
    assert unmounted_data(root / "mnist", container=True) is None           # something is mounted: the usual message


def _outcome(path: Path, keep: bool) -> str:
    """What checking ``data: {kind: mnist, path}`` gives: ``ok`` or the error (``keep=False``: as ``tfgpu plan``)."""
    cfg = load_config({"data": {"kind": "mnist", "path": str(path)}})
    try:
        source_for(cfg.data).check(keep)
    except DataError as exc:
        return f"DataError: {exc}"
    return "ok"


def _header_path_decides(path: Path) -> bool:
    """Whether ``tfgpu plan``'s check decided on the images' headers and the labels' bytes alone (no NumPy)."""
    from tfgpu.data.keras_datasets import load_keras_dataset  # noqa: PLC0415

    try:
        return bool(load_keras_dataset("mnist", str(path), headers=True)[0])
    except DataError:
        return True


def _corrupt(arrays: dict[str, np.ndarray], how: str) -> dict[str, np.ndarray]:
    a = dict(arrays)
    if how == "label_10":
        a["y_test"] = a["y_test"].copy()
        a["y_test"][3] = 10
    elif how == "counts":
        a["y_train"] = a["y_train"][:-1]
    elif how == "flat_images":
        a["x_train"] = a["x_train"].reshape(len(a["x_train"]), -1)
    elif how == "empty_test":
        a["x_test"], a["y_test"] = a["x_test"][:0], a["y_test"][:0]
    elif how == "test_shape":
        a["x_test"] = np.zeros((5, 14, 14), np.uint8)
    elif how == "float_pixels":
        a["x_train"] = a["x_train"].astype(np.float32) / 255
    elif how == "int64_labels":
        a["y_train"] = a["y_train"].astype(np.int64)
    return a


CORRUPTIONS = ["none", "label_10", "counts", "flat_images", "empty_test", "test_shape", "float_pixels", "int64_labels"]


@pytest.mark.parametrize("layout, how", [(layout, how) for layout in ("npz", "idx", "idx_gz") for how in CORRUPTIONS
                                         if layout == "npz" or how not in ("float_pixels", "int64_labels")])
def test_plans_check_refuses_what_runs_check_refuses_in_the_same_words(tmp_path, layout, how):
    """``tfgpu plan`` (``check(keep=False)``) checks uint8 built-ins from the images' headers and the labels'
    bytes, without NumPy; a file those cannot judge (another type, ``.gz``, a header that does not fit the
    size) is read whole. Either way: the outcome of ``tfgpu run``'s check, word for word."""
    arrays = _corrupt(make_idx_dir(tmp_path / "scratch", gz=False), how)
    if layout == "npz":
        np.savez(tmp_path / "mnist.npz", **arrays)
    else:  # (IDX files hold uint8 only)
        for key, (stem, magic) in IDX_FILES.items():
            raw = idx_bytes(arrays[key], magic)
            name = stem + (".gz" if layout == "idx_gz" else "")
            (tmp_path / name).write_bytes(gzip.compress(raw) if layout == "idx_gz" else raw)
    full, planned = _outcome(tmp_path, keep=True), _outcome(tmp_path, keep=False)
    assert planned == full
    assert (full == "ok") == (how in ("none", "int64_labels")), full
    uint8 = how not in ("float_pixels", "int64_labels", "flat_images") or (layout == "npz" and how == "flat_images")
    assert _header_path_decides(tmp_path) == (layout != "idx_gz" and uint8)


def test_a_truncated_idx_file_is_read_whole_for_its_message(tmp_path):
    make_idx_dir(tmp_path, gz=False)
    labels = tmp_path / IDX_FILES["y_train"][0]
    labels.write_bytes(labels.read_bytes()[:-2])
    assert not _header_path_decides(tmp_path)
    assert "holds 10 data bytes, but its header (12) needs 12" in _outcome(tmp_path, keep=False)


def test_plan_of_the_seed_recipe_checks_mnist_without_numpy():
    result = run_python("""
        import sys
        from click.testing import CliRunner
        from tfgpu.cli import main
        got = CliRunner().invoke(main, ["plan", "recipes/mnist.yaml"])
        print(got.exit_code, "numpy" in sys.modules, "tensorflow" in sys.modules)
    """)
    assert result.stdout.split() == ["0", "False", "False"], result.stdout + result.stderr[-2000:]
