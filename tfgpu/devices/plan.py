"""Config + probe -> plan: a pure function, no TensorFlow, no process state.

A :class:`Plan` is plain data: the environment variables to set before
TensorFlow is imported, the ``tf.config`` (and Keras) calls to make, in order,
before devices are initialised, the strategy, the replica count and the global
batch. ``tfgpu plan`` prints it; :func:`tfgpu.devices.apply.apply_plan` carries it out
and does nothing else.

Order of application (why): environment first (TensorFlow and CUDA read it at
import or at device initialisation), then threading (fixed at context
creation), then per-GPU memory settings and logical splits (fixed when devices
initialise), then the CPU split, then settings that may change at any time
(placement, determinism, seed, dtype policy).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..cluster.spec import expand_tasks_per_node, resolve_cluster
from ..config import Config, normalise_device
from ..errors import ConfigError, DeviceError
from .jax_plan import make_jax_plan
from .plan_base import (ENV_ORDER, Plan, StrategyPlan, TfCall, assemble, keras_calls, memory_caps, mig_warning,
                        resolve_precision, visible_gpus)
from .probe import GpuInfo, Probe

__all__ = ["ENV_ORDER", "Plan", "StrategyPlan", "TfCall", "assemble", "keras_calls", "make_plan", "mig_warning",
           "resolve_jit"]













def _memory_calls(config: Config, gpus: list[GpuInfo], warnings: list[str], notes: list[str]) -> list[TfCall]:
    dev = config.devices
    split = dev.gpu_logical_devices
    limited = dev.memory_limit_mib is not None or dev.memory_fraction is not None
    # The config refuses a split without a limit, so "limited" covers every fixed-size case.
    growth = dev.memory_growth if dev.memory_growth is not None else not limited
    calls: list[TfCall] = []
    if dev.memory_growth and limited:
        fixed = "devices.memory_limit_mib" if dev.memory_limit_mib is not None else "devices.memory_fraction"
        warnings.append(
            f"devices.memory_growth: true and {fixed} are both set; a capped or split GPU is a fixed-size "
            f"logical device that cannot grow (TensorFlow refuses both on one GPU), so {fixed} is applied and "
            "memory growth is not; remove one of them to silence this"
        )
    if not gpus:
        asked = [k for k in ("memory_growth", "memory_limit_mib", "memory_fraction") if k in dev.model_fields_set]
        if asked or split > 1:  # a recipe written for GPUs, run on a CPU: as meant, so a note, not a warning
            notes.append(
                "no GPU is visible, so devices."
                + ", devices.".join(asked + (["gpu_logical_devices"] if split > 1 else []))
                + " has nothing to apply to"
            )
        return calls
    caps = memory_caps(config, gpus) if limited else [("", None)] * len(gpus)
    for new_index, (gpu, (key, cap)) in enumerate(zip(gpus, caps)):
        target = f"GPU:{new_index}"
        if limited:
            if key == "devices.memory_fraction":
                if gpu.total_mib is None:
                    raise DeviceError(
                        f"devices.memory_fraction: {cap} needs GPU {new_index}'s total "
                        "memory, which NVML could not report.",
                        "set devices.memory_limit_mib (MiB) instead, or install nvidia-ml-py and the NVIDIA driver.",
                    )
                limit = int(math.floor(cap * gpu.total_mib))
            else:
                limit = int(cap)
                if gpu.total_mib is not None and limit > gpu.total_mib:
                    per_gpu = ", ".join(str(g.total_mib) for g in gpus)
                    raise DeviceError(
                        f"devices.memory_limit_mib: {limit} MiB is more than GPU {new_index} ({gpu.name}) "
                        f"has: {gpu.total_mib} MiB in total.",
                        f"set a limit of at most {gpu.total_mib} MiB, one limit per visible GPU as a list (their "
                        f"totals: [{per_gpu}] MiB), or use devices.memory_fraction (of each GPU's own total).",
                    )
            each = limit // split
            if each < 64:
                raise DeviceError(
                    f"{key}: GPU {new_index} would get {limit} MiB split into {split} logical devices of "
                    f"{each} MiB, less than the 64 MiB TensorFlow needs for a usable device.",
                    "raise the limit or lower devices.gpu_logical_devices.",
                )
            if each < 1024:
                warnings.append(
                    f"{key}: each logical device on GPU {new_index} gets {each} MiB; after the CUDA context and "
                    "cuDNN workspace that leaves little for the model's weights, optimizer state and "
                    "activations (expect out-of-memory errors except for small models and batches)"
                )
            if gpu.used_mib and gpu.total_mib and limit > gpu.total_mib - gpu.used_mib:
                warnings.append(
                    f"{key}: GPU {new_index} ({gpu.name}) is asked for {limit} MiB but only "
                    f"{gpu.total_mib - gpu.used_mib} MiB were free when probed ({gpu.used_mib} MiB held by "
                    "other processes)"
                )
            setting = key if split == 1 else f"{key}, devices.gpu_logical_devices"
            calls.append(TfCall("tf.config.set_logical_device_configuration", target, [each] * split, setting))
        elif growth:
            calls.append(TfCall("tf.config.experimental.set_memory_growth", target, True, "devices.memory_growth"))
    return calls


def _device_memory(calls: list[TfCall], gpus: list[GpuInfo]) -> list[Optional[int]]:
    """MiB each visible GPU gives TensorFlow: its cap from the plan's calls, else its total."""
    caps = {c.device: sum(c.value) for c in calls if c.api == "tf.config.set_logical_device_configuration"
            and c.device and c.device.startswith("GPU:")}
    return [caps.get(f"GPU:{i}", g.total_mib) for i, g in enumerate(gpus)]


