"""One command line, quieter runs: usage errors are exit 2 everywhere, near-miss keys get a "did you mean",
every problem of a recipe is listed in line order, epoch lines round their timing figures, a GPU setting on a
CPU-only machine is a note, and every doctor fix says what to do.
"""

from __future__ import annotations

import csv
import json
import re

import pytest

from tfgpu.config import load_config
from tfgpu.devices.doctor import diagnose
from tfgpu.errors import ConfigError
from tfgpu.training.loops import epoch_line, format_epoch

from ..conftest import ROOT, run_cli
from ..devices.test_doctor import facts, gpu, libraries, machine, no_gpu_machine, tf_facts
from .test_bad_input import cli_error

RECIPE = "recipes/mnist.yaml"


# --------------------------------------------------------------------------- usage errors: exit 2

@pytest.mark.parametrize("command", [
    pytest.param(["plan", RECIPE], id="plan"),
    pytest.param(["run", RECIPE], id="run"),
    pytest.param(["doctor", RECIPE, "--no-tensorflow"], id="doctor"),  # doctor turns a ConfigError into a finding
    pytest.param(["export", "slurm", RECIPE], id="export-slurm"),
])
def test_a_set_without_equals_is_a_usage_error_on_every_command(command, tmp_path):
    result = run_cli(*command, "--set", "train.epochs", cwd=ROOT)
    paragraph = cli_error(result, 2, ["tfgpu: usage error:", "--set 'train.epochs'", "expected 'section.key=value'",
                                      "e.g. --set train.epochs=VALUE", "Fix: write the dotted key, '=', then the value"])
    assert "Usage:" not in paragraph  # tfgpu's one paragraph, not click's usage text
    assert result.stdout == ""  # nothing ran: no plan, no report, no script


def test_a_set_value_that_is_not_yaml_is_a_usage_error_but_a_refused_value_is_a_config_error():
    cli_error(run_cli("plan", RECIPE, "--set", "train.epochs=[1"), 2,
              ["tfgpu: usage error:", "the value '[1' is not valid YAML"])
    cli_error(run_cli("plan", RECIPE, "--set", "train.epochs=0"), 3,
              ["tfgpu: configuration error:", "--set train.epochs=0", "greater than or equal to 1"])


# --------------------------------------------------------------------------- near misses

def _problems(tmp_path, text: str) -> str:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(recipe)
    return info.value.message


def test_a_key_at_the_wrong_level_names_its_section(tmp_path):
    message = _problems(tmp_path, "epochs: 3\n")
    assert "recipe.yaml:1: unknown key 'epochs'. Did you mean 'train.epochs'?" in message
    message = _problems(tmp_path, "train:\n  memory_growth: true\n")
    assert "recipe.yaml:2: unknown key 'train.memory_growth'. Did you mean 'devices.memory_growth'?" in message


@pytest.mark.parametrize("key, tfgpu_key", [
    ("gpu_options: {allow_growth: true}", "devices.memory_growth"),
    ("devices: {allow_growth: true}", "devices.memory_growth"),
    ("devices: {per_process_gpu_memory_fraction: 0.5}", "devices.memory_fraction"),
    ("devices: {visible_device_list: '0'}", "devices.visible_gpus"),
    ("log_device_placement: true", "devices.log_device_placement"),
    ("tensorflow: {inter_op_parallelism_threads: 2}", "tensorflow.inter_op_threads"),
])
def test_tensorflow_1_names_point_at_the_key_and_the_old_names_table(tmp_path, key, tfgpu_key):
    message = _problems(tmp_path, key + "\n")
    assert f"tfgpu's is {tfgpu_key}" in message
    assert "docs/config.md, 'From the old tutorials to the current API'" in message
    assert "## From the old tutorials to the current API" in (ROOT / "docs" / "config.md").read_text()


def test_an_unset_variable_in_a_data_path_suggests_the_set_one(tmp_path):
    # run checks the data before TensorFlow starts: fast, and nothing is written
    result = run_cli("run", RECIPE, "--set", "data.path=$TFGPU_DATAA_DIR/mnist", "--output-dir", str(tmp_path / "runs"))
    cli_error(result, 5, ["tfgpu: data error:", "uses $TFGPU_DATAA_DIR, which is not set",
                          "Did you mean $TFGPU_DATA_DIR (which is set)?", "Fix: correct the name to $TFGPU_DATA_DIR"])
    assert not (tmp_path / "runs").exists()


