"""Planning for ``backend: jax`` on faked machines of 0, 1, 2 and 4 GPUs: pure data, no TensorFlow, no JAX.

Machines are faked only at the probe seam: :class:`~tfgpu.devices.probe.Probe` and
:class:`~tfgpu.devices.probe.GpuInfo` built by hand, or :class:`tests.devices.test_mig.FakeNvml`
read by the real :func:`tfgpu.devices.probe.probe`. The plan's environment is what JAX
and Keras read (``docs/jax.md`` maps every key); the config refuses the
settings that have no JAX counterpart (:data:`tfgpu.config.schema._JAX_REFUSED`).
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from tfgpu.config import load_config
from tfgpu.config.schema import _JAX_REFUSED
from tfgpu.devices.plan import make_plan
from tfgpu.devices.probe import GpuInfo, Probe, probe
from tfgpu.errors import ConfigError, DeviceError

from ..conftest import ROOT, child_env, run_python
from .test_mig import FakeNvml, MIG2, MIG_HOST

A100 = "NVIDIA A100-SXM4-40GB"
NEW = "XLA_CLIENT_MEM_FRACTION"          # jaxlib 0.10.2 (and other recent releases) reads this name
OLD = "XLA_PYTHON_CLIENT_MEM_FRACTION"   # older jaxlib, and the deprecated name recent ones still read
COUNT = "--xla_force_host_platform_device_count"
DETERMINISM = "--xla_gpu_deterministic_ops"
#: Every variable a JAX plan may set; the probe records the ones already set.
JAX_VARS = ("XLA_FLAGS", "JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE", NEW, OLD, "XLA_PYTHON_CLIENT_ALLOCATOR")


def machine(n: int, total_mib: int | None = 40960, fraction_env: str | None = NEW, env: dict | None = None,
            name: str = A100) -> Probe:
    """A probe of ``n`` alike GPUs (NVML indices 0..n-1) whose jaxlib reads ``fraction_env``."""
    gpus = tuple(GpuInfo(i, name, total_mib, f"GPU-{i:04d}", i, 0, "8.0") for i in range(n))
    return Probe(gpus=gpus, nvml_gpus=gpus, env=dict(env or {}), jax_memory_fraction_env=fraction_env)


def jax_config(**sections):
    return load_config({"backend": "jax", **sections})


def jax_plan(n: int = 0, probe_: Probe | None = None, **sections):
    return make_plan(jax_config(**sections), probe_ if probe_ is not None else machine(n))


def call(p, api: str):
    """The plan's one call of ``api``, or None."""
    found = [c for c in p.tf_calls if c.api == api]
    assert len(found) <= 1, found
    return found[0] if found else None


def flags(p, probe_: Probe | None = None) -> list[str]:
    """The XLA_FLAGS JAX will read: the plan's, else the environment's as it was."""
    value = p.env.get("XLA_FLAGS", (probe_.env if probe_ else {}).get("XLA_FLAGS", ""))
    return value.split()


# ------------------------------------------------------------------ every plan


@pytest.mark.parametrize("n", [0, 1, 2, 4])
def test_every_jax_plan_sets_keras_backend_and_keeps_tensorflow_off_the_gpus(n):
    p = jax_plan(n)
    assert p.backend == "jax"
    assert p.env["KERAS_BACKEND"] == "jax" and p.env_settings["KERAS_BACKEND"] == "backend"
    # TensorFlow, where installed for tf.data, must not take the GPUs' memory from JAX.
    assert p.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert not {"TF_GPU_ALLOCATOR", "TF_ENABLE_ONEDNN_OPTS"} & set(p.env)
    assert all(c.api.startswith("keras.") for c in p.tf_calls), [c.api for c in p.tf_calls]
    assert set(p.env_settings) == set(p.env), "every variable names the config key it comes from"
    assert call(p, "keras.mixed_precision.set_global_policy").value == "float32"
    assert p.jit_compile is True and "jax.jit" in p.jit_compile_reason


def test_no_gpu_plans_one_cpu_device_and_no_gpu_memory_variables():
    p = jax_plan(0, train={"batch_size_per_replica": 64})
    assert p.gpus == () and p.logical_devices == ("cpu:0",)
    assert p.strategy.kind == "single_device" and p.strategy.devices == ("cpu:0",)
    assert p.num_replicas == 1 and p.global_batch_size == 64
    assert call(p, "keras.distribution.set_distribution") is None
    assert not {"CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_PREALLOCATE", NEW, OLD, "XLA_FLAGS"} & set(p.env)
    assert p.warnings == ()


