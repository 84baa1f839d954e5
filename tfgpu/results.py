"""Run directories: a new one per run, written as the run goes.

A run directory holds:

- ``config.yaml``: the resolved configuration (what was applied);
- ``plan.json``: the plan (environment, ``tf.config`` calls, strategy);
- ``metrics.csv``: one row per epoch, flushed as each epoch ends;
- ``summary.json``: devices, replicas, batches, loop, epoch times,
  samples/s, final metrics and the run's status (``running``, ``completed``,
  ``failed``, ``interrupted``, ``preempted``);
- ``model.keras``: the trained model (``keras.Model.save``);
- ``tensorboard/``: TensorBoard logs (``output.tensorboard``);
- ``evaluation.json``: written later by ``tfgpu evaluate``;
- ``checkpoint/``: the last checkpoint and ``state.json`` (:mod:`tfgpu.checkpoint`),
  removed once ``model.keras`` is written; ``tfgpu run --resume`` reopens the
  directory (:mod:`tfgpu.resume`).

Files are replaced atomically (write, then rename), so an interrupted run
never leaves a half-written summary, and a run never touches another run's
directory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError, OutputError


def create_run_dir(parent: str, name: str) -> Path:
    """Create a new, empty run directory ``parent/name-YYYYmmdd-HHMMSS[-N]``.

    Raises:
        OutputError: ``parent`` cannot be created or written.
    """
    root = Path(parent)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1, 10_000):
            candidate = root / (f"{name}-{stamp}" + (f"-{n}" if n > 1 else ""))
            try:
                candidate.mkdir()
                return candidate
            except FileExistsError:
                continue
    except OSError as exc:
        raise OutputError(
            f"output.dir: cannot create a run directory under '{parent}': {exc.strerror or exc}.",
            "set output.dir (or --output-dir) to a writable directory.",
        ) from None
    raise OutputError(f"output.dir: too many runs named {name}-{stamp} in '{parent}'.", "use another output.name.")


def open_run_dir(path: Path) -> Path:
    """The run directory ``path`` given by ``--resume``: reopened, or created when it does not exist yet.

    Raises:
        OutputError: it cannot be created.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"--resume: cannot create the run directory {path}: {exc.strerror or exc}.",
                          "name a directory this process may write.") from None
    return path


def check_parent(parent: str) -> None:
    """Fail early, writing nothing, when no run directory can be created under ``parent``.

    Walks up to the nearest existing ancestor: it must be a directory this
    process may write. (:func:`create_run_dir` still reports what this cannot
    foresee, such as a full disk.)

    Raises:
        OutputError: an ancestor is a file, or the nearest existing one is not writable.
    """
    path = Path(parent).absolute()
    for ancestor in (path, *path.parents):
        try:
            exists = ancestor.exists()
        except OSError:
            exists = False
        if not exists:
            continue
        if not ancestor.is_dir():
            what = "is" if ancestor == path else f"lies under '{ancestor}', which is"
            raise OutputError(
                f"output.dir: cannot create a run directory under '{parent}': it {what} a file, not a directory.",
                "set output.dir (or --output-dir) to a directory, or move the file out of the way.",
            )
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise OutputError(
                f"output.dir: cannot create a run directory under '{parent}': '{ancestor}' is not writable.",
                "set output.dir (or --output-dir) to a writable directory.",
            )
        return


def replace_atomic(path: Path, write: Callable[[Path], Any], tmp: Path,
                   hint: str = "check the disk space and permissions.") -> None:
    """Call ``write(tmp)``, then rename ``tmp`` to ``path``: readers see the old file or the whole new one.

    Raises:
        OutputError: writing or renaming failed (``hint`` is its fix).
    """
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}.", hint) from None


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename."""
    replace_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), path.with_name(f".{path.name}.tmp"))


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (see :func:`write_atomic`)."""
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def check_tensorboard(wanted: bool) -> None:
    """``output.tensorboard: true`` needs the ``tensorboard`` package (it implements ``tf.summary``).

    Checked before TensorFlow starts, without importing anything.

    Raises:
        ConfigError: it is wanted and not installed.
    """
    if wanted and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "output.tensorboard: true needs the tensorboard package, which is not installed (TensorFlow 2.16+ no "
            "longer installs it, and tf.summary writes nothing without it).",
            "pip install 'tfgpu[tensorboard]' (or pip install tensorboard), or set output.tensorboard: false.",
        )
