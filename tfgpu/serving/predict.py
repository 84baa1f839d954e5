"""``tfgpu predict RUN_DIR INPUT...``: run a finished run's model on new images, CSV rows or arrays.

Every input is read and checked before TensorFlow (or JAX) starts: image files
and folders are listed and opened with Pillow (header and integrity), CSV cells
parsed, array shapes compared with the run's. Then the run's devices are set up
as ``tfgpu run`` set them (:func:`tfgpu.setup`, the strategy's scope), the
*serving model* (:func:`tfgpu.serving.inference.load_serving_model`: raw inputs in,
float32 probabilities or values out) is loaded and ``keras.Model.predict``
runs over the inputs in chunks, images decoded by a ``tf.data`` pipeline
(parallel ``map`` of :func:`tfgpu.data.image_folder.decode_image`, ``batch``,
``prefetch``) exactly as the run's pipeline decoded them. Rows are written as
each chunk ends to a temporary file renamed at the end, so the output appears
whole or not at all; a record ``<FILE>.json`` is written beside it.

See docs/predict.md.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, TextIO

import numpy as np

from ..errors import DataError, OutputError, UsageError
from ..utils.files import (disk_full, disk_full_error, missing_folders, remove_empty_folders, remove_quietly,
                           write_json)
from .inference import OutputStop, RunModel, open_run, refuse_data_files, refuse_run_files

#: The output formats, by the output file's extension (no extension: CSV).
FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".npy": "npy", "": "csv"}
#: Samples handed to one ``model.predict`` call: rows are written (and memory freed) after each.
CHUNK_SAMPLES = 32768
#: Default ``--top-k``: the K most probable classes listed per row (at most the run's classes).
TOP_K = 3
_ARRAY_EXTENSIONS = (".npy", ".npz")


@dataclass
class Group:
    """Inputs of one kind, in the order given: image paths, or an array of raw samples.

    Attributes:
        source: the input as given on the command line (a file or folder).
        ids: one id per sample: an image's path, ``FILE:LINE`` of a CSV row, ``FILE[i]`` of an array row.
        paths: images to decode (``None`` for arrays).
        x: raw samples ``(N, *stored_shape)`` as read (a ``.npy`` memory-mapped, any numeric dtype; converted
            to the run's dtype a chunk at a time), ``None`` for images.
        labels: classification: class numbers (int64, -1 where unknown); regression: float64 ``(N, units)``
            (NaN where unknown); ``None``: no labels.
        resize: for images: see :func:`tfgpu.data.image_folder.decode_image`.
    """

    source: str
    ids: list[str]
    paths: Optional[list[str]] = None
    x: Optional[np.ndarray] = None
    labels: Optional[np.ndarray] = None
    resize: Optional[bool] = None

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Inputs:
    """Every input, checked: the groups to predict and the files left out (``--skip-bad``)."""

    groups: list[Group]
    skipped: list[dict[str, str]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(g) for g in self.groups)


# ----------------------------------------------------------------------------------------------- reading inputs

def _class_index(run: RunModel) -> dict[str, int]:
    return {name: i for i, name in enumerate(run.class_names or [])}


def _image_geometry(run: RunModel) -> tuple[tuple[int, int], int, bool]:
    """``((height, width), channels, fixed)``: ``fixed`` when the run converts other channel counts."""
    shape = run.stored_shape
    channels = shape[2] if len(shape) == 3 else 1
    fixed = run.kind != "image_folder" or run.cfg.data.color_mode is not None
    return (shape[0], shape[1]), channels, fixed


def _list_folder(folder: Path) -> list[str]:
    from ..data.image_folder import walk_sorted  # noqa: PLC0415

    return [os.path.join(dirpath, name) for dirpath, files in walk_sorted(folder) for name in files]


def _read_images(run: RunModel, given: str, paths: list[str], folder: Optional[Path],
                 bad: list[tuple[str, str]]) -> Group:
    """Check images with Pillow; the bad ones go to ``bad``; labels from class sub-folders of ``folder``."""
    from ..data.image_folder import EXTENSIONS, _inspect  # noqa: PLC0415

    size, channels, fixed = _image_geometry(run)
    good: list[str] = []
    sizes: set[tuple[int, int]] = set()
    for path in paths:
        if not path.lower().endswith(EXTENSIONS):
            bad.append((path, "not an image by its extension (png, jpeg, jpg, bmp, gif)"))
            continue
        shape, have, why = _inspect(path)
        if why is None and not fixed and have != channels:
            why = (f"an image of {have} channel(s), but the run's images have {channels} (data.color_mode was not "
                   "set, so training took the images' own channels and would refuse this one too)")
        if why is not None:
            bad.append((path, why))
            continue
        good.append(path)
        sizes.add(shape)
    labels = None
    index = _class_index(run)
    if folder is not None and index and good:
        parts = [Path(p).relative_to(folder).parts for p in good]
        if all(len(q) >= 2 and q[0] in index for q in parts):
            labels = np.asarray([index[q[0]] for q in parts], dtype=np.int64)
    resize: Optional[bool] = True if run.data.get("resized") else (False if sizes <= {size} else None)
    return Group(given, list(good), paths=good, labels=labels, resize=resize)


def _read_csv(run: RunModel, path: Path, given: str) -> Group:
    """The run's feature columns of a CSV, by name; the label column if present."""
    features = run.features
    if not features:
        raise DataError(f"tfgpu predict: {given} is a CSV file, but the run trained on {run.kind} data "
                        f"({'x'.join(map(str, run.stored_shape))} samples), not on CSV columns.",
                        "give inputs of the run's kind: image files or folders, or .npy/.npz arrays.")
    from ..data.csv import finite_number, not_a_number, read_rows  # noqa: PLC0415

    delimiter = run.cfg.data.delimiter if run.kind == "csv" else ","
    lines = read_rows(path, delimiter, "tfgpu predict", given, "check the file.")
    if not lines:
        raise DataError(f"tfgpu predict: {given} is empty; expected a header row, then one row per sample.",
                        "give a CSV with the run's columns.")
    header = [h.strip() for h in lines[0][1]]
    missing = [n for n in features if n not in header]
    if missing:
        raise DataError(f"tfgpu predict: {given} has no column(s) {', '.join(missing)}; the run's model takes the "
                        f"columns {', '.join(features)} (any order; others are ignored); the file has "
                        f"{', '.join(header)}.", "add the missing columns, named as in the training file's header.")
    cols = [header.index(n) for n in features]
    label = run.label if run.label in header else None
    target = header.index(label) if label else -1
    regression = run.task != "classification"
    x = np.empty((len(lines) - 1, len(cols)), dtype=np.float32)
    y = np.full(len(lines) - 1, -1 if not regression else np.nan, dtype=np.int64 if not regression else np.float64)
    ids = []
    for i, (line, row) in enumerate(lines[1:]):
        if len(row) != len(header):
            raise DataError(f"tfgpu predict: {given}, line {line} has {len(row)} fields; the header has "
                            f"{len(header)}.", f"give every row one field per column (separated by {delimiter!r}).")
        for j, c in enumerate(cols):
            value = finite_number(row[c])
            if value is None:
                what = not_a_number(row[c], "not a finite number")
                raise DataError(f"tfgpu predict: {given}, line {line}, column '{features[j]}' {what}; every "
                                "feature cell must be a number, as in training.",
                                "fill or drop the rows with missing values, and encode categories as numbers.")
            x[i, j] = value
        if label:
            value = finite_number(row[target])
            if value is not None:
                # a classifier's label is a class number; anything else (1.7, 1e30) counts as unknown
                y[i] = value if regression else (int(value) if value.is_integer() and 0 <= value < 2 ** 62 else -1)
        ids.append(f"{given}:{line}")
    labels = None
    if label:
        labels = y.reshape(-1, 1) if regression else y
    return Group(given, ids, x=x, labels=labels)


def _first_not_finite(x: np.ndarray, rows: int = 65536) -> Optional[tuple[int, ...]]:
    """The index of the first NaN or infinity in ``x``, or of a value beyond float32's range (which the model's
    float32 would make infinite), read ``rows`` samples at a time; else ``None``."""
    from ..data.base import not_finite_in_float32  # noqa: PLC0415

    if x.dtype.kind != "f":
        return None
    for lo in range(0, len(x), rows):
        where = np.argwhere(not_finite_in_float32(np.asarray(x[lo:lo + rows])))
        if len(where):
            return (lo + int(where[0][0]), *(int(i) for i in where[0][1:]))
    return None


def _read_array(run: RunModel, path: Path, given: str) -> Group:
    """A ``.npy`` of raw samples, or a ``.npz`` with ``x`` (and ``y``) or the run's array names."""
    try:
        if path.suffix.lower() == ".npy":
            # memory-mapped: a large .npy is read page by page as its chunks are predicted, not all at once
            x, y, keys = np.load(path, allow_pickle=False, mmap_mode="r"), None, "the array"
        else:
            with np.load(path, allow_pickle=False) as data:
                names = list(data.files)
                run_keys = dict(run.cfg.data.keys) if run.kind == "arrays" else {}
                for xk, yk in (("x", "y"), (run_keys.get("x_test", "x_test"), run_keys.get("y_test", "y_test"))):
                    if xk in names:
                        x, y, keys = data[xk], data[yk] if yk in names else None, f"array '{xk}'"
                        break
                else:
                    raise DataError(f"tfgpu predict: {given} has no array 'x' (nor 'x_test'); it holds "
                                    f"{', '.join(names) or 'nothing'}.",
                                    "save the samples as x (and their labels as y): np.savez(FILE, x=..., y=...).")
    except DataError:
        raise
    except Exception as exc:  # not a NumPy file, pickled objects, damaged
        raise DataError(f"tfgpu predict: cannot read {given} as a NumPy array file: {type(exc).__name__}: {exc}.",
                        "give a .npy or .npz written by numpy.save / numpy.savez.") from None
    shape = run.stored_shape
    if x.ndim == len(run.input_shape) + 1 and x.shape[1:] == run.input_shape and run.add_channel:
        x = x.reshape((len(x), *shape))
    if len(shape) == 3 and shape[-1] == 1 and tuple(x.shape[1:]) == shape[:-1]:  # grey images without the axis
        x = x.reshape((len(x), *shape))
    if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != shape:
        raise DataError(f"tfgpu predict: {given}: {keys} has shape {tuple(x.shape)}; the run's model takes "
                        f"(N, {', '.join(map(str, shape))}) (N samples as the run's data stores them).",
                        "give samples of the run's shape (images at the run's image size).")
    # No conversion here: a memory-mapped .npy stays on disk; each chunk is converted as it is predicted.
    if run.stored_dtype == "uint8":
        if x.dtype.kind not in "iub" or (x.size and (x.min() < 0 or x.max() > 255)):
            low, high = (float(x.min()), float(x.max())) if x.size else (0, 0)
            raise DataError(f"tfgpu predict: {given}: {keys} is {x.dtype} with values {low:g} to {high:g}; the run "
                            "takes raw 8-bit pixels (whole numbers 0-255), and rescales them itself.",
                            "give the pixels as stored (uint8), not divided by 255.")
    else:
        if x.dtype.kind not in "iufb":
            raise DataError(f"tfgpu predict: {given}: {keys} is {x.dtype}, not numbers.", "give a numeric array.")
        bad = _first_not_finite(x)
        if bad is not None:
            raise DataError(f"tfgpu predict: {given}: {keys} holds {x[bad]} "
                            f"at sample {bad[0]} (index {list(bad)}); every value must be a finite number within "
                            "float32's range (the model computes in float32), as in training.",
                            "fill or drop the samples with missing values.")
    labels = None
    if y is not None:
        if len(y) != len(x):
            raise DataError(f"tfgpu predict: {given}: y has {len(y)} labels for {len(x)} samples.",
                            "give one label per sample, or leave y out.")
        if run.task == "classification":
            labels = _class_labels(np.asarray(y), run, given)
        else:
            if np.asarray(y).dtype.kind not in "iufb":
                raise DataError(f"tfgpu predict: {given}: y is {np.asarray(y).dtype}, not numbers; the run is a "
                                "regression, whose labels are the true values.", "give y as numbers, or leave it out.")
            labels = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    return Group(given, [f"{given}[{i}]" for i in range(len(x))], x=x, labels=labels)


def _class_labels(y: np.ndarray, run: RunModel, given: str) -> np.ndarray:
    """A ``.npz``'s ``y`` as class numbers (int64 ``(N,)``, -1 where unknown): class numbers ``(N,)`` or
    ``(N, 1)``, one-hot or probability rows ``(N, classes)`` (their argmax), or class names (text).

    Raises:
        DataError: text that is not one of the run's class names, fractional class numbers, or another shape.
    """
    names = run.class_names or []
    classes = int(run.num_classes or len(names) or 0)
    if y.dtype.kind in "US":
        index = _class_index(run)
        text = y.astype(str).reshape(len(y), -1)
        unknown = sorted({str(v) for v in text[:, 0] if v not in index}) if text.shape[1] == 1 else ["(rows)"]
        if unknown or text.shape[1] != 1:
            raise DataError(f"tfgpu predict: {given}: y holds text labels {', '.join(map(repr, unknown[:5]))}, which "
                            f"are not the run's class names ({', '.join(names) or 'the run has none'}).",
                            "give y as class numbers 0, 1, ... or as the run's class names, or leave it out.")
        return np.asarray([index[v] for v in text[:, 0]], dtype=np.int64)
    if y.dtype.kind not in "iufb":
        raise DataError(f"tfgpu predict: {given}: y is {y.dtype}, not class numbers.",
                        "give y as class numbers 0, 1, ..., or leave it out.")
    rows = y.reshape(len(y), -1)
    if rows.shape[1] > 1:
        if rows.shape[1] != classes:
            raise DataError(f"tfgpu predict: {given}: y has shape {tuple(y.shape)}; expected class numbers (N,) or "
                            f"one-hot rows (N, {classes}) for the run's {classes} classes.",
                            "give y as class numbers, or as one-hot rows of the run's classes.")
        return np.argmax(rows, axis=1).astype(np.int64)  # one-hot (or probability) rows: the class each names
    values = rows[:, 0].astype(np.float64)
    whole = np.isfinite(values) & (values == np.round(values))
    if not whole.all():
        i = int(np.argmin(whole))
        raise DataError(f"tfgpu predict: {given}: y[{i}] is {values[i]:g}, not a class number (0 to "
                        f"{max(classes - 1, 0)}).", "give y as whole class numbers, or leave it out.")
    return values.astype(np.int64)


def read_inputs(run: RunModel, inputs: Sequence[str], skip_bad: bool = False) -> Inputs:
    """Read and check every input without TensorFlow.

    Args:
        run: the run (:func:`tfgpu.serving.inference.open_run`).
        inputs: image files and folders (image runs), CSV files (CSV runs), ``.npy``/``.npz`` files.
        skip_bad: leave unreadable images out (listed in the result) instead of failing.

    Returns:
        The :class:`Inputs`.

    Raises:
        DataError: an input does not exist, is of another kind than the run's, or is malformed
            (unreadable images unless ``skip_bad``, a CSV missing a feature column or with a
            non-numeric cell, an array of the wrong shape), or there is nothing to predict.
    """
    from ..data.image_folder import EXTENSIONS  # noqa: PLC0415

    groups: list[Group] = []
    bad: list[tuple[str, str]] = []
    for given in inputs:
        path = Path(given)
        if not path.exists():
            raise DataError(f"tfgpu predict: the input '{given}' does not exist.",
                            "check the path (relative paths are read from the current directory).")
        suffix = path.suffix.lower()
        if path.is_dir() or suffix in EXTENSIONS:
            if not run.is_image:
                raise DataError(f"tfgpu predict: '{given}' is {'a folder' if path.is_dir() else 'an image'}, but the "
                                f"run trained on {run.kind} data of shape {run.stored_shape}, not on images.",
                                "give CSV files with the run's columns, or .npy/.npz arrays.")
            if path.is_dir():
                files = _list_folder(path)
                if not files:
                    raise DataError(f"tfgpu predict: the folder '{given}' holds no files.",
                                    "give a folder of images (png, jpeg, jpg, bmp, gif), sub-folders allowed.")
                groups.append(_read_images(run, given, files, path, bad))
            else:
                groups.append(_read_images(run, given, [given], None, bad))
        elif suffix == ".csv":
            groups.append(_read_csv(run, path, given))
        elif suffix in _ARRAY_EXTENSIONS:
            groups.append(_read_array(run, path, given))
        else:
            what = "image files or folders, .npy/.npz arrays" if run.is_image else "CSV files, .npy/.npz arrays"
            raise DataError(f"tfgpu predict: the input '{given}' is a {suffix or 'extension-less'} file; for this "
                            f"run ({run.kind}) give {what}.",
                            "convert it, or check the path.")
    if bad and not skip_bad:
        shown = "; ".join(f"{p} ({why})" for p, why in bad[:5])
        more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise DataError(f"tfgpu predict: {len(bad)} input file(s) cannot be used: {shown}{more}.",
                        "replace or remove them, or add --skip-bad to predict the others and list these in the "
                        "record.")
    result = Inputs([g for g in groups if len(g)], [{"path": p, "reason": why} for p, why in bad])
    if not result.count:
        raise DataError(f"tfgpu predict: nothing to predict in {', '.join(inputs)}"
                        + (f" (all {len(bad)} file(s) were bad and skipped)." if bad else "."),
                        "give inputs that hold samples.")
    return result


# ------------------------------------------------------------------------------------------------------ output

class Output:
    """Where the rows go: a temporary file beside ``path`` renamed at the end, or stdout.

    Args:
        path: the output file, or ``None`` for CSV on stdout.
        run: the run (class names, task).
        top_k: classes listed per row.
        labelled: some input has labels: CSV rows get ``label`` (and ``correct``) columns, empty where unknown.
    """

    def __init__(self, path: Optional[Path], run: RunModel, top_k: int, labelled: bool = False) -> None:
        self.path, self.run, self.top_k = path, run, top_k
        self.with_labels = labelled  # CSV: label columns for every row when any input has labels
        self.format = FORMATS[path.suffix.lower()] if path is not None else "csv"
        self.names = run.class_names
        # this process's own temporary names: another predict writing the same output cannot collide
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp") if path is not None else None
        self.ids_path = path.with_name(path.name + ".ids.txt") if self.format == "npy" else None
        self._ids_tmp = self.ids_path.with_name(f".{self.ids_path.name}.{os.getpid()}.tmp") if self.ids_path else None
        self.written = 0
        self.correct = 0
        self.labelled = 0
        self.not_finite = 0  # rows whose model output holds NaN or infinity (never counted correct)
        self.abs_error = 0.0
        self.sq_error = 0.0
        self._file: Optional[TextIO] = None
        self._ids: Optional[TextIO] = None
        self._array: Any = None
        self._header_done = False
        self._made: list[Path] = []

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Turn a failed write of the output into one paragraph, after removing the temporary file(s): a full
        disk or quota is :class:`~tfgpu.errors.DiskFull` (exit 8, with the free space, as ``tfgpu run``
        reports it: :func:`tfgpu.utils.files.disk_full_error`), any other write error an ``OutputError``."""
        try:
            yield
        except OSError as exc:
            if self.path is None:  # stdout: nothing of ours to remove, nothing to name
                raise
            self.abort()
            code = disk_full(exc)
            if code is not None:
                raise disk_full_error(code, self.path, self.path.parent, "Nothing was written.",
                                      "free space on that filesystem, or give --output on another one, then "
                                      "predict again.") from None
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}.",
                              "check the disk space and permissions.") from None

    def open(self, count: int, units: int) -> None:
        """Open the temporary file(s) (or stdout) for ``count`` rows of ``units`` outputs."""
        with self._writing():
            self._open(count, units)

    def _open(self, count: int, units: int) -> None:
        if self.path is None:
            self._file = sys.stdout
            self._csv = csv.writer(self._file, lineterminator="\n") if self.format == "csv" else None
            return
        # the folders made here are removed again if the prediction fails (deepest first, while empty)
        self._made = missing_folders(self.path.parent)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.format == "npy":
            self._array = np.lib.format.open_memmap(self.tmp, mode="w+", dtype=np.float32, shape=(count, units))
            self._ids = open(self._ids_tmp, "w", encoding="utf-8")
        else:
            self._file = open(self.tmp, "w", encoding="utf-8", newline="")
        self._csv = csv.writer(self._file, lineterminator="\n") if self.format == "csv" and self._file else None

    def _classes(self, probs: np.ndarray) -> np.ndarray:
        """Per-class probabilities ``(n, classes)``: a one-unit sigmoid gives ``[1 - p, p]``."""
        if probs.shape[1] == 1 and len(self.names or []) == 2:
            return np.concatenate([1.0 - probs, probs], axis=1)
        return probs

    def write(self, ids: Sequence[str], out: np.ndarray, labels: Optional[np.ndarray]) -> None:
        """Write the rows of one chunk: ``out`` float32 ``(n, units)`` from the serving model."""
        with self._writing():
            self._write(ids, out, labels)

    def _write(self, ids: Sequence[str], out: np.ndarray, labels: Optional[np.ndarray]) -> None:
        n = len(ids)
        classify = self.names is not None
        finite = np.isfinite(out).all(axis=1)  # a NaN output's argmax is class 0: it must not count as correct
        self.not_finite += int((~finite).sum())
        if classify:
            probs = self._classes(out)
            if out.shape[1] == 1:  # Keras's binary accuracy: class 1 where p > 0.5
                predicted = (out[:, 0] > 0.5).astype(np.int64)
            else:
                predicted = np.argmax(probs, axis=1)
            k = min(self.top_k, probs.shape[1])
            top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
            if labels is not None:
                known = labels >= 0
                self.labelled += int(known.sum())
                self.correct += int((predicted[known & finite] == labels[known & finite]).sum())
        elif labels is not None:
            known = ~np.isnan(labels).any(axis=1)
            diff = out[known].astype(np.float64) - labels[known]
            self.labelled += int(known.sum())
            self.abs_error += float(np.abs(diff).mean(axis=1).sum()) if len(diff) else 0.0
            self.sq_error += float((diff ** 2).mean(axis=1).sum()) if len(diff) else 0.0
        if self.format == "npy":
            self._array[self.written:self.written + n] = out
            self._ids.write("".join(f"{i}\n" for i in ids))
            self.written += n
            return
        names = self.names or []
        rows = []
        for r in range(n):
            if classify:
                c = int(predicted[r])
                row: dict[str, Any] = {"id": ids[r], "class": names[c], "probability": float(probs[r, c]),
                                       "top_k": [(names[int(j)], float(probs[r, j])) for j in top[r]]}
                if labels is not None and labels[r] >= 0:
                    row["label"], row["correct"] = names[int(labels[r])] if labels[r] < len(names) else \
                        str(int(labels[r])), bool(c == labels[r] and finite[r])
            else:
                values = [float(v) for v in out[r]]
                row = {"id": ids[r], "value": values[0] if len(values) == 1 else values}
                if labels is not None and not np.isnan(labels[r]).any():
                    row["label"] = float(labels[r, 0]) if labels.shape[1] == 1 else [float(v) for v in labels[r]]
            rows.append(row)
        if self.format == "jsonl":
            for row in rows:
                if "top_k" in row:
                    row["top_k"] = [{"class": c, "probability": p} for c, p in row["top_k"]]
                self._file.write(json.dumps(row) + "\n")
        else:
            with_labels = self.with_labels
            if not self._header_done:
                head = (["id", "class", "probability", "top_k"] if classify
                        else ["id"] + (["value"] if out.shape[1] == 1 else [f"value_{i}" for i in range(out.shape[1])]))
                self._csv.writerow(head + ((["label", "correct"] if classify else ["label"]) if with_labels else []))
                self._header_done = True
            for row in rows:
                if classify:
                    line = [row["id"], row["class"], f"{row['probability']:.6g}",
                            " ".join(f"{c}:{p:.6g}" for c, p in row["top_k"])]
                    if with_labels:
                        line += [row.get("label", ""), "" if "correct" not in row else str(row["correct"]).lower()]
                else:
                    v = row["value"]
                    line = [row["id"]] + [f"{x:.7g}" for x in (v if isinstance(v, list) else [v])]
                    if with_labels:
                        lab = row.get("label", "")
                        line += [" ".join(f"{x:.7g}" for x in lab) if isinstance(lab, list) else
                                 (f"{lab:.7g}" if lab != "" else "")]
                self._csv.writerow(line)
        self.written += n

    def commit(self) -> None:
        """Close and rename the temporary file(s) into place."""
        if self.path is None:
            sys.stdout.flush()
            return
        with self._writing():
            if self._array is not None:
                self._array.flush()
                del self._array
                self._array = None
                self._ids.close()
                os.replace(self._ids_tmp, self.ids_path)
            else:
                self._file.close()
            os.replace(self.tmp, self.path)

    def abort(self) -> None:
        """Remove the temporary file(s): nothing half-written is left."""
        if self.path is None:
            return
        for handle in (self._file, self._ids):
            try:
                if handle is not None:
                    handle.close()
            except OSError:
                pass
        self._array = None
        remove_quietly(self.tmp)
        if self.ids_path is not None:
            remove_quietly(self._ids_tmp)
        remove_empty_folders(self._made)
        self._made = []

    def metrics(self) -> dict[str, Any]:
        """Accuracy (classifiers) or mean absolute / squared error (regression) over the labelled rows, and
        ``not_finite``: the rows whose output held NaN or infinity, when there were any (a classifier counts them
        wrong; they make a regression's errors NaN)."""
        bad = {"not_finite": self.not_finite} if self.not_finite else {}
        if not self.labelled:
            return bad
        if self.names is not None:
            return {"labelled": self.labelled, "correct": self.correct, "accuracy": self.correct / self.labelled, **bad}
        return {"labelled": self.labelled, "mae": self.abs_error / self.labelled, "mse": self.sq_error / self.labelled,
                **bad}


def check_output(output: Optional[str], inputs: Sequence[str] = ()) -> Optional[Path]:
    """Check ``--output`` before any work, creating nothing: a known extension, not one of the inputs nor a file of
    a run directory, and a place that can be written (its folders are made when the rows are written).

    Raises:
        UsageError: an extension other than ``.csv``, ``.jsonl``, ``.npy`` (or none, meaning CSV); the output
            (or its record ``FILE.json``, or its ``FILE.ids.txt``) is one of ``inputs``, or would replace a run
            directory's own file (:func:`tfgpu.serving.inference.refuse_run_files`; an earlier prediction with
            its record may be replaced).
        OutputError: the file is a folder, or the nearest existing folder above it cannot be written.
    """
    if output is None:
        return None
    path = Path(output)
    if path.suffix.lower() not in FORMATS:
        raise UsageError(f"tfgpu predict: --output {output}: '{path.suffix}' is not an output format; the format "
                         "follows the extension: .csv, .jsonl or .npy (no extension: CSV).",
                         f"name the file e.g. {path.with_suffix('.csv')}.")
    sidecars = output_files(path)[1:]
    written = {os.path.realpath(p) for p in (path, *sidecars)}
    clash = next((given for given in inputs if os.path.realpath(given) in written), None)
    if clash is not None:
        raise UsageError(f"tfgpu predict: --output {output} would overwrite the input {clash}.",
                         f"write the predictions to another file, e.g. {path.with_name(path.stem + '.predictions.csv')}.")
    refuse_run_files("predict", "--output", output, (path, *sidecars), earlier_output=_earlier_prediction(path))
    if path.is_dir():
        raise OutputError(f"tfgpu predict: --output {output} is a folder; expected a file name.",
                          f"name a file inside it, e.g. {path / 'predictions.csv'}.")
    folder = Path(os.path.abspath(path)).parent
    while not folder.exists():  # the folders to make: made when the rows are written, not for a failed check
        folder = folder.parent
    why = None
    if not folder.is_dir():
        why = f"{folder} is a file, not a folder"
    elif not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        why = "Permission denied"
    if why is not None:
        raise OutputError(f"tfgpu predict: cannot write --output {output}: {why}.",
                          "choose a file in a folder you can write to.")
    return path


def output_files(path: Path) -> tuple[Path, Path, Path]:
    """What ``--output PATH`` writes: the rows, their record ``PATH.json`` and (``.npy``) the ids ``PATH.ids.txt``."""
    return path, record_path(path), path.with_name(path.name + ".ids.txt")


def _earlier_prediction(path: Path) -> bool:
    """``path`` is an earlier ``tfgpu predict`` output: its record beside it names a file of the same name."""
    try:
        record = json.loads(record_path(path).read_text(encoding="utf-8"))
        return isinstance(record, dict) and {"run_dir", "inputs", "format"} <= set(record) \
            and Path(str(record.get("output"))).name == path.name
    except (OSError, ValueError):
        return False


def record_path(path: Path) -> Path:
    """The record beside the output: ``<FILE>.json`` (``preds.csv`` -> ``preds.csv.json``)."""
    return path.with_name(path.name + ".json")


# -------------------------------------------------------------------------------------------------- predicting

class _Progress:
    """One updating line on stderr when it is a terminal; silent otherwise."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def add(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if self.tty and (now - self.last > 0.5 or self.done >= self.total):
            self.last = now
            rate = self.done / max(now - self.start, 1e-9)
            sys.stderr.write(f"\rtfgpu predict: {self.done:,}/{self.total:,} samples, {rate:,.0f} samples/s")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def _keras_progress(progress: _Progress, batch_size: int, chunk: int, stop: OutputStop) -> Any:
    """A Keras callback counting ``model.predict``'s samples into ``progress``, and stopping it (Keras's
    ``Model.stop_predicting``) after the batch it is on once ``stop`` has received a signal."""
    import keras  # noqa: PLC0415

    class Callback(keras.callbacks.Callback):
        # Dispatched on Keras's callback thread: a callback that is not async-safe makes model.predict convert
        # every batch's outputs to NumPy before the next batch (measured: 10% fewer samples/s on 2 replicas).
        async_safe = True

        def __init__(self) -> None:
            super().__init__()
            self.seen = 0

        def on_predict_batch_end(self, batch: int, logs: Any = None) -> None:
            n = min(batch_size, chunk - self.seen)
            self.seen += n
            progress.add(n)
            if stop.received is not None:
                self.model.stop_predicting = True

    return Callback()


def _image_dataset(paths: list[str], run: RunModel, resize: Optional[bool], batch_size: int) -> Any:
    import tensorflow as tf  # noqa: PLC0415

    from ..data.image_folder import decode_image  # noqa: PLC0415

    size, channels, _ = _image_geometry(run)
    drop = len(run.stored_shape) == 2
    interpolation = run.cfg.data.interpolation

    def decode(path: Any) -> Any:
        image = decode_image(path, size, channels, resize, interpolation)
        return image[..., 0] if drop else image

    ds = tf.data.Dataset.from_tensor_slices(paths)
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _decode_error(path: str, run: RunModel, resize: Optional[bool]) -> Optional[str]:
    """Why TensorFlow cannot decode the image ``path`` as training would
    (:func:`tfgpu.data.image_folder.decode_image`), in its own words; ``None`` when it can."""
    import tensorflow as tf  # noqa: PLC0415

    from ..data.base import tf_error_text  # noqa: PLC0415
    from ..data.image_folder import decode_image  # noqa: PLC0415

    size, channels, _ = _image_geometry(run)
    try:
        decode_image(tf.constant(path), size, channels, resize, run.cfg.data.interpolation)
    except Exception as exc:  # noqa: BLE001 - any failure of TensorFlow's decoder
        return tf_error_text(exc)
    return None


def _locate(paths: list[str], run: RunModel, resize: Optional[bool]) -> str:
    """The first image TensorFlow cannot decode, and why."""
    for path in paths:
        why = _decode_error(path, run, resize)
        if why is not None:
            return f"{path}: {why}"
    return "one of the images"


def _need_tensorflow(run: RunModel, inputs: Inputs) -> None:
    if run.backend != "jax" or not any(g.paths is not None for g in inputs.groups):
        return
    from ..devices.jax_apply import tensorflow_importable  # noqa: PLC0415

    if not tensorflow_importable():
        raise DataError("tfgpu predict: image inputs need TensorFlow to decode them (tf.io.decode_image, as in "
                        "training), which is not installed here; arrays and CSV inputs need only JAX.",
                        "pip install tensorflow-cpu (decoding only), or give the images as a .npy/.npz array.")


def predict(run_dir: str, inputs: Sequence[str], output: Optional[str] = None, top_k: int = TOP_K,
            batch_size: Optional[int] = None, overrides: Sequence[str] = (), skip_bad: bool = False,
            log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict[str, Any]:
    """Predict with a run's model on ``inputs``; write the rows and the record; return the record.

    Args:
        run_dir: a directory written by ``tfgpu run`` (with ``model.keras``).
        inputs: image files/folders, CSV files or ``.npy``/``.npz`` files (see :func:`read_inputs`).
        output: ``.csv``, ``.jsonl`` or ``.npy`` file (no extension: CSV); ``None``: CSV on stdout, no record.
        top_k: classes listed per row (classifiers), at least 1.
        batch_size: samples per step over all replicas; ``None``: the run's
            ``train.batch_size_per_replica`` x replicas.
        overrides: ``--set`` strings over the run's config (e.g. ``devices.cpu_logical_devices=2``).
        skip_bad: predict the readable images and list the others in the record.
        log: where progress notes go (stderr).

    Returns:
        The record: ``run_dir``, ``inputs``, ``output``, ``format``, ``count``, ``skipped``,
        ``seconds``, ``samples_per_second``, ``per_input`` (each input's count and seconds), ``batch_size``, ``num_replicas``, ``devices``,
        ``backend`` and, with labels, ``accuracy`` (or ``mae``/``mse``).

    Raises:
        DataError: the run or an input is unusable (see :func:`read_inputs`).
        UsageError: a bad ``--output`` extension, ``--top-k`` or ``--batch-size``.
        OutputError: the output cannot be written.

    Wraps: https://keras.io/api/models/model_training_apis/#predict-method
    """
    path = check_output(output, inputs)
    run = open_run(run_dir, "predict", overrides)
    if path is not None:
        refuse_data_files("predict", "--output", str(output), output_files(path), run.cfg)
    if top_k < 1:
        raise UsageError(f"tfgpu predict: --top-k {top_k}: expected 1 or more.", "e.g. --top-k 3.")
    found = read_inputs(run, inputs, skip_bad)
    _need_tensorflow(run, found)
    for item in found.skipped:
        log(f"tfgpu predict: skipped {item['path']}: {item['reason']}")
    stop = OutputStop("predict")
    with stop.installed():
        return _predict(run, found, inputs, path, top_k, batch_size, log, stop, skip_bad)


def _predict(run: RunModel, found: Inputs, inputs: Sequence[str], path: Optional[Path], top_k: int,
             batch_size: Optional[int], log: Callable[[str], None], stop: OutputStop,
             skip_bad: bool) -> dict[str, Any]:
    """:func:`predict` once the inputs are read: start, load, predict, write (a stop signal: ``stop``)."""
    from ..devices.setup import setup  # noqa: PLC0415
    from .inference import load_serving_model  # noqa: PLC0415

    stop.doing = "starting TensorFlow and loading the model"
    # Signals wait for safe points from here on: an exception raised into TensorFlow's C++ code (an import it makes
    # mid-predict among them) ended predict with 1 and a SystemError traceback instead of 75 (seen in CI)
    with stop.held():
        info = setup(run.cfg)
        replicas = int(info.num_replicas or 1)
        batch = batch_size if batch_size is not None else run.cfg.train.batch_size_per_replica * replicas
        if batch < 1 or (run.backend == "jax" and batch % replicas):
            raise UsageError(f"tfgpu predict: --batch-size {batch}: expected a positive multiple of the "
                             f"{replicas} replica(s) (each replica takes an equal share of a batch).",
                             f"e.g. --batch-size {max(replicas, 256 // replicas * replicas)}.")
        with info.scope():
            model = load_serving_model(run, "predict")
    units = int(model.output_shape[-1])
    writer = Output(path, run, top_k, labelled=any(g.labels is not None for g in found.groups))
    progress = _Progress(found.count)
    timings: list[dict[str, Any]] = []
    start = time.perf_counter()
    stop.doing = f"predicting {found.count:,} samples"
    try:
        writer.open(found.count, units)
        with stop.held():  # a signal stops model.predict after its batch, then the chunk loop (stop.check())
            _predict_groups(model, run, found, writer, batch, replicas, progress, skip_bad, stop, log, timings)
        seconds = time.perf_counter() - start
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    record = {"run_dir": str(run.run_dir), "inputs": list(inputs), "output": str(path) if path else None,
              "format": writer.format, "count": writer.written, "skipped": found.skipped,
              "seconds": round(seconds, 4), "samples_per_second": round(writer.written / max(seconds, 1e-9), 1),
              "per_input": timings, "batch_size": batch, "num_replicas": replicas, "devices": list(info.logical_devices or ()),
              "backend": run.backend, "task": run.task, "class_names": run.class_names,
              "top_k": min(top_k, run.num_classes or top_k) if run.class_names else None,
              **({"ids": str(writer.ids_path)} if writer.ids_path else {}), **writer.metrics()}
    if path is not None:
        write_json(record_path(path), record)
    metric = ""
    if "accuracy" in record:
        metric = f", accuracy {record['accuracy']:.4f} ({record['correct']:,} of {record['labelled']:,} labelled)"
    elif "mae" in record:
        metric = f", mae {record['mae']:.4g} ({record['labelled']:,} labelled)"
    log(f"tfgpu predict: {writer.written:,} samples in {seconds:.2f} s ({record['samples_per_second']:,.0f} "
        f"samples/s) on {replicas} replica(s){metric}"
        + (f"; {len(found.skipped)} file(s) skipped" if found.skipped else "")
        + (f"; {record['not_finite']:,} output(s) NaN or infinite (the model overflowed on them; never counted "
           "correct)" if record.get("not_finite") else "")
        + (f"; wrote {path} and {record_path(path)}" if path else ""))
    return record


def _predict_groups(model: Any, run: RunModel, found: Inputs, writer: "Output", batch: int, replicas: int,
                    progress: _Progress, skip_bad: bool, stop: OutputStop, log: Callable[[str], None],
                    timings: list[dict[str, Any]]) -> None:
    """Predict every group of ``found`` chunk by chunk into ``writer`` (each group's seconds into ``timings``).

    Raises:
        Preempted, KeyboardInterrupt: ``stop`` received a signal (model.predict stopped after its batch; the
            chunk it was on is not written).
    """
    for group in found.groups:
        began = time.perf_counter()
        for lo in range(0, len(group), CHUNK_SAMPLES):
            hi = min(lo + CHUNK_SAMPLES, len(group))
            out, kept = _predict_chunk(model, run, group, lo, hi, batch, replicas, progress, skip_bad, stop)
            stop.check()  # model.predict may have stopped short of the chunk's end: nothing of it is written
            labels = group.labels[lo:hi] if group.labels is not None else None
            if kept is None:
                writer.write(group.ids[lo:hi], out, labels)
            else:  # --skip-bad: images TensorFlow could not decode (Pillow read them) left out
                for i in sorted(set(range(hi - lo)) - set(kept)):
                    path_i = group.ids[lo + i]
                    found.skipped.append({"path": path_i, "reason": "TensorFlow cannot decode it (Pillow read "
                                                                    "its header)"})
                    log(f"tfgpu predict: skipped {path_i}: TensorFlow cannot decode it")
                writer.write([group.ids[lo + i] for i in kept], out,
                             labels[kept] if labels is not None else None)
        timings.append({"input": group.source, "count": len(group),
                        "seconds": round(time.perf_counter() - began, 4)})


def _predict_chunk(model: Any, run: RunModel, group: Group, lo: int, hi: int, batch: int, replicas: int,
                   progress: _Progress, skip_bad: bool, stop: OutputStop) -> tuple[np.ndarray, Optional[list[int]]]:
    """``model.predict`` on samples ``lo:hi`` of ``group``: float32 ``(n, units)``, and ``None``, or with
    ``skip_bad`` where TensorFlow could not decode some images, the indices (within the chunk) of the ``n``
    images it could, whose outputs these are. Once ``stop`` has received a signal, model.predict stops after the
    batch it is on (fewer outputs than asked).

    Raises:
        DataError: an image TensorFlow cannot decode (without ``skip_bad``; with it, when none of the chunk's can).
    """
    callback = _keras_progress(progress, batch, hi - lo, stop)
    if group.paths is not None:
        import tensorflow as tf  # noqa: PLC0415

        paths = group.paths[lo:hi]
        try:
            return _predict_images(model, run, group, paths, batch, replicas, callback), None
        except tf.errors.OpError:
            if not skip_bad:
                raise DataError(f"tfgpu predict: TensorFlow cannot decode {_locate(paths, run, group.resize)}.",
                                "replace or remove the file (Pillow read it, TensorFlow's decoder did not), or add "
                                "--skip-bad to predict the others and list it in the record.") from None
        kept = [i for i, path in enumerate(paths) if _decode_error(path, run, group.resize) is None]
        if not kept:
            raise DataError(f"tfgpu predict: TensorFlow cannot decode any of {len(paths)} images from "
                            f"{paths[0]}.", "check the files (Pillow read their headers).")
        out = _predict_images(model, run, group, [paths[i] for i in kept], batch, replicas,
                              _keras_progress(progress, batch, len(kept), stop))
        return out, kept
    x = np.asarray(group.x[lo:hi], dtype=run.stored_dtype)  # one chunk read (and converted) at a time
    pad = (-len(x)) % replicas if run.backend == "jax" else 0  # JAX splits every batch evenly over the devices
    if pad:
        x = np.concatenate([x, np.zeros((pad, *x.shape[1:]), dtype=x.dtype)])
    out = model.predict(x, batch_size=batch, verbose=0, callbacks=[callback])
    return np.asarray(out, dtype=np.float32)[:hi - lo], None


def _predict_images(model: Any, run: RunModel, group: Group, paths: list[str], batch: int, replicas: int,
                    callback: Any) -> np.ndarray:
    """``model.predict`` on the decoded ``paths``: float32 ``(len(paths), units)``."""
    # JAX splits every batch evenly over the devices: repeat the last image, and drop its outputs below
    pad = (-len(paths)) % replicas if run.backend == "jax" else 0
    out = model.predict(_image_dataset(paths + paths[-1:] * pad, run, group.resize, batch), verbose=0,
                        callbacks=[callback])[:len(paths)]
    return np.asarray(out, dtype=np.float32)

