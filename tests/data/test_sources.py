"""Each data source's check and load, in process and without TensorFlow: what a user's files become.

Real data where it exists (the offline MNIST and breast cancer table, written out in other
layouts here); small made-up files only for layouts this machine has no real copy of
(CIFAR's pickles). Training on each source is in test_data_e2e.py.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from PIL import Image

from tfgpu.config import load_config
from tfgpu.data import LoadContext, source_for
from tfgpu.data.base import holdout
from tfgpu.data.pipeline import choose_sharding, decoded_bytes, transform_numpy
from tfgpu.errors import DataError
from tfgpu.model.keras_model import target_of

from ..conftest import data_dir, run_python


def load(data: dict, model: dict | None = None, check_only: bool = False):
    """``data:`` (and ``model:``) -> the checked source, or its loaded Data (in-memory sources need no TensorFlow)."""
    cfg = load_config({"data": data, **({"model": model} if model else {})})
    source = source_for(cfg.data, cfg.model.loss, cfg.tensorflow.seed)
    source.check()
    return source if check_only else source.load(LoadContext(global_batch_size=32, num_replicas=1))


def png(path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


# --------------------------------------------------------------------------- keras built-ins


def test_mnist_validation_split_is_seeded_and_keeps_the_test_split(mnist_dir):
    a = load({"path": str(mnist_dir / "mnist.npz"), "validation_split": 0.1, "seed": 7})
    b = load({"path": str(mnist_dir / "mnist.npz"), "validation_split": 0.1, "seed": 7})
    c = load({"path": str(mnist_dir / "mnist.npz"), "validation_split": 0.1, "seed": 8})
    assert (a.train.size, a.validation.size, a.test.size) == (22699 - 2270, 2270, 10000)
    assert not a.validation_is_test
    assert np.array_equal(a.validation.y, b.validation.y) and np.array_equal(a.validation.x, b.validation.x)
    assert not np.array_equal(a.validation.x, c.validation.x)  # another seed, other samples
    # the held-out samples are exactly the ones missing from training
    full = load({"path": str(mnist_dir / "mnist.npz")}).train.x
    assert len(np.unique(np.concatenate([a.train.x, a.validation.x]).reshape(len(full), -1), axis=0)) == \
        len(np.unique(full.reshape(len(full), -1), axis=0))


def test_holdout_is_deterministic_and_disjoint():
    train, val = holdout(100, 0.25, seed=3, what="x")
    assert len(val) == 25 and len(train) == 75 and not set(train) & set(val)
    assert np.array_equal(val, holdout(100, 0.25, seed=3, what="x")[1])
    with pytest.raises(DataError, match="leaves no training samples"):
        holdout(1, 0.5, seed=0, what="one.npz")


def test_fashion_mnist_reads_the_original_idx_files(tmp_path, mnist_dir):
    # Fashion-MNIST's files have MNIST's names and format; the real MNIST IDX files stand in for them.
    (tmp_path / "fashion_mnist").mkdir()
    for f in (mnist_dir / "idx").iterdir():
        (tmp_path / "fashion_mnist" / f.name).write_bytes(f.read_bytes())
    data = load({"name": "fashion_mnist", "path": str(tmp_path)})
    assert data.spec.kind == "keras" and data.spec.details["dataset"] == "fashion_mnist"
    assert data.train.x.shape == (22699, 28, 28) and data.spec.num_classes == 10


def _cifar_batch(path, images: np.ndarray, labels: np.ndarray, label_key: bytes = b"labels", **extra) -> None:
    rows = images.transpose(0, 3, 1, 2).reshape(len(images), -1)  # CIFAR stores channel planes, row-major
    with open(path, "wb") as f:
        pickle.dump({b"data": rows, label_key: list(map(int, labels)), **extra}, f, protocol=2)


def _digits_as_cifar(n: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Real MNIST digits as 32x32 RGB images (padded, grey copied to 3 channels)."""
    with np.load(data_dir() / "mnist" / "mnist.npz") as d:
        x, y = d["x_train"][start:start + n], d["y_train"][start:start + n]
    rgb = np.repeat(np.pad(x, ((0, 0), (2, 2), (2, 2)))[..., None], 3, axis=-1)
    return rgb, y


def test_cifar10_reads_the_python_pickles(tmp_path):
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i in range(5):
        _cifar_batch(folder / f"data_batch_{i + 1}", *_digits_as_cifar(20, 20 * i))
    x_test, y_test = _digits_as_cifar(10, 500)
    _cifar_batch(folder / "test_batch", x_test, y_test)
    data = load({"name": "cifar10", "path": str(tmp_path)})
    assert data.train.x.shape == (100, 32, 32, 3) and data.spec.input_shape == (32, 32, 3)
    assert np.array_equal(data.validation.x, x_test)  # the planes were put back into (H, W, C)
    assert np.array_equal(data.train.y[:20], _digits_as_cifar(20)[1])


