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
- ``checkpoint/``: the last checkpoint's files (:mod:`tfgpu.checkpoint`),
  removed once ``model.keras`` is written; ``tfgpu run --resume`` reopens the
  directory (:mod:`tfgpu.resume`).

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

import errno
import importlib.util
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from .errors import ConfigError, DiskFull, OutputError

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


#: ``errno`` of a full disk and of a used-up quota, with the words the OS (and TensorFlow, HDF5) use for them.
FULL_ERRNOS = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded"}


def disk_full(exc: Optional[BaseException]) -> Optional[int]:
    """``ENOSPC`` or ``EDQUOT`` when ``exc`` (or an exception it came from) says the disk or the quota is full.

    Recognises ``OSError`` (Python, h5py) by its ``errno``, and TensorFlow's
    and HDF5's errors (``ResourceExhaustedError: ... No space left on device``,
    ``errno = 28``) by their text.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return exc.errno
        text = str(exc)
        for code, words in FULL_ERRNOS.items():
            if words in text or f"errno = {code}," in text:
                return code
        exc = exc.__cause__ or exc.__context__
    return None


def failed_file(exc: BaseException, under: Path) -> Optional[Path]:
    """The file a failed write was writing, or ``None``.

    In order: the exception's ``filename`` (``OSError``) or ``path``
    (:class:`~tfgpu.errors.DiskFull`); a path in its message (TensorFlow and
    HDF5 name the file), preferring one under ``under``; the ``filename`` of
    the object whose method raised it (Keras's ``CSVLogger`` writes
    ``metrics.csv`` through a file object, whose errors name no file).
    """
    import traceback  # noqa: PLC0415

    for name in (getattr(exc, "filename", None), getattr(exc, "path", None)):
        if name:
            return Path(os.fsdecode(name))
    paths = [Path(m.group(1).rstrip(":.")) for m in re.finditer(r"(/[^\s'\",;()]+)", str(exc))]
    inside = [p for p in paths if str(p).startswith(str(under))]
    if inside or paths:
        return (inside or paths)[0]
    for frame, _ in reversed(list(traceback.walk_tb(exc.__traceback__))):
        name = getattr(frame.f_locals.get("self"), "filename", None)
        if isinstance(name, str) and name.startswith(str(under)):
            return Path(name)
    return None


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _measured(path: Path) -> tuple[Path, Optional[Any]]:
    """The nearest of ``path`` and its ancestors whose filesystem can be measured, and its
    ``shutil.disk_usage`` (``None`` when none can be)."""
    for where in (path, *path.parents):
        try:
            return where, shutil.disk_usage(where)
        except OSError:
            continue
    return path, None


def disk_full_error(code: int, path: Optional[Path], where: Path, kept: str, hint: str,
                    needed: Optional[int] = None) -> DiskFull:
    """The one-paragraph :class:`~tfgpu.errors.DiskFull` for a write to ``path`` that failed with ``code``.

    Args:
        code: ``ENOSPC`` or ``EDQUOT``; path: the file (``None``: unknown);
        where: a directory on the full filesystem (or below its nearest existing
        ancestor); kept: what is kept, one sentence (or ``""``); hint: the fix;
        needed: bytes the write needs, when known.
    """
    what = "the disk is full" if code == errno.ENOSPC else "the disk quota is used up"
    target = str(path) if path is not None else f"a file in {where}"
    where, usage = _measured(where)
    free = f"{_size(usage.free)} free of {_size(usage.total)}" if usage is not None else "free space unknown"
    need = f"about {_size(needed)} needed, " if needed is not None else ""
    return DiskFull(f"{what}: cannot write {target} ({need}{FULL_ERRNOS[code]}); {free} on the filesystem of "
                    f"{where}." + (f" {kept}" if kept else ""), hint, str(path) if path else None, code, needed)


def ensure_room(path: Path, needed: int) -> None:
    """Raise :class:`~tfgpu.errors.DiskFull` before writing ``needed`` bytes to ``path`` on a filesystem without them.

    For writers that cannot fail cleanly: an HDF5 file (Keras's ``.weights.h5``
    and the weights inside ``.keras``) that runs out of space is left open in a
    state in which closing it crashes the process (SIGSEGV inside HDF5's
    close, seen with h5py 3 here), so those writes are checked first. A
    filesystem that cannot be measured passes.
    """
    where, usage = _measured(path.parent)
    if usage is not None and usage.free < needed:
        raise disk_full_error(errno.ENOSPC, path, where, "", "free space on that filesystem, then run the command "
                              "again.", needed)


def process_record() -> dict[str, Any]:
    """Who writes a run directory: ``{"pid", "host", "start"}`` (``start``: the process's start time in clock ticks
    since boot, from ``/proc/self/stat``, so a reused pid is told apart; ``None`` off Linux)."""
    import socket  # noqa: PLC0415

    return {"pid": os.getpid(), "host": socket.gethostname(), "start": _start_ticks(os.getpid())}


def _start_ticks(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_alive(record: Optional[dict[str, Any]]) -> Optional[bool]:
    """Whether the process :func:`process_record` described still runs: ``None`` when this cannot be told (another
    host, or no record: a run directory written by an earlier tfgpu)."""
    import socket  # noqa: PLC0415

    if not record or record.get("host") != socket.gethostname() or not isinstance(record.get("pid"), int):
        return None
    pid = record["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, owned by another user
        pass
    start = record.get("start")
    return start is None or _start_ticks(pid) == start


def stale_status(summary: dict[str, Any]) -> Optional[str]:
    """Why a ``summary.json`` that says ``"running"`` is out of date, or ``None`` (it is not, or cannot be told).

    The process that wrote it ended without recording how (killed, crashed, or
    its disk filled up so that the last write failed).
    """
    if summary.get("status") != "running" or process_alive(summary.get("process")) is not False:
        return None
    process = summary["process"]
    return (f"summary.json says \"running\", but its process (pid {process.get('pid')} on {process.get('host')}) "
            "has ended without recording how the run ended (killed, crashed, or its disk was full)")


def remove_quietly(path: Path) -> None:
    """Delete a file or a directory tree if it exists (a temporary file after a failed write)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except OSError:
        pass


