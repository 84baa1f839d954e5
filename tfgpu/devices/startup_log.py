"""TensorFlow's start-up log: what ``tensorflow.log_level`` holds back while TensorFlow loads, and where it goes.

TensorFlow's C++ libraries log through Abseil. Lines logged before
``absl::InitializeLog()`` runs go to stderr whatever ``TF_CPP_MIN_LOG_LEVEL``
says (abseil/abseil-cpp#1718 and #1957), so every ``import tensorflow`` prints
"WARNING: All log messages before absl::InitializeLog() is called are written
to STDERR", the oneDNN and "Could not find cuda drivers" I-lines (once per
library that carries Abseil), and on a machine without a driver the E-line
"failed call to cuInit: ... (303)". Once TensorFlow has set up its logging the
threshold works again.

:func:`hold_back` closes that gap at the file-descriptor level while
:func:`tfgpu.setup` imports TensorFlow and initialises its devices: fd 2 is
pointed at a pipe read by a small filter process (this file, run as
``python -I -S startup_log.py LEVEL TOKEN``; a process, not a thread, because
``import tensorflow`` holds Python's GIL while TensorFlow writes, so a thread
could not drain the pipe, and a process outlives a crash and still delivers
its last lines). The filter:

- holds back lines in Abseil/glog format (``I0000 00:00:...  123 file.cc:45] ...``,
  and TensorFlow's older ``2024-01-01 12:00:00.000000: I file.cc:45] ...``)
  whose severity (I 0, W 1, E 2, F 3) is below the level, the
  "before absl::InitializeLog()" notice (a warning, 1), and the further
  lines of a held message (read with it, indented or "To enable the following
  instructions"; never a Python traceback's);
- passes everything else through unchanged and in order: Python tracebacks,
  lines at or above the level, lines in any other format; a partial line waits
  at most 50 ms for its end;
- never blocks the writer: it reads as fast as lines come, however many.

When the window ends, fd 2 is restored; :class:`StartupLog` has every
TensorFlow line with whether it was shown. What was held back goes to a file:
``RUN_DIR/startup.log`` for ``tfgpu run``, else
``<temp dir>/tfgpu-<uid>/startup-<pid>.log`` (:attr:`tfgpu.Setup.startup_log_file`).
``tfgpu doctor --log`` shows the whole start-up log of a fresh TensorFlow, each
line with what it means.

On a machine with no NVIDIA driver at all (NVML cannot start and there is no
``libcuda.so.1``: :attr:`tfgpu.devices.probe.Probe.no_driver`), cuInit's error
(``failed call to cuInit ... (303)``) is what the probe already said, not news:
it is held back with the INFO lines (:data:`NO_DRIVER_EXPECTED`), at every level
but 0. Other known-harmless errors (:data:`HARMLESS`: the duplicate
cuDNN/cuFFT/cuBLAS factory registrations of tensorflow/tensorflow#62075;
cuInit's error with every GPU hidden) are not dropped at the levels that show
errors: they pass through, and one ``tfgpu: note:`` line after the start-up
names them as harmless and why. A cuInit error on a machine that has a driver
is always shown.

``TFGPU_LOG_FILTER=0`` turns the filter off (TensorFlow then prints as it
would without tfgpu). This module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

#: ``0`` turns the start-up filter off.
FILTER_ENV = "TFGPU_LOG_FILTER"
#: The file in a run directory that gets the held-back lines.
RUN_FILE = "startup.log"

_ABSL = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [^\s\]]+:\d+\] ")
_OLD_TF = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) [^\s\]]+:\d+\] ")
_NOTICE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
#: How a TensorFlow message's further lines start: indented (XLA's device list), or these words (the CPU
#: instructions notice). Only such a line, arriving with a held message, is held with it.
_CONTINUES = (b" ", b"\t", b"To enable the following instructions")
#: Indented lines that are Python's, never a TensorFlow message's.
_PYTHON = (b"  File \"", b"    ")
#: Errors expected at start-up on a machine with no NVIDIA driver (``Probe.no_driver``): held back like INFO lines
#: (regexes searched in the line). A FATAL line is never held back.
NO_DRIVER_EXPECTED = (r"failed call to cuInit",)
#: Seconds a partial line waits for the rest before it is passed on as it is.
PARTIAL_WAIT = 0.05
#: Seconds :func:`hold_back` waits for the filter to report at the end of the window.
REPORT_WAIT = 10.0


def severity(line: bytes) -> Optional[int]:
    """A line's severity if it is TensorFlow's (Abseil/glog format, or the InitializeLog notice), else ``None``.

    0 INFO, 1 WARNING, 2 ERROR, 3 FATAL, as ``TF_CPP_MIN_LOG_LEVEL`` counts them; the notice counts as a warning.
    """
    match = _ABSL.match(line) or _OLD_TF.match(line)
    if match:
        return _SEVERITY[match.group(1)]
    if line.startswith(_NOTICE):
        return 1
    return None


def shown(line: str, level: int, expected: Sequence[str] = ()) -> Optional[bool]:
    """Whether the start-up filter shows ``line`` at ``level`` (``None``: not TensorFlow's, always shown).

    A TensorFlow line is held back below ``level``, and also, unless ``level`` is 0 or it is FATAL, when it
    matches one of ``expected`` (:data:`NO_DRIVER_EXPECTED` on a machine without a driver).
    ``tfgpu doctor`` reads a start-up log with the same rule.
    """
    raw = line.encode("utf-8", "surrogateescape")
    found = severity(raw)
    if found is None:
        return None
    return not _held(raw, found, level, [re.compile(p.encode()) for p in expected])


def _held(line: bytes, found: int, level: int, expected: Sequence["re.Pattern[bytes]"]) -> bool:
    return found < level or (0 < level and found < 3 and any(p.search(line) for p in expected))


def message(line: str) -> str:
    """The text of a TensorFlow log line without its prefix (severity, time, thread, file:line)."""
    raw = line.encode("utf-8", "surrogateescape")
    match = _ABSL.match(raw) or _OLD_TF.match(raw)
    return raw[match.end():].decode("utf-8", "replace") if match else line


@dataclass(frozen=True)
class Harmless:
    """A start-up line that is known to be harmless, and why.

    Attributes:
        name: a short name, e.g. ``"cuInit 303"``.
        pattern: a regex searched in the line's message.
        why: one sentence for the user.
        needs: another regex that must match some line of the same start-up
            (the condition that makes it harmless), or ``""``.
        hidden_gpus: harmless also when every GPU is hidden on purpose
            (``CUDA_VISIBLE_DEVICES`` empty or ``-1``).
    """

    name: str
    pattern: str
    why: str
    needs: str = ""
    hidden_gpus: bool = False


#: The start-up lines tfgpu knows to be harmless. ``tfgpu doctor --log`` names them; a shown one gets a note.
HARMLESS = (
    Harmless("duplicate CUDA factory registration",
             r"Unable to register (cuDNN|cuFFT|cuBLAS) factory: Attempting to register factory for plugin",
             "TensorFlow and XLA each register the CUDA plugins cuDNN, cuFFT and cuBLAS; the second registration is "
             "refused and the first one is used (tensorflow/tensorflow#62075): the GPU is not affected"),
    Harmless("computation placer registered twice", r"computation placer already registered",
             "TensorFlow and XLA both register it; the first one is used: nothing is affected"),
    Harmless("cuInit without a driver", r"failed call to cuInit",
             "no NVIDIA driver is installed (libcuda.so.1 was not found), so CUDA cannot start and TensorFlow runs "
             "on the CPU, as it must here",
             needs=r"Could not find cuda drivers on your machine"),
    Harmless("cuInit with every GPU hidden", r"failed call to cuInit",
             "CUDA_VISIBLE_DEVICES hides every GPU (as devices.visible_gpus: none asks), so CUDA finds no device and "
             "TensorFlow runs on the CPU", hidden_gpus=True),
    Harmless("no CUDA driver", r"Could not find cuda drivers on your machine",
             "this TensorFlow build can use NVIDIA GPUs, but this machine has no NVIDIA driver: it runs on the CPU"),
    Harmless("TensorRT not found", r"TF-TRT Warning: Could not find TensorRT",
             "TensorRT is only needed for TF-TRT inference conversion, which tfgpu does not use"),
    Harmless("oneDNN notice", r"oneDNN custom operations are on",
             "information: oneDNN's fused CPU kernels may round differently (tensorflow.onednn_opts turns them off)"),
    Harmless("CPU instructions notice", r"This TensorFlow binary is optimized to use available CPU instructions",
             "information: some ops could use more CPU instructions in a build from source"),
    Harmless("InitializeLog notice", re.escape(_NOTICE.decode()),
             "Abseil's notice that TensorFlow logs before its logging is set up; these are the lines tfgpu holds "
             "back below tensorflow.log_level"),
)


def gpus_hidden(env: Optional[dict] = None) -> bool:
    """``CUDA_VISIBLE_DEVICES`` hides every GPU (``""``, ``-1`` or another negative index first)."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    return value is not None and (value.strip() == "" or value.strip().startswith("-"))


def why_harmless(line: str, lines: list[str], hidden: bool = False) -> Optional[Harmless]:
    """The :data:`HARMLESS` entry that ``line`` matches, given the other ``lines`` of the same start-up."""
    text = message(line)
    for entry in HARMLESS:
        if not re.search(entry.pattern, text):
            continue
        if entry.hidden_gpus and not hidden:
            continue
        if entry.needs and not any(re.search(entry.needs, other) for other in lines):
            continue
        return entry
    return None


@dataclass
class StartupLog:
    """TensorFlow's lines while :func:`hold_back` was active.

    Attributes:
        level: the threshold (``TF_CPP_MIN_LOG_LEVEL``): lines below it were held back.
        lines: ``(line, shown)`` for each TensorFlow line, in order (without the newline).
        filtered: whether the filter ran (``False``: ``TFGPU_LOG_FILTER=0``, no fd 2, or it could not start).
        hidden_gpus: every GPU was hidden (``CUDA_VISIBLE_DEVICES``), for :func:`why_harmless`.
    """

    level: int
    lines: list[tuple[str, bool]] = field(default_factory=list)
    filtered: bool = False
    hidden_gpus: bool = False

    @property
    def held(self) -> str:
        """The held-back lines, as they were written (a newline after each)."""
        return "".join(f"{line}\n" for line, shown in self.lines if not shown)

    def shown_harmless(self) -> list[tuple[str, Harmless]]:
        """Errors (E or F) that were shown and are known to be harmless, each kind once."""
        everything = [line for line, _ in self.lines]
        found: dict[str, tuple[str, Harmless]] = {}
        for line, shown in self.lines:
            level = severity(line.encode("utf-8", "surrogateescape"))
            if shown and level is not None and level >= 2:
                entry = why_harmless(line, everything, self.hidden_gpus)
                if entry is not None and entry.why not in found:
                    found[entry.why] = (line, entry)
        return list(found.values())

    def note(self) -> Optional[str]:
        """The ``tfgpu: note:`` line for the shown harmless errors, or ``None``."""
        shown = self.shown_harmless()
        if not shown:
            return None
        parts = [f"\"{_short(message(line))}\": {entry.why}" for line, entry in shown]
        return ("tfgpu: note: TensorFlow's start-up error(s) above are known to be harmless here: " + "; ".join(parts)
                + ". ('tfgpu doctor --log' explains every start-up line.)")


def _short(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def level_in_force(plan_env: dict, env: Optional[dict] = None) -> int:
    """The ``TF_CPP_MIN_LOG_LEVEL`` TensorFlow will run with: the plan's (``plan_env``, what tfgpu sets: see
    :func:`tfgpu.devices.plan.make_plan`), else the one in ``env`` (default ``os.environ``), else TensorFlow's 0.

    A value TensorFlow cannot parse counts as 0, as TensorFlow reads it.
    """
    environ = os.environ if env is None else env
    value = plan_env.get("TF_CPP_MIN_LOG_LEVEL", environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    try:
        return max(0, min(3, int(value)))
    except ValueError:
        return 0


@contextlib.contextmanager
def hold_back(level: int, hidden_gpus: bool = False, expected: Sequence[str] = ()) -> Iterator[StartupLog]:
    """Hold back TensorFlow's start-up lines below ``level`` at the file-descriptor level (see the module).

    Use around the code that imports TensorFlow and initialises its devices::

        with hold_back(2) as log:
            import tensorflow as tf
            tf.config.list_logical_devices()
        log.held   # what was not shown

    fd 2 is restored when the block ends, also on an exception; the filter
    has passed everything on by then. Does nothing (``log.filtered`` is
    ``False``) with ``TFGPU_LOG_FILTER=0``, without an open fd 2, off POSIX,
    or when the filter process cannot start.

    Args:
        level: ``TF_CPP_MIN_LOG_LEVEL`` in force (:func:`level_in_force`), 0-3.
        hidden_gpus: every GPU is hidden (:func:`gpus_hidden` after the plan's environment).
        expected: regexes of errors held back too (:data:`NO_DRIVER_EXPECTED` when the probe found no driver).

    Yields:
        :class:`StartupLog`, filled in when the block ends.
    """
    log = StartupLog(level, hidden_gpus=hidden_gpus)
    if os.environ.get(FILTER_ENV, "1") == "0" or os.name != "posix":
        yield log
        return
    token = os.urandom(8).hex()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield log
        return
    try:
        read_end, write_end = os.pipe()
        try:
            helper = subprocess.Popen([sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(level), token,
                                       *expected],
                                      stdin=read_end, stdout=subprocess.PIPE, stderr=saved, close_fds=True)
        finally:
            os.close(read_end)
    except OSError:
        os.close(saved)
        with contextlib.suppress(NameError, OSError):
            os.close(write_end)
        yield log
        return
    os.dup2(write_end, 2)
    os.close(write_end)
    log.filtered = True
    try:
        yield log
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        with contextlib.suppress(OSError):
            os.write(2, f"\0tfgpu-startup-end-{token}\n".encode())
        os.dup2(saved, 2)
        os.close(saved)
        log.lines = _report(helper)


def _report(helper: subprocess.Popen) -> list[tuple[str, bool]]:
    """Read the filter's report (one JSON ``[line, shown]`` per line) until it closes its stdout."""
    assert helper.stdout is not None
    chunks, fd = [], helper.stdout.fileno()
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], REPORT_WAIT)
            if not ready:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        helper.stdout.close()
    lines = []
    for text in b"".join(chunks).decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            line, shown = json.loads(text)
            lines.append((str(line), bool(shown)))
    return lines


def write_held(log: StartupLog, path: Path) -> Optional[Path]:
    """Write the held-back lines to ``path`` (only if there are any; its folder is made); returns it, or ``None``.

    Raises:
        OSError: the file cannot be written.
    """
    text = log.held
    if not text:
        return None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    return path


#: How many start-up logs of :func:`tfgpu.setup` outside a run are kept (the oldest are removed).
KEEP_FILES = 100


def default_file() -> Path:
    """Where :func:`tfgpu.setup` (outside ``tfgpu run``) puts the held-back lines:
    ``<temp dir>/tfgpu-<uid>/startup-<pid>.log``; the folder keeps the newest :data:`KEEP_FILES`."""
    folder = Path(tempfile.gettempdir()) / f"tfgpu-{os.getuid()}"
    try:
        logs = sorted(folder.glob("startup-*.log"), key=lambda p: p.stat().st_mtime)
        for old in logs[:max(0, len(logs) - KEEP_FILES + 1)]:
            old.unlink()
    except OSError:
        pass
    return folder / f"startup-{os.getpid()}.log"


# The filter process ------------------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            written = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:
            return  # the reader went away: nothing to pass on to
        data = data[written:]


class _Filter:
    """Sorts lines into shown and held back, and records every TensorFlow line with which it was."""

    def __init__(self, level: int, expected: Sequence[str] = ()) -> None:
        self.level = level
        self.expected = [re.compile(p.encode()) for p in expected]
        self.report: list[bytes] = []

    def lines(self, lines: list[bytes], ends: list[bytes]) -> bytes:
        """Classify lines that arrived together; returns the bytes to show."""
        shown = []
        held_before = False
        for line, end in zip(lines, ends):
            level = severity(line)
            if level is None and held_before and line.startswith(_CONTINUES) and not line.startswith(_PYTHON):
                level = -1  # the continuation of the message just held back: held with it
            hold = level is not None and (level < 0 or _held(line, level, self.level, self.expected))
            if level is not None:
                text = line.decode("utf-8", "surrogateescape")
                self.report.append(json.dumps([text, not hold]).encode("utf-8", "surrogateescape") + b"\n")
            held_before = hold
            if not hold:
                shown.append(line + end)
        return b"".join(shown)


def _main(argv: list[str]) -> int:
    import signal  # noqa: PLC0415

    # Ctrl-C, a scheduler's SIGTERM or a requeue signal to the whole process group are the run's to handle:
    # the filter lives until the last writer of the pipe is gone (end of file), so no line is lost.
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    level, token, expected = int(argv[0]), argv[1].encode(), argv[2:]
    end = b"\0tfgpu-startup-end-" + token
    sorter = _Filter(level, expected)
    source, pending, reported = 0, b"", False
    while True:
        if pending and not reported:
            ready, _, _ = select.select([source], [], [], PARTIAL_WAIT)
            if not ready:  # a partial line with no end in sight: pass it on as it is
                _write_all(2, sorter.lines([pending], [b""]))
                pending = b""
                continue
        try:
            chunk = os.read(source, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        if reported:  # after the window: pass everything on (children that inherited the pipe)
            _write_all(2, chunk)
            continue
        data = pending + chunk
        parts = data.split(b"\n")
        pending = parts.pop()
        if end in pending:  # the marker always ends with a newline; this is defensive
            parts.append(pending)
            pending = b""
        lines, ends, after = [], [], []
        for i, part in enumerate(parts):
            if end in part:
                before = part[:part.index(end)]
                if before:
                    lines.append(before)
                    ends.append(b"")
                after = parts[i + 1:]
                reported = True
                break
            lines.append(part)
            ends.append(b"\n")
        _write_all(2, sorter.lines(lines, ends))
        if reported:
            _write_all(1, b"".join(sorter.report))
            os.close(1)
            rest = b"\n".join(after) + (b"\n" if after else b"") + pending
            pending = b""
            _write_all(2, rest)
    if pending:
        _write_all(2, pending if reported else sorter.lines([pending], [b""]))
    if not reported:
        _write_all(1, b"".join(sorter.report))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