def test_one_gpu_is_a_single_device_with_memory_growth_and_no_distribution():
    p = jax_plan(1, train={"batch_size_per_replica": 256})
    assert p.env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert p.env_settings["XLA_PYTHON_CLIENT_PREALLOCATE"] == "devices.memory_growth"
    assert p.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "CUDA_VISIBLE_DEVICES" not in p.env
    assert p.strategy.kind == "single_device" and p.strategy.devices == ("gpu:0",)
    assert p.logical_devices == ("gpu:0",) and [g.label() for g in p.gpus] == [f"{A100} (40960 MiB)"]
    assert p.num_replicas == 1 and p.global_batch_size == 256
    assert call(p, "keras.distribution.set_distribution") is None
    assert "Single device: gpu:0 (no keras.distribution)" in p.describe()


@pytest.mark.parametrize("n", [2, 4])
def test_several_gpus_train_data_parallel_over_all_of_them(n):
    p = jax_plan(n, train={"batch_size_per_replica": 256, "lr_scaling": "linear"})
    devices = [f"gpu:{i}" for i in range(n)]
    assert p.strategy.kind == "data_parallel" and list(p.strategy.devices) == devices
    assert p.logical_devices == tuple(devices)
    assert p.num_replicas == n and p.global_batch_size == 256 * n and p.lr_scale == float(n)
    dist = call(p, "keras.distribution.set_distribution")
    assert dist.value == devices and dist.setting == "distribute.strategy"
    assert p.tf_calls[-1] is dist, "the distribution is set after the seed and dtype policy"
    assert p.env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert not [w for w in p.warnings if "unequal" in w]


def test_four_gpus_describe_shows_each_variable_with_its_key_and_the_data_parallel_line():
    p = jax_plan(4, devices={"memory_fraction": 0.3}, train={"batch_size_per_replica": 64})
    text = p.describe()
    assert text.splitlines()[0] == "Backend: jax (KERAS_BACKEND=jax)"
    for line in ("  KERAS_BACKEND=jax    # backend",
                 "  TF_FORCE_GPU_ALLOW_GROWTH=true    # backend",
                 "  XLA_CLIENT_MEM_FRACTION=0.3    # devices.memory_fraction",
                 "Environment (set before Keras and JAX are imported):",
                 "Keras calls (in order, before the model is built):",
                 "keras.distribution.set_distribution(keras.distribution.DataParallel(devices=['gpu:0', 'gpu:1', "
                 "'gpu:2', 'gpu:3']))    # distribute.strategy",
                 "JAX devices: gpu:0, gpu:1, gpu:2, gpu:3",
                 "Data parallel: keras.distribution.DataParallel over gpu:0, gpu:1, gpu:2, gpu:3",
                 "Replicas: 4; batch: 64 per replica x 4 = 256 global"):
        assert line in text, f"{line!r} not in:\n{text}"
    assert "tf.config" not in text and "TensorFlow calls" not in text


def test_plan_to_dict_carries_backend_and_the_key_of_each_variable():
    data = jax_plan(2, devices={"memory_fraction": 0.5}).to_dict()
    assert data["backend"] == "jax"
    assert data["env_settings"][NEW] == "devices.memory_fraction" and data["env"][NEW] == "0.5"
    assert "keras.distribution.set_distribution(keras.distribution.DataParallel(devices=['gpu:0', 'gpu:1']))" \
        in data["tf_calls_text"]


