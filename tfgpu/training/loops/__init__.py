"""The two training loops (``fit`` and ``custom``) and what they share."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ...errors import TrainingError


@dataclass(frozen=True)
class Job:
    """What a training loop runs, as plain data (:meth:`tfgpu.training.trainer.Trainer.job` makes it).

    Attributes:
        model: a ``keras.Model`` built and compiled in the strategy's scope,
            mapping float32 ``(batch, ...)`` inputs to predictions.
        train_epochs: ``(epochs, skip) -> dataset`` of global batches ``(x, y)``
            (:attr:`tfgpu.data.pipeline.Pipelines.train_epochs`).
        validation: a finite dataset of global batches, read once per epoch, or ``None``.
        epochs: passes over the training set.
        steps_per_epoch: batches in one pass (on JAX's ``fit``, a multiple of the model's ``steps_per_execution``).
        validation_steps: batches in ``validation``.
        strategy: the ``tf.distribute.Strategy`` (the custom loop).
        optimizer: the optimizer (the custom loop; a ``LossScaleOptimizer`` under ``mixed_float16``).
        loss: a per-example ``keras.losses.Loss`` (``reduction=None``; the custom loop).
        metrics, val_metrics: Keras metrics for training and validation (the custom loop).
        steps_per_execution: the most training steps per ``tf.function`` call (the custom loop; ``fit``'s is compiled in).
        jit_compile: compile each replica's step with XLA (the custom loop).
        terminate_on_nan: stop when the loss becomes NaN or infinite.
        global_batch: rows in a global batch (0: unknown; the loops then read batch by batch).
        train_blocks: ``train_epochs`` also takes ``block`` (:attr:`tfgpu.data.pipeline.Pipelines.train_blocks`):
            with a plain feed the loops then read a call's batches as one block
            (:class:`tfgpu.training.loops.replica_batches.Blocks`).
        accumulation: micro-batches per optimizer step (``train.gradient_accumulation_steps``): each step's
            batch holds ``accumulation`` global batches (:mod:`tfgpu.training.loops.gradients`).
        forward: the training forward pass ``x -> predictions`` in checkpointed segments (``model.remat``:
            :class:`tfgpu.training.loops.remat.Segments`), or ``None``: ``model(x, training=True)``.
        feed: how the batches reach the replicas (:class:`tfgpu.training.loops.replica_batches.Feed`);
            ``None``: the way :meth:`~tfgpu.training.loops.replica_batches.Feed.of` chooses for the strategy
            (``benchmarks/loop_overhead.py`` sets the other, to measure what it costs).
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
    global_batch: int = 0
    train_blocks: bool = False
    feed: Any = None
    accumulation: int = 1
    forward: Any = None


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


#: The last run's distributed iterators, kept alive on purpose (:func:`keep_iterators`).
LAST_RUN_ITERATORS: list = []


def keep_iterators(iterators: list) -> None:
    """Keep ``iterators`` (the run's distributed iterators) alive until the next run in this process ends, or
    until exit: the last run's are released now.

    Destroying a MirroredStrategy iterator that has trained for a while waits for tf.data's autotuning thread of
    its per-device datasets to wake from a timed wait that doubles up to 60 s (gdb: ``~RootDataset::Iterator``
    -> ``Model::OptimizeLoop``; the per-device datasets that ``MultiDeviceIterator`` makes do not take the input
    pipeline's options, so tfgpu cannot turn their autotuner off). At the end of ``fit`` that paused the process
    1.3-4.8 s in 4 runs of 10 (the seed recipe, 2 replicas, 128 per replica, 2 epochs, 2 cores), and in 0 of 16
    with the training iterator kept; a validation iterator, made again every epoch, is released without a pause.
    At exit no pause was seen.
    """
    LAST_RUN_ITERATORS[:] = list(iterators)


def progress_mode(setting: str) -> str:
    """``train.progress`` -> ``"bar"``, ``"epoch"`` or ``"none"`` (``auto``: a bar on a terminal)."""
    if setting == "auto":
        return "bar" if sys.stdout.isatty() else "epoch"
    return setting


#: What :func:`epoch_stats_callback` adds to each epoch's logs (and metrics.csv), in the order the epoch line shows.
EPOCH_STATS = ("epoch_seconds", "train_seconds", "samples_per_second")
#: What :class:`tfgpu.training.telemetry.Telemetry` adds (:data:`tfgpu.training.telemetry.COLUMNS`), shown last.
TELEMETRY = ("input_wait_seconds", "input_wait_percent", "mfu_percent", "host_cpu_percent", "host_rss_mib",
             "gpu_utilization_percent", "gpu_memory_peak_mib", "gpu_power_w", "gpu_temperature_c")
#: What :class:`tfgpu.training.loops.gradients.GradientStep` adds: the global gradient norm (mean and max).
GRADIENTS = ("gradient_norm", "gradient_norm_max")
#: The logs that are not the model's figures: shown in their own form, after the metrics.
NOT_METRICS = (*EPOCH_STATS, *TELEMETRY, *GRADIENTS)


def _seconds(value: float) -> str:
    """Seconds for the eye, 2-3 significant digits: ``0.0507`` -> ``0.051``, ``0.1316`` -> ``0.132``, ``4.4076`` ->
    ``4.41``, ``61.57`` -> ``61.6``, ``312.4`` -> ``312``."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def _telemetry_items(logs: dict[str, float]) -> list[str]:
    """The :data:`TELEMETRY` figures in short form: ``input wait: 3% - MFU: 12.3% - CPU: 95% - GPU: 87% 11.8 GiB
    312 W 71 C``."""
    items = []
    if "gradient_norm" in logs:
        items.append(f"grad norm: {float(logs['gradient_norm']):.3g}"
                     + (f" (max {float(logs['gradient_norm_max']):.3g})" if "gradient_norm_max" in logs else ""))
    if "input_wait_percent" in logs:
        items.append(f"input wait: {float(logs['input_wait_percent']):.0f}%")
    if "mfu_percent" in logs:
        items.append(f"MFU: {float(logs['mfu_percent']):.3g}%")
    if "host_cpu_percent" in logs:
        items.append(f"CPU: {float(logs['host_cpu_percent']):.0f}%")
    if "gpu_utilization_percent" in logs:
        gpu = [f"{float(logs['gpu_utilization_percent']):.0f}%"]
        if "gpu_memory_peak_mib" in logs:
            gpu.append(f"{float(logs['gpu_memory_peak_mib']) / 1024:.1f} GiB")
        if "gpu_power_w" in logs:
            gpu.append(f"{float(logs['gpu_power_w']):.0f} W")
        if "gpu_temperature_c" in logs:
            gpu.append(f"{float(logs['gpu_temperature_c']):.0f} C")
        items.append("GPU: " + " ".join(gpu))
    return items


def format_epoch(logs: dict[str, float]) -> str:
    """One epoch's logs as the console shows them: ``loss: 0.3012 - accuracy: 0.9100 - ... - epoch_seconds: 4.41 -
    train_seconds: 3.66 - samples_per_second: 6199 - input wait: 2% - MFU: 4.1% - CPU: 96%``.

    Metrics keep Keras's own format (4 decimals; ``.4e`` below 0.001, as ``keras.utils.Progbar``); the timing
    figures of :data:`EPOCH_STATS` are rounded for reading (seconds to 2-3 significant digits, samples/s to a
    whole number) and come next, then the :data:`TELEMETRY` figures in short form (:func:`_telemetry_items`).
    Display only: ``metrics.csv`` and ``summary.json`` keep the full values.

    Args:
        logs: an epoch's logs (metric name -> float), e.g. as Keras passes them to ``on_epoch_end``.

    Returns:
        The ``" - "``-joined ``name: value`` items.
    """
    items = [f"{k}: {v:.4f}" if v == 0 or abs(v) >= 1e-3 else f"{k}: {v:.4e}"
             for k, v in ((k, float(v)) for k, v in logs.items() if k not in NOT_METRICS)]
    for key in EPOCH_STATS:
        if key in logs:
            value = float(logs[key])
            items.append(f"{key}: {value:.0f}" if key == "samples_per_second" else f"{key}: {_seconds(value)}")
    return " - ".join(items + _telemetry_items(logs))


def epoch_stats(callbacks: list, epoch: int) -> dict[str, float]:
    """The :data:`EPOCH_STATS` figures (and ``learning_rate``, which a callback before it adds) that
    :func:`epoch_stats_callback` (among ``callbacks``) recorded for ``epoch`` (from 0), or ``{}``:
    ``keras.callbacks.CallbackList`` hands the callbacks a copy of the logs, so a loop that prints them reads
    the figures back here."""
    for callback in callbacks:
        record = getattr(callback, "epochs", None)
        if isinstance(record, Epochs) and record.rows and record.rows[-1].get("epoch") == epoch:
            return {k: record.rows[-1][k] for k in ("learning_rate", *NOT_METRICS) if k in record.rows[-1]}
    return {}


def epoch_line(epoch: int, epochs: int, logs: dict[str, float]) -> str:
    """``Epoch 3/10 - <format_epoch(logs)>``: the line each loop prints per epoch with ``train.progress: epoch``.

    Args:
        epoch: counted from 0 (as Keras's callbacks count); epochs: the run's total.
    """
    return f"Epoch {epoch + 1}/{epochs} - {format_epoch(logs)}"


def progress_callback(epochs: int) -> Any:
    """``fit``'s console output: a ``keras.callbacks.ProgbarLogger`` whose epoch line is :func:`epoch_line`.

    With ``verbose=2`` (``train.progress: epoch``) it prints one :func:`epoch_line` per epoch, as the custom loop
    does; with ``verbose=1`` (``bar``) it draws Keras's progress bar and ends it with the metrics, leaving out the
    timing figures of :data:`EPOCH_STATS` (Keras would print them with 4 decimals; the bar shows the time). Given
    to ``fit`` among the callbacks, it replaces the one Keras adds, and it must come after
    :func:`epoch_stats_callback` (whose figures it prints). ``epochs``: the run's total, shown as ``Epoch N/epochs``
    also in a resumed epoch's remainder, which ``fit`` trains as a call of its own with fewer epochs.

    Wraps: https://keras.io/api/callbacks/progbar_logger/
    """
    import keras  # noqa: PLC0415

    class EpochProgress(keras.callbacks.ProgbarLogger):
        def set_params(self, params: dict) -> None:
            super().set_params(params)
            self.epochs = epochs  # Keras's bar header too: the run's total, not the call's

        def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
            if self.verbose == 1:
                super().on_epoch_begin(epoch, logs)
            else:
                self._reset_progbar()

        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            logs = logs or {}
            if self.verbose == 1:
                self._finalize_progbar({k: v for k, v in logs.items() if k not in NOT_METRICS})
            elif self.verbose:
                print(epoch_line(epoch, self.epochs, logs), flush=True)

    return EpochProgress()


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


def measure_input_wait(callbacks: list, function: Any) -> None:
    """Hand the run's :class:`~tfgpu.training.telemetry.Telemetry` (the ``telemetry`` of a callback among
    ``callbacks``) the cumulative input wait of ``function``, a training function of
    :func:`~tfgpu.training.loops.replica_batches.steps_function` (its ``input_wait`` variable)."""
    variable = getattr(function, "input_wait", None)
    for callback in callbacks:
        telemetry = getattr(callback, "telemetry", None)
        if telemetry is not None and variable is not None:
            telemetry.input_wait = lambda: float(variable.numpy())


def epoch_stats_callback(samples_per_epoch: int, epochs: Optional[Epochs] = None, telemetry: Any = None) -> Any:
    """A Keras callback that times each epoch and the first training step.

    It adds to each epoch's logs ``epoch_seconds`` (the whole epoch, validation
    included), ``train_seconds`` (from the epoch's start to the start of its
    validation) and ``samples_per_second`` (training samples / ``train_seconds``).
    Place it before ``keras.callbacks.CSVLogger`` so the CSV gets the columns.
    It appends every epoch's logs (plain floats) to ``epochs.rows`` and sets
    ``epochs.first_step_at`` to the ``time.perf_counter()`` at which the first
    training call (``steps_per_execution`` steps) returned; its ``rows`` and
    ``first_step_at`` attributes read them.

    With ``telemetry`` (:class:`tfgpu.training.telemetry.Telemetry`) it adds that epoch's device statistics,
    input wait and MFU too (:data:`TELEMETRY`), before the row is kept.

    Without ``telemetry`` it reads no tensor, so it adds no host synchronisation; the input wait is one read of a
    host variable at each epoch's start and end.

    Wraps: https://keras.io/api/callbacks/base_callback/
    """
    import keras  # noqa: PLC0415

    record = epochs if epochs is not None else Epochs()

    class EpochStats(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.epochs = record
            self.telemetry = telemetry
            self._start: Optional[float] = None
            self._train_end: Optional[float] = None

        @property
        def rows(self) -> list[dict[str, float]]:
            return self.epochs.rows

        @property
        def first_step_at(self) -> Optional[float]:
            return self.epochs.first_step_at

        def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
            if self.telemetry is not None:
                self.telemetry.begin_epoch()
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
                if self.telemetry is not None:
                    self.telemetry.end_epoch(epoch, logs, train, samples_per_epoch)
                row = {"epoch": epoch}  # counted from 0, as in metrics.csv (keras.callbacks.CSVLogger)
                row.update({k: float(v) for k, v in logs.items()})
                self.epochs.rows.append(row)
            self._start = None

    return EpochStats()
