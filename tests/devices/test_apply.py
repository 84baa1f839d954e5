"""Applying plans to a real TensorFlow, each in a fresh process."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pytest

from ..conftest import run_python


def _onednn_on_by_default() -> bool:
    """TensorFlow turns oneDNN on by default on Linux x86 CPUs with AVX512-VNNI, AVX512-BF16 or AMX."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return (sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
            and any(f in flags for f in ("avx512_vnni", "avx512_bf16", "amx_tile")))


def ok(result):
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    return result


@pytest.mark.slow
def test_two_logical_cpus_give_a_mirrored_strategy_with_two_replicas():
    result = ok(run_python("""
        import json, tfgpu
        info = tfgpu.setup({"devices": {"cpu_logical_devices": 2}, "train": {"batch_size_per_replica": 64}})
        import tensorflow as tf
        s = info.strategy
        ids = s.run(lambda: tf.distribute.get_replica_context().replica_id_in_sync_group)
        print(json.dumps({
            "type": type(s).__name__, "replicas": s.num_replicas_in_sync, "info_replicas": info.num_replicas,
            "global": info.global_batch_size, "logical": list(info.logical_devices),
            "devices": list(s.extended.worker_devices),
            "ids": sorted(int(v) for v in s.experimental_local_results(ids)),
        }))
    """))
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["type"] == "MirroredStrategy"
    assert out["replicas"] == out["info_replicas"] == 2
    assert out["global"] == 128
    assert out["logical"] == ["/device:CPU:0", "/device:CPU:1"]
    assert [d.rsplit("/", 1)[1] for d in out["devices"]] == ["device:CPU:0", "device:CPU:1"]
    assert out["ids"] == [0, 1]


@pytest.mark.slow
def test_placement_logging_prints_the_textbook_matmul_line():
    result = ok(run_python("""
        import tfgpu
        tfgpu.setup({"devices": {"log_device_placement": True}, "tensorflow": {"onednn_opts": False}})
        import tensorflow as tf
        a = tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        b = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        print("RESULT", tf.matmul(a, b).numpy().tolist())
    """))
    assert "RESULT [[22.0, 28.0], [49.0, 64.0]]" in result.stdout
    assert "Executing op MatMul in device /job:localhost/replica:0/task:0/device:CPU:0" in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(not _onednn_on_by_default(), reason="TensorFlow leaves oneDNN off by default on this CPU")
def test_placement_logging_names_the_onednn_kernel_where_onednn_is_on_by_default():
    """What the README's note says: with oneDNN left at TensorFlow's default on such a CPU, the textbook matmul
    logs _MklMatMul, not MatMul."""
    result = ok(run_python("""
        import tfgpu
        tfgpu.setup({"devices": {"log_device_placement": True}})
        import tensorflow as tf
        a = tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        b = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        print("RESULT", tf.matmul(a, b).numpy().tolist())
    """))
    assert "RESULT [[22.0, 28.0], [49.0, 64.0]]" in result.stdout
    assert "Executing op _MklMatMul in device /job:localhost/replica:0/task:0/device:CPU:0" in result.stderr
    assert "Executing op MatMul in device" not in result.stderr


@pytest.mark.slow
def test_soft_placement_runs_a_gpu2_request_on_cpu_and_hard_placement_refuses():
    code = """
        import tfgpu
        tfgpu.setup({{"devices": {{"soft_placement": {soft}}}}})
        import tensorflow as tf
        a = tf.constant([[1.0, 2.0, 3.0]])
        try:
            with tf.device("/device:GPU:2"):
                print("DEVICE", tf.matmul(a, tf.transpose(a)).device)
        except tf.errors.InvalidArgumentError as exc:
            print("REFUSED", str(exc).splitlines()[0])
    """
    soft = ok(run_python(code.format(soft=True)))
    assert "DEVICE /job:localhost/replica:0/task:0/device:CPU:0" in soft.stdout
    hard = ok(run_python(code.format(soft=False)))
    assert "REFUSED Could not satisfy device specification" in hard.stdout


@pytest.mark.slow
def test_setup_after_tensorflow_initialised_names_each_setting():
    result = run_python("""
        import tensorflow as tf
        tf.config.list_logical_devices()          # initialises the devices
        import tfgpu
        try:
            tfgpu.setup({"devices": {"cpu_logical_devices": 2}, "tensorflow": {"intra_op_threads": 1}})
        except tfgpu.AlreadyInitializedError as exc:
            print("CODE", exc.exit_code)
            print(exc)
        except RuntimeError as exc:
            print("BARE RuntimeError", exc)
    """)
    assert "BARE" not in result.stdout
    assert "CODE 6" in result.stdout
    assert "devices.cpu_logical_devices: tf.config.set_logical_device_configuration(<CPU:0>" in result.stdout
    assert "tensorflow.intra_op_threads" in result.stdout
    assert "call tfgpu.setup() before any other TensorFlow code" in result.stdout


