"""Planning for faked machines of 0, 1, 2 and 4 GPUs: pure data, no TensorFlow."""

from __future__ import annotations

import pytest

from tfgpu.config import load_config
from tfgpu.devices.plan import make_plan
from tfgpu.devices.probe import GpuInfo, Probe, cuda_visible
from tfgpu.errors import ConfigError, DeviceError

from ..conftest import run_cli, run_python


def machine(n: int, total_mib: int = 16384, **kw) -> Probe:
    return Probe(gpus=tuple(GpuInfo(i, f"Fake GPU {i}", total_mib, f"GPU-{i:04d}", i) for i in range(n)), **kw)


def plan(n: int, total_mib: int = 16384, probe_kw=None, **sections):
    return make_plan(load_config({}, **sections), machine(n, total_mib, **(probe_kw or {})))


def calls(p, api_suffix: str):
    return [c for c in p.tf_calls if c.api.endswith(api_suffix)]


def test_cpu_only_machine_plans_one_cpu_replica():
    p = plan(0, train={"batch_size_per_replica": 64})
    assert p.gpus == () and p.logical_devices == ("/cpu:0",)
    assert p.strategy.kind == "one_device" and p.strategy.devices == ("/cpu:0",)
    assert p.num_replicas == 1 and p.global_batch_size == 64
    assert calls(p, "set_memory_growth") == []
    assert "CUDA_VISIBLE_DEVICES" not in p.env


@pytest.mark.parametrize("n", [1, 2, 4])
def test_growth_is_on_for_every_visible_gpu_by_default(n):
    p = plan(n, train={"batch_size_per_replica": 256})
    growth = calls(p, "set_memory_growth")
    assert [c.device for c in growth] == [f"GPU:{i}" for i in range(n)]
    assert all(c.value is True for c in growth)
    assert p.num_replicas == n and p.global_batch_size == 256 * n
    assert p.strategy.kind == ("mirrored" if n > 1 else "one_device")
    assert p.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_two_cpu_logical_devices_give_a_two_replica_mirrored_strategy():
    p = plan(0, devices={"cpu_logical_devices": 2}, train={"batch_size_per_replica": 128})
    split = calls(p, "set_logical_device_configuration")
    assert split[0].device == "CPU:0" and split[0].value == [None, None]
    assert p.strategy.kind == "mirrored" and p.strategy.devices == ("/cpu:0", "/cpu:1")
    assert p.strategy.cross_device_ops == "reduce_to_one_device"
    assert p.num_replicas == 2 and p.global_batch_size == 256


def test_fraction_becomes_mib_of_each_gpus_total():
    p = plan(2, total_mib=40960, devices={"memory_fraction": 0.25})
    limits = calls(p, "set_logical_device_configuration")
    assert [(c.device, c.value) for c in limits] == [("GPU:0", [10240]), ("GPU:1", [10240])]
    assert calls(p, "set_memory_growth") == []  # a limit turns the default growth off


def test_fraction_uses_each_gpus_own_total():
    probe = Probe(gpus=(GpuInfo(0, "big", 81920, "GPU-a", 0), GpuInfo(1, "small", 24576, "GPU-b", 1)))
    p = make_plan(load_config({"devices": {"memory_fraction": 0.5}}), probe)
    assert [c.value for c in calls(p, "set_logical_device_configuration")] == [[40960], [12288]]


def test_limit_split_into_logical_gpus():
    p = plan(2, devices={"memory_limit_mib": 8000, "gpu_logical_devices": 2})
    limits = calls(p, "set_logical_device_configuration")
    assert [c.value for c in limits] == [[4000, 4000], [4000, 4000]]
    assert p.logical_devices == ("/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3")
    assert p.num_replicas == 4
    # NCCL cannot all-reduce between logical GPUs that share a physical GPU
    assert p.strategy.cross_device_ops == "reduce_to_one_device"


def test_visible_subset_sets_cuda_visible_devices_and_renumbers():
    p = plan(4, devices={"visible_gpus": [1, 3]})
    assert p.env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert [g.index for g in p.gpus] == [0, 1] and [g.name for g in p.gpus] == ["Fake GPU 1", "Fake GPU 3"]
    assert [c.device for c in calls(p, "set_memory_growth")] == ["GPU:0", "GPU:1"]
    assert p.strategy.devices == ("/gpu:0", "/gpu:1") and p.strategy.cross_device_ops == "nccl"


def test_visible_subset_composes_with_an_existing_cuda_visible_devices():
    nvml = [GpuInfo(i, f"G{i}", 16384, f"GPU-{i}", i) for i in range(4)]
    probe = Probe(gpus=tuple(cuda_visible(nvml, "2,3")), env={"CUDA_VISIBLE_DEVICES": "2,3"})
    p = make_plan(load_config({"devices": {"visible_gpus": [1]}}), probe)
    assert p.env["CUDA_VISIBLE_DEVICES"] == "3"


