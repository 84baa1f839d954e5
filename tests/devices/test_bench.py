"""tfgpu bench: the d2l timing exercises on real TensorFlow (in subprocesses), their tables and bad input.

Sizes and repeats are small so each test takes seconds on a 2-core CPU; the timings
themselves are not asserted (they depend on the machine), only that they are positive,
consistent and reported.
"""

from __future__ import annotations

import json
import re

import pytest

from tfgpu.devices.bench import DevicesResult, Timing, bench_devices, bench_logging, bench_matmul, describe_devices
from tfgpu.errors import ConfigError

from ..conftest import one_paragraph, run_cli, run_python

SPLIT = ("--set", "devices.cpu_logical_devices=2")


def bench(*args: str) -> str:
    result = run_cli("bench", *args, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    # tensorflow.log_level (2 by default) holds TensorFlow's start-up INFO/WARNING lines back
    assert not re.search(r"^[IW][0-9]{4} ", result.stderr, re.M) and "absl::InitializeLog" not in result.stderr
    return result.stdout


def table(stdout: str, header: list[str]) -> list[list[str]]:
    """The rows under the header line that has all of ``header`` (split on two or more spaces)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if all(h in line for h in header))
    rows = []
    for line in lines[start + 1:]:
        cells = [c for c in line.split("  ") if c.strip()]
        if len(cells) < len(header):
            break
        rows.append([c.strip() for c in cells])
    assert rows, f"no rows under {header}:\n{stdout}"
    return rows


# --------------------------------------------------------------------------- matmul


@pytest.mark.slow
def test_matmul_json_one_row_per_device_and_size_with_consistent_gflops():
    data = json.loads(bench("matmul", "--sizes", "64,128", "--repeats", "2", "--json"))
    assert data["logical_devices"] == ["/device:CPU:0"]
    rows = data["rows"]
    assert [(r["device"], r["size"]) for r in rows] == [("/device:CPU:0", 64), ("/device:CPU:0", 128)]
    for r in rows:
        assert len(r["times_ms"]) == 2 and 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert 1 <= r["matmuls_per_call"] <= 100
        assert r["gflops"] > 0
        assert r["gflops"] == pytest.approx(2 * r["size"] ** 3 / (r["median_ms"] * 1e-3) / 1e9, rel=1e-9)


@pytest.mark.slow
def test_matmul_table_times_each_logical_device():
    out = bench("matmul", *SPLIT, "--sizes", "32,64", "--repeats", "1")
    assert "logical devices: CPU:0, CPU:1" in out
    rows = table(out, ["device", "n", "matmuls/call", "median ms", "min-max ms", "GFLOP/s"])
    assert [(r[0], r[1]) for r in rows] == [("CPU:0", "32"), ("CPU:0", "64"), ("CPU:1", "32"), ("CPU:1", "64")]
    assert all(float(r[5]) > 0 for r in rows)
    assert "GFLOP/s = 2 n^3 / median time" in out


# --------------------------------------------------------------------------- logging


@pytest.mark.slow
def test_logging_json_both_variants_agree():
    data = json.loads(bench("logging", "--steps", "50", "--size", "32", "--repeats", "2", "--json"))
    assert data["device"] == "/device:CPU:0" and data["steps"] == 50 and data["size"] == 32
    variants = {v["name"]: v for v in data["variants"]}
    assert list(variants) == ["host", "device_eager", "device_function"]
    assert variants["host"]["transfers"] == 50 and variants["device_function"]["transfers"] == 1
    for v in variants.values():
        assert v["median_ms"] > 0 and v["steps_per_second"] > 0 and len(v["times_ms"]) == 2
    assert data["norms_agree"] is True and data["max_relative_difference"] < 1e-4
    assert data["ratio"] == pytest.approx(variants["host"]["median_ms"] / variants["device_function"]["median_ms"])
    assert data["last_norm"] > 0


@pytest.mark.slow
def test_logging_table():
    out = bench("logging", "--steps", "20", "--size", "16", "--repeats", "1")
    rows = table(out, ["variant", "transfers", "median ms", "steps/s", "vs host"])
    assert [r[0] for r in rows] == ["host", "device_eager", "device_function"]
    assert rows[0][2] == "20" and rows[2][2] == "1"
    assert "Norms agree: yes" in out and "as fast as logging to the host" in out


# --------------------------------------------------------------------------- devices


@pytest.mark.slow
def test_devices_split_across_two_cpu_logical_devices():
    data = json.loads(bench("devices", *SPLIT, "--size", "128", "--repeats", "2", "--json"))
    assert data["devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert data["tasks"] == 2 and data["ideal_speedup"] == 2 and data["matmuls_per_task"] >= 1
    assert data["sequential"]["median_ms"] > 0 and data["split"]["median_ms"] > 0
    assert data["speedup"] == pytest.approx(data["sequential"]["median_ms"] / data["split"]["median_ms"])
    assert any("one physical CPU" in n and "no real speed-up" in n for n in data["notes"])


@pytest.mark.slow
def test_devices_with_one_device_says_how_to_get_two():
    out = bench("devices", "--size", "64", "--repeats", "1")
    rows = table(out, ["run", "devices", "work", "median ms", "speed-up"])
    assert [r[0] for r in rows] == ["sequential"] and rows[0][1] == "CPU:0"
    assert "Only one device (/device:CPU:0)" in out
    assert "--set devices.cpu_logical_devices=2" in out and "devices.gpu_logical_devices" in out


@pytest.mark.slow
def test_devices_text_two_devices_table():
    out = bench("devices", *SPLIT, "--size", "64", "--repeats", "1")
    rows = table(out, ["run", "devices", "work", "median ms", "speed-up"])
    assert [(r[0], r[1]) for r in rows] == [("sequential", "CPU:0"), ("split", "CPU:0, CPU:1")]
    assert "one physical CPU" in out


def test_describe_devices_without_tensorflow():
    result = DevicesResult(("/device:GPU:0", "/device:GPU:1"), 1024, 2, 10, Timing((20.0, 22.0, 21.0)),
                           Timing((11.0, 10.0, 10.5)), ())
    assert result.speedup == pytest.approx(2.0)
    text = describe_devices(result)
    split_row = next(line for line in text.splitlines() if line.startswith("split"))
    assert "GPU:0, GPU:1" in split_row and " 10.5 " in split_row and split_row.endswith("2.00x")
    assert "ideal 2.00x" in text and "Only one device" not in text


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("args, fragment", [
    (["matmul", "--sizes", "0"], "'0' is not a matrix size"),
    (["matmul", "--sizes", "abc"], "'abc' is not a matrix size"),
    (["matmul", "--sizes", "64,,128"], "'' (in '64,,128') is not a matrix size"),
    (["matmul", "--sizes", "70000"], "from 1 to 65536"),
    (["matmul", "--repeats", "0"], "Invalid value for '--repeats'"),
    (["logging", "--steps", "0"], "Invalid value for '--steps'"),
    (["logging", "--size", "x"], "Invalid value for '--size'"),
    (["devices", "--repeats", "-1"], "Invalid value for '--repeats'"),
])
def test_bad_options_are_usage_errors(args, fragment):
    result = run_cli("bench", *args, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    error = result.stderr[result.stderr.index("Error: "):]
    one_paragraph(error)
    assert fragment in error, error


def test_cli_and_library_accept_the_same_sizes():
    from tfgpu.cli import bench as cli  # noqa: PLC0415
    from tfgpu.devices import bench as bench_module  # noqa: PLC0415

    assert cli._MAX_SIZE == bench_module.MAX_SIZE
    # `tfgpu bench matmul` without --sizes times the library's default sizes (and --help shows them)
    sizes = next(p for p in cli.bench_matmul.params if p.name == "sizes")
    assert sizes.type.convert(sizes.default, sizes, None) == bench_module.DEFAULT_SIZES
    help_text = run_cli("bench", "matmul", "--help", timeout=60).stdout
    assert f"[default: {','.join(map(str, bench_module.DEFAULT_SIZES))}]" in " ".join(help_text.split())


def test_bad_set_is_a_config_error():
    result = run_cli("bench", "matmul", "--set", "devices.cpu_logical_devices=0", timeout=60)
    assert result.returncode == 3
    one_paragraph(result.stderr)
    assert "tfgpu: configuration error" in result.stderr and "devices.cpu_logical_devices" in result.stderr


@pytest.mark.parametrize("call", [
    lambda: bench_matmul(sizes=[0]),
    lambda: bench_matmul(sizes=[]),
    lambda: bench_matmul(sizes=[64], repeats=0),
    lambda: bench_logging(steps=0),
    lambda: bench_devices(size=True),
])
def test_library_rejects_bad_arguments_before_tensorflow(call):
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.exit_code == 3 and info.value.hint
    one_paragraph(info.value.message)


def test_bench_help_does_not_import_tensorflow():
    result = run_python("""
        import sys
        from tfgpu.cli import main
        for args in (['bench', '--help'], ['bench', 'matmul', '--help'], ['bench', 'devices', '--help']):
            assert main(args, standalone_mode=False) == 0, args
        assert 'tensorflow' not in sys.modules, 'tensorflow was imported'
        print('ok')
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
    assert "logging" in result.stdout and "--sizes" in result.stdout
