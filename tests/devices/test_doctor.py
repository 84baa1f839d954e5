"""tfgpu doctor: every branch from injected facts, and the real path on this (driverless) machine.

The facts are the probe's output (the one seam where a GPU is faked); the
checks under test are the real ones.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from tfgpu.config import load_config
from tfgpu.devices.doctor import diagnose, report
from tfgpu.devices.probe import (Facts, GpuInfo, Library, Probe, TensorflowFacts, cuda_libraries, cuda_visible,
                                 gather_facts, probe_libraries)

from ..conftest import run_cli

BUILD = {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9",
         "cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]}
LIBRARIES = cuda_libraries("9")


def gpu(i: int, cc: str = "8.0", total: int = 40960, used: int = 400, name: str = "NVIDIA A100-SXM4-40GB") -> GpuInfo:
    return GpuInfo(i, name, total, f"GPU-{i:04d}", i, used, cc)


def machine(n: int = 2, env=None, gpus=None, **kw) -> Probe:
    env = env or {}
    listed = tuple(gpus) if gpus is not None else tuple(gpu(i) for i in range(n))
    base = dict(gpus=tuple(cuda_visible(listed, env.get("CUDA_VISIBLE_DEVICES"))), env=env, nvml_gpus=listed,
                driver_version="555.42.06", cuda_driver_version="12.5", nvidia_smi="/usr/bin/nvidia-smi",
                device_nodes=tuple(f"/dev/nvidia{i}" for i in range(len(listed))) + ("/dev/nvidiactl",))
    base.update(kw)
    return Probe(**base)


def no_gpu_machine(**kw) -> Probe:
    base = dict(nvml_error="NVML could not start (NVML Shared Library Not Found): no NVIDIA driver is loaded",
                driver_version=None, cuda_driver_version=None, nvidia_smi=None, device_nodes=())
    base.update(kw)
    return machine(0, **base)


def tf_facts(gpus: int = 2, build=None, log: str = "", **kw) -> TensorflowFacts:
    physical = (("/physical_device:CPU:0", "CPU"),) + tuple((f"/physical_device:GPU:{i}", "GPU") for i in range(gpus))
    base = dict(version="2.21.0", keras_version="3.15.1", build_info=BUILD if build is None else build,
                physical_devices=physical, logical_devices=tuple((n.replace("physical_", ""), t) for n, t in physical),
                gpu_details=tuple({"device_name": "NVIDIA A100-SXM4-40GB", "compute_capability": [8, 0]}
                                  for _ in range(gpus)), log=log)
    base.update(kw)
    return TensorflowFacts(**base)


def libraries(*missing: str) -> tuple[Library, ...]:
    return tuple(Library(name, role, pkg, None if name in missing else f"/venv/nvidia/lib/{name}",
                         f"{name}: cannot open shared object file: No such file or directory" if name in missing else None,
                         None if name in missing or not pkg else "12.9.79")
                 for name, role, pkg in LIBRARIES)


PACKAGES = {"tensorflow": "2.21.0", "keras": "3.15.1", "nvidia-ml-py": "12.560.30"}


def facts(m: Probe | None = None, packages=None, tf="default", libs=None) -> Facts:
    m = m if m is not None else machine()
    if tf == "default":
        tf = tf_facts(len(m.gpus))
    return Facts(machine=m, packages=dict(PACKAGES if packages is None else packages), tensorflow=tf,
                 libraries=libraries() if libs is None else libs)


def find(findings, check: str, level: str | None = None):
    found = [f for f in findings if f.check == check and (level is None or f.level == level)]
    assert found, f"no {check}/{level} finding in:\n" + report(findings)
    return found[0]


def levels(findings) -> dict[str, int]:
    return {lvl: sum(f.level == lvl for f in findings) for lvl in ("ok", "warning", "error")}


# ------------------------------------------------------------ healthy machines


def test_a_healthy_two_gpu_host_has_no_errors_or_warnings():
    findings = diagnose(facts(), load_config({}))
    assert levels(findings)["error"] == 0 and levels(findings)["warning"] == 0, report(findings)
    seen = find(findings, "tensorflow-gpus", "ok").seen
    assert "2 of 2 visible GPU(s)" in seen and "compute capability 8.0" in seen
    assert "driver 555.42.06 (supports CUDA 12.5); NVML lists 2 GPU(s)" in find(findings, "driver", "ok").seen
    libs = find(findings, "cuda-libraries", "ok").seen
    assert "all 12 load: libcuda.so.1, libcudart.so.12 12.9.79," in libs and "libcupti.so.12 12.9.79" in libs
    assert "TensorFlow 2.21.0 was built against CUDA 12.5.1 and cuDNN 9" in libs
    assert "2 replica(s), global batch 64" in find(findings, "config", "ok").seen


def test_a_machine_without_any_nvidia_gpu_is_a_warning_not_an_error():
    findings = diagnose(facts(no_gpu_machine(), tf=tf_facts(0), libs=libraries(*[n for n, _, _ in LIBRARIES])))
    assert levels(findings)["error"] == 0, report(findings)
    assert "this machine shows no NVIDIA GPU" in find(findings, "driver", "warning").seen
    assert "no GPU on this machine" in find(findings, "tensorflow-gpus", "ok").seen
    assert not [f for f in findings if f.check == "cuda-libraries"]  # no GPU: missing CUDA libraries are no problem


def test_the_cuda_wheels_without_a_gpu_are_listed_and_the_only_error_is_the_driver():
    """The GPU image started without --gpus: every library of tensorflow[and-cuda] loads (with its version),
    the driver's libcuda.so.1 cannot, and that is the one error."""
    findings = diagnose(facts(no_gpu_machine(in_container=True), tf=tf_facts(0), libs=libraries("libcuda.so.1")))
    seen = find(findings, "cuda-libraries", "ok").seen
    assert seen.startswith("all 11 load: libcudart.so.12 12.9.79, libcublas.so.12 12.9.79"), seen
    for name in ("libcudnn.so.9", "libcufft.so.11", "libcusparse.so.12", "libcusolver.so.11", "libcurand.so.10",
                 "libnccl.so.2", "libnvJitLink.so.12", "libcupti.so.12"):
        assert f"{name} 12.9.79" in seen
    assert "TensorFlow 2.21.0 was built against CUDA 12.5.1 and cuDNN 9" in seen
    errors = [f for f in findings if f.level == "error"]
    assert [f.check for f in errors] == ["cuda-driver-library"], report(findings)
    assert "libcuda.so.1 (the NVIDIA driver's CUDA library) cannot be loaded" in errors[0].seen
    assert "--gpus all" in errors[0].fix


