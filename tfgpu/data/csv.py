"""``kind: csv``: a CSV file with a header row; one column is the label, the others (or ``features``) the inputs.

Read with Python's ``csv`` module in :meth:`CsvSource.check`, before TensorFlow
starts, into float32 features ``(N, F)`` and labels ``(N,)``: whole-number
labels are classes (unless ``model.loss`` is a regression loss such as
``mse``), other numbers regression targets. Every feature cell must be a number
(``1``, ``-2.5``, ``3e-4``); an empty or non-numeric cell is a data error that
names the file, line and column. ``validation_path`` and ``test_path`` are CSV
files with the same columns. Feature scales differ in most tables: set
``data.normalize: true``.

``data.sample_weight: COLUMN`` reads that column of the training file as each
row's weight (a finite number >= 0; not a feature): the training batches become
``(x, y, w)``, which ``fit`` applies as ``sample_weight`` and the custom loop
multiplies into each sample's loss. Validation and test rows are not weighted
(their files need no such column).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Optional

from ..config import DataConfig
from ..errors import DataError
from ..utils.lazy import numpy as np
from .arrays import arrange
from .base import FLOAT32_MAX, Data, LoadContext, Source, existing


def finite_number(text: str) -> Optional[float]:
    """A CSV cell as a float that is finite in float32, else ``None`` (empty, text, NaN, infinity, or beyond
    :data:`FLOAT32_MAX` in magnitude); :func:`not_a_number` says which."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and abs(value) <= FLOAT32_MAX else None


def not_a_number(cell: str, text: str = "not a number") -> str:
    """Why a cell that :func:`finite_number` refused is refused, for a message: ``is empty``, ``is 'x', not a
    number`` (``text``), ``is 'nan', not a finite number`` or ``is '1e39', beyond float32's range``."""
    cell = cell.strip()
    if not cell:
        return "is empty"
    try:
        value = float(cell)
    except ValueError:
        return f"is {cell!r}, {text}"
    if not math.isfinite(value):
        return f"is {cell!r}, not a finite number"
    return f"is {cell!r}, beyond float32's range (+-{FLOAT32_MAX:.4g}), in which the model computes"


def read_rows(path: Path, delimiter: str, where: str, shown: Any, fix_unreadable: str) -> list[tuple[int, list[str]]]:
    """The rows of a CSV file that hold something, each with its line number (the header is line 1).

    Args:
        where: the start of a message (``data.path``, ``tfgpu predict``); shown: the file as the message names it;
            fix_unreadable: the fix when the file cannot be read.

    Raises:
        DataError: not UTF-8 (a BOM is allowed), or unreadable.
    """
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f, delimiter=delimiter))
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: {shown} is not UTF-8 text ({exc.reason} at byte {exc.start}).",
                        "save the CSV as UTF-8.") from None
    except (OSError, csv.Error) as exc:
        raise DataError(f"{where}: cannot read {shown} as CSV: {exc}.", fix_unreadable) from None
    return [(i + 1, r) for i, r in enumerate(rows) if any(cell.strip() for cell in r)]


