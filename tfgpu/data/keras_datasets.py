"""``kind: mnist`` and ``kind: keras``: the Keras built-in datasets, from local files or the Keras download.

``mnist``, ``fashion_mnist``, ``cifar10`` and ``cifar100`` (``data.name``).
Where they are read from, first match wins:

1. ``data.path``: a Keras-layout ``.npz`` file (``x_train``, ``y_train``,
   ``x_test``, ``y_test``), or a folder holding ``<name>.npz`` or the original
   files: for MNIST and Fashion-MNIST the four IDX files
   (``train-images-idx3-ubyte[.gz]``, ``train-labels-idx1-ubyte[.gz]``,
   ``t10k-images-idx3-ubyte[.gz]``, ``t10k-labels-idx1-ubyte[.gz]``) directly
   or under ``idx/``; for CIFAR-10 ``cifar-10-batches-py/`` (``data_batch_1``
   to ``_5``, ``test_batch``); for CIFAR-100 ``cifar-100-python/`` (``train``,
   ``test``); or a ``<name>/`` folder with either;
2. ``$TFGPU_DATA_DIR/<name>/``, with the same layouts;
3. ``keras.datasets.<name>.load_data()`` (the Keras cache, else a download).

IDX counts are read from the file headers, never assumed. CIFAR's pickles are
read with an unpickler that builds NumPy arrays and nothing else. The test
split is the validation data unless ``data.validation_split`` is set.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
from pathlib import Path
from typing import Any, Optional

from ..errors import DataError
from ..utils.lazy import numpy as np
from .arrays import ArrayHeader, arrange, npz_headers, read_npz
from .base import DATA_DIR_ENV, Data, LoadContext, Source, resolve_path, unmounted_data

IDX_FILES = {
    "x_train": ("train-images-idx3-ubyte", 2051),
    "y_train": ("train-labels-idx1-ubyte", 2049),
    "x_test": ("t10k-images-idx3-ubyte", 2051),
    "y_test": ("t10k-labels-idx1-ubyte", 2049),
}
#: Classes of each built-in (cifar100: fine labels; coarse has 20).
CLASSES = {"mnist": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100}
CIFAR_DIRS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
_KERAS_LAYOUT = {role: role for role in IDX_FILES}
#: The arrays ``tfgpu plan`` reads whole (their range is checked): the labels, small; the images' headers suffice.
LABELS = ("y_train", "y_test")


def classes_of(name: str, label_mode: str = "fine") -> int:
    """Classes of a built-in: 10, or CIFAR-100's 100 fine / 20 coarse."""
    return 20 if (name == "cifar100" and label_mode == "coarse") else CLASSES[name]


