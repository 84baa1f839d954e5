"""The peak-throughput table behind MFU: NVML names find the right entry, peaks come in FLOP/s from
the right column, and every entry is dense, positive and sourced. Pure data: no TensorFlow, no GPU."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from tfgpu.devices import peaks
from tfgpu.devices.peaks import GPU_PEAKS, PRECISIONS, GpuPeak, find_gpu, peak_flops

#: What NVML / nvidia-smi report -> the table's canonical name.
NVML_NAMES = {
    "NVIDIA B200": "B200",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA H200 NVL": "H200 NVL",
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA GH200 480GB": "GH200",
    "NVIDIA A100-SXM4-80GB": "A100 SXM",
    "NVIDIA A100-SXM4-40GB": "A100 SXM",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe",
    "NVIDIA A100 80GB PCIe": "A100 PCIe",
    "NVIDIA A30": "A30",
    "NVIDIA A10": "A10",
    "NVIDIA A10G": "A10G",
    "NVIDIA A40": "A40",
    "NVIDIA L4": "L4",
    "NVIDIA L40": "L40",
    "NVIDIA L40S": "L40S",
    "Tesla V100-SXM2-16GB": "V100 SXM2",
    "Tesla V100-SXM2-32GB": "V100 SXM2",
    "Tesla V100-PCIE-32GB": "V100 PCIe",
    "Tesla T4": "T4",
    "Tesla P100-PCIE-16GB": "P100 PCIe",
    "Tesla P100-SXM2-16GB": "P100 SXM2",
    "NVIDIA RTX A6000": "RTX A6000",
    "NVIDIA RTX 6000 Ada Generation": "RTX 6000 Ada",
    "NVIDIA GeForce RTX 3090": "GeForce RTX 3090",
    "NVIDIA GeForce RTX 3080": "GeForce RTX 3080",
    "NVIDIA GeForce RTX 4090": "GeForce RTX 4090",
    "NVIDIA GeForce RTX 4080": "GeForce RTX 4080",
    "NVIDIA GeForce RTX 5090": "GeForce RTX 5090",
    "NVIDIA GeForce RTX 2080 Ti": "GeForce RTX 2080 Ti",
    # MIG instances: the full GPU's entry (the caller scales by the slice).
    "NVIDIA A100-SXM4-40GB MIG 1g.5gb": "A100 SXM",
    "NVIDIA A100-SXM4-80GB MIG 3g.40gb": "A100 SXM",
    "NVIDIA H100 80GB HBM3 MIG 1g.10gb": "H100 SXM",
    "NVIDIA A30 MIG 2g.12gb": "A30",
}


@pytest.mark.parametrize("nvml_name, canonical", sorted(NVML_NAMES.items()))
def test_an_nvml_name_finds_its_entry(nvml_name, canonical):
    gpu = find_gpu(nvml_name)
    assert gpu is not None and gpu.name == canonical


def test_matching_ignores_case_and_punctuation():
    assert find_gpu("nvidia a100-sxm4-40gb").name == "A100 SXM"
    assert find_gpu("NVIDIA GEFORCE RTX 4090").name == "GeForce RTX 4090"
    assert find_gpu("  tesla t4  ").name == "T4"
    assert find_gpu("NVIDIA_H100_PCIe").name == "H100 PCIe"


def test_every_entry_is_found_by_its_own_name_and_names_are_unique():
    assert len({gpu.name for gpu in GPU_PEAKS}) == len(GPU_PEAKS)
    for gpu in GPU_PEAKS:
        assert find_gpu(gpu.name) is gpu


def test_a_name_that_is_a_prefix_of_another_is_not_confused_with_it():
    assert find_gpu("NVIDIA A10").name == "A10"
    assert find_gpu("NVIDIA A100-PCIE-40GB").name == "A100 PCIe"
    assert find_gpu("NVIDIA A10G").name == "A10G"
    assert find_gpu("NVIDIA L4").name == "L4"
    assert find_gpu("NVIDIA L40").name == "L40"
    assert find_gpu("NVIDIA L40S").name == "L40S"
    assert find_gpu("NVIDIA H200").name == "H200 SXM"
    assert find_gpu("NVIDIA GH200 480GB").name == "GH200"
    assert find_gpu("NVIDIA B200").name == "B200"


def test_h100_forms_are_told_apart_and_an_unknown_form_is_sxm():
    assert find_gpu("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert find_gpu("NVIDIA H100 NVL").name == "H100 NVL"
    assert find_gpu("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert find_gpu("NVIDIA H100").name == "H100 SXM"
    assert find_gpu("NVIDIA H100 SXM5 80GB").name == "H100 SXM"
    assert find_gpu("NVIDIA H100 PCIe").tf32 < find_gpu("NVIDIA H100 80GB HBM3").tf32


@pytest.mark.parametrize("name", [
    "",
    "   ",
    "NVIDIA GeForce RTX 4080 SUPER",
    "NVIDIA GeForce RTX 4090 D",
    "NVIDIA GeForce RTX 4090 Laptop GPU",
    "NVIDIA GeForce RTX 3090 Ti",
    "NVIDIA GeForce RTX 3080 Ti",
    "NVIDIA GeForce RTX 2080",
    "NVIDIA GB200",
    "NVIDIA H800",
    "NVIDIA H20",
    "NVIDIA A800-SXM4-80GB",
    "NVIDIA A100X",
    "Tesla V100S-PCIE-32GB",
    "Quadro RTX 6000",
    "NVIDIA RTX 6000",
    "NVIDIA L20",
    "Tesla K80",
    "AMD Instinct MI300X",
    "Apple M2",
    "cpu",
])
def test_an_unknown_name_gives_none(name):
    assert find_gpu(name) is None
    assert peak_flops(name, "float32") is None


def test_peak_flops_is_in_flops_from_the_table():
    h100 = find_gpu("NVIDIA H100 80GB HBM3")
    flops, what = peak_flops("NVIDIA H100 80GB HBM3", "float32")
    assert flops == pytest.approx(h100.tf32 * 1e12) == pytest.approx(494.7e12)
    assert "TF32" in what and "dense" in what and "H100 SXM" in what
    flops, what = peak_flops("NVIDIA H100 80GB HBM3", "float32", tf32=False)
    assert flops == pytest.approx(h100.float32 * 1e12) == pytest.approx(66.9e12)
    assert "FP32" in what and "TF32 off" in what
    assert peak_flops("NVIDIA H100 80GB HBM3", "mixed_float16")[0] == pytest.approx(h100.float16 * 1e12)
    assert peak_flops("NVIDIA H100 80GB HBM3", "mixed_bfloat16")[0] == pytest.approx(h100.bfloat16 * 1e12)


@pytest.mark.parametrize("name, precision, tflops", [
    # Well-known dense figures, as NVIDIA prints them (without sparsity).
    ("NVIDIA A100-SXM4-40GB", "float32", 156),
    ("NVIDIA A100-SXM4-80GB", "mixed_bfloat16", 312),
    ("NVIDIA A100-PCIE-40GB", "mixed_float16", 312),
    ("Tesla V100-SXM2-16GB", "mixed_float16", 125),
    ("Tesla V100-SXM2-16GB", "float32", 15.7),
    ("Tesla T4", "mixed_float16", 65),
    ("Tesla T4", "float32", 8.1),
    ("NVIDIA A10", "mixed_bfloat16", 125),
    ("NVIDIA L4", "mixed_float16", 121),
    ("NVIDIA GeForce RTX 4090", "mixed_float16", 165.2),
    ("NVIDIA GeForce RTX 3090", "mixed_bfloat16", 71),
    ("NVIDIA B200", "mixed_bfloat16", 2250),
])
def test_well_known_dense_values(name, precision, tflops):
    flops, _ = peak_flops(name, precision)
    assert flops == pytest.approx(tflops * 1e12)


def test_float32_without_tf32_hardware_uses_the_cuda_cores():
    flops, what = peak_flops("Tesla V100-PCIE-32GB", "float32", tf32=True)
    assert flops == pytest.approx(14e12)
    assert "no TF32" in what


def test_bfloat16_on_a_gpu_without_it_gives_none():
    for name in ("Tesla T4", "Tesla V100-SXM2-16GB", "Tesla P100-PCIE-16GB", "NVIDIA GeForce RTX 2080 Ti"):
        assert find_gpu(name).bfloat16 is None
        assert peak_flops(name, "mixed_bfloat16") is None
        assert peak_flops(name, "mixed_float16") is not None


def test_a_mig_slice_gets_the_full_gpus_peak():
    assert peak_flops("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "mixed_bfloat16") == peak_flops(
        "NVIDIA A100-SXM4-40GB", "mixed_bfloat16")


def test_p100_float16_is_said_to_be_on_cuda_cores():
    flops, what = peak_flops("Tesla P100-PCIE-16GB", "mixed_float16")
    assert flops == pytest.approx(18.7e12)
    assert "no tensor cores" in what


@pytest.mark.parametrize("precision", ["int8", "float16", "bfloat16", "auto", "FLOAT32", ""])
def test_an_unknown_precision_is_refused_naming_the_allowed_ones(precision):
    for name in ("NVIDIA H100 80GB HBM3", "no such GPU"):  # checked before the name
        with pytest.raises(ValueError) as info:
            peak_flops(name, precision)
        for allowed in ("float32", "mixed_float16", "mixed_bfloat16"):
            assert allowed in str(info.value)
    assert PRECISIONS == ("float32", "mixed_float16", "mixed_bfloat16")


@pytest.mark.parametrize("gpu", GPU_PEAKS, ids=lambda g: g.name)
def test_every_entry_is_sourced_positive_and_consistent(gpu: GpuPeak):
    assert gpu.source.startswith("https://") and " " not in gpu.source
    assert gpu.float32 > 0 and gpu.float16 > 0
    assert gpu.float16 >= gpu.float32
    if gpu.tf32 is not None:
        assert gpu.tf32 >= gpu.float32
        assert gpu.float16 >= gpu.tf32
    if gpu.bfloat16 is not None:
        assert gpu.bfloat16 >= gpu.float32
        assert gpu.tf32 is not None  # BF16 and TF32 arrived together (Ampere)
    # In TFLOPS, not FLOP/s: no GPU here is below 1 TFLOPS or above 10 PFLOPS dense.
    assert 1 <= gpu.float32 <= 10_000 and 1 <= gpu.float16 <= 10_000


def test_the_table_covers_the_gpus_tfgpu_is_run_on():
    names = {gpu.name for gpu in GPU_PEAKS}
    assert {"B200", "H200 SXM", "H200 NVL", "H100 SXM", "H100 PCIe", "H100 NVL", "GH200", "A100 SXM",
            "A100 PCIe", "A30", "A10", "A10G", "A40", "L4", "L40", "L40S", "V100 SXM2", "V100 PCIe", "T4",
            "RTX A6000", "RTX 6000 Ada", "GeForce RTX 3090", "GeForce RTX 3080", "GeForce RTX 4090",
            "GeForce RTX 4080", "GeForce RTX 5090", "GeForce RTX 2080 Ti"} <= names
    assert any(name.startswith("P100") for name in names)


def test_the_table_is_frozen():
    with pytest.raises(AttributeError):
        GPU_PEAKS[0].float32 = 1.0  # type: ignore[misc]


def test_the_module_imports_only_the_standard_library():
    """... and, for the CPU's name, tfgpu's probe (which imports no TensorFlow either)."""
    tree = ast.parse(Path(peaks.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.module == "probe", "peaks imports nothing else from tfgpu"
                continue
            imported.add((node.module or "").split(".")[0])
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)


def test_the_cpu_peak_is_the_best_large_matmul_tfgpu_bench_matmul_measured(tmp_path, monkeypatch):
    """tfgpu bench matmul records its best CPU figure at n >= 1024 (smaller matrices do not reach the peak) as the
    CPU's peak for MFU, and a later, lower figure does not replace it."""
    from tfgpu.devices.bench import MatmulRow, Timing, record_cpu_peak

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    row = lambda device, n, ms: MatmulRow(device, n, 1, Timing((ms, ms, ms)))  # noqa: E731
    assert record_cpu_peak([row("/device:CPU:0", 512, 0.5)]) is None and peaks.read_cpu_peak() is None
    rows = [row("/device:CPU:0", 1024, 20.0), row("/device:CPU:0", 2048, 100.0), row("/device:GPU:0", 2048, 1.0)]
    flops = record_cpu_peak(rows)
    assert flops == pytest.approx(2 * 2048**3 / 0.1)  # 171.8 GFLOP/s, the best CPU row
    assert peaks.read_cpu_peak() == (flops, "tfgpu bench matmul: float32 2048 x 2048 matmul on /device:CPU:0, "
                                            "median of 3")
    assert record_cpu_peak([row("/device:CPU:0", 1024, 40.0)]) == flops  # slower: kept
    assert json.loads((tmp_path / "tfgpu" / "cpu_peak.json").read_text()).keys() == {peaks.cpu_key()}
