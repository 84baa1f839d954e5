"""tensorflow.log_level holds TensorFlow's start-up lines back at the file-descriptor level (tfgpu.devices.startup_log).

The filter is a real process on a real pipe in every test here; the end-to-end ones start real TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest

from tfgpu.config import load_config
from tfgpu.devices.doctor import check_startup_log, describe_startup_log
from tfgpu.devices.plan import make_plan
from tfgpu.devices.probe import Facts, Probe, TensorflowFacts
from tfgpu.devices.probe import find_libcuda, probe
from tfgpu.devices.startup_log import NO_DRIVER_EXPECTED, StartupLog, level_in_force, severity, shown, why_harmless

from ..conftest import RECIPES, only_run_dir, run_cli, run_python

ABSL_LINE = re.compile(r"^[IW][0-9]{4} ", re.M)
NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
I_LINE = "I0000 00:00:1795531503.647323    2442 port.cc:153] oneDNN custom operations are on."
W_LINE = "W0000 00:00:1795531503.647323    2442 dataset.cc:997] Input of GeneratorDatasetOp will not be optimized"
E_LINE = ("E0000 00:00:1795531506.485939    2442 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
          "Failed call to cuInit: UNKNOWN ERROR (303)")
NO_DRIVER = "I0000 00:00:1795531503.648828    2442 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used."
OLD_FORMAT = "2024-03-01 12:00:00.123456: W tensorflow/core/util/port.cc:113] oneDNN custom operations are on."
FACTORY = ("E0000 00:00:1721920000.000000   1234 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to "
           "register factory for plugin cuDNN when one has already been registered")


@pytest.mark.parametrize("line, expected", [
    (I_LINE, 0), (W_LINE, 1), (E_LINE, 2), ("F1124 14:54:04.414814 9791 check.cc:12] Check failed: x", 3),
    ("I1124 14:54:04.414814    9791 gpu_device.cc:2019] Created device /job:localhost/replica:0/task:0/device:GPU:0",
     0),
    (OLD_FORMAT, 1), (NOTICE, 1),
    ("Traceback (most recent call last):", None), ('  File "train.py", line 3, in <module>', None),
    ("tfgpu: warning: no GPU is visible", None), ("Epoch 1/2", None), ("I0000 is not a log line", None),
])
def test_severity_knows_tensorflows_line_formats_and_nothing_else(line, expected):
    assert severity(line.encode()) == expected


@pytest.mark.parametrize("given, env, level", [
    ({"tensorflow": {"log_level": 3}}, {"TF_CPP_MIN_LOG_LEVEL": "0"}, 3),  # the config wins when it sets the key
    ({}, {"TF_CPP_MIN_LOG_LEVEL": "0"}, 0),                               # else an existing variable is kept
    ({}, {}, 2),                                                           # else the default, 2
    ({"devices": {"log_device_placement": True}}, {}, 0),                 # placement lines are INFO
    ({}, {"TF_CPP_MIN_LOG_LEVEL": "x"}, 0),                               # TensorFlow reads junk as 0
])
def test_the_level_held_back_below_is_the_one_the_plan_starts_tensorflow_with(given, env, level):
    plan = make_plan(load_config(given), Probe(env=env))
    assert level_in_force(plan.env, env) == level


def test_known_harmless_errors_are_named_only_where_they_are_harmless():
    assert why_harmless(E_LINE, [NO_DRIVER, E_LINE]).name == "cuInit without a driver"
    assert why_harmless(E_LINE, [E_LINE]) is None  # a driver is there: cuInit failing is a real problem
    assert why_harmless(E_LINE, [E_LINE], hidden=True).name == "cuInit with every GPU hidden"
    assert "62075" in why_harmless(FACTORY, [FACTORY]).why
    log = StartupLog(2, [(NO_DRIVER, False), (E_LINE, True), (FACTORY, True)])
    note = log.note()
    assert note.startswith("tfgpu: note:") and "no NVIDIA driver" in note and "registration" in note
    assert "\n" not in note
    assert StartupLog(3, [(E_LINE, False)]).note() is None  # held back: nothing shown, nothing to explain


F_LINE = "F0000 00:00:1795531506.485939    2442 cuda_platform.cc:52] failed call to cuInit: fatal"


def test_cuinit_is_held_back_as_expected_only_where_the_probe_found_no_driver():
    assert shown(E_LINE, 2) is True  # a machine with a driver: cuInit failing is shown (it is why no GPU is used)
    assert shown(E_LINE, 2, NO_DRIVER_EXPECTED) is False  # no driver at all: expected, held back like INFO
    assert shown(E_LINE, 0, NO_DRIVER_EXPECTED) is True  # log_level 0 shows everything
    assert shown(F_LINE, 2, NO_DRIVER_EXPECTED) is True  # a fatal line is never held
    assert shown(FACTORY, 2, NO_DRIVER_EXPECTED) is True and shown(I_LINE, 2) is False
    assert shown("Traceback (most recent call last):", 3, NO_DRIVER_EXPECTED) is None  # not TensorFlow's


def test_no_driver_means_no_nvml_and_no_libcuda_anywhere_the_linker_looks(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "stubs"))
    (tmp_path / "stubs").mkdir()
    (tmp_path / "stubs" / "libcuda.so.1").write_bytes(b"")  # a toolkit's stub has no driver behind it
    empty = tmp_path / "ld.so.cache"
    empty.write_bytes(b"glibc-ld.so.cache1.1\0libc.so.6\0/usr/lib/x86_64-linux-gnu/libc.so.6\0")
    found = find_libcuda(str(empty))
    assert found is None or found.startswith(("/usr/", "/lib"))  # none here, or the host's own (a driver)
    cache = tmp_path / "cache"
    cache.write_bytes(b"glibc-ld.so.cache1.1\0libcuda.so.1\0/usr/lib/x86_64-linux-gnu/libcuda.so.1\0")
    assert find_libcuda(str(cache)) == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libcuda.so.1").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "lib"))
    assert find_libcuda(str(empty)) == str(tmp_path / "lib" / "libcuda.so.1")
    assert Probe(nvml_error="NVML Shared Library Not Found").no_driver
    assert not Probe(nvml_error="NVML Shared Library Not Found", libcuda="/usr/lib64/libcuda.so.1").no_driver
    assert not Probe(nvml_error=None).no_driver


FILTER_SCRIPT = """
    import os, sys
    from tfgpu.devices.startup_log import hold_back

    NOTICE, I_LINE, W_LINE, E_LINE = {lines!r}
    with hold_back({level}, expected={expected!r}) as log:
        os.write(2, (NOTICE + "\\n" + I_LINE + "\\n").encode())          # one write, two held lines
        os.write(2, (I_LINE + "\\nTo enable the following instructions: AVX2, rebuild TensorFlow.\\n").encode())
        os.write(2, (W_LINE + "\\n  StreamExecutor device (0): Host\\n").encode())  # its second line: held with it
        print("python says hello", file=sys.stderr)
        os.write(2, (E_LINE + "\\n").encode())
        os.write(2, b"partial line without an end")
        for i in range(20000):                                       # ~2 MB: far more than a pipe holds
            os.write(2, (I_LINE + " %d\\n" % i).encode())
        os.write(2, b"Traceback (most recent call last):\\n")
    os.write(2, (I_LINE + " after the window\\n").encode())               # fd 2 is the terminal's again
    held = log.held.splitlines()
    print(len(held), sum(1 for _, shown in log.lines if shown), log.filtered)
    print(held[0] if held else ""); print(held[-1] if held else "")
