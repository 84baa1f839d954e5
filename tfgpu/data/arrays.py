"""``kind: arrays``: NumPy arrays from a ``.npz`` file or a folder of ``.npy`` files.

The arrays have roles: ``x_train``, ``y_train`` (required), ``x_val``,
``y_val``, ``x_test``, ``y_test`` (optional, in pairs). In a ``.npz`` they are
found by those names (the Keras layout), in a folder as ``<name>.npy``;
``data.keys`` renames them (``{x_train: features, y_train: target}``). Any
sample shape; labels are class numbers or float targets (with e.g. ``loss: mse``).
``data.keys: {sample_weight: NAME}`` also reads the array ``NAME``: one weight
(a finite number >= 0) per training sample, carried with its sample through
``validation_split`` and shuffling into ``(x, y, w)`` training batches.

Everything is read in :meth:`ArraysSource.check`, before TensorFlow starts.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Optional

from ..config import DataConfig
from ..config.schema import ARRAY_ROLES, SAMPLE_WEIGHT_ROLE
from ..errors import DataError
from ..utils.lazy import numpy as np
from .base import Data, DataSpec, LoadContext, Source, Split, check_finite, existing, holdout, label_task, rescale_for
from .pipeline import aligned, aligned_empty


def read_aligned(f: IO[bytes]) -> Optional[np.ndarray]:
    """The array of an open ``.npy`` file, read into an :func:`~tfgpu.data.pipeline.aligned_empty` buffer.

    ``np.load`` returns arrays that TensorFlow must copy before it can use them
    (:data:`~tfgpu.data.pipeline.ALIGNMENT`); read here, they are held once.
    Returns ``None`` where ``np.load`` should read it instead: Fortran order,
    dtypes other than numbers and booleans (Python objects, which
    ``allow_pickle=False`` refuses with its own message), an unknown format version.

    Raises:
        ValueError: not a ``.npy`` header, or the data ends early.
    """
    from numpy.lib import format as npy_format  # noqa: PLC0415

    version = npy_format.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        return None
    read_header = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
    shape, fortran_order, dtype = read_header(f)
    if fortran_order or dtype.kind not in "biuf":
        return None
    out = aligned_empty(shape, dtype)
    view = memoryview(out.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        n = f.readinto(view[done:done + (1 << 20)])  # 1 MiB at a time: a zip member reads via bytes
        if not n:
            raise ValueError(f"the array data ends after {done} of {len(view)} bytes")
        done += n
    return out


@dataclass(frozen=True)
class ArrayHeader:
    """An array as its ``.npy`` header describes it, read without NumPy (``tfgpu plan``'s check).

    Attributes:
        shape: e.g. ``(60000, 28, 28)``.
        descr: NumPy's type string, e.g. ``"|u1"`` (uint8) or ``"<f4"`` (float32).
        data: the values' bytes where they were read too (small uint8 arrays: labels), else ``None``.
    """

    shape: tuple[int, ...]
    descr: str
    data: Optional[bytes] = field(default=None, repr=False)

    def max(self) -> int:
        """The largest value of a uint8 array whose bytes were read (as ``ndarray.max``)."""
        assert self.data is not None and str(self) == "uint8", "only a uint8 array whose data was read has a max"
        return max(self.data)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> "ArrayHeader":
        return self  # ``.kind`` and ``str()`` as a NumPy dtype has them

    @property
    def kind(self) -> str:
        """NumPy's one-letter kind: ``b`` bool, ``i``/``u`` integers, ``f`` floats, ``c`` complex, ..."""
        return _KINDS.get(self.descr[1:2], "O")

    def __len__(self) -> int:
        return self.shape[0]

    def __str__(self) -> str:
        return _NAMES.get(self.descr.lstrip("<>|="), self.descr)


#: The type letters of ``dtype.str`` (a ``.npy`` header's ``descr``) -> NumPy's ``dtype.kind``.
_KINDS = {"b": "b", "i": "i", "u": "u", "f": "f", "c": "c"}
_NAMES = {"u1": "uint8", "i1": "int8", "u2": "uint16", "i2": "int16", "u4": "uint32", "i4": "int32", "u8": "uint64",
          "i8": "int64", "f2": "float16", "f4": "float32", "f8": "float64", "b1": "bool"}
_NPY_MAGIC = b"\x93NUMPY"


def npy_header(f: IO[bytes]) -> Optional[ArrayHeader]:
    """The shape and type in an open ``.npy`` file's header (https://numpy.org/devdocs/reference/generated/numpy.lib.format.html),
    without NumPy and without reading the data; ``None`` when only :func:`read_aligned` (or ``np.load``) can
    tell: a format version, order or type it would treat specially (Fortran order, anything but plain numbers
    and booleans), or no ``.npy`` header at all (its error message is theirs)."""
    import ast  # noqa: PLC0415

    head = f.read(10)
    if len(head) < 10 or not head.startswith(_NPY_MAGIC) or head[6] not in (1, 2, 3):
        return None
    size = int.from_bytes(head[8:10], "little")
    if head[6] > 1:
        size = int.from_bytes(head[8:10] + f.read(2), "little")
    try:
        meta = ast.literal_eval(f.read(size).decode("latin1" if head[6] < 3 else "utf-8"))
    except (ValueError, SyntaxError, UnicodeDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("fortran_order") is not False or not isinstance(meta.get("descr"), str) \
            or not isinstance(meta.get("shape"), tuple) or not all(isinstance(n, int) and n >= 0 for n in meta["shape"]):
        return None
    header = ArrayHeader(meta["shape"], meta["descr"])
    return header if header.kind in "biuf" and header.descr[2:].isdigit() else None


def npz_headers(path: Path, names: dict[str, str], required: tuple[str, ...],
                read: tuple[str, ...] = ()) -> Optional[dict[str, ArrayHeader]]:
    """:func:`read_npz`'s arrays as their headers (role -> :class:`ArrayHeader`), read without NumPy; the
    roles in ``read`` (uint8 arrays) with their data too. ``None`` when only reading the file as
    :func:`read_npz` does can say what is wrong with it (or that nothing is): it is not a zip archive,
    lacks a ``required`` array, holds one :func:`npy_header` cannot describe, or one of ``read`` that is
    not uint8 or ends early."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = set(archive.namelist())
            if any(f"{names[r]}.npy" not in members for r in required):
                return None
            found = {}
            for role, name in names.items():
                if f"{name}.npy" in members:
                    with archive.open(f"{name}.npy") as f:
                        found[role] = header = npy_header(f)
                        if header is not None and role in read:
                            count = 1
                            for n in header.shape:
                                count *= n
                            data = f.read(count) if str(header) == "uint8" else b""
                            found[role] = ArrayHeader(header.shape, header.descr, data) if len(data) == count else None
                    if found[role] is None:
                        return None
            return found
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return None


def _npz_array(data: Any, name: str) -> np.ndarray:
    """Array ``name`` of a ``.npz`` opened by ``np.load`` (through :func:`read_aligned` where it can)."""
    member = f"{name}.npy"
    if member in data.zip.namelist():
        with data.zip.open(member) as f:
            array = read_aligned(f)
        if array is not None:
            return array
    return data[name]


def read_npz(path: Path, names: dict[str, str], required: tuple[str, ...], fix: str) -> dict[str, np.ndarray]:
    """The arrays ``names`` (role -> array name) of a ``.npz`` file; roles missing from the file are left out.

    Read with ``allow_pickle=False``: an array of Python objects is refused.

    Raises:
        DataError: not a zip archive, unreadable, or a ``required`` role is missing.
    """
    try:
        is_zip = zipfile.is_zipfile(path)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}.", "check the path and its permissions.") from None
    if not is_zip:
        raise DataError(
            f"cannot read {path} as a .npz file: it is not a zip archive (a .npz is a zip archive of NumPy arrays).",
            fix,
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [names[r] for r in required if names[r] not in data.files]
            if missing:
                raise DataError(
                    f"{path} lacks the array(s) {', '.join(missing)}; it holds {', '.join(data.files) or 'nothing'}.",
                    fix,
                )
            return {role: _npz_array(data, name) for role, name in names.items() if name in data.files}
    except DataError:
        raise
    except Exception as exc:  # zipfile/pickle/OS errors all mean an unreadable file
        raise DataError(f"cannot read {path} as a .npz file: {str(exc).strip().rstrip('.')}.",
                        "re-create the file with numpy.savez; it must hold plain numeric arrays "
                        "(no Python objects).") from None


def _read_npy_dir(directory: Path, names: dict[str, str]) -> dict[str, np.ndarray]:
    found = {}
    for role, name in names.items():
        path = directory / f"{name}.npy"
        if not path.is_file():
            continue
        try:
            with open(path, "rb") as f:
                array = read_aligned(f)
            found[role] = array if array is not None else np.load(path, allow_pickle=False)
        except Exception as exc:  # a damaged file, or one of Python objects
            raise DataError(f"cannot read {path} as a .npy array: {str(exc).strip().rstrip('.')}.",
                            "re-create it with numpy.save; it must hold a plain numeric array.") from None
    return found


def check_weights(w: np.ndarray, samples: int, where: str) -> np.ndarray:
    """``data.keys.sample_weight``'s array checked: one finite number >= 0 per training sample, as float32.

    Raises:
        DataError: not numbers, not 1-D, another length, NaN/infinite or negative (naming the first such sample).
    """
    if not (np.issubdtype(w.dtype, np.number) or w.dtype == np.bool_):
        raise DataError(f"{where}: the sample weights are {w.dtype} values; a weight is a number >= 0.",
                        "save the weights as a float array.")
    if w.ndim != 1 or len(w) != samples:
        raise DataError(
            f"{where}: the sample weights have shape {w.shape}; expected ({samples},), one weight per training "
            "sample (x_train's first axis).",
            "save a 1-D array of one weight per training sample (e.g. w.reshape(-1)).",
        )
    w = w.astype(np.float32)
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(f"{where}: the weight of training sample {i} is {w[i]}; a weight is a finite number >= 0.",
                        "fix that weight (0 leaves the sample out of the loss, 1 is an ordinary sample).")
    return w


def check_pairs(arrays: dict[str, np.ndarray], where: str) -> None:
    """Each ``x_<split>`` has a ``y_<split>`` of the same length, and no split is empty.

    Raises:
        DataError: a half pair, a length mismatch, an empty split or non-numeric inputs.
    """
    for split in ("train", "val", "test"):
        x, y = arrays.get(f"x_{split}"), arrays.get(f"y_{split}")
        if (x is None) != (y is None):
            have, lack = (f"x_{split}", f"y_{split}") if y is None else (f"y_{split}", f"x_{split}")
            raise DataError(f"{where}: holds {have} but not {lack}; inputs and labels come in pairs.",
                            f"add {lack}, or remove {have}.")
        if x is None:
            continue
        if x.ndim < 1 or y.ndim < 1 or len(x) != len(y):
            raise DataError(
                f"{where}: x_{split} has shape {x.shape} and y_{split} {y.shape}; the first axis counts samples "
                "and must match.",
                "save one label (row) per input sample.",
            )
        if len(x) == 0:
            raise DataError(f"{where}: the {split} split is empty.", "use arrays with samples in them.")
        if x.dtype.kind not in "biufc":  # numbers and booleans (a NumPy dtype's kind, or an ArrayHeader's)
            raise DataError(f"{where}: x_{split} holds {x.dtype} values; inputs must be numbers.",
                            "convert the inputs to numbers (e.g. float32) before saving.")
    shapes = {s: arrays[f"x_{s}"].shape[1:] for s in ("train", "val", "test") if f"x_{s}" in arrays}
    if len(set(shapes.values())) > 1:
        raise DataError(
            f"{where}: the samples differ in shape between splits "
            f"({', '.join(f'{k} {v}' for k, v in shapes.items())}).",
            "save every split with the same sample shape.",
        )


class ArraysSource(Source):
    """``.npz`` / ``.npy`` arrays (see the module doc)."""

    kind = "arrays"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.arrays: dict[str, np.ndarray] = {}
        self.where = ""

    def check(self, keep: bool = True) -> None:
        cfg: DataConfig = self.cfg
        names = {role: cfg.keys.get(role, role) for role in ARRAY_ROLES}
        if SAMPLE_WEIGHT_ROLE in cfg.keys:  # read only when named
            names[SAMPLE_WEIGHT_ROLE] = cfg.keys[SAMPLE_WEIGHT_ROLE]
        fix = ("point data.path at a .npz holding x_train and y_train (rename them with data.keys), or at a "
               "folder of .npy files")
        path = existing(cfg.path, "path", "a .npz file or a folder of .npy files", fix + ".")
        if path.is_file():
            self.arrays = read_npz(path, names, ("x_train", "y_train"), fix + ".")
        else:
            self.arrays = _read_npy_dir(path, names)
            if "x_train" not in self.arrays or "y_train" not in self.arrays:
                raise DataError(
                    f"data.path: '{cfg.path}' is a folder without {names['x_train']}.npy and {names['y_train']}.npy.",
                    fix + f" ({', '.join(f'{n}.npy' for n in names.values())}).",
                )
        self.where = str(path)
        check_pairs(self.arrays, self.where)
        if SAMPLE_WEIGHT_ROLE in names:
            name = names[SAMPLE_WEIGHT_ROLE]
            if SAMPLE_WEIGHT_ROLE not in self.arrays:
                raise DataError(
                    f"data.keys.sample_weight: {self.where} has no array '{name}'"
                    + (" (as a .npy file)" if path.is_dir() else "") + ".",
                    "set data.keys.sample_weight to the name of the array of training weights, or add it.",
                )
            self.arrays["w_train"] = check_weights(self.arrays.pop(SAMPLE_WEIGHT_ROLE), len(self.arrays["x_train"]),
                                                   f"{self.where}: {name}")
        for role in ("x_train", "x_val", "x_test"):
            if role in self.arrays:
                check_finite(self.arrays[role], f"{self.where}: {names[role]}")
        if cfg.validation_split is not None and "x_val" in self.arrays:
            raise DataError(
                f"{self.where} holds validation arrays ({names['x_val']}, {names['y_val']}) and "
                f"data.validation_split is {cfg.validation_split}.",
                "remove data.validation_split to use the file's validation arrays, or drop them from the file.",
            )

    def load(self, context: LoadContext) -> Data:
        if "x_train" not in self.arrays:  # handed over by an earlier load: read the files again
            self.check()
        weights = self.cfg.keys.get(SAMPLE_WEIGHT_ROLE)
        return arrange(self, self.arrays, f"arrays from {self.where}", self.where,
                       weight_source=f"array '{weights}'" if weights else None)


def arrange(source: Source, arrays: dict[str, np.ndarray], description: str, where: str,
            num_classes: Optional[int] = None, class_names: Optional[tuple[str, ...]] = None,
            details: Optional[dict] = None, origins: Optional[dict[str, str]] = None,
            label_where: Optional[dict[str, str]] = None, weight_source: Optional[str] = None) -> Data:
    """In-memory arrays by role -> :class:`Data`: labels checked, validation chosen, inputs kept compact.

    Validation is, in order: ``data.validation_split`` of the training arrays (a
    seeded random choice), the ``x_val``/``y_val`` arrays, the test arrays
    (then ``validation_is_test``), else none. Float64 inputs are kept as float32.

    The arrays are handed over: each is taken out of ``arrays`` (a source's own
    dict) as it is held, in a buffer TensorFlow uses in place
    (:func:`~tfgpu.data.pipeline.aligned`: a copy only where the dtype changes
    or the buffer is not aligned), so no second copy stays alive; a source's
    ``load`` is called once after its ``check``.

    Args:
        origins: where each split (``train``, ``val``, ``test``) came from, in words;
            default: ``<where>: x_train, y_train`` and so on.
        label_where: where each split's labels are, for messages; default ``<where>: y_train`` ...
        weight_source: where ``arrays["w_train"]`` (per-sample training weights, checked) came from, in
            words (``column 'w'``); recorded in the spec's details as ``sample_weight``.

    Raises:
        DataError: labels outside ``[0, num_classes)`` or not numbers (see :func:`label_task`).
    """
    cfg: DataConfig = source.cfg
    origins = {s: f"{where}: x_{s}, y_{s}" for s in ("train", "val", "test")} | (origins or {})
    label_where = {s: f"{where}: y_{s}" for s in ("train", "val", "test")} | (label_where or {})
    labels = label_task([(label_where[s], arrays[f"y_{s}"]) for s in ("train", "val", "test") if f"y_{s}" in arrays],
                        source.loss, cfg.num_classes or num_classes)
    x_dtype = "uint8" if arrays["x_train"].dtype == np.uint8 else "float32"

    def compact(role: str) -> np.ndarray:
        return aligned(arrays.pop(role), x_dtype)

    def label(role: str) -> np.ndarray:  # class numbers as one column, (N, 1), become (N,)
        y = arrays.pop(role)
        if labels.task == "classification" and y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        return aligned(y, labels.dtype)

    def taken(a: np.ndarray, indices: np.ndarray) -> np.ndarray:
        return np.take(a, indices, axis=0, out=aligned_empty((len(indices), *a.shape[1:]), a.dtype))

    x_train, y_train = compact("x_train"), label("y_train")
    w_train = arrays.pop("w_train", None)  # training weights travel with their samples (Split.w)
    validation = test = None
    is_test = False
    if cfg.validation_split is not None:
        keep, held = holdout(len(x_train), cfg.validation_split, source.split_seed, where)
        origin = f"validation_split {cfg.validation_split} of the training samples (seed {source.split_seed})"
        validation = Split("validation", origin, taken(x_train, held), taken(y_train, held), size=len(held))
        x_train, y_train = taken(x_train, keep), taken(y_train, keep)
        w_train = w_train[keep] if w_train is not None else None
    elif "x_val" in arrays:
        x_val = compact("x_val")
        validation = Split("validation", origins["val"], x_val, label("y_val"), size=len(x_val))
    if "x_test" in arrays:
        x_test = compact("x_test")
        test = Split("test", origins["test"], x_test, label("y_test"), size=len(x_test))
        if validation is None:
            validation, test, is_test = Split("validation", test.origin + " (the test split)", test.x, test.y,
                                              size=test.size), None, True
    train = Split("train", origins["train"], x_train, y_train, size=len(x_train), w=w_train)
    if w_train is not None:
        details = {**(details or {}), "sample_weight": weight_source or "given"}
    grey = x_dtype == "uint8" and x_train.ndim == 3  # (N, H, W) images get a channel axis
    spec = DataSpec(kind=cfg.kind, source=description, sample_shape=tuple(x_train.shape[1:]), x_dtype=x_dtype,
                    add_channel=grey, rescale=rescale_for(cfg, x_dtype), task=labels.task,
                    num_classes=labels.num_classes, class_names=class_names,
                    target_shape=tuple(y_train.shape[1:]), label_dtype=labels.dtype, details=dict(details or {}))
    return Data(train, validation, test, spec, validation_is_test=is_test)
