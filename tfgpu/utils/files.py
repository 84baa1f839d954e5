"""FILES"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Optional
from ..errors import DiskFull, OutputError


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


def note_file(exc: OSError) -> None:
    """Give ``exc`` (an ``OSError`` naming no file) the ``filename`` of the object whose method raised it.

    For a failed write inside a Keras callback (``CSVLogger`` writes ``metrics.csv`` through a file object,
    whose errors name no file): call it where the exception passes through tfgpu's code, before Keras's
    traceback filter (``keras.config.disable_traceback_filtering``) drops Keras's frames, the callback's
    among them; :func:`failed_file` then reads the name.
    """
    import traceback  # noqa: PLC0415

    if exc.filename:
        return
    for frame, _ in reversed(list(traceback.walk_tb(exc.__traceback__))):
        name = getattr(frame.f_locals.get("self"), "filename", None)
        if isinstance(name, str):
            exc.filename = name
            return


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


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those above it that do not exist yet, deepest first: what ``mkdir(parents=True)`` makes,
    for :func:`remove_empty_folders` to take back after a failed write."""
    return [d for d in (folder, *folder.parents) if not d.exists()]


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first, :func:`missing_folders`) while they are empty; stop at the first that
    is not."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


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