def read_csv(path: Path, key: str, label: str, features: Optional[list[str]], delimiter: str,
             weight: Optional[str] = None) -> tuple[np.ndarray, np.ndarray, list[str], Optional[np.ndarray]]:
    """One CSV file -> ``(x float32 (N, F), y float64 (N,), feature names, weights float32 (N,) or None)``.

    Args:
        weight: the column of per-sample weights (``data.sample_weight``), left out of the features.

    Raises:
        DataError: unreadable, empty, no ``label`` (or ``weight``) column, a missing feature
            column, a ragged row, a cell that is not a finite number, or a negative weight.
    """
    fix_cells = "put a number in every feature and label cell (fill or drop the rows with missing values)"
    rows = [r for _, r in read_rows(path, delimiter, f"data.{key}", path, "check the file and data.delimiter.")]
    if not rows:
        raise DataError(f"data.{key}: {path} is empty; a CSV for tfgpu has a header row, then one row per sample.",
                        "point data.path at the CSV that holds the data.")
    header = [h.strip() for h in rows[0]]
    if len(rows) == 1:
        raise DataError(f"data.{key}: {path} has a header row ({', '.join(header[:8])}) but no data rows.",
                        "add the samples, one row each.")
    if label not in header:
        guess = [h for h in header if h.lower() == label.lower()]
        said = f" (did you mean '{guess[0]}'?)" if guess else ""
        raise DataError(
            f"data.{key}: {path} has no column '{label}'{said}; its columns are {', '.join(header)}.",
            "set data.label to the name of the target column, as written in the header row.",
        )
    if len(set(header)) != len(header):
        dupe = next(h for h in header if header.count(h) > 1)
        raise DataError(f"data.{key}: {path} has the column '{dupe}' twice in its header row.",
                        "give every column its own name.")
    if weight is not None and weight not in header:
        guess = [h for h in header if h.lower() == weight.lower()]
        said = f" (did you mean '{guess[0]}'?)" if guess else ""
        raise DataError(
            f"data.sample_weight: {path} has no column '{weight}'{said}; its columns are {', '.join(header)}.",
            "set data.sample_weight to the name of the weight column, as written in the header row.",
        )
    names = features if features is not None else [h for h in header if h not in (label, weight)]
    missing = [n for n in names if n not in header]
    if missing:
        raise DataError(f"data.features: {path} has no column(s) {', '.join(missing)}; its columns are "
                        f"{', '.join(header)}.", "list columns as written in the header row.")
    if not names:
        raise DataError(f"data.{key}: {path} has only the label column '{label}'; there are no features.",
                        "add feature columns, or name them in data.features.")
    cols = [header.index(n) for n in names]
    target = header.index(label)
    x = np.empty((len(rows) - 1, len(cols)), dtype=np.float32)
    y = np.empty(len(rows) - 1, dtype=np.float64)
    w = np.empty(len(rows) - 1, dtype=np.float32) if weight is not None else None
    weight_col = header.index(weight) if weight is not None else -1
    for i, row in enumerate(rows[1:]):
        line = i + 2
        if len(row) != len(header):
            raise DataError(f"data.{key}: {path}, line {line} has {len(row)} fields; the header has {len(header)}.",
                            f"give every row one field per column (separated by {delimiter!r}).")
        for j, c in enumerate(cols):
            value = finite_number(row[c])
            if value is None:
                what = not_a_number(row[c])
                raise DataError(
                    f"data.{key}: {path}, line {line}, column '{names[j]}' {what}; every feature must be numeric "
                    "(tfgpu does not encode categories).",
                    f"{fix_cells}, encode categories as numbers (e.g. one 0/1 column per category), or leave the "
                    "column out with data.features.",
                )
            x[i, j] = value
        value = finite_number(row[target])
        if value is None:
            what = not_a_number(row[target])
            raise DataError(
                f"data.{key}: {path}, line {line}, label column '{label}' {what}"
                + (" (class labels are numbered 0, 1, ...)." if what.endswith("not a number") else "."),
                f"{fix_cells}; number text classes 0, 1, ... in the file.",
            )
        y[i] = value
        if w is not None:
            value = finite_number(row[weight_col])
            if value is None or value < 0:
                what = (not_a_number(row[weight_col], "not a finite number") if value is None
                        else f"is {row[weight_col].strip()}, below 0")
                raise DataError(
                    f"data.sample_weight: {path}, line {line}, weight column '{weight}' {what}; a sample's weight "
                    "is a finite number >= 0 (0 leaves the row out of the loss).",
                    "put a weight in every row of that column (1 for an ordinary row).",
                )
            w[i] = value
    return x, y, names, w


class CsvSource(Source):
    """``kind: csv`` (see the module doc)."""

    kind = "csv"

    def check(self, keep: bool = True) -> None:
        cfg: DataConfig = self.cfg
        features = list(cfg.features) if cfg.features is not None else None
        self.arrays: dict[str, np.ndarray] = {}
        self.files: dict[str, str] = {}
        for key, split in (("path", "train"), ("validation_path", "val"), ("test_path", "test")):
            value = getattr(cfg, key)
            if value is None:
                continue
            path = existing(value, key, "a CSV file", f"check data.{key}.")
            if path.is_dir():
                raise DataError(f"data.{key}: '{value}' is a folder; expected a CSV file.", "name the .csv file.")
            x, y, names, w = read_csv(path, key, cfg.label, features, cfg.delimiter,
                                      cfg.sample_weight if split == "train" else None)
            if features is None:
                features = names  # the other files must have the training file's columns
            self.arrays[f"x_{split}"], self.arrays[f"y_{split}"] = x, y
            if w is not None:  # training weights only: validation and test are not weighted
                self.arrays["w_train"] = w
            self.files[split] = str(path)
        self.features = features

    def load(self, context: LoadContext) -> Data:
        details = {"features": list(self.features), "label": self.cfg.label, "files": self.files}
        origins = {"train": self.files["train"], "val": self.files.get("val", ""), "test": self.files.get("test", "")}
        labels = {s: f"{f}, column '{self.cfg.label}'" for s, f in self.files.items()}
        return arrange(self, self.arrays, f"CSV {self.files['train']}", self.files["train"], details=details,
                       origins=origins, label_where=labels,
                       weight_source=f"column '{self.cfg.sample_weight}'" if self.cfg.sample_weight else None)