def test_some_cuda_wheels_missing_without_a_gpu_is_a_warning_naming_them():
    findings = diagnose(facts(no_gpu_machine(), tf=tf_facts(0), libs=libraries("libcuda.so.1", "libcudnn.so.9")))
    f = find(findings, "cuda-libraries", "warning")
    assert "10 of 11 load" in f.seen and "libcudnn.so.9 (cuDNN 9, pip nvidia-cudnn-cu12)" in f.seen
    assert "pip install 'tensorflow[and-cuda]==2.21.0' (provides nvidia-cudnn-cu12)" in f.fix


def test_a_cpu_only_tensorflow_build_never_judges_cuda_libraries_without_a_gpu():
    cpu_build = {"is_cuda_build": False}
    findings = diagnose(facts(no_gpu_machine(), tf=tf_facts(0, build=cpu_build), libs=libraries("libcuda.so.1")))
    assert not [f for f in findings if f.check.startswith("cuda-")], report(findings)


def test_a_library_version_comes_from_its_wheel_or_its_file_name(tmp_path):
    from tfgpu.devices.probe import _library_version

    plain = tmp_path / "lib" / "libcudart.so.12.5.82"
    plain.parent.mkdir()
    plain.write_bytes(b"")
    (tmp_path / "lib" / "libcudart.so.12").symlink_to(plain.name)
    assert _library_version(str(tmp_path / "lib" / "libcudart.so.12"), "libcudart.so.12", "nvidia-cuda-runtime-cu12") == "12.5.82"
    wheel = tmp_path / "site-packages" / "nvidia" / "cu" / "lib" / "libcudart.so.12"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"")
    import importlib.metadata as md

    assert _library_version(str(wheel), "libcudart.so.12", "pytest") == md.version("pytest")
    assert _library_version(str(wheel), "libcudart.so.12", "no-such-wheel-cu12") is None