def test_planning_imports_neither_tensorflow_nor_jax():
    result = run_python("""
        import sys
        from tfgpu.config import load_config
        from tfgpu.devices.plan import make_plan
        from tfgpu.devices.probe import GpuInfo, Probe
        p = make_plan(load_config({"backend": "jax", "devices": {"memory_fraction": 0.3}}),
                      Probe(gpus=(GpuInfo(0, "A100", 40960),), jax_memory_fraction_env="XLA_CLIENT_MEM_FRACTION"))
        assert p.env["XLA_CLIENT_MEM_FRACTION"] == "0.3", p.env
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "jax", "jaxlib", "keras")))
    """, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


# ------------------------------------------------------------------ memory


@pytest.mark.parametrize("growth, preallocate", [(None, "false"), (True, "false"), (False, "true")])
def test_memory_growth_becomes_preallocate(growth, preallocate):
    devices = {} if growth is None else {"memory_growth": growth}
    p = jax_plan(2, devices=devices)
    assert p.env["XLA_PYTHON_CLIENT_PREALLOCATE"] == preallocate
    assert not {NEW, OLD} & set(p.env)


@pytest.mark.parametrize("fraction_env, name", [(NEW, NEW), (OLD, OLD), (None, OLD)])
def test_memory_fraction_becomes_the_variable_the_installed_jaxlib_reads(fraction_env, name):
    p = make_plan(jax_config(devices={"memory_fraction": 0.3}), machine(4, fraction_env=fraction_env))
    assert p.env[name] == "0.3" and p.env_settings[name] == "devices.memory_fraction"
    other = OLD if name == NEW else NEW
    assert other not in p.env, "jaxlib refuses both names at once"
    # A cap is applied instead of memory growth: JAX preallocates the fraction (its default).
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in p.env
    assert p.warnings == ()


def test_memory_limit_becomes_the_fraction_of_the_gpus_total():
    p = jax_plan(4, devices={"memory_limit_mib": 12288})   # 12288 / 40960 = 0.3
    assert p.env[NEW] == "0.3" and p.env_settings[NEW] == "devices.memory_limit_mib"
    assert p.warnings == ()


def test_memory_limit_fraction_is_rounded_down_so_no_gpu_gets_more_than_asked():
    p = jax_plan(1, devices={"memory_limit_mib": 10000})   # 10000 / 40960 = 0.2441...
    assert p.env[NEW] == "0.244"
    assert float(p.env[NEW]) * 40960 <= 10000


def test_a_mig_instance_is_capped_from_its_own_memory(monkeypatch):
    for var in JAX_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG2)
    machine_ = probe(nvml=FakeNvml(MIG_HOST))
    p = make_plan(jax_config(devices={"memory_limit_mib": 9984}), machine_)   # of the instance's 19968 MiB
    name = machine_.jax_memory_fraction_env or OLD
    assert p.env[name] == "0.5"
    assert p.strategy.devices == ("gpu:0",)


def test_unequal_per_gpu_fractions_apply_the_smallest_to_every_gpu_with_a_warning():
    p = jax_plan(2, devices={"memory_fraction": [0.5, 0.3]})
    assert p.env[NEW] == "0.3"
    [warning] = [w for w in p.warnings if "one memory fraction" in w]
    assert "devices.memory_fraction" in warning and "GPU:0 0.500, GPU:1 0.300" in warning
    assert "smallest" in warning


def test_per_gpu_limits_that_are_the_same_share_of_each_gpu_need_no_warning():
    gpus = (GpuInfo(0, "NVIDIA H100 80GB HBM3", 81920, "GPU-a", 0), GpuInfo(1, "NVIDIA A10", 24576, "GPU-b", 1))
    p = make_plan(jax_config(devices={"memory_limit_mib": [40960, 12288]}),
                  Probe(gpus=gpus, jax_memory_fraction_env=NEW))
    assert p.env[NEW] == "0.5"
    assert not [w for w in p.warnings if "memory fraction" in w]
    assert [w for w in p.warnings if "unequal GPUs" in w], "the replicas still run on unlike GPUs"


def test_per_gpu_list_of_the_wrong_length_is_a_device_error():
    with pytest.raises(DeviceError, match="2 per-GPU values were given .* but 4 GPU"):
        jax_plan(4, devices={"memory_fraction": [0.5, 0.3]})


def test_limit_above_a_gpus_total_is_a_device_error():
    with pytest.raises(DeviceError) as info:
        jax_plan(2, devices={"memory_limit_mib": 50000})
    assert info.value.exit_code == 4
    assert "devices.memory_limit_mib: 50000 MiB is more than GPU 0" in info.value.message
    assert "40960 MiB" in info.value.message


def test_cap_without_a_known_total_is_a_device_error():
    with pytest.raises(DeviceError, match="NVML could not report"):
        make_plan(jax_config(devices={"memory_fraction": 0.5}), machine(1, total_mib=None))