def replace_atomic(path: Path, write: Callable[[Path], Any], tmp: Path,
                   hint: str = "check the disk space and permissions.") -> None:
    """Call ``write(tmp)``, then rename ``tmp`` to ``path``: readers see the old file or the whole new one.

    A failed write leaves no ``tmp`` behind.

    Raises:
        DiskFull: the disk or the quota is full (the message names the file and the free space).
        OutputError: writing or renaming failed otherwise (``hint`` is its fix).
    """
    try:
        write(tmp)
        os.replace(tmp, path)
    except Exception as exc:
        remove_quietly(tmp)
        code = disk_full(exc)
        if code is not None:
            raise disk_full_error(code, path, path.parent, "",
                                  "free space on that filesystem, then run the command again.") from None
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}.", hint) from None
        raise


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename."""
    replace_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), path.with_name(f".{path.name}.tmp"))


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (see :func:`write_atomic`)."""
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


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


def versions(backend: str) -> dict[str, Optional[str]]:
    """``summary.json``'s ``versions``: tfgpu, Python, Keras and the backend's packages (TensorFlow's version only
    where it is imported, so a JAX run never imports it). ``tfgpu export`` and MLflow's tags report the same."""
    import platform  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from importlib import metadata  # noqa: PLC0415

    import keras  # noqa: PLC0415

    from . import __version__  # noqa: PLC0415

    found: dict[str, Optional[str]] = {"tfgpu": __version__, "keras": keras.__version__,
                                       "python": platform.python_version()}
    found["tensorflow"] = getattr(sys.modules.get("tensorflow"), "__version__", None)
    if backend == "jax":
        for name in ("jax", "jaxlib"):
            try:
                found[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                found[name] = None
    return found