# ------------------------------------------------------------ driver and NVML


def test_a_container_started_without_gpus():
    m = no_gpu_machine(in_container=True, env={"NVIDIA_VISIBLE_DEVICES": "all"})
    f = find(diagnose(facts(m, tf=tf_facts(0))), "driver", "error")
    assert "container with no /dev/nvidia* device files" in f.seen and "docker run --gpus all" in f.fix


def test_a_container_with_nvidia_visible_devices_none():
    m = no_gpu_machine(in_container=True, env={"NVIDIA_VISIBLE_DEVICES": "none"})
    f = find(diagnose(facts(m, tf=tf_facts(0))), "driver", "error")
    assert "NVIDIA_VISIBLE_DEVICES='none' hides every GPU" in f.fix


def test_device_files_without_a_working_nvml_point_at_a_driver_mismatch():
    m = no_gpu_machine(device_nodes=("/dev/nvidia0", "/dev/nvidiactl"), nvidia_smi="/usr/bin/nvidia-smi",
                       nvml_error="NVML could not start (Driver/library version mismatch): no NVIDIA driver is loaded")
    f = find(diagnose(facts(m, tf=tf_facts(0))), "driver", "error")
    assert "Driver/library version mismatch" in f.seen and "/dev/nvidia0" in f.seen and "reboot" in f.fix


