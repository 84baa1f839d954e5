"""Checkpoints as a run goes, the position to resume from, and stopping cleanly when a scheduler says so.

A run's checkpoint lives in ``RUN_DIR/checkpoint/``; what it holds is named by
the run's one state file, ``summary.json`` (``checkpoint.committed``, written
by :meth:`tfgpu.training.rundir.RunDir.commit` *after* a save has completed): where
training stood (``epoch`` epochs done and ``step`` steps of the next,
``global_step``), which files hold that state, when it was saved and how long
the save took. Only the state it names is ever restored, so a save cut short
by ``kill -9`` is never read.

- Each save is written under a new name, ``ckpt-<global step>``: ``fit``'s
  ``ckpt-<n>.weights.h5`` (``keras.Model.save_weights``: weights and optimizer
  variables; the record holds its SHA-256), the custom loop's
  ``ckpt-<n>.index``/``.data-*`` (``tf.train.Checkpoint.write`` of the model,
  optimizer, epoch and step). It is committed, and only then are the older
  files deleted: at every moment the committed checkpoint is whole on disk.
- ``progress.json``: the chief's last call boundary (at most every 0.2 s), so
  a resumed run can say how much work the kill cost.

Where Keras 3's ``BackupAndRestore`` falls short, so tfgpu does not use it:

- its ``double_checkpoint`` copies ``latest`` over ``.bkp`` before writing
  ``latest``: after one restore from ``.bkp`` the next save overwrote the
  committed copy with an uncommitted one (and ``tf.train.CheckpointManager``'s
  ``max_to_keep`` deletes old checkpoints before tfgpu has committed the new);
- it restores the epoch only: tfgpu continues inside the epoch (``loops.fit``:
  the rest of the epoch is one fit call), on the batches an uninterrupted run
  reads (:attr:`~tfgpu.data.pipeline.Pipelines.train_epochs` skips the done
  ones, with the run's data seed kept in ``summary.json``);
- every worker writes and deletes the same directory: here only the chief
  writes ``RUN_DIR/checkpoint``; another worker saves into its own scratch
  directory (every worker must save, since reading synchronised variables is
  collective) and restores from the chief's files.

Wraps: https://keras.io/api/models/model_saving_apis/weights_saving_and_loading/ and
https://www.tensorflow.org/api_docs/python/tf/train/Checkpoint
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..errors import OutputError, Preempted, TrainingError
from ..utils.files import ensure_room, remove_quietly, write_json

CHECKPOINT_DIR = "checkpoint"
#: The run's state file, which holds the commit record (``checkpoint.committed``).
SUMMARY_FILE = "summary.json"
#: Where a run directory of an older tfgpu kept the commit record (read on resume only).
LEGACY_STATE_FILE = "state.json"
PROGRESS_FILE = "progress.json"
#: Seconds between two writes of ``progress.json``.
PROGRESS_EVERY = 0.2
_FIT_SUFFIX = ".weights.h5"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


#: Room an HDF5 save needs beyond its arrays' bytes (its metadata, with a margin), for :func:`saved_bytes` checks.
HDF5_MARGIN = 1 << 20


def saved_bytes(model: Any) -> int:
    """Bytes of the arrays a Keras save writes: the model's weights and its optimizer's variables (no file overhead)."""
    import numpy as np  # noqa: PLC0415

    variables = list(model.weights)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        variables += list(getattr(optimizer, "variables", []))
    total = 0
    for v in variables:
        try:
            total += math.prod(int(d) for d in v.shape) * np.dtype(str(v.dtype)).itemsize
        except (TypeError, ValueError):
            total += math.prod(int(d) for d in v.shape) * 4
    return total


def close_hdf5_files(directory: Path) -> None:
    """Empty and close every HDF5 file h5py still holds open in ``directory`` (after a failed Keras save).

    A ``save_weights`` that fails part-way (a full disk) leaves its h5py file
    open with data HDF5 could not write; HDF5 retries when the file is closed
    (or when the process exits, where it was seen to crash with SIGSEGV).
    Truncating the file first frees its space, so the close succeeds; the
    caller then deletes it. Does nothing when h5py was never imported.
    """
    h5py = sys.modules.get("h5py")
    if h5py is None:
        return
    try:
        open_files = h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)
    except Exception:  # noqa: BLE001 - h5py's internals: nothing more can be done
        return
    for fid in open_files:
        try:
            name = Path(os.fsdecode(fid.name))
            if name.parent.resolve() != directory.resolve():
                continue
            os.truncate(name, 0)
            for _ in range(8):  # one close per reference the failed save left
                if not fid.valid:
                    break
                fid.close()
        except Exception:  # noqa: BLE001
            continue


def read_json(path: Path) -> Optional[dict[str, Any]]:
    """A JSON file tfgpu wrote atomically, or ``None`` when it is absent.

    Raises:
        OutputError: it exists but cannot be read or parsed.
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise OutputError(f"cannot read {path}: {exc}.",
                          "the file was changed by hand or the disk failed; move the run aside and start again.") from None