def read_idx(path: Path, expected_magic: int) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) into a uint8 array.

    The header is big-endian: magic (2051 images, 2049 labels), then one
    uint32 per dimension; the count is taken from it.

    Raises:
        DataError: unreadable file, wrong magic number, or a size that does
            not match the header (truncated or padded file).
    """
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"cannot read IDX file {path}: {exc}.", "re-download or re-copy the file.") from None
    kind = "images" if expected_magic == 2051 else "labels"
    if len(raw) < 8:
        raise DataError(f"IDX file {path} is {len(raw)} bytes long, too short for a header.",
                        "the file is truncated; re-download or re-copy it.")
    magic = int.from_bytes(raw[:4], "big")
    if magic != expected_magic:
        raise DataError(
            f"IDX file {path} has magic number {magic}; {kind} files have {expected_magic}.",
            f"check that this is the {kind} file (the names may be swapped) and that it is not damaged.",
        )
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(np.prod(dims))
    if len(raw) != expected:
        raise DataError(
            f"IDX file {path} holds {len(raw) - header} data bytes, but its header "
            f"({' x '.join(map(str, dims))}) needs {expected - header}.",
            "the file is truncated or damaged; re-download or re-copy it.",
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def idx_header(path: Path, expected_magic: int, data: bool = False) -> Optional[ArrayHeader]:
    """An uncompressed IDX file's shape from its header, without NumPy (``data``: with its bytes, for labels);
    ``None`` when only :func:`read_idx` can say what is wrong with it (or that nothing is): a ``.gz`` file,
    another magic number, or a size that does not match the header."""
    if path.suffix == ".gz":
        return None
    try:
        with path.open("rb") as f:
            head = f.read(4)
            if len(head) < 4 or int.from_bytes(head, "big") != expected_magic:
                return None
            dims = f.read(4 * head[3])
            size = path.stat().st_size
            values = f.read() if data else None
    except OSError:
        return None
    shape = tuple(int.from_bytes(dims[4 * i:4 * i + 4], "big") for i in range(head[3]))
    count = 1
    for n in shape:
        count *= n
    return ArrayHeader(shape, "|u1", values) if len(dims) == 4 * head[3] and size == 4 + len(dims) + count else None


def _find_idx(directory: Path) -> Optional[dict[str, Path]]:
    for base in (directory, directory / "idx"):
        found = {}
        for key, (stem, _) in IDX_FILES.items():
            for candidate in (base / stem, base / f"{stem}.gz"):
                if candidate.is_file():
                    found[key] = candidate
                    break
        if len(found) == len(IDX_FILES):
            return found
        if found:
            missing = [IDX_FILES[k][0] for k in IDX_FILES if k not in found]
            raise DataError(
                f"{base} has some IDX files but not {', '.join(missing)} (or their .gz).",
                "copy all four IDX files into that directory.",
            )
    return None


class _ArrayUnpickler(pickle.Unpickler):
    """Builds NumPy arrays and plain containers, nothing else (CIFAR's pickles need no more)."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
               ("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"the pickle wants to build {module}.{name}, which a dataset never needs")
        if module == "numpy.core.multiarray":  # NumPy 2's name for NumPy 1's module
            module = "numpy._core.multiarray"
        if module == "copy_reg":
            module = "copyreg"
        return super().find_class(module, name)


def _read_cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR pickle -> ``(images (N, 32, 32, 3) uint8, labels (N,) uint8)``.

    Raises:
        DataError: unreadable, not a CIFAR batch, or a pickle that builds anything but arrays.
    """
    try:
        with path.open("rb") as f:
            batch = _ArrayUnpickler(io.BufferedReader(f), encoding="bytes").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError) as exc:
        raise DataError(f"cannot read the CIFAR batch {path}: {exc}.",
                        "re-download or re-extract the dataset (the python version of the archive).") from None
    if not isinstance(batch, dict):
        raise DataError(f"{path} is not a CIFAR batch (a pickled dict); it holds a {type(batch).__name__}.",
                        "point data.path at the extracted cifar-10-batches-py or cifar-100-python folder.")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or label_key not in batch:
        raise DataError(f"{path} lacks '{'data' if 'data' not in batch else label_key}'; it holds "
                        f"{', '.join(map(str, batch)) or 'nothing'}.",
                        "point data.path at the extracted python version of the CIFAR archive.")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch[label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise DataError(f"{path}: 'data' is {data.dtype} {data.shape} with {len(labels)} labels; a CIFAR batch "
                        "holds uint8 rows of 3072 values (3 x 32 x 32) and one label per row.",
                        "re-download or re-extract the dataset.")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels.astype(np.uint8)


def _read_cifar(directory: Path, name: str, label_mode: str) -> dict[str, np.ndarray]:
    if name == "cifar10":
        train = [directory / f"data_batch_{i}" for i in range(1, 6)]
        test, key = directory / "test_batch", "labels"
    else:
        train, test, key = [directory / "train"], directory / "test", f"{label_mode}_labels"
    missing = [p.name for p in (*train, test) if not p.is_file()]
    if missing:
        raise DataError(f"{directory} lacks {', '.join(missing)}.", "extract the whole CIFAR archive there.")
    parts = [_read_cifar_batch(p, key) for p in train]
    x_test, y_test = _read_cifar_batch(test, key)
    return {"x_train": np.concatenate([x for x, _ in parts]), "y_train": np.concatenate([y for _, y in parts]),
            "x_test": x_test, "y_test": y_test}


def _load_dir(directory: Path, name: str, label_mode: str,
              headers: bool = False) -> Optional[tuple[dict[str, Any], str]]:
    """The dataset in ``directory`` (or its ``name`` folder): ``(arrays, source)``, ``None`` when no layout is there.
    ``headers``: the arrays' :class:`~tfgpu.data.arrays.ArrayHeader` instead, or ``({}, source)`` when the
    files must be read whole to be checked (CIFAR's pickles, a ``.gz`` or damaged file)."""
    fix = f"use a Keras-layout {name}.npz with x_train, y_train, x_test and y_test."
    for base in (directory, directory / name):
        if (base / f"{name}.npz").is_file():
            path = base / f"{name}.npz"
            if headers:
                return npz_headers(path, _KERAS_LAYOUT, tuple(IDX_FILES), LABELS) or {}, str(path)
            return read_npz(path, _KERAS_LAYOUT, tuple(IDX_FILES), fix), str(path)
        if name in CIFAR_DIRS:
            for folder in (base / CIFAR_DIRS[name], base):
                if (folder / ("test_batch" if name == "cifar10" else "test")).is_file():
                    return ({} if headers else _read_cifar(folder, name, label_mode)), str(folder)
        else:
            idx = _find_idx(base)
            if idx:
                read = idx_header if headers else read_idx
                arrays = {k: read(p, IDX_FILES[k][1], *((k in LABELS,) if headers else ())) for k, p in idx.items()}
                if headers and None in arrays.values():
                    arrays = {}
                return arrays, str(idx["x_train"].parent)
    return None


def _layouts(name: str) -> str:
    if name in CIFAR_DIRS:
        return f"neither {name}.npz nor the extracted {CIFAR_DIRS[name]}/ folder"
    return f"neither {name}.npz nor the four IDX files (directly, under idx/ or under {name}/)"


def _check_images(arrays: dict[str, Any], source: str, name: str, classes: int) -> dict[str, Any]:
    """The shapes and values of a Keras built-in's four arrays checked; the arrays as uint8.

    With :class:`~tfgpu.data.arrays.ArrayHeader` objects (``tfgpu plan``: the images' headers, the labels'
    bytes), the same checks run on uint8 arrays (whose pixels need no value check) and the headers are
    returned; another type returns ``{}``: its values must be read with NumPy to be checked.
    """
    headers = any(isinstance(a, ArrayHeader) for a in arrays.values())
    if headers and not all(str(a.dtype) == "uint8" for a in arrays.values()):
        return {}
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim not in (3, 4) or y.ndim not in (1, 2):
            raise DataError(
                f"{source}: x_{split} has shape {x.shape} and y_{split} {y.shape}; expected images "
                "(N, rows, cols) or (N, rows, cols, channels) and labels (N,).",
                f"use the Keras layout of {name}.",
            )
        if len(x) != len(y):
            raise DataError(
                f"{source}: {len(x)} {split} images but {len(y)} {split} labels; the counts must match.",
                "the image and label files belong to different sets, or one is damaged.",
            )
        if len(x) == 0:
            raise DataError(f"{source}: the {split} split is empty.", "use a dataset with samples in both splits.")
        _check_values(x, f"x_{split}", source, "pixel", "whole numbers from 0 to 255")
        _check_values(y, f"y_{split}", source, "label", f"whole class numbers from 0 to {classes - 1}")
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        raise DataError(
            f"{source}: train images are {arrays['x_train'].shape[1:]} but test images {arrays['x_test'].shape[1:]}.",
            "use train and test files of the same dataset.",
        )
    top = int(max(arrays["y_train"].max(), arrays["y_test"].max()))
    if top >= classes:
        raise DataError(f"{source}: a label is {top}; {name} has classes 0-{classes - 1}.",
                        "the label file is damaged or belongs to another dataset.")
    if headers:
        return arrays
    return {k: np.asarray(v, dtype=np.uint8) for k, v in arrays.items()}


def _check_values(a: np.ndarray, name: str, source: str, what: str, allowed: str) -> None:
    """Refuse arrays that would not survive the cast to uint8 unchanged (text, fractions, negatives, > 255)."""
    if str(a.dtype) == "uint8":  # (also an ArrayHeader's: no NumPy needed)
        return
    floating = np.issubdtype(a.dtype, np.floating)
    if not (floating or np.issubdtype(a.dtype, np.integer)) or a.dtype == np.bool_:
        raise DataError(
            f"{source}: {name} holds {a.dtype} values; {what}s must be {allowed}.",
            f"save {name} as uint8 (pixels 0-255, labels from 0).",
        )
    bad = (a < 0) | (a > 255)
    if floating:
        bad |= ~np.isfinite(a) | (np.floor(a) != a)
    if bad.any():
        value = a[bad].flat[0].item()
        finite = a[np.isfinite(a)] if floating else a
        scaled = (" (they look scaled to [0, 1]; tfgpu scales the 0-255 values itself)"
                  if what == "pixel" and finite.size and finite.max() <= 1 else "")
        raise DataError(
            f"{source}: {name} holds the {what} value {value!r} ({a.dtype}); {what}s must be {allowed}{scaled}.",
            f"save {name} as uint8 (pixels 0-255, labels from 0); for other arrays use data.kind: arrays.",
        )


def _from_keras(name: str, label_mode: str) -> tuple[dict[str, np.ndarray], str]:
    import keras  # noqa: PLC0415

    loader = getattr(keras.datasets, name)
    try:
        kwargs = {"label_mode": label_mode} if name == "cifar100" else {}
        (x_train, y_train), (x_test, y_test) = loader.load_data(**kwargs)
    except Exception as exc:  # network errors come in many types
        raise DataError(
            f"{name} is not in the Keras cache (~/.keras/datasets/) and could not be downloaded: {exc}.",
            f"on a machine without network access, set {DATA_DIR_ENV} to a folder holding {name}/ with "
            f"{name}.npz or the original files, or set data.path.",
        ) from None
    return ({"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test},
            f"keras.datasets.{name}")


def needs_download(path: Optional[str]) -> bool:
    """Whether the Keras download (which imports TensorFlow) will be used: no ``data.path``, no ``TFGPU_DATA_DIR``."""
    return path is None and not os.environ.get(DATA_DIR_ENV)


def load_keras_dataset(name: str = "mnist", path: Optional[str] = None, label_mode: str = "fine",
                       headers: bool = False) -> tuple[dict[str, Any], str]:
    """Read a Keras built-in into memory: ``({x_train, y_train, x_test, y_test}, source)``.

    Args:
        name: ``mnist``, ``fashion_mnist``, ``cifar10`` or ``cifar100``.
        path: ``data.path``, or ``None`` (see the module doc).
        label_mode: ``cifar100``: ``fine`` or ``coarse``.

        headers: without NumPy (``tfgpu plan``): the images' headers and the labels' bytes, as
            :class:`~tfgpu.data.arrays.ArrayHeader` objects, checked as the arrays are; ``{}`` when the
            files must be read with NumPy to be checked (a type other than uint8, CIFAR's pickles, a
            ``.gz`` or damaged file). Not for the Keras download.

    Returns:
        uint8 images ``(N, 28, 28)`` (MNIST, Fashion-MNIST) or ``(N, 32, 32, 3)``
        (CIFAR), uint8 labels ``(N,)``, and where they were read from.

    Raises:
        DataError: the path does not exist, holds no recognised layout, or a
            file is malformed (wrong magic, truncated, counts that differ).

    Environment: ``TFGPU_DATA_DIR``: a folder with one sub-folder per dataset.
    """
    classes = classes_of(name, label_mode)
    if path is not None:
        p = resolve_path(path, "path")
        if not p.exists():
            raise DataError(
                f"data.path: '{path}' does not exist (looked from {Path.cwd()}).",
                f"point data.path at {name}.npz or a folder with the original files, or remove it to use "
                f"{DATA_DIR_ENV} or the Keras download.",
            )
        if p.is_file() and headers:
            loaded = (npz_headers(p, _KERAS_LAYOUT, tuple(IDX_FILES), LABELS) or {}, str(p))
        elif p.is_file():
            loaded = (read_npz(p, _KERAS_LAYOUT, tuple(IDX_FILES),
                               f"use a Keras-layout {name}.npz with x_train, y_train, x_test and y_test "
                               "(or data.kind: arrays with data.keys for other names)."), str(p))
        else:
            loaded = _load_dir(p, name, label_mode, headers)
            if loaded is None:
                raise DataError(f"data.path: '{path}' holds {_layouts(name)}.",
                                "point data.path at the folder that holds them.")
    elif os.environ.get(DATA_DIR_ENV):
        root = Path(os.environ[DATA_DIR_ENV]).expanduser()
        directory = root / name
        if not directory.is_dir():
            unmounted = unmounted_data(directory)
            if unmounted:
                raise DataError(f"{DATA_DIR_ENV}={os.environ[DATA_DIR_ENV]}: there is no '{name}' folder in it; "
                                f"{unmounted[0]}.", unmounted[1])
            raise DataError(
                f"{DATA_DIR_ENV}={os.environ[DATA_DIR_ENV]}: there is no '{name}' folder in it "
                f"(looked for {directory}).",
                f"put the dataset in {directory}/ ({name}.npz or the original files), or unset {DATA_DIR_ENV}.",
            )
        loaded = _load_dir(directory, name, label_mode, headers)
        if loaded is None:
            raise DataError(f"{directory} holds {_layouts(name)}.", f"copy {name}.npz or the original files there.")
    else:  # needs_download(path)
        loaded = _from_keras(name, label_mode)
    arrays, source = loaded
    if headers and not arrays:
        return {}, source
    return _check_images(arrays, source, name, classes), source


class KerasSource(Source):
    """``kind: mnist`` / ``kind: keras`` (see the module doc)."""

    kind = "keras"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.loaded: Optional[tuple[dict[str, np.ndarray], str]] = None

    def check(self, keep: bool = True) -> None:
        # Local files are read now (NumPy only); the Keras download needs TensorFlow, so it waits for load().
        if needs_download(self.cfg.path):
            return
        if not keep and load_keras_dataset(self.cfg.dataset_name, self.cfg.path, self.cfg.label_mode, True)[0]:
            return  # tfgpu plan: every check passed on the images' headers and the labels (uint8), no NumPy
        self.loaded = load_keras_dataset(self.cfg.dataset_name, self.cfg.path, self.cfg.label_mode)

    def load(self, context: LoadContext) -> Data:
        name = self.cfg.dataset_name
        arrays, source = self.loaded or load_keras_dataset(name, self.cfg.path, self.cfg.label_mode)
        classes = classes_of(name, self.cfg.label_mode)
        return arrange(self, arrays, f"{name} from {source}", source, num_classes=classes,
                       details={"dataset": name})
