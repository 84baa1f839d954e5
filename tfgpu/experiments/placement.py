"""Where a sweep's trials run: the slots of ``tfgpu sweep`` (pure: config and probe in, data out).

A *slot* is the devices one trial process gets. Free slots take the next trial at once, so at most
one trial runs per slot. :func:`plan_slots` turns ``sweep.per_trial`` and the machine into slots:

- a GPU host: ``per_trial.gpus: N`` (whole GPUs) gives each slot N GPUs through
  ``CUDA_VISIBLE_DEVICES`` (NVML indices, ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; a MIG instance by its
  ``MIG-`` UUID, one per slot: a CUDA process uses one MIG instance only); a fraction ``f`` below 1
  gives ``floor(1/f)`` slots per GPU, each trial capped with ``devices.memory_fraction: f``;
- a host without GPUs (or ``devices.visible_gpus: none``): ``--parallel K`` slots, each with its
  share of the CPU cores, pinned to them (``os.sched_setaffinity``) and given as thread limits
  (``tensorflow.intra_op_threads`` / ``inter_op_threads``, ``OMP_NUM_THREADS``);
- ``--parallel K`` on a GPU host runs at most K of the slots.

Nothing here starts a process or imports TensorFlow: ``tfgpu plan`` prints the same slots a sweep uses,
and tests describe machines they do not have through the probe (:func:`tfgpu.devices.probe.probe`'s seam).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..config import Config
from ..devices.plan_base import visible_gpus
from ..devices.probe import GpuInfo, Probe
from ..errors import DeviceError


@dataclass(frozen=True)
class Slot:
    """The devices one trial process gets.

    Attributes:
        index: the slot's number, from 0.
        label: what it is, for people: ``"GPU 0 (NVIDIA H100 80GB HBM3 (81559 MiB))"``,
            ``"GPU 1, share 2 of 2 (memory_fraction 0.5)"``, ``"CPU cores 0-7"``.
        env: environment variables the trial process gets (``CUDA_VISIBLE_DEVICES``, ...).
        overrides: ``--set`` items the trial's run gets (memory caps, thread limits).
        cpus: the CPU cores the process is pinned to, or ``None`` (not pinned).
    """

    index: int
    label: str
    env: dict[str, str] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    cpus: Optional[tuple[int, ...]] = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "label": self.label, "env": dict(self.env), "overrides": list(self.overrides),
                "cpus": list(self.cpus) if self.cpus is not None else None}


def _ranges(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cores):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _cpu_slots(cfg: Config, parallel: int, cores: Sequence[int]) -> list[Slot]:
    """``parallel`` slots sharing ``cores``: contiguous equal shares, or one core each (shared) beyond them."""
    cores = sorted(cores) or [0]
    slots = []
    for i in range(parallel):
        if parallel <= len(cores):
            share = len(cores) // parallel
            extra = len(cores) % parallel
            start = i * share + min(i, extra)
            mine = tuple(cores[start:start + share + (1 if i < extra else 0)])
        else:
            mine = (cores[i % len(cores)],)
        threads = len(mine)
        overrides: tuple[str, ...] = ()
        if cfg.backend == "tensorflow":  # (on JAX these keys are refused: the affinity alone limits it)
            overrides = (f"tensorflow.intra_op_threads={threads}", f"tensorflow.inter_op_threads={threads}")
        shared = " (shared)" if parallel > len(cores) else ""
        slots.append(Slot(i, f"CPU core{'s' if threads > 1 else ''} {_ranges(mine)}{shared}",
                          {"OMP_NUM_THREADS": str(threads)}, overrides, mine))
    return slots


def _gpu_groups(cfg: Config, gpus: list[GpuInfo]) -> list[tuple[list[GpuInfo], int, int]]:
    """``(GPUs, share, shares)`` per slot for ``sweep.per_trial.gpus``."""
    want = cfg.sweep.per_trial.gpus if cfg.sweep is not None else 1
    if want < 1:
        shares = math.floor(1 / want + 1e-9)  # (0.5, 1): one share per GPU, still capped
        return [([g], s + 1, shares) for s in range(shares) for g in gpus]  # each GPU's first share first
    want = int(want)
    mig = [g for g in gpus if g.is_mig]
    if want > 1 and mig:
        raise DeviceError(
            f"sweep.per_trial.gpus: {want} GPUs per trial were requested (received {want}), but the GPUs here "
            f"are MIG instances ({', '.join(g.uuid for g in mig)}), and a CUDA process can use only one MIG "
            "instance (NVIDIA's MIG user guide).",
            "set sweep.per_trial.gpus: 1 (one trial per MIG instance), or a fraction to share an instance.")
    if want > len(gpus):
        raise DeviceError(
            f"sweep.per_trial.gpus: {want} GPUs per trial were requested (received {want}), but {len(gpus)} "
            f"GPU{'s are' if len(gpus) != 1 else ' is'} visible: "
            f"{', '.join(f'GPU {g.index} {g.label()}' for g in gpus)}.",
            f"set sweep.per_trial.gpus to {len(gpus)} or fewer (or a fraction to share one), or make more GPUs "
            "visible (devices.visible_gpus, CUDA_VISIBLE_DEVICES).")
    return [(gpus[i:i + want], 1, 1) for i in range(0, len(gpus) - want + 1, want)]


def plan_slots(cfg: Config, probe: Probe, parallel: Optional[int], cores: Sequence[int]) -> list[Slot]:
    """The slots of a sweep of ``cfg`` on the machine ``probe`` describes.

    Args:
        cfg: the recipe's configuration, with its ``sweep`` section (``per_trial``).
        probe: the machine (:func:`tfgpu.devices.probe.probe`, or a machine file's: ``tfgpu plan --machine``).
        parallel: ``--parallel K``: the slots on a host without GPUs (default 1), or at most K of a GPU
            host's slots (default: all of them).
        cores: the CPU cores this process may use (``os.sched_getaffinity(0)``).

    Returns:
        The slots, in order; each runs one trial at a time.

    Raises:
        DeviceError: ``per_trial.gpus`` asks for more GPUs than are visible, or for several MIG instances.
    """
    gpus = visible_gpus(cfg, probe)
    if cfg.devices.visible_gpus == "all":
        gpus += list(probe.mig_hidden)  # one process sees one MIG instance; the sweep's processes see one each
    if not gpus:
        return _cpu_slots(cfg, parallel or 1, cores)
    base: list[str] = []
    if isinstance(cfg.devices.visible_gpus, list):
        base.append("devices.visible_gpus=all")  # each trial sees only its own GPUs, renumbered from 0
    slots = []
    want = cfg.sweep.per_trial.gpus if cfg.sweep is not None else 1
    for i, (group, share, shares) in enumerate(_gpu_groups(cfg, gpus)):
        names = ",".join(g.cuda_name for g in group)
        env = {"CUDA_VISIBLE_DEVICES": names, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        overrides = list(base)
        label = ", ".join(f"GPU {g.cuda_name} ({g.label()})" for g in group)
        if want < 1:
            overrides.append(f"devices.memory_fraction={want}")
            if cfg.devices.memory_limit_mib is not None:
                overrides.append("devices.memory_limit_mib=null")
            label += f", share {share} of {shares} (devices.memory_fraction {want})"
        slots.append(Slot(i, label, env, tuple(overrides)))
    if parallel is not None:
        slots = slots[:parallel]
    return slots


def slot_lines(slots: Sequence[Slot], trials: int) -> list[str]:
    """``tfgpu plan``'s lines for a sweep: each slot and what its trials get."""
    lines = [f"sweep: {trials} trial{'s' if trials != 1 else ''}, {len(slots)} at a time "
             f"({len(slots)} slot{'s' if len(slots) != 1 else ''}; a free slot takes the next trial at once)"]
    for slot in slots:
        extra = [f"{k}={v}" for k, v in slot.env.items()] + [f"--set {o}" for o in slot.overrides]
        pinned = f"; pinned to cores {_ranges(slot.cpus)}" if slot.cpus is not None else ""
        lines.append(f"  slot {slot.index}: {slot.label}{pinned}" + (f": {' '.join(extra)}" if extra else ""))
    return lines
