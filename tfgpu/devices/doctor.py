"""``tfgpu doctor``: the "why does TensorFlow not see my GPU?" checklist, as code.

Every check is a pure function of probed :class:`~tfgpu.devices.probe.Facts` (and the
active config): it returns :class:`Finding` objects, each with a level
(``ok`` / ``warning`` / ``error``), what was seen and the fix. The facts come
from :func:`tfgpu.devices.probe.gather_facts` on the real machine, or from a JSON file
written by ``tfgpu doctor --json`` / ``tfgpu devices --json`` on another one
(``tfgpu doctor --facts FILE``), which is also how every branch is tested
without a GPU.

Nothing here imports TensorFlow or JAX: they are examined in child processes
by the probe. With ``backend: jax`` :func:`check_jax` judges JAX, and the
TensorFlow checks stay silent where no TensorFlow is installed (JAX does not
need it).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from ..config import Config
from ..config.schema import NEEDS_TENSORFLOW
from ..errors import TfgpuError
from .probe import (Facts, GpuInfo, JAX_CUDA_PLUGINS, JaxFacts, Library, TENSORFLOW_PACKAGES, cuda_choice,
                    tensorflow_installed)
from .startup_log import NO_DRIVER_EXPECTED, gpus_hidden, level_in_force, message, severity, why_harmless
from .startup_log import shown as shown_at

#: What the TensorFlow pip wheel for Linux is built for, when TensorFlow itself
#: could not be asked (``tf.sysconfig.get_build_info()`` of 2.21.0).
DEFAULT_BUILD = {
    "is_cuda_build": True,
    "cuda_version": "12.5.1",
    "cudnn_version": "9",
    "cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"],
}

#: The oldest Linux driver for CUDA 12.x (minor-version compatibility), and the
#: driver that CUDA 12.5, TensorFlow 2.21's CUDA, ships with
#: (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/, table 3).
MIN_DRIVER_CUDA12 = "525.60.13"
DRIVER_CUDA_12_5 = "555.42.06"

INSTALL = "pip install 'tensorflow[and-cuda]'"

#: Installing JAX: on the CPU (tfgpu's extra), and with NVIDIA's CUDA 12 plugin
#: (https://docs.jax.dev/en/latest/installation.html).
JAX_INSTALL_CPU = "pip install 'tfgpu[jax]'"
JAX_INSTALL_CUDA12 = 'pip install -U "jax[cuda12]"'

#: ``data.kind`` values that read their data with TensorFlow (``tf.data``), on either backend.
TF_DATA_KINDS = tuple(NEEDS_TENSORFLOW)

#: The ``/dev/shm`` NCCL asks containers for: its troubleshooting guide ("Shared memory",
#: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/runtime_and_mpi_issues.html)
#: passes ``--shm-size=1g`` to ``docker run``. Docker, Podman and Kubernetes give 64 MiB.
SHM_MIN_MIB = 1024


@dataclass(frozen=True)
class Finding:
    """One line of the doctor's report.

    Attributes:
        check: a stable id, e.g. ``"cuda-libraries"``.
        level: ``"ok"``, ``"warning"`` or ``"error"``.
        title: what was checked, e.g. ``"CUDA libraries"``.
        seen: what was found, with the values.
        fix: what to do (empty for ``ok``).
    """

    check: str
    level: str
    title: str
    seen: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _version_tuple(text: Optional[str]) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text or "")[:3])


def _gpu_list(gpus: tuple[GpuInfo, ...]) -> str:
    return ", ".join(f"{g.index}: {g.name}" + (" (MIG mode)" if g.mig_mode else "") for g in gpus)


def _visible_text(gpus: tuple[GpuInfo, ...]) -> str:
    """``NVML 2 -> GPU:0, MIG-ab12... (GI 1/CI 0 of NVML 0) -> GPU:1``."""
    return ", ".join(
        (f"{g.uuid} (GI {g.gpu_instance_id}/CI {g.compute_instance_id} of NVML {g.nvml_index})" if g.is_mig
         else f"NVML {g.nvml_index}") + f" -> GPU:{g.index}" for g in gpus)


def _build(facts: Facts) -> tuple[dict[str, Any], str]:
    """TensorFlow's build info, and where it came from."""
    tf = facts.tensorflow
    if tf is not None and tf.build_info:
        return tf.build_info, f"TensorFlow {tf.version}"
    return DEFAULT_BUILD, "the TensorFlow 2.21 Linux wheel (TensorFlow itself was not examined)"


def _jax_backend(config: Optional[Config]) -> bool:
    return config is not None and config.backend == "jax"


def _tf_not_needed(facts: Facts, config: Optional[Config]) -> bool:
    """``backend: jax`` and no TensorFlow package installed: the TensorFlow checks have nothing to judge."""
    return _jax_backend(config) and not tensorflow_installed(facts.packages)


def _tf_needs(config: Optional[Config]) -> list[str]:
    """The settings of a ``backend: jax`` config that still run through TensorFlow (data kinds, TensorBoard)."""
    if config is None:
        return []
    return ([f"data.kind: {config.data.kind}"] if config.data.kind in TF_DATA_KINDS else []) + (
        ["output.tensorboard: true"] if config.output.tensorboard else [])


def _tf_gpu_count(facts: Facts) -> Optional[int]:
    tf = facts.tensorflow
    if tf is None or tf.version is None:
        return None
    return len(tf.devices_of("GPU"))


# ---------------------------------------------------------------- the checks


