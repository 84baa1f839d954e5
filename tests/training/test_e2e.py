"""End to end on the real (offline) MNIST: `tfgpu run` in a subprocess, as a user runs it."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
import yaml

from ..conftest import only_run_dir, run_cli, run_python


def evaluate(*model_paths: Path) -> list[float]:
    """Each saved model's accuracy on the MNIST test split, evaluated by plain Keras in one process."""
    result = run_python(f"""
        import os, numpy as np, keras
        data = np.load(os.path.join(os.environ["TFGPU_DATA_DIR"], "mnist", "mnist.npz"))
        x = data["x_test"][..., None].astype("float32") / 255.0
        for path in {[str(p) for p in model_paths]!r}:
            model = keras.models.load_model(path)
            print("ACC", model.evaluate(x, data["y_test"], batch_size=1000, verbose=0, return_dict=True)["accuracy"])
    """, TF_CPP_MIN_LOG_LEVEL="3")
    assert result.returncode == 0, result.stderr[-3000:]
    return [float(line.split("ACC")[-1]) for line in result.stdout.splitlines() if line.startswith("ACC")]


@pytest.fixture(scope="module")
def reloaded_accuracy(two_replica_runs) -> dict[str, float]:
    """``{loop: accuracy}`` of each shared run's model.keras, reloaded and evaluated by plain Keras."""
    loops = sorted(two_replica_runs)
    return dict(zip(loops, evaluate(*(two_replica_runs[loop][1] / "model.keras" for loop in loops))))


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_two_replica_run_writes_a_complete_run_directory(two_replica_runs, reloaded_accuracy, loop):
    result, run_dir = two_replica_runs[loop]
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "config.resolved.yaml", "config.yaml", "metrics.csv", "model.keras", "plan.json", "startup.log",
        "summary.json"]  # no temporary file, no reserve, no checkpoint once model.keras holds the result
    assert "global batch: 128 per replica x 2 replicas = 256" in result.stdout
    # TensorFlow's start-up INFO/WARNING lines are held back (tensorflow.log_level 2), into startup.log
    assert not re.search(r"^[IW][0-9]{4} ", result.stdout + result.stderr, re.M)
    assert "absl::InitializeLog" in (run_dir / "startup.log").read_text()
    # this machine has no NVIDIA driver, which the probe knows: cuInit's 303 is expected, held back, not explained
    assert "cuInit" not in result.stdout + result.stderr and "tfgpu: note" not in result.stderr
    assert "failed call to cuInit" in (run_dir / "startup.log").read_text()
    assert json.loads((run_dir / "summary.json").read_text())["startup_log"] == str(run_dir / "startup.log")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["loop"] == loop
    assert summary["strategy"] == "MirroredStrategy" and summary["num_replicas"] == 2
    assert summary["batch_size_per_replica"] == 128 and summary["global_batch_size"] == 256
    assert summary["logical_devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert summary["steps_per_epoch"] == 89  # ceil(22699 / 256)
    assert summary["learning_rate"] == pytest.approx(0.002)  # Adam's 0.001 x 2 replicas (linear)
    assert len(summary["epoch_seconds"]) == 2 and all(s > 0 for s in summary["epoch_seconds"])
    assert summary["samples_per_second"] > 0
    assert summary["final_metrics"]["val_accuracy"] >= 0.95  # a real model on real data
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    assert float(rows[-1]["val_accuracy"]) == pytest.approx(summary["final_metrics"]["val_accuracy"])
    config = yaml.safe_load((run_dir / "config.yaml").read_text())  # as given: the recipe and --set
    assert config["train"]["loop"] == loop and config["devices"] == {"memory_growth": True, "cpu_logical_devices": 2}
    resolved = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())  # every value
    assert resolved["train"]["loop"] == loop and resolved["devices"]["soft_placement"] is True
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["strategy"]["devices"] == ["/cpu:0", "/cpu:1"]
    # the saved model is the trained one: evaluating it gives the recorded validation accuracy
    assert reloaded_accuracy[loop] == pytest.approx(summary["final_metrics"]["val_accuracy"], abs=2e-3)