def test_none_hides_every_gpu():
    p = plan(2, devices={"visible_gpus": "none"})
    assert p.env["CUDA_VISIBLE_DEVICES"] == "-1"
    assert p.gpus == () and p.strategy.devices == ("/cpu:0",)


def test_gpu_index_beyond_the_count_is_a_device_error():
    with pytest.raises(DeviceError) as info:
        plan(2, devices={"visible_gpus": [3]})
    assert info.value.exit_code == 4
    assert "GPU index 3" in info.value.message and "can see 2 GPUs (indices 0-1)" in info.value.message


def test_limit_above_total_is_a_device_error():
    with pytest.raises(DeviceError, match="20000 MiB is more than GPU 0 .* 16384 MiB"):
        plan(1, devices={"memory_limit_mib": 20000})


def test_fraction_without_known_total_is_a_device_error():
    probe = Probe(gpus=(GpuInfo(0, "unknown"),))
    with pytest.raises(DeviceError, match="NVML could not report"):
        make_plan(load_config({"devices": {"memory_fraction": 0.5}}), probe)


def test_strategy_device_that_will_not_exist_is_a_device_error():
    with pytest.raises(DeviceError, match=r"/gpu:2 was requested"):
        plan(2, distribute={"strategy": "mirrored", "devices": ["/gpu:0", "/gpu:2"]})


def test_nccl_falls_back_on_cpu_with_a_warning():
    p = plan(0, devices={"cpu_logical_devices": 2}, distribute={"cross_device_ops": "nccl"})
    assert p.strategy.cross_device_ops == "reduce_to_one_device"
    assert any("nccl cannot work here (the replicas are not all GPUs)" in w for w in p.warnings)


def test_nccl_is_not_used_off_linux():
    p = plan(2, probe_kw={"platform": "win32"})
    assert p.strategy.cross_device_ops == "hierarchical_copy"


def test_explicit_cross_device_ops_is_kept_on_gpus():
    p = plan(4, distribute={"cross_device_ops": "hierarchical_copy"})
    assert p.strategy.cross_device_ops == "hierarchical_copy"


def test_one_device_and_default_strategies():
    p = plan(2, distribute={"strategy": "one_device", "devices": ["/gpu:1"]})
    assert p.strategy.devices == ("/gpu:1",) and p.num_replicas == 1
    p = plan(2, distribute={"strategy": "default"})
    assert p.strategy.kind == "default" and p.num_replicas == 1
    with pytest.raises(DeviceError, match="exactly one device"):
        plan(2, distribute={"strategy": "one_device", "devices": ["/gpu:0", "/gpu:1"]})


@pytest.mark.parametrize("rule, factor", [("none", 1.0), ("linear", 4.0), ("sqrt", 2.0)])
def test_learning_rate_scaling(rule, factor):
    assert plan(4, train={"lr_scaling": rule}).lr_scale == factor


def test_log_level_from_environment_is_kept_unless_configured():
    kept = plan(0, probe_kw={"env": {"TF_CPP_MIN_LOG_LEVEL": "0"}})
    assert "TF_CPP_MIN_LOG_LEVEL" not in kept.env
    forced = plan(0, probe_kw={"env": {"TF_CPP_MIN_LOG_LEVEL": "0"}}, tensorflow={"log_level": 3})
    assert forced.env["TF_CPP_MIN_LOG_LEVEL"] == "3"


def test_calls_are_in_application_order():
    p = plan(1, devices={"memory_limit_mib": 4096, "cpu_logical_devices": 2},
             tensorflow={"intra_op_threads": 2, "seed": 1, "deterministic_ops": True,
                         "mixed_precision": "mixed_float16", "gpu_allocator": "cuda_malloc_async"})
    assert [c.api.rsplit(".", 1)[1] for c in p.tf_calls] == [
        "set_intra_op_parallelism_threads", "set_logical_device_configuration",
        "set_logical_device_configuration", "set_soft_device_placement", "set_log_device_placement",
        "enable_op_determinism", "set_random_seed", "set_global_policy"]
    assert list(p.env) == ["TF_CPP_MIN_LOG_LEVEL", "KERAS_BACKEND", "CUDA_DEVICE_ORDER", "TF_GPU_ALLOCATOR"]
    assert str(p.tf_calls[1]) == (
        "tf.config.set_logical_device_configuration(<GPU:0>, [LogicalDeviceConfiguration(memory_limit=4096)])")


