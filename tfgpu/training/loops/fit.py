"""``train.loop: fit``: ``keras.Model.fit`` under the strategy's scope.

Call length (TensorFlow backend): Keras runs an epoch of ``steps`` steps as
``ceil(steps / n)`` training calls of ``n = steps_per_execution`` steps, each
a ``tf.while_loop`` that stops only when the input runs out (Keras 3.15.1
``keras/src/trainers/epoch_iterator.py``, ``keras/src/backend/tensorflow/trainer.py``).
tfgpu gives ``fit`` one dataset of all the epochs, so a last call of ``n``
steps would run into the next epoch; instead, while ``fit`` runs, the model's
``train_function`` is tfgpu's (:func:`bounded_function`): the same
``train_step`` on every replica, ``k`` steps a call with ``k`` a tensor, so an
epoch's last call runs the steps left (:func:`fit_calls`) without a second
trace. ``n`` no longer has to divide the epoch (it once did: 178 steps gave
calls of 2, a prime count calls of 1). Keras's callbacks, logs, history and
``stop_training`` are Keras's own; validation is run by tfgpu (below).

Input: that train function reads its batches the way :mod:`tfgpu.training.loops.replica_batches`
chooses; on CPU replicas a plain iterator of tfgpu's (for a split held in memory, a call's
batches as one block: :class:`~tfgpu.training.loops.replica_batches.Blocks`), and Keras's own
iterator then only feeds what ``fit`` reads before training (one batch, to
build its metrics), from a one-batch stand-in. Validation: tfgpu runs the
model's ``test_step`` at each epoch's end from one iterator for the whole
``fit`` call, with Keras's callback hooks (:func:`epoch_calls`), instead of
``fit``'s ``evaluate``, which makes two distributed iterators every epoch.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

from ...utils.console import warn
from ...utils.files import note_file
from . import Job, check_loss, keep_iterators, measure_input_wait, progress_callback
from . import gradients
from .custom import MAX_CALL_SECONDS
from .gradients import GradientStep
from .replica_batches import Blocks, Feed, steps_function

VERBOSE = {"bar": 1, "epoch": 2, "none": 0}


def fit_calls(steps: int, per_call: int) -> list[int]:
    """The steps each of ``fit``'s training calls runs in an epoch of ``steps`` steps, in order.

    Keras starts a call at steps ``0, per_call, 2 * per_call, ...`` of the epoch
    (``ceil(steps / per_call)`` calls); tfgpu's train function runs
    ``min(per_call, steps - start)`` steps in each (:func:`bounded_function`).
    E.g. ``fit_calls(178, 32)`` is ``[32, 32, 32, 32, 32, 18]``; the sum is always ``steps``.

    Raises:
        ValueError: ``steps`` or ``per_call`` below 1.
    """
    if steps < 1 or per_call < 1:
        raise ValueError(f"steps ({steps}) and per_call ({per_call}) must be at least 1")
    return [min(per_call, steps - begin) for begin in range(0, steps, per_call)]


def bounded_function(model: Any, feed: Feed, step_fn: Any, blocks: Optional[Blocks] = None) -> Any:
    """``(source, steps) -> logs``: ``steps`` (an int32 tensor) steps of ``step_fn`` in one call, on the batches of
    ``source``: an iterator, or with ``blocks`` a :class:`~tfgpu.training.loops.replica_batches.Blocks` like it
    (:func:`~tfgpu.training.loops.replica_batches.steps_function`).

    ``step_fn`` is the model's own ``train_step`` or ``test_step`` (so a model
    that overrides them trains and validates its way), run on every replica
    with ``strategy.run``, on the batch ``feed`` gives each replica
    (:meth:`~tfgpu.training.loops.replica_batches.Feed.args`); the logs are the last
    step's, each value the mean over the replicas, as Keras's own train and test
    functions reduce them (``reduction="auto"``). The step is one
    ``tf.function`` (XLA when the model is compiled with ``jit_compile``), called
    from a ``tf.range`` loop in another, so a call of any length is one trace.
    Not for ``MultiWorkerMirroredStrategy`` (tfgpu's ``fit`` runs one step a
    call there, with Keras's own functions).

    Wraps: https://keras.io/api/models/model_training_apis/#fit-method and
    https://www.tensorflow.org/api_docs/python/tf/distribute/Strategy#run
    """
    import tensorflow as tf  # noqa: PLC0415

    strategy = model.distribute_strategy

    def mean_over_replicas(value: Any) -> Any:
        if isinstance(value, tf.distribute.DistributedValues):
            return tf.reduce_mean(tf.stack(strategy.experimental_local_results(value)), axis=0)
        return value

    @tf.autograph.experimental.do_not_convert
    def one_step(data: Any) -> Any:
        outputs = strategy.run(step_fn, args=(feed.args(data),))
        return tf.nest.map_structure(mean_over_replicas, outputs)

    return steps_function(tf.function(one_step, reduce_retracing=True, jit_compile=bool(model.jit_compile)), blocks)


@dataclass(frozen=True)
class Calls:
    """``fit``'s training calls for one ``fit`` call (:func:`epoch_calls`).

    Attributes:
        several: ``(source, steps) -> logs`` of the model's ``train_step`` (:func:`bounded_function`).
        steps: steps in each epoch of the ``fit`` call.
        source: an iterator of tfgpu's, or its :class:`~tfgpu.training.loops.replica_batches.Blocks`, to train
            from; ``None``: the iterator Keras passes.
    """

    several: Any
    steps: int
    source: Any = None


@dataclass(frozen=True)
class Validation:
    """``fit``'s validation pass, run by tfgpu at each epoch's end (:func:`epoch_calls`).

    Attributes:
        several: ``(iterator, steps) -> logs`` of the model's ``test_step`` (:func:`bounded_function`).
        batches: one iterator over the validation set repeated once per epoch of the ``fit`` call.
        steps: batches in one pass.
    """

    several: Any
    batches: Any
    steps: int


def epoch_calls(model: Any, calls: Calls, callbacks: list, validation: Optional[Validation] = None,
                **params: Any) -> Any:
    """The ``keras.callbacks.CallbackList`` for one ``fit`` call whose training calls never cross an epoch.

    It records the step each training call starts at (``on_train_batch_begin``,
    which Keras calls just before the call) so that ``model.train_function``,
    set here, runs ``calls.several`` (:func:`bounded_function` of ``train_step``)
    for ``min(model.steps_per_execution, calls.steps - start)`` steps
    (:func:`fit_calls`) on ``calls.source`` (``None``: the iterator Keras passes), and
    it hands the callbacks the call's true last step (Keras names
    ``start + steps_per_execution - 1``, past the epoch's end for a short call).

    With ``validation`` (``fit`` is then given no validation data), each epoch's
    end first validates as Keras's ``fit`` would (Keras 3.15.1
    ``TensorFlowTrainer.evaluate``): the metrics reset, ``on_test_begin``, calls
    of at most ``steps_per_execution`` steps with their ``on_test_batch_begin``/
    ``_end``, ``on_test_end`` with the logs, and the logs added to the epoch's as
    ``val_<name>``; but from one iterator for the whole ``fit`` call, where
    Keras's ``evaluate`` makes two distributed iterators every epoch, the first
    to read one batch before ``on_test_begin`` (0.04-0.05 s of the seed
    recipe's 1.1 s training epoch on 2 CPU cores, counted as training time, and
    0.08-0.1 s more validation; docs/benchmarks.md).
    ``params`` are what Keras's ``fit`` gives its own list (``verbose``, ``epochs``);
    with a list given, ``fit`` uses it as it is (Keras 3.15.1).

    Wraps: https://keras.io/api/callbacks/ and https://keras.io/api/models/model_training_apis/#evaluate-method
    """
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    per_call = int(model.steps_per_execution)
    several, steps, source = calls.several, calls.steps, calls.source
    start = [0]

    def train_function(iterator: Any) -> Any:
        count = tf.constant(min(per_call, steps - start[0]), tf.int32)
        return several(iterator if source is None else source, count)

    model.train_function = train_function  # fit's make_train_function keeps a function already set

    class EpochCalls(keras.callbacks.CallbackList):
        def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
            start[0] = batch
            super().on_train_batch_begin(batch, logs)

        def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
            super().on_train_batch_end(min(batch, steps - 1), logs)

        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            if validation is not None and logs is not None:
                # in place: fit's own epoch logs (on_train_end's, after the last epoch) get the figures too
                logs.update({f"val_{k}": v for k, v in self.validate().items()})
            try:
                super().on_epoch_end(epoch, logs)
            except OSError as exc:  # CSVLogger's full disk: name metrics.csv (tfgpu.training.rundir's DiskFull)
                note_file(exc)
                raise

        def validate(self) -> dict[str, Any]:
            model.reset_metrics()  # fit read the epoch's training figures already
            model.stop_evaluating = False
            self.on_test_begin()
            logs: Any = {}
            for begin in range(0, validation.steps, per_call):
                count = min(per_call, validation.steps - begin)
                self.on_test_batch_begin(begin)
                logs = validation.several(validation.batches, tf.constant(count, tf.int32))
                self.on_test_batch_end(begin + count - 1, logs)
                if model.stop_evaluating:
                    break
            figures = model.get_metrics_result()  # Keras's choice: the metrics, unless test_step logs others
            if not isinstance(logs, dict) or set(logs) != set(figures):
                figures = logs
            figures = python_logs(figures)
            self.on_test_end(figures)
            return figures

    return EpochCalls(callbacks, add_history=True, add_progbar=params.get("verbose", 0) != 0, model=model,
                      steps=steps, **params)


def python_logs(logs: dict) -> dict[str, Any]:
    """Logs as Python values, nested dicts flattened, keys sorted (what Keras's ``evaluate`` hands ``on_test_end``):
    a tensor of one value becomes a ``float``, anything else is left as it is."""
    import keras  # noqa: PLC0415

    out: dict[str, Any] = {}
    for key, value in sorted((logs or {}).items()):
        if isinstance(value, dict):
            out.update(python_logs(value))
            continue
        try:
            out[key] = float(keras.ops.convert_to_numpy(value) if keras.ops.is_tensor(value) else value)
        except (TypeError, ValueError):
            out[key] = value
    return out


def train_fit(job: Job, callbacks: list, progress: str, start: tuple[int, int] = (0, 0),
              max_call_seconds: float = MAX_CALL_SECONDS) -> None:
    """Train a compiled model with ``model.fit``, from the start or from a checkpoint's position.

    Args:
        job: the model and its data (:class:`~tfgpu.training.loops.Job`). fit reads one
            dataset of all the epochs (``job.train_epochs``) with
            ``steps_per_epoch``, so one iterator serves the whole run
            instead of a distributed iterator built every epoch (0.1-0.4 s
            each with MirroredStrategy on 2 CPU cores, measured); each global
            batch is split across the replicas (:mod:`tfgpu.training.loops.replica_batches`).
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
    model = job.model
    step = tfgpu_step(model)
    if step is None:
        _train_fit(job, callbacks, progress, start, max_call_seconds)
        return
    # tfgpu's train_step (loops.gradients): micro-batches, one all-reduce, the gradient norm, clipping after it
    model.train_step = gradients.train_step(model, step, job.accumulation, job.forward)
    try:
        with step.attached():
            _train_fit(job, [step.callback(), *callbacks], progress, start, max_call_seconds)
    finally:
        del model.train_step  # the class's own again


def tfgpu_step(model: Any) -> Optional[GradientStep]:
    """The :class:`~tfgpu.training.loops.gradients.GradientStep` ``fit`` trains ``model`` with, made in its
    strategy's scope: on the TensorFlow backend, for a model without its own ``train_step``; else ``None``
    (Keras's own step: on JAX, or the model's)."""
    import keras  # noqa: PLC0415

    if keras.backend.backend() != "tensorflow" or gradients.overrides_train_step(model):
        return None
    return GradientStep(model.optimizer, model.distribute_strategy)


def _train_fit(job: Job, callbacks: list, progress: str, start: tuple[int, int], max_call_seconds: float) -> None:
    """:func:`train_fit` with the model's ``train_step`` set."""
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
        callbacks = [*callbacks, progress_callback(job.epochs)]
    epochs, steps_per_epoch = job.epochs, job.steps_per_epoch
    epoch, step = start
    calls = []
    if step:
        calls.append((epoch, epoch + 1, steps_per_epoch - step, epoch * steps_per_epoch + step))
        epoch += 1
    if epoch < epochs:
        calls.append((epoch, epochs, steps_per_epoch, epoch * steps_per_epoch))
    model = job.model
    # (JAX's models have no strategy)
    feed = (job.feed or Feed.of(model.distribute_strategy)) if bounded(model) else None
    several = testing = None
    for first, end, steps, skip in calls:
        data, source, validation = job.train_epochs(epochs, skip), None, None
        if feed is not None:
            if feed.plain:
                # tfgpu's train function reads a plain iterator of its own (tfgpu.training.loops.replica_batches;
                # in memory, a call's batches as one block); fit gets the first batch, cached, for what Keras
                # reads before training (one batch, to build its metrics)
                data, source = feed.training(job, epochs, skip)
                kept.append(source.iterator if isinstance(source, Blocks) else source)
                data = data.take(1).cache().repeat()
            else:
                # Keras counts steps_per_execution steps for every call, a short one too, and stops an epoch
                # early once that count reaches the dataset's length: without a known length it only counts
                # epochs. The batches after the run's last are never trained on (a prefetch may read ahead).
                data = data.repeat()
            if several is None:  # traced once for the run (a resumed run's two fit calls read alike)
                blocks = source if isinstance(source, Blocks) else None
                several = bounded_function(model, feed, model.train_step, blocks)
                measure_input_wait(callbacks, several)
                testing = bounded_function(model, feed, model.test_step) if job.validation else None
        if testing is not None:  # validated by tfgpu at each epoch's end, from one iterator (epoch_calls)
            validation = Validation(testing, feed.iterator(job.validation.repeat(end - first)), job.validation_steps)
            kept.append(validation.batches)
        # tfgpu's train function for this fit call: calls never cross an epoch (bounded); else Keras's
        given = (epoch_calls(model, Calls(several, steps, source), callbacks, validation, verbose=VERBOSE[progress],
                             epochs=end) if several is not None else callbacks)
        # The dataset is shuffled by tf.data, so fit must not try to shuffle it.
        try:
            model.fit(data, validation_data=job.validation if validation is None else None, initial_epoch=first,
                      epochs=end, steps_per_epoch=steps, callbacks=given, verbose=VERBOSE[progress], shuffle=False)
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
            if several is not None:
                model.train_function = None  # Keras makes its own again for anything after (train_on_batch)
            keep_iterators(kept)  # released when fit returns, the training iterator could pause for seconds


def bounded(model: Any) -> bool:
    """Whether ``fit`` trains ``model`` with tfgpu's train function (:func:`epoch_calls`): on the TensorFlow
    backend, outside ``MultiWorkerMirroredStrategy``. Keras's own otherwise (one step a call there; on JAX the
    calls divide the epoch, :func:`tfgpu.training.trainer.resolve_steps_per_execution`)."""
    import keras  # noqa: PLC0415

    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf  # noqa: PLC0415

    return not isinstance(model.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy)


def call_timer(bound: float = MAX_CALL_SECONDS) -> Any:
    """A Keras callback that warns once when one of ``fit``'s training calls takes longer than ``bound`` seconds.

    Stop signals, ``every_steps`` saves and ``progress.json`` wait for the call
    to end. fit's calls are not shortened at run time as the custom loop's are:
    Keras starts a call every ``steps_per_execution`` steps of the epoch (fixed
    when the model is compiled), so tfgpu bounds them when it plans
    (:func:`tfgpu.training.trainer.resolve_steps_per_execution`) and says here
    what to change. A call is timed from ``on_train_batch_begin``
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