"""


@pytest.mark.parametrize("level", [2, 0])
def test_the_filter_holds_back_below_the_level_passes_the_rest_in_order_and_never_blocks(level):
    code = FILTER_SCRIPT.format(lines=(NOTICE, I_LINE, W_LINE, E_LINE), level=level, expected=())
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    err = result.stderr.splitlines()
    count, shown, filtered = result.stdout.splitlines()[0].split()
    assert filtered == "True"
    if level == 0:  # everything is shown, nothing held
        assert int(count) == 0 and len([e for e in err if I_LINE in e]) == 20003
        return
    assert err[:2] == ["python says hello", E_LINE]
    assert err[2:4] == ["partial line without an end" + I_LINE + " 0", "Traceback (most recent call last):"] or \
        err[2:4] == ["partial line without an end", "Traceback (most recent call last):"]
    assert err[-1] == I_LINE + " after the window"
    assert not [e for e in err[:-1] if ABSL_LINE.match(e) and not e.startswith("partial")]
    # held: the notice, two I-lines, the W-line, the two continuations and the 20000 I-lines
    assert int(count) >= 20005 and int(shown) == 1
    assert "To enable the following instructions" not in result.stderr and "StreamExecutor" not in result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == NOTICE and lines[2].startswith(I_LINE)


def test_without_a_driver_the_filter_holds_cuinits_error_back_and_shows_the_rest():
    code = FILTER_SCRIPT.format(lines=(NOTICE, I_LINE, W_LINE, E_LINE), level=2, expected=NO_DRIVER_EXPECTED)
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    err = result.stderr.splitlines()
    assert err[0] == "python says hello" and E_LINE not in result.stderr  # held back, in order with the rest
    assert "Traceback (most recent call last):" in err and err[-1] == I_LINE + " after the window"
    count, shown_count, _ = result.stdout.splitlines()[0].split()
    assert int(shown_count) == 0 and int(count) >= 20006  # the E-line is among the held


def test_the_filter_is_off_with_tfgpu_log_filter_0():
    result = run_python(f"""
        import os
        from tfgpu.devices.startup_log import hold_back
        with hold_back(3) as log:
            os.write(2, b"{I_LINE}\\n")
        print(log.filtered)
    """, TFGPU_LOG_FILTER="0")
    assert result.stdout.strip() == "False" and I_LINE in result.stderr


@pytest.mark.slow
def test_setup_holds_tensorflows_start_up_lines_in_a_file_and_restores_fd_2():
    result = run_python(f"""
        import os, tfgpu
        info = tfgpu.setup({{"devices": {{"cpu_logical_devices": 2}}}})
        os.write(2, b"{I_LINE} written after setup\\n")
        print(info.startup_log_file)
        print(info.logical_devices)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    path, devices = result.stdout.splitlines()[-2:]
    assert "CPU:1" in devices
    assert not [line for line in result.stderr.splitlines() if ABSL_LINE.match(line) and "after setup" not in line]
    assert NOTICE not in result.stderr
    assert f"{I_LINE} written after setup" in result.stderr  # fd 2 is the process's own again
    held = open(path).read()
    # TensorFlow's own lines (which ones depends on the CPU: oneDNN's port.cc notice, or cpu_feature_guard.cc's)
    assert NOTICE in held and any(ABSL_LINE.match(line) for line in held.splitlines()), held
    os.unlink(path)