def test_memory_growth_and_a_cap_together_apply_the_cap_with_a_warning():
    p = jax_plan(1, devices={"memory_growth": True, "memory_fraction": 0.25})
    assert p.env[NEW] == "0.25" and "XLA_PYTHON_CLIENT_PREALLOCATE" not in p.env
    assert [w for w in p.warnings if w.startswith("devices.memory_growth: true and devices.memory_fraction")]


def test_memory_keys_on_a_cpu_only_machine_note_that_they_do_nothing():
    p = jax_plan(0, devices={"memory_fraction": 0.5})
    assert not {NEW, OLD, "XLA_PYTHON_CLIENT_PREALLOCATE"} & set(p.env)
    assert [n for n in p.notes if "no GPU is visible" in n and "devices.memory_fraction" in n]
    assert not [w for w in p.warnings if "no GPU is visible" in w]  # as meant on a CPU: a note, not a warning


def test_an_existing_deprecated_fraction_is_emptied_with_a_warning_when_jaxlib_reads_the_new_name():
    env = {OLD: "0.9"}
    p = make_plan(jax_config(devices={"memory_fraction": 0.3}), machine(2, env=env))
    assert p.env[NEW] == "0.3"
    assert p.env[OLD] == "", "jaxlib refuses both names; an empty value counts as unset"
    [warning] = [w for w in p.warnings if OLD in w]
    assert f"{OLD}=0.9 was set" in warning and NEW in warning
    assert f"  {OLD}=    # devices.memory_fraction" in p.describe()


def test_an_existing_fraction_of_the_same_name_is_replaced_without_a_warning():
    p = make_plan(jax_config(devices={"memory_fraction": 0.3}), machine(1, env={NEW: "0.9"}))
    assert p.env[NEW] == "0.3" and OLD not in p.env and p.warnings == ()


# ------------------------------------------------------------------ which GPUs


def test_visible_subset_sets_cuda_visible_devices_and_renumbers_for_jax():
    p = jax_plan(4, devices={"visible_gpus": [1, 3]})
    assert p.env["CUDA_VISIBLE_DEVICES"] == "1,3" and p.env_settings["CUDA_VISIBLE_DEVICES"] == "devices.visible_gpus"
    assert [g.index for g in p.gpus] == [0, 1] and [g.uuid for g in p.gpus] == ["GPU-0001", "GPU-0003"]
    assert p.strategy.kind == "data_parallel" and p.strategy.devices == ("gpu:0", "gpu:1")
    assert call(p, "keras.distribution.set_distribution").value == ["gpu:0", "gpu:1"]
    assert "Data parallel: keras.distribution.DataParallel over gpu:0, gpu:1" in p.describe()


def test_visible_none_hides_every_gpu_from_cuda_and_jax():
    p = jax_plan(2, devices={"visible_gpus": "none"})
    assert p.env["CUDA_VISIBLE_DEVICES"] == "-1" and p.env["JAX_PLATFORMS"] == "cpu"
    assert p.gpus == () and p.strategy.kind == "single_device" and p.strategy.devices == ("cpu:0",)
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in p.env


def test_gpu_index_beyond_the_count_is_a_device_error():
    with pytest.raises(DeviceError, match="GPU index 5 was requested"):
        jax_plan(4, devices={"visible_gpus": [5]})


def test_jax_platforms_cpu_in_the_environment_is_not_planned_as_gpus():
    """JAX_PLATFORMS=cpu (set by the user) leaves JAX no GPU: a DataParallel over gpu:0, gpu:1 fails at
    its first step (jax.devices('gpu') raises), so the plan must plan for the CPU or say so."""
    p = make_plan(jax_config(), machine(2, env={"JAX_PLATFORMS": "cpu"}))
    on_cpu = all(d.startswith("cpu:") for d in p.strategy.devices)
    assert on_cpu or any("JAX_PLATFORMS" in w for w in p.warnings), (p.strategy, p.warnings)


def test_unlike_gpus_warn_that_the_slowest_sets_the_pace():
    gpus = (GpuInfo(0, "NVIDIA H100 80GB HBM3", 81559, "GPU-h", 0), GpuInfo(1, "NVIDIA A10", 23028, "GPU-a", 1))
    p = make_plan(jax_config(), Probe(gpus=gpus, jax_memory_fraction_env=NEW))
    [warning] = [w for w in p.warnings if "unequal GPUs" in w]
    assert "slowest GPU sets the pace" in warning and "devices.visible_gpus" in warning