def test_note_when_memory_settings_meet_no_gpu():
    p = plan(0, devices={"memory_growth": True})
    assert any("no GPU is visible" in n and "devices.memory_growth" in n for n in p.notes)
    assert not any("no GPU is visible" in w for w in p.warnings)  # a recipe for GPUs on a CPU: as meant
    assert "Note: no GPU is visible" in p.describe() and "Warning: no GPU" not in p.describe()


def test_cuda_visible_rules():
    nvml = [GpuInfo(i, f"G{i}", 1, f"GPU-{i}aa", i) for i in range(3)]
    assert [g.nvml_index for g in cuda_visible(nvml, None)] == [0, 1, 2]
    assert [g.nvml_index for g in cuda_visible(nvml, "2,0")] == [2, 0]
    assert [g.index for g in cuda_visible(nvml, "2,0")] == [0, 1]
    assert cuda_visible(nvml, "-1") == [] and cuda_visible(nvml, "") == []
    assert [g.nvml_index for g in cuda_visible(nvml, "1,7,2")] == [1]  # CUDA stops at an invalid entry
    assert [g.nvml_index for g in cuda_visible(nvml, "GPU-2")] == [2]  # UUID prefix


def test_planning_imports_no_tensorflow():
    """Nor Keras, nor NumPy: `tfgpu plan recipes/mnist.yaml` (the checks and the plan) imports none of them."""
    result = run_python("""
        import sys, tfgpu, tfgpu.cli, tfgpu.devices.plan, tfgpu.devices.probe, tfgpu.data, tfgpu.model.keras_model, tfgpu.training.runner
        from tfgpu.config import load_config
        from tfgpu.devices.plan import make_plan
        from tfgpu.devices.probe import probe
        make_plan(load_config('recipes/mnist.yaml'), probe())
        from click.testing import CliRunner
        assert CliRunner().invoke(tfgpu.cli.main, ['plan', 'recipes/mnist.yaml']).exit_code == 0  # its checks too
        heavy = [m for m in ('tensorflow', 'keras', 'numpy') if m in sys.modules]
        print('imported:', heavy)
    """)
    assert result.returncode == 0, result.stderr
    assert "imported: []" in result.stdout


def test_real_probe_on_this_machine_reports_why_no_gpu():
    # The real NVML path: on a machine without a driver it lists no GPU and says why.
    from tfgpu.devices.probe import probe

    found = probe()
    if found.gpus:
        pytest.skip("this machine has GPUs: the no-driver path cannot be observed here")
    assert found.nvml_error and ("NVML" in found.nvml_error or "nvidia-ml-py" in found.nvml_error)


def test_growth_and_a_limit_together_apply_the_limit_and_warn():
    p = plan(1, devices={"memory_growth": True, "memory_limit_mib": 4096})
    assert [(c.device, c.value) for c in calls(p, "set_logical_device_configuration")] == [("GPU:0", [4096])]
    assert calls(p, "set_memory_growth") == []
    assert any("devices.memory_growth: true and devices.memory_limit_mib are both set" in w for w in p.warnings)


def test_a_fraction_that_leaves_too_little_warns():
    p = plan(1, total_mib=8192, devices={"memory_fraction": 0.1})
    assert [c.value for c in calls(p, "set_logical_device_configuration")] == [[819]]
    assert any("gets 819 MiB" in w and "out-of-memory" in w for w in p.warnings)
    assert not plan(1, total_mib=8192, devices={"memory_fraction": 0.5}).warnings


def test_a_limit_above_the_free_memory_warns():
    busy = Probe(gpus=(GpuInfo(0, "Busy GPU", 16384, "GPU-0", 0, used_mib=12000),))
    p = make_plan(load_config({}, devices={"memory_limit_mib": 8192}), busy)
    assert any("asked for 8192 MiB but only 4384 MiB were free" in w for w in p.warnings)


def test_a_strategy_device_named_by_its_physical_index_explains_the_renumbering():
    with pytest.raises(DeviceError) as err:
        plan(4, devices={"visible_gpus": [2, 3]}, distribute={"devices": ["/gpu:3"]})
    assert "TensorFlow numbers the visible GPUs from 0: with devices.visible_gpus [2, 3], GPU 2 is /gpu:0, " \
           "GPU 3 is /gpu:1." in err.value.message


def test_overriding_a_loaded_config_keeps_what_was_set_explicitly():
    # setup(cfg, devices=...) re-validates a loaded Config; which keys the user set must survive.
    placement = load_config({"devices": {"log_device_placement": True}})
    again = load_config(placement, devices={"soft_placement": False})
    p = make_plan(again, Probe(env={"TF_CPP_MIN_LOG_LEVEL": "1"}))
    assert p.env["TF_CPP_MIN_LOG_LEVEL"] == "0" and not p.warnings
    assert again.devices.soft_placement is False and again.devices.log_device_placement is True
    kept = make_plan(load_config(load_config({"train": {"epochs": 2}}), train={"epochs": 3}),
                     Probe(env={"TF_CPP_MIN_LOG_LEVEL": "1"}))
    assert "TF_CPP_MIN_LOG_LEVEL" not in kept.env  # the user's own value is left alone


