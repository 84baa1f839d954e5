"""tfgpu's exception hierarchy.

Every error a user can cause is a :class:`TfgpuError`: a one-paragraph message
(what is wrong, the value received, what is allowed) plus a hint (the fix), and
the exit code the command line returns for it. The command line prints
``message`` and ``hint`` and no traceback unless ``--debug`` is given.

This module imports nothing from tfgpu, so every other module can use it.

Exit codes (also in the README):

====  =====================================================================
0     success
1     an unexpected internal error (a bug: the traceback is printed)
2     the command line itself was misused: click's usage errors and
      :class:`UsageError` (a ``--set`` item that is not ``key.path=value``
      or whose value is not YAML); a well-formed ``--set`` whose key or value
      the schema refuses is a :class:`ConfigError` (3)
3     :class:`ConfigError`: bad YAML, unknown key, wrong type or range
4     :class:`DeviceError`: a device request this machine cannot satisfy
5     :class:`DataError`: data missing, unreadable or malformed
6     :class:`AlreadyInitializedError`: TensorFlow was initialised first
7     :class:`TrainingError`: training failed once it had started (NaN loss,
      TensorFlow's own error such as out of memory); a model that cannot
      be built or does not fit the data is a :class:`ConfigError` (3)
8     :class:`OutputError`: the run directory cannot be written (also
      :class:`DiskFull`: the disk or the disk quota is full)
9     ``tfgpu doctor`` found at least one error (``--strict``: or a warning)
10    :class:`WorkerError`: a worker process crashed (an uncaught exception:
      Python's exit code 1) or was killed by a signal; a worker that exited
      with a code of its own passes it on (:func:`worker_exit_code`)
11    :class:`TrackingError`: ``output.mlflow`` is on and its tracking
      server cannot be reached or refuses the run (checked before training)
12    :class:`SweepError`: ``tfgpu sweep`` finished no trial (each failed),
      or its study cannot be opened or continued
75    :class:`Preempted`: SIGTERM (or ``train.checkpoint.requeue_signal``)
      arrived; a checkpoint was saved: requeue the job, or continue it with
      ``tfgpu run --resume RUN_DIR`` (75 is sysexits' EX_TEMPFAIL, "try again")
130   :class:`Interrupted`: Ctrl-C; the run directory is kept
141   the reader of the output closed it (``tfgpu predict ... | head``): the
      command stopped there without a message, as one ended by SIGPIPE
      (128 + 13) would
====  =====================================================================
"""

from __future__ import annotations

import re
import signal

#: What tfgpu's own exit codes mean (the table above); a worker that exits with one passes it on.
EXIT_CODES = {0: "success", 1: "an uncaught exception", 2: "usage error", 3: "configuration error", 4: "device error",
              5: "data error", 6: "TensorFlow already initialised", 7: "training failed", 8: "output error",
              9: "doctor found an error", 10: "worker failed", 11: "tracking error",
              12: "sweep error", 75: "preempted", 130: "interrupted",
              141: "output pipe closed"}

#: The exit code of a command whose stdout was closed by its reader (``| head``): 128 + SIGPIPE, as a shell reports
#: a command that SIGPIPE ended.
BROKEN_PIPE = 141
#: The exit code of a supervisor whose worker crashed or was killed (:class:`WorkerError`).
WORKER_FAILED = 10
#: The exit code of an interrupted run (:class:`Interrupted`), and of a worker killed by SIGINT.
INTERRUPTED = 130


def worker_exit_code(code: int) -> int:
    """The exit code ``tfgpu run --workers N`` and ``tfgpu launch --workers N`` give for a worker that ended with
    ``code``: the one rule for both, and for whether a restart can help (:data:`WORKER_FAILED`: it can).

    Args:
        code: the worker's exit status as :class:`subprocess.Popen` gives it (negative: killed by that signal).

    Returns:
        0 for 0; :data:`WORKER_FAILED` (10) for a crash: killed by a signal, or 1 (an uncaught exception: Python's
        code for one, and tfgpu's internal error); 130 for a worker killed by SIGINT (interrupted, as a shell
        says); any other code is the worker's own and passed on: tfgpu's (3-8, 75, 130; a restart would only
        repeat them) or a launched script's ``sys.exit(N)``.
    """
    if code < 0:
        return INTERRUPTED if -code == signal.SIGINT else WORKER_FAILED
    return WORKER_FAILED if code == 1 else code


