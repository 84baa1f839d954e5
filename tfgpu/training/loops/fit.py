"""``train.loop: fit``: ``keras.Model.fit`` under the strategy's scope."""

from __future__ import annotations

import re
import sys
import time
from typing import Any, Optional

from ...utils.console import warn
from . import Job, check_loss, keep_iterators, progress_callback
from .custom import MAX_CALL_SECONDS

VERBOSE = {"bar": 1, "epoch": 2, "none": 0}


def train_fit(job: Job, callbacks: list, progress: str, start: tuple[int, int] = (0, 0),
              max_call_seconds: float = MAX_CALL_SECONDS) -> None:
    """Train a compiled model with ``model.fit``, from the start or from a checkpoint's position.

    Args:
        job: the model and its data (:class:`~tfgpu.training.loops.Job`). fit reads one
            dataset of all the epochs (``job.train_epochs``) with
            ``steps_per_epoch``, so Keras keeps one iterator for the whole run
            instead of building a distributed iterator every epoch (0.1-0.4 s
            each with MirroredStrategy on 2 CPU cores, measured); Keras splits
            each global batch across the replicas.
        callbacks: Keras callbacks (CSVLogger with ``append=True``: a resumed
            run calls fit twice).
        progress: ``"bar"``, ``"epoch"`` or ``"none"`` (:func:`~tfgpu.training.loops.progress_callback` prints the
            epoch lines: :func:`~tfgpu.training.loops.epoch_line`, timing figures rounded).
        start: ``(epoch, step)`` to start from, both counted from 0: epochs
            before ``epoch`` and the first ``step`` steps of it are done (a
            checkpoint's position). fit cannot start inside an epoch, so the
            rest of that epoch is one fit call of ``steps_per_epoch - step``
            steps (its training metrics cover those steps), the later epochs another.
        max_call_seconds: a warning (once) when a training call takes longer
            (:func:`call_timer`); fit cannot shorten its calls.

    Raises:
        TrainingError: the loss became NaN or infinite (with ``job.terminate_on_nan``:
            ``keras.callbacks.TerminateOnNaN``).

    Wraps: https://keras.io/api/models/model_training_apis/#fit-method
    """
    kept: list = []
    callbacks = [call_timer(max_call_seconds), iterator_keeper(kept), *callbacks]  # before the checkpoint's batch end
    at = [start[0]]  # the epoch being trained, for the NaN message
    if job.terminate_on_nan:
        import keras  # noqa: PLC0415

        # First, and raising: a graceful stop would still run the later callbacks' epoch end, whose
        # checkpoint save would commit the NaN weights as the position to resume from.
        callbacks = [keras.callbacks.TerminateOnNaN(raise_error=True),
                     keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: at.__setitem__(0, e)), *callbacks]
    if progress != "none":  # last: it prints what the callbacks before it (epoch statistics) put in the logs
        callbacks = [*callbacks, progress_callback()]
    epochs, steps_per_epoch = job.epochs, job.steps_per_epoch
    epoch, step = start
    calls = []
    if step:
        calls.append((epoch, epoch + 1, steps_per_epoch - step, epoch * steps_per_epoch + step))
        epoch += 1
    if epoch < epochs:
        calls.append((epoch, epochs, steps_per_epoch, epoch * steps_per_epoch))
    for first, end, steps, skip in calls:
        # The dataset is shuffled by tf.data, so fit must not try to shuffle it.
        try:
            job.model.fit(job.train_epochs(epochs, skip), validation_data=job.validation, initial_epoch=first,
                          epochs=end, steps_per_epoch=steps, callbacks=callbacks, verbose=VERBOSE[progress],
                          shuffle=False)
            if job.model.stop_training:  # a callback (EarlyStopping) ended the run: no later fit call
                break
        except RuntimeError as exc:
            found = re.match(r"NaN or Inf loss encountered at batch \d+\. Loss value: (\S+)\.", str(exc))
            if found is None:
                raise
            check_loss(float(found.group(1)), at[0] + 1, " (keras.callbacks.TerminateOnNaN); the last "
                       "checkpoint before it is kept")
            raise
        finally:
            keep_iterators(kept)  # released when fit returns, the training iterator could pause for seconds


def call_timer(bound: float = MAX_CALL_SECONDS) -> Any:
    """A Keras callback that warns once when one of ``fit``'s training calls takes longer than ``bound`` seconds.

    Stop signals, ``every_steps`` saves and ``progress.json`` wait for the call
    to end. fit cannot shorten its calls as the custom loop does: Keras fixes the
    steps per call when the model is compiled (``steps_per_execution`` is traced
    into its ``tf.while_loop``, and the epoch's calls are counted with it), so
    tfgpu bounds them when it plans (:func:`tfgpu.training.trainer.resolve_steps_per_execution`)
    and says here what to change. A call is timed from ``on_train_batch_begin``
    to ``on_train_batch_end``, after which Keras has read the call's logs on the
    host; the first call, which traces the function, is not counted.

    Wraps: https://keras.io/api/callbacks/base_callback/
    """
    import keras  # noqa: PLC0415

    class CallTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.began: Optional[float] = None
            self.calls = 0
            self.told = False

        def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
            self.began = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
            self.calls += 1
            seconds = time.perf_counter() - (self.began or time.perf_counter())
            if self.calls > 1 and seconds > bound and not self.told:
                self.told = True
                warn(f"a training call of {self.model.steps_per_execution} steps took {seconds:.1f} s, more than "
                     f"{bound:g} s (stop signals and checkpoints wait for the call to end); loop: fit cannot "
                     "shorten its calls: lower train.steps_per_execution, or use train.loop: custom, which does")

    return CallTimer()


def iterator_keeper(kept: list) -> Any:
    """A Keras callback that appends each ``fit`` call's training iterator (Keras's ``TFEpochIterator``) to ``kept``.

    ``fit`` makes its training iterator a local variable and drops it when it returns; under MirroredStrategy
    that destruction can pause the process for seconds (:func:`tfgpu.training.loops.keep_iterators`, which
    ``train_fit`` hands ``kept`` to). Keras gives callbacks no handle on it, so ``on_train_begin`` reads it from
    the frame of Keras's ``fit`` (``keras.src.backend.tensorflow.trainer``), the caller a few frames up; in a
    Keras that names it otherwise nothing is kept and only the pause comes back.

    Wraps: https://keras.io/api/callbacks/base_callback/
    """
    import keras  # noqa: PLC0415

    class IteratorKeeper(keras.callbacks.Callback):
        def on_train_begin(self, logs: Optional[dict] = None) -> None:
            frame = sys._getframe(1)
            for _ in range(8):
                if frame is None:
                    return
                if frame.f_code.co_name == "fit" and frame.f_globals.get("__name__", "").startswith("keras."):
                    found = frame.f_locals.get("epoch_iterator")
                    if found is not None:
                        kept.append(found)
                    return
                frame = frame.f_back

    return IteratorKeeper()