def test_xla_auto_is_off_on_cpus_and_says_why():
    p = plan(0)
    assert p.jit_compile is False
    assert "off on CPUs" in p.jit_compile_reason and "slower" in p.jit_compile_reason
    assert "XLA: off (auto: off on CPUs" in p.describe()


@pytest.mark.parametrize("n, loop, strategy, expected", [
    (1, "fit", "auto", ("one_device", False)),       # tfgpu's one GPU is a OneDeviceStrategy: Keras says off
    (1, "custom", "auto", ("one_device", False)),
    (2, "fit", "auto", ("mirrored", False)),
    (2, "custom", "auto", ("mirrored", False)),
    (1, "fit", "default", ("default", True)),        # no tf.distribute strategy: Keras says on
])
def test_xla_auto_on_gpus_is_keras_rule_off_under_any_tf_distribute_strategy(n, loop, strategy, expected):
    p = plan(n, train={"loop": loop}, distribute={"strategy": strategy})
    assert (p.strategy.kind, p.jit_compile) == expected
    if p.jit_compile:
        assert "without a tf.distribute strategy" in p.jit_compile_reason
    else:
        assert "off on GPUs under tf.distribute." in p.jit_compile_reason
        assert "off under any tf.distribute strategy" in p.jit_compile_reason
    assert "not measured" in p.jit_compile_reason


KERAS_AUTO_JIT = """
import contextlib, json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
import keras

def auto_jit(strategy=None):
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse", jit_compile="auto")
    return model.jit_compile

found = {"cpu_only": auto_jit(tf.distribute.OneDeviceStrategy("/cpu:0"))}
# Keras's rule turns XLA off on CPU-only machines first; to read its strategy rule, let it see a GPU.
real = tf.config.list_physical_devices
tf.config.list_physical_devices = lambda kind=None: real(kind) + (
    [tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")] if kind in (None, "GPU") else [])
found["one_device"] = auto_jit(tf.distribute.OneDeviceStrategy("/cpu:0"))
found["mirrored"] = auto_jit(tf.distribute.MirroredStrategy(["/cpu:0"]))
found["default"] = auto_jit()
tf.config.experimental.enable_op_determinism()
found["default_deterministic"] = auto_jit()
print("FOUND", json.dumps(found))
"""


@pytest.mark.slow
def test_xla_auto_reason_agrees_with_what_the_installed_keras_does():
    """Keras's own compile(jit_compile="auto"), run, against tfgpu's plan and its recorded reason."""
    import json  # noqa: PLC0415

    from tfgpu.devices.plan import resolve_jit  # noqa: PLC0415

    result = run_python(KERAS_AUTO_JIT)
    assert result.returncode == 0, result.stderr[-3000:]
    keras = json.loads(result.stdout.split("FOUND", 1)[1])
    assert keras == {"cpu_only": False, "one_device": False, "mirrored": False, "default": True,
                     "default_deterministic": False}
    assert resolve_jit("auto", False, "one_device")[0] is keras["cpu_only"]
    for kind in ("one_device", "mirrored", "default"):
        use, reason = resolve_jit("auto", True, kind)
        assert use is keras[kind], (kind, reason)
        assert ("auto: on" if use else "auto: off") in reason
    assert resolve_jit("auto", True, "default", deterministic=True)[0] is keras["default_deterministic"]


@pytest.mark.parametrize("setting", [True, False])
def test_explicit_xla_setting_is_kept_and_named(setting):
    p = plan(0, tensorflow={"jit_compile": setting})
    assert p.jit_compile is setting
    assert p.jit_compile_reason == f"tensorflow.jit_compile: {str(setting).lower()}"


def test_xla_with_fit_on_several_replicas_is_refused_before_training():
    # Keras would compile strategy.run itself with XLA; TensorFlow fails in the first step.
    with pytest.raises(ConfigError) as err:
        plan(2, tensorflow={"jit_compile": True})
    assert "tensorflow.jit_compile: true" in err.value.message and "2 replicas" in err.value.message
    assert "train.loop: custom" in err.value.hint
    assert plan(2, tensorflow={"jit_compile": True}, train={"loop": "custom"}).jit_compile is True


def test_cli_plan_refuses_xla_with_fit_on_two_cpu_replicas():
    result = run_cli("plan", "recipes/mnist.yaml", "--set", "devices.cpu_logical_devices=2",
                     "--set", "tensorflow.jit_compile=true")
    assert result.returncode == 3
    assert "Traceback" not in result.stderr and "MirroredStrategy does not support" in result.stderr
