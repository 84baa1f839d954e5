"""Read-only discovery of the machine: GPUs through NVML, and the environment.

This is the one seam where hardware is faked in tests: :func:`probe` returns a
:class:`Probe`, and planning takes a :class:`Probe` as plain data. Build one by
hand (``Probe(gpus=(GpuInfo(0, "A100", total_mib=40960),))``) to plan for a
machine you do not have.

Nothing here imports TensorFlow or initialises CUDA.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

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
    "TFGPU_CONFIG",
    "TFGPU_DATA_DIR",
)


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as this process can use it.

    Attributes:
        index: the index TensorFlow will give it (``/physical_device:GPU:<index>``)
            with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, counting only GPUs an
            existing ``CUDA_VISIBLE_DEVICES`` lets through.
        name: the product name, e.g. ``"NVIDIA H100 80GB HBM3"``.
        total_mib: total memory in MiB, or ``None`` when unknown.
        uuid: NVML's UUID (``"GPU-..."``), or ``""``.
        nvml_index: NVML's own index (all GPUs of the machine), or ``None``.
    """

    index: int
    name: str = "GPU"
    total_mib: Optional[int] = None
    uuid: str = ""
    nvml_index: Optional[int] = None


@dataclass(frozen=True)
class Probe:
    """What the machine offers, as plain data.

    Attributes:
        gpus: the GPUs this process may use, in TensorFlow's order.
        nvml_error: why NVML could not be read (no driver, ...), or ``None``.
        env: the values of :data:`RELEVANT_ENV` that are set.
        tf_imported: whether ``tensorflow`` was already imported.
        platform: ``sys.platform``.
    """

    gpus: tuple[GpuInfo, ...] = ()
    nvml_error: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)
    tf_imported: bool = False
    platform: str = "linux"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_nvml() -> tuple[list[GpuInfo], Optional[str]]:
    """All GPUs NVML lists, in NVML (PCI bus) order; or the reason it could not."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return [], "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"NVML could not start ({_text(exc)}): no NVIDIA driver is loaded"
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                GpuInfo(
                    index=i,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    total_mib=int(memory.total // (1024 * 1024)),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    nvml_index=i,
                )
            )
        return gpus, None
    except pynvml.NVMLError as exc:
        return [], f"NVML failed while listing GPUs: {_text(exc)}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def cuda_visible(gpus: list[GpuInfo], cuda_visible_devices: Optional[str]) -> list[GpuInfo]:
    """Apply CUDA's ``CUDA_VISIBLE_DEVICES`` rules to NVML's list and renumber.

    Entries are NVML indices or UUID prefixes (``GPU-8f1...``); CUDA stops at the
    first entry that matches no GPU, and an empty value or ``-1`` hides all.
    """
    if cuda_visible_devices is None:
        return [GpuInfo(i, g.name, g.total_mib, g.uuid, g.nvml_index) for i, g in enumerate(gpus)]
    chosen: list[GpuInfo] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        match = None
        if entry.isdigit():
            match = next((g for g in gpus if g.nvml_index == int(entry)), None)
        elif entry.startswith(("GPU-", "MIG-")):
            match = next((g for g in gpus if g.uuid.startswith(entry)), None)
        if match is None or match in chosen:
            break
        chosen.append(match)
    return [GpuInfo(i, g.name, g.total_mib, g.uuid, g.nvml_index) for i, g in enumerate(chosen)]


def probe() -> Probe:
    """Discover the GPUs this process may use, without TensorFlow.

    Reads NVML (``nvidia-ml-py``, https://pypi.org/project/nvidia-ml-py/) and
    the environment. Never raises for a missing driver: ``nvml_error`` says why
    no GPU was listed.

    Environment variables read: ``CUDA_VISIBLE_DEVICES`` (which GPUs are
    visible, and their renumbering) and the others in :data:`RELEVANT_ENV`.
    """
    all_gpus, error = _read_nvml()
    env = {k: os.environ[k] for k in RELEVANT_ENV if k in os.environ}
    return Probe(
        gpus=tuple(cuda_visible(all_gpus, env.get("CUDA_VISIBLE_DEVICES"))),
        nvml_error=error,
        env=env,
        tf_imported="tensorflow" in sys.modules,
        platform=sys.platform,
    )