def _unequal_gpus(gpus: list[GpuInfo], calls: list[TfCall], strategy: "StrategyPlan", split: int,
                  warnings: list[str]) -> None:
    """Warn when one strategy's GPU replicas are not alike (model, or memory given to TensorFlow)."""
    used = sorted({int(d.split(":")[1]) // split for d in strategy.devices if d.startswith("/gpu:")})
    if len(used) < 2:
        return
    memory = _device_memory(calls, gpus)
    if len({(gpus[i].name, memory[i]) for i in used}) < 2:
        return
    listed = ", ".join(f"GPU:{i} {gpus[i].name} ({memory[i] if memory[i] is not None else '?'} MiB for TensorFlow)"
                       for i in used)
    smallest = min((memory[i] for i in used if memory[i] is not None), default=None)
    warnings.append(
        f"{strategy.kind} strategy over unequal GPUs: {listed}. Every replica runs the same step on the same "
        "per-replica batch in lockstep, so the slowest GPU sets the pace"
        + (f" and the smallest memory ({smallest} MiB) must hold a replica's batch" if smallest else "")
        + "; to train on alike GPUs only, choose them with devices.visible_gpus"
    )


def _cross_device_ops(config: Config, kind: str, devices: tuple[str, ...], probe: Probe,
                      warnings: list[str]) -> Optional[str]:
    requested = config.distribute.cross_device_ops
    if kind != "mirrored" or len(devices) < 2:
        if requested != "auto":
            warnings.append(
                f"distribute.cross_device_ops: {requested} is ignored: a single replica sums nothing across devices"
            )
        return None
    on_gpus = all(d.startswith("/gpu:") for d in devices)
    virtual = config.devices.gpu_logical_devices > 1
    nccl_ok = on_gpus and not virtual and probe.platform.startswith("linux")
    fallback = "hierarchical_copy" if on_gpus and not virtual else "reduce_to_one_device"
    if requested == "auto":
        return "nccl" if nccl_ok else fallback
    if requested == "nccl" and not nccl_ok:
        why = (
            "the replicas are not all GPUs" if not on_gpus
            else "logical GPUs share a physical GPU" if virtual
            else "NCCL is only available on Linux"
        )
        warnings.append(f"distribute.cross_device_ops: nccl cannot work here ({why}); using {fallback} instead")
        return fallback
    if requested == "hierarchical_copy" and not on_gpus:
        warnings.append(
            "distribute.cross_device_ops: hierarchical_copy needs GPUs; using reduce_to_one_device instead"
        )
        return "reduce_to_one_device"
    return requested


def _strategy(config: Config, logical: tuple[str, ...], cpu_count: int, gpu_count: int,
              probe: Probe, warnings: list[str]) -> StrategyPlan:
    dist = config.distribute
    known = {f"/gpu:{i}" for i in range(gpu_count)} | {f"/cpu:{i}" for i in range(cpu_count)}
    explicit = tuple(normalise_device(d) for d in dist.devices) if dist.devices else None
    if explicit:
        missing = [d for d in explicit if d not in known]
        if missing:
            visible = config.devices.visible_gpus
            renumbered = (
                f" TensorFlow numbers the visible GPUs from 0: with devices.visible_gpus {list(visible)}, "
                + ", ".join(f"GPU {g} is /gpu:{i}" for i, g in enumerate(visible)) + "."
                if isinstance(visible, list) and visible and any(d.startswith("/gpu:") for d in missing) else ""
            )
            raise DeviceError(
                f"distribute.devices: {missing[0]} was requested (received {list(dist.devices)}), but the "
                f"logical devices will be: {', '.join(sorted(known))}.{renumbered}",
                "name existing devices, or raise devices.cpu_logical_devices / devices.gpu_logical_devices, "
                "or make more GPUs visible.",
            )
    kind = dist.strategy
    if kind == "multi_worker_mirrored":
        return _multi_worker(config, logical, gpu_count, probe, warnings)
    if dist.communication != "auto":
        warnings.append(f"distribute.communication: {dist.communication} is ignored: it sets "
                        "MultiWorkerMirroredStrategy's collectives, and the strategy is " + kind)
    if kind == "default":
        if explicit:
            warnings.append("distribute.devices is ignored with strategy: default")
        return StrategyPlan("default", (), None)
    if kind == "one_device":
        if explicit and len(explicit) != 1:
            raise DeviceError(
                f"distribute.devices: strategy one_device takes exactly one device; received {list(dist.devices)}.",
                "give one device, e.g. ['/gpu:0'], or use strategy: mirrored for several.",
            )
        devices = explicit or logical[:1]
        return StrategyPlan("one_device", devices, None)
    devices = explicit or logical
    if kind == "auto":
        kind = "mirrored" if len(devices) > 1 else "one_device"
    ops = _cross_device_ops(config, kind, devices, probe, warnings)
    return StrategyPlan(kind, devices, ops)


def _tasks_on_busiest_node(env: dict[str, str]) -> int:
    try:
        return max(expand_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "1"))))
    except ValueError:
        return 1


