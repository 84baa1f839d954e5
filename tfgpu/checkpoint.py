"""Checkpoints as a run goes, the position to resume from, and stopping cleanly when a scheduler says so.

A run's checkpoint lives in ``RUN_DIR/checkpoint/``:

- ``state.json``: tfgpu's commit record, replaced atomically *after* a save
  has completed: where training stood (``epoch`` epochs done and ``step``
  steps of the next, ``global_step``), which files hold that state, when it
  was saved and how long the save took. Only the state it names is ever
  restored, so a save cut short by ``kill -9`` is never read.
- ``fit``: ``latest.weights.h5`` and ``training_metadata.json`` with their
  ``.bkp`` copies, written by ``keras.callbacks.BackupAndRestore`` with
  ``double_checkpoint=True``; ``state.json`` holds the SHA-256 of the weights
  file it means, which is ``latest`` or, when a save was cut short,
  ``latest.bkp``.
- ``custom``: ``ckpt-<global step>.index/.data-*`` and ``checkpoint``, written by
  ``tf.train.CheckpointManager`` (``max_to_keep=2``, so the one ``state.json``
  names survives the next save) of ``tf.train.Checkpoint(model, optimizer,
  epoch, step)``.
- ``progress.json``: the chief's last call boundary (at most every 0.2 s), so
  a resumed run can say how much work the kill cost.

Where Keras 3's ``BackupAndRestore`` falls short, and what tfgpu does:

- it restores the epoch only (the saved batch is not used): tfgpu restores
  the weights itself and continues inside the epoch (``loops.fit``: the rest
  of the epoch is one fit call), on the batches an uninterrupted run reads
  (:attr:`~tfgpu.data.pipeline.Pipelines.train_epochs` skips the done ones);
- every worker writes and deletes the same directory: here only the chief
  writes ``RUN_DIR/checkpoint``; another worker saves into its own scratch
  directory (every worker must save, since reading synchronised variables is
  collective) and restores from the chief's files;
- its two files are not written as one: a kill between the weights and the
  metadata leaves new weights with old metadata, and a half-written metadata
  file raises ``JSONDecodeError``, which its ``.bkp`` fallback (``OSError``
  only) does not catch; the commit record above closes both.

Wraps: https://keras.io/api/callbacks/backup_and_restore/ and
https://www.tensorflow.org/api_docs/python/tf/train/CheckpointManager
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from .errors import OutputError, Preempted
from .results import ensure_room, remove_quietly, write_json

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.json"
PROGRESS_FILE = "progress.json"
#: Seconds between two writes of ``progress.json``.
PROGRESS_EVERY = 0.2
_FIT_WEIGHTS = "latest.weights.h5"


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

    Keys: ``loop``, ``epoch`` (epochs done), ``step`` (steps done of epoch
    ``epoch``, counted from 0), ``global_step``, ``steps_per_epoch``,
    ``saved_at`` (Unix time), ``save_seconds``, ``reason`` (``epoch``,
    ``steps`` or ``preempted``), ``files``.
    """
    return read_json(Path(run_dir) / CHECKPOINT_DIR / STATE_FILE)