def check_platform(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """Native Windows and macOS have no CUDA TensorFlow; WSL2 and Linux do."""
    m = facts.machine
    tf_version = facts.packages.get("tensorflow") or (facts.tensorflow.version if facts.tensorflow else None)
    if m.platform == "win32":
        if tf_version and _version_tuple(tf_version) < (2, 11):
            return [Finding("platform", "warning", "Platform",
                            f"native Windows with TensorFlow {tf_version}: the last line with GPU support there",
                            "TensorFlow 2.10 needs CUDA 11.2 and cuDNN 8.1 installed system-wide; for current "
                            f"TensorFlow use WSL2 and {INSTALL} inside it.")]
        return [Finding("platform", "error", "Platform",
                        f"native Windows{f' with TensorFlow {tf_version}' if tf_version else ''}: TensorFlow "
                        "2.11 and later has no GPU support on native Windows",
                        f"use WSL2 (Ubuntu) and {INSTALL} inside it, or a Linux Docker container with --gpus all.")]
    if m.platform == "darwin":
        return [Finding("platform", "warning", "Platform",
                        "macOS: there is no CUDA TensorFlow for macOS; NVIDIA GPUs cannot be used",
                        "on Apple silicon, pip install tensorflow-metal gives TensorFlow a 'GPU' device.")]
    where = "Linux" + (" under WSL2" if m.wsl else "") + (" in a container" if m.in_container else "")
    return [Finding("platform", "ok", "Platform", where)]


def check_driver(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """NVIDIA driver present? GPUs listed by NVML (and nvidia-smi on PATH)?"""
    m = facts.machine
    if m.platform == "darwin":
        return []
    smi = f"nvidia-smi at {m.nvidia_smi}" if m.nvidia_smi else "nvidia-smi not on PATH"
    if m.nvml_gpus:
        seen = (f"driver {m.driver_version or '?'} (supports CUDA {m.cuda_driver_version or '?'}); NVML lists "
                f"{len(m.nvml_gpus)} GPU(s): {_gpu_list(m.nvml_gpus)}; {smi}")
        return [Finding("driver", "ok", "NVIDIA driver and GPUs", seen)]
    if m.nvml_error and "not installed" in m.nvml_error:
        return [Finding("driver", "warning", "NVIDIA driver and GPUs",
                        f"{m.nvml_error}; {smi}; tfgpu cannot list GPUs or their memory without it",
                        "pip install nvidia-ml-py (a tfgpu dependency: reinstall tfgpu).")]
    reason = m.nvml_error or "NVML lists no GPU"
    container_env = m.env.get("NVIDIA_VISIBLE_DEVICES")
    if m.in_container and not m.device_nodes:
        if container_env in ("none", "void", ""):
            fix = (f"NVIDIA_VISIBLE_DEVICES={container_env!r} hides every GPU from this container; start it "
                   "with --gpus all (or NVIDIA_VISIBLE_DEVICES=all with the NVIDIA runtime).")
        else:
            fix = ("start the container with GPUs: docker run --gpus all ... (the host needs the NVIDIA "
                   "driver and the NVIDIA Container Toolkit; check there with nvidia-smi).")
        level = "error" if container_env is not None else "warning"
        return [Finding("driver", level, "NVIDIA driver and GPUs",
                        f"{reason}; this is a container with no /dev/nvidia* device files"
                        + (f" (NVIDIA_VISIBLE_DEVICES={container_env})" if container_env is not None else ""),
                        fix)]
    if m.device_nodes or m.nvidia_smi:
        found = ", ".join(m.device_nodes[:4]) if m.device_nodes else smi
        return [Finding("driver", "error", "NVIDIA driver and GPUs",
                        f"{reason}, yet NVIDIA hardware or tools are present ({found})",
                        "the driver's user-space libraries do not match the kernel module, or are missing: run "
                        "nvidia-smi; if it fails with 'Driver/library version mismatch', reboot (or reload the "
                        "nvidia kernel module) after the driver update; in a container use --gpus all.")]
    return [Finding("driver", "warning", "NVIDIA driver and GPUs",
                    f"{reason}; no /dev/nvidia* device files and {smi}: this machine shows no NVIDIA GPU, so "
                    "TensorFlow will run on the CPU",
                    "if it has a GPU, install the NVIDIA driver (e.g. ubuntu-drivers install) and check with "
                    "nvidia-smi.")]


def check_visible_devices(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """``CUDA_VISIBLE_DEVICES`` hiding GPUs (empty, ``-1``, or an entry that names no GPU)."""
    m = facts.machine
    value = m.env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return []
    title = "CUDA_VISIBLE_DEVICES"
    if not m.nvml_gpus:
        return [Finding("cuda-visible-devices", "ok", title, f"CUDA_VISIBLE_DEVICES={value!r} (no GPU listed to filter)")]
    visible = m.gpus  # NVML's GPUs after CUDA_VISIBLE_DEVICES, as the probe applied it
    if not visible:
        why = "hides every GPU" if value.strip() in ("", "-1") else "names no GPU CUDA can find first"
        return [Finding("cuda-visible-devices", "error", title,
                        f"CUDA_VISIBLE_DEVICES={value!r} {why}; NVML lists {len(m.nvml_gpus)} GPU(s): "
                        f"{_gpu_list(m.nvml_gpus)}",
                        "unset CUDA_VISIBLE_DEVICES (or set it to indices such as 0,1) and choose GPUs with "
                        "devices.visible_gpus in the tfgpu config instead.")]
    entries = [e.strip() for e in value.split(",") if e.strip()]
    hidden = cuda_choice(m.nvml_gpus, m.mig_devices, value)[1]
    if len(visible) + len(hidden) < len(entries):
        return [Finding("cuda-visible-devices", "warning", title,
                        f"CUDA_VISIBLE_DEVICES={value!r}: CUDA stops at the first entry that names no GPU (or "
                        f"repeats one), so only {len(visible)} of the {len(entries)} listed are visible "
                        f"({_visible_text(visible)})",
                        f"use NVML indices 0-{len(m.nvml_gpus) - 1}, GPU UUIDs or, for MIG instances, MIG UUIDs "
                        "(nvidia-smi -L lists them all), each once.")]
    return [Finding("cuda-visible-devices", "ok", title,
                    f"CUDA_VISIBLE_DEVICES={value!r}: {len(visible)} device(s) visible, renumbered from 0 "
                    f"({_visible_text(visible)})")]


def check_mig(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """MIG (Multi-Instance GPU): instances present, which one this process gets, and the one-per-process limit."""
    m = facts.machine
    enabled = [g for g in m.nvml_gpus if g.mig_mode]
    if not enabled:
        return []
    title = "MIG instances"
    out = []
    for gpu in enabled:
        if not any(i.parent_uuid == gpu.uuid for i in m.mig_devices):
            out.append(Finding("mig", "error", title,
                               f"GPU {gpu.nvml_index} ({gpu.name}) is in MIG mode but has no MIG instance, so CUDA "
                               "can use neither the GPU nor a slice of it",
                               f"create instances (e.g. sudo nvidia-smi mig -i {gpu.nvml_index} -cgi 9,9 -C; "
                               "nvidia-smi mig -lgip lists the profiles) or turn MIG mode off "
                               f"(sudo nvidia-smi -i {gpu.nvml_index} -mig 0)."))
    if not m.mig_devices:
        return out
    using = [g for g in m.gpus if g.is_mig]
    hidden = m.mig_hidden
    listed = "; ".join(f"{i.uuid}: {i.name}, {i.total_mib} MiB, GI {i.gpu_instance_id}/CI "
                       f"{i.compute_instance_id} of GPU {i.nvml_index}" for i in m.mig_devices)
    if using:
        g = using[0]
        seen = (f"this process uses MIG instance {g.uuid} ({g.name}) as GPU:{g.index}; memory settings apply to "
                f"its {g.total_mib} MiB, not the whole GPU's")
    else:
        seen = "this process uses no MIG instance"
    seen += f". NVML lists {len(m.mig_devices)} instance(s): {listed or 'none'}"
    if hidden:
        named = "CUDA_VISIBLE_DEVICES names" if "CUDA_VISIBLE_DEVICES" in m.env else "There are"
        out.append(Finding("mig", "warning", title,
                           f"{seen}. {named} {len(hidden) + len(using)} MIG instances but a CUDA process can use "
                           f"only one (NVIDIA's MIG user guide), so {', '.join(h.uuid for h in hidden)} "
                           f"{'is' if len(hidden) == 1 else 'are'} not visible to it",
                           "name one instance per process: CUDA_VISIBLE_DEVICES=MIG-<uuid> (nvidia-smi -L); to "
                           "train on several, run one worker per instance under multi_worker_mirrored "
                           "(docs/multiworker.md)."))
    elif using and "CUDA_VISIBLE_DEVICES" not in m.env:
        out.append(Finding("mig", "ok", title, seen + "; set CUDA_VISIBLE_DEVICES=MIG-<uuid> to choose another"))
    else:
        out.append(Finding("mig", "ok", title, seen))
    return out


def check_packages(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """TensorFlow installed? The CPU-only package where a GPU is present? The old ``tensorflow-gpu``?"""
    p = facts.packages
    has_gpu = bool(facts.machine.nvml_gpus)
    out = []
    tf_dists = [d for d in TENSORFLOW_PACKAGES if d != "tensorflow-gpu" and d in p]
    if "tensorflow-gpu" in p:
        out.append(Finding("tensorflow-gpu", "error", "Old tensorflow-gpu package",
                           f"tensorflow-gpu {p['tensorflow-gpu']} is installed: that package stopped at 2.12 "
                           "(later versions only fail to install), and it shares the 'tensorflow' module with "
                           "the current package, so files of the two versions mix",
                           f"pip uninstall -y tensorflow-gpu tensorflow && {INSTALL} (GPU support is in "
                           "'tensorflow' itself since 2.1)."))
    if not tf_dists and "tensorflow-gpu" not in p and _jax_backend(config):
        needs = _tf_needs(config)
        if needs:
            out.append(Finding("tensorflow-installed", "warning", "TensorFlow installed",
                               "no TensorFlow package is installed; backend: jax trains without it, but this "
                               f"config's {' and '.join(needs)} reads or writes through TensorFlow",
                               "pip install tensorflow (the CPU build is enough beside JAX: it only reads data "
                               "and writes logs), or choose a data kind that needs no TensorFlow."))
        else:
            out.append(Finding("tensorflow-installed", "ok", "TensorFlow installed",
                               "no TensorFlow package: not needed with backend: jax (data kinds "
                               f"{', '.join(TF_DATA_KINDS)} and output.tensorboard need it)"))
        return out
    if not tf_dists and "tensorflow-gpu" not in p:
        out.append(Finding("tensorflow-installed", "error", "TensorFlow installed",
                           "no TensorFlow package is installed in this Python environment",
                           f"{INSTALL} (Linux/WSL2), or pip install tensorflow elsewhere."))
        return out
    if len(tf_dists) > 1:
        out.append(Finding("tensorflow-installed", "warning", "TensorFlow installed",
                           "several TensorFlow packages are installed ("
                           + ", ".join(f"{d} {p[d]}" for d in tf_dists) + "); they overwrite each other's files",
                           f"pip uninstall -y {' '.join(tf_dists)} && {INSTALL}"))
    elif tf_dists:
        out.append(Finding("tensorflow-installed", "ok", "TensorFlow installed", f"{tf_dists[0]} {p[tf_dists[0]]}"))
    if "tensorflow-cpu" in p and has_gpu and not _jax_backend(config):  # beside JAX it only reads data
        out.append(Finding("tensorflow-cpu", "error", "CPU-only TensorFlow package",
                           f"tensorflow-cpu {p['tensorflow-cpu']} is installed, which never uses a GPU, and this "
                           f"machine has {len(facts.machine.nvml_gpus)}",
                           f"pip uninstall -y tensorflow-cpu && {INSTALL}"))
    keras = p.get("keras")
    tf_version = p.get("tensorflow") or p.get("tensorflow-cpu")
    if keras and tf_version and _version_tuple(tf_version) >= (2, 16) and _version_tuple(keras) < (3,):
        out.append(Finding("keras", "error", "Keras version",
                           f"keras {keras} with TensorFlow {tf_version}: TensorFlow 2.16+ needs Keras 3",
                           "pip install -U 'keras>=3'"))
    return out


def check_tensorflow(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """TensorFlow imports, its version, and whether it is a CUDA build."""
    tf = facts.tensorflow
    if tf is None or _tf_not_needed(facts, config):
        return []
    if tf.version is None:
        error = tf.import_error or "unknown error"
        fix = f"reinstall in a fresh virtual environment: python -m venv .venv && .venv/bin/{INSTALL}"
        if "illegal instruction" in error.lower() or "crash" in error.lower():
            fix = ("TensorFlow's wheels need a CPU with AVX; on older CPUs build TensorFlow from source, or "
                   "use a newer machine. Also: " + fix)
        seen = f"import tensorflow failed: {error}"
        if _jax_backend(config) and not _tf_needs(config):
            return [Finding("tensorflow-import", "warning", "TensorFlow starts",
                            seen + "; backend: jax trains without it, but a TensorFlow that cannot start breaks "
                            "the data kinds and TensorBoard logs that use it",
                            fix + "; or pip uninstall it: JAX does not need it.")]
        return [Finding("tensorflow-import", "error", "TensorFlow starts", seen, fix)]
    if tf.import_error:  # TensorFlow imported, Keras did not
        return [Finding("tensorflow-import", "error", "TensorFlow starts",
                        f"TensorFlow {tf.version} imports, but {tf.import_error}",
                        "pip install -U 'keras>=3' (TensorFlow 2.16+ uses Keras 3).")]
    build = tf.build_info
    if build.get("is_cuda_build"):
        caps = ", ".join(build.get("cuda_compute_capabilities") or [])
        seen = (f"TensorFlow {tf.version} (Keras {tf.keras_version}), a CUDA build: CUDA "
                f"{build.get('cuda_version')}, cuDNN {build.get('cudnn_version')}, compute capabilities {caps}")
        return [Finding("tensorflow-build", "ok", "TensorFlow build", seen)]
    if _jax_backend(config):
        return [Finding("tensorflow-build", "ok", "TensorFlow build",
                        f"TensorFlow {tf.version}, a {'CUDA' if build.get('is_cuda_build') else 'CPU-only'} build; "
                        "with backend: jax it only reads data and writes logs, on the CPU")]
    if build.get("is_rocm_build"):
        return [Finding("tensorflow-build", "warning", "TensorFlow build",
                        f"TensorFlow {tf.version} is a ROCm (AMD) build; it cannot use NVIDIA GPUs",
                        f"for NVIDIA GPUs: pip uninstall tensorflow-rocm && {INSTALL}")]
    level = "error" if facts.machine.nvml_gpus else "warning"
    return [Finding("tensorflow-build", level, "TensorFlow build",
                    f"TensorFlow {tf.version} is a CPU-only build (tf.sysconfig.get_build_info() has no CUDA)",
                    f"pip uninstall -y tensorflow tensorflow-cpu && {INSTALL} (Linux/WSL2 only).")]


def _missing_libraries(facts: Facts) -> list[Library]:
    return [lib for lib in facts.libraries if lib.path is None]


def _library_list(libraries: list[Library]) -> str:
    return ", ".join(lib.name + (f" {lib.version}" if lib.version else "") for lib in libraries)


def _missing_list(missing: list[Library]) -> str:
    """Each library that cannot be loaded: its name, role, wheel and the loader's message."""
    return "; ".join(f"{lib.name} ({lib.role}{', pip ' + lib.package if lib.package else ''}): "
                     f"{lib.error or 'not found'}" for lib in missing)


def _wheels_fix(facts: Facts, missing: list[Library]) -> str:
    """The install line for the missing libraries' wheels, pinned to the installed TensorFlow."""
    version = facts.packages.get("tensorflow") or (facts.tensorflow.version if facts.tensorflow else None)
    pin = f"=={version}" if version else ""
    return (f"install the CUDA libraries TensorFlow was built with: pip install 'tensorflow[and-cuda]{pin}' "
            f"(provides {', '.join(sorted({lib.package for lib in missing if lib.package}))}); with a system CUDA "
            "instead, add its lib64 folder to LD_LIBRARY_PATH")


def _built_against(facts: Facts) -> str:
    """``"; TensorFlow 2.21.0 was built against CUDA 12.5.1 and cuDNN 9"`` when TensorFlow was asked, else ``""``."""
    tf = facts.tensorflow
    build = tf.build_info if tf is not None and tf.version else {}
    if not build.get("cuda_version"):
        return ""
    return f"; TensorFlow {tf.version} was built against CUDA {build['cuda_version']} and cuDNN {build.get('cudnn_version') or '?'}"


def _libraries_without_gpu(facts: Facts) -> list[Finding]:
    """The CUDA libraries where NVML lists no GPU: judged only where TensorFlow is a CUDA build and the
    CUDA wheels (or a system CUDA) are there, e.g. the GPU image started without --gpus; a CPU-only
    host has neither and gets nothing. The driver's libcuda.so.1 then cannot be there either: an error,
    since the CUDA libraries are installed to be used."""
    tf = facts.tensorflow
    if tf is None or not tf.version or not tf.build_info.get("is_cuda_build"):
        return []
    toolkit = [lib for lib in facts.libraries if lib.package]
    found = [lib for lib in toolkit if lib.path is not None]
    if not found:
        return []
    missing = [lib for lib in toolkit if lib.path is None]
    out = []
    if missing:
        out.append(Finding("cuda-libraries", "warning", "CUDA libraries",
                           f"{len(found)} of {len(toolkit)} load ({_library_list(found)}), {len(missing)} cannot: "
                           f"{_missing_list(missing)}{_built_against(facts)}", _wheels_fix(facts, missing) + "."))
    else:
        out.append(Finding("cuda-libraries", "ok", "CUDA libraries",
                           f"all {len(toolkit)} load: {_library_list(toolkit)}{_built_against(facts)}"))
    driver = [lib for lib in facts.libraries if not lib.package and lib.path is None]
    if driver:
        out.append(Finding("cuda-driver-library", "error", "CUDA driver library",
                           f"{driver[0].name} ({driver[0].role}) cannot be loaded: "
                           f"{driver[0].error or 'not found'}; the CUDA libraries are installed, but without "
                           "the driver and a GPU TensorFlow runs on the CPU",
                           "run on a machine with an NVIDIA GPU and its driver (check with nvidia-smi); in a "
                           "container start it with --gpus all so the NVIDIA Container Toolkit mounts the "
                           "driver's libcuda.so.1."))
    return out


def check_libraries(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """Each CUDA/cuDNN library TensorFlow needs, found by trying to load it, with its version.

    Without a GPU (NVML lists none) see :func:`_libraries_without_gpu`."""
    m = facts.machine
    if not facts.libraries or _jax_backend(config):
        return []
    if not m.nvml_gpus:
        return _libraries_without_gpu(facts)
    missing = _missing_libraries(facts)
    if not missing:
        return [Finding("cuda-libraries", "ok", "CUDA libraries",
                        f"all {len(facts.libraries)} load: {_library_list(list(facts.libraries))}"
                        f"{_built_against(facts)}")]
    driver = [lib for lib in missing if lib.name.startswith("libcuda.so")]
    fix = []
    if any(lib.package for lib in missing):
        fix.append(_wheels_fix(facts, missing))
    if driver:
        fix.append("libcuda.so.1 comes with the NVIDIA driver, not with pip: reinstall the driver, or in a "
                   "container start it with --gpus all so the NVIDIA Container Toolkit mounts it")
    return [Finding("cuda-libraries", "error", "CUDA libraries",
                    f"{len(missing)} of {len(facts.libraries)} cannot be loaded: {_missing_list(missing)}",
                    "; ".join(fix) + ".")]


def check_driver_cuda(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """A driver too old for the CUDA TensorFlow was built with."""
    m = facts.machine
    build, source = _build(facts)
    if _jax_backend(config) or not m.nvml_gpus or not m.cuda_driver_version or not build.get("is_cuda_build"):
        return []
    need = _version_tuple(build.get("cuda_version"))[:2]
    have = _version_tuple(m.cuda_driver_version)[:2]
    title = "Driver and CUDA version"
    seen = (f"driver {m.driver_version} supports CUDA up to {m.cuda_driver_version}; {source} uses CUDA "
            f"{build.get('cuda_version')}")
    if not need or not have:
        return []
    if have[0] < need[0]:
        return [Finding("driver-cuda", "error", title, seen + ": the driver is too old for it",
                        f"update the NVIDIA driver to {DRIVER_CUDA_12_5} or newer (at least {MIN_DRIVER_CUDA12} "
                        f"for any CUDA {need[0]}.x), or use a TensorFlow built for CUDA {have[0]}.")]
    if have < need:
        return [Finding("driver-cuda", "warning", title,
                        seen + ": it runs through CUDA minor-version compatibility, but kernels shipped as PTX "
                        "cannot be compiled by this driver (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
                        f"update the NVIDIA driver to {DRIVER_CUDA_12_5} or newer.")]
    return [Finding("driver-cuda", "ok", title, seen)]


def _capabilities(build: dict[str, Any]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    sass, ptx = [], []
    for entry in build.get("cuda_compute_capabilities") or []:
        kind, _, digits = str(entry).partition("_")
        if len(digits) >= 2 and digits[:-1].isdigit() and digits[-1].isdigit():
            pair = (int(digits[:-1]), int(digits[-1]))
            (sass if kind == "sm" else ptx).append(pair)
    return sass, ptx


def _support(gpu: GpuInfo, sass: list[tuple[int, int]], ptx: list[tuple[int, int]]) -> str:
    """``"ok"`` (native kernels), ``"warning"`` (PTX compiled at start-up) or ``"error"`` (unsupported)."""
    cc = tuple(_version_tuple(gpu.compute_capability)[:2])
    if any(major == cc[0] and minor <= cc[1] for major, minor in sass):
        return "ok"
    return "warning" if any(p <= cc for p in ptx) else "error"


def check_compute_capability(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """Each GPU's compute capability against those TensorFlow's kernels are built for."""
    build, source = _build(facts)
    sass, ptx = _capabilities(build)
    if (not sass and not ptx) or _jax_backend(config):
        return []
    built = ", ".join(build.get("cuda_compute_capabilities") or [])
    out = []
    for gpu in facts.machine.nvml_gpus:
        if not gpu.compute_capability:
            continue
        title = f"GPU {gpu.nvml_index} compute capability"
        seen = f"{gpu.name} has compute capability {gpu.compute_capability}; {source} has kernels for {built}"
        level = _support(gpu, sass, ptx)
        if level == "ok":
            out.append(Finding("compute-capability", "ok", title, seen))
        elif level == "warning":
            out.append(Finding("compute-capability", "warning", title,
                               seen + ": no native kernels, so CUDA compiles PTX for it when TensorFlow starts "
                               "(minutes, the first time)",
                               "keep the compiled kernels: export CUDA_CACHE_MAXSIZE=4294967296; a newer "
                               "TensorFlow may ship native kernels for this GPU."))
        else:
            lowest = min(sass + ptx)
            out.append(Finding("compute-capability", "error", title,
                               seen + f": TensorFlow cannot run on GPUs below compute capability "
                               f"{lowest[0]}.{lowest[1]}, so it skips this one",
                               "use a newer GPU, or build TensorFlow from source with "
                               f"TF_CUDA_COMPUTE_CAPABILITIES={gpu.compute_capability}."))
    return out


#: TensorFlow start-up log lines worth quoting (what each means is in the finding).
_LOG_PATTERNS = (
    "Cannot dlopen some GPU libraries", "Could not load dynamic library", "Could not find cuda drivers",
    "failed call to cuInit", "CUDA_ERROR", "driver version is insufficient", "Ignoring visible gpu device",
    "cuDNN version", "Loaded runtime CuDNN library",
)


def _log_evidence(facts: Facts) -> list[str]:
    tf = facts.tensorflow
    lines = []
    for line in (tf.log if tf else "").splitlines():
        if any(p in line for p in _LOG_PATTERNS):
            text = re.sub(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] ", "", line.strip())
            if text not in lines:
                lines.append(text)
    return lines[:6]


def check_tensorflow_sees_gpus(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """GPUs visible to the driver but not to TensorFlow, and the causes found."""
    m = facts.machine
    tf_count = _tf_gpu_count(facts)
    if tf_count is None or _jax_backend(config):
        return []
    title = "TensorFlow sees the GPUs"
    visible = m.gpus
    tf = facts.tensorflow
    assert tf is not None
    if not m.nvml_gpus:
        if tf_count:
            return [Finding("tensorflow-gpus", "warning", title,
                            f"TensorFlow lists {tf_count} GPU(s) but NVML cannot ({m.nvml_error}); tfgpu cannot "
                            "read their memory, so devices.memory_fraction cannot be used",
                            "pip install nvidia-ml-py, or use devices.memory_limit_mib.")]
        return [Finding("tensorflow-gpus", "ok", title,
                        "no GPU on this machine; TensorFlow uses " + ", ".join(tf.devices_of("CPU")))]
    if tf_count >= len(visible) and visible:
        details = "; ".join(
            f"{name}: {d.get('device_name', '?')} (compute capability "
            f"{'.'.join(str(x) for x in d.get('compute_capability', ())) or '?'})"
            for name, d in zip(tf.devices_of("GPU"), tf.gpu_details or [{}] * tf_count)
        )
        return [Finding("tensorflow-gpus", "ok", title, f"{tf_count} of {len(visible)} visible GPU(s): {details}")]
    causes = []
    value = m.env.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        causes.append(f"CUDA_VISIBLE_DEVICES={value!r} hides them")
    if tf.devices_of("XLA_GPU") and not tf_count:
        causes.append("TensorFlow lists only XLA_GPU devices: its GPU runtime did not register (an old "
                      "TensorFlow, or CUDA libraries it could not load); XLA_GPU devices cannot run ordinary ops")
    if not tf.build_info.get("is_cuda_build"):
        causes.append("this TensorFlow is not a CUDA build")
    missing = _missing_libraries(facts)
    if missing:
        causes.append("CUDA libraries cannot be loaded: " + ", ".join(lib.name for lib in missing))
    need = _version_tuple(tf.build_info.get("cuda_version"))[:1]
    if m.cuda_driver_version and need and _version_tuple(m.cuda_driver_version)[:1] < need:
        causes.append(f"the driver supports CUDA {m.cuda_driver_version} only")
    sass, ptx = _capabilities(_build(facts)[0])
    if sass or ptx:
        causes += [f"{g.name} has compute capability {g.compute_capability}, which TensorFlow does not support"
                   for g in m.nvml_gpus if g.compute_capability and _support(g, sass, ptx) == "error"]
    if m.platform == "win32":
        causes.append("native Windows has no GPU TensorFlow since 2.11")
    evidence = _log_evidence(facts)
    seen = (f"NVML lists {len(m.nvml_gpus)} GPU(s) ({len(visible)} visible to this process) but TensorFlow "
            f"{tf.version} lists {tf_count}")
    seen += ". Causes found: " + "; ".join(causes) if causes else ". No cause found among the checks above"
    if evidence:
        seen += ". TensorFlow said: " + " | ".join(evidence)
    fix = ("fix the errors listed above, then run tfgpu doctor again" if causes else
           "run with TF_CPP_MIN_LOG_LEVEL=0 python -c \"import tensorflow as tf; "
           "print(tf.config.list_physical_devices('GPU'))\" and read the first error it prints")
    return [Finding("tensorflow-gpus", "error", title, seen, fix + ".")]


def _jax_devices_text(jax: JaxFacts) -> str:
    return ", ".join(f"{name} ({kind})" for name, _, kind in jax.devices) or "none"


def _jax_plugin(packages: dict[str, str]) -> Optional[str]:
    """The installed JAX CUDA plugin, e.g. ``"jax-cuda12-plugin 0.10.2"``, or ``None``."""
    name = next((n for n in JAX_CUDA_PLUGINS if n in packages), None)
    return f"{name} {packages[name]}" if name else None


def _jax_cuda_fix(facts: Facts) -> str:
    """How to install JAX's CUDA plugin for this driver."""
    cuda = facts.machine.cuda_driver_version
    major = _version_tuple(cuda)[:1]
    if major and major[0] >= 13:
        install = f'{JAX_INSTALL_CUDA12} (or pip install -U "jax[cuda13]": this driver supports CUDA {cuda})'
    else:
        install = JAX_INSTALL_CUDA12
    return (f"{install}; the plugin must match the driver's CUDA version (this driver supports CUDA "
            f"{cuda or 'unknown: run nvidia-smi'}; jax[cuda12] needs CUDA 12.x or newer, jax[cuda13] needs 13.x) "
            "and be the same release as jaxlib.")


def _jax_gpu_causes(facts: Facts, jax: Optional[JaxFacts]) -> list[str]:
    """Why JAX lists no GPU although NVML does, from the packages, environment and JAX's own log."""
    p, m = facts.packages, facts.machine
    causes = []
    plugins = [n for n in JAX_CUDA_PLUGINS if n in p]
    if not plugins:
        causes.append("no JAX CUDA plugin is installed (jax-cuda12-plugin or jax-cuda13-plugin): jaxlib alone "
                      "runs on the CPU only")
    for name in plugins:
        if p.get("jaxlib") and p[name] != p["jaxlib"]:
            causes.append(f"{name} {p[name]} is not the release of jaxlib {p['jaxlib']}, so JAX does not load it")
        need = int(name.split("-")[1][len("cuda"):])
        have = _version_tuple(m.cuda_driver_version)[:1]
        if have and have[0] < need:
            causes.append(f"{name} needs a driver for CUDA {need}, and this driver supports CUDA "
                          f"{m.cuda_driver_version}")
    platforms = m.env.get("JAX_PLATFORMS")
    if platforms and "cuda" not in platforms and "gpu" not in platforms:
        causes.append(f"JAX_PLATFORMS={platforms!r} leaves out the GPU")
    log = jax.log if jax is not None else ""
    said = []
    for line in log.splitlines():
        if any(k in line for k in ("CUDA", "cuda", "GPU", "plugin", "Falling back")) and line.strip() not in said:
            said.append(line.strip())
    if said:
        causes.append("JAX said: " + " | ".join(said[:4]))
    return causes


def check_jax(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """With ``backend: jax``: JAX and jaxlib installed and starting, the CUDA plugin where there are GPUs,
    JAX's devices (:class:`~tfgpu.devices.probe.JaxFacts` from :func:`tfgpu.devices.probe.probe_jax`)."""
    if not _jax_backend(config):
        return []
    assert config is not None
    title = "JAX (backend: jax)"
    p, m, jax = facts.packages, facts.machine, facts.jax
    missing = [n for n in ("jax", "jaxlib") if n not in p]
    if missing or (jax is not None and jax.version is None):
        seen = (f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed in this Python "
                "environment" if missing else f"import jax failed: {jax.import_error if jax else '?'}")
        return [Finding("jax", "error", title, seen + "; backend: jax cannot train without it",
                        f"{JAX_INSTALL_CPU} (or pip install -U jax) for the CPU, or {JAX_INSTALL_CUDA12} for "
                        "NVIDIA GPUs; or set backend: tensorflow.")]
    plugin = _jax_plugin(p)
    versions = (f"jax {jax.version if jax else p['jax']}, jaxlib {jax.jaxlib_version if jax else p['jaxlib']}, "
                f"CUDA plugin: {plugin or 'none'}")
    if jax is not None and jax.import_error:
        if jax.import_error.startswith("keras"):
            fix = "pip install -U 'keras>=3' (Keras 3 runs on JAX; tf-keras and Keras 2 do not)."
        else:
            fix = ("unset JAX_PLATFORMS or name only installed platforms in it (cpu; cuda needs the CUDA plugin: "
                   + _jax_cuda_fix(facts) + ")")
        return [Finding("jax", "error", title, f"{versions}; JAX imports, but {jax.import_error}", fix)]
    hidden_by_config = config.devices.visible_gpus == "none"
    jax_gpus = jax.devices_of("gpu") if jax is not None else None
    if m.gpus and not hidden_by_config and (plugin is None or jax_gpus == []):
        causes = _jax_gpu_causes(facts, jax)
        listed = (f"JAX lists {_jax_devices_text(jax)}" if jax is not None else "JAX was not started")
        return [Finding("jax-gpus", "error", "JAX sees the GPUs",
                        f"{versions}; NVML lists {len(m.gpus)} GPU(s) visible to this process but {listed}. "
                        "Causes found: " + ("; ".join(causes) if causes else "none among the checks"),
                        _jax_cuda_fix(facts))]
    if jax is None:
        return [Finding("jax", "ok", title, f"{versions} installed (JAX was not started: run tfgpu doctor on "
                                             "this machine to list its devices)")]
    out = []
    if jax_gpus is not None and m.gpus and not hidden_by_config and len(jax_gpus) < len(m.gpus):
        out.append(Finding("jax-gpus", "warning", "JAX sees the GPUs",
                           f"JAX lists {len(jax_gpus)} of the {len(m.gpus)} GPU(s) visible to this process: "
                           f"{_jax_devices_text(jax)}",
                           "run nvidia-smi, and check CUDA_VISIBLE_DEVICES and JAX_PLATFORMS; " + _jax_cuda_fix(facts)))
    out.append(Finding("jax", "ok", title,
                       f"{versions}, Keras {jax.keras_version}; default backend {jax.default_backend}; devices: "
                       f"{_jax_devices_text(jax)}"))
    return out


_SEVERITY_NAMES = ("INFO", "WARNING", "ERROR", "FATAL")


def startup_lines(facts: Facts, config: Optional[Config]) -> list[dict[str, Any]]:
    """TensorFlow's start-up log (the doctor's TensorFlow child, which holds nothing back), line by line.

    Each: ``line``, ``severity`` (``INFO``..``FATAL``), ``shown`` (whether
    ``tfgpu run`` shows it at the config's ``tensorflow.log_level``), and
    ``harmless`` (why it is known to be harmless, or ``None``). Lines that are
    not TensorFlow's (Abseil/glog format) are left out.
    """
    tf = facts.tensorflow
    if tf is None or not tf.log:
        return []
    level = _log_level(facts, config)
    hidden = gpus_hidden(facts.machine.env) or (config is not None and config.devices.visible_gpus == "none")
    raw = tf.log.splitlines()
    expected = NO_DRIVER_EXPECTED if facts.machine.no_driver else ()  # as tfgpu.setup() holds them
    rows = []
    for line in raw:
        sev = severity(line.encode("utf-8", "surrogateescape"))
        if sev is None:
            continue
        entry = why_harmless(line, raw, hidden)
        rows.append({"line": line, "severity": _SEVERITY_NAMES[sev], "shown": shown_at(line, level, expected),
                     "harmless": entry.why if entry else None, "harmless_name": entry.name if entry else None})
    return rows


def _log_level(facts: Facts, config: Optional[Config]) -> int:
    """The level ``tfgpu run`` would start TensorFlow with on this machine: its plan's (the defaults without a
    config), else, for a config that cannot be planned here, the config's ``tensorflow.log_level``."""
    from .plan import make_plan  # noqa: PLC0415

    config = config if config is not None else Config()
    try:
        plan_env = make_plan(config, facts.machine).env
    except TfgpuError:
        plan_env = {"TF_CPP_MIN_LOG_LEVEL": str(config.tensorflow.log_level)}
    return level_in_force(plan_env, facts.machine.env)


def check_startup_log(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """TensorFlow's start-up lines: what ``tensorflow.log_level`` holds back, the errors known to be harmless
    (named, with why), and any other error (a warning: it may be why the GPU is not used)."""
    if _tf_not_needed(facts, config):
        return []
    rows = startup_lines(facts, config)
    if not rows:
        return []
    level = _log_level(facts, config)
    held = sum(not r["shown"] for r in rows)
    counts = ", ".join(f"{sum(r['severity'] == name for r in rows)} {name}" for name in _SEVERITY_NAMES
                       if any(r["severity"] == name for r in rows))
    seen = (f"TensorFlow printed {len(rows)} start-up line(s) ({counts}); at tensorflow.log_level {level} 'tfgpu run' "
            f"holds back {held} (kept in RUN_DIR/startup.log) and shows {len(rows) - held}")
    errors = [r for r in rows if r["severity"] in ("ERROR", "FATAL")]
    known = {}
    for r in errors:
        if r["harmless"]:
            known.setdefault(r["harmless_name"], r["harmless"])
    if known:
        seen += "; errors known to be harmless: " + "; ".join(f"{name} ({why})" for name, why in known.items())
    unknown = [r for r in errors if not r["harmless"]]
    if unknown:
        texts = []
        for r in unknown:
            text = message(r["line"]).strip()
            if text not in texts:
                texts.append(text)
        return [Finding("startup-log", "warning", "TensorFlow's start-up log",
                        f"{seen}; error(s) tfgpu does not know to be harmless: " + " | ".join(texts[:4]),
                        "run 'tfgpu doctor --log' to read each start-up line (explained where known), then fix "
                        "what the error names (most often a CUDA library that does not load or a driver too old: "
                        "the checks above say how); an error here is often why TensorFlow does not use the GPU.")]
    return [Finding("startup-log", "ok", "TensorFlow's start-up log", seen + " ('tfgpu doctor --log' shows them)")]


def describe_startup_log(facts: Facts, config: Optional[Config]) -> str:
    """``tfgpu doctor --log``: every start-up line with whether ``tfgpu run`` shows it, and why it is harmless."""
    rows = startup_lines(facts, config)
    tf = facts.tensorflow
    if tf is None:
        return "TensorFlow's start-up log: TensorFlow was not started (--no-tensorflow, or backend: jax without it)."
    level = _log_level(facts, config)
    lines = [f"TensorFlow's start-up log ({len(rows)} line(s) from a fresh TensorFlow started by tfgpu doctor; "
             f"'tfgpu run' shows those at or above tensorflow.log_level {level}):"]
    for r in rows:
        lines.append(f"  [{'shown' if r['shown'] else 'held back'}] {r['line']}")
        if r["harmless"]:
            lines.append(f"      harmless: {r['harmless']}")
    if not rows:
        lines.append("  (none)")
    return "\n".join(lines)


def check_memory_in_use(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """GPUs whose memory other processes already hold."""
    out = []
    for gpu in facts.machine.gpus:
        if gpu.used_mib is not None and gpu.total_mib and gpu.used_mib > 0.5 * gpu.total_mib:
            out.append(Finding("memory-in-use", "warning", f"GPU {gpu.index} memory",
                               f"{gpu.name}: {gpu.used_mib} of {gpu.total_mib} MiB already in use by other "
                               "processes; TensorFlow gets the rest",
                               "see who holds it with nvidia-smi; pick another GPU with devices.visible_gpus, "
                               "or cap TensorFlow with devices.memory_limit_mib."))
    return out


def _nccl_use(facts: Facts, config: Optional[Config]) -> Optional[str]:
    """Why NCCL would run in this process (``None``: it would not): the plan's reduction across GPUs, or, with no
    config (or one that cannot be planned here), two or more visible GPUs on Linux, where NCCL is the default."""
    m = facts.machine
    if not m.platform.startswith("linux"):
        return None
    if config is not None:
        from .plan import make_plan  # noqa: PLC0415

        try:
            strategy = make_plan(config, m).strategy
        except TfgpuError:
            strategy = None
        if strategy is not None:
            gpus = [d for d in strategy.devices if "gpu" in d.lower()]
            if strategy.kind == "mirrored" and strategy.cross_device_ops == "nccl":
                return f"the plan's mirrored strategy sums gradients across {len(gpus)} GPUs with NCCL"
            if strategy.kind == "multi_worker_mirrored" and gpus and strategy.cross_device_ops in ("auto", "nccl"):
                return (f"multi_worker_mirrored on GPUs with distribute.communication {strategy.cross_device_ops} "
                        "uses NCCL (auto lets TensorFlow pick it on GPUs)")
            if strategy.kind == "data_parallel" and len(gpus) > 1:
                return f"JAX's data_parallel across {len(gpus)} GPUs reduces with NCCL"
            return None
    if len(m.gpus) >= 2:
        return f"{len(m.gpus)} visible GPUs on Linux, where NCCL is the default reduction across GPUs"
    return None


def check_shm(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """``/dev/shm`` big enough for NCCL where NCCL would run: a container's default 64 MiB is not.

    NCCL makes shared-memory segments in ``/dev/shm`` (between GPUs without
    peer-to-peer access above all) and fails at start-up (``ncclShmOpen``,
    ``failed to extend /dev/shm/nccl-...``) when they do not fit.
    """
    size = facts.machine.shm_mib
    why = _nccl_use(facts, config)
    if size is None or why is None:
        return []
    title = "/dev/shm for NCCL"
    if size < SHM_MIN_MIB:
        container = " (the default of a Docker, Podman or Kubernetes container)" if size == 64 else ""
        return [Finding("shm", "warning", title,
                        f"/dev/shm is {size} MiB{container}, below {SHM_MIN_MIB} MiB (NCCL's guide: --shm-size=1g); "
                        f"NCCL runs here ({why}), puts its shared-memory segments in /dev/shm and, where the GPUs "
                        "have no peer-to-peer access, fails at start-up when they do not fit (ncclShmOpen: failed "
                        "to extend /dev/shm/nccl-...)",
                        "start the container with --shm-size=1g (docker/podman run; or --ipc=host to use the host's "
                        "/dev/shm); on Kubernetes mount an emptyDir with medium: Memory at /dev/shm ('tfgpu export "
                        "tfjob' writes one); on a host, sudo mount -o remount,size=1G /dev/shm.")]
    return [Finding("shm", "ok", title, f"/dev/shm is {size} MiB, at least the {SHM_MIN_MIB} MiB NCCL's "
                                        f"guide asks for ({why})")]


def _slurm_layout(env: dict[str, str]) -> tuple[list[str], list[int]]:
    """The allocation's (or the step's) nodes and tasks per node, from Slurm's variables (``[]`` where unreadable)."""
    from ..cluster.spec import expand_hostlist, expand_tasks_per_node  # noqa: PLC0415

    try:
        nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
        tasks = expand_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "")
    except ValueError:
        return [], []
    return [n for n in nodes if n], tasks


def check_slurm(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """Inside a Slurm allocation: what Slurm gave (nodes, tasks, this task, GPUs from ``SLURM_*`` and
    ``CUDA_VISIBLE_DEVICES``), and whether the recipe's workers match it. Silent outside Slurm.

    tfgpu finds its workers in a job step's variables (:func:`tfgpu.cluster.spec.resolve_cluster`): one worker per
    task, under ``distribute.strategy: multi_worker_mirrored``, unless ``distribute.cluster`` or ``TF_CONFIG`` is
    set, which come first.
    """
    env = facts.machine.env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return []
    title = "Slurm allocation"
    nodes, per_node = _slurm_layout(env)
    tasks = sum(per_node)
    in_step = "SLURM_STEP_ID" in env and "SLURM_PROCID" in env
    layout = (f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} ({', '.join(nodes)}), {tasks} task"
              f"{'s' if tasks != 1 else ''} ({', '.join(map(str, per_node))} per node)" if nodes and per_node
              else "its nodes and tasks unreadable (SLURM_*NODELIST, SLURM_*TASKS_PER_NODE)")
    where = (f"this process is task {env['SLURM_PROCID']} of step {env['SLURM_STEP_ID']} on "
             f"{env.get('SLURMD_NODENAME', 'its node')}" if in_step
             else "this process is not a task of a job step (the batch script's or salloc's shell)")
    asked = env.get("SLURM_GPUS_ON_NODE")
    given = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
    visible = len(facts.machine.gpus)
    gpus = (f"GPUs: {asked or 'none asked'} on this node from Slurm (SLURM_GPUS_ON_NODE"
            + (f"; ids {given}" if given else "")
            + f"), CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', 'unset')}, {visible} visible to this process")
    partition = f" (partition {env['SLURM_JOB_PARTITION']})" if env.get("SLURM_JOB_PARTITION") else ""
    out = [Finding("slurm", "ok", title, f"job {job}{partition}: {layout}; {where}; {gpus}")]
    if asked is not None and asked.isdigit() and int(asked) != visible:
        out.append(Finding(
            "slurm", "warning", title,
            f"Slurm gave this node {asked} GPU(s) (SLURM_GPUS_ON_NODE), and this process sees {visible}"
            + (" (CUDA_VISIBLE_DEVICES is unset: Slurm's gres did not set it, so every GPU of the node is used, "
               "also those of other jobs)" if "CUDA_VISIBLE_DEVICES" not in env else ""),
            "ask for the GPUs the run uses (#SBATCH --gpus-per-node=N, 'tfgpu export slurm --gpus-per-worker N'), "
            "and let Slurm set CUDA_VISIBLE_DEVICES (GresTypes=gpu with a gres.conf) or confine the job "
            "(ConstrainDevices=yes in cgroup.conf)."))
    if config is None:
        return out
    strategy = config.distribute.strategy
    own = ("distribute.cluster" if config.distribute.cluster is not None
           else "TF_CONFIG" if env.get("TF_CONFIG") else None)
    if strategy != "multi_worker_mirrored":
        if tasks > 1:
            out.append(Finding(
                "slurm", "warning", title,
                f"the allocation has {tasks} tasks, and distribute.strategy: {strategy} trains each task on its own: "
                f"{tasks} separate runs, not one run on {tasks} workers",
                "set distribute.strategy: multi_worker_mirrored (--set distribute.strategy=multi_worker_mirrored; "
                "'tfgpu export slurm' writes it), one task per node."))
        return out
    if own is not None:
        out.append(Finding(
            "slurm", "warning", title,
            f"{own} is set, and it comes before Slurm's variables: the workers are {own}'s, not the allocation's "
            f"{tasks} task(s)",
            f"remove {own} to train on the allocation's tasks, one worker each."))
    elif not in_step:
        out.append(Finding(
            "slurm", "warning" if tasks > 1 else "ok", title,
            f"distribute.strategy: multi_worker_mirrored outside a job step: 'tfgpu run' here would be one process, "
            f"not the allocation's {tasks} workers",
            "start the workers with srun (one task per node: srun tfgpu run ...; 'tfgpu export slurm' writes the "
            "script)." if tasks > 1 else ""))
    else:
        out.append(Finding("slurm", "ok", title,
                           f"distribute.strategy: multi_worker_mirrored: {tasks} worker(s), one per task, the chief "
                           f"task 0 on {nodes[0] if nodes else 'the first node'} (workers listen on port "
                           f"{config.distribute.port})"))
    return out


_CONFIG_KEY = re.compile(r"\b(?:backend|devices|tensorflow|distribute|data|model|train|output)\.[a-z_]+(?:\.[a-z_]+)?")
_ENV_NAME = re.compile(r"\b([A-Z][A-Z0-9]*_[A-Z0-9_]+)(?:=| was\b)")


def plan_warning_fix(warning: str) -> str:
    """The ``fix:`` of a plan warning in ``tfgpu doctor``: what to change (the config key or environment variable
    the warning names), how (in the recipe or with ``--set``), how to check, and where the key is described."""
    keys = list(dict.fromkeys(_CONFIG_KEY.findall(warning)))
    if not keys and "mixed_float16" in warning:
        keys = ["tensorflow.mixed_precision"]
    if "unequal" in warning:
        return ("choose GPUs of one model with devices.visible_gpus (e.g. --set devices.visible_gpus=[0,1], indices "
                "as nvidia-smi lists them), or cap each GPU with devices.memory_limit_mib; docs/config.md, 'GPUs of "
                "different models or sizes', explains.")
    if keys:
        key = keys[0]
        return (f"change {' or '.join(keys)} as said above, in the recipe or with --set {key}=VALUE (or remove the "
                f"key to take its default), then check with 'tfgpu plan RECIPE'; docs/config.md describes {key}.")
    env = _ENV_NAME.findall(warning)
    if env:
        return (f"unset {env[0]} before starting tfgpu (tfgpu sets what it needs itself), then check with 'tfgpu "
                "plan RECIPE', which lists every variable it sets.")
    return ("do what the line above says, in the recipe or with --set KEY=VALUE, then check with 'tfgpu plan "
            "RECIPE'; docs/config.md describes every key.")


def check_config(facts: Facts, config: Optional[Config]) -> list[Finding]:
    """The active tfgpu config against this machine's GPUs (the same plan ``run`` applies)."""
    if config is None:
        return []
    from .plan import make_plan, mig_warning  # noqa: PLC0415

    title = "tfgpu config on this machine"
    try:
        plan = make_plan(config, facts.machine)
    except TfgpuError as exc:
        return [Finding("config", "error", title, exc.message, exc.hint)]
    reported = mig_warning(facts.machine, list(plan.gpus))  # check_mig's finding says it already
    out = [Finding("config", "warning", title, w, plan_warning_fix(w)) for w in plan.warnings if w != reported]
    out.append(Finding("config", "ok", title,
                       f"{plan.strategy.kind} strategy on {', '.join(plan.strategy.devices) or 'the default device'}, "
                       f"{plan.num_replicas} replica(s), global batch {plan.global_batch_size}, precision "
                       f"{plan.mixed_precision} ({plan.mixed_precision_reason})"))
    return out


#: Every check, in report order.
CHECKS: tuple[Callable[[Facts, Optional[Config]], list[Finding]], ...] = (
    check_platform,
    check_driver,
    check_visible_devices,
    check_mig,
    check_packages,
    check_tensorflow,
    check_libraries,
    check_driver_cuda,
    check_compute_capability,
    check_tensorflow_sees_gpus,
    check_startup_log,
    check_jax,
    check_memory_in_use,
    check_shm,
    check_slurm,
    check_config,
)


def diagnose(facts: Facts, config: Optional[Config] = None) -> list[Finding]:
    """Run every check in :data:`CHECKS` on ``facts``.

    Args:
        facts: from :func:`tfgpu.devices.probe.gather_facts` or :meth:`Facts.from_dict`.
        config: the tfgpu config to check against the hardware, or ``None``.

    Returns:
        The findings, in report order. Pure: reads its arguments only.
    """
    findings: list[Finding] = []
    for check in CHECKS:
        findings += check(facts, config)
    return findings


def report(findings: list[Finding], quiet: bool = False) -> str:
    """The findings as the text ``tfgpu doctor`` prints (``quiet``: errors only)."""
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warning" for f in findings)
    lines = []
    for f in findings:
        if quiet and f.level != "error":
            continue
        lines.append(f"[{f.level:^7}] {f.title}: {f.seen}")
        if f.fix:
            lines.append(f"          fix: {f.fix}")
    verdict = (f"{errors} error(s), {warnings} warning(s)" if errors or warnings else "no problems found")
    if not quiet or errors:
        lines.append(f"tfgpu doctor: {verdict}.")
    return "\n".join(lines)


def _memory(g: GpuInfo) -> str:
    return f"{g.used_mib if g.used_mib is not None else '?'}/{g.total_mib if g.total_mib is not None else '?'}"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def describe_facts(facts: Facts) -> str:
    """The text ``tfgpu devices`` prints: NVML's GPUs, then TensorFlow's devices."""
    m = facts.machine
    lines = []
    if m.nvml_gpus:
        lines.append(f"NVIDIA driver {m.driver_version or '?'} (supports CUDA {m.cuda_driver_version or '?'}); "
                     f"NVML lists {len(m.nvml_gpus)} GPU(s):")
        mig_column = {True: "on", False: "off", None: "-"}
        rows = [("NVML", "name", "UUID", "used/total MiB", "compute capability", "MIG")]
        rows += [(str(g.nvml_index), g.name, g.uuid or "-", _memory(g), g.compute_capability or "?",
                  mig_column[g.mig_mode]) for g in m.nvml_gpus]
        lines += _table(rows)
        if m.mig_devices:
            lines.append(f"MIG instances ({len(m.mig_devices)}; a CUDA process can use one of them):")
            rows = [("GPU", "GI/CI", "name", "UUID", "used/total MiB")]
            rows += [(str(g.nvml_index), f"{g.gpu_instance_id}/{g.compute_instance_id}", g.name, g.uuid, _memory(g))
                     for g in m.mig_devices]
            lines += _table(rows)
    else:
        lines.append(f"NVML: no GPU listed ({m.nvml_error or 'none found'}).")
    if "CUDA_VISIBLE_DEVICES" in m.env or m.mig_devices:
        prefix = (f"CUDA_VISIBLE_DEVICES={m.env['CUDA_VISIBLE_DEVICES']!r}: " if "CUDA_VISIBLE_DEVICES" in m.env
                  else "")
        lines.append(f"{prefix or 'CUDA devices '}visible to this process: {_visible_text(m.gpus) or 'none'}")
        if m.mig_hidden:
            lines.append("  not visible (one MIG instance per process): " + ", ".join(g.uuid for g in m.mig_hidden))
    tf = facts.tensorflow
    if tf is None and facts.jax is not None and not tensorflow_installed(facts.packages):
        lines.append("TensorFlow: not installed (not needed with backend: jax).")
    elif tf is None:
        lines.append("TensorFlow: not examined (--no-tensorflow).")
    elif tf.version is None:
        lines.append(f"TensorFlow: cannot start: {tf.import_error}")
    else:
        b = tf.build_info
        build = (f"CUDA build: CUDA {b.get('cuda_version')}, cuDNN {b.get('cudnn_version')}"
                 if b.get("is_cuda_build") else "CPU-only build")
        lines.append(f"TensorFlow {tf.version} ({build}), Keras {tf.keras_version}, started in {tf.seconds:.1f} s:")
        lines.append("  physical devices: " + ", ".join(f"{n} ({t})" for n, t in tf.physical_devices))
        lines.append("  logical devices:  " + ", ".join(f"{n} ({t})" for n, t in tf.logical_devices))
        for name, d in zip(tf.devices_of("GPU"), tf.gpu_details):
            cc = ".".join(str(x) for x in d.get("compute_capability", ()))
            lines.append(f"  {name}: {d.get('device_name', '?')}, compute capability {cc or '?'}")
        if tf.setup_error:
            lines.append(f"  the config could not be applied: {tf.setup_error}")
    if facts.jax is not None:
        lines += describe_jax(facts.jax, facts.packages)
    return "\n".join(lines)


def describe_jax(jax: JaxFacts, packages: dict[str, str]) -> list[str]:
    """The JAX lines of ``tfgpu devices`` (``backend: jax``), e.g. ``JAX 0.10.2 (jaxlib 0.10.2, CUDA plugin:
    none), Keras 3.15.1, default backend cpu; devices: cpu:0 (cpu), cpu:1 (cpu)``."""
    if jax.version is None:
        return [f"JAX: cannot start: {jax.import_error}"]
    plugin = _jax_plugin(packages) or "none"
    lines = [f"JAX {jax.version} (jaxlib {jax.jaxlib_version}, CUDA plugin: {plugin}), Keras {jax.keras_version}, "
             f"default backend {jax.default_backend}; devices: {_jax_devices_text(jax)}"
             + (f" (started in {jax.seconds:.1f} s)" if jax.seconds else "")]
    if jax.import_error:
        lines.append(f"  error: {jax.import_error}")
    if jax.setup_error:
        lines.append(f"  the config could not be applied: {jax.setup_error}")
    return lines
