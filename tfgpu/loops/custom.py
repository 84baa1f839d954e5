"""``train.loop: custom``: a ``GradientTape`` step run on every replica with ``strategy.run``.

Each replica computes the per-example loss (no reduction) on its part of the
global batch and scales it with ``tf.nn.compute_average_loss`` so that the
gradients summed across replicas are the global-batch mean. Metrics are Keras
metric objects updated per replica; the epoch loss is summed across replicas
with ``strategy.reduce``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from . import check_loss


def train_custom(strategy: Any, model: Any, optimizer: Any, loss_fn: Any, metrics: list, val_metrics: list,
                 train: Any, val: Any, epochs: int, steps_per_epoch: int, callbacks: list, progress: str,
                 jit_compile: bool = False, terminate_on_nan: bool = True) -> None:
    """Train with a custom distributed loop.

    Args:
        strategy: the ``tf.distribute.Strategy``; ``model``, ``optimizer`` and
            the metrics must have been created in its scope.
        model: a ``keras.Model`` mapping float32 ``(batch, ...)`` to predictions.
        optimizer: a Keras optimizer (a ``LossScaleOptimizer`` under ``mixed_float16``).
        loss_fn: a ``keras.losses.Loss`` with ``reduction=None`` (per-example).
        metrics, val_metrics: Keras metrics for training and validation.
        train, val: ``tf.data`` datasets of global batches ``(x, y)``.
        epochs: passes over ``train``; steps_per_epoch: batches in one pass.
        callbacks: Keras callbacks; they get ``on_epoch_end`` logs as with ``fit``.
        progress: ``"bar"``, ``"epoch"`` or ``"none"``.
        jit_compile: compile each replica's step with XLA.
        terminate_on_nan: stop at the end of an epoch whose loss is NaN or
            infinite (``train.terminate_on_nan``, as ``TerminateOnNaN`` does for ``fit``).

    Raises:
        TrainingError: the loss became NaN or infinite (with ``terminate_on_nan``).

    Wraps: https://www.tensorflow.org/api_docs/python/tf/distribute/Strategy#run and
    https://www.tensorflow.org/api_docs/python/tf/nn/compute_average_loss
    """
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    dist_train = strategy.experimental_distribute_dataset(train)
    dist_val = strategy.experimental_distribute_dataset(val)
    scales_loss = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def forward_backward(x: Any, y: Any) -> tuple[Any, Any, Any]:
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            per_example = tf.cast(loss_fn(y, pred), tf.float32)
            loss = tf.nn.compute_average_loss(per_example)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss) if scales_loss else loss
        return tape.gradient(scaled, model.trainable_variables), per_example, pred

    # XLA compiles each replica's forward and backward pass; the gradient
    # all-reduce and the update stay outside it (cross-replica calls cannot be compiled).
    compute = tf.function(forward_backward, jit_compile=True) if jit_compile else forward_backward

    def replica_train(x: Any, y: Any) -> tuple[Any, Any]:
        grads, per_example, pred = compute(x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        for m in metrics:
            m.update_state(y, pred)
        return tf.reduce_sum(per_example), tf.cast(tf.shape(per_example)[0], tf.float32)

    def replica_test(x: Any, y: Any) -> tuple[Any, Any]:
        pred = model(x, training=False)
        per_example = tf.cast(loss_fn(y, pred), tf.float32)
        for m in val_metrics:
            m.update_state(y, pred)
        return tf.reduce_sum(per_example), tf.cast(tf.shape(per_example)[0], tf.float32)

    def distributed(replica_fn: Any, spec: Any) -> Any:
        """One global step: ``strategy.run`` on each replica, sums reduced across replicas."""

        def run(batch: Any) -> tuple[Any, Any]:
            loss_sum, count = strategy.run(replica_fn, args=batch)
            return (strategy.reduce(tf.distribute.ReduceOp.SUM, loss_sum, axis=None),
                    strategy.reduce(tf.distribute.ReduceOp.SUM, count, axis=None))

        # A fixed input signature (batch dimension None) keeps the partial last
        # batch from retracing the step.
        return tf.function(run, input_signature=[spec])

    train_step = distributed(replica_train, dist_train.element_spec)
    test_step = distributed(replica_test, dist_val.element_spec)

    cbs = keras.callbacks.CallbackList(callbacks, add_history=False, add_progbar=False, model=model)
    cbs.on_train_begin()
    for epoch in range(epochs):
        started = time.perf_counter()
        cbs.on_epoch_begin(epoch)
        bar = keras.utils.Progbar(steps_per_epoch) if progress == "bar" else None
        if bar is not None:
            print(f"Epoch {epoch + 1}/{epochs}")
        for m in metrics + val_metrics:
            m.reset_state()
        loss_sum = tf.constant(0.0)
        count = tf.constant(0.0)
        for i, batch in enumerate(dist_train):
            s, n = train_step(batch)
            loss_sum += s  # stays on the device: no host sync per step
            count += n
            if bar is not None:
                bar.update(i + 1)
        val_sum = tf.constant(0.0)
        val_count = tf.constant(0.0)
        for batch in dist_val:
            s, n = test_step(batch)
            val_sum += s
            val_count += n
        logs = {"loss": float(loss_sum / count)}
        logs.update({m.name: float(m.result()) for m in metrics})
        logs["val_loss"] = float(val_sum / val_count)
        logs.update({m.name: float(m.result()) for m in val_metrics})
        if terminate_on_nan:
            check_loss(logs["loss"], epoch + 1)
        seconds = time.perf_counter() - started
        text = " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())
        cbs.on_epoch_end(epoch, logs)
        if progress != "none":
            timing = f"{seconds:.1f}s"
            prefix = "" if bar is not None else f"Epoch {epoch + 1}/{epochs} - "
            print(f"{prefix}{timing} - {text}", file=sys.stdout, flush=True)
    cbs.on_train_end()