@pytest.mark.parametrize("mode, classes", [("fine", 100), ("coarse", 20)])
def test_cifar100_fine_and_coarse_labels(tmp_path, mode, classes):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    x, fine = _digits_as_cifar(30)
    _cifar_batch(folder / "train", x, fine * 10, b"fine_labels", coarse_labels=list(map(int, fine)))
    _cifar_batch(folder / "test", x[:5], fine[:5] * 10, b"fine_labels", coarse_labels=list(map(int, fine[:5])))
    data = load({"name": "cifar100", "path": str(folder), "label_mode": mode})
    assert data.spec.num_classes == classes
    assert np.array_equal(data.train.y, fine * 10 if mode == "fine" else fine)


def test_a_pickle_that_builds_anything_but_arrays_is_refused(tmp_path):
    class Boom:
        def __reduce__(self):
            return (print, ("unpickled!",))

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(pickle.dumps({b"data": Boom(), b"labels": [1]}))
    with pytest.raises(DataError, match="builtins.print, which a dataset never needs"):
        load({"name": "cifar10", "path": str(folder)})


# --------------------------------------------------------------------------- arrays


def test_arrays_npz_with_renamed_keys_any_shape_and_float_targets(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", feats=rng.normal(size=(50, 4, 3)), target=rng.normal(size=50),
             xt=rng.normal(size=(10, 4, 3)), yt=rng.normal(size=10))
    data = load({"kind": "arrays", "path": str(tmp_path / "d.npz"),
                 "keys": {"x_train": "feats", "y_train": "target", "x_test": "xt", "y_test": "yt"}},
                model={"layers": ["Flatten", {"Dense": {"units": 1}}], "loss": "mse"})
    assert data.spec.task == "regression" and data.spec.num_classes is None
    assert data.spec.input_shape == (4, 3) and data.spec.x_dtype == "float32" and data.spec.rescale is None
    assert data.train.x.dtype == np.float32 and data.train.y.dtype == np.float32
    assert data.validation_is_test and data.validation.size == 10
    assert target_of(data.spec.task, None, data.spec.target_shape, "mse").units == 1


def test_arrays_folder_of_npy_files_with_validation_arrays(tmp_path):
    for name, n in (("x_train", 30), ("x_val", 6)):
        np.save(tmp_path / f"{name}.npy", np.arange(n * 5, dtype=np.float64).reshape(n, 5))
        np.save(tmp_path / f"y{name[1:]}.npy", np.arange(n) % 3)
    data = load({"kind": "arrays", "path": str(tmp_path)})
    assert data.spec.task == "classification" and data.spec.num_classes == 3
    assert data.validation.size == 6 and data.test is None and not data.validation_is_test


def test_whole_number_targets_are_values_with_a_regression_loss(tmp_path):
    np.savez(tmp_path / "d.npz", x_train=np.ones((8, 2)), y_train=np.arange(8))
    assert load({"kind": "arrays", "path": str(tmp_path / "d.npz")}).spec.num_classes == 8
    assert load({"kind": "arrays", "path": str(tmp_path / "d.npz")},
                model={"layers": ["Flatten"], "loss": "mae"}).spec.task == "regression"


# --------------------------------------------------------------------------- image folders


def test_image_folder_lists_classes_like_keras_and_records_their_names(tmp_path):
    rng = np.random.default_rng(1)
    for cls, count in (("dog", 3), ("cat", 2), (".hidden", 4)):
        for i in range(count):
            png(tmp_path / cls / f"{i}.png", rng.integers(0, 255, (8, 6), dtype=np.uint8))
    png(tmp_path / "dog" / "nested" / "x.png", rng.integers(0, 255, (8, 6), dtype=np.uint8))  # walked, as Keras does
    (tmp_path / "dog" / ".DS_Store").write_bytes(b"junk")  # hidden files are skipped
    source = load({"kind": "image_folder", "path": str(tmp_path)}, check_only=True)
    data = source.load(LoadContext(32, 1))
    assert data.spec.class_names == ("cat", "dog") and data.spec.num_classes == 2
    assert data.spec.sample_shape == (8, 6, 1) and data.spec.x_dtype == "uint8"
    assert data.train.size == 6 and list(data.train.reader.labels) == [0, 0, 1, 1, 1, 1]
    assert data.validation is None and data.spec.details["images_per_class"] == {"cat": 2, "dog": 4}


