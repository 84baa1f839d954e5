"""``train.loop: custom``: a ``GradientTape`` step run on every replica with ``strategy.run``.

Each replica computes the per-example loss (no reduction) on its part of the
global batch and scales it with ``tf.nn.compute_average_loss`` so that the
gradients summed across replicas are the global-batch mean.

Speed: ``steps_per_execution`` steps run inside one ``tf.function`` call (a
``tf.range`` loop over the run's iterator: on CPU replicas a plain one, each
replica taking its rows in the step, and for a split held in memory a call's
batches read as one block; else tf.distribute's distributed iterator;
:mod:`tfgpu.training.loops.replica_batches`), so Python runs once per call,
not once per step. The loss and metrics are Keras metric objects updated on
each replica and read on the host once per epoch: nothing is copied to the host
per step. Each function is traced once; the counts are returned.

Call length: stop signals, ``every_steps`` saves, ``progress.json`` and the
progress bar act only between calls, so a call is kept under
:data:`MAX_CALL_SECONDS`: each call is timed (to the host's read of its step count)
and the next calls are shortened when one took longer (:func:`next_steps_per_call`).
The step count is a tensor, so a shorter call is not a new trace.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from ...utils.console import warn
from . import Job, check_loss, epoch_line, epoch_stats, format_epoch, keep_iterators, measure_input_wait
from .gradients import GradientStep, accumulate
from .replica_batches import Blocks, Feed, steps_function

#: The longest a training call should take, in seconds. A stop signal is handled at the
#: next call boundary and a checkpoint saved before the process exits; Slurm kills a job
#: KillWait seconds (30 by default) after its SIGTERM, and ``docker stop`` after 10 s.
MAX_CALL_SECONDS = 5.0


def next_steps_per_call(cap: int, steps: int, seconds: float, most: int, bound: float = MAX_CALL_SECONDS) -> int:
    """The most steps the next training call may run, after a call of ``steps`` steps took ``seconds``.

    Args:
        cap: the most steps per call until now (at first ``most``).
        steps, seconds: the last call's steps and wall-clock seconds.
        most: ``train.steps_per_execution`` resolved (the cap never exceeds it).
        bound: seconds a call should stay under (:data:`MAX_CALL_SECONDS`).

    Returns:
        Over ``bound``: as many steps as take half of it at the last call's rate
        (at least 1, at most ``cap``). Else twice ``cap`` (at most ``most``)
        when that many would still take at most half of ``bound``; else ``cap``.
        E.g. ``next_steps_per_call(32, 32, 12.8, 32)`` is 6 (0.4 s a step, 2.4 s a call).
    """
    per_step = seconds / max(steps, 1)
    if seconds > bound:
        return max(1, min(cap, int(bound / 2 / per_step)))
    if cap < most and per_step * min(most, 2 * cap) <= bound / 2:
        return min(most, 2 * cap)
    return cap


def _mean_over_workers(strategy: Any) -> Any:
    """``seconds -> their mean over all replicas`` (one tiny all-reduce): every worker gets the same
    figure, so all shorten their calls alike (their collectives and the checkpoint's stop agreement
    need the same call boundaries on every worker)."""
    import tensorflow as tf  # noqa: PLC0415

    @tf.function
    def reduce(seconds: Any) -> Any:
        per_replica = strategy.run(tf.identity, args=(seconds,))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    return lambda seconds: float(reduce(tf.constant(seconds, tf.float32)))


def train_custom(job: Job, callbacks: list, progress: str, start: tuple[int, int] = (0, 0),
                 max_call_seconds: float = MAX_CALL_SECONDS) -> dict[str, int]:
    """Train with a custom distributed loop.

    Args:
        job: what to train (:class:`~tfgpu.training.loops.Job`): ``job.model``,
            ``job.optimizer`` and the metrics created in ``job.strategy``'s
            scope; ``job.loss`` per-example (``reduction=None``);
            ``job.steps_per_epoch`` and ``job.validation_steps`` exact (the
            iterators are not read past them); ``job.jit_compile`` compiles each
            replica's forward and backward pass with XLA;
            ``job.terminate_on_nan`` stops at the end of an epoch whose loss is
            NaN or infinite (as ``TerminateOnNaN`` does for ``fit``).
        callbacks: Keras callbacks, called in ``fit``'s order (Keras 3.15.1
            ``keras/src/backend/tensorflow/trainer.py``): ``on_train_begin``;
            per epoch ``on_epoch_begin``, ``on_train_batch_begin``/``_end`` once
            per call (the call's first and last step index, no batch logs: they
            would cost a host read per call), ``on_test_begin``,
            ``on_test_batch_begin``/``_end`` once (validation is one call),
            ``on_test_end`` (the validation logs) and ``on_epoch_end`` (the
            epoch's logs, as with ``fit``); ``on_train_end`` with the last
            epoch's logs. ``model.stop_training`` set by a callback
            (``EarlyStopping``) ends the epoch after the current call and the
            run after the epoch, as ``fit`` does.
        progress: ``"bar"``, ``"epoch"`` or ``"none"``.
        start: ``(epoch, step)`` to start from, counted from 0 (a checkpoint's
            position): the first epoch runs its remaining steps, on the batches
            an uninterrupted run reads there. Batch callbacks get indices
            counted from that start, as ``fit`` gives them.
        max_call_seconds: a training call runs at most ``job.steps_per_execution``
            steps (an epoch's last call the steps left); when one takes longer
            than this, the next calls run fewer (:func:`next_steps_per_call`; the
            first call, which traces, is not counted). After each call the
            optimizer's step counter is read on the host, which waits for the
            call's updates, so on a GPU its time is the work done, not only the
            work queued (``tf.test.experimental.sync_devices()`` would also
            sync the other workers' devices, which fails: "Haven't set up remote
            eager worker"). With several workers they all use the mean of their
            times, so their calls keep the same boundaries.

    Returns:
        How many times each step function was traced:
        ``{"train": n, "validation": m}`` (1 and 1 when nothing retraced).

    Raises:
        TrainingError: the loss became NaN or infinite (with ``job.terminate_on_nan``).

    Wraps: https://www.tensorflow.org/api_docs/python/tf/distribute/Strategy#run,
    https://www.tensorflow.org/api_docs/python/tf/nn/compute_average_loss and
    https://www.tensorflow.org/tutorials/distribute/custom_training
    """
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    strategy, model, optimizer, loss_fn = job.strategy, job.model, job.optimizer, job.loss
    metrics, val_metrics, val = job.metrics, job.val_metrics, job.validation
    epochs, steps_per_epoch, steps_per_execution = job.epochs, job.steps_per_epoch, job.steps_per_execution
    # One iterator each for the whole run, over the datasets repeated once per epoch, read
    # exactly one epoch's batches per epoch: no MirroredStrategy iterator is built and torn
    # down per epoch (0.1-0.4 s each on 2 CPU cores, measured).
    first_epoch, first_step = start
    skip = first_epoch * steps_per_epoch + first_step
    feed = job.feed or Feed.of(strategy)  # on CPU replicas a plain iterator, each replica taking its rows in the step
    _, train_batches = feed.training(job, epochs, skip)  # there, in memory, a call's batches read as one block
    val_batches = feed.iterator(val.repeat(epochs - first_epoch)) if val is not None else None
    scales_loss = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    forward = job.forward
    with strategy.scope():
        loss_tracker = keras.metrics.Mean(name="loss")
        val_loss_tracker = keras.metrics.Mean(name="val_loss")
        # The optimizer's slots exist before the step is traced: created lazily inside the
        # tf.range loop, MirroredStrategy fails ("must feed a value for placeholder").
        optimizer.build(model.trainable_variables)
        step = GradientStep(optimizer, strategy)

    def forward_backward(x: Any, y: Any, w: Any = None) -> tuple[Any, Any, Any]:
        with tf.GradientTape() as tape:
            pred = forward(x) if forward is not None else model(x, training=True)  # model.remat: segments
            per_example = tf.cast(loss_fn(y, pred), tf.float32)
            if w is not None:  # train.class_weight: (x, y, w) batches; the loss fit reports with sample_weight
                per_example = per_example * tf.cast(tf.reshape(w, tf.shape(per_example)), tf.float32)
            loss = tf.nn.compute_average_loss(per_example)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss) if scales_loss else loss
        return tape.gradient(scaled, model.trainable_variables), per_example, pred

    # XLA compiles each replica's forward and backward pass; the gradient
    # all-reduce and the update stay outside it (cross-replica calls cannot be compiled).
    compute = tf.function(forward_backward, jit_compile=True, autograph=False) if job.jit_compile else forward_backward

    def micro_grads(batch: Any) -> list:
        x, y, *w = batch
        grads, per_example, pred = compute(x, y, *w)
        loss_tracker.update_state(per_example)
        for m in metrics:
            m.update_state(y, pred)
        return grads

    def replica_train(*batch: Any) -> None:
        # train.gradient_accumulation_steps micro-batches, one all-reduce, the norm, clipping (loops.gradients)
        grads = accumulate(micro_grads, batch, job.accumulation)
        step.apply(grads, model.trainable_variables)

    def replica_test(x: Any, y: Any) -> None:
        pred = model(x, training=False)
        val_loss_tracker.update_state(tf.cast(loss_fn(y, pred), tf.float32))
        for m in val_metrics:
            m.update_state(y, pred)

    def on_replicas(replica_fn: Any) -> Any:
        """One global step: ``strategy.run`` on each replica, no host read. Not converted by AutoGraph, as
        Keras's own ``train_step`` is not (its Python branches are on Python values; converting the step, the
        model's call and the loss cost 0.1-0.3 s at the first training call and as much at the first
        validation call, at every start, measured)."""
        return tf.autograph.experimental.do_not_convert(lambda batch: strategy.run(replica_fn, args=feed.args(batch)))

    # ``steps`` global steps in one call (replica_batches.steps_function)
    blocks = train_batches if isinstance(train_batches, Blocks) else None
    train_steps = steps_function(on_replicas(replica_train), blocks)
    test_steps = steps_function(on_replicas(replica_test))
    measure_input_wait(callbacks, train_steps)
    train_trackers, val_trackers = [loss_tracker, *metrics], [val_loss_tracker, *val_metrics]
    cbs = keras.callbacks.CallbackList([step.callback(), *callbacks], add_history=False, add_progbar=False,
                                       model=model)
    model.stop_training = False  # set by a callback (EarlyStopping) to end the run, as fit reads it
    mean_over_workers = (_mean_over_workers(strategy)
                         if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) else float)
    cap, timed, told = steps_per_execution, False, False
    with step.attached():  # the loop's optimizer skips its own all-reduce (loops.gradients)
        cbs.on_train_begin()
        logs: dict[str, float] = {}
        for epoch in range(first_epoch, epochs):
            started = time.perf_counter()
            cbs.on_epoch_begin(epoch)
            steps = steps_per_epoch - (first_step if epoch == first_epoch else 0)
            bar = keras.utils.Progbar(steps) if progress == "bar" else None
            if bar is not None:
                print(f"Epoch {epoch + 1}/{epochs}")
            for m in train_trackers + val_trackers:
                m.reset_state()
            done = 0
            while done < steps:
                # The step count is a tensor, so a shorter call is not a new trace.
                n = min(cap, steps - done)
                cbs.on_train_batch_begin(done)
                began = time.perf_counter()
                train_steps(train_batches, tf.constant(n, tf.int32))
                if timed:
                    keras.ops.convert_to_numpy(optimizer.iterations)  # waits for the call's updates
                    seconds = time.perf_counter() - began
                    cap = next_steps_per_call(cap, n, mean_over_workers(seconds), steps_per_execution, max_call_seconds)
                    if seconds > max_call_seconds and not told:
                        told = True
                        warn(f"a training call of {n} steps took {seconds:.1f} s, more than {max_call_seconds:g} s "
                             "(stop signals and checkpoints wait for the call to end): "
                             + (f"calls now run at most {cap} step{'s' if cap > 1 else ''}" if cap < n
                                else "a single step takes that long"))
                timed = True  # the first call traces the function: not counted
                done += n
                cbs.on_train_batch_end(done - 1)
                if bar is not None:
                    bar.update(done)
                if model.stop_training:  # as fit: the epoch ends here, validated
                    break
            val_logs: dict[str, float] = {}
            if val_batches is not None:
                cbs.on_test_begin()
                cbs.on_test_batch_begin(0)  # one call of all the validation steps (fit: one per its calls)
                test_steps(val_batches, tf.constant(job.validation_steps, tf.int32))
                cbs.on_test_batch_end(job.validation_steps - 1)
                val_logs = {m.name: float(m.result()) for m in val_trackers}  # the epoch's host reads: this,
                cbs.on_test_end({k[4:]: v for k, v in val_logs.items()})
            logs = {m.name: float(m.result()) for m in train_trackers}       # and this
            logs.update(val_logs)
            if job.terminate_on_nan:
                check_loss(logs["loss"], epoch + 1)
            seconds = time.perf_counter() - started
            cbs.on_epoch_end(epoch, logs)
            if progress != "none":
                # The epoch statistics callback's figures; timed here too, for a caller without that callback.
                shown = {"epoch_seconds": seconds, **logs, **epoch_stats(callbacks, epoch)}
                print(format_epoch(shown) if bar is not None else epoch_line(epoch, epochs, shown), file=sys.stdout,
                      flush=True)
            if model.stop_training:
                break
        cbs.on_train_end(logs)
    # destroyed now, they could pause the run's end for seconds
    keep_iterators([blocks.iterator if blocks is not None else train_batches, val_batches])
    return {"train": train_steps.experimental_get_tracing_count(),
            "validation": test_steps.experimental_get_tracing_count()}