def test_nvml_package_missing_is_a_warning_with_the_install_command():
    m = no_gpu_machine(nvml_error="nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    f = find(diagnose(facts(m, tf=tf_facts(0))), "driver", "warning")
    assert "pip install nvidia-ml-py" in f.fix


def test_nvml_missing_but_tensorflow_sees_gpus():
    m = no_gpu_machine(nvml_error="nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    f = find(diagnose(facts(m, tf=tf_facts(1))), "tensorflow-gpus", "warning")
    assert "TensorFlow lists 1 GPU(s) but NVML cannot" in f.seen and "memory_limit_mib" in f.fix


# ------------------------------------------------------------ CUDA_VISIBLE_DEVICES


@pytest.mark.parametrize("value", ["", "-1"])
def test_cuda_visible_devices_hiding_every_gpu(value):
    m = machine(2, env={"CUDA_VISIBLE_DEVICES": value})
    findings = diagnose(facts(m, tf=tf_facts(0)))
    f = find(findings, "cuda-visible-devices", "error")
    assert f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU" in f.seen and "unset CUDA_VISIBLE_DEVICES" in f.fix
    cause = find(findings, "tensorflow-gpus", "error").seen
    assert "NVML lists 2 GPU(s) (0 visible to this process) but TensorFlow 2.21.0 lists 0" in cause
    assert f"CUDA_VISIBLE_DEVICES={value!r} hides them" in cause


def test_cuda_visible_devices_stopping_at_an_invalid_entry():
    f = find(diagnose(facts(machine(2, env={"CUDA_VISIBLE_DEVICES": "0,7,1"}), tf=tf_facts(1))),
             "cuda-visible-devices", "warning")
    assert "only 1 of the 3 listed are visible (NVML 0 -> GPU:0)" in f.seen and "0-1" in f.fix and "MIG UUIDs" in f.fix


def test_cuda_visible_devices_selecting_one_gpu_is_fine():
    findings = diagnose(facts(machine(2, env={"CUDA_VISIBLE_DEVICES": "1"}), tf=tf_facts(1)))
    assert "1 device(s) visible, renumbered from 0 (NVML 1 -> GPU:0)" in find(findings, "cuda-visible-devices", "ok").seen
    assert "1 of 1 visible GPU(s)" in find(findings, "tensorflow-gpus", "ok").seen


# ------------------------------------------------------------ packages and the TensorFlow build


def test_tensorflow_not_installed():
    findings = diagnose(facts(packages={"keras": "3.15.1"}, tf=TensorflowFacts(import_error="ModuleNotFoundError: No module named 'tensorflow'")))
    assert "no TensorFlow package is installed" in find(findings, "tensorflow-installed", "error").seen
    f = find(findings, "tensorflow-import", "error")
    assert "No module named 'tensorflow'" in f.seen and "tensorflow[and-cuda]" in f.fix


def test_the_old_tensorflow_gpu_package():
    f = find(diagnose(facts(packages={**PACKAGES, "tensorflow-gpu": "2.10.1"})), "tensorflow-gpu", "error")
    assert "tensorflow-gpu 2.10.1 is installed" in f.seen and "pip uninstall -y tensorflow-gpu" in f.fix


def test_the_cpu_only_package_on_a_gpu_machine():
    findings = diagnose(facts(packages={"tensorflow-cpu": "2.21.0", "keras": "3.15.1"},
                              tf=tf_facts(0, build={"is_cuda_build": False})))
    assert "tensorflow-cpu 2.21.0 is installed, which never uses a GPU" in find(findings, "tensorflow-cpu", "error").seen
    assert "CPU-only build" in find(findings, "tensorflow-build", "error").seen
    assert "this TensorFlow is not a CUDA build" in find(findings, "tensorflow-gpus", "error").seen


def test_the_cpu_only_package_without_a_gpu_is_only_a_warning():
    findings = diagnose(facts(no_gpu_machine(), packages={"tensorflow-cpu": "2.21.0"},
                              tf=tf_facts(0, build={"is_cuda_build": False})))
    assert not [f for f in findings if f.check == "tensorflow-cpu"]
    assert find(findings, "tensorflow-build", "warning")


def test_two_tensorflow_packages_overwrite_each_other():
    f = find(diagnose(facts(packages={**PACKAGES, "tensorflow-cpu": "2.20.0"})), "tensorflow-installed", "warning")
    assert "tensorflow 2.21.0, tensorflow-cpu 2.20.0" in f.seen


def test_keras_2_with_a_current_tensorflow():
    f = find(diagnose(facts(packages={**PACKAGES, "keras": "2.15.0"})), "keras", "error")
    assert "keras 2.15.0 with TensorFlow 2.21.0" in f.seen and "keras>=3" in f.fix


@pytest.mark.parametrize("error,fix", [
    ("ImportError: libstdc++.so.6: version `GLIBCXX_3.4.30' not found", "fresh virtual environment"),
    ("the TensorFlow child process exited with code -4 before reporting (a crash while importing TensorFlow, "
     "e.g. an illegal instruction on a CPU without AVX)", "CPU with AVX"),
])
def test_tensorflow_that_cannot_start(error, fix):
    f = find(diagnose(facts(tf=TensorflowFacts(import_error=error))), "tensorflow-import", "error")
    assert error in f.seen and fix in f.fix


def test_keras_that_cannot_import_beside_a_working_tensorflow():
    f = find(diagnose(facts(tf=tf_facts(2, import_error="keras: ImportError: cannot import name 'ops'"))),
             "tensorflow-import", "error")
    assert "TensorFlow 2.21.0 imports, but keras: ImportError" in f.seen and "keras>=3" in f.fix


def test_a_rocm_build_cannot_use_nvidia_gpus():
    findings = diagnose(facts(tf=tf_facts(0, build={"is_cuda_build": False, "is_rocm_build": True})))
    assert "ROCm (AMD) build" in find(findings, "tensorflow-build", "warning").seen


# ------------------------------------------------------------ why TensorFlow misses the GPUs


def test_missing_cuda_libraries_are_each_named_with_their_wheel():
    log = ("W0000 00:00:1700000000.000000    1 gpu_device.cc:2344] Cannot dlopen some GPU libraries. Please make "
           "sure the missing libraries mentioned above are installed properly")
    findings = diagnose(facts(tf=tf_facts(0, log=log), libs=libraries("libcudnn.so.9", "libcufft.so.11")))
    f = find(findings, "cuda-libraries", "error")
    assert "2 of 12 cannot be loaded" in f.seen
    assert "libcudnn.so.9 (cuDNN 9, pip nvidia-cudnn-cu12)" in f.seen and "libcufft.so.11 (cuFFT 11" in f.seen
    assert "pip install 'tensorflow[and-cuda]==2.21.0'" in f.fix and "nvidia-cudnn-cu12" in f.fix
    cause = find(findings, "tensorflow-gpus", "error").seen
    assert "CUDA libraries cannot be loaded: libcufft.so.11, libcudnn.so.9" in cause
    assert "TensorFlow said: Cannot dlopen some GPU libraries" in cause


def test_the_driver_library_missing_points_at_the_driver_not_pip():
    f = find(diagnose(facts(tf=tf_facts(0), libs=libraries("libcuda.so.1"))), "cuda-libraries", "error")
    assert "libcuda.so.1 comes with the NVIDIA driver" in f.fix and "tensorflow[and-cuda]" not in f.fix


@pytest.mark.parametrize("cuda,level,text", [
    ("11.8", "error", "the driver is too old"),
    ("12.2", "warning", "minor-version compatibility"),
    ("12.5", "ok", "uses CUDA 12.5.1"),
    ("12.8", "ok", "supports CUDA up to 12.8"),
])
def test_the_driver_cuda_version_against_tensorflows(cuda, level, text):
    m = machine(1, cuda_driver_version=cuda, driver_version="520.61.05")
    findings = diagnose(facts(m, tf=tf_facts(1 if level != "error" else 0)))
    f = find(findings, "driver-cuda", level)
    assert text in f.seen and "driver 520.61.05" in f.seen
    if level == "error":
        assert "555.42.06" in f.fix
        assert "the driver supports CUDA 11.8 only" in find(findings, "tensorflow-gpus", "error").seen


@pytest.mark.parametrize("cc,name,level,text", [
    ("8.0", "NVIDIA A100", "ok", "compute capability 8.0"),
    ("7.5", "Tesla T4", "ok", "compute capability 7.5"),          # sm_70 kernels run on 7.x
    ("9.0", "NVIDIA H100", "warning", "compiles PTX"),           # only compute_90 PTX in the wheel
    ("12.0", "NVIDIA GeForce RTX 5090", "warning", "compiles PTX"),
    ("5.2", "GeForce GTX 980", "error", "below compute capability 6.0"),
    ("3.7", "Tesla K80", "error", "below compute capability 6.0"),
])
def test_compute_capability_against_the_kernels_tensorflow_ships(cc, name, level, text):
    m = machine(gpus=[gpu(0, cc=cc, name=name)])
    findings = diagnose(facts(m, tf=tf_facts(0 if level == "error" else 1)))
    f = find(findings, "compute-capability", level)
    assert text in f.seen and name in f.seen
    if level == "error":
        assert f"{name} has compute capability {cc}, which TensorFlow does not support" in find(
            findings, "tensorflow-gpus", "error").seen


def test_only_xla_gpu_devices():
    tf = tf_facts(0, physical_devices=(("/physical_device:CPU:0", "CPU"), ("/physical_device:XLA_GPU:0", "XLA_GPU")))
    cause = find(diagnose(facts(machine(1), tf=tf)), "tensorflow-gpus", "error").seen
    assert "only XLA_GPU devices" in cause


@pytest.mark.parametrize("tf_version,level", [("2.21.0", "error"), ("2.10.1", "warning")])
def test_native_windows(tf_version, level):
    m = machine(1, platform="win32")
    findings = diagnose(Facts(machine=m, packages={"tensorflow": tf_version}, tensorflow=tf_facts(0, version=tf_version)))
    f = find(findings, "platform", level)
    assert "native Windows" in f.seen and "WSL2" in f.fix
    if level == "error":
        assert "native Windows has no GPU TensorFlow since 2.11" in find(findings, "tensorflow-gpus", "error").seen


def test_macos_cannot_use_nvidia_gpus():
    f = find(diagnose(facts(no_gpu_machine(platform="darwin"), tf=tf_facts(0))), "platform", "warning")
    assert "tensorflow-metal" in f.fix


def test_no_cause_found_quotes_tensorflows_own_words():
    log = "E0000 00:00:1700000000.0   7 cuda_executor.cc:1] failed call to cuInit: CUDA_ERROR_SYSTEM_NOT_READY"
    f = find(diagnose(facts(machine(1), tf=tf_facts(0, log=log))), "tensorflow-gpus", "error")
    assert "No cause found" in f.seen and "failed call to cuInit: CUDA_ERROR_SYSTEM_NOT_READY" in f.seen
    assert "TF_CPP_MIN_LOG_LEVEL=0" in f.fix


def test_memory_held_by_other_processes():
    m = machine(gpus=[gpu(0, used=30000)])
    f = find(diagnose(facts(m, tf=tf_facts(1))), "memory-in-use", "warning")
    assert "30000 of 40960 MiB already in use" in f.seen


# ------------------------------------------------------------ the config against the hardware


@pytest.mark.parametrize("devices,text", [
    ({"visible_gpus": [3]}, "GPU index 3 was requested (received [3]), but this process can see 2 GPUs"),
    ({"memory_limit_mib": 50000}, "50000 MiB is more than GPU 0 (NVIDIA A100-SXM4-40GB) has: 40960 MiB"),
    ({"memory_limit_mib": 200, "gpu_logical_devices": 4}, "split into 4 logical devices of 50 MiB"),
])
def test_config_requests_the_hardware_cannot_meet(devices, text):
    f = find(diagnose(facts(), load_config({}, devices=devices)), "config", "error")
    assert text in f.seen and f.fix


def test_config_warnings_and_free_memory():
    findings = diagnose(facts(machine(gpus=[gpu(0, used=38000)]), tf=tf_facts(1)),
                        load_config({}, devices={"memory_growth": True, "memory_limit_mib": 8192}))
    texts = [f.seen for f in findings if f.check == "config" and f.level == "warning"]
    assert any("both set" in t for t in texts)
    assert any("asked for 8192 MiB but only 2960 MiB" in t for t in texts)


# ------------------------------------------------------------ the report and the facts file


def test_quiet_report_prints_only_errors_and_the_verdict():
    findings = diagnose(facts(tf=tf_facts(0), libs=libraries("libcudnn.so.9")))
    quiet = report(findings, quiet=True)
    assert "[ error ] CUDA libraries" in quiet and "[  ok   ]" not in quiet
    assert quiet.endswith("tfgpu doctor: 2 error(s), 0 warning(s).")
    assert report(diagnose(facts()), quiet=True) == ""


def test_facts_survive_a_json_round_trip():
    f = facts(tf=tf_facts(2, log="x"), libs=libraries("libcudnn.so.9"))
    assert Facts.from_dict(json.loads(json.dumps(f.to_dict()))) == f


# ------------------------------------------------------------ the real path, and the command line


@pytest.mark.slow
def test_real_facts_on_this_machine():
    real = gather_facts()
    import importlib.metadata as md

    assert real.packages["tensorflow"] == md.version("tensorflow")
    assert real.tensorflow is not None and real.tensorflow.version == md.version("tensorflow")
    assert ("/physical_device:CPU:0", "CPU") in real.tensorflow.physical_devices
    if not real.machine.nvml_gpus:
        assert real.machine.nvml_error  # says why no GPU was listed
    names = [lib.name for lib in real.libraries]
    assert "libcudnn.so.9" in names and "libcudart.so.12" in names
    assert all((lib.path is None) != (lib.error is None) for lib in real.libraries)
    findings = diagnose(real)
    assert find(findings, "tensorflow-installed", "ok") and find(findings, "tensorflow-gpus")


def test_libraries_are_not_probed_off_linux():
    assert probe_libraries(platform="win32") == ()


@pytest.mark.slow
def test_doctor_command_on_this_machine(tmp_path):
    result = run_cli("doctor", "--json")
    data = json.loads(result.stdout)
    assert result.returncode == (9 if data["errors"] else 0), result.stderr
    assert data["facts"]["tensorflow"]["version"] and {f["level"] for f in data["findings"]} <= {"ok", "warning", "error"}
    text = run_cli("doctor", "recipes/mnist.yaml", "--no-tensorflow")
    assert "TensorFlow installed" in text.stdout and "tfgpu doctor:" in text.stdout
    assert "TensorFlow build" not in text.stdout  # not started


def test_doctor_command_on_saved_facts(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"facts": facts(tf=tf_facts(0), libs=libraries("libcudnn.so.9")).to_dict()}))
    result = run_cli("doctor", "--facts", str(broken))
    assert result.returncode == 9
    assert "libcudnn.so.9 (cuDNN 9, pip nvidia-cudnn-cu12)" in result.stdout and "fix: install the CUDA" in result.stdout
    assert "Traceback" not in result.stderr
    warn = tmp_path / "warn.json"
    warn.write_text(json.dumps(facts(machine(gpus=[gpu(0, used=39000)]), tf=tf_facts(1)).to_dict()))
    assert run_cli("doctor", "--facts", str(warn)).returncode == 0
    assert run_cli("doctor", "--facts", str(warn), "--strict").returncode == 9
    quiet = run_cli("doctor", "--facts", str(warn), "--quiet")
    assert quiet.returncode == 0 and quiet.stdout == ""
    bad = run_cli("doctor", "--facts", str(tmp_path / "missing.json"))
    assert bad.returncode == 3 and "--facts" in bad.stderr and "missing.json" in bad.stderr


