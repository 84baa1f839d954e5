"""The benchmark's only instrument in the plain scripts: time stamps, no tensor reads.

A plain script calls :func:`report` once at the end; the harness (``run.py``)
passes the file to write in ``BENCH_RESULT``. Nothing here synchronises with
the device or changes what the script computes.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Optional


class Clock:
    """Epoch and first-step time stamps (``time.perf_counter`` seconds; ``first_step_at`` is Unix time)."""

    def __init__(self) -> None:
        self.first_step_at: Optional[float] = None
        self.train_seconds: list[float] = []
        self._epoch_start = 0.0

    def epoch_begin(self) -> None:
        self._epoch_start = time.perf_counter()

    def step_end(self) -> None:
        if self.first_step_at is None:
            self.first_step_at = time.time()

    def train_end(self) -> None:
        self.train_seconds.append(time.perf_counter() - self._epoch_start)


def keras_callback(clock: Clock) -> Any:
    """The same stamps from ``model.fit``: epoch start, first batch end, validation start."""
    import keras  # noqa: PLC0415

    class Stamps(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self._in_train = False

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            clock.epoch_begin()
            self._in_train = True

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            clock.step_end()

        def on_test_begin(self, logs: Any = None) -> None:
            if self._in_train:
                clock.train_end()
                self._in_train = False

    return Stamps()


def report(clock: Clock, samples: int, val_accuracy: Optional[float], **extra: Any) -> None:
    """Write the run's figures to ``$BENCH_RESULT`` (JSON): steady samples/s = median over epochs after the first,
    best = the fastest of them (``run.py``: the floor targets are stated on it)."""
    steady = clock.train_seconds[1:] or clock.train_seconds
    result = {
        "first_step_at": clock.first_step_at,
        "train_seconds": clock.train_seconds,
        "samples_per_second": statistics.median(samples / s for s in steady) if steady else None,
        "best_samples_per_second": max(samples / s for s in steady) if steady else None,
        "val_accuracy": None if val_accuracy is None else float(val_accuracy),
        **extra,
    }
    path = os.environ.get("BENCH_RESULT")
    if path:
        with open(path, "w") as f:
            json.dump(result, f)
