"""Read-only discovery of the machine: GPUs through NVML, the environment, and
(for ``tfgpu devices`` / ``tfgpu doctor``) TensorFlow and the CUDA libraries.

This is the one seam where hardware is faked in tests: :func:`probe` returns a
:class:`Probe` and :func:`gather_facts` a :class:`Facts`; planning and the
doctor take them as plain data. Build one by hand
(``Probe(gpus=(GpuInfo(0, "A100", total_mib=40960),))``) or load one that
``tfgpu devices --json`` wrote on another machine (:meth:`Probe.from_dict`) to
plan for, or diagnose, a machine you do not have.

Nothing here imports TensorFlow or initialises CUDA in this process: TensorFlow
is examined in a child process (:func:`probe_tensorflow`), so a TensorFlow that
crashes or hangs at start-up is reported, not fatal; JAX likewise (:func:`probe_jax`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
import typing
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Optional, Sequence

from ..cluster.spec import SLURM_ENV
from ..utils.imports import package_folders
from .startup_log import FILTER_ENV

#: Environment variables that change what TensorFlow sees or does; recorded by the probe.
RELEVANT_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_GPU_ALLOCATOR",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "TF_CONFIG",
    "KERAS_BACKEND",
    "XLA_FLAGS",  # JAX and TensorFlow's XLA (the JAX plan keeps the flags it does not set)
    "JAX_PLATFORMS",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "LD_LIBRARY_PATH",
    "TFGPU_CONFIG",
    "TFGPU_DATA_DIR",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    *SLURM_ENV,  # Slurm's task layout (tfgpu.cluster.spec resolves the workers from it)
    # what else a Slurm allocation gave, for tfgpu doctor (tfgpu.devices.doctor.check_slurm)
    "SLURM_STEP_ID", "SLURM_JOB_NUM_NODES", "SLURM_JOB_PARTITION", "SLURMD_NODENAME", "SLURM_GPUS_ON_NODE",
    "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_PER_TASK",
)

#: Python distributions whose installed versions the doctor reads (TensorFlow's many
#: package names, Keras, NVML's bindings, the CUDA wheels of ``tensorflow[and-cuda]``, and JAX:
#: ``jax``, ``jaxlib`` and the CUDA plugins ``jax[cuda12]`` / ``jax[cuda13]`` install).
PACKAGES = (
    "tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos",
    "tensorflow-metal", "tf-nightly", "tf-nightly-cpu", "keras", "tf-keras", "nvidia-ml-py", "pynvml",
    "nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cufft-cu12",
    "nvidia-cusolver-cu12", "nvidia-cusparse-cu12", "nvidia-nccl-cu12", "nvidia-nvjitlink-cu12",
    "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt",
)

#: CPU flags the probe records (of ``/proc/cpuinfo``'s ``flags``): ``avx512_bf16`` and ``amx_bf16``
#: are the bfloat16 instructions ``tensorflow.mixed_precision: auto`` looks for
#: (:func:`tfgpu.devices.plan_base.resolve_precision`); the others say what else the CPU computes fast.
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
             "amx_fp16")

#: TensorFlow's distributions (any one of them provides ``import tensorflow``).
TENSORFLOW_PACKAGES = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos",
                       "tf-nightly", "tf-nightly-cpu")

#: JAX's CUDA plugins (``pip install -U "jax[cuda12]"`` or ``"jax[cuda13]"``), newest CUDA first; jaxlib
#: itself runs on the CPU only (https://docs.jax.dev/en/latest/installation.html).
JAX_CUDA_PLUGINS = ("jax-cuda13-plugin", "jax-cuda12-plugin")


@dataclass(frozen=True)
class GpuInfo:
    """One CUDA device: a whole physical GPU, or one MIG instance of a GPU.

    A MIG (Multi-Instance GPU) instance is a slice of an A100/H100-class GPU
    with its own memory and compute; CUDA and TensorFlow see it as one GPU
    whose memory is the instance's (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/).

    Attributes:
        index: the index TensorFlow will give it (``/physical_device:GPU:<index>``)
            with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, counting only the devices an
            existing ``CUDA_VISIBLE_DEVICES`` lets through.
        name: the product name, e.g. ``"NVIDIA H100 80GB HBM3"``, or for a MIG
            instance NVML's name with its profile, e.g.
            ``"NVIDIA A100-SXM4-40GB MIG 3g.20gb"``.
        total_mib: total memory in MiB (a MIG instance's own), or ``None`` when unknown.
        uuid: NVML's UUID (``"GPU-..."``; ``"MIG-..."`` for an instance), or ``""``.
        nvml_index: NVML's own index of the physical GPU (for an instance: of
            its parent GPU), or ``None``.
        used_mib: memory in use (by any process) when probed, in MiB, or ``None``.
        compute_capability: ``"major.minor"``, e.g. ``"9.0"``, or ``None``.
        mig_mode: on a physical GPU: ``True`` when MIG mode is enabled (CUDA can
            then use only its instances, not the whole GPU), ``False`` when it is
            disabled, ``None`` when the GPU has no MIG support or NVML did not say.
        parent_uuid: for a MIG instance, the UUID of its physical GPU; ``""`` for a whole GPU.
        gpu_instance_id: for a MIG instance, its GPU instance (GI) id, else ``None``.
        compute_instance_id: for a MIG instance, its compute instance (CI) id, else ``None``.
    """

    index: int
    name: str = "GPU"
    total_mib: Optional[int] = None
    uuid: str = ""
    nvml_index: Optional[int] = None
    used_mib: Optional[int] = None
    compute_capability: Optional[str] = None
    mig_mode: Optional[bool] = None
    parent_uuid: str = ""
    gpu_instance_id: Optional[int] = None
    compute_instance_id: Optional[int] = None

    @property
    def is_mig(self) -> bool:
        """Whether this is a MIG instance (not a whole GPU)."""
        return bool(self.parent_uuid)

    @property
    def cuda_name(self) -> str:
        """What ``CUDA_VISIBLE_DEVICES`` names it by: the MIG UUID for an
        instance (an index would name the whole parent GPU), else the NVML index
        (or, without NVML, the index)."""
        if self.is_mig:
            return self.uuid
        return str(self.nvml_index if self.nvml_index is not None else self.index)

    def label(self) -> str:
        """``"NVIDIA A100 (40960 MiB)"``; an instance adds ``MIG GI 1/CI 0 of GPU <nvml index>``."""
        memory = f"{self.total_mib} MiB" if self.total_mib is not None else "memory unknown"
        if self.is_mig:
            return (f"{self.name} ({memory}; MIG instance GI {self.gpu_instance_id}/CI "
                    f"{self.compute_instance_id} of NVML GPU {self.nvml_index})")
        return f"{self.name} ({memory})"


@dataclass(frozen=True)
class Probe:
    """What the machine offers, as plain data.

    Attributes:
        gpus: the CUDA devices this process may use (whole GPUs and at most
            one MIG instance, see :func:`cuda_visible`), in TensorFlow's order.
        nvml_error: why NVML could not be read (no driver, ...), or ``None``.
        env: the values of :data:`RELEVANT_ENV` that are set.
        platform: ``sys.platform`` (``"linux"``, ``"win32"``, ``"darwin"``).
        nvml_gpus: every physical GPU NVML lists, before ``CUDA_VISIBLE_DEVICES``.
        mig_devices: every MIG instance NVML lists on GPUs in MIG mode, in NVML order.
        driver_version: the NVIDIA driver, e.g. ``"550.54.15"``, or ``None``.
        cuda_driver_version: the newest CUDA the driver supports, e.g. ``"12.4"``.
        nvidia_smi: the path of ``nvidia-smi``, or ``None`` when not on PATH.
        device_nodes: the ``/dev/nvidia*`` files (none in a container started
            without ``--gpus``).
        in_container: a Docker/Podman container (``/.dockerenv`` or
            ``/run/.containerenv`` exists).
        wsl: running under Windows Subsystem for Linux.
        jax_memory_fraction_env: the memory-fraction variable the installed
            jaxlib reads (``XLA_CLIENT_MEM_FRACTION`` in newer releases,
            ``XLA_PYTHON_CLIENT_MEM_FRACTION`` before), read from jaxlib's
            source without importing it; ``None`` without jaxlib.
        shm_mib: the size of ``/dev/shm`` in MiB (:func:`shm_size_mib`), where
            NCCL makes its shared-memory segments; ``None`` where there is none.
        cpu_model: the CPU's ``model name`` from ``/proc/cpuinfo``, or ``None``.
        cpu_flags: which of :data:`CPU_FLAGS` the CPU has (``/proc/cpuinfo``'s
            ``flags``, :func:`read_cpu`), e.g. ``("avx512f", "avx512_bf16")``;
            ``None`` where they could not be read (no ``/proc/cpuinfo``, or a
            machine file written before tfgpu recorded them).
            ``tensorflow.mixed_precision: auto`` reads them; a machine file
            (``tfgpu plan --machine FILE``) fakes them.
        libcuda: where the dynamic linker finds the driver's CUDA library
            ``libcuda.so.1`` (:func:`find_libcuda`, nothing loaded), or ``None``.
    """

    gpus: tuple[GpuInfo, ...] = ()
    nvml_error: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)
    platform: str = "linux"
    nvml_gpus: tuple[GpuInfo, ...] = ()
    mig_devices: tuple[GpuInfo, ...] = ()
    driver_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None
    nvidia_smi: Optional[str] = None
    device_nodes: tuple[str, ...] = ()
    in_container: bool = False
    wsl: bool = False
    jax_memory_fraction_env: Optional[str] = None
    shm_mib: Optional[int] = None
    cpu_model: Optional[str] = None
    cpu_flags: Optional[tuple[str, ...]] = None
    libcuda: Optional[str] = None

    @property
    def no_driver(self) -> bool:
        """No NVIDIA driver at all: NVML could not start and there is no ``libcuda.so.1`` to load. TensorFlow's
        ``failed call to cuInit ... (303)`` at start-up is then expected, not news (:mod:`tfgpu.devices.startup_log`)."""
        return self.nvml_error is not None and not self.nvml_gpus and self.libcuda is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def mig_hidden(self) -> tuple[GpuInfo, ...]:
        """MIG instances ``CUDA_VISIBLE_DEVICES`` lets through (all of them when
        it is unset) that CUDA will not show this process, because a CUDA
        process enumerates one MIG instance only."""
        return tuple(cuda_choice(self.nvml_gpus, self.mig_devices, self.env.get("CUDA_VISIBLE_DEVICES"))[1])

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Probe":
        """The inverse of :meth:`to_dict` (unknown keys are ignored)."""
        return _from_dict(cls, data)


@dataclass(frozen=True)
class TensorflowFacts:
    """TensorFlow as a fresh child process finds it.

    Attributes:
        version: ``tf.__version__``, or ``None`` when it could not be imported.
        import_error: the exception text when ``import tensorflow`` failed (or
            the child crashed or timed out), else ``None``.
        keras_version: ``keras.__version__``, or ``None``.
        build_info: ``tf.sysconfig.get_build_info()`` (``is_cuda_build``,
            ``cuda_version``, ``cudnn_version``, ``cuda_compute_capabilities``).
        physical_devices: ``(name, device_type)`` pairs from
            ``tf.config.list_physical_devices()``.
        logical_devices: likewise from ``tf.config.list_logical_devices()``.
        gpu_details: ``tf.config.experimental.get_device_details`` per GPU.
        log: what TensorFlow printed on stderr while starting (last 6000 characters).
        setup_error: when a config was applied, the tfgpu error it raised.
        seconds: wall time of the child process.
    """

    version: Optional[str] = None
    import_error: Optional[str] = None
    keras_version: Optional[str] = None
    build_info: dict[str, Any] = field(default_factory=dict)
    physical_devices: tuple[tuple[str, str], ...] = ()
    logical_devices: tuple[tuple[str, str], ...] = ()
    gpu_details: tuple[dict[str, Any], ...] = ()
    log: str = ""
    setup_error: Optional[str] = None
    seconds: float = 0.0

    def devices_of(self, kind: str) -> list[str]:
        return [name for name, t in self.physical_devices if t == kind]


@dataclass(frozen=True)
class JaxFacts:
    """JAX (and Keras on it) as a fresh child process finds it, with ``KERAS_BACKEND=jax``.

    Attributes:
        version: ``jax.__version__``, or ``None`` when ``import jax`` failed.
        jaxlib_version: ``jaxlib.__version__``, or ``None``.
        keras_version: ``keras.__version__`` (imported on JAX), or ``None``.
        default_backend: ``jax.default_backend()``: ``"cpu"``, ``"gpu"`` (a CUDA
            or ROCm plugin registered a device) or ``"tpu"``; ``None`` when JAX
            could not start (https://docs.jax.dev/en/latest/_autosummary/jax.default_backend.html).
        devices: ``(name, platform, device_kind)`` per device of ``jax.devices()``,
            the name as Keras writes it (``"gpu:0"``, ``"cpu:1"``), e.g.
            ``("gpu:0", "gpu", "NVIDIA H100 80GB HBM3")`` or ``("cpu:0", "cpu", "cpu")``.
        import_error: the exception text when ``import jax`` (or, with ``version``
            set, ``import keras`` or ``jax.devices()``) failed, or the child crashed
            or timed out; else ``None``.
        setup_error: when a config was given, the tfgpu error its JAX plan raised
            (the devices are then JAX's defaults).
        log: what JAX printed on stderr while starting (last 6000 characters),
            e.g. "An NVIDIA GPU may be present on this machine, but a CUDA-enabled
            jaxlib is not installed. Falling back to cpu."
        seconds: wall time of the child process.
    """

    version: Optional[str] = None
    jaxlib_version: Optional[str] = None
    keras_version: Optional[str] = None
    default_backend: Optional[str] = None
    devices: tuple[tuple[str, str, str], ...] = ()
    import_error: Optional[str] = None
    setup_error: Optional[str] = None
    log: str = ""
    seconds: float = 0.0

    def devices_of(self, platform: str) -> list[str]:
        """The device names of one platform, e.g. ``devices_of("gpu") == ["gpu:0", "gpu:1"]``."""
        return [name for name, kind, _ in self.devices if kind == platform]


@dataclass(frozen=True)
class Library:
    """A shared library TensorFlow's CUDA build loads at start-up.

    Attributes:
        name: the soname, e.g. ``"libcudnn.so.9"``.
        role: what it is, e.g. ``"cuDNN 9"``.
        package: the pip wheel that provides it (``tensorflow[and-cuda]``).
        path: where it was loaded from, or ``None``.
        error: the loader's message when it could not be loaded.
        version: its version where it can be told: the pip wheel's version when
            it was loaded from the wheel, else the part of the file name after
            the soname (``libcudart.so.12.5.82`` -> ``"12.5.82"``); ``None``
            otherwise (and in facts saved before versions were recorded).
    """

    name: str
    role: str
    package: str
    path: Optional[str] = None
    error: Optional[str] = None
    version: Optional[str] = None


@dataclass(frozen=True)
class Facts:
    """Everything ``tfgpu doctor`` judges: the machine, the Python packages,
    TensorFlow (from a child process) and the CUDA libraries.

    Attributes:
        machine: :class:`Probe`.
        packages: installed distribution -> version, for :data:`PACKAGES`.
        tensorflow: :class:`TensorflowFacts`, or ``None`` when not examined.
        libraries: :class:`Library` results, in load order.
        jax: :class:`JaxFacts`, or ``None`` when not examined (JAX is examined
            for ``backend: jax`` only; facts saved before it existed have none).
    """

    machine: Probe = field(default_factory=Probe)
    packages: dict[str, str] = field(default_factory=dict)
    tensorflow: Optional[TensorflowFacts] = None
    libraries: tuple[Library, ...] = ()
    jax: Optional[JaxFacts] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Facts":
        """The inverse of :meth:`to_dict` (unknown keys are ignored)."""
        return _from_dict(cls, data)


def _from_dict(cls: Any, data: Any) -> Any:
    """Rebuild a (nested) frozen dataclass from JSON data."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints[f.name]
        kwargs[f.name] = _coerce(hint, value)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if value is None:
        return None
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value)
    if dataclasses.is_dataclass(hint):
        return _from_dict(hint, value)
    if origin is tuple:
        item = args[0]
        return tuple(_coerce(item, v) for v in value)
    return value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_version(code: int) -> str:
    """NVML's CUDA version integer (12040) as ``"12.4"``."""
    return f"{code // 1000}.{(code % 1000) // 10}"


def _read_nvml(nvml: Any = None) -> dict[str, Any]:
    """All physical GPUs NVML lists, in NVML (PCI bus) order, their MIG instances and
    the driver; or the reason they could not be read.

    Args:
        nvml: the NVML bindings (``pynvml`` from nvidia-ml-py when ``None``).
            This is the one place where hardware facts enter tfgpu: tests pass
            an object with the same functions to describe a machine they do not
            have (MIG instances, mixed GPU models).

    MIG: on a GPU whose current MIG mode is enabled (``nvmlDeviceGetMigMode``),
    each slot below ``nvmlDeviceGetMaxMigDeviceCount`` that holds an instance
    (``nvmlDeviceGetMigDeviceHandleByIndex``; an empty slot raises NotFound)
    is read with the same calls as a GPU, which then report the instance's own
    memory and ``MIG-...`` UUID.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # noqa: PLC0415 - provided by nvidia-ml-py
        except ImportError:
            return {"nvml_error": "nvidia-ml-py is not installed (pip install nvidia-ml-py)"}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return {"nvml_error": f"NVML could not start ({_text(exc)}): no NVIDIA driver is loaded"}
    out: dict[str, Any] = {}

    def optional(read: Any) -> Any:
        try:
            return read()
        except nvml.NVMLError:
            return None

    try:
        out["driver_version"] = optional(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        out["cuda_driver_version"] = optional(lambda: _nvml_version(nvml.nvmlSystemGetCudaDriverVersion()))
        gpus, instances = [], []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            capability = optional(lambda: "{}.{}".format(*nvml.nvmlDeviceGetCudaComputeCapability(handle)))
            modes = optional(lambda: nvml.nvmlDeviceGetMigMode(handle))  # (current, pending); NotSupported: no MIG
            mig_mode = None if modes is None else modes[0] == nvml.NVML_DEVICE_MIG_ENABLE
            gpu = GpuInfo(
                index=i,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                total_mib=int(memory.total // (1024 * 1024)),
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                nvml_index=i,
                used_mib=int(memory.used // (1024 * 1024)),
                compute_capability=capability,
                mig_mode=mig_mode,
            )
            gpus.append(gpu)
            if mig_mode:
                for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                    mig = optional(lambda: nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
                    if mig is None:
                        continue
                    mig_memory = nvml.nvmlDeviceGetMemoryInfo(mig)
                    instances.append(dataclasses.replace(
                        gpu,
                        name=_text(nvml.nvmlDeviceGetName(mig)),
                        total_mib=int(mig_memory.total // (1024 * 1024)),
                        used_mib=int(mig_memory.used // (1024 * 1024)),
                        uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                        mig_mode=None,
                        parent_uuid=gpu.uuid,
                        gpu_instance_id=optional(lambda: int(nvml.nvmlDeviceGetGpuInstanceId(mig))),
                        compute_instance_id=optional(lambda: int(nvml.nvmlDeviceGetComputeInstanceId(mig))),
                    ))
        out["nvml_gpus"] = tuple(gpus)
        out["mig_devices"] = tuple(instances)
    except nvml.NVMLError as exc:
        out["nvml_error"] = f"NVML failed while listing GPUs: {_text(exc)}"
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return out


def _cuda_devices_of(gpu: GpuInfo, mig_devices: Sequence[GpuInfo]) -> list[GpuInfo]:
    """What CUDA can run on for one physical GPU: the GPU, or its MIG instances when MIG mode is on."""
    if gpu.mig_mode:
        return [m for m in mig_devices if m.parent_uuid == gpu.uuid]
    return [gpu]


def _match(entry: str, gpus: Sequence[GpuInfo], mig_devices: Sequence[GpuInfo]) -> Optional[list[GpuInfo]]:
    """The CUDA devices one ``CUDA_VISIBLE_DEVICES`` entry names, or ``None`` when it names none."""
    if entry.isdigit():
        gpu = next((g for g in gpus if g.nvml_index == int(entry)), None)
        return _cuda_devices_of(gpu, mig_devices) if gpu else None
    if entry.startswith("MIG-GPU-"):  # drivers before R470: MIG-GPU-<GPU UUID>/<GI>/<CI>
        parent, _, ids = entry[len("MIG-"):].partition("/")
        gi, _, ci = ids.partition("/")
        found = [m for m in mig_devices if m.parent_uuid == parent and str(m.gpu_instance_id) == gi
                 and str(m.compute_instance_id) == ci]
        return found or None
    if entry.startswith("MIG-"):
        found = [m for m in mig_devices if m.uuid.startswith(entry)]
        return found[:1] if len(found) == 1 else None  # a prefix must name one instance
    if entry.startswith("GPU-"):
        found = [g for g in gpus if g.uuid.startswith(entry)]
        return _cuda_devices_of(found[0], mig_devices) if len(found) == 1 else None
    return None


def cuda_choice(gpus: Sequence[GpuInfo], mig_devices: Sequence[GpuInfo],
                cuda_visible_devices: Optional[str]) -> tuple[list[GpuInfo], list[GpuInfo]]:
    """Apply CUDA's ``CUDA_VISIBLE_DEVICES`` rules to NVML's devices and renumber.

    Args:
        gpus: NVML's physical GPUs (:attr:`Probe.nvml_gpus`).
        mig_devices: NVML's MIG instances (:attr:`Probe.mig_devices`).
        cuda_visible_devices: the variable's value, or ``None`` when unset.

    Returns:
        ``(visible, hidden_mig)``: the devices this process sees, numbered from
        0 in the order given, and the MIG instances it named (or, unset, that
        exist) but cannot see.

    Rules (CUDA's, https://docs.nvidia.com/cuda/cuda-c-programming-guide/#env-vars,
    and NVIDIA's MIG user guide): entries are NVML indices, GPU UUID prefixes
    (``GPU-8f1...``), MIG UUIDs (``MIG-<uuid>``, R470+ drivers) or
    ``MIG-GPU-<GPU UUID>/<GI>/<CI>`` (older drivers); CUDA stops at the first
    entry that names nothing or repeats one, and an empty value or ``-1``
    hides all. A GPU in MIG mode cannot be used whole: an entry naming it
    stands for its instances. A CUDA process enumerates only one MIG instance,
    so after the first instance any further ones are hidden (whole GPUs are not).
    """
    chosen: list[GpuInfo] = []
    if cuda_visible_devices is None:
        for gpu in gpus:
            chosen += _cuda_devices_of(gpu, mig_devices)
    else:
        for entry in (e.strip() for e in cuda_visible_devices.split(",")):
            match = _match(entry, gpus, mig_devices)
            if match is None or any(m in chosen for m in match):
                break
            chosen += match
    visible, hidden = [], []
    for device in chosen:
        if device.is_mig and any(v.is_mig for v in visible):
            hidden.append(device)
        else:
            visible.append(device)
    return [dataclasses.replace(g, index=i) for i, g in enumerate(visible)], hidden


def cuda_visible(gpus: Sequence[GpuInfo], cuda_visible_devices: Optional[str],
                 mig_devices: Sequence[GpuInfo] = ()) -> list[GpuInfo]:
    """The devices this process sees: :func:`cuda_choice`'s first half."""
    return cuda_choice(gpus, mig_devices, cuda_visible_devices)[0]


def probe(nvml: Any = None) -> Probe:
    """Discover the GPUs (and MIG instances) this process may use, without TensorFlow.

    Reads NVML (``nvidia-ml-py``, https://pypi.org/project/nvidia-ml-py/) and
    the environment. Never raises for a missing driver: ``nvml_error`` says why
    no GPU was listed.

    Args:
        nvml: NVML bindings to read instead of ``pynvml`` (see :func:`_read_nvml`;
            tests describe machines they do not have with it).

    Environment variables read: ``CUDA_VISIBLE_DEVICES`` (which GPUs are
    visible, and their renumbering) and the others in :data:`RELEVANT_ENV`.
    """
    found = _read_nvml(nvml)
    env = {k: os.environ[k] for k in RELEVANT_ENV if k in os.environ}
    all_gpus, mig_devices = found.get("nvml_gpus", ()), found.get("mig_devices", ())
    return Probe(
        gpus=tuple(cuda_visible(all_gpus, env.get("CUDA_VISIBLE_DEVICES"), mig_devices)),
        nvml_error=found.get("nvml_error"),
        env=env,
        platform=sys.platform,
        nvml_gpus=tuple(all_gpus),
        mig_devices=tuple(mig_devices),
        driver_version=found.get("driver_version"),
        cuda_driver_version=found.get("cuda_driver_version"),
        nvidia_smi=shutil.which("nvidia-smi"),
        device_nodes=tuple(sorted(glob.glob("/dev/nvidia*"))),
        in_container=in_container(),
        wsl=_is_wsl(),
        jax_memory_fraction_env=jax_fraction_env(),
        shm_mib=shm_size_mib(),
        **dict(zip(("cpu_model", "cpu_flags"), read_cpu())),
        libcuda=find_libcuda(),
    )


def read_cpu(path: str = "/proc/cpuinfo") -> tuple[Optional[str], Optional[tuple[str, ...]]]:
    """The first processor's ``model name`` and which of :data:`CPU_FLAGS` it has, from ``/proc/cpuinfo``.

    Args:
        path: the file to read (Linux's ``/proc/cpuinfo`` format).

    Returns:
        ``(model name or None, flags in CPU_FLAGS's order)``, or ``(None, None)``
        where the file cannot be read or has no ``flags`` line (macOS, Windows).
    """
    model, flags = None, None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "flags" and flags is None:
                    have = set(value.split())
                    flags = tuple(flag for flag in CPU_FLAGS if flag in have)
                if model is not None and flags is not None:
                    break
    except OSError:
        return None, None
    return model, flags


def shm_size_mib(path: str = "/dev/shm") -> Optional[int]:
    """The size of the file system at ``path`` in MiB (``os.statvfs``), or ``None`` where it cannot be read.

    Docker, Podman and Kubernetes give a container a 64 MiB ``/dev/shm``
    unless told otherwise; a Linux host's is half its memory.
    """
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):  # no such path; no statvfs on Windows
        return None
    return st.f_blocks * st.f_frsize // 2**20


def jax_fraction_env() -> Optional[str]:
    """The memory-fraction variable the installed jaxlib reads, from its ``xla_client.py`` (not imported):
    ``XLA_CLIENT_MEM_FRACTION`` where jaxlib knows that name (it also reads the deprecated
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` and refuses the two together), else ``XLA_PYTHON_CLIENT_MEM_FRACTION``;
    ``None`` without jaxlib."""
    folders = package_folders("jaxlib")
    if not folders:
        return None
    for folder in folders:
        try:
            text = Path(folder, "xla_client.py").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        return "XLA_CLIENT_MEM_FRACTION" if "XLA_CLIENT_MEM_FRACTION" in text else "XLA_PYTHON_CLIENT_MEM_FRACTION"
    return None


#: Where drivers put ``libcuda.so.1`` besides the linker's cache: Debian/Ubuntu, RHEL, the NVIDIA Container
#: Toolkit's mount, WSL.
LIBCUDA_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib")


def find_libcuda(ld_cache: str = "/etc/ld.so.cache") -> Optional[str]:
    """The ``libcuda.so.1`` the dynamic linker would load, or ``None``, found without loading it.

    Looks in ``LD_LIBRARY_PATH``'s folders, then in the linker's cache (``/etc/ld.so.cache``, which
    ``ldconfig`` writes), then in :data:`LIBCUDA_DIRS`. A CUDA toolkit's ``stubs`` folder does not count
    (its ``libcuda.so`` only links programs; it has no driver behind it).
    """
    name = "libcuda.so.1"
    folders = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d and "stubs" not in d]
    for folder in folders:
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    try:
        with open(ld_cache, "rb") as f:
            cached = re.findall(rb"\0(/[^\0]*/libcuda\.so\.1)\0", f.read())
    except OSError:
        cached = []
    for path in cached:
        if b"stubs" not in path:
            return path.decode("utf-8", "replace")
    for folder in LIBCUDA_DIRS:
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def in_container() -> bool:
    """Whether this process runs in a Docker or Podman container: ``/.dockerenv`` (Docker) or
    ``/run/.containerenv`` (Podman) exists."""
    return os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")