class TfgpuError(Exception):
    """Base class of every error a user can cause.

    Args:
        message: what is wrong, naming the key and the received value.
        hint: how to fix it (one or two sentences), or ``""``.
    """

    exit_code = 1
    kind = "error"

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def report(self) -> str:
        """What the command line prints: ``tfgpu: <kind>: <message>`` and, with a hint, a ``Fix:`` line."""
        return f"tfgpu: {self.kind}: {self.message}" + (f"\nFix: {self.hint}" if self.hint else "")

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\nFix: {self.hint}"
        return self.message


class UsageError(TfgpuError):
    """The command line was written wrongly: a ``--set`` item that is not ``key.path=value``, or whose value
    cannot be read as YAML. Exit code 2, as click's own usage errors; not a :class:`ConfigError`, so
    ``tfgpu doctor`` (which reports a bad config as a finding) exits 2 on it too."""

    exit_code = 2
    kind = "usage error"


class ConfigError(TfgpuError):
    """The configuration (YAML file, dict, ``--set`` or keyword override) is invalid."""

    exit_code = 3
    kind = "configuration error"


class DeviceError(TfgpuError):
    """A device request cannot be satisfied on this machine (e.g. GPU 3 of 2)."""

    exit_code = 4
    kind = "device error"


class DataError(TfgpuError):
    """A dataset is missing, unreadable or malformed."""

    exit_code = 5
    kind = "data error"


class AlreadyInitializedError(TfgpuError):
    """TensorFlow initialised its devices before tfgpu could apply a setting."""

    exit_code = 6
    kind = "TensorFlow already initialised"


class TrainingError(TfgpuError):
    """Training failed after it started: the loss became NaN or infinite (``train.terminate_on_nan``), or
    TensorFlow raised while training, saving ``model.keras`` or evaluating the test split (out of memory, ...).

    A model that cannot be built (an unknown or misconfigured layer, a failing
    ``model.builder``) or does not fit the data is a :class:`ConfigError`,
    raised before anything is written.
    """

    exit_code = 7
    kind = "training failed"


class OutputError(TfgpuError):
    """The run directory or one of its files cannot be written."""

    exit_code = 8
    kind = "output error"


class DiskFull(OutputError):
    """A write failed because the disk is full (``ENOSPC``) or the disk quota is used up (``EDQUOT``).

    The message names the file, the free space and what was kept; the fix
    says where to make room and how to continue (``tfgpu run --resume``).
    Exit code 8, as every :class:`OutputError`.
    """

    kind = "disk full"

    def __init__(self, message: str, hint: str = "", path: "str | None" = None, code: int = 28,
                 needed: "int | None" = None) -> None:
        super().__init__(message, hint)
        #: The file that could not be written (``None``: unknown).
        self.path = path
        #: ``errno.ENOSPC`` (28) or ``errno.EDQUOT``.
        self.code = code
        #: Bytes the write needed, when it was refused before it started.
        self.needed = needed


class Interrupted(TfgpuError):
    """The run was interrupted (Ctrl-C); what was written so far is kept."""

    exit_code = 130
    kind = "interrupted"


class Preempted(TfgpuError):
    """A stop signal arrived (preemption, a scheduler's warning); the run saved a checkpoint and stopped.

    The job is meant to be started again: ``tfgpu run --resume RUN_DIR``
    continues it from that checkpoint.
    """

    exit_code = 75
    kind = "preempted"


class TrackingError(TfgpuError):
    """``output.mlflow`` is on and the MLflow tracking server cannot be reached, or refuses the run.

    Checked before training starts; with ``output.mlflow.required: false`` it is a warning instead.
    """

    exit_code = 11
    kind = "tracking error"


class SweepError(TfgpuError):
    """``tfgpu sweep`` could not run its study: every trial failed, or the study cannot be opened or continued."""

    exit_code = 12
    kind = "sweep error"


class WorkerError(TfgpuError):
    """A worker of a multi-worker run or launch failed; the others were stopped.

    ``exit_code`` is :func:`worker_exit_code` of the worker's: its own code
    when it exited with one (tfgpu's 3-8, a script's), else 10 (killed by a
    signal, or a crash: an uncaught exception).
    """

    exit_code = 10
    kind = "worker failed"

    def __init__(self, message: str, hint: str = "", exit_code: int = 10) -> None:
        super().__init__(message, hint)
        self.exit_code = exit_code

def gist(exc: BaseException) -> str:
    """The gist of an exception's message: TensorFlow's graph errors end with the real one."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if "in user code:" in str(exc):
        text = lines[-1]
    elif lines[0].startswith("Exception encountered when calling") and len(lines) > 1:
        text = lines[1]  # Keras: the layer's own message follows
    else:
        text = lines[0]
    text = text.rstrip(".")
    return text if len(text) <= 500 else text[:497] + "..."
