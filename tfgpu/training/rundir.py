"""A run directory and its life, owned by one object from its creation to its last status (:class:`RunDir`).

A run directory is created (``output.dir/NAME-YYYYmmdd-HHMMSS``), reopened
(``tfgpu run --resume``), or given by ``tfgpu run --workers N``
(``TFGPU_RUN_DIR``); a worker that is not the chief writes a scratch directory
beside it instead, removed when its run ends. :class:`RunDir` writes the
config files, ``plan.json``, TensorFlow's held-back start-up lines
(``startup.log``) and ``summary.json``; on resume it keeps ``metrics.csv`` to
the epochs the checkpoint holds; and it finishes the run as ``completed``,
``failed``, ``interrupted`` or ``preempted``, turning what stopped it into the
error the command line reports (:meth:`RunDir.running`). What each file holds:
:mod:`tfgpu.training.layout`.

``summary.json`` is the run's one state file and this object its one writer:
the status and process, the data seed, the epochs done and the commit record
of the last checkpoint (:meth:`RunDir.commit`) are written together,
atomically, so no two copies can disagree; ``--resume`` and restarted workers
read them back from it (:func:`tfgpu.training.checkpoint.read_state`).

A full disk loses nothing:

- a write that fails with ``ENOSPC`` or ``EDQUOT`` (a config file,
  ``metrics.csv``, a checkpoint save, its commit record, ``model.keras``,
  ``summary.json``, TensorBoard's events) ends the run with one
  :class:`~tfgpu.errors.DiskFull` (exit 8) naming the file, the free space,
  what is kept and ``tfgpu run --resume RUN_DIR``;
- the write leaves no temporary file (:func:`tfgpu.utils.files.replace_atomic`,
  :mod:`tfgpu.training.checkpoint`), and the last committed checkpoint is untouched;
- ``.reserve``, a few KiB made when the run begins, is deleted just before the
  last ``summary.json`` write, so the final status is written even on a disk
  that filled up meanwhile;
- ``summary.json`` records the process (pid, host, start time), so a
  ``"running"`` that a killed process left behind is recognised as stale
  (:func:`tfgpu.utils.processes.stale_status`) by ``--resume`` and ``tfgpu evaluate``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Optional

from ..config import Config, run_name
from ..devices.startup_log import RUN_FILE as STARTUP_LOG_FILE
from ..errors import DiskFull, Interrupted, OutputError, Preempted, TfgpuError, TrainingError, gist
from ..utils.files import disk_full, disk_full_error, failed_file, remove_quietly, write_atomic, write_json
from ..utils.processes import process_record
from . import checkpoint as ckpt
from .layout import CONFIG_FILE, create_run_dir, open_run_dir, write_config
from .loops import NOT_METRICS, Epochs
from .resume import RUN_DIR_ENV, Resumed, keep_metrics, restart_record

SUMMARY_FILE = ckpt.SUMMARY_FILE
#: The reserve file: deleted before the last ``summary.json`` write, so that write has room.
RESERVE_FILE = ".reserve"
#: The reserve's size: room for the final summary (a few KiB: about 4 KiB for 2 epochs) beside the old one.
RESERVE_BYTES = 16 * 1024
#: More room per planned epoch (each adds a row, its times and a checkpoint record to the summary).
RESERVE_BYTES_PER_EPOCH = 1024


def first_call_figures(summary: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary.json``'s ``xla`` figures of the first training call: ``first_call_seconds`` (the loop's start to
    the first call's return: iterators, tracing the step, XLA compiling it when it is compiled, and running the
    call's steps), ``first_call_steps``, and ``trace_and_compile_seconds``: that less the call's steps at the
    steady step time (the median epoch after the first: ``train_seconds / steps_per_epoch``); ``None`` when the run
    has no steady epoch."""
    first = (summary.get("startup_seconds") or {}).get("first_call")
    steps = summary.get("steps_per_epoch") or 0
    calls = min(summary.get("steps_per_execution") or 1, steps) if steps else 0
    steady = [r["train_seconds"] for r in rows[1:]]
    per_step = statistics.median(steady) / steps if steady and steps else None
    return {"first_call_seconds": first, "first_call_steps": calls,
            "trace_and_compile_seconds": (max(0.0, first - calls * per_step)
                                          if first is not None and per_step is not None else None)}