def test_every_problem_is_listed_in_line_order(tmp_path):
    text = ("# three problems, which the schema meets in another order (devices, tensorflow, train)\n"
            "train:\n"
            "  epocs: 2\n"
            "  batch_size_per_replica: 8\n"
            "devices:\n"
            "  memory_growth: true\n"
            "  memory_fraction: 2\n"
            "tensorflow:\n"
            "  seed: -1\n")
    message = _problems(tmp_path, text)
    lines = message.splitlines()
    assert lines[0] == "3 problems in the configuration:"
    assert [re.match(r"  - .*recipe\.yaml:(\d+): ", line).group(1) for line in lines[1:]] == ["3", "7", "9"]
    assert "Did you mean 'train.epochs'?" in lines[1] and "'devices.memory_fraction'" in lines[2] \
        and "'tensorflow.seed'" in lines[3]
    assert "" not in lines  # one paragraph: no blank line


# --------------------------------------------------------------------------- quieter runs

def test_epoch_lines_round_the_timing_figures_and_keep_the_metrics():
    logs = {"accuracy": 0.91234567, "loss": 0.30123, "val_loss": 0.00001234, "epoch_seconds": 0.1316,
            "train_seconds": 0.0507, "samples_per_second": 8969.3581}
    assert format_epoch(logs) == ("accuracy: 0.9123 - loss: 0.3012 - val_loss: 1.2340e-05 - epoch_seconds: 0.132 - "
                                  "train_seconds: 0.051 - samples_per_second: 8969")
    slow = {"loss": 1.0, "samples_per_second": 12.6, "train_seconds": 61.57, "epoch_seconds": 312.4}
    assert epoch_line(2, 10, slow) == ("Epoch 3/10 - loss: 1.0000 - epoch_seconds: 312 - train_seconds: 61.6 - "
                                       "samples_per_second: 13")


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_real_run_prints_rounded_epoch_lines_and_keeps_full_values(two_replica_runs, loop):
    """A run's epoch lines (train.progress auto, not a terminal: a line per epoch) give rounded timing figures, and
    metrics.csv keeps the full values. Reads the shared two-replica runs (2 epochs each)."""
    result, run_dir = two_replica_runs[loop]
    lines = [x for x in result.stdout.splitlines() if x.startswith("Epoch ")]
    assert [line.split(" - ")[0] for line in lines] == ["Epoch 1/2", "Epoch 2/2"], lines
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert len(rows) == 2
    for line, row in zip(lines, rows):
        assert re.fullmatch(r"Epoch \d/2 - (\w+: \d\.\d{4} - ){4}learning_rate: [\d.e+-]+ - epoch_seconds: [\d.]+ - "
                            r"train_seconds: [\d.]+ - "
                            r"samples_per_second: \d+ - grad norm: [\d.e+-]+ \(max [\d.e+-]+\) - input wait: \d+% - "
                            r"MFU: [\d.]+% - CPU: \d+%", line), line
        norm = re.search(r"grad norm: ([\d.e+-]+) \(max ([\d.e+-]+)\)", line)
        assert float(row["gradient_norm"]) == pytest.approx(float(norm.group(1)), rel=5e-3)  # 3 significant digits
        assert 0 < float(row["gradient_norm"]) <= float(row["gradient_norm_max"])
        assert re.search(r"\bloss: ", line) and "val_accuracy: " in line, line  # the metrics keep Keras's 4 decimals
        seconds = re.search(r"epoch_seconds: ([\d.]+)", line).group(1)
        assert len(seconds.replace(".", "").lstrip("0")) <= 3, line  # 2-3 significant digits
        assert len(row["samples_per_second"].partition(".")[2]) > 3  # the file keeps the full value
        assert float(row["samples_per_second"]) == pytest.approx(
            float(re.search(r"samples_per_second: (\d+)", line).group(1)), abs=0.5)
        assert float(row["mfu_percent"]) == pytest.approx(float(re.search(r"MFU: ([\d.]+)%", line).group(1)),
                                                          rel=5e-3)  # 3 significant digits
    assert "warning: no GPU is visible" not in result.stdout + result.stderr  # a note for plan, not a warning here


def test_memory_growth_without_a_gpu_is_a_note_not_a_warning():
    result = run_cli("plan", RECIPE)
    assert result.returncode == 0, result.stderr
    assert "Note: no GPU is visible, so devices.memory_growth has nothing to apply to" in result.stdout
    assert not [x for x in result.stdout.splitlines() if x.startswith("Warning:") and "memory_growth" in x]
    plan = json.loads(run_cli("plan", RECIPE, "--json").stdout)["plan"]
    assert any("devices.memory_growth" in n for n in plan["notes"])
    assert not any("devices.memory_growth" in w for w in plan["warnings"])


# --------------------------------------------------------------------------- doctor: a fix says what to do