def _multi_worker(config: Config, logical: tuple[str, ...], gpu_count: int, probe: Probe,
                  warnings: list[str]) -> StrategyPlan:
    """MultiWorkerMirroredStrategy: every local GPU (else the CPU) of each worker of the resolved cluster."""
    dist = config.distribute
    cluster = resolve_cluster(dist, probe.env)
    if dist.devices:
        warnings.append("distribute.devices is ignored with strategy: multi_worker_mirrored, which uses every "
                        "visible GPU of each worker (else its CPU); choose GPUs with devices.visible_gpus")
    if dist.cross_device_ops != "auto":
        warnings.append(f"distribute.cross_device_ops: {dist.cross_device_ops} is ignored with "
                        "multi_worker_mirrored; set distribute.communication (auto, ring or nccl)")
    devices = logical if gpu_count else ("/cpu:0",)
    if not gpu_count and config.devices.cpu_logical_devices > 1:
        warnings.append(f"devices.cpu_logical_devices: {config.devices.cpu_logical_devices} does not add replicas "
                        "under multi_worker_mirrored: each worker trains one replica on its CPU")
    communication = dist.communication
    if communication == "nccl" and not gpu_count:
        warnings.append("distribute.communication: nccl needs GPUs; using ring instead")
        communication = "ring"
    if cluster.source == "Slurm" and config.devices.visible_gpus == "all" and len(probe.gpus) > 1 \
            and "CUDA_VISIBLE_DEVICES" not in probe.env and _tasks_on_busiest_node(probe.env) > 1:
        warnings.append(
            f"Slurm runs several tasks on this node and each sees all {len(probe.gpus)} GPUs (tfgpu does not "
            "reassign them behind your back); run one task per node (--ntasks-per-node=1), let Slurm bind GPUs "
            "(--gpus-per-task), or set devices.visible_gpus per task")
    return StrategyPlan("multi_worker_mirrored", devices, communication, cluster)




