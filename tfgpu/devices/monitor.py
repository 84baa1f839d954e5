"""Device statistics sampled in the background while a run trains: per GPU utilisation, memory, power and
temperature from NVML, and the host's CPU use and resident memory (psutil).

:class:`DeviceMonitor` starts one daemon thread that samples every ``interval`` seconds (0.25 s: four times a
second); :meth:`DeviceMonitor.take` returns what was sampled since the last call (an epoch's
:class:`DeviceStats`) and starts the next period. The thread keeps the time its samples took
(:attr:`DeviceStats.sampling_seconds`), so the cost is measured, not assumed: a sample of 8 GPUs is 8 x 4 NVML
queries (tens of microseconds each) and two psutil reads.

Imports no TensorFlow. NVML is optional: without it (no driver, no GPU) only the host is sampled.

Wraps: https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html (``nvmlDeviceGetUtilizationRates``,
``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetPowerUsage``, ``nvmlDeviceGetTemperature``) and
https://psutil.readthedocs.io/en/latest/#psutil.Process (``cpu_times``, ``memory_info``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

MIB = 2**20
#: Seconds between samples.
INTERVAL = 0.25


@dataclass(frozen=True)
class GpuStats:
    """One GPU over one period.

    Attributes:
        nvml_index: the physical GPU as NVML counts it; name: NVML's name for it.
        utilization_percent: mean of the samples of ``nvmlDeviceGetUtilizationRates().gpu`` (the share of time a
            kernel ran), 0-100.
        memory_used_mib: the most memory in use in any sample (all processes on the GPU), MiB.
        memory_total_mib: the GPU's memory, MiB.
        power_w: mean board power, watts (``None`` where NVML does not report it).
        temperature_c: the highest GPU temperature sampled, degrees Celsius (``None`` where not reported).
        samples: how many samples the figures are from.
    """

    nvml_index: int
    name: str
    utilization_percent: float
    memory_used_mib: float
    memory_total_mib: float
    power_w: Optional[float]
    temperature_c: Optional[float]
    samples: int


@dataclass(frozen=True)
class DeviceStats:
    """One period (an epoch) of samples.

    Attributes:
        seconds: the period's wall-clock length.
        host_cpu_percent: this process's CPU time (user + system, every thread) over the period's wall time, as a
            share of the cores it may use (0-100; 100 = every core busy the whole period).
        host_rss_mib: the most resident memory sampled, MiB.
        gpus: one :class:`GpuStats` per monitored GPU.
        sampling_seconds: the time the samples themselves took (the monitor's cost, on its own thread).
        samples: how many samples were taken.
    """

    seconds: float
    host_cpu_percent: float
    host_rss_mib: float
    gpus: tuple[GpuStats, ...] = ()
    sampling_seconds: float = 0.0
    samples: int = 0


@dataclass
class _Accumulator:
    samples: int = 0
    rss: float = 0.0
    util: dict[int, list[float]] = field(default_factory=dict)
    memory: dict[int, float] = field(default_factory=dict)
    power: dict[int, list[float]] = field(default_factory=dict)
    temperature: dict[int, float] = field(default_factory=dict)
    cost: float = 0.0


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class DeviceMonitor:
    """Sample ``nvml_indices``' GPUs and this process in a background thread.

    Args:
        nvml_indices: the physical GPUs this process uses, as NVML counts them (``GpuInfo.nvml_index``).
        interval: seconds between samples.
        nvml: NVML bindings (``pynvml``); ``None``: import ``pynvml`` (nvidia-ml-py) when there are GPUs to sample.

    Use: :meth:`start`, then :meth:`take` at each epoch's end, :meth:`stop` at the end. A GPU NVML cannot read is
    left out; the host is always sampled.
    """

    def __init__(self, nvml_indices: Sequence[int] = (), interval: float = INTERVAL, nvml: Any = None) -> None:
        import psutil  # noqa: PLC0415

        self.interval = interval
        self._process = psutil.Process()
        self._nvml = nvml
        self._handles: dict[int, tuple[Any, str, float]] = {}
        if nvml_indices:
            self._open(list(nvml_indices))
        self._lock = threading.Lock()
        self._acc = _Accumulator()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._began = time.perf_counter()
        self._cpu = self._cpu_seconds()

    def _open(self, indices: list[int]) -> None:
        try:
            if self._nvml is None:
                import pynvml  # noqa: PLC0415

                self._nvml = pynvml
            self._nvml.nvmlInit()
            for i in indices:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(i)
                name = self._nvml.nvmlDeviceGetName(handle)
                total = self._nvml.nvmlDeviceGetMemoryInfo(handle).total / MIB
                self._handles[i] = (handle, name.decode() if isinstance(name, bytes) else str(name), total)
        except Exception:  # noqa: BLE001 - no NVML: the host only
            self._handles = {}

    def _cpu_seconds(self) -> float:
        times = self._process.cpu_times()
        return times.user + times.system

    @property
    def gpus(self) -> list[int]:
        """The NVML indices being sampled."""
        return list(self._handles)

    def sample(self) -> None:
        """Take one sample now (the thread calls this every ``interval`` seconds)."""
        began = time.perf_counter()
        rss = self._process.memory_info().rss / MIB
        readings = {}
        nvml = self._nvml
        for i, (handle, _, _) in self._handles.items():
            try:
                util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                used = nvml.nvmlDeviceGetMemoryInfo(handle).used / MIB
            except Exception:  # noqa: BLE001 - a GPU that stopped answering: skip this sample
                continue
            power = temperature = None
            try:
                power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts
            except Exception:  # noqa: BLE001, S110 - not reported on every board
                pass
            try:
                temperature = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            except Exception:  # noqa: BLE001, S110
                pass
            readings[i] = (util, used, power, temperature)
        with self._lock:
            acc = self._acc
            acc.samples += 1
            acc.rss = max(acc.rss, rss)
            for i, (util, used, power, temperature) in readings.items():
                acc.util.setdefault(i, []).append(util)
                acc.memory[i] = max(acc.memory.get(i, 0.0), used)
                if power is not None:
                    acc.power.setdefault(i, []).append(power)
                if temperature is not None:
                    acc.temperature[i] = max(acc.temperature.get(i, -273.0), temperature)
            acc.cost += time.perf_counter() - began

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> "DeviceMonitor":
        """Start sampling (one sample at once, then every ``interval`` seconds); starts the first period."""
        self.take()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="tfgpu-device-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread: it wakes at once (a sample under way ends first; the wait is at most 0.2 s, and the thread
        is a daemon)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=0.2)
            self._thread = None

    def take(self) -> DeviceStats:
        """What was sampled since the last :meth:`take` (or :meth:`start`), and start the next period. A period
        without a sample takes one now."""
        if self._acc.samples == 0:
            self.sample()
        now, cpu = time.perf_counter(), self._cpu_seconds()
        with self._lock:
            acc, self._acc = self._acc, _Accumulator()
        seconds = now - self._began
        cpu_percent = 100.0 * (cpu - self._cpu) / seconds / _cores() if seconds > 0 else 0.0
        self._began, self._cpu = now, cpu
        gpus = []
        for i, (_, name, total) in self._handles.items():
            utils = acc.util.get(i)
            if not utils:
                continue
            power = acc.power.get(i)
            gpus.append(GpuStats(i, name, sum(utils) / len(utils), acc.memory.get(i, 0.0), total,
                                 sum(power) / len(power) if power else None, acc.temperature.get(i), len(utils)))
        return DeviceStats(seconds, cpu_percent, acc.rss, tuple(gpus), acc.cost, acc.samples)
