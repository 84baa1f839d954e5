"""``tfgpu bench input RECIPE``: can the input pipeline feed the model's step?

Two figures from the recipe as ``tfgpu run`` would train it (its devices, strategy, data and model):

1. **The pipeline alone**: the training dataset of global batches (``tfgpu.data.pipeline``: shuffle, decode, cache,
   augment, batch, prefetch) read on the host with no model, ``steps`` batches timed in its first pass (decoding;
   the cache filling) and in its second (what every later epoch costs). The first pass is read to its end, so a
   ``data.cache`` is complete before the second.
2. **The model's step on a staged batch**: one global batch of that pipeline held in memory
   (``tf.data.Dataset.from_tensors(batch).repeat()``) and trained on by the recipe's own loop (``fit`` or
   ``custom``, its strategy and steps per call) for two epochs of ``steps`` steps; the second epoch's samples/s.
   No input work is left in it, so it is the rate the model could train at if input cost nothing.

The verdict (:func:`verdict`) predicts the share of training time input would take: with GPUs the two run side
by side and training waits ``1 - pipeline/step`` of the time when the pipeline is slower; without GPUs they share
the CPU cores and their times add up, so input takes ``step / (pipeline + step)``. **Input-bound** at 10 % or more,
the threshold of the input wait ``tfgpu run`` measures from the inside each epoch (``input_wait_percent``,
:mod:`tfgpu.training.telemetry`); else **compute-bound**. On 2 CPU cores the prediction for an augmenting image
folder was 41-50 % and the run measured 43-44 % (docs/runs.md, "Where the time goes").
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..errors import ConfigError
from ..utils.console import table_lines

@dataclass(frozen=True)
class InputBench:
    """What :func:`bench_input` measured (samples/s are training samples per second, all replicas).

    Attributes:
        recipe: the recipe's path (or ``None``: the defaults); loop: ``fit`` or ``custom``.
        global_batch: rows per global batch; replicas: the replicas the step runs on; gpus: GPUs used.
        steps: batches timed in each measurement.
        pipeline_first: samples/s of the pipeline's first pass (decoding, filling a cache).
        pipeline_first_pass_seconds: the whole first pass, seconds.
        pipeline_steady: samples/s of its second pass.
        step: samples/s of the model's step on a staged batch.
        input_percent: the predicted share of training time spent on input; expected: the predicted samples/s.
        verdict: ``input-bound`` or ``compute-bound``; message and fix: in words.
    """

    recipe: Optional[str]
    loop: str
    global_batch: int
    replicas: int
    gpus: int
    steps: int
    pipeline_first: float
    pipeline_first_pass_seconds: float
    pipeline_steady: float
    step: float
    input_percent: float
    expected: float
    verdict: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _read(iterator: Any, count: int) -> float:
    """Seconds to read ``count`` elements of ``iterator`` (an eager ``tf.data`` iterator: each ``next`` returns
    the element made)."""
    began = time.perf_counter()
    for _ in range(count):
        next(iterator)
    return time.perf_counter() - began


def verdict(pipeline: float, step: float, gpus: int) -> tuple[str, str, float, float]:
    """``(verdict, message, input share %, expected samples/s)`` for a pipeline of ``pipeline`` samples/s feeding a
    step of ``step`` samples/s.

    With GPUs the pipeline (on the CPU) and the step (on the GPUs) run at the same time, so training runs at the
    slower of the two and waits for input ``1 - pipeline/step`` of the time when the pipeline is the slower. Without
    GPUs both run on the same CPU cores, so their work adds up: a sample costs ``1/pipeline + 1/step`` seconds of
    the cores, training runs at ``1 / (1/pipeline + 1/step)`` and input takes ``step / (pipeline + step)`` of the
    time. Input-bound: that share is :data:`tfgpu.training.telemetry.INPUT_BOUND_PERCENT` or more, the threshold of
    the input wait ``tfgpu run`` measures.
    """
    from .telemetry import INPUT_BOUND_PERCENT  # noqa: PLC0415

    if gpus:
        share = max(0.0, 100.0 * (1.0 - pipeline / step)) if step > 0 else 0.0
        expected = min(pipeline, step)
        how = "the pipeline runs on the CPU beside the step on the GPUs"
    else:
        share = 100.0 * step / (pipeline + step) if pipeline + step > 0 else 0.0
        expected = 1.0 / (1.0 / pipeline + 1.0 / step) if pipeline > 0 and step > 0 else 0.0
        how = "the pipeline and the step share the CPU cores, so their times add up"
    name = "input-bound" if share >= INPUT_BOUND_PERCENT else "compute-bound"
    return name, (f"{name}: input would take about {share:.0f} % of the training time ({how}); expect about "
                  f"{expected:,.0f} samples/s"), share, expected


def fixes(cfg: Any) -> str:
    """The recipe keys that feed the step faster, for ``cfg``."""
    items = []
    if cfg.data.cache is False:
        items.append("data.cache: true (decode once)")
    if cfg.data.augment and cfg.data.augment_on == "pipeline":
        items.append("data.augment_on: model (augment on the device, inside the model)")
    items.append("a larger train.batch_size_per_replica (fewer, larger batches per second to make)")
    items.append("more CPU cores for tf.data, or fewer for the model (tensorflow.intra_op_threads)")
    return "; ".join(items)


def bench_input(recipe: Optional[str], overrides: Sequence[str] = (), steps: int = 50) -> InputBench:
    """Time the recipe's input pipeline alone and its model's step on a staged batch (module docstring).

    Args:
        recipe: a recipe path, or ``None`` for the defaults; overrides: ``--set`` items.
        steps: batches timed in each measurement (at most an epoch's).

    Returns:
        An :class:`InputBench`.

    Raises:
        ConfigError: a bad recipe, ``backend: jax`` or several workers (one process times one machine);
        DataError, DeviceError: as ``tfgpu run``.
    """
    import tensorflow as tf  # noqa: PLC0415

    from ..config import load_config  # noqa: PLC0415
    from ..data import load  # noqa: PLC0415
    from ..devices.setup import setup  # noqa: PLC0415
    from . import batch_finder, preflight  # noqa: PLC0415
    from .loops import epoch_stats_callback  # noqa: PLC0415
    from .loops.custom import train_custom  # noqa: PLC0415
    from .loops.fit import train_fit  # noqa: PLC0415
    from .runner import run_seed  # noqa: PLC0415
    from .trainer import Trainer  # noqa: PLC0415

    cfg = load_config(recipe, overrides=overrides)
    if cfg.backend == "jax":
        raise ConfigError("backend: jax (received jax): tfgpu bench input times TensorFlow's input pipeline against "
                          "the TensorFlow loops' step; on JAX, Keras's JAX trainer reads NumPy batches itself, which "
                          "tfgpu does not time.",
                          "time the same recipe on TensorFlow with --set backend=tensorflow, or compare a JAX run's "
                          "samples_per_second and host_cpu_percent (metrics.csv) with and without data.augment.")
    if cfg.distribute.strategy == "multi_worker_mirrored":
        raise ConfigError("distribute.strategy: multi_worker_mirrored (received multi_worker_mirrored): tfgpu bench "
                          "input times one machine's pipeline and step, in one process.",
                          "run it on one of the workers' machines with --set distribute.strategy=auto.")
    source, _ = preflight.check(cfg, None)
    cfg, _ = batch_finder.resolved(cfg)  # train.batch_size_per_replica: auto (the cache, or trials)
    info = setup(cfg)  # TensorFlow's start-up lines held back, as the other benchmarks do
    data, pipes = load(cfg, info, source, seed=run_seed(cfg, info, None))
    steps = max(1, min(steps, pipes.steps_per_epoch))
    global_batch = info.global_batch_size

    # 1. the pipeline alone: the first pass read to its end (a cache completes), the second timed
    iterator = iter(pipes.train_epochs(2, 0))
    began = time.perf_counter()
    first_batch = next(iterator)
    warm = time.perf_counter()
    timed_first = _read(iterator, min(steps, pipes.steps_per_epoch - 1)) if pipes.steps_per_epoch > 1 else 0.0
    first_rate = (min(steps, pipes.steps_per_epoch - 1) * global_batch / timed_first if timed_first > 0
                  else global_batch / max(warm - began, 1e-9))
    _read(iterator, max(0, pipes.steps_per_epoch - 1 - steps))
    first_pass = time.perf_counter() - began
    steady = steps * global_batch / _read(iterator, steps)

    # 2. the model's step on one staged global batch, by the recipe's own loop
    staged = tf.data.Dataset.from_tensors(first_batch).repeat()
    trainer = Trainer(cfg, info, data, pipes)
    job = dataclasses.replace(trainer.job(), train_epochs=lambda epochs, skip, *_: staged, validation=None,
                              validation_steps=0, epochs=2, steps_per_epoch=steps, train_blocks=False)
    stats = epoch_stats_callback(steps * global_batch)
    (train_fit if cfg.train.loop == "fit" else train_custom)(job, [stats], "none")
    step = stats.rows[-1]["samples_per_second"]

    gpus = len(info.plan.gpus)
    name, message, share, expected = verdict(steady, step, gpus)
    return InputBench(recipe, cfg.train.loop, global_batch, info.num_replicas, gpus, steps, first_rate, first_pass,
                      steady, step, share, expected, name, message, fixes(cfg) if name == "input-bound" else "")


def describe(result: InputBench) -> str:
    """The table ``tfgpu bench input`` prints."""
    rows = [("pipeline alone, first pass", f"{result.pipeline_first:,.0f}",
             f"whole pass {result.pipeline_first_pass_seconds:.2f} s"),
            ("pipeline alone, second pass", f"{result.pipeline_steady:,.0f}", "what every later epoch costs"),
            (f"model step on a staged batch ({result.loop})", f"{result.step:,.0f}",
             f"{result.replicas} replica(s), no input work")]
    lines = [f"tfgpu bench input {result.recipe or '(defaults)'}: global batch {result.global_batch}, "
             f"{result.steps} batches timed each"]
    lines += ["  " + line for line in table_lines(("measurement", "samples/s", ""), rows, right=(False, True))]
    lines.append(f"verdict: {result.message}.")
    if result.fix:
        lines.append(f"to feed it faster: {result.fix}.")
    return "\n".join(lines)