@pytest.mark.slow
def test_log_level_0_prints_every_start_up_line_and_holds_nothing_back(tmp_path):
    """tensorflow.log_level 0 prints TensorFlow's start-up lines and holds nothing back in startup.log.
    Trains its own run: every shared run keeps the default log level 2, not the level 0 under test."""
    # The default (2) holding them back into RUN_DIR/startup.log is checked on the shared e2e runs (test_e2e.py).
    loud = run_cli("run", str(RECIPES / "mnist.yaml"), "--set", "train.epochs=1", "--set", "tensorflow.log_level=0",
                   "--output-dir", str(tmp_path))
    assert loud.returncode == 0, loud.stderr[-3000:]
    assert ABSL_LINE.search(loud.stderr) and NOTICE in loud.stderr
    run_dir = only_run_dir(tmp_path)
    assert not (run_dir / "startup.log").exists()  # nothing was held back
    assert json.loads((run_dir / "summary.json").read_text())["startup_log"] is None


def test_doctor_names_harmless_errors_and_warns_about_unknown_ones():
    def facts(log: str) -> Facts:
        return Facts(machine=Probe(), tensorflow=TensorflowFacts(version="2.21.0", log=log,
                                                                 physical_devices=(("/physical_device:CPU:0", "CPU"),)))

    ok = check_startup_log(facts("\n".join([NOTICE, NO_DRIVER, E_LINE])), None)
    assert [f.level for f in ok] == ["ok"]
    assert "cuInit without a driver" in ok[0].seen and "holds back 2" in ok[0].seen
    unknown = "E0000 00:00:1795531506.485939    2442 cuda_dnn.cc:522] Loaded runtime CuDNN library: 8.6.0 but source was compiled with: 9.3.0"
    warn = check_startup_log(facts("\n".join([NOTICE, E_LINE, unknown])), None)
    assert [f.level for f in warn] == ["warning"]
    assert "Loaded runtime CuDNN library" in warn[0].seen and "failed call to cuInit" in warn[0].seen
    text = describe_startup_log(facts("\n".join([NOTICE, NO_DRIVER, E_LINE])), None)
    assert "[held back] " + NOTICE in text and "[shown] " + E_LINE in text and "harmless: no NVIDIA driver" in text