# ------------------------------------------------------------------ allocator, XLA flags, CPU devices


def test_cuda_malloc_async_becomes_jaxs_cuda_async_allocator():
    p = jax_plan(1, tensorflow={"gpu_allocator": "cuda_malloc_async"})
    assert p.env["XLA_PYTHON_CLIENT_ALLOCATOR"] == "cuda_async"
    assert p.env_settings["XLA_PYTHON_CLIENT_ALLOCATOR"] == "tensorflow.gpu_allocator"
    assert "XLA_PYTHON_CLIENT_ALLOCATOR" not in jax_plan(1).env


def test_deterministic_ops_add_the_xla_flag_keeping_the_others_and_replacing_a_duplicate():
    machine_ = machine(1, env={"XLA_FLAGS": f"--xla_dump_to=/tmp/dump {DETERMINISM}=false --xla_gpu_autotune_level=0"})
    p = make_plan(jax_config(tensorflow={"deterministic_ops": True, "seed": 7}), machine_)
    assert p.env_settings["XLA_FLAGS"] == "tensorflow.deterministic_ops"
    got = p.env["XLA_FLAGS"].split()
    assert f"{DETERMINISM}=true" in got
    assert [f for f in got if f.startswith(DETERMINISM)] == [f"{DETERMINISM}=true"]
    assert "--xla_dump_to=/tmp/dump" in got and "--xla_gpu_autotune_level=0" in got
    assert call(p, "keras.utils.set_random_seed").value == 7
    assert not [w for w in p.warnings if "deterministic" in w]


def test_deterministic_ops_without_a_seed_warn():
    p = jax_plan(1, tensorflow={"deterministic_ops": True})
    assert f"{DETERMINISM}=true" in p.env["XLA_FLAGS"].split()
    assert [w for w in p.warnings if "without tensorflow.seed" in w]


def test_two_cpu_devices_on_a_cpu_only_machine_train_data_parallel():
    p = jax_plan(0, devices={"cpu_logical_devices": 2}, train={"batch_size_per_replica": 128})
    assert f"{COUNT}=2" in p.env["XLA_FLAGS"].split()
    assert p.env_settings["XLA_FLAGS"] == "devices.cpu_logical_devices"
    assert p.logical_devices == ("cpu:0", "cpu:1")
    assert p.strategy.kind == "data_parallel" and p.strategy.devices == ("cpu:0", "cpu:1")
    assert p.num_replicas == 2 and p.global_batch_size == 256
    assert call(p, "keras.distribution.set_distribution").value == ["cpu:0", "cpu:1"]


def test_cpu_devices_and_determinism_share_one_xla_flags():
    machine_ = machine(0, env={"XLA_FLAGS": f"{COUNT}=8 --xla_cpu_enable_fast_math=false"})
    p = make_plan(jax_config(devices={"cpu_logical_devices": 4}, tensorflow={"deterministic_ops": True, "seed": 1}),
                  machine_)
    got = p.env["XLA_FLAGS"].split()
    assert [f for f in got if f.startswith(COUNT)] == [f"{COUNT}=4"]
    assert f"{DETERMINISM}=true" in got and "--xla_cpu_enable_fast_math=false" in got
    assert p.env_settings["XLA_FLAGS"] == "devices.cpu_logical_devices, tensorflow.deterministic_ops"
    assert p.num_replicas == 4


TIMEOUT = "--xla_cpu_collective_call_terminate_timeout_seconds"


def test_data_parallel_on_cpu_devices_lets_a_late_device_wait_ten_minutes_not_40_seconds():
    """XLA:CPU stops the process when one CPU device reaches an all-reduce 60 s after another (40 s after its
    warning); on CPU devices tfgpu gives it 10 minutes more (issue 34). A value in XLA_FLAGS is kept; one device or
    GPUs as the replicas (no CPU collectives) get no such flag."""
    p = jax_plan(0, devices={"cpu_logical_devices": 2})
    assert f"{TIMEOUT}=600" in p.env["XLA_FLAGS"].split()
    assert p.env_settings["XLA_FLAGS"] == "devices.cpu_logical_devices"
    own = machine(0, env={"XLA_FLAGS": f"{TIMEOUT}=90"})
    assert [f for f in flags(make_plan(jax_config(devices={"cpu_logical_devices": 4}), own)) if TIMEOUT in f] == [
        f"{TIMEOUT}=90"]
    assert not [f for f in flags(jax_plan(0, devices={"cpu_logical_devices": 1})) if TIMEOUT in f]
    assert not [f for f in flags(jax_plan(2, devices={"cpu_logical_devices": 2})) if TIMEOUT in f]