# Measured on the seed CNN's training step (`python benchmarks/floor.py --jit` against
# without; docs/benchmarks.md): on a 2-core x86 CPU (AVX-512), XLA made it 4.4x slower at
# 4096 samples per replica and 2.8x slower at 128, so `auto` keeps XLA off on CPUs.
CPU_XLA_REASON = "auto: off on CPUs, where XLA measured 2.8-4.4x slower for the seed CNN's step"


# Keras 3.15.1's Trainer._resolve_auto_jit_compile (keras/src/trainers/trainer.py), for TensorFlow:
# False when no physical device is other than a CPU; False when the model was built under a
# tf.distribute strategy (`if self._distribute_strategy: return False`, "Disable XLA with
# tf.distribute"; tf.distribute.has_strategy() is true in any strategy's scope, OneDeviceStrategy
# included, false for the default strategy); else model_supports_jit(model): every layer
# supports XLA and op determinism is off. tfgpu follows it on GPUs; no GPU measurement was made.
_STRATEGY_CLASS = {"one_device": "OneDeviceStrategy", "mirrored": "MirroredStrategy",
                   "multi_worker_mirrored": "MultiWorkerMirroredStrategy"}
KERAS_XLA_RULE = "Keras's jit_compile='auto' turns XLA off under any tf.distribute strategy; not measured by tfgpu"


def resolve_jit(setting: Any, on_gpus: bool, strategy: str, deterministic: bool = False) -> tuple[bool, str]:
    """Resolve ``tensorflow.jit_compile`` for the device kind and the strategy: ``(use XLA, reason)``.

    Args:
        setting: ``"auto"``, ``True`` or ``False``.
        on_gpus: the strategy's devices are GPUs (else CPUs).
        strategy: the plan's strategy kind (``one_device``, ``mirrored``,
            ``multi_worker_mirrored`` or ``default``).
        deterministic: ``tensorflow.deterministic_ops``.

    ``auto`` is off on CPUs (measured, see ``CPU_XLA_REASON``). On GPUs it
    is what Keras 3's own ``jit_compile="auto"`` gives (``KERAS_XLA_RULE``):
    off under any ``tf.distribute`` strategy, so off for tfgpu's usual one GPU
    (``OneDeviceStrategy``) as for several; on only with ``distribute.strategy:
    default`` and without deterministic ops (Keras still turns it off for
    ``fit`` when a layer does not support XLA). The GPU rule is Keras's: tfgpu
    measured no GPU.

    Wraps: https://keras.io/api/models/model_training_apis/#compile-method
    (``jit_compile``) and https://www.tensorflow.org/xla
    """
    if setting != "auto":
        return bool(setting), f"tensorflow.jit_compile: {str(bool(setting)).lower()}"
    if not on_gpus:
        return False, CPU_XLA_REASON
    if strategy in _STRATEGY_CLASS:
        return False, f"auto: off on GPUs under tf.distribute.{_STRATEGY_CLASS[strategy]} ({KERAS_XLA_RULE})"
    if deterministic:
        return False, "auto: off with tensorflow.deterministic_ops (Keras's jit_compile='auto' rule)"
    return True, ("auto: on for a GPU without a tf.distribute strategy (distribute.strategy: default), "
                  "as Keras's jit_compile='auto' gives; not measured by tfgpu")