def read_state(run_dir: Path) -> Optional[dict[str, Any]]:
    """The commit record of ``run_dir``'s last completed checkpoint save, or ``None`` (none yet).

    It is ``summary.json``'s ``checkpoint.committed`` (the run's one state
    file, written by :class:`tfgpu.training.rundir.RunDir`); a run directory of an
    older tfgpu keeps it in ``checkpoint/state.json``, which is read then.
    Keys: ``loop``, ``epoch`` (epochs done), ``step`` (steps done of epoch
    ``epoch``, counted from 0), ``global_step``, ``steps_per_epoch``,
    ``saved_at`` (Unix time), ``save_seconds``, ``reason`` (``epoch``,
    ``steps`` or ``preempted``), ``files``.

    Raises:
        OutputError: a file exists but cannot be read or parsed.
    """
    summary = read_json(Path(run_dir) / SUMMARY_FILE)
    if summary is not None and "committed" in (summary.get("checkpoint") or {}):
        return summary["checkpoint"]["committed"]
    return read_json(Path(run_dir) / CHECKPOINT_DIR / LEGACY_STATE_FILE)


def _step_of(path: Path) -> Optional[int]:
    """``ckpt-<global step>...`` -> the global step (``None``: not a checkpoint file of this scheme)."""
    match = re.match(r"ckpt-(\d+)[._]", path.name)
    return int(match.group(1)) if match else None


def _prune(directory: Path, keep: str) -> None:
    """Delete every checkpoint file in ``directory`` but those of ``keep`` (a file name or a prefix).

    Called after the commit record names ``keep``: a save is written under a
    new name, committed, and only then are the others deleted, so a kill at
    any moment leaves the committed checkpoint whole.
    """
    for path in directory.iterdir() if directory.is_dir() else []:
        legacy = path.name.startswith(("latest.weights.h5", "training_metadata.json")) or path.name == "checkpoint"
        if (_step_of(path) is not None or legacy) and not (path.name == keep or path.name.startswith(keep + ".")):
            if path.is_dir():
                import shutil  # noqa: PLC0415

                shutil.rmtree(path, ignore_errors=True)
            else:
                remove_quietly(path)