def test_an_existing_device_count_flag_gives_that_many_cpu_devices():
    machine_ = machine(0, env={"XLA_FLAGS": f"{COUNT}=2"})
    p = make_plan(jax_config(train={"batch_size_per_replica": 10}), machine_)
    assert f"{COUNT}=2" in flags(p, machine_)
    assert p.logical_devices == ("cpu:0", "cpu:1") and p.strategy.kind == "data_parallel"
    assert p.num_replicas == 2 and p.global_batch_size == 20


def test_an_explicit_single_cpu_device_overrides_the_environments_device_count():
    """``cpu_logical_devices: 1`` set in the config (not left at its default) is what the user asked for: a
    config key that is set replaces the environment variable it maps to (tfgpu.config's precedence rule)."""
    machine_ = machine(0, env={"XLA_FLAGS": f"{COUNT}=4"})
    p = make_plan(jax_config(devices={"cpu_logical_devices": 1}), machine_)
    assert p.logical_devices == ("cpu:0",) and p.num_replicas == 1
    assert not [f for f in flags(p, machine_) if f.startswith(COUNT) and f != f"{COUNT}=1"]


def test_cpu_devices_on_a_gpu_machine_leave_the_gpus_as_the_replicas():
    p = jax_plan(2, devices={"cpu_logical_devices": 2})
    assert f"{COUNT}=2" in p.env["XLA_FLAGS"].split()
    assert p.strategy.devices == ("gpu:0", "gpu:1")


# ------------------------------------------------------------------ strategy and devices


def test_strategy_default_sets_no_distribution():
    p = jax_plan(4, distribute={"strategy": "default"}, train={"batch_size_per_replica": 32})
    assert p.strategy.kind == "default" and p.strategy.devices == ()
    assert call(p, "keras.distribution.set_distribution") is None
    assert p.num_replicas == 1 and p.global_batch_size == 32
    assert "No distribution: JAX's default device (strategy: default)" in p.describe()
    q = jax_plan(4, distribute={"strategy": "default", "devices": ["/gpu:0", "/gpu:1"]})
    assert [w for w in q.warnings if "distribute.devices is ignored" in w]


@pytest.mark.parametrize("strategy", ["auto", "mirrored"])
def test_distribute_devices_choose_a_subset(strategy):
    p = jax_plan(4, distribute={"strategy": strategy, "devices": ["/gpu:1", "GPU:3"]},
                 train={"batch_size_per_replica": 8})
    assert p.strategy.kind == "data_parallel" and p.strategy.devices == ("gpu:1", "gpu:3")
    assert p.logical_devices == ("gpu:0", "gpu:1", "gpu:2", "gpu:3")
    assert call(p, "keras.distribution.set_distribution").value == ["gpu:1", "gpu:3"]
    assert p.num_replicas == 2 and p.global_batch_size == 16


def test_one_chosen_device_is_a_single_device():
    p = jax_plan(4, distribute={"devices": ["/device:GPU:0"]})
    assert p.strategy.kind == "single_device" and p.strategy.devices == ("gpu:0",)
    assert call(p, "keras.distribution.set_distribution") is None and p.num_replicas == 1


def test_one_chosen_device_other_than_the_first_is_refused_with_visible_gpus_as_the_fix():
    """On JAX one device is JAX's default device (the first); tfgpu does not move the model to another."""
    with pytest.raises(DeviceError) as info:
        jax_plan(4, distribute={"devices": ["/device:GPU:2"]})
    assert "gpu:2 alone" in info.value.message and "devices.visible_gpus" in info.value.hint


def test_chosen_cpu_devices_need_the_cpu_split():
    p = jax_plan(0, devices={"cpu_logical_devices": 3}, distribute={"devices": ["/cpu:0", "/cpu:2"]})
    assert p.strategy.devices == ("cpu:0", "cpu:2") and p.num_replicas == 2
    with pytest.raises(DeviceError) as info:
        jax_plan(0, distribute={"devices": ["/cpu:1"]})
    assert "cpu:1 was requested" in info.value.message and "JAX will have: cpu:0" in info.value.message
    assert COUNT in info.value.hint