def make_plan(config: Config, probe: Probe) -> Plan:
    """Translate a configuration for a machine into a :class:`Plan`.

    A pure function: it reads its arguments only and imports no TensorFlow.

    Args:
        config: the validated configuration.
        probe: what the machine offers (see :func:`tfgpu.devices.probe.probe`).

    Returns:
        The plan.

    Raises:
        DeviceError: a request this machine cannot satisfy: a GPU index beyond
            the count, a memory limit above a GPU's total, a fraction without a
            known total, a strategy device that will not exist.
    """
    if config.backend == "jax":
        return make_jax_plan(config, probe)
    warnings: list[str] = []
    dev = config.devices
    tfc = config.tensorflow
    gpus = visible_gpus(config, probe)

    env: dict[str, str] = {}
    if "log_level" in tfc.model_fields_set:
        env["TF_CPP_MIN_LOG_LEVEL"] = str(tfc.log_level)
        if dev.log_device_placement and tfc.log_level > 0:
            warnings.append(
                f"devices.log_device_placement is on but tensorflow.log_level is {tfc.log_level}: TensorFlow "
                "logs placements at INFO level, so they are hidden; set log_level: 0 to see them"
            )
    elif dev.log_device_placement:
        env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    elif "TF_CPP_MIN_LOG_LEVEL" not in probe.env:
        env["TF_CPP_MIN_LOG_LEVEL"] = str(tfc.log_level)
    if tfc.onednn_opts is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = "1" if tfc.onednn_opts else "0"
    env["KERAS_BACKEND"] = "tensorflow"
    if dev.visible_gpus != "all" or probe.gpus:
        if probe.env.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID") != "PCI_BUS_ID":
            warnings.append(
                f"CUDA_DEVICE_ORDER was {probe.env['CUDA_DEVICE_ORDER']}; tfgpu sets PCI_BUS_ID so GPU "
                "indices match nvidia-smi"
            )
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if dev.visible_gpus == "none":
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    elif dev.visible_gpus != "all":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.cuda_name for g in gpus)
    if tfc.gpu_allocator != "default":
        env["TF_GPU_ALLOCATOR"] = tfc.gpu_allocator

    calls: list[TfCall] = []
    if tfc.intra_op_threads:
        calls.append(TfCall("tf.config.threading.set_intra_op_parallelism_threads", None,
                            tfc.intra_op_threads, "tensorflow.intra_op_threads"))
    if tfc.inter_op_threads:
        calls.append(TfCall("tf.config.threading.set_inter_op_parallelism_threads", None,
                            tfc.inter_op_threads, "tensorflow.inter_op_threads"))
    notes: list[str] = []
    calls += _memory_calls(config, gpus, warnings, notes)
    if dev.cpu_logical_devices > 1:
        calls.append(TfCall("tf.config.set_logical_device_configuration", "CPU:0",
                            [None] * dev.cpu_logical_devices, "devices.cpu_logical_devices"))
    calls.append(TfCall("tf.config.set_soft_device_placement", None, dev.soft_placement, "devices.soft_placement"))
    calls.append(TfCall("tf.debugging.set_log_device_placement", None, dev.log_device_placement,
                        "devices.log_device_placement"))
    if tfc.deterministic_ops:
        calls.append(TfCall("tf.config.experimental.enable_op_determinism", None, None, "tensorflow.deterministic_ops"))
        if tfc.seed is None:
            warnings.append("tensorflow.deterministic_ops without tensorflow.seed: runs still differ; set a seed")
    precision = resolve_precision(tfc.mixed_precision, gpus, probe.cpu_flags)
    calls += keras_calls(config, bool(gpus), warnings, precision[0])

    gpu_count = len(gpus) * dev.gpu_logical_devices
    cpu_count = dev.cpu_logical_devices
    logical = tuple(f"/gpu:{i}" for i in range(gpu_count)) or tuple(f"/cpu:{i}" for i in range(cpu_count))
    strategy = _strategy(config, logical, cpu_count, gpu_count, probe, warnings)
    _unequal_gpus(gpus, calls, strategy, dev.gpu_logical_devices, warnings)
    mig = mig_warning(probe, gpus)
    if mig:
        warnings.append(mig)
    replicas = max(1, len(strategy.devices)) * (strategy.cluster.num_workers if strategy.cluster else 1)
    if tfc.jit_compile is True and config.train.loop == "fit" and replicas > 1:
        raise ConfigError(
            f"tensorflow.jit_compile: true (received true) with train.loop: fit and {replicas} replicas: Keras then "
            "compiles the whole distributed step, strategy.run and the cross-replica gradient sum included, "
            "with XLA, which MirroredStrategy does not support (TensorFlow fails in the first step).",
            "use train.loop: custom, which compiles each replica's step with XLA and sums the gradients "
            "outside it, or set tensorflow.jit_compile to auto or false.",
        )
    jit = resolve_jit(tfc.jit_compile, any(d.startswith("/gpu") for d in strategy.devices) or (
        not strategy.devices and bool(gpu_count)), strategy.kind, tfc.deterministic_ops)
    return assemble(config, {k: env[k] for k in ENV_ORDER if k in env}, calls, gpus, logical, strategy, replicas,
                    jit, warnings, precision=precision, notes=tuple(notes))




