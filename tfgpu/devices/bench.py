"""Timing exercises from the d2l.ai "GPUs" chapter, so users can time their own hardware.

Three benchmarks, each a function that returns plain data (``tfgpu bench`` prints it):

- :func:`bench_matmul`: float32 ``n x n`` matrix multiplication on each logical device:
  median milliseconds per matmul and GFLOP/s (``2 n^3`` floating-point operations each).
- :func:`bench_logging`: 1000 small matmuls whose Frobenius norms are logged either to the
  host at every step (one device-to-host transfer per step) or kept on the device and
  transferred once at the end.
- :func:`bench_devices`: the same independent matmuls run in sequence on one device, then
  one per device, launched together so they can run concurrently.

Apply the device settings first (:func:`configure`, i.e. :func:`tfgpu.setup`), then call
these; they import TensorFlow. Each timed call ends by reading a result back to the host
(``Tensor.numpy()``), so asynchronous GPU execution is waited for, and each is run once
untimed first (tracing, kernel selection, allocation). Times are wall-clock
(``time.perf_counter``); the reported value is the median over the repeats, with the min
and max beside it.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ..errors import ConfigError, DeviceError
from ..utils.console import table_lines

DEFAULT_SIZES = (256, 512, 1024, 2048)
MAX_SIZE = 65536
"""Largest matrix side accepted (a 65536 x 65536 float32 matrix is 16 GiB)."""
TARGET_SECONDS = 0.05
"""Aim for timed calls of about this long: chains of matmuls are lengthened up to it."""
MAX_CHAIN = 100
"""Most matmuls chained in one timed call (they are unrolled into one graph)."""

# ------------------------------------------------------------------------ data


@dataclass(frozen=True)
class Timing:
    """Wall-clock times of repeated runs of one measurement.

    Attributes:
        times_ms: one time per repeat, milliseconds.
    """

    times_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def max_ms(self) -> float:
        return max(self.times_ms)

    def to_dict(self) -> dict[str, Any]:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms,
                "times_ms": list(self.times_ms)}


@dataclass(frozen=True)
class MatmulRow:
    """One device and size of :func:`bench_matmul`.

    Attributes:
        device: the logical device, e.g. ``"/device:GPU:0"``.
        size: ``n``: both operands are ``(n, n)`` float32.
        matmuls_per_call: matmuls chained in each timed call (times are divided by it).
        per_matmul: time per matmul, milliseconds (each repeat's call time / matmuls_per_call).
        gflops: ``2 n^3 / median time``, in GFLOP/s (10^9 floating-point operations per second).
    """

    device: str
    size: int
    matmuls_per_call: int
    per_matmul: Timing

    @property
    def gflops(self) -> float:
        return 2.0 * self.size ** 3 / (self.per_matmul.median_ms * 1e-3) / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "size": self.size, "matmuls_per_call": self.matmuls_per_call,
                **self.per_matmul.to_dict(), "gflops": self.gflops}


@dataclass(frozen=True)
class LoggingVariant:
    """One way of logging the norms in :func:`bench_logging`.

    Attributes:
        name: ``"host"``, ``"device_eager"`` or ``"device_function"``.
        description: what it does, in a few words.
        transfers: device-to-host transfers per run (``steps`` or 1).
        timing: time per run of all the steps, milliseconds.
        steps: steps per run.
        norms: the logged Frobenius norms, ``steps`` floats.
    """

    name: str
    description: str
    transfers: int
    timing: Timing
    steps: int
    norms: tuple[float, ...] = field(repr=False)

    @property
    def steps_per_second(self) -> float:
        return self.steps / (self.timing.median_ms * 1e-3)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "transfers": self.transfers,
                **self.timing.to_dict(), "steps_per_second": self.steps_per_second}


@dataclass(frozen=True)
class LoggingResult:
    """The result of :func:`bench_logging`.

    Attributes:
        device: the logical device the steps ran on.
        steps: matmuls per run.
        size: ``n`` of the ``(n, n)`` float32 matrices.
        variants: host first, then the on-device variants.
        norms_agree: every variant logged the same norms as the host variant
            (``numpy.allclose``, rtol 1e-4).
        max_relative_difference: largest ``|norm - host norm| / host norm``.
    """

    device: str
    steps: int
    size: int
    variants: tuple[LoggingVariant, ...]
    norms_agree: bool
    max_relative_difference: float

    @property
    def host(self) -> LoggingVariant:
        return self.variants[0]

    @property
    def ratio(self) -> float:
        """Host time / on-device (``tf.function``) time: how much faster logging on the device is."""
        return self.host.timing.median_ms / self.variants[-1].timing.median_ms

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "steps": self.steps, "size": self.size,
                "variants": [v.to_dict() for v in self.variants], "ratio": self.ratio,
                "norms_agree": self.norms_agree, "max_relative_difference": self.max_relative_difference,
                "first_norms": list(self.host.norms[:3]), "last_norm": self.host.norms[-1]}


@dataclass(frozen=True)
class DevicesResult:
    """The result of :func:`bench_devices`.

    Attributes:
        devices: the logical devices used (the GPUs if any, else the CPUs).
        size: ``n`` of the ``(n, n)`` float32 matrices.
        tasks: independent tasks (``max(2, len(devices))``).
        matmuls_per_task: chained matmuls in each task.
        sequential: all tasks one after another on ``devices[0]``, milliseconds.
        split: one task per device, launched together; ``None`` with one device.
        notes: what the numbers can and cannot show on these devices.
    """

    devices: tuple[str, ...]
    size: int
    tasks: int
    matmuls_per_task: int
    sequential: Timing
    split: Optional[Timing]
    notes: tuple[str, ...]

    @property
    def speedup(self) -> Optional[float]:
        """Sequential time / split time (ideal: ``tasks``); ``None`` with one device."""
        return None if self.split is None else self.sequential.median_ms / self.split.median_ms

    def to_dict(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "size": self.size, "tasks": self.tasks,
                "matmuls_per_task": self.matmuls_per_task, "sequential": self.sequential.to_dict(),
                "split": None if self.split is None else self.split.to_dict(),
                "speedup": self.speedup, "ideal_speedup": self.tasks if self.split is not None else None,
                "notes": list(self.notes)}


# ------------------------------------------------------------------------ helpers


def configure(recipe: Optional[str] = None, overrides: Sequence[str] = ()) -> Any:
    """Load RECIPE with ``--set`` overrides and apply its device settings (:func:`tfgpu.setup`).

    Returns:
        the :class:`tfgpu.Setup` (its ``logical_devices`` are what the benchmarks time).

    Raises:
        ConfigError, DeviceError, AlreadyInitializedError: as :func:`tfgpu.setup`.
    """
    from .setup import setup  # noqa: PLC0415
    from ..config import load_config  # noqa: PLC0415
    from ..errors import ConfigError  # noqa: PLC0415

    cfg = load_config(recipe, overrides=overrides)
    if cfg.backend == "jax":
        raise ConfigError(
            "backend: jax: tfgpu bench times TensorFlow ops (tf.matmul on TensorFlow's devices), so it would "
            "not measure the JAX devices this config sets up.",
            "run it with backend: tensorflow (--set backend=tensorflow); "
            "'tfgpu run' records samples/s on both backends in summary.json.")
    return setup(cfg)


def environment() -> dict[str, Any]:
    """TensorFlow's version, devices and float32 matmul precision (imports TensorFlow).

    ``tensor_float_32``: whether float32 matmuls on Ampere or newer GPUs run at
    TensorFloat-32 precision (TensorFlow's default), see
    https://www.tensorflow.org/api_docs/python/tf/config/experimental/enable_tensor_float_32_execution
    """
    import tensorflow as tf  # noqa: PLC0415

    return {"tensorflow_version": tf.__version__,
            "physical_devices": [d.name for d in tf.config.list_physical_devices()],
            "logical_devices": [d.name for d in tf.config.list_logical_devices()],
            "tensor_float_32": bool(tf.config.experimental.tensor_float_32_execution_enabled())}


def _check_positive(name: str, value: int, most: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (most is not None and value > most):
        allowed = f"an integer from 1 to {most}" if most else "an integer >= 1"
        raise ConfigError(f"{name}: received {value!r}; expected {allowed}.", f"pass {name} as {allowed}.")


def _logical_devices(kind: Optional[str] = None) -> list[str]:
    import tensorflow as tf  # noqa: PLC0415

    return [d.name for d in tf.config.list_logical_devices(kind)]


def _resolve_devices(devices: Optional[Sequence[str]]) -> list[str]:
    known = _logical_devices()
    if devices is None:
        return known
    short = {name.replace("/device:", "").upper(): name for name in known}
    out = []
    for d in devices:
        name = short.get(str(d).replace("/device:", "").lstrip("/").upper())
        if name is None:
            raise DeviceError(f"device {d!r} is not a logical device of this process; it has {', '.join(known)}.",
                              "name one of those, or change the split with devices.cpu_logical_devices / "
                              "devices.gpu_logical_devices.")
        out.append(name)
    return out


def _time(call: Callable[[], Any], repeats: int) -> Timing:
    """Run ``call`` once untimed, then ``repeats`` times timed (milliseconds)."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return Timing(tuple(times))


def _operands(device: str, size: int, seed: int) -> tuple[Any, Any]:
    """``(a, w)`` on ``device``: ``a ~ N(0, 1)`` and ``w ~ N(0, 1/n)``, both ``(n, n)`` float32.

    Multiplying by ``w`` keeps the Frobenius norm about the same, so a chain of
    matmuls neither overflows nor underflows (denormals would slow a CPU down).
    """
    import tensorflow as tf  # noqa: PLC0415

    with tf.device(device):
        a = tf.random.stateless_normal((size, size), seed=[seed, 0], dtype=tf.float32)
        w = tf.random.stateless_normal((size, size), seed=[seed, 1], stddev=1.0 / math.sqrt(size), dtype=tf.float32)
    return a, w


def _chain(x: Any, w: Any, count: int) -> Any:
    """``x @ w @ w ...`` (``count`` matmuls). Each depends on the last, so none is merged away."""
    import tensorflow as tf  # noqa: PLC0415

    for _ in range(count):
        x = tf.linalg.matmul(x, w)
    return x


def _chain_function(device: str, count: int) -> Callable[[Any, Any], Any]:
    """A ``tf.function`` running ``count`` chained matmuls on ``device``, ending in a scalar sum."""
    import tensorflow as tf  # noqa: PLC0415

    @tf.function
    def chained(a: Any, w: Any) -> Any:
        with tf.device(device):
            return tf.reduce_sum(_chain(a, w, count))

    return chained


def _chain_length(device: str, a: Any, w: Any) -> int:
    """Matmuls per timed call so that a call takes about :data:`TARGET_SECONDS` (1 to :data:`MAX_CHAIN`)."""
    one = _chain_function(device, 1)
    seconds = _time(lambda: one(a, w).numpy(), 1).median_ms * 1e-3
    return max(1, min(MAX_CHAIN, round(TARGET_SECONDS / max(seconds, 1e-9))))


def _out_of_memory(exc: Exception, what: str) -> DeviceError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DeviceError(f"{what}: the device ran out of memory ({first}).",
                       "use smaller matrices, or free the device's memory (other processes, "
                       "devices.memory_limit_mib).")


# ------------------------------------------------------------------------ benchmarks


def bench_matmul(sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 5,
                 devices: Optional[Sequence[str]] = None) -> list[MatmulRow]:
    """Time float32 ``(n, n) @ (n, n)`` matrix multiplication on each logical device.

    For each device and size: the operands are created on the device
    (``tf.device``), a ``tf.function`` chaining ``k`` matmuls (``k`` chosen so a
    call takes about 50 ms, 1 to 100) ends in ``tf.reduce_sum`` read back with
    ``.numpy()`` (waiting for the GPU), is run once untimed, then ``repeats``
    times; each time is divided by ``k``.

    Args:
        sizes: matrix sides ``n``, each 1 to 65536.
        repeats: timed calls per device and size (>= 1).
        devices: logical device names (``"/device:GPU:0"`` or ``"GPU:0"``);
            default: every logical device (the CPUs, then the GPUs).

    Returns:
        one :class:`MatmulRow` per (device, size), devices outer: median time per
        matmul (ms) with min and max, and GFLOP/s ``= 2 n^3 / median``. On
        Ampere or newer GPUs float32 matmuls use TensorFloat-32 unless it is
        turned off (see :func:`environment`).

    Raises:
        ConfigError: a size or ``repeats`` out of range.
        DeviceError: an unknown device, or a device out of memory.

    Wraps https://www.tensorflow.org/api_docs/python/tf/linalg/matmul under
    https://www.tensorflow.org/api_docs/python/tf/device and
    https://www.tensorflow.org/api_docs/python/tf/function
    """
    if not sizes:
        raise ConfigError("sizes: received an empty list; expected at least one size.", "pass e.g. sizes=[256, 512].")
    for n in sizes:
        _check_positive("size", n, MAX_SIZE)
    _check_positive("repeats", repeats)
    import tensorflow as tf  # noqa: PLC0415

    rows = []
    for device in _resolve_devices(devices):
        for n in sizes:
            try:
                rows.append(_matmul_row(device, n, repeats))
            except tf.errors.ResourceExhaustedError as exc:
                raise _out_of_memory(exc, f"matmul of {n} x {n} float32 matrices on {device}") from exc
    return rows


def _matmul_row(device: str, n: int, repeats: int) -> MatmulRow:
    a, w = _operands(device, n, seed=n)
    count = _chain_length(device, a, w)
    chained = _chain_function(device, count)
    timing = _time(lambda: chained(a, w).numpy(), repeats)
    return MatmulRow(device, n, count, Timing(tuple(t / count for t in timing.times_ms)))


def record_cpu_peak(rows: Sequence[MatmulRow], by: str = "tfgpu bench matmul") -> Optional[float]:
    """Record the best CPU GFLOP/s of ``rows`` at a size of at least
    :data:`~tfgpu.devices.peaks.CPU_PEAK_SIZE` as this CPU's peak for MFU
    (:func:`tfgpu.devices.peaks.write_cpu_peak`), when it beats the recorded one; in FLOP/s, ``None`` when no row
    is a CPU's of that size (small matrices do not reach the CPU's peak)."""
    from .peaks import CPU_PEAK_SIZE, read_cpu_peak, write_cpu_peak  # noqa: PLC0415

    cpu = [r for r in rows if "CPU" in r.device.upper() and r.size >= CPU_PEAK_SIZE]
    if not cpu:
        return None
    best = max(cpu, key=lambda r: r.gflops)
    known = read_cpu_peak()
    if known is not None and known[0] >= best.gflops * 1e9:
        return known[0]
    write_cpu_peak(best.gflops * 1e9, f"{by}: float32 {best.size} x {best.size} matmul on {best.device}, "
                                      f"median of {len(best.per_matmul.times_ms)}")
    return best.gflops * 1e9


def cpu_peak_flops(repeats: int = 3) -> tuple[float, str]:
    """This CPU's peak for MFU, FLOP/s: the figure ``tfgpu bench matmul`` recorded, else one measured now
    (a float32 1024 x 1024 matmul on ``/cpu:0``, about a second on 2 cores) and recorded. TensorFlow must be set up.

    Returns:
        ``(FLOP/s, where it came from)``.
    """
    from .peaks import CPU_PEAK_SIZE, read_cpu_peak  # noqa: PLC0415

    known = read_cpu_peak()
    if known is not None:
        return known
    row = _matmul_row("/cpu:0", CPU_PEAK_SIZE, repeats)
    record_cpu_peak([row], by="measured by tfgpu run as tfgpu bench matmul does")
    return read_cpu_peak() or (row.gflops * 1e9, f"measured now: float32 {CPU_PEAK_SIZE} x {CPU_PEAK_SIZE} on /cpu:0")


def bench_logging(steps: int = 1000, size: int = 100, repeats: int = 5,
                  device: Optional[str] = None) -> LoggingResult:
    """Log the Frobenius norm of each of ``steps`` matmuls: to the host per step, or on the device.

    Each step is one power-iteration step on ``(n, n)`` float32 matrices:
    ``y = x @ w``, ``norm = ||y||_F`` (``tf.norm``), ``x = y / norm``; the
    norms are the log. Three variants do exactly this work:

    - ``host``: a Python loop in eager mode, ``float(norm)`` at each step: one
      device-to-host transfer (and wait) per step.
    - ``device_eager``: the same loop keeping each norm as a tensor on the
      device; one ``tf.stack(...).numpy()`` at the end.
    - ``device_function``: the loop inside a ``tf.function`` (a graph
      ``while`` loop) writing the norms into a ``tf.TensorArray``; one
      transfer at the end, no Python per step.

    Args:
        steps: matmuls per run (>= 1).
        size: ``n`` (1 to 65536).
        repeats: timed runs per variant (>= 1), after one untimed run.
        device: logical device; default the first GPU, else ``/device:CPU:0``.

    Returns:
        :class:`LoggingResult`: each variant's time per run (ms), steps/s, the
        host / ``tf.function`` ratio, and whether all variants logged the same
        norms (``numpy.allclose``, rtol 1e-4).

    Raises:
        ConfigError: ``steps``, ``size`` or ``repeats`` out of range.
        DeviceError: an unknown device, or a device out of memory.

    Wraps https://www.tensorflow.org/api_docs/python/tf/norm,
    https://www.tensorflow.org/api_docs/python/tf/TensorArray and
    https://www.tensorflow.org/api_docs/python/tf/function
    """
    _check_positive("steps", steps)
    _check_positive("size", size, MAX_SIZE)
    _check_positive("repeats", repeats)
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    if device is None:
        device = (_logical_devices("GPU") or _logical_devices("CPU"))[0]
    else:
        device = _resolve_devices([device])[0]

    logged: dict[str, Any] = {}

    def host() -> None:
        norms = []
        with tf.device(device):
            x = x0
            for _ in range(steps):
                y = tf.linalg.matmul(x, w)
                norm = tf.norm(y)
                norms.append(float(norm))  # device-to-host transfer, waits for the step
                x = y / norm
        logged["host"] = norms

    def device_eager() -> None:
        norms = []
        with tf.device(device):
            x = x0
            for _ in range(steps):
                y = tf.linalg.matmul(x, w)
                norm = tf.norm(y)
                norms.append(norm)  # stays on the device
                x = y / norm
            stacked = tf.stack(norms)
        logged["device_eager"] = stacked.numpy().tolist()

    @tf.function
    def power_iteration(x: Any, w: Any) -> Any:
        with tf.device(device):
            norms = tf.TensorArray(tf.float32, size=steps)
            for i in tf.range(steps):
                y = tf.linalg.matmul(x, w)
                norm = tf.norm(y)
                norms = norms.write(i, norm)
                x = y / norm
            return norms.stack()

    def device_function() -> None:
        logged["device_function"] = power_iteration(x0, w).numpy().tolist()

    specs = [("host", "float(norm) every step", steps, host),
             ("device_eager", "norms kept on the device, eager loop", 1, device_eager),
             ("device_function", "tf.function + tf.TensorArray", 1, device_function)]
    variants = []
    try:
        x0, w = _operands(device, size, seed=7)
        with tf.device(device):
            x0 = x0 / tf.norm(x0)
        for name, description, transfers, call in specs:
            timing = _time(call, repeats)
            variants.append(LoggingVariant(name, description, transfers, timing, steps, tuple(logged[name])))
    except tf.errors.ResourceExhaustedError as exc:
        raise _out_of_memory(exc, f"{steps} steps on {size} x {size} float32 matrices on {device}") from exc

    reference = np.asarray(variants[0].norms)
    agree = all(np.allclose(v.norms, reference, rtol=1e-4, atol=0.0) for v in variants[1:])
    worst = max(float(np.max(np.abs(np.asarray(v.norms) - reference) / np.abs(reference))) for v in variants[1:])
    return LoggingResult(device, steps, size, tuple(variants), bool(agree), worst)


def bench_devices(size: int = 2048, repeats: int = 5, devices: Optional[Sequence[str]] = None) -> DevicesResult:
    """The same independent matmul tasks in sequence on one device vs one per device at once.

    ``tasks = max(2, number of devices)`` independent tasks, each a chain of
    ``k`` float32 ``(n, n)`` matmuls (``k`` chosen so a task takes about 50 ms,
    1 to 100) ending in a scalar sum. ``sequential``: all tasks on the first
    device in one ``tf.function``, each starting after the last ended
    (``tf.control_dependencies``). ``split``: task ``i`` on device ``i``, all
    in one ``tf.function`` so TensorFlow can run them concurrently. Every
    result is read back with ``.numpy()``; each function is run once untimed.

    Args:
        size: ``n`` (1 to 65536).
        repeats: timed calls of each (>= 1).
        devices: logical device names; default the logical GPUs if there are
            any, else the logical CPUs.

    Returns:
        :class:`DevicesResult`: both times (ms), the speed-up (sequential /
        split; ideal ``tasks``) and notes. With one device only ``sequential``
        is timed and the notes say how to get two.

    Raises:
        ConfigError: ``size`` or ``repeats`` out of range.
        DeviceError: an unknown device, or a device out of memory.

    Wraps https://www.tensorflow.org/api_docs/python/tf/device,
    https://www.tensorflow.org/api_docs/python/tf/function and
    https://www.tensorflow.org/api_docs/python/tf/control_dependencies
    """
    _check_positive("size", size, MAX_SIZE)
    _check_positive("repeats", repeats)
    import tensorflow as tf  # noqa: PLC0415

    names = _resolve_devices(devices) if devices is not None else (_logical_devices("GPU") or _logical_devices("CPU"))
    tasks = max(2, len(names))
    first = names[0]

    def sequential_function(count: int) -> Callable[..., Any]:
        @tf.function
        def sequential(operands: Any) -> Any:
            outputs = []
            with tf.device(first):
                for a, w in operands:
                    with tf.control_dependencies(outputs[-1:]):
                        x = tf.identity(a)
                    outputs.append(tf.reduce_sum(_chain(x, w, count)))
            return outputs
        return sequential

    def split_function(count: int) -> Callable[..., Any]:
        @tf.function
        def split(operands: Any) -> Any:
            outputs = []
            for device, (a, w) in zip(names, operands):
                with tf.device(device):
                    outputs.append(tf.reduce_sum(_chain(a, w, count)))
            return outputs
        return split

    def read(outputs: Any) -> list[float]:
        return [float(t.numpy()) for t in outputs]

    try:
        on_first = [_operands(first, size, seed=100 + i) for i in range(tasks)]
        count = _chain_length(first, *on_first[0])
        seq = sequential_function(count)
        sequential = _time(lambda: read(seq(on_first)), repeats)
        split = None
        if len(names) > 1:
            spread = [_operands(d, size, seed=100 + i) for i, d in enumerate(names)]
            par = split_function(count)
            split = _time(lambda: read(par(spread)), repeats)
    except tf.errors.ResourceExhaustedError as exc:
        raise _out_of_memory(exc, f"{tasks} matmul tasks of {size} x {size} float32 matrices") from exc
    return DevicesResult(tuple(names), size, tasks, count, sequential, split, tuple(_device_notes(names)))


def _device_notes(names: Sequence[str]) -> list[str]:
    import tensorflow as tf  # noqa: PLC0415

    if len(names) == 1:
        return [f"Only one device ({names[0]}): nothing to split the work across, so only the sequential "
                "time was measured. For two devices: on a CPU, --set devices.cpu_logical_devices=2 (both "
                "share the same cores); on GPUs, a machine with two or more GPUs, or one GPU split with "
                "--set devices.gpu_logical_devices=2 --set devices.memory_limit_mib=MiB (both share that GPU)."]
    kinds = {n.split(":")[-2].upper() for n in names}
    physical = {kind: len(tf.config.list_physical_devices(kind)) for kind in kinds}
    notes = []
    if kinds == {"CPU"} and physical["CPU"] == 1:
        notes.append(f"All {len(names)} devices are logical devices of one physical CPU: they share its cores "
                     "and thread pools, so no real speed-up is expected (each matmul already uses every core); "
                     "any speed-up comes from running matmuls at once on cores one leaves idle, not from more "
                     "hardware. This shows the mechanics only.")
    elif kinds == {"GPU"} and len(names) > physical["GPU"]:
        notes.append(f"{len(names)} logical GPUs on {physical['GPU']} physical GPU(s): logical devices of one GPU "
                     "share its compute units and memory bandwidth, so little speed-up is expected.")
    return notes


# ------------------------------------------------------------------------ text


def _ms(t: float) -> str:
    return f"{t:.3f}" if t < 10 else f"{t:.1f}"


def _range(t: Timing) -> str:
    return f"{_ms(t.min_ms)}-{_ms(t.max_ms)}"


def _short(device: str) -> str:
    return device.replace("/device:", "")


def describe_environment(env: dict[str, Any]) -> str:
    """One line: TensorFlow's version and logical devices (and TF32 when there are GPUs)."""
    line = f"TensorFlow {env['tensorflow_version']}; logical devices: {', '.join(map(_short, env['logical_devices']))}"
    if any(":GPU:" in d for d in env["logical_devices"]):
        line += ("; float32 matmuls use TensorFloat-32 on Ampere+ GPUs" if env["tensor_float_32"]
                 else "; TensorFloat-32 off (full float32)")
    return line + "."


def describe_matmul(rows: Sequence[MatmulRow], repeats: int) -> str:
    """The table ``tfgpu bench matmul`` prints."""
    body = [(_short(r.device), str(r.size), str(r.matmuls_per_call), _ms(r.per_matmul.median_ms),
             _range(r.per_matmul), f"{r.gflops:.1f}") for r in rows]
    lines = table_lines(("device", "n", "matmuls/call", "median ms", "min-max ms", "GFLOP/s"), body,
                   (False, True, True, True, True, True))
    lines.append(f"float32 (n, n) @ (n, n); time per matmul, median of {repeats} timed calls after one warm-up; "
                 "GFLOP/s = 2 n^3 / median time.")
    return "\n".join(lines)


def describe_logging(result: LoggingResult) -> str:
    """The table ``tfgpu bench logging`` prints."""
    host = result.host.timing.median_ms
    body = [(v.name, v.description, str(v.transfers), _ms(v.timing.median_ms), _range(v.timing),
             f"{v.steps_per_second:,.0f}", f"{host / v.timing.median_ms:.2f}x") for v in result.variants]
    lines = [f"{result.steps} steps of y = x @ w, log ||y||_F, x = y / ||y||_F; ({result.size}, {result.size}) "
             f"float32 on {_short(result.device)}:"]
    lines += table_lines(("variant", "how", "transfers", "median ms", "min-max ms", "steps/s", "vs host"), body,
                    (False, False, True, True, True, True, True))
    agree = "yes" if result.norms_agree else "NO"
    lines.append(f"Logging on the device (tf.function) is {result.ratio:.2f}x as fast as logging to the host. "
                 f"Norms agree: {agree} (max relative difference {result.max_relative_difference:.1e}; "
                 f"last norm {result.host.norms[-1]:.6g}).")
    return "\n".join(lines)


def describe_devices(result: DevicesResult) -> str:
    """The table ``tfgpu bench devices`` prints."""
    work = f"{result.tasks} tasks x {result.matmuls_per_task} matmul(s)"
    body = [("sequential", _short(result.devices[0]), work, _ms(result.sequential.median_ms),
             _range(result.sequential), "1.00x")]
    if result.split is not None:
        body.append(("split", ", ".join(map(_short, result.devices)), work, _ms(result.split.median_ms),
                     _range(result.split), f"{result.speedup:.2f}x"))
    lines = [f"Independent float32 ({result.size}, {result.size}) matmul chains:"]
    lines += table_lines(("run", "devices", "work", "median ms", "min-max ms", "speed-up"), body,
                    (False, False, False, True, True, True))
    if result.split is not None:
        lines.append(f"Speed-up = sequential / split time; ideal {result.tasks:.2f}x.")
    lines += list(result.notes)
    return "\n".join(lines)
