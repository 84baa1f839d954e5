"""The two training loops (``fit`` and ``custom``) and what they share."""

from __future__ import annotations

import sys
import time
from typing import Any, Optional


def progress_mode(setting: str) -> str:
    """``train.progress`` -> ``"bar"``, ``"epoch"`` or ``"none"`` (``auto``: a bar on a terminal)."""
    if setting == "auto":
        return "bar" if sys.stdout.isatty() else "epoch"
    return setting


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
