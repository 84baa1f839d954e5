"""`tensorflow.mixed_precision: auto`: the Keras dtype policy the plan picks from the probe alone.

The machines are faked the way `tfgpu plan --machine FILE` reads them: a JSON probe with the GPUs'
compute capabilities and the CPU's flags (``cpu_flags``, from ``/proc/cpuinfo`` on a real machine).
Planning imports no TensorFlow, so these run in a second each; one real run shows the policy
reaching Keras and summary.json.
"""

from __future__ import annotations

import json

import pytest

from tfgpu.config import load_config
from tfgpu.devices.doctor import check_config
from tfgpu.devices.probe import Facts, GpuInfo, Probe, read_cpu

from ..conftest import TWO_REPLICAS, one_paragraph, only_run_dir, run_cli


def gpu(i: int, cc: str | None, name: str) -> dict:
    return {"index": i, "name": name, "total_mib": 40960, "uuid": f"GPU-{i}", "nvml_index": i,
            "compute_capability": cc}


A100, V100, T4, P100 = ("8.0", "NVIDIA A100-SXM4-40GB"), ("7.0", "Tesla V100-SXM2-16GB"), ("7.5", "Tesla T4"), \
    ("6.1", "NVIDIA GeForce GTX 1080")


def plan_auto(tmp_path, gpus=(), cpu_flags=(), backend="tensorflow", *extra: str) -> dict:
    """`tfgpu plan --json` of the MNIST recipe with `mixed_precision: auto` on the described machine."""
    saved = tmp_path / "machine.json"
    probe = {"gpus": [gpu(i, *g) for i, g in enumerate(gpus)], "cpu_flags": cpu_flags,
             "jax_memory_fraction_env": "XLA_CLIENT_MEM_FRACTION"}
    if cpu_flags is None:
        del probe["cpu_flags"]
    saved.write_text(json.dumps(probe))
    result = run_cli("plan", "recipes/mnist.yaml", "--machine", str(saved), "--json", "--set",
                     "tensorflow.mixed_precision=auto", "--set", f"backend={backend}", *extra)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["plan"]
    policy_calls = [c for c in plan["tf_calls_text"] if c.startswith("keras.mixed_precision.set_global_policy")]
    assert policy_calls == [f"keras.mixed_precision.set_global_policy('{plan['mixed_precision']}')"]
    return plan


@pytest.mark.parametrize("flags, policy, why", [
    (["avx2", "avx512f", "avx512_bf16"], "mixed_bfloat16", "auto: mixed_bfloat16 on a CPU with avx512_bf16 ("),
    (["avx2", "amx_tile", "amx_bf16"], "mixed_bfloat16", "auto: mixed_bfloat16 on a CPU with amx_bf16 ("),
    (["avx2", "avx512f"], "float32", "auto: float32 on a CPU without avx512_bf16 or amx_bf16"),
    ([], "float32", "auto: float32 on a CPU without avx512_bf16 or amx_bf16"),
    (None, "float32", "auto: float32 on a CPU whose flags are unknown"),  # a machine file of an older tfgpu
])
def test_auto_on_a_cpu_follows_its_bfloat16_flags(tmp_path, flags, policy, why):
    plan = plan_auto(tmp_path, (), flags)
    assert plan["mixed_precision"] == policy
    assert plan["mixed_precision_reason"].startswith(why), plan["mixed_precision_reason"]


@pytest.mark.parametrize("gpus, policy, why", [
    ([A100, A100], "mixed_bfloat16", "auto: mixed_bfloat16, the lowest compute capability of the 2 GPUs is 8.0 "
                                     "(GPU:0 NVIDIA A100-SXM4-40GB), >= 8.0: bfloat16 tensor cores"),
    ([("9.0", "NVIDIA H100 80GB HBM3")], "mixed_bfloat16",
     "auto: mixed_bfloat16, NVIDIA H100 80GB HBM3 has compute capability 9.0, >= 8.0"),
    ([T4], "mixed_float16", "auto: mixed_float16, Tesla T4 has compute capability 7.5, 7.x: float16 tensor cores "
                            "(bfloat16 needs >= 8.0); the loss is scaled (LossScaleOptimizer)"),
    ([P100], "float32", "auto: float32, NVIDIA GeForce GTX 1080 has compute capability 6.1, below 7.0: no tensor "
                        "cores"),
    # Mixed GPUs: the replicas run in lockstep under one policy, and the lowest capability decides.
    ([A100, V100], "mixed_float16", "the lowest compute capability of the 2 GPUs is 7.0 (GPU:1 Tesla V100-SXM2-16GB)"),
    ([A100, T4, P100], "float32", "the lowest compute capability of the 3 GPUs is 6.1 (GPU:2 NVIDIA GeForce GTX 1080)"),
    ([A100, (None, "GPU")], "float32", "auto: float32, NVML did not report GPU:1's compute capability"),
])
def test_auto_on_gpus_follows_the_lowest_compute_capability(tmp_path, gpus, policy, why):
    # The CPU's bfloat16 flags do not matter when GPUs train.
    plan = plan_auto(tmp_path, gpus, ["avx512_bf16"])
    assert plan["mixed_precision"] == policy
    assert why in plan["mixed_precision_reason"], plan["mixed_precision_reason"]