class FitFiles:
    """``fit``'s checkpoint: ``ckpt-<global step>.weights.h5``, written by ``keras.Model.save_weights``.

    The file holds the model's weights and its optimizer's variables. Each save
    gets a new name; ``summary.json`` commits it (with its SHA-256), and only
    then are older files deleted (:meth:`prune`). Keras's
    ``BackupAndRestore`` is not used: its ``double_checkpoint`` copies the
    latest file over its ``.bkp`` before each save, so after one restore from
    ``.bkp`` the next save overwrote the committed file with an uncommitted one.

    Args:
        model: the compiled model (its optimizer is saved with it).
        directory: where this process saves.

    Wraps: https://keras.io/api/models/model_saving_apis/weights_saving_and_loading/
    """

    def __init__(self, model: Any, directory: Path) -> None:
        self.model = model
        self.directory = directory

    def track(self, optimizer: Any) -> None:
        """Nothing to do: the file holds the model's compiled optimizer, whichever it is now (``train.unfreeze``)."""

    def save(self, epoch: int, step: int, global_step: int) -> dict[str, Any]:
        """Save as ``ckpt-<global_step>.weights.h5``; returns what the commit record keeps of the file.

        A save that fails (a full disk: h5py's ``OSError``) leaves no partial
        file: the HDF5 file being written is emptied and closed (HDF5 would
        otherwise try to flush it again when the process exits, and crash) and deleted.
        """
        name = f"ckpt-{global_step}{_FIT_SUFFIX}"
        path = self.directory / name
        self.directory.mkdir(parents=True, exist_ok=True)
        ensure_room(path, saved_bytes(self.model) + HDF5_MARGIN)  # an HDF5 file that runs out of space crashes
        try:
            self.model.save_weights(str(path))
            digest = _sha256(path)
        except BaseException:
            close_hdf5_files(self.directory)
            remove_quietly(path)
            raise
        return {"weights": name, "sha256": digest}

    def prune(self, state: dict[str, Any]) -> None:
        """Delete every checkpoint file but the one ``state`` (the committed record) names."""
        _prune(self.directory, state["files"]["weights"])

    def restore(self, state: dict[str, Any], directory: Path) -> str:
        """Load the weights ``state`` names from ``directory``; returns the file read.

        Raises:
            OutputError: that file is missing or is not the one saved (its SHA-256 differs).
        """
        want = state["files"]["sha256"]
        named = state["files"]["weights"]
        for name in (named, f"{named}.bkp"):  # .bkp: the record of a run directory of an older tfgpu
            path = directory / name
            if path.is_file() and _sha256(path) == want:
                optimizer = self.model.optimizer
                if optimizer is not None and not optimizer.built:
                    optimizer.build(self.model.trainable_variables)
                if name.endswith(".weights.h5"):
                    self.model.load_weights(str(path))
                else:  # Keras loads only files named *.weights.h5: a link under that name (no copy, no space)
                    self.directory.mkdir(parents=True, exist_ok=True)
                    link = self.directory / ".restore.weights.h5"
                    remove_quietly(link)
                    try:
                        os.symlink(path.resolve(), link)
                        self.model.load_weights(str(link))
                    finally:
                        remove_quietly(link)
                return str(path)
        raise OutputError(
            f"{directory}: {named} is missing or is not the checkpoint summary.json names "
            f"(epoch {state['epoch']}, step {state['step']}).",
            "the checkpoint files were changed or lost; start a new run (the run directory keeps its metrics).")


class CustomFiles:
    """The custom loop's checkpoint: ``tf.train.Checkpoint(model, optimizer, epoch, step)`` written as ``ckpt-<global step>``.

    ``Checkpoint.write`` writes ``ckpt-<n>.index`` and ``.data-*`` under a new
    name each save; ``summary.json`` commits it and only then are older ones
    deleted (:meth:`prune`). ``tf.train.CheckpointManager`` is not used: its
    ``max_to_keep`` deletes old checkpoints when it saves, before tfgpu commits,
    so a save cut short after its deletion could leave no committed checkpoint.

    Args:
        model, optimizer: the model and the optimizer that trains it.
        directory: where this process saves.

    Wraps: https://www.tensorflow.org/api_docs/python/tf/train/Checkpoint#write
    """

    def __init__(self, model: Any, optimizer: Any, directory: Path) -> None:
        import tensorflow as tf  # noqa: PLC0415

        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.directory = directory
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch, step=self.step)

    def track(self, optimizer: Any) -> None:
        """Save (and restore) ``optimizer`` from now on instead of the one given first (``train.unfreeze``
        replaces the optimizer, :func:`tfgpu.model.transfer.unfreeze`)."""
        import tensorflow as tf  # noqa: PLC0415

        model = self.checkpoint.model
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch, step=self.step)

    def save(self, epoch: int, step: int, global_step: int) -> dict[str, Any]:
        """Save as ``ckpt-<global_step>``; returns what the commit record keeps of the files.

        A save that fails (a full disk: TensorFlow's ``ResourceExhaustedError``)
        leaves none of its files (``ckpt-<n>_temp/``, ``ckpt-<n>.*``); earlier checkpoints stay.
        """
        self.epoch.assign(epoch)
        self.step.assign(step)
        prefix = self.directory / f"ckpt-{global_step}"
        try:
            return {"checkpoint": Path(self.checkpoint.write(str(prefix))).name, "api": "tf.train.Checkpoint.write"}
        except BaseException:
            for path in [*self.directory.glob(f"ckpt-{global_step}_temp*"), *self.directory.glob(f"ckpt-{global_step}.*")]:
                if path.is_dir():
                    import shutil  # noqa: PLC0415

                    shutil.rmtree(path, ignore_errors=True)
                else:
                    remove_quietly(path)
            raise

    def prune(self, state: dict[str, Any]) -> None:
        """Delete every checkpoint but the one ``state`` (the committed record) names."""
        _prune(self.directory, state["files"]["checkpoint"])

    def restore(self, state: dict[str, Any], directory: Path) -> str:
        """Restore the checkpoint ``state`` names from ``directory``; returns its path.

        Raises:
            OutputError: it is missing, damaged, or does not fit the model.
        """
        path = directory / state["files"]["checkpoint"]
        try:
            # read() for write()'s files (no save_counter); restore() for CheckpointManager's (an older tfgpu).
            load = self.checkpoint.read if state["files"].get("api") == "tf.train.Checkpoint.write" else self.checkpoint.restore
            load(str(path)).assert_existing_objects_matched()
        except (ValueError, AssertionError) as exc:
            raise OutputError(f"{path}: the checkpoint does not fit this run's model ({exc}).",
                              "resume with the run's own config; start a new run for another model.") from None
        except Exception as exc:  # tf.errors.NotFoundError / DataLossError: files gone or damaged
            raise OutputError(f"{path}: cannot read the checkpoint summary.json names: {type(exc).__name__}.",
                              "the checkpoint files were changed or lost; start a new run.") from None
        if (int(self.epoch.numpy()), int(self.step.numpy())) != (state["epoch"], state["step"]):
            raise OutputError(f"{path} holds epoch {int(self.epoch.numpy())} step {int(self.step.numpy())}, "
                              f"summary.json says epoch {state['epoch']} step {state['step']}.",
                              "the checkpoint files were changed; start a new run.")
        return str(path)


