"""The two training loops (``fit`` and ``custom``) and what they share."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import TrainingError


@dataclass(frozen=True)
class Job:
    """What a training loop runs, as plain data (:meth:`tfgpu.trainer.Trainer.job` makes it).

    Attributes:
        model: a ``keras.Model`` built and compiled in the strategy's scope,
            mapping float32 ``(batch, ...)`` inputs to predictions.
        train_epochs: ``(epochs, skip) -> dataset`` of global batches ``(x, y)``
            (:attr:`tfgpu.data.pipeline.Pipelines.train_epochs`).
        validation: a finite dataset of global batches, read once per epoch, or ``None``.
        epochs: passes over the training set.
        steps_per_epoch: batches in one pass (a multiple of the model's ``steps_per_execution``).
        validation_steps: batches in ``validation``.
        strategy: the ``tf.distribute.Strategy`` (the custom loop).
        optimizer: the optimizer (the custom loop; a ``LossScaleOptimizer`` under ``mixed_float16``).
        loss: a per-example ``keras.losses.Loss`` (``reduction=None``; the custom loop).
        metrics, val_metrics: Keras metrics for training and validation (the custom loop).
        steps_per_execution: training steps per ``tf.function`` call (the custom loop; ``fit``'s is compiled in).
        jit_compile: compile each replica's step with XLA (the custom loop).
        terminate_on_nan: stop when the loss becomes NaN or infinite.
    """

    model: Any
    train_epochs: Callable[[int, int], Any]
    validation: Any
    epochs: int
    steps_per_epoch: int
    validation_steps: int = 0
    strategy: Any = None
    optimizer: Any = None
    loss: Any = None
    metrics: list = field(default_factory=list)
    val_metrics: list = field(default_factory=list)
    steps_per_execution: int = 1
    jit_compile: bool = False
    terminate_on_nan: bool = True


@dataclass
class Epochs:
    """The epochs a run has finished, shared by the epoch-statistics callback and the run directory.

    Attributes:
        rows: each finished epoch's logs as plain floats, ``epoch`` counted from 0
            (a resumed run starts with the rows of the epochs its checkpoint holds).
        first_step_at: ``time.perf_counter()`` when the first training call returned, else ``None``.
    """

    rows: list[dict[str, float]] = field(default_factory=list)
    first_step_at: Optional[float] = None


def progress_mode(setting: str) -> str:
    """``train.progress`` -> ``"bar"``, ``"epoch"`` or ``"none"`` (``auto``: a bar on a terminal)."""
    if setting == "auto":
        return "bar" if sys.stdout.isatty() else "epoch"
    return setting


def check_loss(loss: float, epoch: int, how: str = "") -> None:
    """Raise :class:`TrainingError` when an epoch's training loss is NaN or infinite (``train.terminate_on_nan``).

    Args:
        loss: the epoch's mean training loss; epoch: counted from 1; how: what stopped it, for the message.
    """
    if not math.isfinite(loss):
        raise TrainingError(
            f"the training loss became {loss} in epoch {epoch}; training stopped{how}.",
            "lower the learning rate, check the data for bad values, or use float32.",
        )


def epoch_stats_callback(samples_per_epoch: int, epochs: Optional[Epochs] = None) -> Any:
    """A Keras callback that times each epoch and the first training step.

    It adds to each epoch's logs ``epoch_seconds`` (the whole epoch, validation
    included), ``train_seconds`` (from the epoch's start to the start of its
    validation) and ``samples_per_second`` (training samples / ``train_seconds``).
    Place it before ``keras.callbacks.CSVLogger`` so the CSV gets the columns.
    It appends every epoch's logs (plain floats) to ``epochs.rows`` and sets
    ``epochs.first_step_at`` to the ``time.perf_counter()`` at which the first
    training call (``steps_per_execution`` steps) returned; its ``rows`` and
    ``first_step_at`` attributes read them.

    It reads no tensor, so it adds no host synchronisation.

    Wraps: https://keras.io/api/callbacks/base_callback/
    """
    import keras  # noqa: PLC0415

    record = epochs if epochs is not None else Epochs()

    class EpochStats(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.epochs = record
            self._start: Optional[float] = None
            self._train_end: Optional[float] = None

        @property
        def rows(self) -> list[dict[str, float]]:
            return self.epochs.rows

        @property
        def first_step_at(self) -> Optional[float]:
            return self.epochs.first_step_at

        def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
            self._start = time.perf_counter()
            self._train_end = None

        def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
            if self.epochs.first_step_at is None:
                self.epochs.first_step_at = time.perf_counter()

        def on_test_begin(self, logs: Optional[dict] = None) -> None:
            if self._start is not None and self._train_end is None:
                self._train_end = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            now = time.perf_counter()
            start = self._start if self._start is not None else now
            train = (self._train_end or now) - start
            if logs is not None:
                logs["epoch_seconds"] = now - start
                logs["train_seconds"] = train
                logs["samples_per_second"] = samples_per_epoch / train if train > 0 else 0.0
                row = {"epoch": epoch}  # counted from 0, as in metrics.csv (keras.callbacks.CSVLogger)
                row.update({k: float(v) for k, v in logs.items()})
                self.epochs.rows.append(row)
            self._start = None

    return EpochStats()