class RunDir:
    """One run's directory: where it is, what it writes, and how the run ended.

    Args:
        path: the directory this process writes.
        chief: whether it is the run's (``False``: a worker's scratch
            directory, removed by :meth:`close`).
        home: where the chief's files are (a non-chief restores its checkpoint
            from there); default ``path``.

    Attributes:
        summary: ``summary.json``'s contents, as last written or about to be.
        epochs: the finished epochs (:class:`~tfgpu.training.loops.Epochs`), shared with
            the epoch-statistics callback.

    Use as a context manager: on leaving, a scratch directory is removed.
    """

    def __init__(self, path: Path, chief: bool = True, home: Optional[Path] = None) -> None:
        self.path = path
        self.chief = chief
        self.home = home if home is not None else path
        self.summary: dict[str, Any] = {}
        self.epochs = Epochs()
        self.started = time.perf_counter()
        self.training_started: Optional[float] = None  # set by the runner when the loop starts
        self._marks: list[tuple[str, float]] = []
        self.recipe: Optional[str] = None
        self._planned = 0
        self._resumable = False

    @classmethod
    def open(cls, cfg: Config, recipe: Optional[str], info: Any, target: Optional[Path]) -> "RunDir":
        """The directory this process writes.

        The chief's: a new one; ``target`` (``--resume``'s, reopened or created);
        or the one ``tfgpu run --workers`` made for it (``TFGPU_RUN_DIR``). Any
        other worker's: a scratch directory beside it, removed when the run ends
        (TensorFlow's documented non-chief pattern: every worker saves, since
        saving reads synchronised variables collectively, but only the chief's
        files are kept).

        Raises:
            OutputError: the directory cannot be created, or ``TFGPU_RUN_DIR``
                is not an empty directory made for this run.
        """
        run = cls._open(cfg, recipe, info, target)
        run.recipe = recipe
        return run

    @classmethod
    def _open(cls, cfg: Config, recipe: Optional[str], info: Any, target: Optional[Path]) -> "RunDir":
        name = run_name(cfg, recipe)
        given = str(target) if target else os.environ.get(RUN_DIR_ENV)
        if info.is_chief:
            if target:
                return cls(open_run_dir(target))
            if given:
                path = Path(given)
                if not path.is_dir() or (path / CONFIG_FILE).exists():
                    raise OutputError(f"{RUN_DIR_ENV}: '{given}' is not an empty run directory made for this run.",
                                      f"unset {RUN_DIR_ENV}; 'tfgpu run --workers N' sets it for its workers.")
                return cls(path)
            return cls(create_run_dir(cfg.output.dir, name))
        index = info.cluster.worker_index
        where = Path(given).parent if given else Path(cfg.output.dir)
        stem = Path(given).name if given else f".{name}"
        path = where / f"{stem}.worker-{index}-{os.getpid()}.tmp"
        try:
            path.mkdir(parents=True)
        except OSError as exc:
            raise OutputError(f"output.dir: worker {index} cannot create its scratch directory {path}: "
                              f"{exc.strerror or exc}.",
                              "set output.dir to a directory every worker can write.") from None
        return cls(path, chief=False, home=Path(given) if given else path)

    @classmethod
    def for_group(cls, cfg: Config, recipe: Optional[str], target: Optional[Path]) -> "RunDir":
        """The run directory ``tfgpu run --workers N`` makes for its chief: ``target`` (``--resume``), else a new one.

        Raises:
            OutputError: it cannot be created.
        """
        if target is not None:
            return cls(open_run_dir(target))
        return cls(create_run_dir(cfg.output.dir, run_name(cfg, recipe)))

    def load_summary(self) -> dict[str, Any]:
        """``summary.json`` as the run last wrote it (``{"status": "failed"}`` when there is none).

        Raises:
            OutputError: it exists but cannot be read or parsed.
        """
        summary = ckpt.read_json(self.path / SUMMARY_FILE)
        return summary if summary is not None else {"status": "failed"}

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """A non-chief's scratch directory is removed; the chief's directory stays."""
        if not self.chief:
            shutil.rmtree(self.path, ignore_errors=True)

    # The run's beginning ------------------------------------------------------------------------------------------

    def startup(self, started: float, marks: dict[str, float]) -> None:
        """Note when each piece of the start-up ended (``time.perf_counter()``; ``marks`` in order: ``checks``,
        ``tensorflow``, ``data``, ``model``), from ``started``, for ``summary.json``'s ``startup_seconds``."""
        self._marks = [("start", started), *marks.items()]

    def _startup_seconds(self, first: Optional[float]) -> dict[str, Optional[float]]:
        """``summary.json``'s ``startup_seconds``: the seconds from the command's start to the first training call's
        return, piece by piece: ``checks`` (the config, the model and the data files, before TensorFlow),
        ``tensorflow`` (importing it, the devices and the strategy: :func:`tfgpu.setup`), ``data`` (loading it, the
        pipelines), ``model`` (building, compiling and checking it on two samples), ``run_directory`` (its files,
        the callbacks, a checkpoint restored) and ``first_call`` (the loop's start: its iterators, tracing the
        step, the first call's steps; ``None`` if no call returned). They add up to ``first_step_seconds``."""
        out: dict[str, Optional[float]] = {}
        for (_, before), (name, at) in zip(self._marks, self._marks[1:]):
            out[name] = at - before
        last = self._marks[-1][1]
        training = self.training_started if self.training_started is not None else last
        out["run_directory"] = training - last
        out["first_call"] = first - training if first is not None else None
        return out

    def begin(self, cfg: Config, info: Any, facts: dict[str, Any], resumed: Optional[Resumed],
              started: tuple[float, float]) -> None:
        """Write the config files, ``plan.json``, ``startup.log`` and ``summary.json`` (``"status": "running"``).

        Args:
            cfg: the run's configuration; info: :class:`tfgpu.Setup`.
            facts: what the summary records of the devices, data and model
                (:meth:`tfgpu.training.trainer.Trainer.facts`).
            resumed: the run being continued, or ``None``: its restarts are
                recorded, and the chief cuts ``metrics.csv`` to the epochs its
                checkpoint holds (those rows start :attr:`epochs`).
            started: ``(time.perf_counter(), time.time())`` when the command started.

        Raises:
            DiskFull, OutputError: a file cannot be written (nothing is left half-written).
        """
        self.started, started_at = started
        self._planned = cfg.train.epochs
        self._resumable = cfg.train.checkpoint.enabled
        write_config(self.path, cfg)
        write_json(self.path / "plan.json", info.plan.to_dict())
        held = info.startup_log.held if info.startup_log is not None else ""
        if held:
            write_atomic(self.path / STARTUP_LOG_FILE, held)
        summary: dict[str, Any] = {"status": "running", "recipe": str(self.recipe) if self.recipe else None,
                                   "run_dir": str(self.path), "cwd": os.getcwd(),
                                   "started_at": started_at, "process": process_record(), **facts,
                                   "tensorboard": str(self.path / "tensorboard") if cfg.output.tensorboard else None,
                                   "startup_log": str(self.path / STARTUP_LOG_FILE) if held else None, "epochs": []}
        if resumed is not None:
            previous = resumed.summary
            summary["restarts"] = [*previous.get("restarts", []), restart_record(self.home, previous, resumed.why)]
            summary["first_started_at"] = previous.get("first_started_at", previous.get("started_at"))
            if self.chief:
                self.epochs.rows[:] = keep_metrics(self.path, resumed.start.epoch)
                summary["epochs"] = list(self.epochs.rows)
        state = resumed.state if resumed is not None else None
        if self._resumable or state is not None:
            summary["checkpoint"] = {
                "dir": str(self.home / ckpt.CHECKPOINT_DIR), "enabled": self._resumable,
                "every_epochs": cfg.train.checkpoint.every_epochs, "every_steps": cfg.train.checkpoint.every_steps,
                "restored_from": {"epoch": state["epoch"], "step": state["step"]} if state else None}
            if state is not None:  # the commit stays the run's until a later save replaces it
                summary["checkpoint"]["committed"] = state
        self.summary = summary
        self._reserve(cfg.train.epochs)
        try:
            write_json(self.path / SUMMARY_FILE, summary)
        except TfgpuError:
            remove_quietly(self.path / RESERVE_FILE)
            raise

    def commit(self, state: dict[str, Any]) -> None:
        """Make ``state`` (a completed checkpoint save's record) the one to resume from: ``summary.json`` is written.

        ``summary.json`` is the run's one state file: its status and process,
        the data seed, the epochs done (their rows, as ``metrics.csv`` has
        them) and this commit record are written together, atomically, so they
        never disagree. The checkpoint callback calls it after each save.

        Raises:
            DiskFull, OutputError: it cannot be written (the previous commit stays).
        """
        record = self.summary.setdefault("checkpoint", {})
        before = dict(record), self.summary.get("epochs"), self.summary.get("epochs_completed")
        record["committed"] = state
        self.summary["epochs"] = list(self.epochs.rows)
        self.summary["epochs_completed"] = len(self.epochs.rows)
        try:
            write_json(self.path / SUMMARY_FILE, self.summary)
        except BaseException:  # not committed: the summary written later must not name this save
            record.clear()
            record.update(before[0])
            self.summary["epochs"], self.summary["epochs_completed"] = before[1], before[2]
            raise

    @property
    def committed(self) -> Optional[dict[str, Any]]:
        """The commit record of the last completed checkpoint save (``None``: none yet)."""
        return (self.summary.get("checkpoint") or {}).get("committed")

    def record(self, fields: dict[str, Any]) -> None:
        """Add ``fields`` to the summary (written at the next write); a dict merges into a dict already there."""
        for key, value in fields.items():
            if isinstance(value, dict) and isinstance(self.summary.get(key), dict):
                self.summary[key].update(value)
            else:
                self.summary[key] = value

    def _reserve(self, epochs: int) -> None:
        size = RESERVE_BYTES + RESERVE_BYTES_PER_EPOCH * epochs
        path = self.path / RESERVE_FILE
        try:
            with open(path, "wb") as f:
                f.write(b"\0" * size)  # written, not a sparse hole: the blocks must be taken now
        except OSError as exc:
            remove_quietly(path)
            code = disk_full(exc)
            if code is None:
                raise OutputError(f"cannot write {path}: {exc.strerror or exc}.",
                                  "check the disk space and permissions.") from None
            raise disk_full_error(code, path, self.path, f"Nothing was trained; {self.path} keeps the config.",
                                  "free space on that filesystem, then run again.") from None

    # The run's end -----------------------------------------------------------------------------------------------

    def finish(self, status: str, error: Optional[str] = None, fields: Optional[dict[str, Any]] = None) -> None:
        """Record how the run ended (``completed``, ``failed``, ``interrupted``, ``preempted``) in ``summary.json``.

        The epochs' figures (times, samples/s, final metrics) are derived from
        :attr:`epochs`: ``final_metrics`` are the figures of the epoch whose model the run keeps
        (``final_metrics_epoch``, counted from 1): the one ``fields["final_metrics_epoch"]`` names (the epoch
        whose weights training restored), else the last. The reserve is released first, so this write has room.

        Raises:
            DiskFull, OutputError: ``summary.json`` cannot be written even so.
        """
        rows = self.epochs.rows
        summary = self.summary
        self.record(fields or {})
        summary["status"] = status
        summary["epochs"] = rows
        summary["epochs_completed"] = len(rows)
        summary["wall_seconds"] = time.perf_counter() - self.started
        first = self.epochs.first_step_at
        summary["first_step_seconds"] = first - self.started if first is not None else None
        if self._marks:
            summary["startup_seconds"] = self._startup_seconds(first)
        summary["epoch_seconds"] = [r["epoch_seconds"] for r in rows]
        summary["train_seconds"] = [r["train_seconds"] for r in rows]
        steady = [r["samples_per_second"] for r in rows[1:]] or [r["samples_per_second"] for r in rows]
        summary["samples_per_second"] = statistics.median(steady) if steady else None
        if isinstance(summary.get("xla"), dict) and self._marks:
            summary["xla"].update(first_call_figures(summary, rows))
        # The kept model's epoch: the one whose weights training restored (fields' final_metrics_epoch, counted
        # from 1: train.early_stopping.restore_best_weights), else the last.
        kept = (fields or {}).get("final_metrics_epoch")
        last = next((r for r in rows if kept is not None and int(r["epoch"]) == kept - 1), rows[-1] if rows else {})
        summary["final_metrics"] = {k: v for k, v in last.items()  # the model's figures: no rate, no timing
                                    if k not in ("epoch", "learning_rate", *NOT_METRICS)}
        summary["final_metrics_epoch"] = int(last["epoch"]) + 1 if last else None
        if str(summary.get("test_metrics_from", "")).startswith("model.evaluate"):  # not the validation's copy
            summary["final_metrics"].update(summary["test_metrics"])
        if error:
            summary["error"] = error
        remove_quietly(self.path / RESERVE_FILE)
        write_json(self.path / SUMMARY_FILE, summary)

    @contextlib.contextmanager
    def running(self, outcome: Callable[[], dict[str, Any]],
                ending: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> Iterator[None]:
        """The training, saving and testing of the run: how the block ends is how the run ends.

        Normally: ``completed``. Ctrl-C: ``interrupted``, raised as
        :class:`~tfgpu.errors.Interrupted`; a stop signal: ``preempted``
        (:class:`~tfgpu.errors.Preempted` with the resume command); a full
        disk anywhere: ``failed``, raised as one :class:`~tfgpu.errors.DiskFull`;
        tfgpu's own errors: ``failed``, raised as they are; anything else (a
        TensorFlow error during training): ``failed``, raised as
        :class:`~tfgpu.errors.TrainingError`. ``outcome()`` gives what the
        summary records of the training however it ended (checkpoint saves,
        traces). ``ending()`` holds the stop signals while the last status is
        written (:meth:`tfgpu.training.checkpoint.StopSignals.ending`).
        """
        try:
            yield
        except KeyboardInterrupt:
            self._end("interrupted", None, outcome, ending)
            raise Interrupted(
                f"interrupted after {len(self.epochs.rows)} of {self._planned} epochs; {self.path} keeps the config, "
                "the metrics of the finished epochs and summary.json.",
                f"continue it with 'tfgpu run --resume {self.path}'" if self._resumable
                else "run again to train from the start.") from None
        except BaseException as exc:
            code = disk_full(exc) if isinstance(exc, Exception) else None
            if code is not None:
                error = self._disk_full(exc, code)
                self._end("failed", error.message, outcome, ending)
                raise error from (None if isinstance(exc, TfgpuError) else exc)
            if isinstance(exc, Preempted):  # raised by the checkpoint callback, which does not know the run directory
                self._end("preempted", str(exc), outcome, ending)
                raise Preempted(exc.message, f"continue with 'tfgpu run --resume {self.home}' (exit code 75 means: "
                                             "run this job again).") from None
            if isinstance(exc, TfgpuError):
                self._end("failed", str(exc), outcome, ending)
                raise
            if not isinstance(exc, Exception):
                raise
            self._end("failed", f"{type(exc).__name__}: {exc}", outcome, ending)
            raise TrainingError(
                f"training failed in epoch {min(len(self.epochs.rows) + 1, self._planned)}: {type(exc).__name__}: "
                f"{gist(exc)}.",
                (f"{self.path} keeps what was written" if self.chief
                 else "the chief's run directory keeps what was written") + "; run with --debug for the traceback.",
            ) from exc
        try:
            with ending():
                self.finish("completed", fields=outcome())
        except DiskFull as exc:
            raise self._disk_full(exc, exc.code) from None

    def _end(self, status: str, error: Optional[str], outcome: Callable[[], dict[str, Any]],
             ending: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> None:
        """:meth:`finish` on the way out of a failed run: never raises over the error that ended it."""
        try:
            with ending():
                self.finish(status, error, outcome())
        except TfgpuError:
            pass  # summary.json keeps "running"; its process record shows that this process has ended

    def _disk_full(self, exc: BaseException, code: int) -> DiskFull:
        """The run's :class:`DiskFull`: the file, the free space, what is kept and how to continue."""
        path = failed_file(exc, self.path)
        if path is not None and re.search(r"_temp[^/]*/", str(path)):  # TensorFlow's sharded save: name the checkpoint
            path = Path(re.sub(r"_temp[^/]*/.*$", "", str(path)))
        done = len(self.epochs.rows)
        state = self.committed
        if not self._resumable:
            kept = "train.checkpoint is off: a new run starts from the first epoch"
        elif state is None:
            kept = "no checkpoint was saved yet: --resume starts from the first epoch"
        else:
            kept = f"--resume continues from the checkpoint at epoch {state['epoch'] + 1} step {state['step']}"
        message = (f"The run stopped after {done} of {self._planned} epoch(s); {self.path} keeps its config, "
                   f"metrics and summary ({kept}).")
        hint = (f"free space on that filesystem (or move {self.path} to a larger one), then continue with "
                f"'tfgpu run --resume {self.path}'." if self._resumable else
                "free space on that filesystem, then run again.")
        where = path.parent if path is not None else self.path
        return disk_full_error(code, path, where, message, hint, getattr(exc, "needed", None))

    def drop_checkpoint(self) -> None:
        """Remove ``checkpoint/`` once ``model.keras`` holds the result (the chief's completed run)."""
        if self.chief:
            shutil.rmtree(self.path / ckpt.CHECKPOINT_DIR, ignore_errors=True)
