"""The optimizer step of both loops: gradient accumulation, the all-reduce, clipping and the gradient norm.

Keras's own ``gradient_accumulation_steps`` fails under ``tf.distribute``: its
update runs inside a ``tf.cond`` and the all-reduce inside it is a
``merge_call``, which TensorFlow refuses there ("merge_call called while
defining a new graph or a tf.function", keras-team/keras#20582). Keras's own
clipping (``clipnorm``, ``global_clipnorm``, ``clipvalue``) runs before its
all-reduce, on each replica's part of the gradient (scaled by ``1 / replicas``),
so ``global_clipnorm: 1`` on 2 replicas clips each half to 1, not the gradient.

tfgpu's step, the same for ``train.loop: fit`` (the model's ``train_step``,
:func:`train_step`) and ``custom``:

1. **Micro-batches** (``train.gradient_accumulation_steps: K``): each replica
   gets ``K x batch_size_per_replica`` rows a step and runs them as ``K``
   micro-batches one after another (a ``tf.while_loop`` of one iteration at a
   time, so one micro-batch's activations are held at once), summing their
   gradients, each weighted by its share of the replica's rows: the sum is the
   gradient of the replica's mean loss, exactly as one batch of all its rows
   would give (:func:`accumulate`). No accumulator variables: a step is one
   optimizer step, so a checkpoint, a resume or a stop always lands on an
   accumulation boundary.
2. **One all-reduce** per optimizer step: ``ReplicaContext.all_reduce(SUM)``
   of the summed gradients (Keras's own all-reduce in ``apply_gradients`` is
   skipped for the optimizer tfgpu trains with, :meth:`GradientStep.attached`).
3. **The global norm** of the reduced gradient (unscaled by a
   ``LossScaleOptimizer``'s loss scale), recorded per epoch as
   ``gradient_norm`` (mean over the epoch's steps) and ``gradient_norm_max``.
4. **Clipping** (``train.gradient_clipping``, or ``clipnorm``/``global_clipnorm``/``clipvalue``
   given to ``model.optimizer``): Keras's own, which now sees the reduced gradient.

Wraps: https://www.tensorflow.org/api_docs/python/tf/distribute/ReplicaContext#all_reduce,
https://www.tensorflow.org/api_docs/python/tf/clip_by_global_norm and
https://keras.io/api/optimizers/#base-optimizer-class (``clipnorm``, ``clipvalue``, ``global_clipnorm``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

from ...errors import ConfigError
from ...model.keras_model import inner_optimizer
from .replica_batches import part_bounds


def check(cfg: Any) -> None:
    """Refuse what tfgpu's step cannot do, before TensorFlow starts (``tfgpu plan`` and ``tfgpu run``).

    Raises:
        ConfigError: ``train.gradient_accumulation_steps`` on ``backend: jax`` or with a builder's own batches
            (``data.batched``); ``train.gradient_clipping`` together with the optimizer's own clipping argument;
            Keras's ``gradient_accumulation_steps`` given to ``model.optimizer`` on TensorFlow.
    """
    train, k = cfg.train, cfg.train.gradient_accumulation_steps
    spec = cfg.model.optimizer
    args = next(iter(spec.values()), {}) if isinstance(spec, dict) and len(spec) == 1 and "name" not in spec else spec
    args = args if isinstance(args, dict) else {}
    if k > 1 and cfg.backend == "jax":
        raise ConfigError(
            f"train.gradient_accumulation_steps: {k} is tfgpu's accumulation inside tf.distribute's step, "
            "and this recipe trains on backend: jax.",
            f"on JAX give it to Keras's optimizer: model.optimizer: {{name: adam, gradient_accumulation_steps: {k}}} "
            "(Keras's own, which counts each micro-batch as a step), or use backend: tensorflow.")
    if k > 1 and cfg.data.batched:
        raise ConfigError(
            f"train.gradient_accumulation_steps: {k} needs batches of K x the global batch, and with "
            "data.batched: true the builder's batches are the steps' batches.",
            "let tfgpu batch (data.batched: false), or have the builder batch K times larger and set "
            "gradient_accumulation_steps: 1.")
    if cfg.backend != "jax" and args.get("gradient_accumulation_steps"):
        raise ConfigError(
            f"model.optimizer: gradient_accumulation_steps: {args['gradient_accumulation_steps']} is Keras's own, "
            "which fails under tf.distribute (merge_call inside a tf.cond, keras-team/keras#20582).",
            f"remove it from model.optimizer and set train.gradient_accumulation_steps: "
            f"{args['gradient_accumulation_steps']} (tfgpu's, which works in every strategy).")
    own = [name for name in ("clipnorm", "global_clipnorm", "clipvalue") if args.get(name) is not None]
    if train.gradient_clipping is not None and own:
        raise ConfigError(
            f"train.gradient_clipping and model.optimizer's {own[0]}: {args[own[0]]} both clip the gradients.",
            "keep one: train.gradient_clipping (global_norm, norm or value), or the optimizer's own argument.")


def clip_with(optimizer: Any, clipping: Any) -> None:
    """Set ``train.gradient_clipping`` on ``optimizer`` (the inner one of a ``LossScaleOptimizer``) as Keras's
    ``global_clipnorm``, ``clipnorm`` or ``clipvalue``; ``None``: leave it as built."""
    if clipping is None:
        return
    inner = inner_optimizer(optimizer)
    name, value = clipping.keras_argument
    setattr(inner, name, value)


def clipping_of(optimizer: Any) -> Optional[dict[str, float]]:
    """The clipping ``optimizer`` applies, as ``{keras_argument: value}``, or ``None``."""
    inner = inner_optimizer(optimizer)
    for name in ("global_clipnorm", "clipnorm", "clipvalue"):
        value = getattr(inner, name, None)
        if value:
            return {name: float(value)}
    return None


def overrides_train_step(model: Any) -> bool:
    """Whether ``model``'s class has its own ``train_step`` (a builder's subclass): tfgpu's step then stays out."""
    import keras  # noqa: PLC0415

    return type(model).train_step is not keras.Model.train_step


