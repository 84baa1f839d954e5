"""Config + probe -> the JAX backend's plan: a pure function, no JAX, no TensorFlow, no process state.

On ``backend: jax`` the device settings become JAX's environment variables,
read when JAX starts its backends (the first JAX operation), and a few Keras
calls; ``docs/jax.md`` has the table. Settings with no JAX counterpart never
reach here: the config refuses them (:data:`tfgpu.config.schema._JAX_REFUSED`).

Wraps: https://docs.jax.dev/en/latest/gpu_memory_allocation.html and
https://keras.io/api/distribution/
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable, Optional

from ..config import Config, normalise_device
from ..errors import DeviceError
from .plan_base import (Plan, StrategyPlan, TfCall, assemble, keras_calls, memory_caps, mig_warning,
                        resolve_precision, visible_gpus)
from .probe import GpuInfo, Probe

#: Keys of a JAX plan's environment, in the order they are set.
JAX_ENV_ORDER = ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL", "TF_FORCE_GPU_ALLOW_GROWTH", "CUDA_DEVICE_ORDER",
                 "CUDA_VISIBLE_DEVICES", "JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_CLIENT_MEM_FRACTION",
                 "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_FLAGS")
#: The memory-fraction variable of jaxlib releases that predate ``XLA_CLIENT_MEM_FRACTION`` (and still
#: read, deprecated, by those that have it; jaxlib refuses the two together).
OLD_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
NEW_FRACTION_ENV = "XLA_CLIENT_MEM_FRACTION"
#: ``tensorflow.gpu_allocator`` -> ``XLA_PYTHON_CLIENT_ALLOCATOR`` (jaxlib accepts default, platform, bfc,
#: cuda_async, vmm).
ALLOCATORS = {"cuda_malloc_async": "cuda_async"}
CPU_COUNT_FLAG = "--xla_force_host_platform_device_count"
DETERMINISM_FLAG = "--xla_gpu_deterministic_ops"
#: How long XLA:CPU lets a collective's rendezvous (every CPU device's step arriving at its all-reduce) go on after
#: its "may be stuck" warning (at 20 s) before it stops the process with SIGABRT; jaxlib 0.10.2's default is 40 s,
#: 60 s in all (measured: a device 75 s late aborts the default, 45 s does not). Seen on this project's 2-core
#: machine under a parallel test suite's load: the seed recipe's all-reduce on 2 CPU devices ran out of those
#: 40 s and the run died in epoch 1 (issue 34). Not reproduced here: beside 2 and 4 concurrent trainings, 21 runs
#: finished and no rendezvous waited even 1 s (the warning flag at 1 s, 3 of them), so that wait was one device's
#: thread held up, not the usual pace of a loaded machine. tfgpu lets such a wait go on 10 minutes more (XLA
#: still warns at 20 s, and says 'unstuck after ...' when it ends); a real deadlock still ends the run, later.
CPU_COLLECTIVE_TIMEOUT_FLAG = "--xla_cpu_collective_call_terminate_timeout_seconds"
CPU_COLLECTIVE_TIMEOUT_SECONDS = 600
JIT_REASON = "JAX: Keras's JAX trainer compiles every step with XLA (jax.jit)"


def _set_flag(flags: list[str], name: str, value: str) -> list[str]:
    """``flags`` with ``name=value`` replacing any earlier ``name=...``."""
    return [f for f in flags if f.split("=", 1)[0] != name] + [f"{name}={value}"]


def _flag(flags: list[str], name: str) -> Optional[str]:
    return next((f.split("=", 1)[1] for f in flags if f.split("=", 1)[0] == name and "=" in f), None)


def _fraction(config: Config, gpus: list[GpuInfo], warnings: list[str]) -> tuple[str, float]:
    """``(config key, the one memory fraction JAX takes for every GPU)`` from a limit or fraction (or their lists)."""
    fractions = []
    caps = memory_caps(config, gpus)
    key = caps[0][0]
    for i, (gpu, (_, cap)) in enumerate(zip(gpus, caps)):
        if gpu.total_mib is None:
            raise DeviceError(
                f"{key}: {cap} needs GPU {i}'s total memory to become JAX's memory fraction, and NVML could not "
                "report it.", "install nvidia-ml-py and the NVIDIA driver, or leave the memory keys unset "
                "(memory growth: XLA_PYTHON_CLIENT_PREALLOCATE=false).")
        if key == "devices.memory_limit_mib":
            if cap > gpu.total_mib:
                raise DeviceError(
                    f"devices.memory_limit_mib: {cap} MiB is more than GPU {i} ({gpu.name}) has: {gpu.total_mib} MiB "
                    "in total.", f"set a limit of at most {gpu.total_mib} MiB, or use devices.memory_fraction.")
            fractions.append(cap / gpu.total_mib)
        else:
            fractions.append(float(cap))
    # Rounded down to 1/1000, so no GPU is given more than asked.
    fraction = math.floor(min(fractions) * 1000) / 1000
    if fraction <= 0:
        raise DeviceError(f"{key}: {caps[0][1]} is less than 1/1000 of a GPU's memory, the smallest memory fraction "
                          "tfgpu gives JAX.", "raise the cap, or leave the memory keys unset (memory growth).")
    if len({round(f, 3) for f in fractions}) > 1:
        asked = ", ".join(f"GPU:{i} {f:.3f}" for i, f in enumerate(fractions))
        warnings.append(
            f"{key}: JAX takes one memory fraction for every GPU (of each GPU's own total), and the values asked "
            f"differ ({asked}); {fraction:g} is applied to every GPU, the smallest, so no GPU gets more than asked")
    return key, fraction


def _memory_env(config: Config, gpus: list[GpuInfo], probe: Probe, put: Callable[[str, str, str], None], warnings: list[str],
                notes: list[str]) -> None:
    dev = config.devices
    limited = dev.memory_limit_mib is not None or dev.memory_fraction is not None
    if not gpus:
        asked = [k for k in ("memory_growth", "memory_limit_mib", "memory_fraction") if k in dev.model_fields_set]
        if asked:
            notes.append("no GPU is visible, so devices." + ", devices.".join(asked) + " has nothing to apply to")
        return
    if not limited:
        growth = dev.memory_growth if dev.memory_growth is not None else True
        # false: JAX's own default, made explicit: 75% of each GPU (or XLA_CLIENT_MEM_FRACTION) taken at start.
        put("XLA_PYTHON_CLIENT_PREALLOCATE", "false" if growth else "true", "devices.memory_growth")
        return
    key, fraction = _fraction(config, gpus, warnings)
    if dev.memory_growth:
        warnings.append(
            f"devices.memory_growth: true and {key} are both set; tfgpu applies the cap (JAX preallocates "
            f"{fraction:g} of each GPU) and not memory growth, as on TensorFlow; remove one of them to silence this")
    name = probe.jax_memory_fraction_env or OLD_FRACTION_ENV
    put(name, f"{fraction:g}", key)
    other = OLD_FRACTION_ENV if name == NEW_FRACTION_ENV else NEW_FRACTION_ENV
    if probe.env.get(other):
        # jaxlib refuses both names at once; an empty value counts as unset.
        put(other, "", key)
        warnings.append(f"{other}={probe.env[other]} was set; tfgpu sets {name} (the name the installed jaxlib "
                        f"reads) and empties {other}, which jaxlib refuses beside it")


def _devices(config: Config, gpus: list[GpuInfo], cpu_count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(every JAX device the run will have, the ones the data-parallel mesh uses), as ``"gpu:0"``, ``"cpu:1"``."""
    everything = tuple(f"gpu:{i}" for i in range(len(gpus))) or tuple(f"cpu:{i}" for i in range(cpu_count))
    asked = config.distribute.devices
    if not asked:
        return everything, everything
    chosen = tuple(normalise_device(d).lstrip("/") for d in asked)
    if len(chosen) == 1 and chosen != everything[:1] and chosen[0] in everything:
        raise DeviceError(
            f"distribute.devices: {chosen[0]} alone (received {list(asked)}): on JAX one device means JAX's default "
            f"device, {everything[0]}, and tfgpu does not move the model elsewhere.",
            "choose the GPU with devices.visible_gpus (e.g. [2]), which makes it JAX's first device.")
    missing = [d for d in chosen if d not in everything]
    if missing:
        raise DeviceError(
            f"distribute.devices: {missing[0]} was requested (received {list(asked)}), but JAX will have: "
            f"{', '.join(everything)}.",
            "name existing devices, make more GPUs visible, or raise devices.cpu_logical_devices (JAX's "
            f"{CPU_COUNT_FLAG}).")
    return everything, chosen