def test_auto_reads_only_the_gpus_the_run_uses(tmp_path):
    both = plan_auto(tmp_path, [V100, A100], [])
    assert both["mixed_precision"] == "mixed_float16"
    a100 = plan_auto(tmp_path, [V100, A100], [], "tensorflow", "--set", "devices.visible_gpus=[1]")
    assert a100["mixed_precision"] == "mixed_bfloat16"
    assert a100["mixed_precision_reason"].startswith("auto: mixed_bfloat16, NVIDIA A100-SXM4-40GB has compute "
                                                     "capability 8.0")
    cpu = plan_auto(tmp_path, [V100, A100], ["amx_bf16"], "tensorflow", "--set", "devices.visible_gpus=none")
    assert cpu["mixed_precision"] == "mixed_bfloat16" and "a CPU with amx_bf16" in cpu["mixed_precision_reason"]


def test_auto_on_jax_follows_the_same_rule(tmp_path):
    assert plan_auto(tmp_path, [T4], [], "jax")["mixed_precision"] == "mixed_float16"
    assert plan_auto(tmp_path, [A100], [], "jax")["mixed_precision"] == "mixed_bfloat16"
    cpu = plan_auto(tmp_path, (), ["avx512_bf16"], "jax")
    assert cpu["backend"] == "jax" and cpu["mixed_precision"] == "mixed_bfloat16"
    assert plan_auto(tmp_path, (), ["avx2"], "jax")["mixed_precision"] == "float32"


def test_plan_text_says_which_policy_and_why(tmp_path):
    saved = tmp_path / "t4.json"
    saved.write_text(json.dumps({"gpus": [gpu(0, *T4)], "cpu_flags": []}))
    auto = run_cli("plan", "recipes/mnist.yaml", "--machine", str(saved), "--set", "tensorflow.mixed_precision=auto")
    assert auto.returncode == 0, auto.stderr
    assert ("Precision: mixed_float16 (auto: mixed_float16, Tesla T4 has compute capability 7.5, 7.x: float16 tensor "
            "cores (bfloat16 needs >= 8.0); the loss is scaled (LossScaleOptimizer))") in auto.stdout
    assert "keras.mixed_precision.set_global_policy('mixed_float16')    # tensorflow.mixed_precision" in auto.stdout
    # The default stays float32, whatever the machine (see docs/config.md for why).
    default = run_cli("plan", "recipes/mnist.yaml", "--machine", str(saved))
    assert "Precision: float32 (tensorflow.mixed_precision: float32)" in default.stdout


def test_doctor_reports_the_policy_auto_picks():
    t4 = Probe(gpus=(GpuInfo(0, "Tesla T4", 15360, "GPU-0", 0, 0, "7.5"),), cpu_flags=("avx512_bf16",))
    cpu = Probe(cpu_flags=("avx2",))
    auto = load_config({"tensorflow": {"mixed_precision": "auto"}})
    seen = {name: [f.seen for f in check_config(Facts(machine=m), auto) if f.level == "ok"][0]
            for name, m in (("t4", t4), ("cpu", cpu))}
    assert "precision mixed_float16 (auto: mixed_float16, Tesla T4 has compute capability 7.5" in seen["t4"]
    assert "precision float32 (auto: float32 on a CPU without avx512_bf16 or amx_bf16" in seen["cpu"]


def test_a_policy_that_is_not_known_lists_auto(tmp_path):
    result = run_cli("plan", "recipes/mnist.yaml", "--set", "tensorflow.mixed_precision=bf16")
    assert result.returncode == 3
    one_paragraph(result.stderr)
    assert "tensorflow.mixed_precision" in result.stderr and "'auto'" in result.stderr and "bf16" in result.stderr


def test_the_probe_reads_this_cpus_flags():
    model, flags = read_cpu()
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        listed = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    assert flags is not None and set(flags) <= set(listed)
    assert ("avx512_bf16" in flags) == ("avx512_bf16" in listed)
    assert model


@pytest.mark.slow
@pytest.mark.skipif("avx512_bf16" not in (read_cpu()[1] or ()) and "amx_bf16" not in (read_cpu()[1] or ()),
                    reason="this CPU has no bfloat16 instructions, so auto is float32")
def test_auto_trains_in_bfloat16_on_a_cpu_with_bfloat16_instructions(tmp_path):
    """On a CPU with bfloat16 instructions, mixed_precision auto trains in mixed_bfloat16 and summary.json says why.
    Trains its own run: the precision under test (mixed_bfloat16) is one no shared run has."""
    result = run_cli("run", "recipes/mnist.yaml", *TWO_REPLICAS, "--set", "tensorflow.mixed_precision=auto",
                     "--set", "train.loop=custom", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["mixed_precision"] == "mixed_bfloat16"
    assert summary["mixed_precision_reason"].startswith("auto: mixed_bfloat16 on a CPU with ")
    assert "tfgpu: precision: mixed_bfloat16 (auto: mixed_bfloat16 on a CPU with" in result.stdout
    assert summary["epochs"][-1]["val_accuracy"] > 0.9  # float32 gets 0.96 with these settings