@pytest.mark.slow
def test_setup_after_initialisation_with_settings_already_in_force_is_fine():
    result = ok(run_python("""
        import tensorflow as tf
        tf.config.list_logical_devices()
        import tfgpu
        info = tfgpu.setup({"devices": {"soft_placement": True}})
        print("REPLICAS", info.num_replicas)
    """))
    assert "REPLICAS 1" in result.stdout


@pytest.mark.slow
def test_second_setup_with_the_same_settings_is_a_no_op_and_different_ones_fail():
    result = run_python("""
        import tfgpu
        first = tfgpu.setup({"devices": {"cpu_logical_devices": 2}})
        again = tfgpu.setup({"devices": {"cpu_logical_devices": 2}})
        print("SAME", again is first)
        try:
            tfgpu.setup({"devices": {"cpu_logical_devices": 3}})
        except tfgpu.AlreadyInitializedError as exc:
            print("CONFLICT", "devices.cpu_logical_devices" in str(exc))
    """)
    assert "SAME True" in result.stdout and "CONFLICT True" in result.stdout, result.stderr[-3000:]


@pytest.mark.slow
def test_environment_and_seed_are_applied_before_tensorflow():
    code = """
        import os, sys, tfgpu
        assert "tensorflow" not in sys.modules
        info = tfgpu.setup({"devices": {"visible_gpus": "none"}, "tensorflow": {"seed": 7, "log_level": 3}})
        import tensorflow as tf
        print("ENV", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["TF_CPP_MIN_LOG_LEVEL"])
        print("GPUS", tfgpu.num_gpus(), len(tfgpu.try_all_gpus()))
        with tfgpu.try_gpu(0):
            x = tf.random.uniform((3,))
        print("DRAW", x.device.endswith("CPU:0"), [round(float(v), 6) for v in x])
    """
    first = ok(run_python(code))
    second = ok(run_python(code))
    assert "ENV -1 3" in first.stdout and "GPUS 0 1" in first.stdout
    draw = [line for line in first.stdout.splitlines() if line.startswith("DRAW")]
    assert draw and draw[0].startswith("DRAW True")
    assert draw == [line for line in second.stdout.splitlines() if line.startswith("DRAW")]
    assert "cuInit" not in first.stderr  # log level 3 hides TensorFlow's errors about the missing driver


@pytest.mark.slow
def test_gpus_listed_by_nvml_but_not_by_tensorflow_fall_back_to_the_cpu():
    # The probe (the one faked seam) reports two GPUs; the real TensorFlow here has none.
    code = """
        import json
        from tfgpu.devices.apply import apply_config
        from tfgpu.config import load_config
        from tfgpu.errors import DeviceError
        from tfgpu.devices.probe import GpuInfo, Probe
        fake = Probe(gpus=(GpuInfo(0, "Fake A100", 40960, "GPU-0", 0), GpuInfo(1, "Fake A100", 40960, "GPU-1", 1)))
        try:
            plan, applied = apply_config(load_config({"devices": {"cpu_logical_devices": 2, "visible_gpus": VISIBLE}}), fake)
        except DeviceError as exc:
            print(json.dumps({"error": exc.message}))
        else:
            print(json.dumps({"gpus": len(plan.gpus), "strategy": list(plan.strategy.devices),
                              "warnings": list(plan.warnings), "imported_before": applied.tf_was_imported,
                              "logical": list(applied.logical_devices)}))
    """
    result = ok(run_python(code.replace("VISIBLE", '"all"')))
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["gpus"] == 0 and out["strategy"] == ["/cpu:0", "/cpu:1"]
    assert out["logical"] == ["/device:CPU:0", "/device:CPU:1"]
    assert any("NVML lists 2 GPU(s) but TensorFlow sees none" in w for w in out["warnings"])
    assert out["imported_before"] is False
    # An explicit GPU request cannot silently become the CPU.
    out = json.loads(ok(run_python(code.replace("VISIBLE", "[1]"))).stdout.strip().splitlines()[-1])
    assert "NVML lists 2 GPU(s) but TensorFlow sees none" in out["error"] and "GPU index 1" in out["error"]