#: An imperative that starts a fix, or follows its ';' or ':' - what to do, not only where to read.
ACTION = re.compile(r"(^|[;:.]\s|\bor\s|\bthen\s)(pip|install|uninstall|reinstall|unset|set|change|choose|use|start|run|"
                    r"update|create|turn|remove|name|correct|pick|cap|build|keep|reboot|fix|do|on apple|if it|for|"
                    r"tensorflow 2\.10|libcuda|the driver)\b", re.IGNORECASE)

SCENARIOS = {
    "no-gpu": (facts(no_gpu_machine(), tf=tf_facts(0)), None),
    "container-without-gpus": (facts(no_gpu_machine(in_container=True, env={"NVIDIA_VISIBLE_DEVICES": "void"}),
                                     tf=tf_facts(0)), None),
    "nvml-missing": (facts(no_gpu_machine(nvml_error="nvidia-ml-py is not installed"), tf=tf_facts(2)), None),
    "driver-mismatch": (facts(no_gpu_machine(nvidia_smi="/usr/bin/nvidia-smi", device_nodes=("/dev/nvidia0",)),
                              tf=tf_facts(0)), None),
    "cuda-visible-hides": (facts(machine(env={"CUDA_VISIBLE_DEVICES": "-1"}), tf=tf_facts(0)), None),
    "cuda-visible-stops": (facts(machine(env={"CUDA_VISIBLE_DEVICES": "0,7,1"})), None),
    "old-packages": (facts(packages={"tensorflow-gpu": "2.10.0", "tensorflow-cpu": "2.21.0", "tensorflow": "2.21.0",
                                     "keras": "2.15.0"}), None),
    "no-tensorflow": (facts(packages={"keras": "3.15.1"}, tf=None), None),
    "tensorflow-cannot-start": (facts(tf=tf_facts(0, version=None, import_error="ImportError: libfoo")), None),
    "cpu-build": (facts(tf=tf_facts(0, build={"is_cuda_build": False})), None),
    "missing-libraries": (facts(libs=libraries("libcudnn.so.9", "libcuda.so.1"), tf=tf_facts(0)), None),
    "old-driver": (facts(machine(cuda_driver_version="11.8", driver_version="520.61")), None),
    "old-gpu": (facts(machine(gpus=[gpu(0, cc="5.0", name="Tesla M60")]), tf=tf_facts(0)), None),
    "memory-in-use": (facts(machine(gpus=[gpu(0, used=38000)]), tf=tf_facts(1)), None),
    "startup-log": (facts(tf=tf_facts(2, log="E0000 00:00:1.0 1 foo.cc:1] something unknown broke\n")), None),
    "config-warnings": (facts(machine(gpus=[gpu(0), gpu(1, name="Tesla T4", total=15360, cc="7.5")]), tf=tf_facts(2)),
                        {"devices": {"memory_growth": True, "memory_limit_mib": 8192},
                         "tensorflow": {"deterministic_ops": True}}),
    "config-error": (facts(), {"devices": {"visible_gpus": [5]}}),
    "windows": (facts(machine(platform="win32")), None),
    "macos": (facts(no_gpu_machine(platform="darwin"), tf=tf_facts(0)), None),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_doctor_fix_says_what_to_do(name):
    machine_facts, config = SCENARIOS[name]
    findings = diagnose(machine_facts, load_config({}, **config) if config else None)
    problems = [f for f in findings if f.level != "ok"]
    assert problems, f"{name}: the scenario finds nothing to fix"
    for f in problems:
        assert f.fix, f"{f.check}: no fix"
        assert ACTION.search(f.fix), f"{f.check}: the fix says where to read, not what to do: {f.fix}"
        assert not re.fullmatch(r"see [^;]*\.?", f.fix.strip(), re.IGNORECASE), f.fix


def test_a_config_warning_fix_names_the_key_to_change_and_the_command_to_check():
    machine_facts, config = SCENARIOS["config-warnings"]
    fixes = {f.seen: f.fix for f in diagnose(machine_facts, load_config({}, **config))
             if f.check == "config" and f.level == "warning"}
    both = next(fix for seen, fix in fixes.items() if "both set" in seen)
    assert "change devices.memory_growth or devices.memory_limit_mib" in both
    assert "--set devices.memory_growth=VALUE" in both and "tfgpu plan RECIPE" in both and "docs/config.md" in both
    seed = next(fix for seen, fix in fixes.items() if "without tensorflow.seed" in seen)
    assert "tensorflow.deterministic_ops or tensorflow.seed" in seed
    unequal = next(fix for seen, fix in fixes.items() if "unequal" in seen)
    assert "devices.visible_gpus" in unequal
