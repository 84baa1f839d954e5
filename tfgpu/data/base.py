"""What every data source delivers, and the checks they share. No TensorFlow at import.

A source (one module per ``data.kind``) has two steps:

1. ``check()``: pure Python and NumPy, no TensorFlow. It reads what it can of
   the local files (folders, headers, CSV cells, arrays) and raises
   :class:`~tfgpu.errors.DataError` for anything wrong, before TensorFlow
   starts and before anything is written.
2. ``load(context)``: after :func:`tfgpu.setup`; may import TensorFlow. It
   returns :class:`Data`: the splits, in memory (NumPy arrays) or as a
   :class:`Reader` that streams ``tf.data`` elements, and the
   :class:`DataSpec` the model is built from.

:mod:`tfgpu.data.pipeline` turns a :class:`Data` into the ``tf.data``
pipelines the loops read, the same fast path for every source.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..config import DataConfig
from ..devices.probe import in_container
from ..errors import DataError
from ..model.keras_model import loss_family
from ..utils.lazy import numpy as np

DATA_DIR_ENV = "TFGPU_DATA_DIR"


@dataclass(frozen=True)
class DataSpec:
    """What the model is built from, and what the run records about the data.

    Attributes:
        kind: ``data.kind``.
        source: where the data came from, in words (paths, the Keras download, a builder).
        sample_shape: one sample as stored, e.g. ``(28, 28)`` for MNIST, ``(64, 64, 3)``.
        x_dtype: the stored input dtype (``uint8`` images, ``float32`` features).
        add_channel: a channel axis is added in the pipeline (grey images stored as (H, W)).
        rescale: the factor inputs are multiplied by in the pipeline (``1/255``), or ``None``.
        task: ``classification`` (integer class labels) or ``regression`` (value targets).
        num_classes: classes (classification), else ``None``.
        class_names: the class names (image folders: the sub-folder names), else ``None``.
        target_shape: one label's shape: ``()`` for a class number or a scalar target.
        label_dtype: the stored label dtype.
        details: more facts for the run summary (file counts, shards, the sharding policy).
    """

    kind: str
    source: str
    sample_shape: tuple[int, ...]
    x_dtype: str
    add_channel: bool = False
    rescale: Optional[float] = None
    task: str = "classification"
    num_classes: Optional[int] = None
    class_names: Optional[tuple[str, ...]] = None
    target_shape: tuple[int, ...] = ()
    label_dtype: str = "int32"
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One model input's shape, as the pipeline delivers it, e.g. ``(28, 28, 1)``."""
        return self.sample_shape + (1,) if self.add_channel else self.sample_shape

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready data (for ``summary.json``)."""
        return {"kind": self.kind, "source": self.source, "input_shape": list(self.input_shape),
                "stored_shape": list(self.sample_shape), "stored_dtype": self.x_dtype, "rescale": self.rescale,
                "task": self.task, "num_classes": self.num_classes,
                "class_names": list(self.class_names) if self.class_names is not None else None,
                "target_shape": list(self.target_shape), **self.details}


class Reader:
    """A streamed split: builds the ``tf.data`` dataset of its unbatched ``(x, y)`` elements.

    Attributes:
        size: the number of samples, or ``None`` until counted (builder datasets).
        files: the files read (for FILE sharding and the summary), possibly empty.
        shuffles: the reader itself shuffles every sample uniformly each epoch
            (e.g. the file list before decoding), so no element buffer is needed.
    """

    size: Optional[int] = None
    files: tuple[str, ...] = ()
    shuffles: bool = False

    def dataset(self, shuffle: bool, seed: Optional[int], shard: Optional[tuple[int, int]] = None) -> Any:
        """The ``tf.data.Dataset`` of ``(x, y)`` elements, one pass, in a fixed order unless ``shuffle``.

        Args:
            shuffle: reshuffle what the reader can shuffle cheaply (file order) every epoch.
            seed: the shuffle seed (``tensorflow.seed``).
            shard: ``(num_shards, index)``: read only this worker's files (FILE sharding).
        """
        raise NotImplementedError

    def locate_error(self, error: BaseException) -> Optional[str]:
        """Which file (and record) a decoding ``error`` came from, in words; ``None`` if unknown.

        Called only after reading failed; may re-read the files one by one.
        """
        return None


@dataclass(frozen=True)
class Split:
    """One split of the data: in memory (``x``, ``y``) or streamed (``reader``) or prebatched.

    Attributes:
        name: ``train``, ``validation`` or ``test``.
        origin: where it came from, in words (a path, ``validation_split 0.2 of ...``).
        x, y: the samples in memory: ``x`` of shape ``(N, *sample_shape)``, ``y`` ``(N, *target_shape)``.
        reader: a :class:`Reader` for streamed sources.
        batches: for ``builder`` with ``batched: true``: a function returning the
            dataset of global batches; ``size`` then counts batches.
        size: samples (batches for ``batches``), or ``None`` until counted.
        w: per-sample weights ``(N,)`` float32 of an in-memory training split (``data.sample_weight``,
            ``data.keys.sample_weight``), or ``None``; its training batches are then ``(x, y, w)``.
    """

    name: str
    origin: str
    x: Optional[np.ndarray] = None
    y: Optional[np.ndarray] = None
    reader: Optional[Reader] = None
    batches: Optional[Callable[[], Any]] = None
    size: Optional[int] = None
    w: Optional[np.ndarray] = None

    @property
    def in_memory(self) -> bool:
        return self.x is not None

    def with_arrays(self, x: np.ndarray, y: np.ndarray) -> "Split":
        """The same split held in memory."""
        return replace(self, x=x, y=y, reader=None, batches=None, size=len(x))


@dataclass(frozen=True)
class Data:
    """A loaded source: its splits and spec.

    Attributes:
        train: the training split.
        validation: the validation split, or ``None`` (no validation).
        test: the test split, evaluated once after training, or ``None``. When the
            validation split *is* the test split (no ``validation_split`` or
            ``validation_path``), ``test`` is ``None`` and ``validation_is_test`` is set.
        spec: the :class:`DataSpec`.
        validation_is_test: the validation data is the source's test split.
    """

    train: Split
    validation: Optional[Split]
    test: Optional[Split]
    spec: DataSpec
    validation_is_test: bool = False

    def splits(self) -> list[Split]:
        return [s for s in (self.train, self.validation, self.test) if s is not None]


@dataclass(frozen=True)
class LoadContext:
    """What a source may need when it loads (after :func:`tfgpu.setup`).

    Attributes:
        global_batch_size: samples per step over all replicas.
        num_replicas: replicas in sync.
        seed: ``tensorflow.seed`` (shuffling), or ``None``.
        num_workers, worker_index: the input pipelines (1 and 0 on one machine).
        workers_on_host: the workers on this host, this one included (their decoded
            data shares its memory: :func:`tfgpu.data.pipeline.memory_allowance`).
    """

    global_batch_size: int
    num_replicas: int
    seed: Optional[int] = None
    num_workers: int = 1
    worker_index: int = 0
    workers_on_host: int = 1

    def input_context(self) -> Any:
        """The ``tf.distribute.InputContext`` a builder gets for sharding and per-replica batches.

        Wraps https://www.tensorflow.org/api_docs/python/tf/distribute/InputContext
        """
        import tensorflow as tf  # noqa: PLC0415

        return tf.distribute.InputContext(num_input_pipelines=self.num_workers,
                                          input_pipeline_id=self.worker_index,
                                          num_replicas_in_sync=self.num_replicas)


class Source:
    """One ``data.kind``: a pure :meth:`check`, then :meth:`load` (see the module doc).

    Args:
        cfg: the ``data`` section.
        loss: ``model.loss`` (with the labels, it decides classification or regression).
        tf_seed: ``tensorflow.seed`` (the default split seed).
    """

    kind = ""

    def __init__(self, cfg: DataConfig, loss: Any = "sparse_categorical_crossentropy",
                 tf_seed: Optional[int] = None) -> None:
        self.cfg = cfg
        self.loss = loss
        self.split_seed = cfg.seed if cfg.seed is not None else (tf_seed if tf_seed is not None else 0)

    def check(self, keep: bool = True) -> None:
        """Check (and read, where that is cheap) the local files; no TensorFlow.

        Args:
            keep: keep what was read for :meth:`load` (``tfgpu run``). ``False`` (``tfgpu plan``): the
                same checks, made as cheaply as the files allow (the Keras built-ins' uint8 ``.npz`` and
                IDX files: the images' headers and the labels' bytes, without NumPy), nothing kept.

        Raises:
            DataError: a file or folder is missing, unreadable or malformed.
        """

    def load(self, context: LoadContext) -> Data:
        """Load the splits (may import TensorFlow); call after :meth:`check`.

        Raises:
            DataError: the data cannot be read or does not fit the config.
        """
        raise NotImplementedError


# --------------------------------------------------------------------------- shared checks


def resolve_path(value: str, key: str) -> Path:
    """``data.<key>``'s path with ``~`` and ``$VAR`` / ``${VAR}`` expanded.

    Raises:
        DataError: it names an environment variable that is not set.
    """
    expanded = os.path.expandvars(value)
    unset = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", expanded)
    if unset:
        close = difflib.get_close_matches(unset[0], list(os.environ), n=1, cutoff=0.8)
        guess = f" Did you mean ${close[0]} (which is set)?" if close else ""
        raise DataError(
            f"data.{key}: '{value}' uses ${unset[0]}, which is not set in the environment.{guess}",
            (f"correct the name to ${close[0]} in data.{key}, or " if close else "")
            + f"set {unset[0]} (e.g. export {unset[0]}=../shared/data), or write the path out.",
        )
    try:
        return Path(expanded).expanduser()
    except RuntimeError:  # '~user' for a user that does not exist
        return Path(expanded)


def unmounted_data(path: Path, container: Optional[bool] = None) -> Optional[tuple[str, str]]:
    """In a container whose data folder (``$TFGPU_DATA_DIR``) is missing or empty: why, and the fix.

    The image sets ``TFGPU_DATA_DIR=/data`` and declares it a volume: a ``docker run``
    without ``-v HOST_DIR:/data`` gets an empty ``/data``, and every dataset under it
    is "missing". This names the mount instead.

    Args:
        path: the file or folder that was not found.
        container: whether this is a container; ``None``: :func:`in_container`.

    Returns:
        ``(what, fix)`` to append to a :class:`~tfgpu.errors.DataError`'s message
        and to use as its hint, or ``None``: not a container, ``path`` is not under
        ``$TFGPU_DATA_DIR``, or that folder holds something (then it is mounted, and
        the usual message applies).
    """
    root_value = os.environ.get(DATA_DIR_ENV)
    if not root_value or not (in_container() if container is None else container):
        return None
    root = Path(os.path.abspath(Path(root_value).expanduser()))
    try:
        inside = Path(os.path.abspath(path)).relative_to(root).parts
    except ValueError:
        return None
    try:
        if any(root.iterdir()):
            return None
        state = "is empty"
    except FileNotFoundError:
        state = "does not exist"
    except OSError:
        return None
    folder = f"{inside[0]}/" if inside else "the data"
    return (f"inside this container {root} {state}: no data folder is mounted there",
            f"mount the host folder that holds {folder} at {root}: docker run -v /path/to/data:{root}:ro ... "
            f"(podman run takes the same -v; with --user, that user must be able to read it).")


def existing(value: str, key: str, what: str, fix: str) -> Path:
    """:func:`resolve_path`, which must exist.

    Raises:
        DataError: it does not (naming ``what`` was expected and ``fix``; a
            path under ``examples/`` also names ``recipes/make_examples.py``,
            which writes the example recipes' data there).
    """
    path = resolve_path(value, key)
    if not path.exists():
        unmounted = unmounted_data(path)
        if unmounted:
            raise DataError(f"data.{key}: '{value}' does not exist; {unmounted[0]}.", unmounted[1])
        raise DataError(f"data.{key}: '{value}' does not exist (looked from {Path.cwd()}); expected {what}.",
                        fix + examples_hint(value))
    return path


def examples_hint(value: Optional[str]) -> str:
    """For a missing path under ``examples/``: the sentence naming ``recipes/make_examples.py``, which writes the
    example recipes' data there (``""`` for any other path), to append to a fix."""
    if not value or Path(value).parts[:1] != ("examples",):
        return ""
    return (" The example data under examples/ is written by 'python recipes/make_examples.py' (run it from the "
            "repository's root, about 20 s): MNIST from $TFGPU_DATA_DIR as a PNG class folder, TFRecord shards and "
            "a prepared TFDS dataset, and the tumour-area .npz.")


def holdout(n: int, fraction: float, seed: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``validation_split``: sample indices ``(train, validation)``, a seeded random choice.

    ``round(n * fraction)`` samples (at least 1) go to validation, chosen by a
    permutation from ``numpy.random.default_rng(seed)``; both index arrays are
    sorted, so the stored order is kept. The same ``n``, ``fraction`` and
    ``seed`` always give the same split.

    Raises:
        DataError: one side would be empty.
    """
    n_val = max(1, round(n * fraction))
    if n_val >= n:
        raise DataError(
            f"data.validation_split: {fraction} of {what}'s {n} samples leaves no training samples.",
            "use a smaller validation_split or more data.",
        )
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def whole_numbers(y: np.ndarray) -> bool:
    """Every label is a whole number (an integer dtype, or floats without fractions)."""
    if np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_:
        return True
    if not np.issubdtype(y.dtype, np.floating):
        return False
    finite = np.isfinite(y)
    return bool(finite.all() and (np.floor(y) == y).all())


@dataclass(frozen=True)
class Labels:
    """The task the labels and loss describe.

    Attributes:
        task: ``classification`` or ``regression``.
        num_classes: classes, or ``None`` for regression.
        dtype: the dtype labels are kept in (``int32``/``uint8`` classes, ``float32`` targets).
    """

    task: str
    num_classes: Optional[int]
    dtype: str


def label_task(ys: Sequence[tuple[str, np.ndarray]], loss: Any, num_classes: Optional[int],
               class_count: Optional[int] = None) -> Labels:
    """Decide classification or regression from the labels and ``model.loss``, and check them.

    Whole-number labels are class numbers unless the loss is a regression loss
    (``mse``, ``mae``, ...); any other numbers are regression targets. Class
    numbers must lie in ``[0, num_classes)``, where ``num_classes`` is
    ``data.num_classes``, else ``class_count`` (e.g. the number of class
    folders), else the largest label + 1.

    Args:
        ys: ``(where, labels)`` for each split, ``where`` naming the file for messages.
        loss: ``model.loss``.
        num_classes: ``data.num_classes`` (or ``None``).
        class_count: the classes the source itself defines, if any.

    Raises:
        DataError: labels that are not numbers, not finite, or outside ``[0, num_classes)``.
    """
    for where, y in ys:
        if not (np.issubdtype(y.dtype, np.number) or y.dtype == np.bool_):
            raise DataError(
                f"{where}: the labels are {y.dtype} values; tfgpu trains on numbers (class numbers 0, 1, ... "
                "or target values).",
                "encode the labels as integers (e.g. 0 and 1) or floats.",
            )
        if np.issubdtype(y.dtype, np.floating) and not_finite_in_float32(y).any():
            bad = y[not_finite_in_float32(y)].flat[0]  # a float64 1e39 is infinity in the float32 loss
            raise DataError(f"{where}: a label is {bad}; labels must be finite numbers within float32's range "
                            f"(+-{FLOAT32_MAX:.4g}), in which the loss is computed.",
                            "remove or fix the samples with missing, infinite or out-of-range labels.")
    classes = all(whole_numbers(y) for _, y in ys) and loss_family(loss) != "regression"
    if not classes:
        return Labels("regression", None, "float32")
    top = max((int(y.max()) for _, y in ys if y.size), default=0)
    low = min((int(y.min()) for _, y in ys if y.size), default=0)
    count = num_classes or class_count or max(top + 1, 2)
    if low < 0 or top >= count:
        where, y = next((w, y) for w, y in ys if y.size and (int(y.min()) < 0 or int(y.max()) >= count))
        value = int(y.min()) if int(y.min()) < 0 else int(y.max())
        said = f"data.num_classes is {num_classes}" if num_classes else f"there are {count} classes"
        raise DataError(
            f"{where}: a label is {value}, outside [0, {count}) ({said}); class labels must be the numbers "
            f"0 to {count - 1}.",
            "renumber the labels from 0, or set data.num_classes to the number of classes"
            + (" (or use a regression loss such as mse for value targets)" if low >= 0 else "") + ".",
        )
    return Labels("classification", count, "uint8" if count <= 256 else "int32")


#: The largest magnitude a float32 holds (``numpy.finfo("float32").max``): inputs, targets and weights are float32
#: in the model, where a larger number (``1e39`` in a float64 array or a CSV cell) becomes infinity.
FLOAT32_MAX = 3.4028234663852886e38


def not_finite_in_float32(x: np.ndarray) -> np.ndarray:
    """Where float ``x`` is NaN or infinite, or, for a wider float, beyond :data:`FLOAT32_MAX` (infinite once the
    model casts it to float32): a bool array of ``x``'s shape."""
    bad = ~np.isfinite(x)
    if x.dtype.itemsize > 4:
        bad |= np.abs(np.nan_to_num(x)) > FLOAT32_MAX
    return bad


def check_finite(x: np.ndarray, where: str) -> None:
    """Float inputs must be finite, also once in float32 (a NaN input makes every loss NaN; a float64 ``1e39``
    becomes infinity in the model's float32).

    Raises:
        DataError: naming the first sample that is not.
    """
    if np.issubdtype(x.dtype, np.floating):
        bad = not_finite_in_float32(x.reshape(len(x), -1)).any(axis=1)
        if bad.any():
            raise DataError(f"{where}: sample {int(np.argmax(bad))} holds NaN or infinite values, or values beyond "
                            f"float32's range (+-{FLOAT32_MAX:.4g}), in which the model computes.",
                            "fill or drop the missing values (and rescale the huge ones) before training.")


def rescale_for(cfg: DataConfig, x_dtype: str) -> Optional[float]:
    """``data.rescale`` resolved: ``auto`` is 1/255 for 8-bit (uint8) inputs, else none."""
    if cfg.rescale == "auto":
        return 1 / 255 if x_dtype == "uint8" else None
    return cfg.rescale


def in_memory_labels(y: np.ndarray, labels: Labels) -> np.ndarray:
    """Labels in the dtype training keeps them in (a copy only when the dtype changes)."""
    return np.asarray(y, dtype=labels.dtype) if y.dtype != np.dtype(labels.dtype) else y


def tf_error_text(exc: BaseException) -> str:
    """A TensorFlow error's own words: its first line without ``{{function_node ...}}`` and ``[Op:...]``."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    first = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", first)
    first = re.sub(r"\s*\[Op:\w+\].*$", "", first)
    return " ".join(first.split()).rstrip(".") or type(exc).__name__