#: The seed CNN's training FLOPs per sample, by hand (2 per multiply-add): Conv2D(16, 3) on 28x28x1 gives 26x26x16,
#: 26*26*16*9*1 = 97,344 multiply-adds, done for its forward pass and its filter's gradient (the input needs none);
#: Conv2D(32, 3) on 13x13x16 gives 11x11x32, 11*11*32*9*16 = 557,568, for forward, filter and input gradients;
#: Dense(10) on 5*5*32 = 800 features, 8,000, three times too.
SEED_CNN_FLOPS = 2 * (97_344 * 2 + 557_568 * 3 + 8_000 * 3)


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_each_epoch_records_input_wait_mfu_and_the_host(two_replica_runs, loop):
    result, run_dir = two_replica_runs[loop]
    summary = json.loads((run_dir / "summary.json").read_text())
    telemetry = summary["telemetry"]
    assert telemetry["flops_per_sample"] == SEED_CNN_FLOPS == 3_782_784
    assert telemetry["flops_per_replica_step"] == SEED_CNN_FLOPS * 128
    assert "2 FLOPs per multiply-add" in telemetry["flops_counted_by"]
    peak = telemetry["peak_flops_per_worker"]
    assert "float32 1024 x 1024 matmul on" in telemetry["peak_source"] and peak > 1e9  # this CPU's own figure
    assert telemetry["sampling_percent_of_training"] < 1.0  # the monitor's own cost, measured
    assert telemetry["gpus_monitored"] == [] and telemetry["device_stats_file"] is None
    assert not (run_dir / "device_stats.csv").exists()
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    for row in rows:
        figures = {k: float(v) for k, v in row.items()}
        assert 0 <= figures["input_wait_seconds"] <= figures["train_seconds"]
        assert figures["input_wait_percent"] == pytest.approx(
            100 * figures["input_wait_seconds"] / figures["train_seconds"])
        assert figures["mfu_percent"] == pytest.approx(100 * SEED_CNN_FLOPS * figures["samples_per_second"] / peak)
        assert 0 < figures["host_cpu_percent"] <= 100 and figures["host_rss_mib"] > 100
        assert "gpu_utilization_percent" not in figures  # no GPU: no GPU columns
    assert telemetry["input_bound"] is None  # in memory, prefetched: the step hardly waits
    assert sum(f"input wait: {float(r['input_wait_percent']):.0f}% - MFU: " in result.stdout for r in rows) == 2
    assert summary["final_metrics"].keys() == {"accuracy", "loss", "val_accuracy", "val_loss"}
    # XLA told: off here, and the first call's trace time
    xla = summary["xla"]
    assert (xla["requested"], xla["compiled"]) == (False, False)
    assert xla["first_call_seconds"] == summary["startup_seconds"]["first_call"] and xla["first_call_steps"] == 32
    assert 0 <= xla["trace_and_compile_seconds"] < xla["first_call_seconds"]
    assert f"first training call {xla['first_call_seconds']:.2f} s: tracing the step" in result.stdout


@pytest.mark.slow
def test_both_loops_reach_the_same_accuracy(two_replica_runs):
    acc = {loop: json.loads((d / "summary.json").read_text())["final_metrics"]["val_accuracy"]
           for loop, (_, d) in two_replica_runs.items()}
    assert abs(acc["fit"] - acc["custom"]) <= 0.01, acc


@pytest.mark.slow
def test_builder_recipe_and_a_second_run_never_overwrites_the_first(tmp_path):
    """A model.builder recipe trains, and a second run into the same folder leaves the first run's files as they were.
    Trains its own runs: it needs two runs of a builder model in one folder, which no shared run is."""
    args = ["run", "recipes/mnist.yaml", "--set", "model.layers=null", "--set", "model.builder=tests.builders:small_cnn",
            "--set", "model.builder_args={filters: 4}", "--set", "train.epochs=1", "--set", "train.batch_size_per_replica=512",
            "--output-dir", str(tmp_path)]
    assert run_cli(*args).returncode == 0
    first = only_run_dir(tmp_path)
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    assert run_cli(*args).returncode == 0
    dirs = sorted(p for p in tmp_path.iterdir())
    assert len(dirs) == 2 and first in dirs
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    summary = json.loads((first / "summary.json").read_text())
    assert summary["model"]["layers"] == ["Conv2D", "MaxPooling2D", "Flatten", "Dense"]


@pytest.mark.slow
def test_nan_loss_stops_with_exit_7_and_keeps_the_run_directory(tmp_path):
    """A NaN loss stops the run with exit 7 and keeps its run directory, without model.keras.
    Trains its own run: the NaN loss it provokes (an SGD rate of 1e12) ends the run with exit 7."""
    result = run_cli("run", "recipes/mnist.yaml", "--set", "model.optimizer={name: sgd, learning_rate: 1.0e+12}",
                     "--set", "train.batch_size_per_replica=512", "--set", "train.epochs=3", "--output-dir", str(tmp_path))
    assert result.returncode == 7, result.stderr[-3000:]
    assert "loss became nan" in result.stderr and "Traceback" not in result.stderr
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "nan" in summary["error"]
    assert (run_dir / "config.yaml").exists() and (run_dir / "metrics.csv").exists()
    assert not (run_dir / "model.keras").exists()


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_terminate_on_nan_off_trains_on_in_both_loops(tmp_path, loop):
    """With train.terminate_on_nan off, both loops train on through a NaN loss to the last epoch.
    Trains its own run: the setting under test (terminate_on_nan off, a NaN-making rate) changes the training."""
    result = run_cli("run", "recipes/mnist.yaml", "--set", f"train.loop={loop}", "--set", "train.terminate_on_nan=false",
                     "--set", "model.optimizer={name: sgd, learning_rate: 1.0e+12}", "--set", "output.save_model=false",
                     "--set", "train.batch_size_per_replica=2048", "--set", "train.epochs=2", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs_completed"] == 2
    assert math.isnan(summary["final_metrics"]["loss"])
