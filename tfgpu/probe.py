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
crashes or hangs at start-up is reported, not fatal.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import time
import typing
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any, Optional, Sequence

from .cluster import SLURM_ENV

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
    "LD_LIBRARY_PATH",
    "TFGPU_CONFIG",
    "TFGPU_DATA_DIR",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    *SLURM_ENV,  # Slurm's task layout (tfgpu.cluster resolves the workers from it)
)

#: Python distributions the doctor looks at (name -> what it is).
PACKAGES = (
    "tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos",
    "tensorflow-metal", "tf-nightly", "tf-nightly-cpu", "keras", "tf-keras", "nvidia-ml-py", "pynvml",
    "nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cufft-cu12",
    "nvidia-cusolver-cu12", "nvidia-cusparse-cu12", "nvidia-nccl-cu12", "nvidia-nvjitlink-cu12",
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
        used_mib: memory in use (by any process) when probed, in MiB, or ``None``.
        compute_capability: ``"major.minor"``, e.g. ``"9.0"``, or ``None``.
    """

    index: int
    name: str = "GPU"
    total_mib: Optional[int] = None
    uuid: str = ""
    nvml_index: Optional[int] = None
    used_mib: Optional[int] = None
    compute_capability: Optional[str] = None


@dataclass(frozen=True)
class Probe:
    """What the machine offers, as plain data.

    Attributes:
        gpus: the GPUs this process may use, in TensorFlow's order.
        nvml_error: why NVML could not be read (no driver, ...), or ``None``.
        env: the values of :data:`RELEVANT_ENV` that are set.
        tf_imported: whether ``tensorflow`` was already imported.
        platform: ``sys.platform`` (``"linux"``, ``"win32"``, ``"darwin"``).
        nvml_gpus: every GPU NVML lists, before ``CUDA_VISIBLE_DEVICES``.
        driver_version: the NVIDIA driver, e.g. ``"550.54.15"``, or ``None``.
        cuda_driver_version: the newest CUDA the driver supports, e.g. ``"12.4"``.
        nvidia_smi: the path of ``nvidia-smi``, or ``None`` when not on PATH.
        device_nodes: the ``/dev/nvidia*`` files (none in a container started
            without ``--gpus``).
        in_container: a Docker/Podman container (``/.dockerenv`` or
            ``/run/.containerenv`` exists).
        wsl: running under Windows Subsystem for Linux.
    """

    gpus: tuple[GpuInfo, ...] = ()
    nvml_error: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)
    tf_imported: bool = False
    platform: str = "linux"
    nvml_gpus: tuple[GpuInfo, ...] = ()
    driver_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None
    nvidia_smi: Optional[str] = None
    device_nodes: tuple[str, ...] = ()
    in_container: bool = False
    wsl: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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
class Library:
    """A shared library TensorFlow's CUDA build loads at start-up.

    Attributes:
        name: the soname, e.g. ``"libcudnn.so.9"``.
        role: what it is, e.g. ``"cuDNN 9"``.
        package: the pip wheel that provides it (``tensorflow[and-cuda]``).
        path: where it was loaded from, or ``None``.
        error: the loader's message when it could not be loaded.
    """

    name: str
    role: str
    package: str
    path: Optional[str] = None
    error: Optional[str] = None


@dataclass(frozen=True)
class Facts:
    """Everything ``tfgpu doctor`` judges: the machine, the Python packages,
    TensorFlow (from a child process) and the CUDA libraries.

    Attributes:
        machine: :class:`Probe`.
        packages: installed distribution -> version, for :data:`PACKAGES`.
        tensorflow: :class:`TensorflowFacts`, or ``None`` when not examined.
        libraries: :class:`Library` results, in load order.
    """

    machine: Probe = field(default_factory=Probe)
    packages: dict[str, str] = field(default_factory=dict)
    tensorflow: Optional[TensorflowFacts] = None
    libraries: tuple[Library, ...] = ()

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


def _read_nvml() -> dict[str, Any]:
    """All GPUs NVML lists, in NVML (PCI bus) order, and the driver; or the reason it could not."""
    try:
        import pynvml  # noqa: PLC0415 - provided by nvidia-ml-py
    except ImportError:
        return {"nvml_error": "nvidia-ml-py is not installed (pip install nvidia-ml-py)"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"nvml_error": f"NVML could not start ({_text(exc)}): no NVIDIA driver is loaded"}
    out: dict[str, Any] = {}
    try:
        for key, read in (("driver_version", lambda: _text(pynvml.nvmlSystemGetDriverVersion())),
                          ("cuda_driver_version", lambda: _nvml_version(pynvml.nvmlSystemGetCudaDriverVersion()))):
            try:
                out[key] = read()
            except pynvml.NVMLError:
                out[key] = None
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                capability: Optional[str] = f"{major}.{minor}"
            except pynvml.NVMLError:
                capability = None
            gpus.append(GpuInfo(
                index=i,
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                total_mib=int(memory.total // (1024 * 1024)),
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                nvml_index=i,
                used_mib=int(memory.used // (1024 * 1024)),
                compute_capability=capability,
            ))
        out["nvml_gpus"] = tuple(gpus)
    except pynvml.NVMLError as exc:
        out["nvml_error"] = f"NVML failed while listing GPUs: {_text(exc)}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return out


def cuda_visible(gpus: Sequence[GpuInfo], cuda_visible_devices: Optional[str]) -> list[GpuInfo]:
    """Apply CUDA's ``CUDA_VISIBLE_DEVICES`` rules to NVML's list and renumber.

    Entries are NVML indices or UUID prefixes (``GPU-8f1...``); CUDA stops at the
    first entry that matches no GPU, and an empty value or ``-1`` hides all.
    """
    chosen: list[GpuInfo] = []
    if cuda_visible_devices is None:
        chosen = list(gpus)
    else:
        for entry in (e.strip() for e in cuda_visible_devices.split(",")):
            match = None
            if entry.isdigit():
                match = next((g for g in gpus if g.nvml_index == int(entry)), None)
            elif entry.startswith(("GPU-", "MIG-")):
                match = next((g for g in gpus if g.uuid.startswith(entry)), None)
            if match is None or match in chosen:
                break
            chosen.append(match)
    return [dataclasses.replace(g, index=i) for i, g in enumerate(chosen)]


def probe() -> Probe:
    """Discover the GPUs this process may use, without TensorFlow.

    Reads NVML (``nvidia-ml-py``, https://pypi.org/project/nvidia-ml-py/) and
    the environment. Never raises for a missing driver: ``nvml_error`` says why
    no GPU was listed.

    Environment variables read: ``CUDA_VISIBLE_DEVICES`` (which GPUs are
    visible, and their renumbering) and the others in :data:`RELEVANT_ENV`.
    """
    nvml = _read_nvml()
    env = {k: os.environ[k] for k in RELEVANT_ENV if k in os.environ}
    all_gpus = nvml.get("nvml_gpus", ())
    return Probe(
        gpus=tuple(cuda_visible(all_gpus, env.get("CUDA_VISIBLE_DEVICES"))),
        nvml_error=nvml.get("nvml_error"),
        env=env,
        tf_imported="tensorflow" in sys.modules,
        platform=sys.platform,
        nvml_gpus=tuple(all_gpus),
        driver_version=nvml.get("driver_version"),
        cuda_driver_version=nvml.get("cuda_driver_version"),
        nvidia_smi=shutil.which("nvidia-smi"),
        device_nodes=tuple(sorted(glob.glob("/dev/nvidia*"))),
        in_container=os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"),
        wsl=_is_wsl(),
    )


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
    args = [sys.executable, "-m", "tfgpu._tfprobe"]
    started = time.perf_counter()
    try:
        child = subprocess.run(args, input=json.dumps({"config": config, "logical": logical}), capture_output=True,
                               text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        return TensorflowFacts(import_error=f"TensorFlow did not start within {timeout:.0f} s",
                               log=_text(exc.stderr or "")[-6000:], seconds=timeout)
    seconds = time.perf_counter() - started
    last = child.stdout.strip().splitlines()[-1:] or [""]
    try:
        data = json.loads(last[0])
    except json.JSONDecodeError:
        return TensorflowFacts(
            import_error=f"the TensorFlow child process exited with code {child.returncode} before reporting "
                         "(a crash while importing TensorFlow, e.g. an illegal instruction on a CPU without AVX)",
            log=child.stderr[-6000:], seconds=seconds)
    facts = _from_dict(TensorflowFacts, data)
    return dataclasses.replace(facts, log=child.stderr[-6000:], seconds=seconds)


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


def probe_libraries(cudnn_major: str = "9", platform: str = sys.platform) -> tuple[Library, ...]:
    """Try to load each CUDA library TensorFlow needs, the way TensorFlow looks for it.

    First by soname (``LD_LIBRARY_PATH``, the ``ldconfig`` cache), then in the
    ``nvidia-*-cu12`` wheels' ``lib`` folders. Loading a library does not
    initialise CUDA. Returns nothing off Linux (TensorFlow has no CUDA build there).
    """
    if not platform.startswith("linux"):
        return ()
    dirs = _wheel_dirs()
    results = []
    for name, role, package in cuda_libraries(cudnn_major):
        path, error = None, None
        try:
            ctypes.CDLL(name)
            path = name + " (system library path)"
        except OSError as exc:
            error = str(exc)
            for folder in dirs:
                candidate = os.path.join(folder, name)
                if os.path.exists(candidate):
                    try:
                        ctypes.CDLL(candidate)
                        path, error = candidate, None
                        break
                    except OSError as inner:
                        error = str(inner)
        results.append(Library(name, role, package, path, error))
    return tuple(results)


def gather_facts(tensorflow: bool = True) -> Facts:
    """Everything the doctor needs: :func:`probe`, :func:`probe_packages`,
    :func:`probe_tensorflow` (physical devices only, so no GPU memory is
    touched; skipped with ``tensorflow=False``) and :func:`probe_libraries`."""
    machine = probe()
    tf_facts = probe_tensorflow(logical=False) if tensorflow else None
    cudnn = str((tf_facts.build_info.get("cudnn_version") if tf_facts else None) or "9").split(".")[0]
    return Facts(machine=machine, packages=probe_packages(), tensorflow=tf_facts,
                 libraries=probe_libraries(cudnn, machine.platform))


def load_facts(path: str, option: str = "--machine") -> Facts:
    """Read facts saved by ``tfgpu devices --json`` or ``tfgpu doctor --json`` (or a bare probe).

    Raises:
        ConfigError: the file is missing or is not such a JSON document.
    """
    from .errors import ConfigError  # noqa: PLC0415

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