def test_a_device_that_will_not_exist_is_a_device_error():
    with pytest.raises(DeviceError, match="gpu:2 was requested"):
        jax_plan(2, distribute={"devices": ["/gpu:0", "/gpu:2"]})


def test_jit_compile_false_runs_keras_jax_steps_eagerly():
    p = jax_plan(1, tensorflow={"jit_compile": False})
    assert p.jit_compile is False and "eagerly" in p.jit_compile_reason


def test_log_level_is_kept_from_the_environment_unless_set():
    assert "TF_CPP_MIN_LOG_LEVEL" not in make_plan(jax_config(), machine(1, env={"TF_CPP_MIN_LOG_LEVEL": "0"})).env
    p = make_plan(jax_config(tensorflow={"log_level": 3}), machine(1, env={"TF_CPP_MIN_LOG_LEVEL": "0"}))
    assert p.env["TF_CPP_MIN_LOG_LEVEL"] == "3" and p.env_settings["TF_CPP_MIN_LOG_LEVEL"] == "tensorflow.log_level"


def test_tensorflow_growth_off_in_the_environment_is_turned_on_with_a_warning():
    p = make_plan(jax_config(), machine(1, env={"TF_FORCE_GPU_ALLOW_GROWTH": "false"}))
    assert p.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert [w for w in p.warnings if "TF_FORCE_GPU_ALLOW_GROWTH was false" in w]


# ------------------------------------------------------------------ the real probe over FakeNvml


def four_a100s() -> FakeNvml:
    return FakeNvml([{"name": A100, "uuid": f"GPU-a100000{i}-0000-4000-8000-000000000000", "total": 40960,
                      "used": 0, "cc": "8.0", "mig": False} for i in range(4)])


def test_real_probe_of_four_a100s_plans_four_replicas_with_the_installed_jaxlibs_name(monkeypatch):
    for var in ("CUDA_VISIBLE_DEVICES", *JAX_VARS):
        monkeypatch.delenv(var, raising=False)
    machine_ = probe(nvml=four_a100s())
    p = make_plan(jax_config(devices={"memory_fraction": 0.3}, train={"batch_size_per_replica": 512}), machine_)
    assert p.num_replicas == 4 and p.global_batch_size == 2048
    assert call(p, "keras.distribution.set_distribution").value == ["gpu:0", "gpu:1", "gpu:2", "gpu:3"]
    assert p.env[machine_.jax_memory_fraction_env or OLD] == "0.3"


def test_installed_jaxlib_reads_xla_client_mem_fraction():
    """jaxlib 0.10.2's xla_client.py reads XLA_CLIENT_MEM_FRACTION (and, deprecated, the old name)."""
    try:
        version = metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        pytest.skip("jaxlib is not installed")
    if version != "0.10.2":
        pytest.skip(f"checked against jaxlib 0.10.2 only; {version} is installed")
    from tfgpu.devices.probe import jax_fraction_env  # noqa: PLC0415

    assert jax_fraction_env() == NEW


# ------------------------------------------------------------------ the config refuses what JAX cannot do

#: For each entry of _JAX_REFUSED, configs that set it to a value refused on JAX.
REFUSED_SAMPLES: dict[tuple[str, str], list[dict]] = {
    ("devices", "gpu_logical_devices"): [{"devices": {"gpu_logical_devices": 2, "memory_fraction": 0.5}}],
    ("devices", "soft_placement"): [{"devices": {"soft_placement": False}}],
    ("devices", "log_device_placement"): [{"devices": {"log_device_placement": True}}],
    ("tensorflow", "intra_op_threads"): [{"tensorflow": {"intra_op_threads": 4}}],
    ("tensorflow", "inter_op_threads"): [{"tensorflow": {"inter_op_threads": 2}}],
    ("tensorflow", "onednn_opts"): [{"tensorflow": {"onednn_opts": False}}, {"tensorflow": {"onednn_opts": True}}],
    ("train", "loop"): [{"train": {"loop": "custom"}}],
    ("train", "profile_steps"): [{"train": {"profile_steps": [2, 3]}, "output": {"tensorboard": True}}],
    ("distribute", "strategy"): [{"distribute": {"strategy": "multi_worker_mirrored"}},
                                 {"distribute": {"strategy": "one_device"}}],
    ("distribute", "cross_device_ops"): [{"distribute": {"cross_device_ops": "nccl"}},
                                         {"distribute": {"cross_device_ops": "reduce_to_one_device"}}],
    ("distribute", "communication"): [{"distribute": {"communication": "ring"}}],
    ("distribute", "cluster"): [{"distribute": {"cluster": {"workers": ["node1:12345", "node2:12345"],
                                                            "task_index": 0}}}],
}
REFUSED_CASES = [(section, key, why, sample) for section, key, _, why in _JAX_REFUSED
                 for sample in REFUSED_SAMPLES.get((section, key), [])]


