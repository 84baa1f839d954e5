"""The two training loops (``fit`` and ``custom``) and what they share."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Optional

from ..errors import TrainingError


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


def epoch_stats_callback(samples_per_epoch: int) -> Any:
    """A Keras callback that adds ``epoch_seconds`` and ``samples_per_second`` to each epoch's logs.

    Place it before ``keras.callbacks.CSVLogger`` so the CSV gets both columns.
    Its ``rows`` attribute holds every epoch's logs (plain floats).
    """
    import keras  # noqa: PLC0415

    class EpochStats(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[dict[str, float]] = []
            self._start: Optional[float] = None

        def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            seconds = time.perf_counter() - (self._start or time.perf_counter())
            if logs is not None:
                logs["epoch_seconds"] = seconds
                logs["samples_per_second"] = samples_per_epoch / seconds if seconds > 0 else 0.0
                row = {"epoch": epoch}  # counted from 0, as in metrics.csv (keras.callbacks.CSVLogger)
                row.update({k: float(v) for k, v in logs.items()})
                self.rows.append(row)

    return EpochStats()
