"""Run directories: a new one per run, written as the run goes.

A run directory holds:

- ``config.yaml``: the configuration as given: the recipe's keys and the
  ``--set`` overrides (``--output-dir`` included), without the defaults, so
  ``tfgpu run RUN_DIR/config.yaml`` is planned as the first run was (a key left
  at its default stays one: e.g. an unset ``tensorflow.log_level`` keeps an
  existing ``TF_CPP_MIN_LOG_LEVEL``); ``--resume`` and ``tfgpu evaluate`` load it;
- ``config.resolved.yaml``: every setting the run used, defaults included, for
  reading (the data section shows the keys its kind reads). A run directory
  written by an earlier tfgpu has no such file, and its ``config.yaml`` holds
  every setting; ``--resume`` still reads it as the first run's recipe;
- ``plan.json``: the plan (environment, ``tf.config`` calls, strategy);
- ``metrics.csv``: one row per epoch, flushed as each epoch ends;
- ``summary.json``: devices, replicas, batches, loop, epoch times,
  samples/s, final metrics, and the run's state, of which it is the one file:
  its status (``running``, ``completed``, ``failed``, ``interrupted``,
  ``preempted``), process, data seed, epochs done and the commit record of
  its last checkpoint (``checkpoint.committed``);
- ``model.keras``: the trained model (``keras.Model.save``);
- ``tensorboard/``: TensorBoard logs (``output.tensorboard``);
- ``evaluation.json``: written later by ``tfgpu evaluate``;
- ``checkpoint/``: the last checkpoint's files (:mod:`tfgpu.training.checkpoint`),
  removed once ``model.keras`` is written; ``tfgpu run --resume`` reopens the
  directory (:mod:`tfgpu.training.resume`).

``config.yaml``, ``config.resolved.yaml``, ``plan.json``, ``summary.json``,
``model.keras`` and the checkpoint's ``progress.json`` are
replaced atomically (written to a temporary file, then renamed), so a process
killed at any moment leaves the old file or the whole new one, never half of
one. ``metrics.csv`` is appended instead, one row per finished epoch (Keras's
``CSVLogger`` flushes each row), so a kill loses at most the row being written;
``--resume`` rewrites it, atomically, to the epochs its checkpoint holds.
TensorFlow appends to the TensorBoard event files and writes the checkpoint's
own files. Nothing is fsynced: all of this holds when the process is killed,
not when the machine loses power or its kernel crashes, after which the files
written last may be older or empty. (An fsync on each ``progress.json``, up to
five a second, would cost on network filesystems, and would not make the
checkpoint survive a power loss: TensorFlow does not fsync its files either.)
A run never touches another run's directory.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, OutputError
from ..utils.files import write_atomic

#: The configuration as given (recipe and overrides): what a replay, ``--resume`` and ``tfgpu evaluate`` load.
CONFIG_FILE = "config.yaml"
#: Every setting the run used, defaults included: for reading.
RESOLVED_CONFIG_FILE = "config.resolved.yaml"

_GIVEN_HEAD = (
    "# The settings this run was given (its recipe and --set overrides); every other key has tfgpu's default.\n"
    "# 'tfgpu run RUN_DIR/config.yaml' runs it again, planned the same way. Every value used:\n"
    "# config.resolved.yaml.\n"
)
_RESOLVED_HEAD = (
    "# Every setting this run used, defaults included (for reading). To run it again use config.yaml:\n"
    "# a recipe sets each key it lists, and setting a key can change the plan (e.g. tensorflow.log_level\n"
    "# replaces an existing TF_CPP_MIN_LOG_LEVEL; left unset, it does not).\n"
)


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


def given_yaml(cfg: Any) -> str:
    """A :class:`~tfgpu.config.Config`'s settings as given (:meth:`~tfgpu.config.Config.explicit_dict`) as YAML.

    Loading the text again gives an equal config with the same keys marked as set.
    """
    return yaml.safe_dump(cfg.explicit_dict(), sort_keys=False, default_flow_style=None)


def write_config(run_dir: Path, cfg: Any) -> None:
    """Write :data:`RESOLVED_CONFIG_FILE`, then :data:`CONFIG_FILE` (the file that makes a directory a run's).

    Raises:
        OutputError: either cannot be written.
    """
    write_atomic(run_dir / RESOLVED_CONFIG_FILE, _RESOLVED_HEAD + cfg.to_yaml())
    write_atomic(run_dir / CONFIG_FILE, _GIVEN_HEAD + given_yaml(cfg))


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