def test_image_folder_sizes_and_channels_from_the_config(tmp_path):
    png(tmp_path / "a" / "grey.png", np.zeros((10, 10), np.uint8))
    png(tmp_path / "b" / "rgb.png", np.zeros((12, 8, 3), np.uint8))
    data = load({"kind": "image_folder", "path": str(tmp_path), "image_size": [16, 16], "color_mode": "rgb"})
    assert data.spec.sample_shape == (16, 16, 3) and data.train.reader.resize


def test_image_folder_validation_split_and_folders(tmp_path):
    for split, n in (("train", 20), ("val", 4)):
        for cls in ("a", "b"):
            for i in range(n):
                png(tmp_path / split / cls / f"{i}.png", np.full((4, 4), i, np.uint8))
    data = load({"kind": "image_folder", "path": str(tmp_path / "train"), "validation_split": 0.25, "seed": 3})
    assert (data.train.size, data.validation.size) == (30, 10)
    assert not set(data.train.reader.paths) & set(data.validation.reader.paths)
    again = load({"kind": "image_folder", "path": str(tmp_path / "train"), "validation_split": 0.25, "seed": 3})
    assert again.validation.reader.paths == data.validation.reader.paths
    folders = load({"kind": "image_folder", "path": str(tmp_path / "train"), "test_path": str(tmp_path / "val")})
    assert folders.validation_is_test and folders.validation.size == 8


# --------------------------------------------------------------------------- CSV


def test_breast_cancer_csv(tmp_path):
    data = load({"kind": "csv", "path": str(data_dir() / "breast_cancer" / "breast_cancer.csv"), "label": "target",
                 "validation_split": 0.2})
    assert data.spec.input_shape == (30,) and data.spec.num_classes == 2 and data.spec.task == "classification"
    assert (data.train.size, data.validation.size) == (455, 114)
    assert data.spec.details["features"][:2] == ["mean_radius", "mean_texture"]
    assert sorted(np.unique(data.train.y)) == [0, 1] and data.train.x.dtype == np.float32
    assert target_of("classification", 2, (), "binary_crossentropy").units == 1
    assert target_of("classification", 2, (), "sparse_categorical_crossentropy").units == 2


def test_csv_chosen_features_in_order_and_a_test_file(tmp_path):
    text = "a,b,c,label\n1,2,3,0\n4,5,6,1\n7,8,9,0\n"
    (tmp_path / "t.csv").write_text(text)
    (tmp_path / "s.csv").write_text("label,c,a,b\n1,30,10,20\n")  # other column order: read by name
    data = load({"kind": "csv", "path": str(tmp_path / "t.csv"), "label": "label", "features": ["c", "a"],
                 "test_path": str(tmp_path / "s.csv")})
    assert data.train.x.tolist() == [[3, 1], [6, 4], [9, 7]]
    assert data.validation.x.tolist() == [[30, 10]] and data.validation_is_test


def test_csv_float_label_is_regression(tmp_path):
    (tmp_path / "r.csv").write_text("x,y\n1,0.5\n2,1.5\n3,2.25\n")
    assert load({"kind": "csv", "path": str(tmp_path / "r.csv"), "label": "y"}).spec.task == "regression"


# --------------------------------------------------------------------------- the shared pipeline parts


def test_transform_matches_what_the_model_sees():
    data = load({"path": str(data_dir() / "mnist" / "mnist.npz")})
    x, y = transform_numpy(data.spec, data.train.x[:2], data.train.y[:2])
    assert x.shape == (2, 28, 28, 1) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    assert decoded_bytes(data.spec, 1000) == 784_000


@pytest.mark.parametrize("files, workers, in_memory, policy", [
    (8, 1, False, "DATA"), (8, 2, False, "FILE"), (1, 2, False, "DATA"), (8, 2, True, "DATA")])
def test_sharding_choice(files, workers, in_memory, policy):
    assert choose_sharding(files, workers, in_memory)[0] == policy


def test_checking_and_loading_in_memory_sources_imports_no_tensorflow(tmp_path):
    png(tmp_path / "a" / "1.png", np.zeros((4, 4), np.uint8))
    png(tmp_path / "b" / "2.png", np.zeros((4, 4), np.uint8))
    result = run_python(f"""
        import sys
        from tfgpu.config import load_config
        from tfgpu.data import LoadContext, source_for
        for data in ({{"kind": "csv", "path": {str(data_dir() / "breast_cancer" / "breast_cancer.csv")!r},
                      "label": "target"}}, {{"kind": "mnist"}}, {{"kind": "image_folder", "path": {str(tmp_path)!r}}}):
            source = source_for(load_config({{"data": data}}).data)
            source.check()
            if data["kind"] != "image_folder":
                source.load(LoadContext(32, 1))
        print("HEAVY", [m for m in ("tensorflow", "keras") if m in sys.modules])
    """)
    assert "HEAVY []" in result.stdout, result.stdout + result.stderr[-2000:]
