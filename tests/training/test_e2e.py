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
