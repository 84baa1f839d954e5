"""``tfgpu devices`` and ``tfgpu doctor`` with ``backend: jax``: the JAX facts, their report and check_jax.

Most tests build :class:`~tfgpu.devices.probe.Facts` by hand (no JAX needed); the
ones that start the real JAX child process skip where JAX is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from tfgpu.cli import main as cli_main
from tfgpu.config import load_config
from tfgpu.devices import probe as probe_module
from tfgpu.devices.doctor import check_jax, check_packages, describe_facts, diagnose, report
from tfgpu.devices.probe import Facts, GpuInfo, JaxFacts, Probe, TensorflowFacts, gather_facts, load_facts, probe_jax

from ..conftest import ROOT, child_env

needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")

JAX = load_config({"backend": "jax"})
JAX_PACKAGES = {"jax": "0.10.2", "jaxlib": "0.10.2", "keras": "3.15.1", "nvidia-ml-py": "12.560.30"}
CPU2 = (("cpu:0", "cpu", "cpu"), ("cpu:1", "cpu", "cpu"))


def jax_facts(devices=CPU2, backend: str = "cpu", **kw) -> JaxFacts:
    base = dict(version="0.10.2", jaxlib_version="0.10.2", keras_version="3.15.1", default_backend=backend,
                devices=devices, seconds=1.5)
    base.update(kw)
    return JaxFacts(**base)


def gpu_machine(n: int = 2, **kw) -> Probe:
    gpus = tuple(GpuInfo(i, "NVIDIA H100 80GB HBM3", 81559, f"GPU-{i:04d}", i, 500, "9.0") for i in range(n))
    base = dict(gpus=gpus, nvml_gpus=gpus, driver_version="550.54.15", cuda_driver_version="12.4",
                nvidia_smi="/usr/bin/nvidia-smi", device_nodes=("/dev/nvidia0", "/dev/nvidiactl"))
    base.update(kw)
    return Probe(**base)


def cpu_machine() -> Probe:
    return Probe(nvml_error="NVML could not start (NVML Shared Library Not Found): no NVIDIA driver is loaded")


def levels(findings) -> dict[str, int]:
    return {lvl: sum(f.level == lvl for f in findings) for lvl in ("ok", "warning", "error")}


# ------------------------------------------------------------ describe_facts


def test_devices_text_has_a_jax_line_with_versions_plugin_and_devices():
    facts = Facts(machine=cpu_machine(), packages=JAX_PACKAGES, jax=jax_facts())
    text = describe_facts(facts)
    assert ("JAX 0.10.2 (jaxlib 0.10.2, CUDA plugin: none), Keras 3.15.1, default backend cpu; devices: "
            "cpu:0 (cpu), cpu:1 (cpu)") in text
    assert "TensorFlow: not installed (not needed with backend: jax)." in text


def test_devices_text_names_the_cuda_plugin_and_the_gpus():
    packages = {**JAX_PACKAGES, "jax-cuda12-plugin": "0.10.2", "jax-cuda12-pjrt": "0.10.2"}
    gpus = (("gpu:0", "gpu", "NVIDIA H100 80GB HBM3"), ("gpu:1", "gpu", "NVIDIA H100 80GB HBM3"))
    text = describe_facts(Facts(machine=gpu_machine(), packages=packages, jax=jax_facts(gpus, "gpu")))
    assert "CUDA plugin: jax-cuda12-plugin 0.10.2" in text
    assert "default backend gpu; devices: gpu:0 (NVIDIA H100 80GB HBM3), gpu:1 (NVIDIA H100 80GB HBM3)" in text


def test_devices_text_when_jax_cannot_start_or_the_config_failed():
    broken = JaxFacts(import_error="ModuleNotFoundError: No module named 'jax'")
    assert "JAX: cannot start: ModuleNotFoundError: No module named 'jax'" in describe_facts(Facts(jax=broken))
    text = describe_facts(Facts(jax=jax_facts(setup_error="distribute.devices: gpu:3 was requested")))
    assert "the config could not be applied: distribute.devices: gpu:3" in text


def test_without_jax_facts_there_is_no_jax_line():
    assert "JAX" not in describe_facts(Facts(machine=cpu_machine()))


# ------------------------------------------------------------ check_jax


def test_check_jax_is_silent_unless_the_backend_is_jax():
    facts = Facts(machine=gpu_machine(), packages={})
    assert check_jax(facts, None) == []
    assert check_jax(facts, load_config({})) == []


def test_jax_missing_is_an_error_with_both_install_commands():
    findings = check_jax(Facts(machine=cpu_machine(), packages={"keras": "3.15.1"},
                               jax=JaxFacts(import_error="ModuleNotFoundError: No module named 'jax'")), JAX)
    [f] = findings
    assert f.level == "error" and "jax and jaxlib are not installed" in f.seen
    assert "pip install 'tfgpu[jax]'" in f.fix and 'pip install -U "jax[cuda12]"' in f.fix


def test_jax_installed_but_not_importable_is_an_error():
    [f] = check_jax(Facts(packages=JAX_PACKAGES, jax=JaxFacts(import_error="ImportError: jaxlib is broken")), JAX)
    assert f.level == "error" and "import jax failed: ImportError: jaxlib is broken" in f.seen


def test_gpus_by_nvml_but_jax_sees_only_the_cpu_without_a_plugin():
    facts = Facts(machine=gpu_machine(), packages=JAX_PACKAGES, jax=jax_facts((("cpu:0", "cpu", "cpu"),),
                  log="An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not installed. "
                      "Falling back to cpu."))
    [f] = check_jax(facts, JAX)
    assert f.check == "jax-gpus" and f.level == "error"
    assert "NVML lists 2 GPU(s)" in f.seen and "JAX lists cpu:0 (cpu)" in f.seen
    assert "no JAX CUDA plugin is installed" in f.seen and "CUDA-enabled jaxlib is not installed" in f.seen
    assert 'pip install -U "jax[cuda12]"' in f.fix and "supports CUDA 12.4" in f.fix


def test_a_plugin_that_does_not_match_jaxlib_or_the_driver_is_named():
    packages = {**JAX_PACKAGES, "jax-cuda13-plugin": "0.9.0"}
    facts = Facts(machine=gpu_machine(), packages=packages, jax=jax_facts((("cpu:0", "cpu", "cpu"),)))
    [f] = check_jax(facts, JAX)
    assert f.level == "error"
    assert "jax-cuda13-plugin 0.9.0 is not the release of jaxlib 0.10.2" in f.seen
    assert "jax-cuda13-plugin needs a driver for CUDA 13" in f.seen


def test_gpus_hidden_on_purpose_are_no_jax_error():
    config = load_config({"backend": "jax", "devices": {"visible_gpus": "none"}})
    findings = check_jax(Facts(machine=gpu_machine(), packages=JAX_PACKAGES, jax=jax_facts()), config)
    assert levels(findings) == {"ok": 1, "warning": 0, "error": 0}


def test_all_fine_lists_jax_devices():
    packages = {**JAX_PACKAGES, "jax-cuda12-plugin": "0.10.2", "jax-cuda12-pjrt": "0.10.2"}
    gpus = (("gpu:0", "gpu", "NVIDIA H100 80GB HBM3"), ("gpu:1", "gpu", "NVIDIA H100 80GB HBM3"))
    [f] = check_jax(Facts(machine=gpu_machine(), packages=packages, jax=jax_facts(gpus, "gpu")), JAX)
    assert f.level == "ok" and "CUDA plugin: jax-cuda12-plugin 0.10.2" in f.seen
    assert "devices: gpu:0 (NVIDIA H100 80GB HBM3), gpu:1 (NVIDIA H100 80GB HBM3)" in f.seen
    [f] = check_jax(Facts(machine=cpu_machine(), packages=JAX_PACKAGES, jax=jax_facts()), JAX)
    assert f.level == "ok" and "default backend cpu; devices: cpu:0 (cpu), cpu:1 (cpu)" in f.seen


def test_jax_seeing_fewer_gpus_than_nvml_is_a_warning():
    packages = {**JAX_PACKAGES, "jax-cuda12-plugin": "0.10.2"}
    facts = Facts(machine=gpu_machine(2), packages=packages,
                  jax=jax_facts((("gpu:0", "gpu", "NVIDIA H100 80GB HBM3"),), "gpu"))
    assert levels(check_jax(facts, JAX)) == {"ok": 1, "warning": 1, "error": 0}


def test_keras_that_does_not_start_on_jax_is_an_error():
    [f] = check_jax(Facts(packages=JAX_PACKAGES, jax=jax_facts(import_error="keras: ModuleNotFoundError: keras")), JAX)
    assert f.level == "error" and "keras>=3" in f.fix


# ------------------------------------------------------------ TensorFlow checks on a JAX host


def test_no_tensorflow_is_no_error_with_backend_jax():
    facts = Facts(machine=cpu_machine(), packages=JAX_PACKAGES, jax=jax_facts())
    [f] = check_packages(facts, JAX)
    assert f.level == "ok" and "not needed with backend: jax" in f.seen
    assert "image_folder" in f.seen and "output.tensorboard" in f.seen
    # backend tensorflow: still an error
    assert check_packages(facts, load_config({}))[0].level == "error"


def test_no_tensorflow_with_a_config_that_reads_through_it_is_a_warning():
    config = load_config({"backend": "jax", "output": {"tensorboard": True}})
    [f] = check_packages(Facts(packages=JAX_PACKAGES), config)
    assert f.level == "warning" and "output.tensorboard: true" in f.seen


def test_a_jax_gpu_host_without_tensorflow_has_no_tensorflow_errors():
    packages = {**JAX_PACKAGES, "jax-cuda12-plugin": "0.10.2", "jax-cuda12-pjrt": "0.10.2"}
    gpus = (("gpu:0", "gpu", "NVIDIA H100 80GB HBM3"), ("gpu:1", "gpu", "NVIDIA H100 80GB HBM3"))
    tf = TensorflowFacts(import_error="ModuleNotFoundError: No module named 'tensorflow'")
    facts = Facts(machine=gpu_machine(), packages=packages, tensorflow=tf, jax=jax_facts(gpus, "gpu"))
    findings = diagnose(facts, JAX)
    assert levels(findings)["error"] == 0 and levels(findings)["warning"] == 0, report(findings)
    checks = {f.check for f in findings}
    assert not checks & {"tensorflow-import", "tensorflow-build", "cuda-libraries", "driver-cuda",
                         "compute-capability", "tensorflow-gpus"}
    assert {"jax", "config", "tensorflow-installed"} <= checks


def test_tensorflow_cpu_beside_jax_is_fine():
    packages = {**JAX_PACKAGES, "tensorflow-cpu": "2.21.0", "jax-cuda12-plugin": "0.10.2"}
    gpus = (("gpu:0", "gpu", "NVIDIA H100 80GB HBM3"), ("gpu:1", "gpu", "NVIDIA H100 80GB HBM3"))
    tf = TensorflowFacts(version="2.21.0", keras_version="3.15.1", build_info={"is_cuda_build": False},
                         physical_devices=(("/physical_device:CPU:0", "CPU"),))
    findings = diagnose(Facts(machine=gpu_machine(), packages=packages, tensorflow=tf,
                              jax=jax_facts(gpus, "gpu")), JAX)
    assert levels(findings)["error"] == 0, report(findings)


# ------------------------------------------------------------ facts JSON


def test_facts_json_round_trip_with_jax_facts(tmp_path):
    facts = Facts(machine=cpu_machine(), packages=JAX_PACKAGES, jax=jax_facts(setup_error="x", log="warning"))
    again = Facts.from_dict(json.loads(json.dumps(facts.to_dict())))
    assert again == facts and again.jax.devices == CPU2
    path = tmp_path / "facts.json"
    path.write_text(json.dumps({"errors": 0, "facts": facts.to_dict()}))
    assert load_facts(str(path)).jax == facts.jax


def test_old_facts_json_without_jax_still_loads():
    data = Facts(machine=cpu_machine(), packages={"tensorflow": "2.21.0"}).to_dict()
    del data["jax"]
    assert Facts.from_dict(data).jax is None


# ------------------------------------------------------------ gathering (probes replaced)


def _no_tensorflow_host(monkeypatch):
    """A host without TensorFlow: its packages say so, and starting TensorFlow fails the test."""
    monkeypatch.setattr(probe_module, "probe_packages", lambda: dict(JAX_PACKAGES))
    monkeypatch.setattr(probe_module, "probe", cpu_machine)
    monkeypatch.setattr(probe_module, "probe_libraries", lambda *a, **k: ())

    def no_tf(*args, **kwargs):
        raise AssertionError("TensorFlow was started on a host without it")

    monkeypatch.setattr(probe_module, "probe_tensorflow", no_tf)
    asked = []
    monkeypatch.setattr(probe_module, "probe_jax", lambda config=None, **k: asked.append(config) or jax_facts())
    return asked


def test_gather_facts_with_jax_skips_a_tensorflow_that_is_not_installed(monkeypatch):
    asked = _no_tensorflow_host(monkeypatch)
    facts = gather_facts(jax=True)
    assert facts.tensorflow is None and facts.jax == jax_facts() and asked == [None]


def test_devices_with_backend_jax_skips_a_tensorflow_that_is_not_installed(monkeypatch):
    asked = _no_tensorflow_host(monkeypatch)
    result = CliRunner().invoke(cli_main, ["devices", "--set", "backend=jax", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["tensorflow"] is None and data["jax"]["devices"] == [list(d) for d in CPU2]
    assert asked == [{"backend": "jax"}]


# ------------------------------------------------------------ the real JAX child process

BLOCK_TENSORFLOW = textwrap.dedent("""
    import importlib.abc, runpy, sys

    class BlockTensorflow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "tensorflow":
                sys.stderr.write("TENSORFLOW WAS IMPORTED: " + name + "\\n")
                raise ImportError("tensorflow is blocked in this test")

    sys.meta_path.insert(0, BlockTensorflow())
    runpy.run_module("tfgpu.devices.seen_by_jax", run_name="__main__")
