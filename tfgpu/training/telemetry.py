"""Seeing the devices work: each epoch's device statistics, input wait and model FLOPs utilisation (MFU).

Every run records, per epoch, in ``metrics.csv`` (so also TensorBoard, MLflow and ``tfgpu runs``/``compare``):

- ``input_wait_seconds`` / ``input_wait_percent``: the time the training step waited for its next batch, summed
  over the epoch's steps, and its share of ``train_seconds``. Measured inside the training call: ``tf.timestamp()``
  before and after each ``get_next`` of the input iterator (:func:`tfgpu.training.loops.replica_batches.steps_function`,
  both loops); a prefetched batch costs microseconds, a batch the pipeline has not made yet costs the wait. Not
  measured where Keras's own training function runs (``fit`` with several workers; ``backend: jax``).
- ``mfu_percent``: the model's training FLOPs per sample (:func:`step_flops`: the matmuls and convolutions of
  the traced forward and backward pass) x samples/s over the devices' peak FLOP/s (:func:`peak`: the GPU table in
  :mod:`tfgpu.devices.peaks`, or this CPU's ``tfgpu bench matmul`` figure).
- ``host_cpu_percent``, ``host_rss_mib`` and, with GPUs, ``gpu_utilization_percent`` (mean over the GPUs),
  ``gpu_memory_peak_mib`` (the largest, TensorFlow's own peak where it has one), ``gpu_power_w`` (summed),
  ``gpu_temperature_c`` (the highest): :class:`tfgpu.devices.monitor.DeviceMonitor`, sampled 4 times a second.
  Per GPU in ``device_stats.csv`` beside ``metrics.csv`` (another worker's GPUs: ``device_stats.worker-<i>.csv``
  there; ``metrics.csv``'s columns are the chief's).

A run whose median epoch waits for input 10 % of its training time or more gets an "input-bound" finding naming
the recipe keys that feed the step faster (:func:`input_bound`).
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any, Callable, Optional

from .loops import TELEMETRY

#: An epoch whose input wait is at least this share (%) of its training time is input-bound.
INPUT_BOUND_PERCENT = 10.0
#: The per-epoch columns this module adds (:data:`tfgpu.training.loops.TELEMETRY`).
COLUMNS = TELEMETRY
DEVICE_STATS_FILE = "device_stats.csv"
DEVICE_STATS_COLUMNS = ("epoch", "worker", "nvml_index", "name", "utilization_percent", "memory_used_mib", "memory_peak_mib",
                        "memory_total_mib", "power_w", "temperature_c", "samples")


#: Operations whose FLOPs :func:`step_flops` counts: the multiply-adds of matmuls and convolutions (2 FLOPs each).
COUNTED_OPS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv2DBackpropInput",
               "Conv2DBackpropFilter", "Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
               "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter")


def _size(shape: Any) -> int:
    dims = shape.as_list()
    if any(d is None for d in dims):
        raise ValueError(f"a shape is not fully known: {shape}")
    product = 1
    for d in dims:
        product *= d
    return product


def op_flops(op: Any) -> int:
    """FLOPs of one graph operation of :data:`COUNTED_OPS` (0 for any other): 2 per multiply-add.

    MatMul ``2 m n k`` (``BatchMatMul``: times the batch); a convolution ``2 x output elements x kernel volume x
    input channels per output channel``; each backprop op as its forward convolution (its ``out_backprop`` is
    the forward output), which is also what TensorFlow's cuDNN kernels do. (TensorFlow's own profiler registry
    counts a backprop op over the *input's* positions, which overstates a ``valid`` convolution.)
    """
    kind = op.type
    if kind == "MatMul":
        a, b = op.inputs[0].shape, op.inputs[1].shape
        m = a[1] if op.get_attr("transpose_a") else a[0]
        k = a[0] if op.get_attr("transpose_a") else a[1]
        n = b[0] if op.get_attr("transpose_b") else b[1]
        return 2 * int(m) * int(n) * int(k)
    if kind.startswith("BatchMatMul"):
        out = op.outputs[0].shape
        a = op.inputs[0].shape
        adj_x = op.get_attr("adj_x")
        k = a[-2] if adj_x else a[-1]
        return 2 * _size(out) * int(k)
    if kind in ("Conv2D", "Conv3D", "DepthwiseConv2dNative"):
        out, kernel = op.outputs[0].shape, op.inputs[1].shape
    elif "BackpropInput" in kind:
        out, kernel = op.inputs[2].shape, op.inputs[1].shape  # (input_sizes, filter, out_backprop)
    elif "BackpropFilter" in kind:
        out, kernel = op.inputs[2].shape, op.outputs[0].shape  # (input, filter_sizes, out_backprop) -> filter
    else:
        return 0
    volume = _size(kernel[:-1])  # kh x kw (x kd) x input channels (per group)
    if kind.startswith("Depthwise"):
        volume = _size(kernel[:-2])  # each output channel sees one input channel
    return 2 * _size(out) * volume


def _live_ops(graph: Any) -> list:
    """The operations ``graph``'s outputs depend on (a gradient nobody asked for, e.g. of the input, is left out:
    TensorFlow prunes it before running)."""
    seen: set = set()
    stack = [t.op for t in graph.outputs]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return [op for op in graph.get_operations() if op.name in seen]


def step_flops(model: Any, loss: Any, x: Any, y: Any, batch: int) -> tuple[Optional[float], str]:
    """Model FLOPs of one training step on a batch of ``batch`` rows like ``x``/``y`` (a replica's batch).

    The forward pass with ``training=True``, the loss and the gradients of the trainable weights are traced into
    one graph (``tf.function(...).get_concrete_function``: nothing runs), under ``strategy.run`` (a
    MirroredVariable is read in a replica's context only; the count is divided by the local replicas). The
    operations the gradients depend on are summed with :func:`op_flops`: matmuls and convolutions, forward and
    backward, 2 FLOPs per multiply-add. Element-wise operations, pooling, normalisation and the optimizer's update
    are not counted, as in the usual MFU (Chowdhery et al. 2022, PaLM, appendix B): a few percent of a CNN's or a
    transformer's work.

    Args:
        model: the built ``keras.Model`` (call it in the strategy's scope); loss: a Keras loss; x, y: sample rows
            (NumPy arrays ``(n, ...)``: their shapes past the first axis and dtypes); batch: the rows counted.

    Returns:
        ``(FLOPs, how they were counted)``, or ``(None, why not)`` when the graph cannot be traced, has a shape
        that is not fully known, or holds no matmul or convolution.

    Wraps: https://www.tensorflow.org/api_docs/python/tf/function (``get_concrete_function``) and
    https://www.tensorflow.org/api_docs/python/tf/GradientTape
    """
    import tensorflow as tf  # noqa: PLC0415

    try:
        specs = [tf.TensorSpec((batch, *v.shape[1:]), tf.as_dtype(v.dtype)) for v in (x, y)]

        def forward_backward(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                value = loss(y, model(x, training=True))
            return tape.gradient(value, model.trainable_variables)

        strategy = tf.distribute.get_strategy()
        graph = tf.function(lambda x, y: strategy.run(forward_backward, args=(x, y)),
                            autograph=False).get_concrete_function(*specs).graph
        counted = sum(op_flops(op) for op in _live_ops(graph) if op.type in COUNTED_OPS)
        replicas = (len(strategy.extended.worker_devices)
                    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                    else strategy.num_replicas_in_sync)
        counted /= replicas
    except Exception as exc:  # noqa: BLE001 - MFU is a figure, never a reason for a run to fail
        return None, f"not counted: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not counted:
        return None, "not counted: the step has no matmul or convolution"
    return float(counted), ("matmuls and convolutions of the traced forward + backward pass, 2 FLOPs per "
                            "multiply-add (tfgpu.training.telemetry.step_flops)")


def jax_step_flops(model: Any, loss: Any, x: Any, y: Any, batch: int) -> tuple[Optional[float], str]:
    """:func:`step_flops` on ``backend: jax``: XLA's own count. The loss of ``model.stateless_call`` and its gradient
    (``jax.grad``) are lowered for a batch of ``batch`` rows (``jax.jit(...).lower``: nothing compiles or runs) and
    XLA's HLO cost analysis gives the FLOPs (``Lowered.cost_analysis()["flops"]``). It counts element-wise
    operations too: 1 % above the matmul-and-convolution count on a Dense and two Conv2D layers
    (tests/training/test_telemetry.py).

    Wraps: https://docs.jax.dev/en/latest/aot.html and https://keras.io/api/models/model/#statelesscall-method
    """
    import jax  # noqa: PLC0415

    try:
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]

        def loss_of(trainable: Any, non_trainable: Any, x: Any, y: Any) -> Any:
            pred, _ = model.stateless_call(trainable, non_trainable, x, training=True)
            return loss(y, pred)

        specs = [jax.ShapeDtypeStruct((batch, *v.shape[1:]), v.dtype) for v in (x, y)]
        analysis = jax.jit(jax.grad(loss_of)).lower(trainable, non_trainable, *specs).cost_analysis()
        analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
        counted = float(analysis["flops"])
    except Exception as exc:  # noqa: BLE001 - a figure, never a reason for a run to fail
        return None, f"not counted: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not counted:
        return None, "not counted: XLA's cost analysis gave 0"
    return counted, "XLA's HLO cost analysis of the lowered loss gradient (jax.jit(...).lower(...).cost_analysis())"


def peak(plan: Any, tf32: bool) -> tuple[Optional[float], str]:
    """The peak FLOP/s of one worker's devices, and where it comes from.

    GPUs: the sum over the worker's physical GPUs of :func:`tfgpu.devices.peaks.peak_flops` at the run's precision
    (``float32`` counts TensorFloat-32 when it is on, TensorFlow's default on Ampere and newer); a GPU not in the
    table or a MIG instance (a share of a GPU's SMs) gives ``None``. CPU: this CPU's ``tfgpu bench matmul`` figure
    (:func:`tfgpu.devices.bench.cpu_peak_flops`; the logical CPU devices share it), measured once when none is
    recorded.
    """
    if plan.gpus:
        from ..devices.peaks import peak_flops  # noqa: PLC0415

        total, sources = 0.0, set()
        for gpu in {g.nvml_index: g for g in plan.gpus}.values():
            if getattr(gpu, "is_mig", False):
                return None, f"{gpu.name} is a MIG instance: no peak table for a share of a GPU"
            found = peak_flops(gpu.name, plan.mixed_precision, tf32=tf32)
            if found is None:
                return None, f"{gpu.name} is not in tfgpu's peak table (tfgpu/devices/peaks.py)"
            total += found[0]
            sources.add(found[1])
        return total, "; ".join(sorted(sources))
    from ..devices.bench import cpu_peak_flops  # noqa: PLC0415

    return cpu_peak_flops()


class Telemetry:
    """One process's per-epoch figures (the epoch statistics callback calls it).

    Args:
        monitor: a started :class:`tfgpu.devices.monitor.DeviceMonitor`, or ``None``.
        flops_per_sample: training FLOPs per sample (:func:`step_flops` / replica batch), or ``None``.
        peak_flops: the devices' peak FLOP/s over all workers, or ``None``.
        tf_gpus: TensorFlow's logical GPU devices of this process, each with its physical GPU's NVML index
            (``((0, "GPU:0"), (0, "GPU:1"), (1, "GPU:2"))``), for ``get_memory_info``'s peak (summed per GPU).
        stats_path: where this process's ``device_stats.csv`` goes (with GPUs), or ``None``.
        facts: what ``summary.json`` records about how the figures were made.
        worker: this process's worker index (the ``worker`` column of ``device_stats.csv``).

    Attributes:
        input_wait: ``() -> seconds``, the cumulative input wait of the training function (set by the loop when
            its training function measures it), or ``None``.
    """

    def __init__(self, monitor: Any = None, flops_per_sample: Optional[float] = None,
                 peak_flops: Optional[float] = None, tf_gpus: tuple[tuple[int, str], ...] = (),
                 stats_path: Optional[Path] = None, facts: Optional[dict[str, Any]] = None, worker: int = 0) -> None:
        self.monitor = monitor
        self.flops_per_sample = flops_per_sample
        self.peak_flops = peak_flops
        self.tf_gpus = tf_gpus
        self.stats_path = stats_path
        self.worker = worker
        self.facts = dict(facts or {})
        self.input_wait: Optional[Callable[[], float]] = None
        self._waited = 0.0
        self._sampling = 0.0
        self._seconds = 0.0

    def begin_epoch(self) -> None:
        """Start an epoch: TensorFlow's per-GPU memory peak is reset (``tf.config.experimental.reset_memory_stats``)."""
        if self.tf_gpus:
            import tensorflow as tf  # noqa: PLC0415

            for _, device in self.tf_gpus:
                try:
                    tf.config.experimental.reset_memory_stats(device)
                except (ValueError, RuntimeError):
                    pass
        if self.input_wait is not None:
            self._waited = self.input_wait()

    def _tf_peaks(self) -> dict[int, float]:
        """TensorFlow's peak memory this epoch per physical GPU (NVML index), MiB: its logical devices' summed."""
        if not self.tf_gpus:
            return {}
        import tensorflow as tf  # noqa: PLC0415

        peaks: dict[int, float] = {}
        for nvml_index, device in self.tf_gpus:
            try:
                peak_mib = tf.config.experimental.get_memory_info(device)["peak"] / 2**20
            except (ValueError, RuntimeError):
                continue
            peaks[nvml_index] = peaks.get(nvml_index, 0.0) + peak_mib
        return peaks

    def end_epoch(self, epoch: int, logs: dict[str, Any], train_seconds: float, samples: int) -> None:
        """Add the epoch's :data:`COLUMNS` to ``logs`` (those this process can measure) and its rows to
        ``device_stats.csv``."""
        if self.input_wait is not None:
            now = self.input_wait()
            waited, self._waited = max(0.0, now - self._waited), now
            logs["input_wait_seconds"] = waited
            logs["input_wait_percent"] = 100.0 * waited / train_seconds if train_seconds > 0 else 0.0
        if self.flops_per_sample and self.peak_flops and train_seconds > 0:
            logs["mfu_percent"] = 100.0 * self.flops_per_sample * samples / train_seconds / self.peak_flops
        if self.monitor is None:
            return
        stats = self.monitor.take()
        self._sampling += stats.sampling_seconds
        self._seconds += stats.seconds
        logs["host_cpu_percent"] = stats.host_cpu_percent
        logs["host_rss_mib"] = stats.host_rss_mib
        if not stats.gpus:
            return
        tf_peaks = self._tf_peaks()
        rows = []
        for gpu in stats.gpus:
            rows.append({"epoch": epoch, "worker": self.worker, "nvml_index": gpu.nvml_index, "name": gpu.name,
                         "utilization_percent": gpu.utilization_percent, "memory_used_mib": gpu.memory_used_mib,
                         "memory_peak_mib": tf_peaks.get(gpu.nvml_index, ""), "memory_total_mib": gpu.memory_total_mib,
                         "power_w": "" if gpu.power_w is None else gpu.power_w,
                         "temperature_c": "" if gpu.temperature_c is None else gpu.temperature_c,
                         "samples": gpu.samples})
        logs["gpu_utilization_percent"] = statistics.fmean(g.utilization_percent for g in stats.gpus)
        logs["gpu_memory_peak_mib"] = max([*tf_peaks.values()] or [g.memory_used_mib for g in stats.gpus])
        power = [g.power_w for g in stats.gpus if g.power_w is not None]
        if power:
            logs["gpu_power_w"] = sum(power)
        temperatures = [g.temperature_c for g in stats.gpus if g.temperature_c is not None]
        if temperatures:
            logs["gpu_temperature_c"] = max(temperatures)
        if self.stats_path is not None:
            new = not self.stats_path.exists()
            with open(self.stats_path, "a", newline="") as f:
                writer = csv.DictWriter(f, DEVICE_STATS_COLUMNS)
                if new:
                    writer.writeheader()
                writer.writerows(rows)

    def close(self) -> dict[str, Any]:
        """Stop the monitor; what ``summary.json`` records under ``telemetry``."""
        if self.monitor is not None:
            self.monitor.stop()
            self.facts["sampling_seconds"] = round(self._sampling, 6)
            self.facts["sampling_percent_of_training"] = (round(100.0 * self._sampling / self._seconds, 4)
                                                          if self._seconds else None)
        return self.facts


def stats_file(info: Any) -> str:
    """This process's ``device_stats`` file name: ``device_stats.csv`` for the chief, ``device_stats.worker-<i>.csv``
    for another worker (all in the chief's run directory, so every worker's GPUs are kept)."""
    return DEVICE_STATS_FILE if info.is_chief else f"device_stats.worker-{info.cluster.worker_index}.csv"


def for_run(cfg: Any, info: Any, model: Any, sample: tuple[Any, Any], run_home: Path) -> Telemetry:
    """A run's :class:`Telemetry`: the device monitor started on the worker's GPUs (NVML indices from the plan), the
    step's FLOPs counted (:func:`step_flops`, :func:`jax_step_flops` on JAX) and the devices' peak found
    (:func:`peak`; on JAX without GPUs only a CPU figure ``tfgpu bench matmul`` recorded: a JAX run does not start
    TensorFlow to measure one).

    Args:
        cfg: the run's config; info: its :class:`tfgpu.Setup`; model: the compiled model; sample: two training rows
            ``(x, y)`` as the pipeline gives them; run_home: the chief's run directory (the device statistics of
            every worker go there: :func:`stats_file`).
    """
    from ..devices.monitor import DeviceMonitor  # noqa: PLC0415
    from ..model.keras_model import make_loss  # noqa: PLC0415

    plan = info.plan
    # in TensorFlow's order (CUDA_VISIBLE_DEVICES may reorder them), each physical GPU once (MIG instances: theirs)
    indices = list(dict.fromkeys(g.nvml_index for g in plan.gpus if g.nvml_index is not None))
    monitor = DeviceMonitor(indices).start()
    facts: dict[str, Any] = {"monitor_interval_seconds": monitor.interval, "gpus_monitored": monitor.gpus,
                             "device_stats_file": stats_file(info) if monitor.gpus else None}
    batch = plan.batch_size_per_replica
    if plan.backend == "jax":
        from ..devices.peaks import read_cpu_peak  # noqa: PLC0415

        flops, how = jax_step_flops(model, make_loss(cfg.model.loss), *sample, batch)
        # float32 matmuls on GPUs run at TensorFloat-32 in JAX by default too
        found = peak(plan, True) if plan.gpus else (
            read_cpu_peak() or (None, "no CPU figure recorded: run 'tfgpu bench matmul' once"))
    else:
        import tensorflow as tf  # noqa: PLC0415

        with info.scope():
            flops, how = step_flops(model, make_loss(cfg.model.loss), *sample, batch)
        found = peak(plan, bool(tf.config.experimental.tensor_float_32_execution_enabled()))
    per_worker, source = found
    facts.update({"flops_per_replica_step": flops, "flops_per_sample": flops / batch if flops else None,
                  "flops_counted_by": how, "peak_flops_per_worker": per_worker, "peak_source": source,
                  "workers": plan.num_workers})
    per_gpu = max(1, cfg.devices.gpu_logical_devices)
    logical = sum("GPU" in d.upper() for d in info.logical_devices) if plan.backend != "jax" else 0
    tf_gpus = tuple((plan.gpus[i // per_gpu].nvml_index, f"GPU:{i}") for i in range(logical)
                    if i // per_gpu < len(plan.gpus) and plan.gpus[i // per_gpu].nvml_index is not None)
    return Telemetry(monitor, flops / batch if flops else None, per_worker * plan.num_workers if per_worker else None,
                     tf_gpus, run_home / stats_file(info) if monitor.gpus else None,
                     facts, info.cluster.worker_index if info.cluster is not None else 0)


def input_bound(rows: list[dict[str, Any]], cfg: Any) -> Optional[dict[str, Any]]:
    """The input-bound finding for a run's epoch rows, or ``None``: the median ``input_wait_percent`` of the epochs
    after the first (the first traces) at :data:`INPUT_BOUND_PERCENT` or more.

    Returns:
        ``{"input_wait_percent": median, "message": ..., "fix": ...}``; the fix names the recipe keys that apply to
        ``cfg`` (``data.cache``, ``data.augment_on``, ``tensorflow.inter_op_threads``...).
    """
    waits = [float(r["input_wait_percent"]) for r in rows if r.get("input_wait_percent") not in (None, "")]
    waits = waits[1:] if len(waits) > 1 else waits
    if not waits:
        return None
    median = statistics.median(waits)
    if median < INPUT_BOUND_PERCENT:
        return None
    fixes = []
    data = cfg.data
    if not getattr(data, "cache", True):
        fixes.append("data.cache: true (decode once, read from memory after the first epoch)")
    if getattr(data, "augment", None) and getattr(data, "augment_on", "pipeline") == "pipeline":
        fixes.append("data.augment_on: model (augment on the device, in the model)")
    fixes.append("check the pipeline alone with 'tfgpu bench input RECIPE'")
    fixes.append("give tf.data more threads: fewer tensorflow.intra_op_threads for the model, or more cores")
    return {"input_wait_percent": round(median, 1),
            "message": f"input-bound: the training step waited for its next batch {median:.0f} % of its time "
                       f"(median over epochs; {INPUT_BOUND_PERCENT:g} % or more is input-bound)",
            "fix": "; ".join(fixes)}