@pytest.mark.slow
def test_doctor_log_shows_a_real_tensorflow_start_up():
    result = run_cli("doctor", "--log")
    assert result.returncode in (0, 9), result.stderr[-3000:]
    assert "TensorFlow's start-up log" in result.stdout and "[held back] " + NOTICE in result.stdout
    cuinit = [line for line in result.stdout.splitlines() if "failed call to cuInit" in line]
    if probe().no_driver:  # as here and in CI: listed, held back as 'tfgpu run' holds it, and explained
        assert cuinit and all(line.lstrip().startswith("[held back] E") for line in cuinit), result.stdout
        assert "harmless: no NVIDIA driver is installed" in result.stdout


def test_the_filter_script_imports_only_the_standard_library():
    import tfgpu.devices.startup_log as module  # noqa: PLC0415

    result = run_python(textwrap.dedent(f"""
        import subprocess, sys
        out = subprocess.run([sys.executable, "-I", "-S", "-c",
                              "import runpy, sys; sys.argv = ['x', '2', 'ab']; "
                              "runpy.run_path({module.__file__!r}, run_name='not_main'); "
                              "print(sorted(m for m in sys.modules if m.startswith('tfgpu')))"],
                             capture_output=True, text=True)
        print(out.stdout.strip(), out.returncode)
    """))
    assert result.stdout.strip() == "[] 0", result.stdout + result.stderr


def test_the_filter_outlives_a_signal_to_the_whole_process_group(tmp_path):
    # Slurm's requeue signal and Ctrl-C reach every process of the group: the run handles them; the filter must
    # keep passing lines on, not die and lose them.
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(f"""
        import os, signal, time
        from tfgpu.devices.startup_log import hold_back
        signal.signal(signal.SIGUSR1, lambda *a: None)
        with hold_back(2) as log:
            os.write(2, b"{I_LINE}\\n")
            time.sleep(0.3)
            os.killpg(0, signal.SIGUSR1)
            time.sleep(0.3)
            os.write(2, b"{E_LINE}\\n")
        print(len(log.lines), [shown for _, shown in log.lines])
    """))
    result = run_python(f"""
        import subprocess, sys
        out = subprocess.run([sys.executable, {str(child)!r}], capture_output=True, text=True,
                             start_new_session=True)
        print(out.returncode, out.stdout.strip(), "|", out.stderr.strip())
    """)
    assert result.stdout.strip() == f"0 2 [False, True] | {E_LINE}", result.stdout + result.stderr


def test_setups_outside_a_run_keep_only_the_newest_start_up_logs(tmp_path):
    folder = tmp_path / f"tfgpu-{os.getuid()}"
    folder.mkdir()
    for i in range(105):
        path = folder / f"startup-{i}.log"
        path.write_text("x")
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
    result = run_python("from tfgpu.devices.startup_log import default_file; print(default_file())", TMPDIR=str(tmp_path))
    assert result.stdout.strip().startswith(str(folder / "startup-"))
    kept = sorted(int(p.stem.split("-")[1]) for p in folder.iterdir())
    assert kept == list(range(6, 105))  # 99 old ones and room for the new one: 100
