"""Peak throughput of NVIDIA GPUs, the denominator of model FLOPs utilisation (MFU).

MFU is the FLOP/s a training step achieves (the model's floating-point operations per step over
the step's wall time) divided by the GPU's peak FLOP/s in the precision the step computes in.
:data:`GPU_PEAKS` holds that peak for the GPUs tfgpu is run on, one :class:`GpuPeak` per product,
in **TFLOPS** (10^12 floating-point operations per second, a multiply-add counted as two):

- **dense** figures only. NVIDIA's datasheets print most tensor-core figures "with sparsity"
  (2:4 structured sparsity, which doubles them); a dense matmul, which is what a Keras model
  runs, never reaches those, so every such figure here is the printed one halved (the comment
  on each entry says where that was done);
- at the **boost clock** the datasheet or whitepaper assumes (a card that runs at a lower
  clock, held back by power or temperature, reaches proportionally less);
- per **whole GPU**: a MIG slice (``find_gpu`` returns the full GPU's entry) has a fraction of
  the SMs, and the caller scales by it;
- from NVIDIA's datasheets, product pages and architecture whitepapers (``GpuPeak.source``,
  the document each entry's figures come from). The A10G, AWS's variant of the A10, is the one
  exception: NVIDIA publishes no datasheet for it (see its entry).

The columns are the ones tfgpu's precision settings compute in: ``float32`` (CUDA cores, no
tensor cores), ``tf32`` (what float32 matmuls and convolutions run on by default on Ampere and
later, where TensorFlow enables TF32), ``float16`` (``mixed_float16``: FP16 inputs, FP32
accumulation on the tensor cores) and ``bfloat16`` (``mixed_bfloat16``). :func:`peak_flops`
picks the column for a precision and returns FLOP/s.

Names are matched from what NVML and ``nvidia-smi`` report (:func:`find_gpu`). Only the
standard library is imported: no TensorFlow, JAX or numpy.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

__all__ = ["GPU_PEAKS", "PRECISIONS", "GpuPeak", "find_gpu", "peak_flops"]


@dataclass(frozen=True)
class GpuPeak:
    """One GPU's dense peak throughput, in TFLOPS, at its boost clock.

    Attributes:
        name: the table's canonical name, e.g. ``"H100 SXM"``; :func:`find_gpu` accepts it too.
        float32: peak FP32 on the CUDA cores (non-tensor).
        tf32: dense TF32 on the tensor cores, or ``None`` where the GPU has no TF32 (before Ampere).
        float16: dense FP16 on the tensor cores with FP32 accumulate (what ``mixed_float16``
            runs). Data-centre and workstation GPUs run FP32 accumulate at the FP16-accumulate
            rate; GeForce cards run it at half that rate, and this column holds the
            FP32-accumulate figure (half the one NVIDIA headlines). The P100 has no tensor cores:
            its column is FP16 on the CUDA cores.
        bfloat16: dense BF16 on the tensor cores, or ``None`` where the GPU has no BF16 (before Ampere).
        source: the URL of the NVIDIA datasheet, product page or architecture whitepaper the
            figures come from.
    """

    name: str
    float32: float
    tf32: Optional[float]
    float16: float
    bfloat16: Optional[float]
    source: str


_HGX = "https://www.nvidia.com/en-us/data-center/hgx/"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_HOPPER_WP = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
_H100 = "https://www.nvidia.com/en-us/data-center/h100/"
_GH200 = "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/"
_A100 = "https://www.nvidia.com/en-us/data-center/a100/"
_GA102_WP = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
_ADA_WP = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_BLACKWELL_RTX_WP = ("https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
                     "nvidia-rtx-blackwell-gpu-architecture.pdf")
_TURING_WP = ("https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/"
              "turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf")
_V100 = "https://www.nvidia.com/en-us/data-center/v100/"
_P100 = "https://www.nvidia.com/en-us/data-center/tesla-p100/"

#: The table, in TFLOPS, dense, at boost clock (see the module docstring). "sparse/2": the source
#: prints the figure with sparsity and the entry holds half of it.
GPU_PEAKS: tuple[GpuPeak, ...] = (
    # --- Data centre: Blackwell, Hopper ---
    # HGX B200 (1000 W), per GPU: FP32 75; TF32 2.2 PFLOPS, FP16/BF16 4.5 PFLOPS with sparsity.
    # TF32 sparse/2 of the unrounded 2.25 PFLOPS (18 PFLOPS for 8 GPUs), i.e. half the FP16 rate.
    GpuPeak("B200", 75.0, 1125.0, 2250.0, 2250.0, _HGX),
    # H200 datasheet: FP32 67; TF32 989, BF16/FP16 1,979 with sparsity: sparse/2.
    GpuPeak("H200 SXM", 67.0, 494.5, 989.5, 989.5, _H200),
    # H200 NVL (PCIe card): FP32 60; TF32 835, BF16/FP16 1,671 with sparsity: sparse/2.
    GpuPeak("H200 NVL", 60.0, 417.5, 835.5, 835.5, _H200),
    # Hopper whitepaper (dense/sparse columns, dense taken): H100 SXM5 FP32 66.9, TF32 494.7,
    # FP16 (FP32 accumulate) and BF16 989.4. The H100 datasheet rounds these to 67 / 989* / 1,979*.
    GpuPeak("H100 SXM", 66.9, 494.7, 989.4, 989.4, _HOPPER_WP),
    # Hopper whitepaper, H100 PCIe: FP32 51.2, TF32 378, FP16/BF16 756 (dense column).
    GpuPeak("H100 PCIe", 51.2, 378.0, 756.0, 756.0, _HOPPER_WP),
    # H100 datasheet, H100 NVL (per GPU): FP32 60; TF32 835, BF16/FP16 1,671 with sparsity: sparse/2.
    GpuPeak("H100 NVL", 60.0, 417.5, 835.5, 835.5, _H100),
    # GH200 datasheet (the Hopper GPU of the superchip): FP32 67; TF32 989, BF16/FP16 1,979
    # with sparsity: sparse/2.
    GpuPeak("GH200", 67.0, 494.5, 989.5, 989.5, _GH200),
    # --- Data centre: Ampere ---
    # A100 datasheet (40 GB and 80 GB alike, SXM and PCIe alike): FP32 19.5; TF32 156 | 312*,
    # BF16/FP16 312 | 624* (dense | sparse): dense column.
    GpuPeak("A100 SXM", 19.5, 156.0, 312.0, 312.0, _A100),
    GpuPeak("A100 PCIe", 19.5, 156.0, 312.0, 312.0, _A100),
    # A30 datasheet: FP32 10.3; TF32 82 | 165*, BF16/FP16 165 | 330*: dense column.
    GpuPeak("A30", 10.3, 82.0, 165.0, 165.0, "https://www.nvidia.com/en-us/data-center/products/a30-gpu/"),
    # A10 datasheet: FP32 31.2; TF32 62.5 | 125*, BF16/FP16 125 | 250*: dense column.
    GpuPeak("A10", 31.2, 62.5, 125.0, 125.0, "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"),
    # A10G (AWS G5 instances): GA102 with 80 SMs at a 1,710 MHz boost, tensor cores at the GeForce
    # rate (FP32 accumulate at half the FP16-accumulate rate). NVIDIA publishes no datasheet for
    # it and AWS's G5 page (the source) gives no per-precision figures: these are the ones
    # commonly quoted for it (FP32 35, TF32 35 | 70*, BF16/FP16 70 | 140*), which agree with
    # 80 SMs x 1.71 GHz at GA102's per-SM rates. The least certain entry in the table.
    GpuPeak("A10G", 35.0, 35.0, 70.0, 70.0, "https://aws.amazon.com/ec2/instance-types/g5/"),
    # A40 datasheet: FP32 37.4; TF32 74.8 | 149.6*, BF16/FP16 149.7 | 299.4*: dense column.
    GpuPeak("A40", 37.4, 74.8, 149.7, 149.7, "https://www.nvidia.com/en-us/data-center/a40/"),
    # --- Data centre: Ada ---
    # L4 datasheet: FP32 30.3; TF32 120, BF16/FP16 242 with sparsity: sparse/2.
    GpuPeak("L4", 30.3, 60.0, 121.0, 121.0, "https://www.nvidia.com/en-us/data-center/l4/"),
    # L40 datasheet: FP32 90.5; TF32 90.5 | 181*, BF16/FP16 181.05 | 362.1*: dense column.
    GpuPeak("L40", 90.5, 90.5, 181.05, 181.05, "https://www.nvidia.com/en-us/data-center/l40/"),
    # L40S datasheet: FP32 91.6; TF32 366, BF16/FP16 733 with sparsity: sparse/2.
    GpuPeak("L40S", 91.6, 183.0, 366.5, 366.5, "https://www.nvidia.com/en-us/data-center/l40s/"),
    # --- Data centre: Volta, Turing, Pascal (no TF32, no BF16) ---
    # V100 datasheet: SXM2 FP32 15.7, tensor 125; PCIe FP32 14, tensor 112 (no sparsity before Ampere).
    GpuPeak("V100 SXM2", 15.7, None, 125.0, None, _V100),
    GpuPeak("V100 PCIe", 14.0, None, 112.0, None, _V100),
    # T4 datasheet: FP32 8.1, mixed precision (FP16/FP32) 65.
    GpuPeak("T4", 8.1, None, 65.0, None, "https://www.nvidia.com/en-us/data-center/tesla-t4/"),
    # P100 datasheet: no tensor cores; FP16 on the CUDA cores at twice the FP32 rate.
    # SXM2 FP32 10.6, FP16 21.2; PCIe FP32 9.3, FP16 18.7.
    GpuPeak("P100 SXM2", 10.6, None, 21.2, None, _P100),
    GpuPeak("P100 PCIe", 9.3, None, 18.7, None, _P100),
    # --- Workstation (full-rate FP32 accumulate) ---
    # GA102 whitepaper, appendix C (RTX A6000): FP32 38.7; TF32 77.4 | 154.8*, FP16 (FP32
    # accumulate) and BF16 154.8 | 309.7*: dense column. The datasheet prints 309.7 (sparse).
    GpuPeak("RTX A6000", 38.7, 77.4, 154.8, 154.8, _GA102_WP),
    # Ada whitepaper (RTX 6000 Ada): FP32 91.1; TF32 182.1 | 364.2*, FP16 (FP32 accumulate)
    # and BF16 364.2 | 728.5*: dense column.
    GpuPeak("RTX 6000 Ada", 91.1, 182.1, 364.2, 364.2, _ADA_WP),
    # --- GeForce: float16 is FP16 tensor with FP32 accumulate, half the FP16-accumulate figure ---
    # GA102 whitepaper (RTX 3090): FP32 35.6; TF32 35.6 | 71*; FP16 with FP32 accumulate
    # 71 | 142* (with FP16 accumulate 142 | 284*); BF16 71 | 142*: dense column.
    GpuPeak("GeForce RTX 3090", 35.6, 35.6, 71.0, 71.0, _GA102_WP),
    # GA102 whitepaper (RTX 3080): FP32 29.8; TF32 29.8 | 59.5*; FP16 with FP32 accumulate
    # 59.5 | 119* (with FP16 accumulate 119 | 238*); BF16 59.5 | 119*: dense column.
    GpuPeak("GeForce RTX 3080", 29.8, 29.8, 59.5, 59.5, _GA102_WP),
    # Ada whitepaper (RTX 4090): FP32 82.6; TF32 82.6 | 165.2*; FP16 with FP32 accumulate
    # 165.2 | 330.4* (with FP16 accumulate 330.3 | 660.6*); BF16 165.2 | 330.4*: dense column.
    GpuPeak("GeForce RTX 4090", 82.6, 82.6, 165.2, 165.2, _ADA_WP),
    # Ada whitepaper (RTX 4080): FP32 48.7; TF32 48.7 | 97.5*; FP16 with FP32 accumulate
    # 97.5 | 194.9* (with FP16 accumulate 194.9 | 389.9*); BF16 97.5 | 194.9*: dense column.
    GpuPeak("GeForce RTX 4080", 48.7, 48.7, 97.5, 97.5, _ADA_WP),
    # RTX Blackwell whitepaper (RTX 5090): FP32 104.8; TF32 104.8 | 209.5*; FP16 with FP32
    # accumulate 209.5 | 419* (with FP16 accumulate 419 | 838*); BF16 209.5 | 419*: dense column.
    GpuPeak("GeForce RTX 5090", 104.8, 104.8, 209.5, 209.5, _BLACKWELL_RTX_WP),
    # Turing whitepaper (RTX 2080 Ti, reference boost 1,545 MHz; the Founders Edition's 1,635 MHz
    # gives 14.2 / 56.9): FP32 13.4; FP16 with FP32 accumulate 53.8 (with FP16 accumulate
    # 107.6). No TF32, no BF16, no sparsity.
    GpuPeak("GeForce RTX 2080 Ti", 13.4, None, 53.8, None, _TURING_WP),
)

#: tfgpu's precision names (``train.mixed_precision`` once resolved) that :func:`peak_flops` accepts.
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")

#: Entries whose ``float16`` column is not on tensor cores (the GPU has none).
_NO_TENSOR_CORES = frozenset({"P100 SXM2", "P100 PCIe"})

_BY_NAME = {gpu.name: gpu for gpu in GPU_PEAKS}

#: Words a name carries that say nothing of the product: the vendor and brand, memory size and type.
_NOISE = re.compile(r"nvidia|geforce|tesla|\d+(?:gb|gib|g)|hbm\d*e?|gddr\d+x?")

#: GPUs sold in more than one form: first word -> (form word -> entry), entry when no form word is known.
_FAMILIES: dict[str, tuple[dict[str, str], str]] = {
    "h100": ({"pcie": "H100 PCIe", "nvl": "H100 NVL"}, "H100 SXM"),
    "h200": ({"nvl": "H200 NVL"}, "H200 SXM"),
    "a100": ({"pcie": "A100 PCIe"}, "A100 SXM"),
    "v100": ({"pcie": "V100 PCIe"}, "V100 SXM2"),
    "p100": ({"pcie": "P100 PCIe"}, "P100 SXM2"),
}

#: Every other GPU: the whole normalized name -> entry (so "a10" is not "a100", "l40" not "l40s",
#: "rtx 4080" not "rtx 4080 super", "rtx 4090" not "rtx 4090 laptop gpu").
_EXACT: dict[str, str] = {
    "b200": "B200",
    "gh200": "GH200",
    "a30": "A30",
    "a10": "A10",
    "a10g": "A10G",
    "a40": "A40",
    "l4": "L4",
    "l40": "L40",
    "l40s": "L40S",
    "t4": "T4",
    "rtx a6000": "RTX A6000",
    "rtx 6000 ada": "RTX 6000 Ada",
    "rtx 6000 ada generation": "RTX 6000 Ada",
    "rtx 3090": "GeForce RTX 3090",
    "rtx 3080": "GeForce RTX 3080",
    "rtx 4090": "GeForce RTX 4090",
    "rtx 4080": "GeForce RTX 4080",
    "rtx 5090": "GeForce RTX 5090",
    "rtx 2080 ti": "GeForce RTX 2080 Ti",
}


def _words(name: str) -> list[str]:
    """``name`` lower-cased, cut before a MIG profile, split on anything not a letter or digit,
    without the words that do not identify the product (:data:`_NOISE`)."""
    text = re.split(r"\bmig\b", name.lower(), maxsplit=1)[0]
    return [w for w in re.split(r"[^a-z0-9]+", text) if w and not _NOISE.fullmatch(w)]


def find_gpu(name: str) -> Optional[GpuPeak]:
    """The table's entry for a GPU named as NVML / ``nvidia-smi`` (or this table) names it.

    Case does not matter, nor do the vendor and brand words (``NVIDIA``, ``GeForce``,
    ``Tesla``), the memory size and type (``80GB``, ``HBM3``) or punctuation:
    ``"NVIDIA H100 80GB HBM3"`` is the H100 SXM, ``"NVIDIA A100-PCIE-40GB"`` and
    ``"NVIDIA A100 80GB PCIe"`` the A100 PCIe, ``"Tesla V100-SXM2-16GB"`` the V100 SXM2.

    A MIG instance (``"NVIDIA A100-SXM4-40GB MIG 1g.5gb"``) gives its full GPU's entry: the
    caller scales the peak by the slice's share of the SMs.

    An H100, H200, A100, V100 or P100 whose name says no form the table knows (``"NVIDIA H100"``,
    ``"NVIDIA H200"``, ``"NVIDIA A100-SXM4-80GB"``) is taken as the SXM part: ``PCIe`` and ``NVL``
    are the only forms told apart, and within a product they only lower the peak, so an unknown
    form is reported at the highest peak (MFU comes out no higher than it is).

    Every other GPU must be named exactly, up to the words above: ``"A10"`` is not ``"A100"``,
    ``"L40"`` is not ``"L40S"``, ``"GeForce RTX 4080 SUPER"``, ``"... RTX 3090 Ti"`` and
    ``"... RTX 4090 Laptop GPU"`` are not in the table and give ``None``.

    Args:
        name: the GPU's name, e.g. ``pynvml.nvmlDeviceGetName`` or
            ``nvidia-smi --query-gpu=name``, or a canonical :attr:`GpuPeak.name`.

    Returns:
        The :class:`GpuPeak`, or ``None`` for a GPU the table does not hold.
    """
    words = _words(name)
    if not words:
        return None
    family = _FAMILIES.get(words[0])
    if family is not None:
        forms, default = family
        found = [forms[w] for w in words[1:] if w in forms]
        return _BY_NAME[found[0] if found else default]
    entry = _EXACT.get(" ".join(words))
    return _BY_NAME[entry] if entry is not None else None


def peak_flops(name: str, precision: str, tf32: bool = True) -> Optional[tuple[float, str]]:
    """A GPU's dense peak in FLOP/s for one of tfgpu's precisions, and which column that is.

    The column: ``"float32"``: TF32 tensor cores when ``tf32`` is true and the GPU has TF32
    (TensorFlow runs float32 matmuls and convolutions in TF32 on Ampere and later unless
    ``tf.config.experimental.enable_tensor_float_32_execution(False)``), else FP32 on the CUDA
    cores; ``"mixed_float16"``: FP16 tensor cores with FP32 accumulate; ``"mixed_bfloat16"``:
    BF16 tensor cores.

    Args:
        name: the GPU's name as :func:`find_gpu` takes it (NVML's name, MIG instances included:
            the full GPU's peak is returned).
        precision: ``"float32"``, ``"mixed_float16"`` or ``"mixed_bfloat16"``.
        tf32: whether float32 matmuls run in TF32 (only read for ``"float32"``).

    Returns:
        ``(flops, description)``: the peak in FLOP/s (the table's TFLOPS x 1e12) and a short
        description of the column, e.g. ``"TF32 tensor cores, dense, H100 SXM"``; ``None`` when
        the GPU is not in the table, or for ``"mixed_bfloat16"`` on a GPU without BF16 (before
        Ampere).

    Raises:
        ValueError: ``precision`` is not one of :data:`PRECISIONS` (checked before the name).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    gpu = find_gpu(name)
    if gpu is None:
        return None
    if precision == "float32":
        if tf32 and gpu.tf32 is not None:
            return gpu.tf32 * 1e12, f"TF32 tensor cores, dense, {gpu.name}"
        why = "TF32 off" if gpu.tf32 is not None else "no TF32 on this GPU"
        return gpu.float32 * 1e12, f"FP32 CUDA cores (non-tensor; {why}), {gpu.name}"
    if precision == "mixed_float16":
        if gpu.name in _NO_TENSOR_CORES:
            return gpu.float16 * 1e12, f"FP16 CUDA cores (no tensor cores), {gpu.name}"
        return gpu.float16 * 1e12, f"FP16 tensor cores with FP32 accumulate, dense, {gpu.name}"
    if gpu.bfloat16 is None:
        return None
    return gpu.bfloat16 * 1e12, f"BF16 tensor cores, dense, {gpu.name}"


# ------------------------------------------------------------------ CPUs: this machine's own matmul figure

#: The float32 matmul size whose throughput stands for a CPU's peak (``tfgpu bench matmul``'s largest default).
CPU_PEAK_SIZE = 1024


def cpu_key() -> str:
    """This machine's CPU as the cache names it: ``model name`` from /proc/cpuinfo and the cores this process may
    use, e.g. ``"Intel(R) Xeon(R) Platinum 8488C x 2 cores"``."""
    from .probe import read_cpu  # noqa: PLC0415

    model = read_cpu()[0] or "unknown CPU"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return f"{model} x {cores} core{'s' if cores != 1 else ''}"


def cpu_peak_path() -> Path:
    """``$XDG_CACHE_HOME/tfgpu/cpu_peak.json`` (``~/.cache/tfgpu/cpu_peak.json``): each CPU's best float32 matmul
    figure, in FLOP/s."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfgpu" / "cpu_peak.json"


def read_cpu_peak(key: Optional[str] = None) -> Optional[tuple[float, str]]:
    """This CPU's recorded peak: ``(FLOP/s, where it came from)``, or ``None`` when none is recorded."""
    try:
        entry = json.loads(cpu_peak_path().read_text()).get(key or cpu_key())
        return float(entry["flops"]), str(entry["source"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_cpu_peak(flops: float, source: str, key: Optional[str] = None) -> None:
    """Record this CPU's peak (FLOP/s) and its source; a cache that cannot be written is left as it is."""
    path = cpu_peak_path()
    try:
        known = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    known[key or cpu_key()] = {"flops": flops, "source": source}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=2))
        tmp.replace(path)
    except OSError:
        pass
