"""What both backends' plans share: the plan's types and the steps that do not depend on the backend.

:class:`Plan` (with :class:`TfCall` and :class:`StrategyPlan`) is the data
``tfgpu plan`` prints and :mod:`tfgpu.devices.apply` (or the JAX apply) carries out.
The TensorFlow plan (:mod:`tfgpu.devices.plan`) and the JAX plan
(:mod:`tfgpu.devices.jax_plan`) both build one from the steps here: which
GPUs are visible, their memory caps, the MIG warning, the Keras calls (seed,
dtype policy) and the batch/learning-rate tail (:func:`assemble`). This module
imports neither backend's plan, so neither imports the other. Pure: no
TensorFlow, no process state.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from ..cluster.spec import Cluster
from ..config import Config
from ..errors import DeviceError
from .probe import GpuInfo, Probe

#: Keys of :attr:`Plan.env`, in the order they are set.
ENV_ORDER = ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS", "KERAS_BACKEND", "CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "TF_GPU_ALLOCATOR")


@dataclass(frozen=True)
class TfCall:
    """One TensorFlow/Keras configuration call.

    Attributes:
        api: the public API, e.g. ``"tf.config.experimental.set_memory_growth"``.
        device: the physical device it applies to (``"GPU:0"``, ``"CPU:0"``) or ``None``.
        value: the argument (bool, int, str, or a list of logical-device memory
            limits in MiB where ``None`` means no limit).
        setting: the config key it comes from, e.g. ``"devices.memory_growth"``.
    """

    api: str
    device: Optional[str]
    value: Any
    setting: str

    def __str__(self) -> str:
        value = self.value
        if self.api.endswith("set_logical_device_configuration"):
            value = "[" + ", ".join(
                "LogicalDeviceConfiguration()" if v is None else f"LogicalDeviceConfiguration(memory_limit={v})"
                for v in self.value
            ) + "]"
        elif self.api == "keras.distribution.set_distribution":
            value = f"keras.distribution.DataParallel(devices={self.value!r})"
        elif isinstance(value, str):
            value = repr(value)
        args = [a for a in (self.device and f"<{self.device}>", value if value is not None else None) if a is not None]
        return f"{self.api}({', '.join(str(a) for a in args)})"


@dataclass(frozen=True)
class StrategyPlan:
    """Which ``tf.distribute`` strategy to build.

    Attributes:
        kind: ``"mirrored"``, ``"one_device"``, ``"multi_worker_mirrored"`` or ``"default"``;
            with ``backend: jax``: ``"data_parallel"`` (``keras.distribution.DataParallel``),
            ``"single_device"`` or ``"default"``.
        devices: logical device names, e.g. ``("/gpu:0", "/gpu:1")`` (this
            worker's, for ``multi_worker_mirrored``); JAX devices as Keras
            names them (``"gpu:0"``, ``"cpu:1"``) with ``backend: jax``.
        cross_device_ops: ``"nccl"``, ``"hierarchical_copy"``,
            ``"reduce_to_one_device"``, or ``None`` (a single device); for
            ``multi_worker_mirrored`` the collective implementation:
            ``"auto"``, ``"ring"`` or ``"nccl"``.
        cluster: the workers (``multi_worker_mirrored`` only), else ``None``.
    """

    kind: str
    devices: tuple[str, ...]
    cross_device_ops: Optional[str]
    cluster: Optional[Cluster] = None


@dataclass(frozen=True)
class Plan:
    """Everything :func:`tfgpu.setup` and ``tfgpu run`` will do, as data.

    Attributes:
        env: environment variables to set before ``import tensorflow``.
        tf_calls: configuration calls, in order.
        gpus: the physical GPUs TensorFlow will see, numbered as it will number them.
        logical_devices: the logical devices the strategy can use.
        strategy: the strategy to build.
        num_replicas: replicas in sync over all workers (devices per worker x workers).
        batch_size_per_replica: samples per replica per step (0: ``auto``, not found yet).
        global_batch_size: ``batch_size_per_replica * num_replicas`` samples per micro-batch step.
        gradient_accumulation_steps: micro-batches per optimizer step (``train.gradient_accumulation_steps``).
        effective_batch_size: ``global_batch_size * gradient_accumulation_steps``: samples per optimizer step.
        lr_scaling: ``"none"``, ``"linear"`` or ``"sqrt"``.
        lr_scale: the factor the optimizer's learning rate is multiplied by: ``linear`` x replicas x
            accumulation steps, ``sqrt`` its square root (the effective batch over the per-replica batch).
        jit_compile: whether each replica's training step is compiled with
            XLA (``tensorflow.jit_compile``, ``auto`` resolved by :func:`resolve_jit`).
        jit_compile_reason: why, in words (also written to ``summary.json``).
        mixed_precision: the Keras dtype policy name (``tensorflow.mixed_precision``,
            ``auto`` resolved by :func:`resolve_precision`).
        mixed_precision_reason: why, in words (also written to ``summary.json``).
        warnings: things that work but are probably not what was meant.
        notes: things worth knowing that are as meant (``tfgpu plan`` prints them; ``tfgpu run`` does
            not), e.g. a GPU memory setting on a machine with no GPU.
        backend: the Keras backend, ``"tensorflow"`` or ``"jax"``; on ``jax``,
            ``tf_calls`` are Keras calls and ``env`` holds JAX's variables.
        env_settings: for each variable of ``env``, the config key it comes
            from (filled by the JAX plan; ``tfgpu plan`` prints it beside it).
    """

    env: dict[str, str]
    tf_calls: tuple[TfCall, ...]
    gpus: tuple[GpuInfo, ...]
    logical_devices: tuple[str, ...]
    strategy: StrategyPlan
    num_replicas: int
    batch_size_per_replica: int
    global_batch_size: int
    lr_scaling: str
    lr_scale: float
    jit_compile: bool
    jit_compile_reason: str
    mixed_precision: str
    mixed_precision_reason: str = ""
    warnings: tuple[str, ...] = field(default=())
    backend: str = "tensorflow"
    notes: tuple[str, ...] = field(default=())
    env_settings: dict[str, str] = field(default_factory=dict)
    gradient_accumulation_steps: int = 1
    effective_batch_size: int = 0

    @property
    def cluster(self) -> Optional[Cluster]:
        """The multi-worker cluster, or ``None`` on one machine."""
        return self.strategy.cluster

    @property
    def num_workers(self) -> int:
        """Worker processes that train together (1 without a cluster)."""
        return self.cluster.num_workers if self.cluster else 1

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (``tf_calls`` also as text)."""
        data = asdict(self)
        data["tf_calls_text"] = [str(c) for c in self.tf_calls]
        if self.cluster:
            data["strategy"]["cluster"] = self.cluster.to_dict()
        return data

    def describe(self) -> str:
        """The plan as the lines ``tfgpu plan`` prints."""
        jax = self.backend == "jax"
        lines = [f"Backend: {self.backend} (KERAS_BACKEND={self.backend})"]
        lines.append("Environment (set before Keras and JAX are imported):" if jax
                     else "Environment (set before TensorFlow is imported):")
        lines += [f"  {k}={v}" + (f"    # {self.env_settings[k]}" if k in self.env_settings else "")
                  for k, v in self.env.items()] or ["  (nothing to set)"]
        lines.append("Keras calls (in order, before the model is built):" if jax
                     else "TensorFlow calls (in order, before devices initialise):")
        lines += [f"  {i}. {c}    # {c.setting}" for i, c in enumerate(self.tf_calls, 1)] or ["  (none)"]
        gpus = ", ".join(f"GPU:{g.index} {g.label()}" for g in self.gpus)
        lines.append(f"Physical GPUs: {gpus or 'none (CPU only)'}")
        lines.append(f"{'JAX devices' if jax else 'Logical devices'}: {', '.join(self.logical_devices)}")
        s = self.strategy
        if jax:
            lines.append(
                f"Data parallel: keras.distribution.DataParallel over {', '.join(s.devices)} (each global batch "
                "split along its first axis)" if s.kind == "data_parallel" else
                f"Single device: {s.devices[0]} (no keras.distribution)" if s.devices else
                "No distribution: JAX's default device (strategy: default)")
            replicas = str(self.num_replicas)
        elif s.cluster:
            lines.append(f"Strategy: {s.kind} on {', '.join(s.devices)} of each worker, collectives "
                         f"{s.cross_device_ops}")
            lines.append(f"Cluster: {s.cluster.describe()}")
            replicas = f"{len(s.devices)} per worker x {s.cluster.num_workers} workers = {self.num_replicas}"
        else:
            ops = f", cross-device ops {s.cross_device_ops}" if s.cross_device_ops else ""
            lines.append(f"Strategy: {s.kind} on {', '.join(s.devices) or 'the default device'}{ops}")
            replicas = str(self.num_replicas)
        if not self.batch_size_per_replica:
            lines.append(f"Replicas: {replicas}; batch: auto per replica (not found yet: tfgpu run or "
                         "tfgpu find-batch-size tries sizes in child processes and caches the answer)")
        else:
            lines.append(
                f"Replicas: {replicas}; batch: {self.batch_size_per_replica} per replica x "
                f"{self.num_replicas} = {self.global_batch_size} global"
                + (f"; x {self.gradient_accumulation_steps} accumulation steps = {self.effective_batch_size} per "
                   "optimizer step" if self.gradient_accumulation_steps > 1 else ""))
        if self.lr_scaling != "none":
            lines.append(f"Learning rate: x{self.lr_scale:g} ({self.lr_scaling} scaling)")
        lines.append(f"XLA: {'on' if self.jit_compile else 'off'} ({self.jit_compile_reason})")
        lines.append(f"Precision: {self.mixed_precision} ({self.mixed_precision_reason})")
        for w in self.warnings:
            lines.append(f"Warning: {w}")
        for n in self.notes:
            lines.append(f"Note: {n}")
        return "\n".join(lines)


def visible_gpus(config: Config, probe: Probe) -> list[GpuInfo]:
    """The GPUs ``devices.visible_gpus`` selects from the probe's (raises DeviceError for an index beyond them)."""
    request = config.devices.visible_gpus
    if request == "all":
        return list(probe.gpus)
    if request == "none":
        return []
    count = len(probe.gpus)
    for i in request:
        if i >= count:
            have = f"{count} GPU{'s' if count != 1 else ''}" + (
                f" (indices 0-{count - 1})" if count > 1 else " (index 0)" if count == 1 else ""
            )
            why = f" NVML says: {probe.nvml_error}." if probe.nvml_error and not count else ""
            raise DeviceError(
                f"devices.visible_gpus: GPU index {i} was requested (received {list(request)}), but this "
                f"process can see {have}.{why}",
                "use indices below the GPU count, 'all', or 'none' for CPU only; 'tfgpu plan' "
                "shows the GPUs found.",
            )
    return [probe.gpus[i] for i in request]


def memory_caps(config: Config, gpus: list[GpuInfo]) -> list[tuple[str, Any]]:
    """``(key, cap)`` per visible GPU from ``memory_limit_mib`` / ``memory_fraction`` (a value or a list)."""
    dev = config.devices
    key, value = (("devices.memory_fraction", dev.memory_fraction) if dev.memory_fraction is not None
                  else ("devices.memory_limit_mib", dev.memory_limit_mib))
    if not isinstance(value, list):
        return [(key, value)] * len(gpus)
    if len(value) != len(gpus):
        listed = ", ".join(f"GPU:{i} {g.label()}" for i, g in enumerate(gpus)) or "none"
        raise DeviceError(
            f"{key}: {len(value)} per-GPU values were given (received {value}) but {len(gpus)} GPU(s) will be "
            f"visible: {listed}.",
            "give one value per visible GPU, in that order (devices.visible_gpus chooses them), or a single "
            "value for every GPU.",
        )
    return [(key, v) for v in value]


def mig_warning(probe: Probe, gpus: list[GpuInfo]) -> Optional[str]:
    """The plan's warning about MIG instances this process cannot use (a CUDA process enumerates one MIG
    instance only), or ``None``; ``tfgpu doctor`` reports them in its own MIG check instead."""
    hidden = probe.mig_hidden
    if not hidden:
        return None
    using = next((g for g in gpus if g.is_mig), None)
    return (
        f"{len(hidden) + 1} MIG instances are available but a CUDA process can use only one MIG instance "
        f"(NVIDIA's MIG user guide): this process "
        + (f"uses {using.uuid} ({using.name}) and " if using else "")
        + f"cannot see {', '.join(h.uuid for h in hidden)}; to train on several instances run one worker per "
        "instance, each with CUDA_VISIBLE_DEVICES=MIG-<uuid> (nvidia-smi -L lists them) under "
        "multi_worker_mirrored"
    )


#: GPUs of this compute capability and above have bfloat16 tensor cores (NVIDIA Ampere, sm_80, and later).
BF16_CAPABILITY = (8, 0)
#: ... and of this one and above float16 tensor cores (Volta, sm_70, and Turing, sm_75).
FP16_CAPABILITY = (7, 0)
#: The CPU flags that mean bfloat16 matrix instructions (Intel Cooper Lake / AMD Zen 4 and later; Intel AMX).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
#: What ``auto`` measured on a CPU with avx512_bf16 (docs/benchmarks.md, "Mixed precision").
CPU_BF16_MEASURED = "measured: 1.1-2.1x float32's samples/s at its accuracy, seed CNN, 2-core AVX512-BF16 CPU"


def _capability(gpu: GpuInfo) -> Optional[tuple[int, int]]:
    try:
        major, minor = (gpu.compute_capability or "").split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def resolve_precision(setting: str, gpus: list[GpuInfo], cpu_flags: Optional[tuple[str, ...]]) -> tuple[str, str]:
    """Resolve ``tensorflow.mixed_precision`` for the machine: ``(Keras dtype policy, reason)``.

    ``auto`` reads the probe only (NVML's compute capabilities, ``/proc/cpuinfo``'s
    flags), never TensorFlow:

    1. A policy that is set is kept.
    2. GPUs visible (after ``devices.visible_gpus``): the lowest compute
       capability decides (the replicas run in lockstep, so all use one
       policy): >= 8.0 ``mixed_bfloat16`` (bfloat16 tensor cores, float32's
       range, no loss scaling); 7.x ``mixed_float16`` (float16 tensor cores;
       Keras scales the loss: ``compile`` wraps the optimizer in a
       ``LossScaleOptimizer``, and so does tfgpu's custom loop); below 7.0, or
       a capability NVML did not report, ``float32``.
    3. No GPU: ``mixed_bfloat16`` on a CPU with ``avx512_bf16`` or
       ``amx_bf16`` (oneDNN's bfloat16 kernels on TensorFlow, XLA's on JAX;
       both measured faster at float32's accuracy, docs/benchmarks.md), else
       ``float32``.

    The same rule holds for ``backend: jax`` (Keras's dtype policies and its
    loss scaling in ``compile`` work on every backend).

    Args:
        setting: ``"auto"``, ``"float32"``, ``"mixed_float16"`` or ``"mixed_bfloat16"``.
        gpus: the GPUs the run will use.
        cpu_flags: :attr:`tfgpu.devices.probe.Probe.cpu_flags` (``None``: unknown).

    Returns:
        ``(policy, reason)``: the policy name for ``set_global_policy`` and why, in words.

    Wraps: ``keras.mixed_precision.set_global_policy``
    (https://keras.io/api/mixed_precision/policy/; guide:
    https://www.tensorflow.org/guide/mixed_precision).
    """
    # 1. Set explicitly.
    if setting != "auto":
        return setting, f"tensorflow.mixed_precision: {setting}"
    # 2. GPUs: the lowest compute capability decides.
    if gpus:
        unknown = [g for g in gpus if _capability(g) is None]
        if unknown:
            return "float32", (f"auto: float32, NVML did not report GPU:{gpus.index(unknown[0])}'s compute "
                               "capability (mixed precision needs >= 7.0)")
        low = min(gpus, key=lambda g: _capability(g) or (0, 0))
        cc = _capability(low) or (0, 0)
        which = (f"{low.name} has compute capability {low.compute_capability}" if len(gpus) == 1 else
                 f"the lowest compute capability of the {len(gpus)} GPUs is {low.compute_capability} "
                 f"(GPU:{gpus.index(low)} {low.name})")
        if cc >= BF16_CAPABILITY:
            return "mixed_bfloat16", (f"auto: mixed_bfloat16, {which}, >= 8.0: bfloat16 tensor cores, float32's "
                                      "range, no loss scaling")
        if cc >= FP16_CAPABILITY:
            return "mixed_float16", (f"auto: mixed_float16, {which}, 7.x: float16 tensor cores (bfloat16 needs "
                                     ">= 8.0); the loss is scaled (LossScaleOptimizer)")
        return "float32", (f"auto: float32, {which}, below 7.0: no tensor cores, so mixed precision would not be "
                           "faster")
    # 3. The CPU: bfloat16 instructions or not.
    if cpu_flags is None:
        return "float32", ("auto: float32 on a CPU whose flags are unknown (no /proc/cpuinfo, or a machine "
                           "file without cpu_flags)")
    have = [f for f in BF16_CPU_FLAGS if f in cpu_flags]
    if have:
        return "mixed_bfloat16", f"auto: mixed_bfloat16 on a CPU with {' and '.join(have)} ({CPU_BF16_MEASURED})"
    return "float32", "auto: float32 on a CPU without avx512_bf16 or amx_bf16 (bfloat16 would be emulated, slower)"


def keras_calls(config: Config, on_gpus: bool, warnings: list[str], policy: Optional[str] = None) -> list[TfCall]:
    """The Keras calls both backends make: the seed (``keras.utils.set_random_seed``) and the dtype policy
    (``keras.mixed_precision.set_global_policy``) ``policy``, resolved by :func:`resolve_precision`
    (default: ``tensorflow.mixed_precision`` as set)."""
    tfc = config.tensorflow
    policy = policy or tfc.mixed_precision
    calls = []
    if tfc.seed is not None:
        calls.append(TfCall("keras.utils.set_random_seed", None, tfc.seed, "tensorflow.seed"))
    calls.append(TfCall("keras.mixed_precision.set_global_policy", None, policy,
                        "tensorflow.mixed_precision"))
    if policy == "mixed_float16" and not on_gpus:
        warnings.append("mixed_float16 on CPU is slow (CPUs compute float16 in software); use float32 or mixed_bfloat16")
    return calls


def assemble(config: Config, env: dict[str, str], calls: list[TfCall], gpus: list[GpuInfo],
             logical: tuple[str, ...], strategy: StrategyPlan, replicas: int, jit: tuple[bool, str],
             warnings: list[str], precision: Optional[tuple[str, str]] = None, **extra: Any) -> Plan:
    """The :class:`Plan` of a backend's parts: the batch sizes and learning-rate scale follow from
    ``replicas``; GPUs are renumbered as the process will see them; ``precision``: ``(policy, reason)`` from
    :func:`resolve_precision` (default: the setting as given); ``extra``: ``backend``, ``env_settings``."""
    if precision is None:
        precision = resolve_precision(config.tensorflow.mixed_precision, gpus, None)
    per_replica, accumulation = config.train.batch_size_per_replica, config.train.gradient_accumulation_steps
    per_replica = 0 if per_replica == "auto" else per_replica  # found when the run starts (training.batch_finder)
    factor = replicas * accumulation  # the effective batch over the per-replica batch
    scale = {"none": 1.0, "linear": float(factor), "sqrt": math.sqrt(factor)}[config.train.lr_scaling]
    return Plan(
        env=env,
        tf_calls=tuple(calls),
        gpus=tuple(dataclasses.replace(g, index=i) for i, g in enumerate(gpus)),
        logical_devices=logical,
        strategy=strategy,
        num_replicas=replicas,
        batch_size_per_replica=per_replica,
        global_batch_size=per_replica * replicas,
        gradient_accumulation_steps=accumulation,
        effective_batch_size=per_replica * replicas * accumulation,
        lr_scaling=config.train.lr_scaling,
        lr_scale=scale,
        jit_compile=jit[0],
        jit_compile_reason=jit[1],
        mixed_precision=precision[0],
        mixed_precision_reason=precision[1],
        warnings=tuple(warnings),
        **extra,
    )