def test_every_refused_setting_has_a_sample():
    assert set(REFUSED_SAMPLES) == {(section, key) for section, key, _, _ in _JAX_REFUSED}


@pytest.mark.parametrize("section, key, why, sample", REFUSED_CASES,
                         ids=[f"{s}.{k}-{i}" for i, (s, k, _, _) in enumerate(REFUSED_CASES)])
def test_a_setting_without_a_jax_counterpart_is_refused_on_jax_only(section, key, why, sample):
    with pytest.raises(ConfigError) as info:
        load_config({"backend": "jax", **sample})
    message = info.value.message
    assert info.value.exit_code == 3
    assert f"'{section}.{key}'" in message and "no JAX counterpart" in message
    assert why.split(";")[0] in message, "the message names the nearest JAX tool"
    assert "Traceback" not in message
    cfg = load_config({"backend": "tensorflow", **sample})
    assert cfg.backend == "tensorflow" and getattr(getattr(cfg, section), key) is not None
    assert load_config(sample).backend == "tensorflow", "tensorflow is the default backend"


@pytest.mark.parametrize("sample", [
    {"devices": {"gpu_logical_devices": 1, "log_device_placement": False}},
    {"tensorflow": {"intra_op_threads": 0, "inter_op_threads": 0, "onednn_opts": None}},
    {"train": {"loop": "fit", "profile_steps": None}},
    {"distribute": {"strategy": "mirrored", "cross_device_ops": "auto", "communication": "auto", "cluster": None}},
    {"distribute": {"strategy": "auto"}},
    {"distribute": {"strategy": "default"}},
])
def test_values_that_mean_the_same_on_jax_are_accepted(sample):
    cfg = load_config({"backend": "jax", **sample})
    assert make_plan(cfg, machine(2)).backend == "jax"


def test_several_refused_settings_are_named_together():
    """The CLI says 'correct the keys above': a TensorFlow recipe moved to JAX should list every key to remove."""
    with pytest.raises(ConfigError) as info:
        load_config({"backend": "jax", "train": {"loop": "custom"}, "tensorflow": {"intra_op_threads": 4}})
    assert "'tensorflow.intra_op_threads'" in info.value.message
    assert "also without a JAX counterpart here: train.loop" in info.value.message


def test_soft_placement_true_asks_for_nothing_on_jax_and_is_accepted():
    """A resolved config (config.resolved.yaml, read by --resume) lists soft_placement: true, its default."""
    assert load_config({"backend": "jax", "devices": {"soft_placement": True}}).backend == "jax"


def test_an_unknown_backend_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        load_config({"backend": "torch"})
    assert "backend" in info.value.message and "jax" in info.value.message


# ------------------------------------------------------------------ the command line


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in child_env(needs=("jax",)).items() if k not in JAX_VARS}
    return subprocess.run([sys.executable, "-m", "tfgpu", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)


def test_cli_plan_on_jax_prints_the_jax_environment():
    result = cli("plan", "recipes/mnist.yaml", "--set", "backend=jax", "--set", "devices.cpu_logical_devices=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "KERAS_BACKEND=jax    # backend" in result.stdout
    assert f"XLA_FLAGS={COUNT}=2 {TIMEOUT}=600    # devices.cpu_logical_devices" in result.stdout
    assert "Data parallel: keras.distribution.DataParallel over " in result.stdout


def test_cli_refuses_the_custom_loop_on_jax_with_exit_code_3():
    result = cli("plan", "recipes/mnist.yaml", "--set", "backend=jax", "--set", "train.loop=custom")
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.startswith("tfgpu: configuration error:")
    assert "--set train.loop=custom: 'train.loop': no JAX counterpart (backend: jax)" in result.stderr
    assert "loop: fit" in result.stderr and "Traceback" not in result.stderr