def test_doctor_reports_a_bad_recipe_as_a_finding(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("devices:\n  visible_gpu: [0]\n")
    result = run_cli("doctor", str(recipe), "--no-tensorflow")
    assert result.returncode == 9 and "unknown key 'devices.visible_gpu'" in result.stdout


@pytest.mark.slow
def test_devices_command(tmp_path):
    result = run_cli("devices", "recipes/mnist.yaml", "--set", "devices.cpu_logical_devices=2")
    assert result.returncode == 0, result.stderr
    assert "physical devices: /physical_device:CPU:0 (CPU)" in result.stdout
    assert "logical devices:  /device:CPU:0 (CPU), /device:CPU:1 (CPU)" in result.stdout
    data = json.loads(run_cli("devices", "--json").stdout)
    assert data["tensorflow"]["logical_devices"] == [["/device:CPU:0", "CPU"]]
    assert data["tensorflow"]["build_info"]["is_cuda_build"] in (True, False)
    fast = run_cli("devices", "--no-tensorflow")
    assert fast.returncode == 0 and "TensorFlow: not examined" in fast.stdout


def test_plan_for_another_machine_from_its_devices_json(tmp_path):
    saved = tmp_path / "h100x2.json"
    two = machine(gpus=[gpu(0, cc="9.0", total=81559, name="NVIDIA H100 80GB HBM3"),
                        gpu(1, cc="9.0", total=81559, name="NVIDIA H100 80GB HBM3")])
    saved.write_text(json.dumps(dataclasses.replace(facts(two), libraries=()).to_dict()))
    result = run_cli("plan", "recipes/mnist.yaml", "--machine", str(saved), "--set", "devices.memory_fraction=0.5",
                     "--set", "devices.memory_growth=null")
    assert result.returncode == 0, result.stderr
    assert "Physical GPUs: GPU:0 NVIDIA H100 80GB HBM3 (81559 MiB), GPU:1 NVIDIA H100 80GB HBM3 (81559 MiB)" in result.stdout
    assert "tf.config.set_logical_device_configuration(<GPU:1>, [LogicalDeviceConfiguration(memory_limit=40779)])" in result.stdout
    assert "Strategy: mirrored on /gpu:0, /gpu:1, cross-device ops nccl" in result.stdout
    assert "Replicas: 2; batch: 4096 per replica x 2 = 8192 global" in result.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    wrong = run_cli("plan", "--machine", str(bad))
    assert wrong.returncode == 3 and "not a tfgpu facts file" in wrong.stderr


@pytest.mark.parametrize("body,seen", [
    ("raise ImportError('libcudart.so.12: cannot open shared object file: No such file or directory')",
     "import tensorflow failed: ImportError: libcudart.so.12: cannot open shared object file"),
    ("import os\nos.abort()", "exited with code -6 before reporting"),
])
def test_devices_and_doctor_with_a_tensorflow_that_cannot_start(tmp_path, body, seen):
    # A broken TensorFlow installation, first on the child's import path: the commands must still answer.
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(body + "\n")
    devices = run_cli("devices", PYTHONPATH=str(tmp_path))
    assert devices.returncode == 0, devices.stderr
    assert "NVML" in devices.stdout and "TensorFlow: cannot start:" in devices.stdout
    with_recipe = run_cli("devices", "recipes/mnist.yaml", PYTHONPATH=str(tmp_path))  # setup() meets it first
    assert with_recipe.returncode == 0 and devices.stdout.splitlines()[-1] in with_recipe.stdout
    doctor = run_cli("doctor", "--json", PYTHONPATH=str(tmp_path))
    assert doctor.returncode == 9
    finding = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "tensorflow-import"][0]
    assert finding["level"] == "error" and seen in finding["seen"] and finding["fix"]


