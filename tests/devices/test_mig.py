"""MIG instances and mixed-GPU hosts: NVML facts injected at the probe seam, the real
probe, plan, doctor and CLI on top of them; and, where a GPU exists, the real NVML.

A MIG (Multi-Instance GPU) host cannot exist here, so its NVML answers come from
:class:`FakeNvml`, passed to :func:`tfgpu.devices.probe.probe` the way ``pynvml`` is; every
line of tfgpu that reads them is the real one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from tfgpu.config import load_config
from tfgpu.devices.doctor import diagnose
from tfgpu.devices.plan import make_plan
from tfgpu.devices.probe import Facts, GpuInfo, Probe, cuda_choice, probe, probe_packages
from tfgpu.errors import ConfigError, DeviceError

from ..conftest import one_paragraph, run_cli

MIB = 1024 * 1024
A100 = "NVIDIA A100-SXM4-40GB"


class FakeNvml:
    """The few pynvml functions the probe calls, answering for a described machine.

    ``gpus``: dicts with name, uuid, total/used MiB, cc, and ``mig``: ``None`` (no MIG
    support: NVML raises NotSupported), ``False`` (off) or a list of instance dicts
    (name, uuid, total MiB, gi, ci; ``None`` for an empty slot).
    """

    NVML_DEVICE_MIG_ENABLE = 1

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[dict]):
        self.gpus = gpus
        self.calls: list[str] = []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=h["total"] * MIB, used=h.get("used", 0) * MIB)

    def nvmlDeviceGetName(self, h):
        return h["name"].encode()  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return tuple(int(x) for x in h["cc"].split("."))

    def nvmlDeviceGetMigMode(self, h):
        if h["mig"] is None:
            raise self.NVMLError("Not Supported")
        return [1 if h["mig"] is not False else 0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, slot):
        slots = h["mig"] + [None] * 7
        if slots[slot] is None:
            raise self.NVMLError("Not Found")
        return slots[slot]

    def nvmlDeviceGetGpuInstanceId(self, h):
        return h["gi"]

    def nvmlDeviceGetComputeInstanceId(self, h):
        return h["ci"]


def instance(n: int, gi: int, size: str = "3g.20gb", total: int = 19968) -> dict:
    return {"name": f"{A100} MIG {size}", "uuid": f"MIG-{n}111aaaa-0000-5000-8000-00000000000{n}",
            "total": total, "used": 12, "gi": gi, "ci": 0}


#: GPU 0: an A100 in MIG mode with two 3g.20gb instances (slots 0 and 2; slot 1 empty);
#: GPU 1: an A100 with MIG off; GPU 2: a V100 (no MIG support).
MIG_HOST = [
    {"name": A100, "uuid": "GPU-aaaa0000-0000-4000-8000-000000000000", "total": 40960, "used": 50, "cc": "8.0",
     "mig": [instance(1, 1), None, instance(2, 2)]},
    {"name": A100, "uuid": "GPU-bbbb0000-0000-4000-8000-000000000000", "total": 40960, "used": 400, "cc": "8.0",
     "mig": False},
    {"name": "Tesla V100-SXM2-16GB", "uuid": "GPU-cccc0000-0000-4000-8000-000000000000", "total": 16384,
     "used": 300, "cc": "7.0", "mig": None},
]
MIG1, MIG2 = MIG_HOST[0]["mig"][0]["uuid"], MIG_HOST[0]["mig"][2]["uuid"]


def mig_probe(monkeypatch, cuda_visible_devices: str | None, host=None) -> Probe:
    if cuda_visible_devices is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cuda_visible_devices)
    return probe(nvml=FakeNvml(MIG_HOST if host is None else host))


# ------------------------------------------------------------------ the NVML seam


def test_probe_lists_gpus_their_mig_mode_and_each_instance_with_its_own_memory(monkeypatch):
    nvml = FakeNvml(MIG_HOST)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    p = probe(nvml=nvml)
    assert [(g.nvml_index, g.name, g.total_mib, g.mig_mode) for g in p.nvml_gpus] == [
        (0, A100, 40960, True), (1, A100, 40960, False), (2, "Tesla V100-SXM2-16GB", 16384, None)]
    assert [(g.uuid, g.total_mib, g.used_mib, g.gpu_instance_id, g.compute_instance_id, g.nvml_index,
             g.parent_uuid, g.compute_capability) for g in p.mig_devices] == [
        (MIG1, 19968, 12, 1, 0, 0, MIG_HOST[0]["uuid"], "8.0"),
        (MIG2, 19968, 12, 2, 0, 0, MIG_HOST[0]["uuid"], "8.0")]
    assert p.mig_devices[0].name == f"{A100} MIG 3g.20gb" and p.mig_devices[0].is_mig
    assert nvml.calls == ["init", "shutdown"] and p.driver_version == "550.54.15" and p.cuda_driver_version == "12.4"


def test_without_cuda_visible_devices_a_process_sees_whole_gpus_and_one_mig_instance(monkeypatch):
    p = mig_probe(monkeypatch, None)
    assert [g.uuid or g.name for g in p.gpus] == [MIG1, MIG_HOST[1]["uuid"], MIG_HOST[2]["uuid"]]
    assert [g.index for g in p.gpus] == [0, 1, 2]
    assert [g.uuid for g in p.mig_hidden] == [MIG2]


@pytest.mark.parametrize("value, visible, hidden", [
    (MIG2, [MIG2], []),                                       # R470+ MIG UUID
    (MIG2[:12], [MIG2], []),                                  # a unique prefix
    ("MIG-", [], []),                                         # a prefix of both names neither: CUDA stops
    (f"MIG-{MIG_HOST[0]['uuid']}/2/0", [MIG2], []),            # pre-R470 MIG-GPU-<uuid>/<gi>/<ci>
    (f"MIG-{MIG_HOST[0]['uuid']}/5/0", [], []),                # no such instance
    ("0", [MIG1], [MIG2]),                                    # the MIG-mode GPU's index stands for its instances
    (f"{MIG1},{MIG2}", [MIG1], [MIG2]),                       # one MIG instance per process
    (f"2,{MIG2},1", [MIG_HOST[2]["uuid"], MIG2, MIG_HOST[1]["uuid"]], []),
    (f"{MIG1},{MIG1}", [MIG1], []),                           # a repeat stops CUDA
    ("GPU-cccc", [MIG_HOST[2]["uuid"]], []),
    ("-1", [], []),
])
def test_cuda_visible_devices_names_mig_instances_as_cuda_does(value, visible, hidden):
    machine = probe(nvml=FakeNvml(MIG_HOST))
    shown, dropped = cuda_choice(machine.nvml_gpus, machine.mig_devices, value)
    assert [g.uuid for g in shown] == visible
    assert [g.index for g in shown] == list(range(len(visible)))
    assert [g.uuid for g in dropped] == hidden


# ------------------------------------------------------------------ plan on MIG


def test_plan_caps_a_mig_instance_from_its_own_memory_and_names_it_by_uuid(monkeypatch):
    p = mig_probe(monkeypatch, MIG2)
    plan = make_plan(load_config({"devices": {"memory_fraction": 0.5}}), p)
    assert [str(c) for c in plan.tf_calls if "logical_device" in c.api] == [
        "tf.config.set_logical_device_configuration(<GPU:0>, [LogicalDeviceConfiguration(memory_limit=9984)])"]
    assert "GPU:0 NVIDIA A100-SXM4-40GB MIG 3g.20gb (19968 MiB; MIG instance GI 2/CI 0 of NVML GPU 0)" \
        in plan.describe()
    chosen = make_plan(load_config({"devices": {"visible_gpus": [0]}}), p)
    assert chosen.env["CUDA_VISIBLE_DEVICES"] == MIG2  # an index would name the whole parent GPU
    with pytest.raises(DeviceError) as err:
        make_plan(load_config({"devices": {"memory_limit_mib": 30000}}), p)
    assert "30000 MiB is more than GPU 0 (NVIDIA A100-SXM4-40GB MIG 3g.20gb) has: 19968 MiB" in err.value.message


def test_plan_warns_that_other_mig_instances_are_out_of_reach(monkeypatch):
    plan = make_plan(load_config({}), mig_probe(monkeypatch, f"{MIG1},{MIG2}"))
    [warning] = [w for w in plan.warnings if "MIG" in w]
    assert f"uses {MIG1}" in warning and f"cannot see {MIG2}" in warning
    assert "one worker per instance" in warning and "CUDA_VISIBLE_DEVICES=MIG-<uuid>" in warning


# ------------------------------------------------------------------ mixed GPU models and sizes


def mixed() -> Probe:
    gpus = (GpuInfo(0, "NVIDIA H100 80GB HBM3", 81559, "GPU-h100", 0, 600, "9.0"),
            GpuInfo(1, "NVIDIA A10", 23028, "GPU-a10", 1, 300, "8.6"))
    return Probe(gpus=gpus, nvml_gpus=gpus)


def calls(plan) -> list[str]:
    return [str(c) for c in plan.tf_calls if c.device and c.device.startswith("GPU")]


def test_mixed_gpus_get_fractions_of_their_own_totals_and_per_gpu_limits():
    plan = make_plan(load_config({"devices": {"memory_fraction": 0.5}}), mixed())
    assert calls(plan) == [
        "tf.config.set_logical_device_configuration(<GPU:0>, [LogicalDeviceConfiguration(memory_limit=40779)])",
        "tf.config.set_logical_device_configuration(<GPU:1>, [LogicalDeviceConfiguration(memory_limit=11514)])"]
    plan = make_plan(load_config({"devices": {"memory_limit_mib": [60000, 20000], "gpu_logical_devices": 2}}),
                     mixed())
    assert calls(plan) == [
        "tf.config.set_logical_device_configuration(<GPU:0>, [LogicalDeviceConfiguration(memory_limit=30000), "
        "LogicalDeviceConfiguration(memory_limit=30000)])",
        "tf.config.set_logical_device_configuration(<GPU:1>, [LogicalDeviceConfiguration(memory_limit=10000), "
        "LogicalDeviceConfiguration(memory_limit=10000)])"]
    plan = make_plan(load_config({"devices": {"memory_fraction": [0.9, 0.25]}}), mixed())
    assert "memory_limit=73403" in calls(plan)[0] and "memory_limit=5757" in calls(plan)[1]


def test_a_limit_the_smaller_gpu_cannot_meet_says_which_and_offers_a_per_gpu_list():
    with pytest.raises(DeviceError) as err:
        make_plan(load_config({"devices": {"memory_limit_mib": 30000}}), mixed())
    assert "30000 MiB is more than GPU 1 (NVIDIA A10) has: 23028 MiB" in err.value.message
    assert "one limit per visible GPU as a list (their totals: [81559, 23028] MiB)" in err.value.hint
    with pytest.raises(DeviceError) as err:
        make_plan(load_config({"devices": {"memory_limit_mib": [1000, 2000, 3000]}}), mixed())
    assert "3 per-GPU values were given (received [1000, 2000, 3000]) but 2 GPU(s) will be visible" \
        in err.value.message and "one value per visible GPU" in err.value.hint
    plan = make_plan(load_config({"devices": {"memory_limit_mib": [3000], "visible_gpus": [1]}}), mixed())
    assert calls(plan) == [
        "tf.config.set_logical_device_configuration(<GPU:0>, [LogicalDeviceConfiguration(memory_limit=3000)])"]


@pytest.mark.parametrize("devices, words", [
    ({"memory_growth": [True, False]}, ["'devices.memory_growth'", "Memory growth cannot differ between GPU devices",
                                        "set true or false", "Received: [True, False] (list)"]),
    ({"memory_growth": {"0": True}}, ["'devices.memory_growth'", "one setting for every GPU"]),
    ({"memory_limit_mib": [8000, None]}, ["'devices.memory_limit_mib'", "entry 1 is null",
                                          "uncapped GPU takes all of its memory", "give every visible GPU a cap"]),
    ({"memory_fraction": [0.5, 0]}, ["'devices.memory_fraction'", "entry 1 (0): Input should be greater than 0"]),
    ({"memory_limit_mib": []}, ["'devices.memory_limit_mib'", "an empty list caps no GPU"]),
])
def test_memory_settings_that_would_differ_per_gpu_in_growth_are_config_errors(devices, words):
    with pytest.raises(ConfigError) as err:
        load_config({"devices": devices})
    text = str(err.value)
    assert all(w in text for w in words), text


def test_mirrored_over_unequal_gpus_warns_that_the_slowest_sets_the_pace():
    plan = make_plan(load_config({}), mixed())
    assert plan.strategy.kind == "mirrored"
    [warning] = [w for w in plan.warnings if "unequal" in w]
    assert "GPU:0 NVIDIA H100 80GB HBM3 (81559 MiB for TensorFlow), GPU:1 NVIDIA A10 (23028 MiB" in warning
    assert "slowest GPU sets the pace" in warning and "smallest memory (23028 MiB)" in warning
    alike = (GpuInfo(0, "NVIDIA A10", 23028, "GPU-1", 0), GpuInfo(1, "NVIDIA A10", 23028, "GPU-2", 1))
    assert not [w for w in make_plan(load_config({}), Probe(gpus=alike, nvml_gpus=alike)).warnings if "unequal" in w]
    assert not [w for w in make_plan(load_config({"devices": {"visible_gpus": [0]}}), mixed()).warnings
                if "unequal" in w]
    # equal models capped differently are unequal replicas too
    capped = make_plan(load_config({"devices": {"memory_limit_mib": [8000, 4000]}}), Probe(gpus=alike, nvml_gpus=alike))
    assert [w for w in capped.warnings if "unequal" in w and "smallest memory (4000 MiB)" in w]


# ------------------------------------------------------------------ doctor, devices, plan from a facts file


def test_doctor_reports_the_instance_in_use_and_the_one_per_process_limit(monkeypatch):
    findings = diagnose(Facts(machine=mig_probe(monkeypatch, None)))
    [mig] = [f for f in findings if f.check == "mig"]
    assert mig.level == "warning"
    assert f"this process uses MIG instance {MIG1}" in mig.seen and "memory settings apply to its 19968 MiB" in mig.seen
    assert f"so {MIG2} is not visible" in mig.seen and "CUDA_VISIBLE_DEVICES=MIG-<uuid>" in mig.fix
    one = diagnose(Facts(machine=mig_probe(monkeypatch, MIG2)))
    assert [(f.level, f.check) for f in one if f.check in ("mig", "cuda-visible-devices")] == [
        ("ok", "cuda-visible-devices"), ("ok", "mig")]
    host = [dict(MIG_HOST[0], mig=[]), MIG_HOST[1]]
    empty = diagnose(Facts(machine=mig_probe(monkeypatch, None, host)))
    [error] = [f for f in empty if f.check == "mig"]
    assert error.level == "error" and "in MIG mode but has no MIG instance" in error.seen
    assert "nvidia-smi mig -i 0 -cgi" in error.fix and "nvidia-smi -i 0 -mig 0" in error.fix


def test_devices_doctor_and_plan_show_mig_from_a_facts_file(monkeypatch, tmp_path):
    saved = tmp_path / "mig-host.json"
    saved.write_text(json.dumps(Facts(machine=mig_probe(monkeypatch, None), packages=probe_packages()).to_dict()))

    shown = run_cli("devices", "--facts", str(saved))
    assert shown.returncode == 0, shown.stderr
    assert "NVML  name" in shown.stdout and "MIG" in shown.stdout.splitlines()[1]
    assert "MIG instances (2; a CUDA process can use one of them):" in shown.stdout
    assert f"0    2/0    {A100} MIG 3g.20gb  {MIG2}  12/19968" in shown.stdout
    assert f"visible to this process: {MIG1} (GI 1/CI 0 of NVML 0) -> GPU:0, NVML 1 -> GPU:1" in shown.stdout
    assert f"not visible (one MIG instance per process): {MIG2}" in shown.stdout

    doctor = run_cli("doctor", "--facts", str(saved))
    assert "[warning] MIG instances: this process uses MIG instance" in doctor.stdout
    assert doctor.stdout.count("can use only one") == 1  # the config check does not repeat the MIG check
    assert doctor.returncode == 0, doctor.stdout  # a warning is not an error (exit 9 needs one, or --strict)

    plan = run_cli("plan", "recipes/mnist.yaml", "--machine", str(saved), "--set", "devices.memory_fraction=0.5",
                   "--set", "devices.visible_gpus=[0]")
    assert plan.returncode == 0, plan.stderr
    assert f"CUDA_VISIBLE_DEVICES={MIG1}" in plan.stdout
    assert "memory_limit=9984" in plan.stdout and "MIG instance GI 1/CI 0 of NVML GPU 0" in plan.stdout
    assert "Warning: 2 MIG instances are available but a CUDA process can use only one MIG instance" in plan.stdout

    bad = run_cli("plan", "recipes/mnist.yaml", "--machine", str(saved), "--set", "devices.memory_limit_mib=[9000]")
    assert bad.returncode == 4
    one_paragraph(bad.stderr)
    assert "1 per-GPU values were given (received [9000]) but 3 GPU(s) will be visible" in bad.stderr


# ------------------------------------------------------------------ a real GPU, where there is one


def _nvidia_smi(*args: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=True).stdout
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]


@pytest.mark.gpu
def test_real_nvml_matches_nvidia_smi(monkeypatch):
    if not shutil.which("nvidia-smi"):
        pytest.skip("no nvidia-smi: this machine has no NVIDIA GPU")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    p = probe()
    if not p.nvml_gpus:
        pytest.skip(f"NVML lists no GPU ({p.nvml_error})")
    rows = _nvidia_smi("--query-gpu=index,uuid,name,memory.total,mig.mode.current", "--format=csv,noheader,nounits")
    assert [(g.nvml_index, g.uuid, g.name, g.total_mib) for g in p.nvml_gpus] == [
        (int(i), uuid, name, int(total)) for i, uuid, name, total, _ in rows]
    assert [g.mig_mode for g in p.nvml_gpus] == [
        {"Enabled": True, "Disabled": False}.get(mode) for *_, mode in rows]
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    assert sorted(g.uuid for g in p.mig_devices) == sorted(
        word.rstrip(")") for word in listed.split() if word.startswith("MIG-"))