""")


@pytest.mark.slow
@needs_jax
def test_the_jax_child_never_imports_tensorflow():
    request = {"config": {"backend": "jax", "devices": {"cpu_logical_devices": 2}}}
    child = subprocess.run([sys.executable, "-c", BLOCK_TENSORFLOW], input=json.dumps(request), capture_output=True,
                           text=True, timeout=120, env=child_env(needs=("jax",), KERAS_BACKEND="jax"), cwd=ROOT)
    assert child.returncode == 0, child.stderr
    assert "TENSORFLOW WAS IMPORTED" not in child.stderr
    data = json.loads(child.stdout.strip().splitlines()[-1])
    assert [d[0] for d in data["devices"]] == ["cpu:0", "cpu:1"], data
    assert data["default_backend"] == "cpu" and data["keras_version"] and "import_error" not in data


def test_probe_jax_reports_a_missing_jax_instead_of_raising(tmp_path, monkeypatch):
    fake = tmp_path / "jax"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'jax'\")\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    facts = probe_jax(timeout=120)
    assert facts.version is None and "No module named 'jax'" in facts.import_error
    assert "JAX: cannot start" in describe_facts(Facts(jax=facts))


@pytest.mark.slow
@needs_jax
def test_tfgpu_devices_with_backend_jax_lists_jax_cpu_devices():
    child = subprocess.run(
        [sys.executable, "-m", "tfgpu", "devices", "--set", "backend=jax", "--set", "devices.cpu_logical_devices=2"],
        capture_output=True, text=True, timeout=300, env=child_env(needs=("jax",)), cwd=ROOT)
    assert child.returncode == 0, child.stderr
    assert "default backend cpu; devices: cpu:0 (cpu), cpu:1 (cpu)" in child.stdout, child.stdout


@pytest.mark.slow
@needs_jax
def test_tfgpu_devices_json_and_doctor_with_backend_jax():
    child = subprocess.run(
        [sys.executable, "-m", "tfgpu", "devices", "--no-tensorflow", "--json", "--set", "backend=jax",
         "--set", "devices.cpu_logical_devices=2"], capture_output=True, text=True, timeout=300,
        env=child_env(needs=("jax",)), cwd=ROOT)
    assert child.returncode == 0, child.stderr
    data = json.loads(child.stdout)
    assert data["tensorflow"] is None and [d[0] for d in data["jax"]["devices"]] == ["cpu:0", "cpu:1"]
    assert "jax" in data["packages"] and "jaxlib" in data["packages"]
    doctor = subprocess.run([sys.executable, "-m", "tfgpu", "doctor", "--no-tensorflow", "--json", "--set",
                             "backend=jax"], capture_output=True, text=True, timeout=300,
                            env=child_env(needs=("jax",)), cwd=ROOT)
    out = json.loads(doctor.stdout)
    [jax] = [f for f in out["findings"] if f["check"] == "jax"]
    assert jax["level"] == "ok" and "devices: cpu:0 (cpu)" in jax["seen"], jax
    assert out["facts"]["jax"]["default_backend"] == "cpu"
