"""``tfgpu doctor --smoke``: the verdicts on made-up reports, and the real checks on logical CPU devices with
faults injected through the one seam (``TFGPU_SMOKE_FAULTS``)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tfgpu.devices.smoke import (CopyCheck, Faults, ReduceCheck, SmokeReport, StepCheck, gpu_link, implementations,
                                 reduce_groups, verdicts)

from ..conftest import run_cli

GPUS = ("/gpu:0", "/gpu:1", "/gpu:2")


def report(steps=(), reduces=(), copies=()) -> SmokeReport:
    r = SmokeReport(GPUS, "nccl")
    r.steps, r.reduces, r.copies = list(steps), list(reduces), list(copies)
    return r


def good_steps(devices=GPUS):
    return [StepCheck(d, op, 10, 0, 0, 0.0) for d in devices for op in ("matmul", "conv2d", "sum")]


def by_check(findings, check):
    return [f for f in findings if f.check == check]


def test_a_pair_that_sums_wrong_only_with_nccl_gets_the_p2p_fix_and_the_working_cross_device_ops():
    reduces = [ReduceCheck(GPUS[:2], (0, 1), "nccl", True, wrong=7),
               ReduceCheck(GPUS[:2], (0, 1), "hierarchical_copy", False),
               ReduceCheck(GPUS[:2], (0, 1), "reduce_to_one_device", False),
               ReduceCheck(GPUS[1:], (1, 2), "nccl", True)]
    (finding,) = by_check(verdicts(report(good_steps(), reduces)), "smoke-all-reduce")
    assert finding.level == "error" and finding.title == "All-reduce over /gpu:0 + /gpu:1"
    assert "nccl: 7 wrong" in finding.seen
    assert "distribute.cross_device_ops: hierarchical_copy" in finding.fix
    assert "NCCL_P2P_DISABLE=1" in finding.fix and "NVIDIA/nccl#631" in finding.fix


def test_a_device_that_computes_wrong_is_named_and_its_all_reduces_point_at_it():
    steps = good_steps(GPUS[:2]) + [StepCheck("/gpu:2", "matmul", 65536, 3, 1, 2.0),
                                    StepCheck("/gpu:2", "sum", 1, 0, 0, 0.0)]
    reduces = [ReduceCheck(GPUS, (0, 1, 2), "nccl", True, nan=3), ReduceCheck(GPUS[:2], (0, 1), "nccl", True)]
    findings = verdicts(report(steps, reduces))
    (device,) = by_check(findings, "smoke-device")
    assert device.level == "error" and "/gpu:2" in device.title
    assert "matmul: 3 of 65536 elements wrong (max error 2), 1 of 65536 NaN or infinite" in device.seen
    assert "devices.visible_gpus" in device.fix and "Xid" in device.fix
    (reduce,) = by_check(findings, "smoke-all-reduce")
    assert "/gpu:2: see its known step" in reduce.fix


def test_an_implementation_that_fails_everywhere_else_is_replaced_by_one_that_works():
    reduces = [ReduceCheck(GPUS[:2], (0, 1), "hierarchical_copy", True, error="InternalError: boom"),
               ReduceCheck(GPUS[:2], (0, 1), "reduce_to_one_device", False)]
    (finding,) = by_check(verdicts(report(good_steps(), reduces)), "smoke-all-reduce")
    assert "InternalError: boom" in finding.seen
    assert finding.fix == "set distribute.cross_device_ops: reduce_to_one_device (it sums right here)."


def test_nothing_sums_right_says_to_check_the_links_and_drop_a_gpu():
    reduces = [ReduceCheck(GPUS[:2], (0, 1), name, False, wrong=1) for name in ("nccl", "reduce_to_one_device")]
    (finding,) = by_check(verdicts(report(good_steps(), reduces)), "smoke-all-reduce")
    assert "nvidia-smi topo -m" in finding.fix


def test_a_slow_copy_is_a_warning_against_its_link_and_a_healthy_report_is_all_ok():
    slow = CopyCheck("/gpu:0", "/gpu:1", 64 << 20, 9.5, "NVLink", 40.0)
    fast = CopyCheck("/gpu:0", "/gpu:2", 64 << 20, 21.0, "PCIe P2P", 5.0)
    host = CopyCheck("/cpu:0", "/cpu:1", 16 << 20, 3.0, "host memory (logical devices)")
    findings = verdicts(report(good_steps(), [ReduceCheck(GPUS[:2], (0, 1), "nccl", True)], [slow, fast, host]))
    (warning,) = by_check(findings, "smoke-bandwidth")
    assert warning.level == "warning" and "9.5 GB/s over NVLink" in warning.seen and "40 GB/s" in warning.seen
    assert [f.level for f in findings if f.check != "smoke-bandwidth"] == ["ok", "ok"]


def test_the_checks_cover_all_replicas_and_each_pair_with_every_cross_device_ops_that_can_work():
    assert reduce_groups(["a", "b"]) == [(0, 1)]
    assert reduce_groups(["a", "b", "c"]) == [(0, 1, 2), (0, 1), (0, 2), (1, 2)]
    assert implementations(GPUS, "hierarchical_copy", Faults()) == [
        "hierarchical_copy", "nccl", "reduce_to_one_device"]
    assert implementations(("/cpu:0", "/cpu:1"), "reduce_to_one_device", Faults()) == ["reduce_to_one_device"]
    assert implementations(("/gpu:0", "/gpu:0"), None, Faults()) == ["reduce_to_one_device"]  # one GPU, split


def test_the_fault_seam_reads_its_variable_and_refuses_what_it_does_not_know():
    faults = Faults.from_env({"TFGPU_SMOKE_FAULTS": "wrong:/GPU:1, nan:cpu:0,nccl-pair:2-0"})
    assert faults.wrong == {"/gpu:1"} and faults.nan == {"cpu:0"} and faults.nccl_pairs == {frozenset((0, 2))}
    assert not Faults.from_env({})
    with pytest.raises(ValueError, match="unknown fault 'slow:1'"):
        Faults.from_env({"TFGPU_SMOKE_FAULTS": "slow:1"})


def test_the_link_between_two_gpus_comes_from_nvml_peer_to_peer_status():
    def fake(nvlink: bool, p2p: bool):
        status = {0: 0 if nvlink else 1, 1: 0 if p2p else 1}
        return SimpleNamespace(
            NVML_P2P_CAPS_INDEX_NVLINK=0, NVML_P2P_CAPS_INDEX_READ=1, NVML_P2P_STATUS_OK=0,
            nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetP2PStatus=lambda a, b, index: status[index])

    assert gpu_link(fake(True, True), 0, 1) == "NVLink"
    assert gpu_link(fake(False, True), 0, 1) == "PCIe P2P"
    assert gpu_link(fake(False, False), 0, 1) == "through the host"
    assert gpu_link(SimpleNamespace(), 0, 1) == "unknown"


@pytest.mark.slow
def test_doctor_smoke_on_two_logical_cpus_passes_and_prints_its_table():
    result = run_cli("doctor", "--smoke", "--no-tensorflow", "--set", "devices.cpu_logical_devices=2")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "Smoke test on 2 device(s) (/cpu:0, /cpu:1), tensorflow; cross-device ops reduce_to_one_device" in out
    assert "known step (matmul, conv2d, sum)              /cpu:1" in out
    assert "all-reduce reduce_to_one_device (configured)  /cpu:0 + /cpu:1   exact" in out
    assert "copy bandwidth" in out and "GB/s (16 MiB) over host memory (logical devices)" in out
    assert "[  ok   ] All-reduce: 1 device group(s) x reduce_to_one_device: exact sums on every replica" in out


@pytest.mark.slow
def test_doctor_smoke_names_each_injected_fault_and_its_fix_and_exits_9():
    """Three logical CPUs: /cpu:2 gives NaN, and the pair 0-1 sums wrong with NCCL only (run through the reduction
    to one device, as CPUs have no NCCL)."""
    result = run_cli("doctor", "--smoke", "--no-tensorflow", "--json", "--set", "devices.cpu_logical_devices=3",
                     TFGPU_SMOKE_FAULTS="nan:/cpu:2,nccl-pair:0-1")
    assert result.returncode == 9, result.stderr
    data = json.loads(result.stdout)
    smoke = data["smoke"]
    assert smoke["devices"] == ["/cpu:0", "/cpu:1", "/cpu:2"] and smoke["faults_injected"]
    bad = {(s["device"], s["op"]) for s in smoke["steps"] if not s["ok"]}
    assert bad == {("/cpu:2", "matmul"), ("/cpu:2", "conv2d"), ("/cpu:2", "sum")}
    sums = {(tuple(r["indices"]), r["implementation"]): r for r in smoke["all_reduce"]}
    assert set(sums) == {(g, name) for g in [(0, 1, 2), (0, 1), (0, 2), (1, 2)]
                         for name in ("nccl", "reduce_to_one_device")}
    assert sums[(0, 1), "nccl"]["wrong"] > 0 and sums[(0, 1), "reduce_to_one_device"]["ok"]
    assert sums[(0, 2), "reduce_to_one_device"]["nan"] == 2 and not sums[(0, 2), "nccl"]["ok"]
    errors = {f["title"]: f for f in data["findings"] if f["level"] == "error"}
    assert set(errors) == {"Known step on /cpu:2", "All-reduce over /cpu:0 + /cpu:1 + /cpu:2",
                           "All-reduce over /cpu:0 + /cpu:1", "All-reduce over /cpu:0 + /cpu:2",
                           "All-reduce over /cpu:1 + /cpu:2"}
    assert "NCCL_P2P_DISABLE=1" in errors["All-reduce over /cpu:0 + /cpu:1"]["fix"]
    assert "distribute.cross_device_ops: reduce_to_one_device" in errors["All-reduce over /cpu:0 + /cpu:1"]["fix"]
    assert "/cpu:2: see its known step" in errors["All-reduce over /cpu:1 + /cpu:2"]["fix"]


@pytest.mark.slow
def test_doctor_smoke_on_jax_runs_the_same_checks_through_jax():
    result = run_cli("doctor", "--smoke", "--no-tensorflow", "--json", "--set", "backend=jax",
                     "--set", "devices.cpu_logical_devices=2", needs=("jax",), TFGPU_SMOKE_FAULTS="wrong:cpu:0")
    assert result.returncode == 9, result.stderr
    smoke = json.loads(result.stdout)["smoke"]
    assert smoke["backend"] == "jax" and smoke["devices"] == ["cpu:0", "cpu:1"]
    assert {s["device"] for s in smoke["steps"] if not s["ok"]} == {"cpu:0"}
    (reduce,) = smoke["all_reduce"]
    assert reduce["implementation"] == "xla_psum" and reduce["wrong"] == 2 and reduce["nan"] == 0


@pytest.mark.slow
def test_doctor_smoke_checks_one_machine_and_says_so_for_a_cluster_recipe():
    result = run_cli("doctor", "--smoke", "--no-tensorflow", "--quiet", "--set",
                     "distribute.strategy=multi_worker_mirrored")
    assert result.returncode == 9, result.stdout + result.stderr
    assert "Smoke test: not run: distribute.strategy is multi_worker_mirrored" in result.stdout
    assert "--set distribute.strategy=mirrored" in result.stdout
    assert "Smoke test on" not in result.stdout  # nothing started


def test_doctor_smoke_refuses_another_machines_facts():
    result = run_cli("doctor", "--smoke", "--facts", "facts.json")
    assert result.returncode == 2 and "--smoke runs its checks on this machine's devices" in result.stderr