def accumulate(grads_of: Callable[[Any], list], batch: Any, k: int) -> list:
    """The gradients of ``batch`` as ``k`` micro-batches, run one after another and summed, each weighted by its
    rows over the batch's (so the sum is the gradient of the mean over all the rows when each micro-batch's loss is
    its own mean, as Keras's and ``tf.nn.compute_average_loss`` are).

    Args:
        grads_of: ``micro_batch -> gradients`` (a list, ``None`` for a variable the loss does not reach); it may
            update metrics (each micro-batch's rows are seen once).
        batch: a structure of tensors of shape ``(rows, ...)``, the replica's rows.
        k: micro-batches (1: ``grads_of(batch)``).

    Returns:
        The weighted sum, one entry per variable (``None`` where ``grads_of`` gives ``None``; sparse gradients
        are made dense).
    """
    if k == 1:
        return grads_of(batch)
    import tensorflow as tf  # noqa: PLC0415

    rows = tf.shape(tf.nest.flatten(batch)[0])[0]

    def weighted(i: Any) -> list:
        start, end = part_bounds(rows, k, i)
        share = tf.cast(end - start, tf.float32) / tf.cast(tf.maximum(rows, 1), tf.float32)
        grads = grads_of(tf.nest.map_structure(lambda t: t[start:end], batch))
        return [None if g is None else tf.convert_to_tensor(g) * tf.cast(share, g.dtype) for g in grads]

    first = weighted(tf.constant(0))  # outside the loop: which variables have gradients is known from it
    kept = [i for i, g in enumerate(first) if g is not None]

    def body(i: Any, sums: list) -> tuple[Any, list]:
        grads = weighted(i)
        return i + 1, [s + grads[j] for s, j in zip(sums, kept)]

    _, sums = tf.while_loop(lambda i, _: i < k, body, (tf.constant(1), [first[j] for j in kept]),
                            parallel_iterations=1)  # one micro-batch at a time: its activations only
    out: list = [None] * len(first)
    for s, j in zip(sums, kept):
        out[j] = s
    return out