#: :attr:`StopSignals.received` when ``train.max_time`` ran out.
MAX_TIME = "train.max_time"


class StopSignals:
    """SIGTERM, the requeue signal and Ctrl-C (SIGINT), handled for the whole life of ``tfgpu run``
    (:meth:`installed`).

    While training (inside :meth:`deferred`, with a checkpoint to save) a signal
    only sets :attr:`received`: the checkpoint callback reads it at the next
    call boundary, saves and stops. At any other moment (reading the data,
    building the model, saving ``model.keras``, testing; or training with
    ``train.checkpoint`` off) the handler raises :class:`~tfgpu.errors.Preempted`
    at once, naming what the run was doing (:attr:`doing`). Either way the run
    ends as ``preempted`` with exit code 75, never killed by the signal's
    default action (SIGUSR1's ends the process). Ctrl-C is stopped the same way
    but ends the run ``interrupted`` (``KeyboardInterrupt``: exit 130), resumable
    from the checkpoint saved where it stopped; a second Ctrl-C, or one outside
    training, interrupts at once; a process started with SIGINT ignored keeps
    ignoring it. (A KeyboardInterrupt raised into Keras's or TensorFlow's code
    mid-call, a checkpoint write among them, once left a run unstopped for two
    minutes under load.) Inside :meth:`held` every signal waits for the block's
    end. Signal handlers can only be set in the main thread (elsewhere this does
    nothing).

    Args:
        requeue_signal: ``train.checkpoint.requeue_signal`` (e.g. ``"SIGUSR1"``) or ``None``.
    """

    def __init__(self, requeue_signal: Optional[str]) -> None:
        self.requeue_signal = requeue_signal
        self.received: Optional[str] = None
        #: What the run is doing, for the message of a signal that arrives outside training.
        self.doing = "starting"
        #: A signal stopped the run outside training (its handler raised; no checkpoint callback saw it).
        self.outside = False
        #: This process is the run's chief (the one that requeues a Slurm job); the caller sets it.
        self.chief = True
        self._deferred = False
        self._previous: dict[int, Any] = {}
        #: ``train.max_time`` in seconds, and the ``time.monotonic()`` at which it runs out (:meth:`time_up`).
        self.max_time: Optional[float] = None
        self.deadline: Optional[float] = None

    def limit(self, seconds: Optional[float]) -> None:
        """``train.max_time``: the run stops like a requeue signal ``seconds`` from now (``None``: no limit)."""
        self.max_time = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if name == "SIGINT":
            # Ctrl-C: while training, stop at the next call boundary with a checkpoint, like SIGTERM, then end
            # interrupted (a KeyboardInterrupt raised into Keras's or TensorFlow's own code, a checkpoint being
            # written among them, could leave the run hanging); a second Ctrl-C, or one at any other moment,
            # interrupts at once
            if not self._deferred or self.received == "SIGINT":
                raise KeyboardInterrupt
            self.received = self.received or name
            return
        if self.received in (None, "SIGINT") or name == self.requeue_signal:
            self.received = name
        if not self._deferred:
            self.outside = True
            raise self.stopped(name)

    def stopped(self, name: Optional[str] = None) -> Preempted:
        """The :class:`~tfgpu.errors.Preempted` of a signal (``name``, else :attr:`received`) that stops the run
        outside training: which signal, and what the run was doing."""
        return Preempted(f"{name or self.received} arrived while {self.doing}; the run stopped there.")

    @contextlib.contextmanager
    def installed(self) -> Iterator["StopSignals"]:
        """Handle the signals inside the block (the previous handlers are put back after)."""
        import threading  # noqa: PLC0415

        if threading.current_thread() is threading.main_thread():
            for name in ["SIGTERM", "SIGINT"] + ([self.requeue_signal] if self.requeue_signal else []):
                sig = getattr(signal, name)
                if sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
                    continue  # started with Ctrl-C ignored (nohup, a background job): it stays ignored
                self._previous[sig] = signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous.clear()

    def reassert(self) -> None:
        """Set the handlers again (after TensorFlow started a multi-worker strategy).

        TensorFlow's coordination service installs its own C-level SIGTERM
        handler for its preemption notifier when a MultiWorkerMirroredStrategy
        starts; Python's handler then never runs (seen here: SIGTERM to a
        worker did nothing). Setting Python's handler again puts it back.
        """
        import threading  # noqa: PLC0415

        if self._previous and threading.current_thread() is threading.main_thread():
            for sig in self._previous:
                signal.signal(sig, self._handle)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Inside, a signal only sets :attr:`received`; the run stops (:class:`~tfgpu.errors.Preempted`) when the block ends.

        For TensorFlow's import and start-up: an exception raised into the
        middle of importing its C++ modules was seen to abort the process
        (SIGABRT) instead of ending it with 75. They take seconds, far under a
        scheduler's grace period. Blocks nest (an inner one ends at a safe
        point of the outer); :meth:`check` inside stops at a safe point of the
        block's own.
        """
        with self.ending():  # a signal only recorded inside
            yield
        self.check()

    def check(self) -> None:
        """Stop here if a signal has arrived: ``KeyboardInterrupt`` for Ctrl-C, else
        :class:`~tfgpu.errors.Preempted` (a safe point inside :meth:`held`; nothing otherwise)."""
        if self.interrupted:
            raise KeyboardInterrupt
        if self.received is not None:
            self.outside = True
            raise self.stopped()

    @contextlib.contextmanager
    def ending(self) -> Iterator[None]:
        """While the run writes how it ended (``summary.json``'s last status): a stop signal only sets
        :attr:`received`, and nothing is raised when the block ends: the run is ending already, and a signal raised
        into that write would leave ``summary.json`` saying ``running``. A Ctrl-C after a Ctrl-C still stops at
        once."""
        was = self._deferred
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = was

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Inside: a signal only sets :attr:`received` (the checkpoint callback stops at the next call boundary)."""
        self.check()  # a signal that arrived just before: stop now
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False

    @property
    def interrupted(self) -> bool:
        """The signal received is Ctrl-C (SIGINT): the run ends ``interrupted`` (130), not ``preempted``."""
        return self.received == "SIGINT"

    @property
    def requeue(self) -> bool:
        """The signal received is the requeue signal, or ``train.max_time`` ran out (a job that stops before its
        scheduler's limit wants to run again)."""
        return self.received is not None and self.received in (self.requeue_signal, MAX_TIME)

    def time_up(self) -> bool:
        """Whether ``train.max_time`` has run out (:attr:`deadline`); it then counts as a stop received
        (:data:`MAX_TIME`), as a signal would. Read at call boundaries (the checkpoint callback)."""
        if self.received is None and self.deadline is not None and time.monotonic() >= self.deadline:
            self.received = MAX_TIME
        return self.received == MAX_TIME

    def describe(self) -> str:
        """What stopped the run, in words: the signal's name, or ``train.max_time (N s) ran out``."""
        if self.received == MAX_TIME:
            return f"train.max_time ({self.max_time:g} s from the process's start) ran out"
        return f"{self.received or 'a stop signal (on another worker)'} arrived"


def requeue(job_id: str) -> str:
    """Ask Slurm to requeue job ``job_id`` (``scontrol requeue``); returns what happened, for the message.

    This is the one place tfgpu talks to Slurm; the tests put their own
    ``scontrol`` first on ``PATH``.
    """
    command = ["scontrol", "requeue", job_id]
    try:
        # SIGTERM ignored: the requeue ends every process of the job with SIGTERM, this scontrol too, often before
        # it has said that it succeeded (seen on a real Slurm: "failed with exit code -15" for a requeued job)
        done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                              preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"'{' '.join(command)}' could not run ({exc}); requeue the job yourself"
    if done.returncode == -signal.SIGTERM:  # it asked, and the requeue it asked for ended it all the same
        return f"Slurm job {job_id} was requeued ('{' '.join(command)}', ended by the requeue's SIGTERM)"
    if done.returncode != 0:
        return (f"'{' '.join(command)}' failed with exit code {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[:300]}; requeue the job yourself")
    return f"Slurm job {job_id} was requeued ('{' '.join(command)}')"


def agreement(strategy: Any) -> Callable[[int], int]:
    """``code -> max over workers`` (0 none, 1 stop, 2 stop and requeue): one tiny all-reduce across workers.

    Workers must stop at the same step (their collectives would wait for a
    missing peer otherwise), so with several workers each call boundary asks
    them all; every worker calls it at the same boundaries.
    """
    import tensorflow as tf  # noqa: PLC0415

    @tf.function
    def reduce(flags: Any) -> Any:
        per_replica = strategy.run(lambda f: tf.identity(f), args=(flags,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def agree(code: int) -> int:
        flags = tf.constant([1.0 if code >= 1 else 0.0, 1.0 if code >= 2 else 0.0])
        total = reduce(flags).numpy()
        return 2 if total[1] > 0 else 1 if total[0] > 0 else 0

    return agree


def _require_finite(model: Any, epoch: int, step: int) -> None:
    """Raise :class:`TrainingError` when a weight of ``model`` is NaN or infinite (read on the host: a save reads them too)."""
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    for variable in model.weights:
        if not np.all(np.isfinite(keras.ops.convert_to_numpy(variable))):
            raise TrainingError(
                f"the weights became NaN or infinite before the checkpoint at epoch {epoch + 1} step {step} "
                f"({variable.path if hasattr(variable, 'path') else variable.name}); that checkpoint was not saved, "
                "so --resume would continue from the last good one.",
                "lower the learning rate, check the data for bad values, or use float32.")


@dataclass(frozen=True)
class Position:
    """Where training stands: ``epoch`` epochs done and ``step`` steps of the next (both from 0)."""

    epoch: int = 0
    step: int = 0


@dataclass(frozen=True)
class SavePlan:
    """When and where the checkpoint callback saves.

    Attributes:
        write_dir: where this process saves (the chief: ``RUN_DIR/checkpoint``).
        chief: writes ``state.json`` and ``progress.json``.
        steps_per_epoch, epochs: the run's.
        every_epochs, every_steps: ``train.checkpoint``'s.
        loop: ``fit`` or ``custom`` (recorded).
        start: the position training starts from (batch indices the loops
            pass are counted from it in its first epoch).
        refuse_nan: ``train.terminate_on_nan``: a save whose weights hold NaN
            or infinite values is refused (:class:`~tfgpu.errors.TrainingError`),
            so the last good checkpoint stays the one to resume from.
    """

    write_dir: Path
    chief: bool
    steps_per_epoch: int
    epochs: int
    every_epochs: int = 1
    every_steps: Optional[int] = None
    loop: str = "fit"
    start: Position = Position()
    refuse_nan: bool = True


def checkpoint_callback(files: Any, plan: SavePlan, stop: Optional[StopSignals] = None,
                        agree: Optional[Callable[[int], int]] = None,
                        on_stop: Optional[Callable[[dict[str, Any]], str]] = None,
                        commit: Optional[Callable[[dict[str, Any]], None]] = None) -> Any:
    """The Keras callback that saves checkpoints and stops at a signal; both loops call it.

    Place it after ``CSVLogger``: an epoch's row is written before its
    checkpoint, so a kill between the two redoes the epoch and the resumed run
    drops the row (metrics.csv never lacks an epoch a checkpoint holds).

    Args:
        files: :class:`FitFiles` or :class:`CustomFiles`.
        plan: when and where (:class:`SavePlan`).
        stop: the signal watcher; ``None``: signals are not handled.
        agree: :func:`agreement` with several workers, else ``None``.
        on_stop: called by the chief with the state after the stop's save;
            returns a sentence for the message (the requeue's outcome).
        commit: called by the chief with each completed save's record
            (:meth:`tfgpu.training.rundir.RunDir.commit`: written to ``summary.json``);
            only then are the older checkpoint files deleted.

    Its ``saves`` attribute lists the seconds each save took.

    Raises (from the training loop):
        Preempted: a stop signal arrived; the checkpoint was saved first.
        TrainingError: the weights became NaN or infinite (``plan.refuse_nan``); nothing was saved.
        OSError and TensorFlow's errors: a save failed (e.g. the disk is full);
            what it had written is removed first, and the last committed
            checkpoint is left as it was.
    """
    write_dir, chief, steps_per_epoch, epochs = plan.write_dir, plan.chief, plan.steps_per_epoch, plan.epochs
    every_epochs, every_steps, start, loop = plan.every_epochs, plan.every_steps, plan.start, plan.loop
    import keras  # noqa: PLC0415

    class Checkpointer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.saves: list[float] = []
            self.epoch = start.epoch
            self.base = start.step
            self.saved_at = start.epoch * steps_per_epoch + start.step
            self.next_steps = self._next(self.saved_at)
            self.progress_at = 0.0
            self.last_state: Optional[dict[str, Any]] = None
            write_dir.mkdir(parents=True, exist_ok=True)

        def _next(self, global_step: int) -> Optional[int]:
            return (global_step // every_steps + 1) * every_steps if every_steps else None

        def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
            self.epoch = epoch
            self.base = start.step if epoch == start.epoch else 0

        def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
            step = self.base + batch + 1
            global_step = self.epoch * steps_per_epoch + step
            # At an epoch's last step the epoch-end save (after validation and the metrics row) does it.
            if self.next_steps is not None and global_step >= self.next_steps and step < steps_per_epoch:
                self._save(self.epoch, step, "steps")
            if chief and time.monotonic() - self.progress_at >= PROGRESS_EVERY:
                self.progress_at = time.monotonic()
                write_json(write_dir / PROGRESS_FILE, {"epoch": self.epoch, "step": step,
                                                        "global_step": global_step, "at": time.time()})
            if step < steps_per_epoch:  # at the epoch's last step: after its validation and row (on_epoch_end)
                self._check_stop(self.epoch, step)

        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            due = self.next_steps is not None and (epoch + 1) * steps_per_epoch >= self.next_steps
            # model.stop_training: a callback (train.early_stopping) ends the run here: its last epoch is saved.
            if (epoch + 1) % every_epochs == 0 or epoch + 1 == epochs or due or self.model.stop_training:
                self._save(epoch + 1, 0, "epoch")
            if epoch + 1 < epochs:
                self._check_stop(epoch + 1, 0)

        def _save(self, epoch: int, step: int, reason: str) -> dict[str, Any]:
            global_step = epoch * steps_per_epoch + step
            began = time.perf_counter()
            if plan.refuse_nan:
                _require_finite(self.model, epoch, step)
            state = {"loop": loop, "epoch": epoch, "step": step, "global_step": global_step,
                     "steps_per_epoch": steps_per_epoch, "reason": reason,
                     "files": files.save(epoch, step, global_step)}
            seconds = time.perf_counter() - began
            state.update(saved_at=time.time(), save_seconds=seconds)
            if chief and commit is not None:
                commit(state)  # only now is this save the one to restore
            files.prune(state)
            self.saves.append(seconds)
            self.last_state = state
            self.saved_at = global_step
            self.next_steps = self._next(global_step)
            return state

        def _check_stop(self, epoch: int, step: int) -> None:
            if stop is None:
                return
            stop.time_up()  # train.max_time: a stop, as the requeue signal
            code = 0 if stop.received is None else 2 if stop.requeue else 1
            if agree is not None:
                code = agree(code)
            if not code:
                return
            global_step = epoch * steps_per_epoch + step
            state = self.last_state
            if state is None or state["global_step"] != global_step:
                state = self._save(epoch, step, "preempted")
            if stop.interrupted:  # Ctrl-C: the run ends interrupted (130), resumable from this checkpoint
                raise KeyboardInterrupt
            said = on_stop(state) if (chief and on_stop is not None and code == 2) else ""
            raise Preempted(
                f"{stop.describe()}: stopped at epoch {epoch + 1} step {step} (global step {global_step}) with a "
                f"checkpoint" + (f"; {said}" if said else "") + ".")  # tfgpu.training.runner adds the resume command

    return Checkpointer()
