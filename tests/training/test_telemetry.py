"""Device statistics, input wait and MFU (tfgpu.training.telemetry, tfgpu.devices.monitor): the FLOPs count against
the formula, the monitor through a fake NVML (the one seam: there is no GPU here), the per-epoch figures, the
input-bound finding and the epoch line. Real runs' figures are checked in test_e2e.py and test_input_bench.py."""

from __future__ import annotations

import csv
import json
import time
from types import SimpleNamespace

import pytest

from tfgpu.config import load_config
from tfgpu.devices.monitor import DeviceMonitor
from tfgpu.training.loops import format_epoch
from tfgpu.training.telemetry import Telemetry, input_bound

from ..conftest import run_python


class FakeNvml:
    """NVML bindings for two GPUs whose readings a test sets (utilisation %, memory bytes, power mW, temperature)."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        self.readings = {0: (50, 2 << 30, 200_000, 60), 1: (90, 6 << 30, 300_000, 75)}
        self.calls = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=80 << 30, used=self.readings[h][1])

    def nvmlDeviceGetUtilizationRates(self, h):
        self.calls += 1
        return SimpleNamespace(gpu=self.readings[h][0])

    def nvmlDeviceGetPowerUsage(self, h):
        return self.readings[h][2]

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self.readings[h][3]


def test_the_monitor_averages_utilisation_and_power_and_keeps_the_highest_memory_and_temperature():
    nvml = FakeNvml()
    monitor = DeviceMonitor([0, 1], interval=10.0, nvml=nvml)  # samples only when told (no thread started)
    monitor.take()
    monitor.sample()
    nvml.readings[0] = (70, 3 << 30, 100_000, 65)
    monitor.sample()
    stats = monitor.take()
    first, second = stats.gpus
    assert (first.nvml_index, first.name, first.samples) == (0, "NVIDIA H100 80GB HBM3", 2)
    assert first.utilization_percent == pytest.approx(60.0)
    assert first.memory_used_mib == pytest.approx(3 * 1024) and first.memory_total_mib == pytest.approx(80 * 1024)
    assert first.power_w == pytest.approx(150.0) and first.temperature_c == 65
    assert second.utilization_percent == pytest.approx(90.0) and second.power_w == pytest.approx(300.0)
    assert stats.samples == 2 and stats.sampling_seconds > 0
    assert stats.host_rss_mib > 10 and 0 <= stats.host_cpu_percent
    assert monitor.take().samples == 1  # a new period: a period without a sample takes one


def test_the_monitor_thread_samples_a_few_times_a_second_and_costs_little():
    monitor = DeviceMonitor([0, 1], interval=0.05, nvml=FakeNvml()).start()
    time.sleep(0.6)
    stats = monitor.take()
    monitor.stop()
    assert 6 <= stats.samples <= 14, stats.samples
    assert stats.sampling_seconds < 0.05 * stats.seconds  # under 5 % of one core even at 20 samples a second


def test_no_nvml_leaves_the_host_only():
    class Broken:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    monitor = DeviceMonitor([0], nvml=Broken())
    assert monitor.gpus == []
    stats = monitor.take()
    assert stats.gpus == () and stats.host_rss_mib > 0


def test_an_epoch_gets_mfu_input_wait_and_device_columns_and_device_stats_csv(tmp_path):
    nvml = FakeNvml()
    monitor = DeviceMonitor([0, 1], interval=10.0, nvml=nvml)
    monitor.take()
    waited = iter([1.0, 3.5])
    telemetry = Telemetry(monitor, flops_per_sample=4e6, peak_flops=2e11, stats_path=tmp_path / "device_stats.csv")
    telemetry.input_wait = lambda: next(waited)
    telemetry.begin_epoch()
    monitor.sample()
    logs: dict = {}
    telemetry.end_epoch(0, logs, train_seconds=10.0, samples=250_000)
    assert logs["input_wait_seconds"] == pytest.approx(2.5) and logs["input_wait_percent"] == pytest.approx(25.0)
    assert logs["mfu_percent"] == pytest.approx(100 * 4e6 * 25_000 / 2e11)  # 50 %
    assert logs["gpu_utilization_percent"] == pytest.approx(70.0)
    assert logs["gpu_memory_peak_mib"] == pytest.approx(6 * 1024)  # NVML's: no TensorFlow GPU to ask
    assert logs["gpu_power_w"] == pytest.approx(500.0) and logs["gpu_temperature_c"] == 75
    rows = list(csv.DictReader((tmp_path / "device_stats.csv").open()))
    assert [(r["epoch"], r["worker"], r["nvml_index"], r["utilization_percent"]) for r in rows] == [
        ("0", "0", "0", "50.0"), ("0", "0", "1", "90.0")]
    facts = telemetry.close()
    assert facts["sampling_seconds"] > 0 and facts["sampling_percent_of_training"] is not None


def test_input_bound_needs_a_tenth_of_the_time_waiting_and_names_the_keys():
    cfg = load_config(None, overrides=["data.cache=false", "data.augment=[{RandomFlip: {}}]"])
    rows = [{"input_wait_percent": 60.0}, {"input_wait_percent": 30.0}, {"input_wait_percent": 20.0}]
    bound = input_bound(rows, cfg)
    assert bound["input_wait_percent"] == 25.0  # the median after the first epoch (which traces)
    assert "input-bound" in bound["message"] and "25 %" in bound["message"]
    assert "data.cache: true" in bound["fix"] and "data.augment_on: model" in bound["fix"]
    assert "tfgpu bench input" in bound["fix"]
    assert input_bound([{"input_wait_percent": 60.0}, {"input_wait_percent": 9.0}], cfg) is None
    assert input_bound([{"loss": 1.0}], cfg) is None  # not measured


def test_the_epoch_line_shows_the_figures_short():
    line = format_epoch({"loss": 0.25, "samples_per_second": 25000.0, "input_wait_percent": 3.4,
                         "input_wait_seconds": 0.03, "mfu_percent": 12.345, "host_cpu_percent": 95.2,
                         "host_rss_mib": 800.0, "gpu_utilization_percent": 87.0, "gpu_memory_peak_mib": 12083.0,
                         "gpu_power_w": 312.0, "gpu_temperature_c": 71.0})
    assert line == ("loss: 0.2500 - samples_per_second: 25000 - input wait: 3% - MFU: 12.3% - CPU: 95% - "
                    "GPU: 87% 11.8 GiB 312 W 71 C")


@pytest.mark.slow
def test_flops_of_dense_and_conv2d_steps_match_the_formula():
    """Dense: forward 2 b n m, the weights' gradient as much, no gradient for the input; two valid Conv2Ds: forward
    2 x output elements x kernel volume, the filter's gradient as much, and for the second its input's gradient
    too (the first's input needs none). Exactly, since only matmuls and convolutions are counted."""
    result = run_python("""
        import json
        import keras
        import numpy as np
        from tfgpu.training.telemetry import step_flops

        mse = keras.losses.MeanSquaredError()
        dense = keras.Sequential([keras.Input((100,)), keras.layers.Dense(50, use_bias=False)])
        convs = keras.Sequential([keras.Input((10, 10, 3)), keras.layers.Conv2D(4, 3, use_bias=False),
                                  keras.layers.Conv2D(2, 3, use_bias=False)])
        print(json.dumps([
            step_flops(dense, mse, np.zeros((2, 100), "float32"), np.zeros((2, 50), "float32"), batch=8),
            step_flops(convs, mse, np.zeros((1, 10, 10, 3), "float32"), np.zeros((1, 6, 6, 2), "float32"), batch=2),
        ]))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    (dense, how), (convs, _) = json.loads(result.stdout.strip().splitlines()[-1])
    assert "2 FLOPs per multiply-add" in how
    assert dense == 2 * 8 * 100 * 50 * 2
    first = 2 * (2 * 8 * 8 * 4) * (3 * 3 * 3)  # forward; the filter's gradient the same
    second = 2 * (2 * 6 * 6 * 2) * (3 * 3 * 4)  # forward, filter gradient, input gradient
    assert convs == 2 * first + 3 * second


@pytest.mark.slow
def test_on_jax_xla_counts_the_same_steps_within_two_percent():
    """XLA's cost analysis counts element-wise operations too: a little above the formula, never below."""
    result = run_python("""
        import json, os
        os.environ["KERAS_BACKEND"] = "jax"
        import keras
        import numpy as np
        from tfgpu.training.telemetry import jax_step_flops

        mse = keras.losses.MeanSquaredError()
        dense = keras.Sequential([keras.Input((100,)), keras.layers.Dense(50, use_bias=False)])
        convs = keras.Sequential([keras.Input((10, 10, 3)), keras.layers.Conv2D(4, 3, use_bias=False),
                                  keras.layers.Conv2D(2, 3, use_bias=False)])
        print(json.dumps([
            jax_step_flops(dense, mse, np.zeros((2, 100), "float32"), np.zeros((2, 50), "float32"), batch=8),
            jax_step_flops(convs, mse, np.zeros((1, 10, 10, 3), "float32"), np.zeros((1, 6, 6, 2), "float32"), 2),
        ]))
    """, needs=("jax",))
    assert result.returncode == 0, result.stderr[-3000:]
    (dense, how), (convs, _) = json.loads(result.stdout.strip().splitlines()[-1])
    assert "XLA's HLO cost analysis" in how
    assert 160_000 <= dense <= 1.02 * 160_000
    assert 86_400 <= convs <= 1.02 * 86_400


def test_every_worker_writes_its_gpus_into_the_chief_directory_under_its_own_name():
    from tfgpu.training.telemetry import stats_file

    chief = SimpleNamespace(is_chief=True, cluster=None)
    worker = SimpleNamespace(is_chief=False, cluster=SimpleNamespace(worker_index=2))
    assert (stats_file(chief), stats_file(worker)) == ("device_stats.csv", "device_stats.worker-2.csv")
