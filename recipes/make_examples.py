"""Write the real offline data out in the layouts the example recipes read.

    .venv/bin/python recipes/make_examples.py            # into examples/ (TFGPU_DATA_DIR, default ../shared/data)

From ``$TFGPU_DATA_DIR/mnist/mnist.npz`` (22,699 training and 10,000 test
digits) and ``$TFGPU_DATA_DIR/breast_cancer/breast_cancer.csv`` it writes:

| path | layout | recipe |
| --- | --- | --- |
| ``examples/mnist_png/{train,test}/<digit>/<n>.png`` | a PNG class folder | ``recipes/mnist_images.yaml`` |
| ``examples/mnist_tfrecord/{train,test}-0000i-of-0000n.tfrecord`` | TFRecord shards: ``image`` (PNG bytes), ``label`` (int64) | ``recipes/mnist_tfrecord.yaml`` |
| ``examples/breast_cancer_area.npz`` | arrays: 29 features -> ``mean_area`` (float), 80/20 train/test | ``recipes/tumour_area.yaml`` |
| ``examples/tensorflow_datasets/tfgpu_mnist/1.0.0/`` | a prepared TFDS dataset (``image``, ``label``; splits train, test) | ``recipes/mnist_tfds.yaml`` |

The tests and ``benchmarks/sources.py`` call the same functions. PNGs are
written with Pillow, TFRecords with TensorFlow, the TFDS dataset with
``tfds.dataset_builders.store_as_tfds_dataset`` (skipped when the ``tfds``
extra is not installed).
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """``$TFGPU_DATA_DIR``, else ``../shared/data`` beside the checkout."""
    return Path(os.environ.get("TFGPU_DATA_DIR") or ROOT.parent / "shared" / "data").resolve()


def mnist(limit: int | None = None) -> dict[str, np.ndarray]:
    """The offline MNIST arrays (x uint8 (N, 28, 28), y uint8 (N,)), optionally the first ``limit`` of each split."""
    with np.load(data_dir() / "mnist" / "mnist.npz") as data:
        return {k: data[k][:limit] if limit else data[k] for k in ("x_train", "y_train", "x_test", "y_test")}


def write_png_folder(out: Path, limit: int | None = None) -> Path:
    """MNIST as ``out/{train,test}/<digit>/<n>.png`` (8-bit greyscale PNGs); returns ``out``."""
    from PIL import Image  # noqa: PLC0415

    arrays = mnist(limit)
    for split in ("train", "test"):
        for digit in range(10):
            (out / split / str(digit)).mkdir(parents=True, exist_ok=True)
        for i, (image, label) in enumerate(zip(arrays[f"x_{split}"], arrays[f"y_{split}"])):
            Image.fromarray(image).save(out / split / str(label) / f"{i:05d}.png")
    return out


def write_tfrecords(out: Path, shards: int = 8, limit: int | None = None, encoding: str = "png") -> Path:
    """MNIST as TFRecord shards ``out/{train,test}-0000i-of-0000n.tfrecord`` of ``tf.train.Example``.

    Each record: ``image``, the digit as PNG bytes (``encoding: png``) or its 784
    raw uint8 bytes (``encoding: raw``), and ``label`` (int64). Samples are
    dealt to the shards in turn.
    """
    import io  # noqa: PLC0415

    import tensorflow as tf  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    arrays = mnist(limit)
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        writers = [tf.io.TFRecordWriter(str(out / f"{split}-{i:05d}-of-{shards:05d}.tfrecord")) for i in range(shards)]
        for i, (image, label) in enumerate(zip(arrays[f"x_{split}"], arrays[f"y_{split}"])):
            if encoding == "png":
                buffer = io.BytesIO()
                Image.fromarray(image).save(buffer, format="PNG")
                raw = buffer.getvalue()
            else:
                raw = image.tobytes()
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[raw])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }))
            writers[i % shards].write(example.SerializeToString())
        for w in writers:
            w.close()
    return out


def breast_cancer() -> tuple[list[str], np.ndarray]:
    """The breast cancer CSV: (header, float64 rows (569, 31))."""
    with open(data_dir() / "breast_cancer" / "breast_cancer.csv", newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], np.asarray(rows[1:], dtype=np.float64)


def write_area_npz(path: Path, seed: int = 0) -> Path:
    """A regression set from the breast cancer table: predict ``mean_area`` from the 29 other columns.

    A seeded 80/20 split into ``x_train``/``y_train`` and ``x_test``/``y_test``
    (float32 features, float32 target in the table's units, square microns).
    """
    header, table = breast_cancer()
    target = header.index("mean_area")
    x = np.delete(table, target, axis=1).astype(np.float32)
    y = table[:, target].astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(x))
    test, train = order[: len(x) // 5], order[len(x) // 5:]
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x_train=x[train], y_train=y[train], x_test=x[test], y_test=y[test])
    return path


def write_tfds(data_dir: Path, name: str = "tfgpu_mnist") -> Path:
    """MNIST as a prepared TensorFlow Datasets dataset ``data_dir/<name>/1.0.0/`` (no download involved).

    Features: ``image`` (uint8 (28, 28, 1)) and ``label`` (``ClassLabel``, 10 classes);
    splits ``train`` and ``test``. Wraps ``tfds.dataset_builders.store_as_tfds_dataset``.
    """
    import tensorflow as tf  # noqa: PLC0415
    import tensorflow_datasets as tfds  # noqa: PLC0415

    arrays = mnist()
    features = tfds.features.FeaturesDict({"image": tfds.features.Image(shape=(28, 28, 1)),
                                           "label": tfds.features.ClassLabel(num_classes=10)})
    splits = {split: tf.data.Dataset.from_tensor_slices({"image": arrays[f"x_{split}"][..., None],
                                                         "label": arrays[f"y_{split}"].astype("int64")})
              for split in ("train", "test")}
    tfds.dataset_builders.store_as_tfds_dataset(name=name, version="1.0.0", features=features, split_datasets=splits,
                                                data_dir=str(data_dir), disable_shuffling=True)
    return data_dir / name / "1.0.0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="examples", help="where to write (default: examples/)")
    parser.add_argument("--shards", type=int, default=8, help="TFRecord shards per split")
    args = parser.parse_args()
    out = Path(args.out)
    print("wrote", write_png_folder(out / "mnist_png"))
    print("wrote", write_tfrecords(out / "mnist_tfrecord", args.shards))
    print("wrote", write_area_npz(out / "breast_cancer_area.npz"))
    try:
        import tensorflow_datasets  # noqa: F401, PLC0415
    except ImportError:
        print("skipped the TFDS dataset: pip install 'tfgpu[tfds]' to write it")
    else:
        print("wrote", write_tfds(out / "tensorflow_datasets"))


if __name__ == "__main__":
    main()