def make_jax_plan(config: Config, probe: Probe) -> Plan:
    """Translate a ``backend: jax`` configuration for a machine into a :class:`~tfgpu.devices.plan.Plan`.

    A pure function, like :func:`tfgpu.devices.plan.make_plan` (which calls it): the
    plan's ``env`` holds JAX's environment variables, each with the config key
    it comes from in ``env_settings``; ``tf_calls`` holds the Keras calls
    (seed, dtype policy, ``keras.distribution.set_distribution``).

    Raises:
        DeviceError: a GPU index beyond the count, a limit above a GPU's total,
            a memory cap without a known total, a device that will not exist.
    """
    warnings: list[str] = []
    env: dict[str, str] = {}
    why: dict[str, str] = {}
    dev, tfc, dist = config.devices, config.tensorflow, config.distribute

    def put(key: str, value: str, setting: str) -> None:
        env[key] = value
        why[key] = setting

    platforms = probe.env.get("JAX_PLATFORMS", "").lower()
    if platforms and not {"cuda", "gpu"} & set(platforms.split(",")) and probe.gpus and dev.visible_gpus != "none":
        warnings.append(f"JAX_PLATFORMS={probe.env['JAX_PLATFORMS']} is set, so JAX uses no GPU: planned for "
                        f"its CPU devices, not the {len(probe.gpus)} GPU(s) NVML lists; unset JAX_PLATFORMS to "
                        "train on them")
        probe = dataclasses.replace(probe, gpus=())
    gpus = visible_gpus(config, probe)
    put("KERAS_BACKEND", "jax", "backend")
    if "log_level" in tfc.model_fields_set or "TF_CPP_MIN_LOG_LEVEL" not in probe.env:
        put("TF_CPP_MIN_LOG_LEVEL", str(tfc.log_level), "tensorflow.log_level")  # jaxlib's and XLA's C++ logs too
    # Keras sets it for every backend but TensorFlow, so that TensorFlow, where it is installed for tf.data,
    # does not take the GPUs' memory from JAX; tfgpu keeps it true.
    if probe.env.get("TF_FORCE_GPU_ALLOW_GROWTH", "true").lower() != "true":
        warnings.append(f"TF_FORCE_GPU_ALLOW_GROWTH was {probe.env['TF_FORCE_GPU_ALLOW_GROWTH']}; with backend: jax "
                        "tfgpu sets true, so a TensorFlow used for data does not take the GPUs' memory from JAX")
    put("TF_FORCE_GPU_ALLOW_GROWTH", "true", "backend")
    if dev.visible_gpus != "all" or probe.gpus:
        put("CUDA_DEVICE_ORDER", "PCI_BUS_ID", "devices.visible_gpus")
    if dev.visible_gpus == "none":
        put("CUDA_VISIBLE_DEVICES", "-1", "devices.visible_gpus")
        put("JAX_PLATFORMS", "cpu", "devices.visible_gpus")
    elif dev.visible_gpus != "all":
        put("CUDA_VISIBLE_DEVICES", ",".join(g.cuda_name for g in gpus), "devices.visible_gpus")
    notes: list[str] = []
    _memory_env(config, gpus, probe, put, warnings, notes)
    if tfc.gpu_allocator in ALLOCATORS:
        put("XLA_PYTHON_CLIENT_ALLOCATOR", ALLOCATORS[tfc.gpu_allocator], "tensorflow.gpu_allocator")

    flags = probe.env.get("XLA_FLAGS", "").split()
    flag_keys = []
    if dev.cpu_logical_devices > 1 or "cpu_logical_devices" in dev.model_fields_set:  # a key set wins over XLA_FLAGS
        flags = _set_flag(flags, CPU_COUNT_FLAG, str(dev.cpu_logical_devices))
        flag_keys.append("devices.cpu_logical_devices")
        if dev.cpu_logical_devices > 1 and not gpus and _flag(flags, CPU_COLLECTIVE_TIMEOUT_FLAG) is None:
            # Data parallel over CPU devices all-reduces in this process (XLA:CPU's collectives); a value
            # already in XLA_FLAGS is kept.
            flags = _set_flag(flags, CPU_COLLECTIVE_TIMEOUT_FLAG, str(CPU_COLLECTIVE_TIMEOUT_SECONDS))
    if tfc.deterministic_ops:
        flags = _set_flag(flags, DETERMINISM_FLAG, "true")
        flag_keys.append("tensorflow.deterministic_ops")
        if tfc.seed is None:
            warnings.append("tensorflow.deterministic_ops without tensorflow.seed: runs still differ; set a seed")
    if flag_keys:
        put("XLA_FLAGS", " ".join(flags), ", ".join(flag_keys))
    counted = _flag(flags, CPU_COUNT_FLAG)
    cpu_count = int(counted) if counted and re.fullmatch(r"\d+", counted) and int(counted) > 0 else 1

    precision = resolve_precision(tfc.mixed_precision, gpus, probe.cpu_flags)
    calls = keras_calls(config, bool(gpus), warnings, precision[0])

    everything, chosen = _devices(config, gpus, cpu_count)
    if dist.strategy == "default":
        if dist.devices:
            warnings.append("distribute.devices is ignored with strategy: default")
        strategy = StrategyPlan("default", (), None)
    elif len(chosen) > 1:
        strategy = StrategyPlan("data_parallel", chosen, None)
        calls.append(TfCall("keras.distribution.set_distribution", None, list(chosen), "distribute.strategy"))
    else:
        strategy = StrategyPlan("single_device", chosen[:1], None)
    used = sorted({int(d.split(":")[1]) for d in strategy.devices if d.startswith("gpu:")})
    if len({(gpus[i].name, gpus[i].total_mib) for i in used}) > 1:
        listed = ", ".join(f"GPU:{i} {gpus[i].label()}" for i in used)
        warnings.append(f"data parallel over unequal GPUs: {listed}; every replica runs the same step on the same "
                        "per-replica batch, so the slowest GPU sets the pace; choose alike GPUs with "
                        "devices.visible_gpus")
    mig = mig_warning(probe, gpus)
    if mig:
        warnings.append(mig)
    replicas = max(1, len(strategy.devices))
    if tfc.jit_compile is False:
        jit = (False, "tensorflow.jit_compile: false: Keras runs each JAX step eagerly, without XLA (slow)")
    else:
        jit = (True, JIT_REASON)
    return assemble(config, {k: env[k] for k in JAX_ENV_ORDER if k in env}, calls, gpus, everything, strategy,
                    replicas, jit, warnings, precision=precision, backend="jax", notes=tuple(notes),
                    env_settings={k: why[k] for k in JAX_ENV_ORDER if k in env})