class FitFiles:
    """``fit``'s checkpoint: the weights file of ``keras.callbacks.BackupAndRestore``.

    Args:
        model: the compiled model (its optimizer is saved with it).
        directory: where this process saves (``backup_dir``).
    """

    def __init__(self, model: Any, directory: Path) -> None:
        import keras  # noqa: PLC0415

        self.model = model
        self.directory = directory
        #: SHA-256 of the last committed weights in ``directory`` (``None``: none yet).
        self.committed: Optional[str] = None
        # tfgpu decides when to save and restores itself (see the module's docstring).
        self.backup = keras.callbacks.BackupAndRestore(str(directory), save_freq="epoch", double_checkpoint=True,
                                                       delete_checkpoint=False)
        self.backup.set_model(model)

    def save(self, epoch: int, step: int, global_step: int) -> dict[str, Any]:
        """Save; returns what ``state.json`` records of the files.

        A save that fails (a full disk: h5py's ``OSError``) leaves no partial
        file: the HDF5 file being written is emptied and closed (HDF5 would
        otherwise try to flush it again when the process exits, and crash), and
        each weights file that is not the last committed checkpoint is deleted.
        """
        # BackupAndRestore saves in on_epoch_end(e), recording e + 1 as the epoch Keras would
        # restart at: the epoch being trained (``epoch``), whether it has begun or not.
        latest = self.directory / _FIT_WEIGHTS
        try:
            size = latest.stat().st_size
        except OSError:
            size = saved_bytes(self.model)
        ensure_room(latest, size + HDF5_MARGIN)  # an HDF5 file that runs out of space crashes when closed
        try:
            self.backup.on_epoch_end(epoch - 1)
            digest = _sha256(self.directory / _FIT_WEIGHTS)
        except BaseException:
            self._discard_partial()
            raise
        self.committed = digest  # the caller commits it in state.json next
        return {"weights": _FIT_WEIGHTS, "sha256": digest}

    def _discard_partial(self) -> None:
        close_hdf5_files(self.directory)
        for name in (_FIT_WEIGHTS, f"{_FIT_WEIGHTS}.bkp"):
            path = self.directory / name
            try:
                keep = self.committed is not None and path.is_file() and _sha256(path) == self.committed
            except OSError:
                keep = False
            if not keep:
                remove_quietly(path)

    def restore(self, state: dict[str, Any], directory: Path) -> str:
        """Load the weights ``state`` names from ``directory`` (``latest`` or ``latest.bkp``); returns the file read."""
        want = state["files"]["sha256"]
        for name in (_FIT_WEIGHTS, f"{_FIT_WEIGHTS}.bkp"):
            path = directory / name
            if path.is_file() and _sha256(path) == want:
                optimizer = self.model.optimizer
                if optimizer is not None and not optimizer.built:
                    optimizer.build(self.model.trainable_variables)
                if name == _FIT_WEIGHTS:
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
                if directory.resolve() == self.directory.resolve():
                    self.committed = want
                return str(path)
        raise OutputError(
            f"{directory}: neither {_FIT_WEIGHTS} nor its .bkp is the checkpoint {STATE_FILE} names "
            f"(epoch {state['epoch']}, step {state['step']}).",
            "the checkpoint files were changed or lost; start a new run (the run directory keeps its metrics).")


class CustomFiles:
    """The custom loop's checkpoint: ``tf.train.CheckpointManager`` of the model, optimizer, epoch and step.

    Args:
        model, optimizer: the model and the optimizer that trains it.
        directory: where this process saves.
    """

    def __init__(self, model: Any, optimizer: Any, directory: Path) -> None:
        import tensorflow as tf  # noqa: PLC0415

        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.directory = directory
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch, step=self.step)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=2)

    def save(self, epoch: int, step: int, global_step: int) -> dict[str, Any]:
        """Save as ``ckpt-<global_step>``; returns what ``state.json`` records of the files.

        A save that fails (a full disk: TensorFlow's ``ResourceExhaustedError``)
        leaves none of its files (``ckpt-<n>_temp/``, ``ckpt-<n>.*``, the
        ``checkpoint`` file's temporary copies); earlier checkpoints stay.
        """
        self.epoch.assign(epoch)
        self.step.assign(step)
        try:
            return {"checkpoint": Path(self.manager.save(checkpoint_number=global_step)).name}
        except BaseException:
            for path in [*self.directory.glob(f"ckpt-{global_step}_temp*"),
                         *self.directory.glob(f"ckpt-{global_step}.*"), *self.directory.glob("checkpoint.tmp*")]:
                remove_quietly(path)
            raise

    def restore(self, state: dict[str, Any], directory: Path) -> str:
        """Restore the checkpoint ``state`` names from ``directory``; returns its path."""
        path = directory / state["files"]["checkpoint"]
        try:
            self.checkpoint.restore(str(path)).assert_existing_objects_matched()
        except (ValueError, AssertionError) as exc:
            raise OutputError(f"{path}: the checkpoint does not fit this run's model ({exc}).",
                              "resume with the run's own config; start a new run for another model.") from None
        except Exception as exc:  # tf.errors.NotFoundError / DataLossError: files gone or damaged
            raise OutputError(f"{path}: cannot read the checkpoint {STATE_FILE} names: {type(exc).__name__}.",
                              "the checkpoint files were changed or lost; start a new run.") from None
        if (int(self.epoch.numpy()), int(self.step.numpy())) != (state["epoch"], state["step"]):
            raise OutputError(f"{path} holds epoch {int(self.epoch.numpy())} step {int(self.step.numpy())}, "
                              f"{STATE_FILE} says epoch {state['epoch']} step {state['step']}.",
                              "the checkpoint files were changed; start a new run.")
        return str(path)