# ------------------------------------------------------------------ inside a Slurm allocation

#: Two nodes, one task each, as `srun` sets them for task 0 of step 0 (what tests/cluster/test_slurm.py sees).
SLURM_STEP = {"SLURM_JOB_ID": "7", "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_NODELIST": "n[1-2]",
              "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURMD_NODENAME": "n1",
              "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NUM_TASKS": "2"}
MULTI_WORKER = {"strategy": "multi_worker_mirrored"}


def slurm_findings(env, n=2, distribute=None):
    config = load_config({}, distribute=distribute) if distribute is not None else None
    return [f for f in diagnose(facts(machine(n, env=env)), config) if f.check == "slurm"]


def test_outside_slurm_the_doctor_says_nothing_of_it():
    assert slurm_findings({}, distribute=MULTI_WORKER) == []


def test_a_task_of_a_step_sees_what_slurm_gave_and_the_workers_it_makes():
    env = {**SLURM_STEP, "SLURM_GPUS_ON_NODE": "2", "SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}
    gave, workers = slurm_findings(env, n=4, distribute=MULTI_WORKER)
    assert gave.level == "ok" and gave.seen.startswith("job 7 (partition gpu): 2 nodes (n1, n2), 2 tasks (1, 1 per node)")
    assert "task 0 of step 0 on n1" in gave.seen
    assert "GPUs: 2 on this node from Slurm (SLURM_GPUS_ON_NODE; ids 0,1), CUDA_VISIBLE_DEVICES=0,1, 2 visible" in gave.seen
    assert workers.level == "ok" and "2 worker(s), one per task, the chief task 0 on n1" in workers.seen


def test_gpus_slurm_did_not_give_are_a_warning():
    (gave, gpus) = slurm_findings({**SLURM_STEP, "SLURM_GPUS_ON_NODE": "1"}, n=4)
    assert gpus.level == "warning" and "gave this node 1 GPU(s)" in gpus.seen and "sees 4" in gpus.seen
    assert "CUDA_VISIBLE_DEVICES is unset" in gpus.seen and "--gpus-per-worker" in gpus.fix


@pytest.mark.parametrize("env,distribute,said,fix", [
    ({k: v for k, v in SLURM_STEP.items() if not k.startswith(("SLURM_STEP", "SLURM_PROCID"))}, MULTI_WORKER,
     "outside a job step", "srun"),
    (SLURM_STEP, {"strategy": "mirrored"}, "2 separate runs", "distribute.strategy=multi_worker_mirrored"),
    ({**SLURM_STEP, "TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'},
     MULTI_WORKER, "TF_CONFIG is set", "remove TF_CONFIG"),
])
def test_a_recipe_whose_workers_do_not_match_the_allocation_is_a_warning(env, distribute, said, fix):
    warning = [f for f in slurm_findings(env, distribute=distribute) if f.level == "warning"]
    assert len(warning) == 1 and said in warning[0].seen and fix in warning[0].fix, warning