class GradientStep:
    """tfgpu's optimizer step for one loop's run (see the module's docstring): all-reduce once, record the
    global norm, let the optimizer clip and apply.

    Trains inside :meth:`attached`.

    Attributes:
        optimizer: the optimizer trained with (a ``LossScaleOptimizer`` or a plain one).
        norms: float32 variables ``[sum, count, max]`` of this epoch's finite global norms; every replica holds
            the same values (the norm of the reduced gradient), read from the first.
    """

    def __init__(self, optimizer: Any, strategy: Any) -> None:
        import tensorflow as tf  # noqa: PLC0415

        self.optimizer, self.strategy = optimizer, strategy
        self.inner = inner_optimizer(optimizer)
        with strategy.scope():
            self.norms = tf.Variable([0.0, 0.0, 0.0], trainable=False, name="gradient_norms",
                                     synchronization=tf.VariableSynchronization.ON_READ,
                                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        """While training: Keras's own all-reduce in ``apply_gradients`` skipped (:meth:`apply` has reduced the
        gradients); given back on the way out."""
        self.inner._all_reduce_sum_gradients = _reduced_already
        try:
            yield
        finally:
            self.inner.__dict__.pop("_all_reduce_sum_gradients", None)

    def apply(self, grads: list, variables: list) -> None:
        """All-reduce ``grads`` (summed over the replicas), record their global norm, clip and apply them.

        In a replica context (``strategy.run``), with the per-replica gradients of a loss already scaled for
        distribution (each replica's mean over the global batch's replicas), as Keras's and the custom loop's are.
        """
        import tensorflow as tf  # noqa: PLC0415

        context = tf.distribute.get_replica_context()
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        if not pairs:
            raise ValueError("No gradients provided for any variable: the loss does not depend on the weights.")
        grads = [g for g, _ in pairs]
        if context is not None and context.num_replicas_in_sync > 1:
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        norm = tf.cast(tf.linalg.global_norm(grads), tf.float32)
        if self.optimizer is not self.inner:  # a LossScaleOptimizer: its gradients carry the loss scale
            norm = norm / tf.cast(self.optimizer.dynamic_scale, tf.float32)
        finite = tf.math.is_finite(norm)
        seen = tf.where(finite, norm, 0.0)
        self.norms.assign(tf.stack([self.norms[0] + seen, self.norms[1] + tf.cast(finite, tf.float32),
                                    tf.maximum(self.norms[2], seen)]))
        self.optimizer.apply_gradients(zip(grads, [v for _, v in pairs]))

    def epoch_figures(self) -> dict[str, float]:
        """This epoch's ``gradient_norm`` (mean) and ``gradient_norm_max``, then reset; ``{}`` with no step."""
        total, count, most = (float(v) for v in self.strategy.experimental_local_results(self.norms)[0].numpy())
        self.norms.assign([0.0, 0.0, 0.0])
        if count == 0:
            return {}
        return {"gradient_norm": total / count, "gradient_norm_max": most}

    def callback(self) -> Any:
        """A Keras callback that adds :meth:`epoch_figures` to each epoch's logs (first among the epoch's
        callbacks, so that ``metrics.csv`` and the epoch line have them)."""
        import keras  # noqa: PLC0415

        step = self

        class GradientNorms(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
                step.epoch_figures()  # a resumed epoch starts from 0

            def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
                if logs is not None:
                    logs.update(step.epoch_figures())

        return GradientNorms()


def _reduced_already(grads_and_vars: Any) -> list:
    """Keras's ``TFOptimizer._all_reduce_sum_gradients`` for gradients :meth:`GradientStep.apply` has reduced."""
    return list(grads_and_vars)


def train_step(model: Any, step: GradientStep, k: int, forward: Optional[Callable[[Any], Any]] = None
               ) -> Callable[[Any], Any]:
    """``data -> logs``: Keras's TensorFlow ``train_step`` (Keras 3.15.1 ``keras/src/backend/tensorflow/trainer.py``)
    with tfgpu's optimizer step: ``k`` micro-batches (:func:`accumulate`), one all-reduce, the norm, clipping;
    ``forward``: the forward pass in checkpointed segments (``model.remat``, :mod:`tfgpu.training.loops.remat`).

    The loss tracker and the compiled metrics see every row once, as with one batch; the loss is Keras's
    (``model._compute_loss``: the compiled loss, the model's regularisation losses, scaled for distribution).
    """
    import tensorflow as tf  # noqa: PLC0415
    from keras.src.losses import loss as loss_module  # noqa: PLC0415
    from keras.src.trainers import data_adapters  # noqa: PLC0415

    unpack = data_adapters.data_adapter_utils.unpack_x_y_sample_weight
    optimizer = model.optimizer

    def micro(data: Any) -> list:
        x, y, sample_weight = unpack(data)
        with tf.GradientTape() as tape:
            if forward is not None:
                y_pred = forward(x)
            else:
                y_pred = model(x, training=True) if model._call_has_training_arg else model(x)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            rows = tf.shape(next(i for i in tf.nest.flatten(x) if i is not None))[0]
            model._loss_tracker.update_state(loss_module.unscale_loss_for_distribution(loss), sample_weight=rows)
            if optimizer is not None:
                loss = optimizer.scale_loss(loss)
        grads = tape.gradient(loss, model.trainable_weights)
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        return grads

    def step_fn(data: Any) -> Any:
        grads = accumulate(micro, data, k)
        step.apply(grads, model.trainable_weights)
        return model.get_metrics_result()

    return step_fn