def _is_wsl() -> bool:
    try:
        with open("/proc/version", encoding="utf-8") as f:
            return "microsoft" in f.read().lower()
    except OSError:
        return False


def probe_packages() -> dict[str, str]:
    """Installed versions of :data:`PACKAGES` (from package metadata; nothing is imported)."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def probe_tensorflow(config: Optional[dict[str, Any]] = None, logical: bool = True,
                     timeout: float = 240.0) -> TensorflowFacts:
    """Start TensorFlow in a child process and report what it sees.

    Args:
        config: a config dict to apply with :func:`tfgpu.setup` first (so the
            logical devices reflect its splits), or ``None`` for TensorFlow's defaults.
        logical: also list logical devices. That initialises the GPUs (a CUDA
            context on each, with memory growth on unless ``config`` says
            otherwise); without it no GPU memory is touched.
        timeout: seconds before the child is abandoned (reported as an import error).

    Returns:
        :class:`TensorflowFacts`; never raises for a broken TensorFlow.
    """
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")  # the start-up log is evidence for the doctor
    env[FILTER_ENV] = "0"  # a config's tfgpu.setup() in the child holds nothing back: its stderr is the log
    return _child_facts("tfgpu.devices.seen_by_tf", {"config": config, "logical": logical}, env, timeout, TensorflowFacts,
                        "TensorFlow", "a crash while importing TensorFlow, e.g. an illegal instruction on a CPU "
                        "without AVX")


def _child_facts(module: str, request: dict[str, Any], env: dict[str, str], timeout: float, facts_class: Any,
                 what: str, crash: str) -> Any:
    """Run ``python -m module`` with ``request`` as JSON on stdin; its last stdout line, as ``facts_class``.

    Never raises: a timeout, a crash or an unreadable report becomes ``import_error`` (with the child's stderr
    as ``log``)."""
    started = time.perf_counter()
    try:
        child = subprocess.run([sys.executable, "-m", module], input=json.dumps(request), capture_output=True,
                               text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        return facts_class(import_error=f"{what} did not start within {timeout:.0f} s",
                           log=_text(exc.stderr or "")[-6000:], seconds=timeout)
    seconds = time.perf_counter() - started
    last = child.stdout.strip().splitlines()[-1:] or [""]
    try:
        data = json.loads(last[0])
    except json.JSONDecodeError:
        return facts_class(import_error=f"the {what} child process exited with code {child.returncode} before "
                                        f"reporting ({crash})", log=child.stderr[-6000:], seconds=seconds)
    if not isinstance(data, dict):
        return facts_class(import_error=f"the {what} child process reported {last[0][:200]!r}",
                           log=child.stderr[-6000:], seconds=seconds)
    return dataclasses.replace(_from_dict(facts_class, data), log=child.stderr[-6000:], seconds=seconds)


def tensorflow_installed(packages: dict[str, str]) -> bool:
    """Whether any TensorFlow distribution is among ``packages`` (:func:`probe_packages`' result)."""
    return any(name in packages for name in TENSORFLOW_PACKAGES)


def probe_jax(config: Optional[dict[str, Any]] = None, timeout: float = 240.0) -> JaxFacts:
    """Start JAX (and Keras on it) in a child process and report what it sees; TensorFlow is never imported.

    The child (``python -m tfgpu.devices.seen_by_jax``) runs with ``KERAS_BACKEND=jax``,
    lists ``jax.devices()`` and ``jax.default_backend()``
    (https://docs.jax.dev/en/latest/_autosummary/jax.devices.html) and imports
    Keras. Listing the devices starts JAX's backends: on a GPU that creates a
    CUDA context, so without a config the child sets
    ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` and takes no GPU memory from a job
    running beside it (JAX would otherwise take 75% of each GPU at once,
    https://docs.jax.dev/en/latest/gpu_memory_allocation.html).

    Args:
        config: a config dict (``backend: jax``); its JAX plan
            (:func:`tfgpu.devices.plan.make_plan` on this machine's :func:`probe`) sets
            the environment (``CUDA_VISIBLE_DEVICES``, ``JAX_PLATFORMS``,
            ``XLA_FLAGS``' CPU device count, memory variables) before JAX is
            imported, so the devices are the ones a run gets. ``None``: JAX's defaults.
        timeout: seconds before the child is abandoned (reported as an import error).

    Returns:
        :class:`JaxFacts`; never raises for a missing or broken JAX (``import_error`` says why).
    """
    env = dict(os.environ)
    env["KERAS_BACKEND"] = "jax"
    env[FILTER_ENV] = "0"
    return _child_facts("tfgpu.devices.seen_by_jax", {"config": config}, env, timeout, JaxFacts, "JAX",
                        "a crash while starting JAX, e.g. a jaxlib built for a newer CPU, or a CUDA plugin that "
                        "does not match jaxlib")


#: The libraries TensorFlow's CUDA 12 build dlopens, with their pip wheels (``tensorflow[and-cuda]``).
CUDA12_LIBRARIES = (
    ("libcuda.so.1", "the NVIDIA driver's CUDA library", ""),
    ("libcudart.so.12", "CUDA 12 runtime", "nvidia-cuda-runtime-cu12"),
    ("libcublas.so.12", "cuBLAS 12", "nvidia-cublas-cu12"),
    ("libcublasLt.so.12", "cuBLASLt 12", "nvidia-cublas-cu12"),
    ("libcufft.so.11", "cuFFT 11", "nvidia-cufft-cu12"),
    ("libcusolver.so.11", "cuSOLVER 11", "nvidia-cusolver-cu12"),
    ("libcusparse.so.12", "cuSPARSE 12", "nvidia-cusparse-cu12"),
    ("libnvJitLink.so.12", "nvJitLink 12", "nvidia-nvjitlink-cu12"),
    ("libnccl.so.2", "NCCL 2", "nvidia-nccl-cu12"),
    ("libcurand.so.10", "cuRAND 10", "nvidia-curand-cu12"),
    ("libcupti.so.12", "CUPTI 12 (the profiler's)", "nvidia-cuda-cupti-cu12"),
)


def _wheel_dirs() -> list[str]:
    """``site-packages/nvidia/*/lib``: where TensorFlow's RUNPATH finds the pip CUDA wheels."""
    dirs = []
    for base in sys.path:
        dirs += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib")))
    return dirs


def cuda_libraries(cudnn_major: str = "9") -> list[tuple[str, str, str]]:
    """``(soname, role, pip wheel)`` of each library TensorFlow's CUDA 12 build loads, in load order."""
    return [*CUDA12_LIBRARIES[:7], (f"libcudnn.so.{cudnn_major}", f"cuDNN {cudnn_major}", "nvidia-cudnn-cu12"),
            *CUDA12_LIBRARIES[7:]]


def _loaded_file(name: str, maps: str = "/proc/self/maps") -> Optional[str]:
    """The file this process mapped for the library ``name`` (after loading it by soname), or ``None``."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        base = os.path.basename(path)
        if base == name or base.startswith(name + "."):
            return path
    return None


def _library_version(path: str, name: str, package: str) -> Optional[str]:
    """The version of the library at ``path``: its pip wheel's when the file is in a wheel, else the
    file name's after the soname (``libcudart.so.12.5.82``), else ``None``."""
    real = os.path.realpath(path)
    if package and f"{os.sep}nvidia{os.sep}" in real:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    base = os.path.basename(real)
    if base.startswith(name + "."):
        return base.split(".so.", 1)[1]
    return None


def probe_libraries(cudnn_major: str = "9", platform: str = sys.platform) -> tuple[Library, ...]:
    """Try to load each CUDA library TensorFlow needs, the way TensorFlow looks for it.

    First by soname (``LD_LIBRARY_PATH``, the ``ldconfig`` cache), then in the
    ``nvidia-*-cu12`` wheels' ``lib`` folders. Loading a library does not
    initialise CUDA (``ctypes.CDLL``, i.e. ``dlopen``). Each result has the
    file loaded and its version where it can be told (:class:`Library`).
    Returns nothing off Linux (TensorFlow has no CUDA build there).
    """
    if not platform.startswith("linux"):
        return ()
    dirs = _wheel_dirs()
    results = []
    for name, role, package in cuda_libraries(cudnn_major):
        path, error, version = None, None, None
        try:
            ctypes.CDLL(name)
            loaded = _loaded_file(name)
            path = loaded or name + " (system library path)"
            version = _library_version(loaded, name, package) if loaded else None
        except OSError as exc:
            error = str(exc)
            for folder in dirs:
                candidate = os.path.join(folder, name)
                if os.path.exists(candidate):
                    try:
                        ctypes.CDLL(candidate)
                        path, error = candidate, None
                        version = _library_version(candidate, name, package)
                        break
                    except OSError as inner:
                        error = str(inner)
        results.append(Library(name, role, package, path, error, version))
    return tuple(results)


def gather_facts(tensorflow: bool = True, jax: bool = False) -> Facts:
    """Everything the doctor needs: :func:`probe`, :func:`probe_packages`,
    :func:`probe_tensorflow` (physical devices only, so no GPU memory is
    touched; skipped with ``tensorflow=False``), :func:`probe_libraries` and,
    with ``jax=True`` (``backend: jax``), :func:`probe_jax` with JAX's defaults.

    With ``jax=True`` TensorFlow is not started where no TensorFlow package is
    installed (a JAX-only environment: nothing to examine)."""
    machine = probe()
    packages = probe_packages()
    if jax and not tensorflow_installed(packages):
        tensorflow = False
    tf_facts = probe_tensorflow(logical=False) if tensorflow else None
    cudnn = str((tf_facts.build_info.get("cudnn_version") if tf_facts else None) or "9").split(".")[0]
    return Facts(machine=machine, packages=packages, tensorflow=tf_facts,
                 libraries=probe_libraries(cudnn, machine.platform), jax=probe_jax() if jax else None)


def load_facts(path: str, option: str = "--machine") -> Facts:
    """Read facts saved by ``tfgpu devices --json`` or ``tfgpu doctor --json`` (or a bare probe).

    Raises:
        ConfigError: the file is missing or is not such a JSON document.
    """
    from ..errors import ConfigError  # noqa: PLC0415

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot read the file ({exc.strerror}).",
                          "give the JSON written by 'tfgpu devices --json > FILE' on the machine to plan for.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{option} {path}: not JSON ({exc}).",
                          "give the JSON written by 'tfgpu devices --json > FILE'.") from None
    if isinstance(data, dict) and isinstance(data.get("facts"), dict):
        data = data["facts"]
    try:
        if isinstance(data, dict) and isinstance(data.get("machine"), dict):
            return Facts.from_dict(data)
        if isinstance(data, dict) and "gpus" in data:
            return Facts(machine=Probe.from_dict(data))
        raise TypeError("no 'machine' or 'gpus' key")
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ConfigError(f"{option} {path}: not a tfgpu facts file ({exc}).",
                          "give the JSON written by 'tfgpu devices --json' or 'tfgpu doctor --json'.") from None


def versions(backend: str) -> dict[str, Optional[str]]:
    """``summary.json``'s ``versions``: tfgpu, Python, Keras and the backend's packages (TensorFlow's version only
    where it is imported, so a JAX run never imports it). ``tfgpu export`` and MLflow's tags report the same."""
    import platform  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from importlib import metadata  # noqa: PLC0415

    import keras  # noqa: PLC0415

    from ..version import __version__  # noqa: PLC0415

    found: dict[str, Optional[str]] = {"tfgpu": __version__, "keras": keras.__version__,
                                       "python": platform.python_version()}
    found["tensorflow"] = getattr(sys.modules.get("tensorflow"), "__version__", None)
    if backend == "jax":
        for name in ("jax", "jaxlib"):
            try:
                found[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                found[name] = None
    return found