class StopSignals:
    """While active, SIGTERM and the requeue signal only set :attr:`received` (their handlers are put back after).

    The training callback reads it at the next call boundary, saves and stops
    (:class:`~tfgpu.errors.Preempted`). Used as a context manager; signal
    handlers can only be set in the main thread (elsewhere this does nothing).

    Args:
        requeue_signal: ``train.checkpoint.requeue_signal`` (e.g. ``"SIGUSR1"``) or ``None``.
    """

    def __init__(self, requeue_signal: Optional[str]) -> None:
        self.requeue_signal = requeue_signal
        self.received: Optional[str] = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.received is None or name == self.requeue_signal:
            self.received = name

    def __enter__(self) -> "StopSignals":
        import threading  # noqa: PLC0415

        if threading.current_thread() is threading.main_thread():
            names = ["SIGTERM"] + ([self.requeue_signal] if self.requeue_signal else [])
            for name in names:
                sig = getattr(signal, name)
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @property
    def requeue(self) -> bool:
        """The signal received is the requeue signal."""
        return self.received is not None and self.received == self.requeue_signal


def requeue(job_id: str) -> str:
    """Ask Slurm to requeue job ``job_id`` (``scontrol requeue``); returns what happened, for the message.

    This is the one place tfgpu talks to Slurm; the tests put their own
    ``scontrol`` first on ``PATH``.
    """
    command = ["scontrol", "requeue", job_id]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"'{' '.join(command)}' could not run ({exc}); requeue the job yourself"
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
    """

    write_dir: Path
    chief: bool
    steps_per_epoch: int
    epochs: int
    every_epochs: int = 1
    every_steps: Optional[int] = None
    loop: str = "fit"
    start: Position = Position()


def checkpoint_callback(files: Any, plan: SavePlan, stop: Optional[StopSignals] = None,
                        agree: Optional[Callable[[int], int]] = None,
                        on_stop: Optional[Callable[[dict[str, Any]], str]] = None) -> Any:
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

    Its ``saves`` attribute lists the seconds each save took.

    Raises (from the training loop):
        Preempted: a stop signal arrived; the checkpoint was saved first.
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
            self._check_stop(self.epoch, step)

        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            due = self.next_steps is not None and (epoch + 1) * steps_per_epoch >= self.next_steps
            if (epoch + 1) % every_epochs == 0 or epoch + 1 == epochs or due:
                self._save(epoch + 1, 0, "epoch")
            if epoch + 1 < epochs:
                self._check_stop(epoch + 1, 0)

        def _save(self, epoch: int, step: int, reason: str) -> dict[str, Any]:
            global_step = epoch * steps_per_epoch + step
            began = time.perf_counter()
            state = {"loop": loop, "epoch": epoch, "step": step, "global_step": global_step,
                     "steps_per_epoch": steps_per_epoch, "reason": reason,
                     "files": files.save(epoch, step, global_step)}
            seconds = time.perf_counter() - began
            state.update(saved_at=time.time(), save_seconds=seconds)
            if chief:
                write_json(write_dir / STATE_FILE, state)  # the commit: only now is this save the one to restore
            self.saves.append(seconds)
            self.last_state = state
            self.saved_at = global_step
            self.next_steps = self._next(global_step)
            return state

        def _check_stop(self, epoch: int, step: int) -> None:
            if stop is None:
                return
            code = 0 if stop.received is None else 2 if stop.requeue else 1
            if agree is not None:
                code = agree(code)
            if not code:
                return
            global_step = epoch * steps_per_epoch + step
            state = self.last_state
            if state is None or state["global_step"] != global_step:
                state = self._save(epoch, step, "preempted")
            said = on_stop(state) if (chief and on_stop is not None and code == 2) else ""
            what = stop.received or "a stop signal (on another worker)"
            raise Preempted(
                f"{what} arrived: stopped at epoch {epoch + 1} step {step} (global step {global_step}) with a "
                f"checkpoint" + (f"; {said}" if said else "") + ".")  # tfgpu.runner adds the resume command

    return Checkpointer()
