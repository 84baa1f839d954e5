"""``tfgpu doctor --smoke``: does every device compute right, and does every all-reduce sum right?

The multi-GPU failures users find hardest are silent wrong numbers that only appear with several GPUs: NaN losses
on some machines (tensorflow#62915, #87432), "certain pairs of GPUs" that sum wrong (tensorflow#105552; the usual
cause is PCIe ACS/IOMMU breaking peer-to-peer copies, NVIDIA/nccl#631). This module runs a short, real check on the
devices a config trains on, after applying its device settings (:func:`tfgpu.setup`):

1. **Known step, per device**: a matmul, a 3x3 convolution and a sum of integer-valued float32 inputs, computed on
   the device and compared with NumPy's answer on the host. The inputs are small integers, so the matmul and the
   sum are exact in float32 and TensorFloat-32 (any difference is a fault, not rounding); the convolution is allowed
   1e-3 (cuDNN's Winograd algorithms round).
2. **All-reduce**: each replica contributes ``(replica + 1) x pattern`` (4 MiB of small integers) and
   ``ReplicaContext.all_reduce("sum")`` must give every replica exactly ``n (n + 1) / 2 x pattern``: across all the
   replicas and across each pair of devices, with the config's cross-device ops and with each other one that can
   work on the devices (GPUs: NCCL, hierarchical copy, reduction to one device; CPUs: reduction to one device).
3. **Copy bandwidth per pair**: a 64 MiB (GPUs; 16 MiB on CPUs) tensor copied from one device to the other, the
   best of 3, in GB/s, beside the link NVML reports between the two GPUs (NVLink, PCIe peer-to-peer, or through the
   host) and the least that link should give.

Every failure is a :class:`~tfgpu.devices.doctor.Finding` whose fix names tfgpu's keys.

Test seam: ``TFGPU_SMOKE_FAULTS`` (comma-separated) injects faults into the values the real ops return, so every
verdict can be tested on a machine without GPUs: ``wrong:DEVICE`` (the device's results are off by one in one
element, in the known step and in what it contributes to every all-reduce), ``nan:DEVICE`` (one element NaN),
``nccl-pair:I-J`` (the all-reduce of devices I and J, counted from 0, sums wrong with NCCL only; on CPUs the NCCL
check then runs the reduction to one device in NCCL's place). Not for users.

Wraps: https://www.tensorflow.org/api_docs/python/tf/distribute/MirroredStrategy,
https://www.tensorflow.org/api_docs/python/tf/distribute/ReplicaContext#all_reduce and
https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html (``nvmlDeviceGetP2PStatus``).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

from ..utils.console import table_lines
from .doctor import Finding

FAULTS_ENV = "TFGPU_SMOKE_FAULTS"
#: float32 elements each replica contributes to an all-reduce (4 MiB).
REDUCE_ELEMENTS = 1 << 20
#: Bytes copied per bandwidth measurement: on GPUs, and between logical CPU devices.
COPY_BYTES = {"GPU": 64 << 20, "CPU": 16 << 20}
#: The least copy bandwidth (GB/s) each link should give between two GPUs; below it the pair is reported.
#: NVLink 2-5 gives 150-900 GB/s each way and PCIe 3/4/5 x16 about 12/25/50 GB/s in practice; the floors are well
#: under those, so only a path that is broken or falls back to the host is reported.
LINK_FLOOR_GBPS = {"NVLink": 40.0, "PCIe P2P": 5.0, "through the host": 2.0}
#: cross-device ops by name (tfgpu's ``distribute.cross_device_ops``) -> ``tf.distribute`` class name.
IMPLEMENTATIONS = {"nccl": "NcclAllReduce", "hierarchical_copy": "HierarchicalCopyAllReduce",
                   "reduce_to_one_device": "ReductionToOneDevice"}


@dataclass(frozen=True)
class Faults:
    """The faults :data:`FAULTS_ENV` injects (the test seam; empty for users)."""

    wrong: frozenset = frozenset()
    nan: frozenset = frozenset()
    nccl_pairs: frozenset = frozenset()

    @classmethod
    def from_env(cls, environ: Optional[dict[str, str]] = None) -> "Faults":
        text = (os.environ if environ is None else environ).get(FAULTS_ENV, "")
        wrong, nan, pairs = set(), set(), set()
        for item in filter(None, (p.strip() for p in text.split(","))):
            kind, _, target = item.partition(":")
            if kind == "wrong":
                wrong.add(target.lower())
            elif kind == "nan":
                nan.add(target.lower())
            elif kind == "nccl-pair":
                i, _, j = target.partition("-")
                pairs.add(frozenset((int(i), int(j))))
            else:
                raise ValueError(f"{FAULTS_ENV}: unknown fault {item!r}; expected wrong:DEVICE, nan:DEVICE or "
                                 "nccl-pair:I-J")
        return cls(frozenset(wrong), frozenset(nan), frozenset(pairs))

    def __bool__(self) -> bool:
        return bool(self.wrong or self.nan or self.nccl_pairs)


@dataclass(frozen=True)
class StepCheck:
    """One device's known step: ``op`` (``matmul``, ``conv2d``, ``sum``) and how far it was from the host's answer.

    Attributes:
        device: the logical device, e.g. ``/gpu:1``.
        op: the operation; elements: elements compared; wrong: elements beyond the tolerance; nan: NaN or
        infinite elements; max_error: the largest absolute difference among the finite ones.
    """

    device: str
    op: str
    elements: int
    wrong: int
    nan: int
    max_error: float

    @property
    def ok(self) -> bool:
        return self.wrong == 0 and self.nan == 0


@dataclass(frozen=True)
class ReduceCheck:
    """One all-reduce: ``devices`` summed with ``implementation``.

    Attributes:
        devices: the replicas' devices; indices: their positions among all the devices (from 0);
        implementation: a key of :data:`IMPLEMENTATIONS`; configured: it is the config's;
        wrong: elements (over every replica's result) that are not the exact sum; nan: NaN or infinite ones;
        seconds: the best of 3 timed all-reduces (after one untimed); error: the exception's text if it failed.
    """

    devices: tuple[str, ...]
    indices: tuple[int, ...]
    implementation: str
    configured: bool
    wrong: int = 0
    nan: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.wrong == 0 and self.nan == 0


@dataclass(frozen=True)
class CopyCheck:
    """A copy from ``source`` to ``target``: ``gbps`` (10^9 bytes/s, the best of 3), the ``link`` between them and
    the least that link should give (``floor_gbps``; ``None``: no expectation, e.g. logical CPU devices)."""

    source: str
    target: str
    nbytes: int
    gbps: float
    link: str
    floor_gbps: Optional[float] = None

    @property
    def ok(self) -> bool:
        return self.floor_gbps is None or self.gbps >= self.floor_gbps


@dataclass
class SmokeReport:
    """What :func:`run_smoke` measured, and the verdicts (:func:`verdicts`)."""

    devices: tuple[str, ...]
    configured: Optional[str]
    steps: list[StepCheck] = field(default_factory=list)
    reduces: list[ReduceCheck] = field(default_factory=list)
    copies: list[CopyCheck] = field(default_factory=list)
    seconds: float = 0.0
    backend: str = "tensorflow"
    faults: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "devices": list(self.devices), "configured": self.configured,
                "seconds": round(self.seconds, 3), "faults_injected": self.faults,
                "steps": [asdict(s) | {"ok": s.ok} for s in self.steps],
                "all_reduce": [asdict(r) | {"ok": r.ok} for r in self.reduces],
                "copies": [asdict(c) | {"ok": c.ok} for c in self.copies]}


# ------------------------------------------------------------------ the inputs


def _inputs(seed: int = 0) -> dict[str, Any]:
    """The known step's integer-valued float32 inputs and NumPy's float64 answers."""
    import numpy as np  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    a = rng.integers(-3, 4, (256, 256)).astype(np.float32)
    b = rng.integers(-3, 4, (256, 256)).astype(np.float32)
    image = rng.integers(-2, 3, (2, 16, 16, 3)).astype(np.float32)
    kernel = rng.integers(-2, 3, (3, 3, 3, 8)).astype(np.float32)
    values = rng.integers(-4, 5, (REDUCE_ELEMENTS,)).astype(np.float32)
    conv = np.zeros((2, 14, 14, 8))
    for dy, dx in itertools.product(range(3), range(3)):  # a VALID 3x3 convolution, stride 1
        conv += np.einsum("nhwc,co->nhwo", image[:, dy:dy + 14, dx:dx + 14, :].astype(np.float64),
                          kernel[dy, dx].astype(np.float64))
    return {"a": a, "b": b, "image": image, "kernel": kernel, "values": values,
            "answers": {"matmul": a.astype(np.float64) @ b.astype(np.float64), "conv2d": conv,
                        "sum": np.array([values.astype(np.float64).sum()])}}


def _corrupt(tensor: Any, nan: bool = False) -> Any:
    """``tensor`` with its first element off by one (``nan``: NaN): what the seam injects."""
    import tensorflow as tf  # noqa: PLC0415

    flat = tf.reshape(tensor, [-1])
    if nan:
        flat = tf.tensor_scatter_nd_update(flat, [[0]], tf.constant([math.nan], flat.dtype))
    else:
        flat = tf.tensor_scatter_nd_add(flat, [[0]], tf.constant([1.0], flat.dtype))
    return tf.reshape(flat, tf.shape(tensor))


def _inject(tensor: Any, device: str, faults: Faults) -> Any:
    """The seam: ``tensor`` as ``device`` gives it, faulty when :data:`FAULTS_ENV` names it."""
    name = device.lower()
    if name in faults.nan:
        return _corrupt(tensor, nan=True)
    return _corrupt(tensor) if name in faults.wrong else tensor


def _compare(device: str, op: str, got: Any, want: Any, tolerance: float) -> StepCheck:
    import numpy as np  # noqa: PLC0415

    got = np.asarray(got, np.float64).reshape(-1)
    want = np.asarray(want, np.float64).reshape(-1)
    finite = np.isfinite(got)
    error = np.abs(np.where(finite, got, 0.0) - want)
    wrong = int(np.sum(finite & (error > tolerance * np.maximum(1.0, np.abs(want)))))
    return StepCheck(device, op, int(got.size), wrong, int(np.sum(~finite)),
                     float(error[finite].max()) if finite.any() else 0.0)


def known_steps(devices: Sequence[str], faults: Faults, inputs: Optional[dict[str, Any]] = None) -> list[StepCheck]:
    """Each device's matmul, convolution and sum against NumPy's answers (:class:`StepCheck` per device and op)."""
    import tensorflow as tf  # noqa: PLC0415

    inputs = inputs or _inputs()
    answers = inputs["answers"]
    checks = []
    for device in devices:
        with tf.device(device):
            results = {
                "matmul": tf.matmul(tf.constant(inputs["a"]), tf.constant(inputs["b"])),
                "conv2d": tf.nn.conv2d(tf.constant(inputs["image"]), tf.constant(inputs["kernel"]), 1, "VALID"),
                "sum": tf.reshape(tf.reduce_sum(tf.constant(inputs["values"])), [1]),
            }
            results = {op: _inject(value, device, faults) for op, value in results.items()}
        for op, value in results.items():
            checks.append(_compare(device, op, value.numpy(), answers[op], 1e-3 if op == "conv2d" else 0.0))
    return checks


# ------------------------------------------------------------------ all-reduce


def implementations(devices: Sequence[str], configured: Optional[str], faults: Faults) -> list[str]:
    """The cross-device ops to check on ``devices``: the configured one first, then each other one that can work
    there (NCCL and hierarchical copy need GPUs, one per replica; with an injected NCCL fault, NCCL is checked on
    CPUs too, through the reduction to one device)."""
    gpus = all(d.lower().startswith("/gpu:") for d in devices) and len(set(devices)) == len(devices)
    possible = ["nccl", "hierarchical_copy", "reduce_to_one_device"] if gpus else ["reduce_to_one_device"]
    if faults.nccl_pairs and "nccl" not in possible:
        possible.insert(0, "nccl")
    ordered = [configured] if configured in possible else []
    return ordered + [name for name in possible if name not in ordered]


def _cross_device_ops(name: str, devices: Sequence[str]) -> Any:
    import tensorflow as tf  # noqa: PLC0415

    gpus = all(d.lower().startswith("/gpu:") for d in devices)
    if name == "nccl" and not gpus:  # the test seam's NCCL on CPUs (implementations)
        name = "reduce_to_one_device"
    return getattr(tf.distribute, IMPLEMENTATIONS[name])()


def all_reduce(devices: Sequence[str], indices: Sequence[int], name: str, configured: bool, faults: Faults,
               pattern: Any) -> ReduceCheck:
    """Sum ``(replica + 1) x pattern`` over ``devices`` with cross-device ops ``name``; check every replica's result
    is exactly ``n (n + 1) / 2 x pattern`` (:class:`ReduceCheck`)."""
    import tensorflow as tf  # noqa: PLC0415

    check = ReduceCheck(tuple(devices), tuple(indices), name, configured)
    try:
        strategy = tf.distribute.MirroredStrategy(devices=list(devices),
                                                  cross_device_ops=_cross_device_ops(name, devices))
        base = tf.constant(pattern)
        corrupt_pair = name == "nccl" and frozenset(indices) in faults.nccl_pairs

        def replica() -> Any:
            context = tf.distribute.get_replica_context()
            value = base * tf.cast(context.replica_id_in_sync_group + 1, tf.float32)
            for i, d in enumerate(devices):  # the seam: a faulty device's contribution
                if d.lower() in faults.wrong or d.lower() in faults.nan:
                    value = tf.cond(tf.equal(context.replica_id_in_sync_group, i),
                                    lambda d=d, v=value: _inject(v, d, faults), lambda v=value: v)
            total = context.all_reduce("sum", value)
            if corrupt_pair:  # the seam: this pair's NCCL sums wrong
                total = _corrupt(total)
            return total

        step = tf.function(lambda: strategy.run(replica))
        got: list = []
        best = _best_seconds(lambda: got.__setitem__(slice(None), [
            r.numpy() for r in strategy.experimental_local_results(step())]))  # each call reads every replica's
        wrong, nan = _sum_errors(got, pattern, len(devices))
        return ReduceCheck(check.devices, check.indices, name, configured, wrong, nan, best)
    except Exception as exc:  # noqa: BLE001 - a failing implementation is a finding, not a crash
        return ReduceCheck(check.devices, check.indices, name, configured,
                           error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def _sum_errors(results: Any, pattern: Any, n: int) -> tuple[int, int]:
    """``(wrong, nan)``: elements of ``results`` (every replica's, stacked or listed) that are not the exact sum
    ``n (n + 1) / 2 x pattern``, and those that are NaN or infinite."""
    import numpy as np  # noqa: PLC0415

    got = np.asarray(results, np.float64).reshape(-1, pattern.size)
    finite = np.isfinite(got)
    want = pattern.astype(np.float64) * (n * (n + 1) / 2)
    return int(np.sum(finite & (got != want))), int(np.sum(~finite))


def _best_seconds(call: Any) -> float:
    """The fastest of 3 timed calls of ``call`` after one untimed (:func:`tfgpu.devices.bench._time`), seconds."""
    from .bench import _time  # noqa: PLC0415

    return _time(call, 3).min_ms / 1e3


def reduce_groups(devices: Sequence[str]) -> list[tuple[int, ...]]:
    """The device groups to all-reduce over, as indices: every pair, and all of them when there are more than 2."""
    n = len(devices)
    pairs = list(itertools.combinations(range(n), 2))
    return ([tuple(range(n))] if n > 2 else []) + pairs


# ------------------------------------------------------------------ bandwidth


def gpu_link(nvml: Any, first: int, second: int) -> str:
    """The link NVML reports between two physical GPUs (NVML indices): ``NVLink``, ``PCIe P2P`` or ``through the
    host``; ``unknown`` when NVML cannot say.

    Wraps: ``nvmlDeviceGetP2PStatus`` with ``NVML_P2P_CAPS_INDEX_NVLINK`` and ``NVML_P2P_CAPS_INDEX_READ``.
    """
    try:
        a, b = nvml.nvmlDeviceGetHandleByIndex(first), nvml.nvmlDeviceGetHandleByIndex(second)
        if nvml.nvmlDeviceGetP2PStatus(a, b, nvml.NVML_P2P_CAPS_INDEX_NVLINK) == nvml.NVML_P2P_STATUS_OK:
            return "NVLink"
        if nvml.nvmlDeviceGetP2PStatus(a, b, nvml.NVML_P2P_CAPS_INDEX_READ) == nvml.NVML_P2P_STATUS_OK:
            return "PCIe P2P"
        return "through the host"
    except Exception:  # noqa: BLE001 - NVML missing, or too old for P2P status
        return "unknown"


def copy_bandwidth(source: str, target: str, link: str, nbytes: int) -> CopyCheck:
    """Copy ``nbytes`` of float32 from ``source`` to ``target`` (``tf.identity`` under ``tf.device``), the best of
    3 after one untimed, each ended by reading a scalar back; GB/s = bytes / seconds / 1e9."""
    import tensorflow as tf  # noqa: PLC0415

    with tf.device(source):
        x = tf.ones([nbytes // 4], tf.float32) + 0.0

    def once() -> None:
        with tf.device(target):
            tf.identity(x)[0].numpy()

    seconds = _best_seconds(once)
    return CopyCheck(source, target, nbytes, nbytes / seconds / 1e9 if seconds > 0 else math.inf, link,
                     LINK_FLOOR_GBPS.get(link))


# ------------------------------------------------------------------ the run


def run_smoke(devices: Sequence[str], configured: Optional[str], nvml_indices: Optional[Sequence[int]] = None,
              nvml: Any = None, faults: Optional[Faults] = None) -> SmokeReport:
    """Run the three checks on ``devices`` (TensorFlow must already be set up: :func:`tfgpu.setup`).

    Args:
        devices: the logical devices the config trains on (its strategy's), e.g. ``("/gpu:0", "/gpu:1")``.
        configured: the config's resolved cross-device ops (the plan's), or ``None``.
        nvml_indices: each device's physical GPU as NVML counts them (for the links), or ``None``.
        nvml: NVML bindings (``pynvml``), or ``None`` (links ``unknown`` between GPUs).
        faults: injected faults (default: from :data:`FAULTS_ENV`).

    Returns:
        A :class:`SmokeReport`; :func:`verdicts` turns it into findings.

    Raises:
        ValueError: :data:`FAULTS_ENV` holds an unknown fault.
    """
    started = time.perf_counter()
    faults = faults if faults is not None else Faults.from_env()
    inputs = _inputs()
    report = SmokeReport(tuple(devices), configured, faults=os.environ.get(FAULTS_ENV, "") if faults else "")
    report.steps = known_steps(devices, faults, inputs)
    pattern = inputs["values"]
    if len(devices) > 1:
        for group in reduce_groups(devices):
            members = [devices[i] for i in group]
            for name in implementations(members, configured, faults):
                report.reduces.append(all_reduce(members, group, name, name == configured, faults, pattern))
        for i, j in itertools.combinations(range(len(devices)), 2):
            source, target = devices[i], devices[j]
            on_gpus = source.lower().startswith("/gpu:") and target.lower().startswith("/gpu:")
            if on_gpus and nvml_indices is not None and nvml is not None:
                a, b = nvml_indices[i], nvml_indices[j]
                link = "same GPU (logical devices)" if a == b else gpu_link(nvml, a, b)
            else:
                link = "host memory (logical devices)" if not on_gpus else "unknown"
            report.copies.append(copy_bandwidth(source, target, link, COPY_BYTES["GPU" if on_gpus else "CPU"]))
    report.seconds = time.perf_counter() - started
    return report


# ------------------------------------------------------------------ verdicts


def _devices_text(indices: Sequence[int], devices: Sequence[str]) -> str:
    return " + ".join(devices[i] for i in indices)


def verdicts(report: SmokeReport) -> list[Finding]:
    """The findings of a :class:`SmokeReport`: one ``ok`` per check that passed everywhere, one error per fault,
    each with its fix. Pure."""
    findings: list[Finding] = []
    bad_devices = sorted({s.device for s in report.steps if not s.ok})
    for device in bad_devices:
        failed = [s for s in report.steps if s.device == device and not s.ok]
        what = "; ".join(f"{s.op}: " + ", ".join(
            ([f"{s.wrong} of {s.elements} elements wrong (max error {s.max_error:g})"] if s.wrong else [])
            + ([f"{s.nan} of {s.elements} NaN or infinite"] if s.nan else [])) for s in failed)
        findings.append(Finding(
            "smoke-device", "error", f"Known step on {device}",
            f"{device} does not compute what the host computes: {what}.",
            "train without it (devices.visible_gpus: the others, or CUDA_VISIBLE_DEVICES), and check the GPU: "
            "'nvidia-smi -q -d ECC,TEMPERATURE' for ECC errors and heat, 'dmesg | grep -i xid' for Xid errors; "
            "a GPU that keeps failing needs a reset or a replacement."))
    if report.steps and not bad_devices:
        findings.append(Finding("smoke-device", "ok", "Known step on each device",
                                f"{len(report.devices)} device(s): matmul, conv2d and sum match the host's answer"))
    groups: dict[tuple[int, ...], list[ReduceCheck]] = {}
    for r in report.reduces:
        groups.setdefault(r.indices, []).append(r)
    failing_groups = 0
    for indices, checks in groups.items():
        bad = [c for c in checks if not c.ok]
        if not bad:
            continue
        failing_groups += 1
        good = [c.implementation for c in checks if c.ok]
        where = _devices_text(indices, report.devices)
        seen = "; ".join(f"{c.implementation}: " + (c.error or f"{c.wrong} wrong, {c.nan} NaN/inf element(s)")
                         for c in bad)
        bad_here = [d for d in (report.devices[i] for i in indices) if d in bad_devices]
        if bad_here:
            fix = f"a device computes wrong values ({', '.join(bad_here)}: see its known step); fix that first."
        elif good and [c.implementation for c in bad] == ["nccl"]:
            fix = (f"NCCL sums wrong between these devices and {', '.join(good)} sums right: the usual cause is "
                   "PCIe ACS or the IOMMU breaking NCCL's peer-to-peer path (NVIDIA/nccl#631). Set "
                   "distribute.cross_device_ops: " + good[0] + " in the recipe, or keep NCCL without peer-to-peer "
                   "with NCCL_P2P_DISABLE=1 in the environment; for good, disable ACS in the BIOS or set "
                   "iommu=pt on the kernel command line.")
        elif good:
            fix = f"set distribute.cross_device_ops: {good[0]} (it sums right here)."
        else:
            fix = ("no cross-device ops sum right between these devices: check the GPUs and their links "
                   "('nvidia-smi topo -m', 'dmesg | grep -i xid') and train without one of them.")
        findings.append(Finding("smoke-all-reduce", "error", f"All-reduce over {where}",
                                f"{seen} (the exact sum is known).", fix))
    if groups and not failing_groups:
        names = sorted({r.implementation for r in report.reduces})
        findings.append(Finding("smoke-all-reduce", "ok", "All-reduce",
                                f"{len(groups)} device group(s) x {', '.join(names)}: exact sums on every replica"))
    for c in report.copies:
        if not c.ok:
            findings.append(Finding(
                "smoke-bandwidth", "warning", f"Copy {c.source} -> {c.target}",
                f"{c.gbps:.1f} GB/s over {c.link}, where {c.link} should give at least {c.floor_gbps:g} GB/s.",
                "peer-to-peer copies may be falling back through the host: check 'nvidia-smi topo -m' and "
                "'nvidia-smi topo -p2p r'; PCIe ACS or the IOMMU can disable P2P (disable ACS, or iommu=pt). If "
                "all-reduce also sums wrong between them, set distribute.cross_device_ops: hierarchical_copy."))
    return findings


def describe(report: SmokeReport) -> str:
    """The table ``tfgpu doctor --smoke`` prints."""
    lines = [f"Smoke test on {len(report.devices)} device(s) ({', '.join(report.devices)}), "
             f"{report.backend}; cross-device ops {report.configured or '-'}; {report.seconds:.1f} s"]
    if report.faults:
        lines.append(f"  (faults injected by {FAULTS_ENV}: {report.faults})")
    rows: list[tuple[str, str, str]] = []
    for device in report.devices:
        steps = [s for s in report.steps if s.device == device]
        result = "exact" if all(s.ok and s.max_error == 0 for s in steps) else "; ".join(
            f"{s.op} " + ("ok" if s.ok else f"{s.wrong} wrong, {s.nan} NaN") for s in steps)
        rows.append(("known step (matmul, conv2d, sum)", device, result))
    for r in report.reduces:
        label = f"all-reduce {r.implementation}" + (" (configured)" if r.configured else "")
        result = (f"exact, {r.seconds * 1000:.1f} ms for {REDUCE_ELEMENTS * 4 >> 20} MiB" if r.ok
                  else r.error or f"WRONG: {r.wrong} wrong, {r.nan} NaN/inf")
        rows.append((label, _devices_text(r.indices, report.devices), result))
    for c in report.copies:
        floor = f", at least {c.floor_gbps:g} expected" if c.floor_gbps is not None else ""
        rows.append(("copy bandwidth", f"{c.source} -> {c.target}",
                     f"{c.gbps:.1f} GB/s ({c.nbytes >> 20} MiB) over {c.link}{floor}"))
    return "\n".join([*lines, *("  " + line for line in table_lines(("check", "devices", "result"), rows))])


# ------------------------------------------------------------------ JAX


def run_smoke_jax(devices: Sequence[Any], faults: Optional[Faults] = None) -> SmokeReport:
    """The same checks through JAX (``backend: jax``) on ``devices`` (``jax.Device`` objects): the known step with
    ``jnp.matmul``, ``lax.conv_general_dilated`` and ``jnp.sum`` on each device; the all-reduce with
    ``jax.lax.psum`` under ``jax.shard_map`` (XLA chooses the collective: ``implementation`` ``xla_psum``); copies with
    ``jax.device_put``. Fault names are the devices' Keras names (``cpu:1``, ``gpu:0``).

    Wraps: https://docs.jax.dev/en/latest/_autosummary/jax.lax.psum.html and
    https://docs.jax.dev/en/latest/_autosummary/jax.shard_map.html
    """
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    started = time.perf_counter()
    faults = faults if faults is not None else Faults.from_env()
    names = [f"{d.platform}:{d.id}" for d in devices]
    inputs = _inputs()
    report = SmokeReport(tuple(names), "xla_psum", backend="jax", faults=os.environ.get(FAULTS_ENV, "") if faults
                         else "")

    def injected(value: Any, name: str) -> Any:
        if name in faults.nan:
            return value.reshape(-1).at[0].set(jnp.nan).reshape(value.shape)
        if name in faults.wrong:
            return value.reshape(-1).at[0].add(1.0).reshape(value.shape)
        return value

    for device, name in zip(devices, names):
        a, b, image, kernel, values = (jax.device_put(inputs[k], device)
                                       for k in ("a", "b", "image", "kernel", "values"))
        results = {"matmul": jnp.matmul(a, b, precision="highest"),
                   "conv2d": jax.lax.conv_general_dilated(image, kernel, (1, 1), "VALID",
                                                          dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                          precision="highest"),
                   "sum": jnp.sum(values).reshape(1)}
        for op, value in results.items():
            report.steps.append(_compare(name, op, np.asarray(injected(value, name)), inputs["answers"][op],
                                         1e-3 if op == "conv2d" else 0.0))
    pattern = inputs["values"]
    if len(devices) > 1:
        for group in reduce_groups(names):
            members = [devices[i] for i in group]
            check = ReduceCheck(tuple(names[i] for i in group), group, "xla_psum", True)
            try:
                n = len(members)
                mesh = jax.sharding.Mesh(np.array(members), ("i",))
                shards = [injected(jax.device_put((pattern * (k + 1)).astype(np.float32), d), names[group[k]])
                          for k, d in enumerate(members)]
                stacked = jax.make_array_from_single_device_arrays(
                    (n * pattern.size,), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("i")), shards)
                summed = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh,
                                               in_specs=jax.sharding.PartitionSpec("i"),
                                               out_specs=jax.sharding.PartitionSpec("i")))
                got: list = []
                best = _best_seconds(lambda: got.__setitem__(slice(None), [np.asarray(summed(stacked))]))  # noqa: B023
                wrong, nan = _sum_errors(got, pattern, n)
                check = ReduceCheck(check.devices, group, "xla_psum", True, wrong, nan, best)
            except Exception as exc:  # noqa: BLE001 - a failing collective is a finding
                check = ReduceCheck(check.devices, group, "xla_psum", True, error=f"{type(exc).__name__}: {exc}")
            report.reduces.append(check)
        for i, j in itertools.combinations(range(len(devices)), 2):
            x = jax.device_put(np.ones(COPY_BYTES["CPU"] // 4, np.float32), devices[i])
            best = _best_seconds(lambda: jax.device_put(x, devices[j]).block_until_ready())  # noqa: B023
            gpu = devices[i].platform == "gpu"
            report.copies.append(CopyCheck(names[i], names[j], COPY_BYTES["CPU"], COPY_BYTES["CPU"] / best / 1e9,
                                           "unknown" if gpu else "host memory (logical devices)"))
    report.seconds = time.perf_counter() - started
    return report


def smoke_config(config: Any) -> SmokeReport:
    """Apply ``config``'s device settings in this process (:func:`tfgpu.setup`) and run the smoke test on the devices
    it trains on: its strategy's (TensorFlow) or its distribution's (JAX), else the one it has.

    Raises:
        ConfigError, DeviceError, AlreadyInitializedError: as :func:`tfgpu.setup`.
    """
    from .setup import setup  # noqa: PLC0415

    applied = setup(config)
    plan = applied.plan
    if applied.backend == "jax":
        import jax  # noqa: PLC0415

        wanted = set(plan.strategy.devices)
        devices = [d for d in jax.devices() if not wanted or f"{d.platform}:{d.id}" in wanted]
        return run_smoke_jax(devices)
    devices = list(plan.strategy.devices) or [("/gpu:0" if plan.gpus else "/cpu:0")]
    nvml = indices = None
    if plan.gpus:
        per_gpu = max(1, config.devices.gpu_logical_devices)
        try:
            import pynvml as nvml  # noqa: PLC0415

            nvml.nvmlInit()
            indices = [plan.gpus[int(d.rsplit(":", 1)[1]) // per_gpu].nvml_index if d.startswith("/gpu:") else None
                       for d in devices]
        except Exception:  # noqa: BLE001 - no NVML: the links are "unknown"
            nvml = None
    return run_smoke(devices, plan.strategy.cross_device_ops if len(devices) > 1 else None, indices, nvml)
