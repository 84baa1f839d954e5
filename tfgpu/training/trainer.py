"""What trains: the model, its optimizer, loss, metrics and callbacks, built once from the config and the data.

:class:`Trainer` is made after :func:`tfgpu.setup` and the data: in the
strategy's scope it builds and compiles the model (:mod:`tfgpu.model.keras_model`), checks
it on two samples (a loss or metric that does not fit the labels is a
configuration error before anything is written), and then gives the run what it
needs: its facts for ``summary.json`` and the console, the callbacks (epoch
statistics, ``metrics.csv``, TensorBoard, checkpoints), the training loop
(``fit`` or ``custom``, :mod:`tfgpu.training.loops`, fed a plain
:class:`~tfgpu.training.loops.Job`), the saved model and the test figures.

It writes only where a :class:`~tfgpu.training.rundir.RunDir` tells it to, and prints
nothing (:mod:`tfgpu.utils.console` does). Importing it does not import TensorFlow.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from typing import Any, Optional

from ..config import Config
from ..data.augment import model_layers
from ..data.pipeline import normalization_stats, sample_batch
from ..devices import keras_fixes
from ..devices.probe import versions
from ..errors import ConfigError
from ..model import backbone, transfer
from ..model.keras_model import build_model, check_fits, describe_model, make_loss, make_metrics, make_optimizer, target_of
from ..model.schedules import learning_rate_callback
from ..model.schedules import resolve as resolve_schedule
from ..tracking import study
from ..tracking import mlflow as tracking
from ..utils.console import warn
from . import callbacks as user_callbacks
from . import ema
from . import checkpoint as ckpt
from .loops import Job, epoch_stats_callback, progress_mode
from . import telemetry
from .telemetry import input_bound
from .loops import gradients, remat
from .loops.replica_batches import Feed
from .loops.custom import MAX_CALL_SECONDS

# train.steps_per_execution: auto. At most this many training steps per tf.function call,
# whatever the epoch's length: stop signals, every_steps saves, progress.json and the progress
# bar act only between calls (see resolve_steps_per_execution and loops.custom.MAX_CALL_SECONDS).
AUTO_STEPS_PER_EXECUTION = 32


def resolve_steps_per_execution(setting: Any, steps_per_epoch: int, loop: str,
                                backend: str = "tensorflow") -> tuple[int, str]:
    """``train.steps_per_execution`` -> (training steps per ``tf.function`` call, why), for ``train.loop``.

    The setting is a most (``auto``: :data:`AUTO_STEPS_PER_EXECUTION`), never
    more than one epoch, and the calls never cross an epoch's end:

    - ``custom``, and ``fit`` on TensorFlow: that many; an epoch's last call
      runs the steps left (the step count is a tensor: no second trace; for
      ``fit``, tfgpu's train function, :func:`tfgpu.training.loops.fit.fit_calls`).
      The custom loop also shortens its calls at run time when one takes longer
      than :data:`tfgpu.training.loops.custom.MAX_CALL_SECONDS`; ``fit`` warns.
    - ``fit`` on JAX: the largest divisor of ``steps_per_epoch`` up to it.
      Keras's fit runs ``ceil(steps_per_epoch / n)`` calls of ``n`` steps each
      while the dataset has batches (Keras 3.15.1 ``keras/src/trainers/epoch_iterator.py``),
      and tfgpu gives it one dataset of all the epochs, so an ``n`` that did not
      divide the epoch would run into the next one. A prime step count gives 1.

    Examples with ``auto``: 997 steps: 32 (31 calls of 32, one of 5), on JAX's
    fit 1; 178 steps: 32 (5 of 32, one of 18), on JAX's fit 2; 96: 32; 6: 6.
    """
    most = AUTO_STEPS_PER_EXECUTION if setting == "auto" else int(setting)
    named = "auto" if setting == "auto" else f"train.steps_per_execution: {setting}"
    wanted = min(most, steps_per_epoch)
    whole = f"{named}: the whole {steps_per_epoch}-step epoch in one call"
    if loop == "custom" or backend != "jax":
        left = steps_per_epoch % wanted
        shape = whole if wanted == steps_per_epoch else (
            f"{named}: at most {wanted} step{'s' if wanted > 1 else ''} a call"
            + (f" (an epoch's last call: {left})" if left else ""))
        if loop == "custom":
            return wanted, f"{shape}; a call over {MAX_CALL_SECONDS:g} s is shortened"
        return wanted, shape
    if wanted == steps_per_epoch:
        return wanted, whole
    per_call = max(d for d in range(1, wanted + 1) if steps_per_epoch % d == 0)
    return per_call, (f"{named}: the largest divisor of the epoch's {steps_per_epoch} steps up to {wanted} "
                      "(fit's calls must divide the epoch on JAX)")


def profile_calls(steps: Optional[list[int]], epochs: int, steps_per_epoch: int,
                  per_call: int) -> Optional[dict[str, list[int]]]:
    """``train.profile_steps`` -> the training calls to profile and the steps they hold.

    Keras's TensorBoard callback counts calls: ``ceil(steps_per_epoch / per_call)``
    an epoch, of ``per_call`` steps but an epoch's last (shorter when ``per_call``
    does not divide the epoch: :func:`tfgpu.training.loops.fit.fit_calls`). The custom loop's calls
    shortened at run time (over :data:`~tfgpu.training.loops.custom.MAX_CALL_SECONDS`)
    move the later ones: the calls named are then profiled, not these steps.

    Raises:
        ConfigError: the first step lies beyond the run.
    """
    if steps is None:
        return None
    total = epochs * steps_per_epoch
    if steps[0] > total:
        raise ConfigError(
            f"train.profile_steps: {steps} starts after the run's last step ({epochs} epochs x "
            f"{steps_per_epoch} steps = {total}).",
            f"profile steps between 1 and {total}, e.g. [{min(2, total)}, {min(5, total)}].",
        )
    per_epoch = math.ceil(steps_per_epoch / per_call)

    def call_of(step: int) -> int:  # steps and calls counted from 1 over the run
        epoch, within = divmod(step - 1, steps_per_epoch)
        return epoch * per_epoch + within // per_call + 1

    def steps_of(call: int) -> tuple[int, int]:
        epoch, index = divmod(call - 1, per_epoch)
        first = epoch * steps_per_epoch + index * per_call
        return first + 1, first + min(per_call, steps_per_epoch - index * per_call)

    calls = [call_of(steps[0]), call_of(min(steps[1], total))]
    return {"steps_asked": list(steps), "calls": calls, "steps": [steps_of(calls[0])[0], steps_of(calls[1])[1]]}


def evaluate_split(model: Any, dataset: Any, steps: int) -> dict[str, float]:
    """``model.evaluate`` over one pass of a pipeline: ``{loss: ..., <metric>: ...}`` as floats.

    Wraps https://keras.io/api/models/model_training_apis/#evaluate-method
    """
    result = model.evaluate(dataset, steps=steps, return_dict=True, verbose=0)
    return {k: float(v) for k, v in result.items()}


def sync_batchnorm(model: Any, wanted: bool, backend: str) -> list[str]:
    """``model.sync_batchnorm``: every ``BatchNormalization`` layer of ``model`` (nested ones too) set to compute its
    batch statistics across replicas (``synchronized=True``, which Keras reads when the layer is called, on
    TensorFlow); the names of those layers. On JAX nothing is set: the statistics already cover the global batch.

    Wraps: https://keras.io/api/layers/normalization_layers/batch_normalization/
    """
    if not wanted:
        return []
    import keras  # noqa: PLC0415

    layers = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    if backend == "tensorflow":
        for layer in layers:
            layer.synchronized = True
    if not layers:
        warn("model.sync_batchnorm: true, and the model has no BatchNormalization layer: nothing to synchronise")
    return [layer.name for layer in layers]


class Trainer:
    """The model and what trains it, built in the strategy's scope from the config and the data.

    Args:
        cfg: the run's configuration.
        info: what :func:`tfgpu.setup` applied (:class:`tfgpu.Setup`).
        data: the loaded :class:`~tfgpu.data.Data`.
        pipes: its :class:`~tfgpu.data.pipeline.Pipelines`.
        restoring: ``--resume`` of a run with a checkpoint: the run's summary so far (``model.init_from``
            is then not applied again, :func:`tfgpu.model.transfer.prepare`); ``None``: a fresh start.

    Attributes:
        model: the compiled ``keras.Model`` (``model.compile`` sets what
            ``fit`` trains with, and makes the saved ``model.keras`` ready to
            evaluate and train further).
        optimizer: its optimizer (a ``LossScaleOptimizer`` under
            ``mixed_float16`` with the custom loop; ``fit`` wraps it itself).
        learning_rate: the learning rate after ``train.lr_scaling`` (a schedule's peak).
        schedule: ``train.lr_schedule`` resolved (:class:`tfgpu.model.schedules.Schedule`), or ``None``.
        per_call: training steps per ``tf.function`` call (the custom loop: the most).
        per_call_reason: why, in words (``summary.json``: ``steps_per_execution_reason``).
        profile: the calls ``train.profile_steps`` profiles, or ``None``.
        traces: the custom loop's trace counts after training, else ``None``.
        transfer: what ``model.init_from``/``model.freeze`` did and ``train.unfreeze`` will do
            (:class:`tfgpu.model.transfer.Transfer`).
        stop: the process's :class:`~tfgpu.training.checkpoint.StopSignals` (set by
            :func:`tfgpu.training.runner.run`), or ``None`` (signals are not handled).
        remat: ``model.remat``'s forward pass in checkpointed segments
            (:class:`~tfgpu.training.loops.remat.Segments`), or ``None``.

    Raises:
        ConfigError: the model, loss or metrics do not fit the data, a ``monitor`` the run does not log, a
            callback that refuses its arguments (:func:`tfgpu.training.callbacks.check_built`),
            ``train.profile_steps`` lies beyond the run, or ``model.remat`` on a model it cannot cut
            (:class:`~tfgpu.training.loops.remat.Segments`) (before anything is written).
    """

    def __init__(self, cfg: Config, info: Any, data: Any, pipes: Any,
                 restoring: Optional[dict[str, Any]] = None) -> None:
        import keras  # noqa: PLC0415

        self.cfg, self.info, self.data, self.pipes = cfg, info, data, pipes
        spec, plan = data.spec, info.plan
        target = target_of(spec.task, spec.num_classes, spec.target_shape, cfg.model.loss)
        normalization = normalization_stats(data) if cfg.data.normalize else None
        self.per_call, self.per_call_reason = self._steps_per_call()
        with info.scope():
            augment = model_layers(cfg.data, pipes.info.get("augment", {}).get("seed"), spec)  # augment_on: model
            self.model = build_model(cfg.model, spec.input_shape, target, normalization, augment_layers=augment,
                                     pixel_factor=backbone.pixel_factor(spec))
            self.synchronized = sync_batchnorm(self.model, cfg.model.sync_batchnorm, plan.backend)
            # model.remat: the training forward pass in checkpointed segments (tfgpu's step; the model is unchanged)
            self.remat = remat.Segments(self.model, cfg.model.remat.segments) if cfg.model.remat is not None else None
            # model.init_from and model.freeze, before compiling (tfgpu.model.transfer)
            self.transfer = transfer.prepare(cfg, self.model, plan.num_workers, restoring)
            self.optimizer, self.learning_rate = make_optimizer(
                cfg.model.optimizer, plan.lr_scale, cfg.train.lr_schedule, (cfg.train.epochs, pipes.steps_per_epoch))
            self.schedule = (resolve_schedule(cfg.train.lr_schedule, self.learning_rate / plan.lr_scale, plan.lr_scale,
                                              cfg.train.epochs, pipes.steps_per_epoch)
                             if math.isfinite(self.learning_rate) else None)
            gradients.clip_with(self.optimizer, cfg.train.gradient_clipping)  # Keras's own, fed the reduced gradient
            ema.configure(self.optimizer, cfg.train.ema)  # Keras's use_ema, before the optimizer is built
            if cfg.train.loop == "custom" and plan.mixed_precision == "mixed_float16":
                self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)  # fit wraps it itself
            metrics = make_metrics(cfg.model.metrics, cfg.model.loss)
            # On JAX the last evaluation batch carries padding of sample weight 0 (tfgpu.data.feed); Keras
            # applies sample weights to weighted_metrics only, which are the same metrics when no weights are given.
            by_weight = {"weighted_metrics": metrics} if plan.backend == "jax" else {"metrics": metrics}
            self.model.compile(optimizer=self.optimizer, loss=make_loss(cfg.model.loss), **by_weight,
                               jit_compile=plan.jit_compile, steps_per_execution=self.per_call)
            self.loss = self.metrics = self.val_metrics = None
            if cfg.train.loop == "custom":
                self.loss = make_loss(cfg.model.loss, per_example=True)
                self.metrics = make_metrics(cfg.model.metrics, cfg.model.loss)
                self.val_metrics = make_metrics(cfg.model.metrics, cfg.model.loss, prefix="val_")
        k = cfg.train.gradient_accumulation_steps
        if cfg.train.loop == "fit" and gradients.overrides_train_step(self.model):
            if k > 1:
                raise ConfigError(
                    f"train.gradient_accumulation_steps: {k} runs in tfgpu's train_step, and this model's class "
                    f"({type(self.model).__name__}) has its own train_step, which fit would use instead.",
                    "use train.loop: custom, or accumulate in your own train_step and set "
                    "gradient_accumulation_steps: 1.")
            if self.remat is not None:
                raise ConfigError(
                    f"model.remat runs in tfgpu's train_step, and this model's class ({type(self.model).__name__}) "
                    "has its own train_step, which fit would use instead.",
                    "use train.loop: custom, or call keras.remat in your own model and remove model.remat.")
        # A loss or metric that does not fit the labels fails here, as a configuration error, before
        # anything is written, rather than inside the first training step.
        self.sample = sample_batch(data)  # two training rows as the pipeline gives them (also the FLOPs count's shapes)
        check_fits(self.model, cfg.model.loss, cfg.model.metrics, *self.sample, task=spec.task)
        # train.early_stopping / train.callbacks: every monitor is a figure the run logs (tfgpu.training.callbacks).
        with info.scope():
            compiled = self.metrics if self.metrics is not None else make_metrics(cfg.model.metrics, cfg.model.loss)
        self.logged = user_callbacks.logged_names(cfg, compiled, pipes.validation is not None)
        user_callbacks.check_monitors(cfg, self.logged)
        # ... and every callback takes its arguments (built once against a stand-in run, before anything is
        # written: ReduceLROnPlateau refuses factor >= 1.0 only in its constructor)
        user_callbacks.check_built(cfg, self.logged, info.is_chief, self.optimizer)
        self.early_stopping: Any = None
        self.profile = profile_calls(cfg.train.profile_steps, cfg.train.epochs, pipes.steps_per_epoch, self.per_call)
        self.traces: Optional[dict[str, int]] = None
        self.saver: Any = None
        self.files: Any = None  # the checkpoint files (Trainer.callbacks), when checkpoints are saved or restored
        self.stop: Optional[ckpt.StopSignals] = None
        self.telemetry: Any = None  # the run's device statistics, input wait and MFU (Trainer.callbacks)
        self.rows: list[dict[str, Any]] = []

    def _steps_per_call(self) -> tuple[int, str]:
        """Training steps per call and why (:func:`resolve_steps_per_execution`; 1 for ``fit`` on several workers)."""
        cfg, steps = self.cfg, self.pipes.steps_per_epoch
        setting = cfg.train.steps_per_execution
        per_call, reason = resolve_steps_per_execution(setting, steps, cfg.train.loop, self.info.plan.backend)
        if cfg.train.loop == "fit" and self.info.plan.num_workers > 1:
            # Keras's several-steps-per-call loop (a tf.while_loop over get_next_as_optional) fails under
            # MultiWorkerMirroredStrategy with "You must feed a value for placeholder tensor
            # 'while/cond/Placeholder'" (Keras 3.15.1, TF 2.21, seen here), so fit runs one step per call.
            if per_call > 1 and setting != "auto":
                warn(f"train.steps_per_execution: {setting} is 1 with loop: fit and "
                     "several workers (Keras's multi-step loop fails under MultiWorkerMirroredStrategy); "
                     "loop: custom runs several steps per call")
            return 1, ("loop: fit on several workers: 1 (Keras's multi-step loop fails under "
                       "MultiWorkerMirroredStrategy)")
        if setting != "auto" and per_call < min(int(setting), steps):
            warn(f"train.steps_per_execution: {setting} runs {per_call} steps per call with loop: fit on JAX, the "
                 f"largest divisor of the epoch's {steps} steps up to {setting} (a fit call that did not divide the "
                 "epoch would run into the next one); backend: tensorflow or loop: custom runs any number")
        return per_call, reason

    # Facts -------------------------------------------------------------------------------------------------------

    @property
    def input(self) -> Optional[str]:
        """How the training batches reach the replicas (:mod:`tfgpu.training.loops.replica_batches`), or ``None`` on JAX
        (Keras's own data path)."""
        if self.info.plan.backend == "jax":
            return None
        import tensorflow as tf  # noqa: PLC0415

        feed, pipes = Feed.of(self.info.strategy or tf.distribute.get_strategy()), self.pipes
        return feed.said(feed.block(pipes.train_blocks, pipes.train.element_spec, pipes.global_batch, self.per_call))

    @property
    def train_samples(self) -> int:
        """Training samples per epoch (whole global batches for a streamed split)."""
        train, whole = self.data.train, self.pipes.steps_per_epoch * self.effective_batch_size
        return min(train.size, whole) if train.batches is None else whole

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step: the global batch x ``train.gradient_accumulation_steps``."""
        return self.info.global_batch_size * self.cfg.train.gradient_accumulation_steps

    def facts(self) -> dict[str, Any]:
        """What ``summary.json`` records of the devices, the data, the model and the speed choices."""
        cfg, info, data, pipes = self.cfg, self.info, self.data, self.pipes
        plan = info.plan
        return {
            "loop": cfg.train.loop,
            "backend": plan.backend,
            "versions": versions(plan.backend),
            "physical_devices": list(info.physical_devices),
            "logical_devices": list(info.logical_devices),
            "gpus": [g.name for g in plan.gpus],
            "strategy": type(info.strategy).__name__ if info.strategy is not None else None,
            "strategy_devices": list(plan.strategy.devices),
            "cross_device_ops": plan.strategy.cross_device_ops,
            "cluster": plan.cluster.to_dict() if plan.cluster else None,
            "num_workers": plan.num_workers,
            "keras_fixes": keras_fixes.applied() if plan.cluster else {},
            "num_replicas": info.num_replicas,
            "batch_size_per_replica": plan.batch_size_per_replica,
            "global_batch_size": info.global_batch_size,
            "gradient_accumulation_steps": cfg.train.gradient_accumulation_steps,
            "effective_batch_size": self.effective_batch_size,
            "gradient_clipping": gradients.clipping_of(self.optimizer),
            "ema": ema.facts(self.optimizer),
            "sync_batchnorm": self.synchronized if cfg.model.sync_batchnorm else None,
            "remat": self.remat.describe() if self.remat is not None else None,
            "steps_per_epoch": pipes.steps_per_epoch,
            "limits": {"steps_per_epoch": cfg.train.steps_per_epoch, "validation_steps": cfg.train.validation_steps,
                       "max_time_seconds": cfg.train.max_time},
            "steps_per_execution": self.per_call,
            "steps_per_execution_reason": self.per_call_reason,
            "input": self.input,
            "lr_scaling": plan.lr_scaling,
            "learning_rate": self.learning_rate,
            "lr_schedule": self.schedule.to_dict() if self.schedule is not None else None,
            "jit_compile": plan.jit_compile,
            "jit_compile_reason": plan.jit_compile_reason,
            "xla": self.xla(),
            "mixed_precision": plan.mixed_precision,
            "mixed_precision_reason": plan.mixed_precision_reason,
            "data": {
                **data.spec.to_dict(),
                "train_samples": self.train_samples,
                "validation_samples": data.validation.size if data.validation else 0,
                "test_samples": data.test.size if data.test else 0,
                "splits": {s.name: s.origin for s in data.splits()},
                "validation_is_test": data.validation_is_test,
                "normalize": cfg.data.normalize,
                **pipes.info,
            },
            "model": describe_model(self.model),
            "profile": self.profile,
            "epochs_planned": cfg.train.epochs,
            "warnings": list(plan.warnings),
            **self.transfer.facts(),
        }

    def xla(self) -> dict[str, Any]:
        """Whether the training step is really compiled with XLA, and how that is known (``summary.json``'s ``xla``;
        the first call's seconds are added when the run ends: :func:`tfgpu.training.rundir.first_call_figures`)."""
        plan = self.info.plan
        if self.cfg.train.loop == "custom" and plan.backend != "jax":
            return {"requested": plan.jit_compile, "compiled": plan.jit_compile,
                    "how_known": "the custom loop's forward and backward pass is a tf.function(jit_compile=True), "
                                 "which fails rather than run uncompiled" if plan.jit_compile
                                 else "the custom loop's step is a plain tf.function"}
        kept = bool(self.model.jit_compile)
        return {"requested": plan.jit_compile, "compiled": kept,
                "how_known": f"model.jit_compile is {kept} after Keras's compile"
                             + (" (Keras turned it off: this model cannot be compiled with XLA)"
                                if plan.jit_compile and not kept else "")}

    def banner(self) -> list[str]:
        """The lines the chief prints before training: devices, strategy, data, batches, speed choices."""
        cfg, info, data, pipes = self.cfg, self.info, self.data, self.pipes
        plan, spec = info.plan, data.spec
        lines = []
        if plan.backend == "jax":
            lines.append(f"backend: jax; JAX devices: {', '.join(info.logical_devices)}")
            lines.append("distribution: " + (f"keras.distribution.DataParallel over {', '.join(plan.strategy.devices)}"
                                             if info.strategy is not None else
                                             f"none ({', '.join(plan.strategy.devices) or 'the default device'})"))
        else:
            lines.append(f"devices: {', '.join(info.logical_devices)}")
            lines.append(f"strategy: {type(info.strategy).__name__} on "
                         f"{', '.join(plan.strategy.devices) or 'the default device'}"
                         + (f" ({plan.strategy.cross_device_ops})" if plan.strategy.cross_device_ops else "")
                         + (" of each worker" if plan.cluster else ""))
        if plan.cluster:
            lines.append(f"cluster: {plan.cluster.describe()}; sharding: {pipes.info['sharding']['policy']} "
                         f"({pipes.info['sharding']['reason']})")
        sizes = ", ".join(f"{s.name} {s.size:,}" for s in data.splits())
        what = (f"{spec.num_classes} classes" if spec.task == "classification" else "regression")
        lines.append(f"data: {spec.source}: {sizes}; input {spec.input_shape}, {what}"
                     + (" (validation = the test split)" if data.validation_is_test else "")
                     + ("" if data.validation else " (no validation data)"))
        if pipes.info.get("augment"):  # data.augment (tfgpu.data.augment)
            aug = pipes.info["augment"]
            lines.append(f"augmentation: {', '.join(aug['layers'])} on training batches only, "
                         + ("in the tf.data pipeline (CPU, parallel)" if aug["on"] == "pipeline"
                            else "in the model (training only)") + f"; seed {aug['seed']}")
        if pipes.info.get("class_weight"):  # train.class_weight (tfgpu.data.weights)
            weights, setting = pipes.info["class_weight"]["weights"], pipes.info["class_weight"]["setting"]
            lines.append(f"class weights ({setting if isinstance(setting, str) else 'given'}): "
                         + ", ".join(f"{k} {v:.4g}" for k, v in weights.items()) + " (training loss only)"
                         + (", times the sample weights" if pipes.info.get("sample_weight") else ""))
        if pipes.info.get("sample_weight"):  # data.sample_weight / data.keys.sample_weight (Split.w)
            sw = pipes.info["sample_weight"]
            lines.append(f"sample weights: {sw['source']} (min {sw['min']:.4g}, max {sw['max']:.4g}, "
                         f"mean {sw['mean']:.4g}; training loss only)")
        replicas = f"{info.num_replicas} replica{'s' if info.num_replicas != 1 else ''}"
        k = cfg.train.gradient_accumulation_steps
        lines.append(f"global batch: {plan.batch_size_per_replica} per replica x {replicas} = "
                     f"{info.global_batch_size}"
                     + (f"; x {k} accumulation steps = {self.effective_batch_size} per optimizer step" if k > 1 else "")
                     + f"; {pipes.steps_per_epoch} {'optimizer ' if k > 1 else ''}steps per epoch"
                     + (f" (train.steps_per_epoch: {cfg.train.steps_per_epoch})"
                        if cfg.train.steps_per_epoch is not None else "")
                     + f"; loop: {cfg.train.loop}; "
                     f"learning rate {self.learning_rate:g}"
                     + (f" ({plan.lr_scaling} scaling)" if plan.lr_scaling != "none" else ""))
        if self.schedule is not None:
            lines.append(f"learning-rate schedule: {self.schedule.describe()}")
        if cfg.model.sync_batchnorm:
            lines.append(f"synchronised BatchNormalization: {len(self.synchronized)} layer(s), statistics over the "
                         "global batch" + (" (on JAX they always are)" if plan.backend == "jax" else ""))
        if ema.momentum_of(self.optimizer) is not None:
            lines.append(f"EMA of the weights: momentum {ema.momentum_of(self.optimizer):g}; validation and "
                         "model.keras use the averages")
        if self.remat is not None:
            lines.append(f"rematerialisation: {len(self.remat.segments)} segments recomputed in the backward pass "
                         f"({self.remat.cuts} places to cut; activations kept after "
                         f"{', '.join(self.remat.checkpoints)})")
        clipping = gradients.clipping_of(self.optimizer)
        if clipping:
            name, value = next(iter(clipping.items()))
            own = plan.backend == "jax" or (cfg.train.loop == "fit" and gradients.overrides_train_step(self.model))
            lines.append(f"gradient clipping: {name} {value:g}, after the all-reduce"
                         + (" (Keras's optimizer)" if own else " (tfgpu's step)"))
        lines.append(f"steps per call: {self.per_call} ({self.per_call_reason})")
        xla = self.xla()
        lines.append(f"XLA: {'on' if plan.jit_compile else 'off'} ({plan.jit_compile_reason})"
                     + ("" if xla["compiled"] == plan.jit_compile else f"; but {xla['how_known']}"))
        lines.append(f"precision: {plan.mixed_precision} ({plan.mixed_precision_reason})")
        lines.extend(self.transfer.banner())
        return lines

    # Training ----------------------------------------------------------------------------------------------------

    def callbacks(self, run: Any, state: Optional[dict[str, Any]], start: ckpt.Position) -> list:
        """The learning rate, epoch statistics (into ``run.epochs``), ``metrics.csv``, TensorBoard,
        ``train.early_stopping`` and ``train.callbacks`` (:func:`tfgpu.training.callbacks.build`), the epoch's row to
        MLflow (``output.mlflow``, :func:`tfgpu.tracking.mlflow.callbacks`), the metric to a sweep's study (a trial of
        ``tfgpu sweep``, :func:`tfgpu.tracking.study.trial_callbacks`) and the checkpoint, in that order.

        ``run`` is the :class:`~tfgpu.training.rundir.RunDir`; ``state`` the checkpoint
        to restore first (``None``: a fresh start). It is restored whenever the
        run resumes, also with ``train.checkpoint`` off now (no further saves
        then). The checkpoint callback comes after ``CSVLogger`` (an epoch's row
        is written before its checkpoint; see :func:`tfgpu.training.checkpoint.checkpoint_callback`).

        Raises:
            OutputError: the checkpoint to restore is missing, damaged or does not fit the model.
        """
        import keras  # noqa: PLC0415

        at = self.transfer.unfreeze_epoch
        if state is not None and at is not None and start.epoch >= at:
            transfer.unfreeze(self)  # train.unfreeze: the checkpoint holds the second phase's optimizer
        # the rate first: the epoch statistics' rows (summary.json, the custom loop's epoch line) then hold it too
        self.telemetry = telemetry.for_run(self.cfg, self.info, self.model, self.sample, run.home)
        self.rows = run.epochs.rows
        # train.ema: validation on the averages (swapped in for on_test_begin, back for on_test_end)
        callbacks = [*ema.callbacks(self.optimizer), learning_rate_callback(self.optimizer),
                     epoch_stats_callback(self.train_samples, run.epochs, self.telemetry),
                     keras.callbacks.CSVLogger(str(run.path / "metrics.csv"), append=True)]
        if self.cfg.output.tensorboard:
            calls = tuple(self.profile["calls"]) if self.profile else 0
            callbacks.append(keras.callbacks.TensorBoard(log_dir=str(run.path / "tensorboard"), profile_batch=calls))
        built = user_callbacks.build(self.cfg, run, self.logged, self.info.is_chief,
                                     self.cfg.train.checkpoint.enabled, self.optimizer)
        if self.cfg.train.early_stopping is not None:
            self.early_stopping = built[0]
        callbacks.extend(built)  # after the CSV row and before the checkpoint (tfgpu.training.callbacks)
        callbacks.extend(tracking.callbacks(run))  # output.mlflow: the epoch's row to MLflow (tfgpu.tracking.mlflow)
        callbacks.extend(study.trial_callbacks(run, self.logged, self.info.is_chief))  # tfgpu sweep's reports
        if self.cfg.train.checkpoint.enabled or state is not None:
            files = self.files = self._files(run)
            if state is not None:
                with self.info.scope():
                    files.restore(state, run.home / ckpt.CHECKPOINT_DIR)
            if self.cfg.train.checkpoint.enabled:
                self.saver = self._checkpointing(run, files, start)
                callbacks.append(self.saver)
        return callbacks

    def _files(self, run: Any) -> Any:
        """The checkpoint files of ``train.loop`` in this process's ``RUN_DIR/checkpoint``."""
        write_dir = run.path / ckpt.CHECKPOINT_DIR
        with self.info.scope():
            if self.cfg.train.loop == "fit":
                return ckpt.FitFiles(self.model, write_dir)
            return ckpt.CustomFiles(self.model, self.optimizer, write_dir)

    def _checkpointing(self, run: Any, files: Any, start: ckpt.Position) -> Any:
        """The checkpoint callback: saves into ``files``, commits each save in ``run`` (the chief)."""
        cfg, info = self.cfg, self.info
        settings = cfg.train.checkpoint

        def on_stop(saved: dict) -> str:
            job = os.environ.get("SLURM_JOB_ID")
            return ckpt.requeue(job) if job else "no Slurm job to requeue (SLURM_JOB_ID is not set)"

        plan = ckpt.SavePlan(write_dir=files.directory, chief=info.is_chief,
                             steps_per_epoch=self.pipes.steps_per_epoch, epochs=cfg.train.epochs,
                             every_epochs=settings.every_epochs, every_steps=settings.every_steps,
                             loop=cfg.train.loop, start=start, refuse_nan=cfg.train.terminate_on_nan)
        return ckpt.checkpoint_callback(files, plan, self.stop,
                                        ckpt.agreement(info.strategy) if info.plan.num_workers > 1 else None,
                                        on_stop, run.commit if info.is_chief else None)

    def job(self) -> Job:
        """What the loop runs, as plain data."""
        cfg, pipes = self.cfg, self.pipes
        return Job(model=self.model, train_epochs=pipes.train_epochs, validation=pipes.validation,
                   epochs=cfg.train.epochs, steps_per_epoch=pipes.steps_per_epoch,
                   validation_steps=pipes.validation_steps, strategy=self.info.strategy, optimizer=self.optimizer,
                   loss=self.loss, metrics=self.metrics or [], val_metrics=self.val_metrics or [],
                   steps_per_execution=self.per_call, jit_compile=self.info.plan.jit_compile,
                   terminate_on_nan=cfg.train.terminate_on_nan, global_batch=pipes.global_batch,
                   train_blocks=pipes.train_blocks, accumulation=cfg.train.gradient_accumulation_steps,
                   forward=self.remat)

    def train(self, callbacks: list, start: ckpt.Position) -> None:
        """Train from ``start`` with ``train.loop``; stop signals are handled while it runs.

        Raises:
            Preempted: a stop signal arrived (a checkpoint was saved first).
            TrainingError: the loss became NaN or infinite (``train.terminate_on_nan``).
        """
        from .loops.custom import train_custom  # noqa: PLC0415
        from .loops.fit import train_fit  # noqa: PLC0415

        progress = progress_mode(self.cfg.train.progress) if self.info.is_chief else "none"
        # With a checkpoint to save, a stop signal waits for the next call boundary (the callback saves and
        # stops); without one it stops the run at once (tfgpu.training.checkpoint.StopSignals).
        deferred = self.stop is not None and self.saver is not None
        with (self.stop.deferred() if deferred else contextlib.nullcontext()), ema.held(self.optimizer):
            loop = train_fit if self.cfg.train.loop == "fit" else train_custom
            at, go_on = self.transfer.unfreeze_epoch, True
            if at is not None and not self.transfer.unfrozen and start.epoch < at:
                # train.unfreeze: the loop stops after epoch N (its progress counts the whole run), thaw and
                # recompile with a new optimizer, train on from N (tfgpu.model.transfer); the custom loop traces its
                # step again over the new trainable variables
                stop = transfer.stop_after(at)
                self._traced(loop(self.job(), [*callbacks, stop], progress, (start.epoch, start.step)))
                go_on = stop.reached  # else a callback (early stopping) ended the run in the first phase
                if go_on:
                    transfer.unfreeze(self)
                    start = ckpt.Position(at, 0)
            if go_on:
                self._traced(loop(self.job(), callbacks, progress, (start.epoch, start.step)))
        with self.info.scope():
            ema.finalize(self.optimizer, self.model)  # train.ema: the averages are the result (model.keras, test)
        if self.early_stopping is not None:
            self.early_stopping.finish()  # restore_best_weights: the best epoch's weights, before model.keras
        bound = input_bound(self.rows, self.cfg) if self.info.is_chief else None
        if bound is not None:
            warn(f"{bound['message']}; to feed it faster: {bound['fix']}")

    def _traced(self, counts: Optional[dict[str, int]]) -> None:
        """Add the custom loop's trace counts of one call (``fit`` returns ``None``)."""
        if counts is not None:
            self.traces = {k: (self.traces or {}).get(k, 0) + v for k, v in counts.items()}

    def save(self, path: Any) -> None:
        """Save the model to ``path`` (``keras.Model.save``: a ``.keras`` file).

        Raises:
            DiskFull: the filesystem lacks the room the save needs (checked
                first: the weights inside are HDF5, whose writer crashes when it
                runs out of space, see :func:`tfgpu.utils.files.ensure_room`).
        """
        from ..utils.files import ensure_room  # noqa: PLC0415

        ensure_room(path, ckpt.saved_bytes(self.model) + ckpt.HDF5_MARGIN)
        self.model.save(path)

    def test(self, rows: list[dict[str, float]]) -> dict[str, Any]:
        """The test split's figures, evaluated once (``test_metrics``, ``test_metrics_from``), or ``{}``.

        When validation is the test split: the last epoch's validation figures in ``rows`` (no second pass), or
        the best epoch's when ``train.early_stopping`` restored its weights.
        """
        data, pipes = self.data, self.pipes
        if pipes.test is not None:
            metrics = evaluate_split(self.model, pipes.test, pipes.test_steps)
            return {"test_metrics": {f"test_{k}": v for k, v in metrics.items()},
                    "test_metrics_from": f"model.evaluate on the test split ({data.test.origin})"
                                         + (f", its first {pipes.test_steps} batches (train.test_steps)"
                                            if self.cfg.train.test_steps is not None else "")}
        if data.validation_is_test and rows:
            es = self.early_stopping
            if es is not None and es.restored:  # the model is the best epoch's (restore_best_weights)
                row = next((r for r in rows if int(r["epoch"]) == es.best_epoch), rows[-1])
                return {"test_metrics": {f"test_{k[4:]}": v for k, v in row.items() if k.startswith("val_")},
                        "test_metrics_from": f"the validation of the best epoch ({es.best_epoch + 1}, "
                                             "train.early_stopping restored it), which is the test split"}
            return {"test_metrics": {f"test_{k[4:]}": v for k, v in rows[-1].items() if k.startswith("val_")},
                    "test_metrics_from": "the last epoch's validation, which is the test split"
                                         + (f" (its first {pipes.validation_steps} batches: train.validation_steps)"
                                            if self.cfg.train.validation_steps is not None else "")}
        return {}

    def outcome(self) -> dict[str, Any]:
        """What ``summary.json`` records of the training itself when the run ends (however it ends).

        ``final_metrics_epoch`` (counted from 1) when ``train.early_stopping`` restored the best epoch's weights:
        :meth:`~tfgpu.training.rundir.RunDir.finish` takes ``final_metrics`` from that epoch's row.
        """
        fields: dict[str, Any] = {}
        if self.telemetry is not None:
            fields["telemetry"] = {**self.telemetry.close(), "input_bound": input_bound(self.rows, self.cfg)}
        if self.traces is not None:
            fields["traces"] = self.traces
        if self.early_stopping is not None:
            fields["early_stopping"] = self.early_stopping.record()
            if self.early_stopping.restored:  # the model is the best epoch's: final_metrics are its figures
                fields["final_metrics_epoch"] = self.early_stopping.best_epoch + 1
        if self.saver is not None:
            saves = self.saver.saves
            fields["checkpoint"] = {"saves": len(saves),
                                          "save_seconds_median": statistics.median(saves) if saves else None,
                                          "save_seconds_max": max(saves) if saves else None}
        return fields
