"""The speed work that a user can see without a stopwatch: how many steps go into one
call, that epochs stay exact, that nothing is retraced, and what the run summary records.

Timings themselves are measured by `benchmarks/run.py`, not here.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfgpu.training.trainer import AUTO_STEPS_PER_EXECUTION, resolve_steps_per_execution

from ..conftest import ROOT, child_env, run_python, write_mnist_subset


@pytest.mark.parametrize("setting, steps, expected", [
    ("auto", 6, 6),        # the seed recipe on one replica: the whole epoch in one call
    ("auto", 3, 3),
    ("auto", 178, 2),      # 128 per replica on one replica: 2 x 89, the largest divisor up to 32
    ("auto", 89, 1),       # a prime step count: one step per call, never the whole epoch
    ("auto", 96, 32),
    ("auto", 100, 25),
    (1, 178, 1),
    (5, 178, 2),           # a most: rounded down to a divisor, never up
    (500, 178, 178),       # never more than one epoch
])
def test_fit_on_jax_steps_per_execution_always_divides_the_epoch(setting, steps, expected):
    per_call, _ = resolve_steps_per_execution(setting, steps, "fit", "jax")
    assert per_call == expected and steps % per_call == 0
    assert per_call <= min(AUTO_STEPS_PER_EXECUTION if setting == "auto" else setting, steps)


@pytest.mark.parametrize("setting, steps, expected", [
    ("auto", 6, 6), ("auto", 178, 32), ("auto", 89, 32), ("auto", 96, 32), (1, 178, 1), (5, 178, 5), (500, 178, 178),
])
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_on_tensorflow_both_loops_run_the_setting_whatever_the_epochs_factors(setting, steps, expected, loop):
    # fit's calls end at the epoch's end without dividing it (tfgpu.training.loops.fit.fit_calls): 178 steps are
    # 5 calls of 32 and one of 18, as with the custom loop, no longer 89 calls of 2
    assert resolve_steps_per_execution(setting, steps, loop, "tensorflow")[0] == expected


@pytest.fixture(scope="module")
def runs(two_replica_runs):
    """The shared 2-replica runs (128 per replica, 89 steps per epoch): ``{loop: (result, summary, csv rows)}``."""
    return {loop: (result, json.loads((run_dir / "summary.json").read_text()),
                   list(csv.DictReader((run_dir / "metrics.csv").open())))
            for loop, (result, run_dir) in two_replica_runs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_summary_records_the_speed_choices(runs, loop):
    result, summary, _ = runs[loop]
    # 89 steps, a prime: both loops run 32 steps a call (two calls of 32 and one of 25), not the whole epoch
    # (fit once ran one step a call here: its calls had to divide the epoch)
    per_call = 32
    assert summary["steps_per_epoch"] == 89 and summary["steps_per_execution"] == per_call
    reason = summary["steps_per_execution_reason"]
    assert reason.startswith("auto: at most 32 steps a call (an epoch's last call: 25)")
    assert ("a call over 5 s is shortened" in reason) == (loop == "custom")
    # 2 logical CPUs: each replica takes its rows of a plain iterator's global batch (tfgpu.training.loops.replica_batches)
    assert summary["input"].startswith("a plain tf.data iterator of global batches")
    # held in memory, a call's 32 batches are gathered at once (replica_batches.Blocks): 256 rows of 3,137 bytes
    assert summary["input"].endswith("; held in memory, read 32 batches at a time (one gather and transform a block)")
    startup = summary["startup_seconds"]
    assert list(startup) == ["checks", "tensorflow", "data", "model", "run_directory", "first_call"]
    assert all(v > 0 for v in startup.values())
    assert sum(startup.values()) == pytest.approx(summary["first_step_seconds"])
    assert summary["jit_compile"] is False and "off on CPUs" in summary["jit_compile_reason"]
    assert summary["mixed_precision"] == "float32"
    assert f"tfgpu: steps per call: {per_call} ({reason})\ntfgpu: XLA: off" in result.stdout
    assert 0 < summary["first_step_seconds"] < summary["wall_seconds"]
    assert summary["started_at"] > 1.7e9  # a Unix time
    for train, epoch in zip(summary["train_seconds"], summary["epoch_seconds"]):
        assert 0 < train < epoch  # the validation pass is excluded from training time
    steady = summary["epochs"][1]
    assert summary["samples_per_second"] == pytest.approx(22699 / steady["train_seconds"])


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_metrics_csv_has_the_timing_columns(runs, loop):
    rows = runs[loop][2]
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    for r in rows:
        assert float(r["train_seconds"]) < float(r["epoch_seconds"])
        assert float(r["samples_per_second"]) == pytest.approx(22699 / float(r["train_seconds"]), rel=1e-6)


@pytest.mark.slow
def test_custom_loop_traces_each_step_function_once(runs):
    # 89 steps per epoch in calls of 32, 32 and 25, a partial last batch (22699 = 88 x 256 + 171)
    # and two epochs: still one trace each, because the step count is a tensor and the batch
    # dimension is unknown from the start.
    assert runs["custom"][1]["traces"] == {"train": 1, "validation": 1}


@pytest.mark.slow
def test_fit_keeps_its_training_iterator_past_the_run_so_it_ends_without_a_pause(tmp_path):
    """fit's training iterators outlive the run until the next run in the process ends (or exit), when they are
    released; the custom loop's two iterators are kept the same way. On CPU replicas (here) the batches come
    from a plain iterator of tfgpu's (tfgpu.training.loops.replica_batches), and Keras's own distributed iterator reads a
    one-batch stand-in: it is still one to keep; tfgpu's validation iterator is kept with them.

    Destroyed when fit returns, a MirroredStrategy iterator waited for tf.data's autotuning thread: the seed
    recipe at 2 replicas paused 1.3-4.8 s between its last epoch line and 'done' in 6 runs of 16, and in 0 of 26
    kept (tfgpu.training.loops.keep_iterators). The pause itself is timing; what this checks is what removes it,
    in one process running the real command twice (2 replicas, the breast-cancer CSV, an epoch each)."""
    result = run_python(f"""
        import gc, weakref
        from tfgpu.cli.main import main
        from tfgpu.training import loops
        args = ["run", "recipes/breast_cancer.yaml", "--set", "devices.cpu_logical_devices=2", "--set",
                "train.epochs=1", "--output-dir", {str(tmp_path)!r}]
        try:
            main(args, standalone_mode=False)
        except SystemExit:
            pass
        kept = loops.LAST_RUN_ITERATORS
        (keras_iterator,) = [i for i in kept if type(i).__name__ == "TFEpochIterator"]
        first = weakref.ref(keras_iterator._current_iterator)  # Keras's tf.distribute iterator in fit
        print("KEPT", sorted(type(i).__name__ for i in kept), type(first()).__name__)
        del kept, keras_iterator
        main([*args, "--set", "train.loop=custom"], standalone_mode=False)
        gc.collect()
        print("CUSTOM", [type(i).__name__ for i in loops.LAST_RUN_ITERATORS], "RELEASED", first() is None)
    """, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # fit: Keras's (the stand-in's), tfgpu's training iterator and its validation iterator (tfgpu validates)
    assert "KEPT ['OwnedIterator', 'OwnedIterator', 'TFEpochIterator'] DistributedIterator" in result.stdout, \
        result.stdout[-2000:]
    assert "CUSTOM ['OwnedIterator', 'OwnedIterator'] RELEASED True" in result.stdout, result.stdout


#: Training and test digits the benchmark scripts' tests read (a script is under test, not a speed).
SUBSET_TRAIN, SUBSET_TEST = 8192, 2000


@pytest.mark.slow
def test_benchmark_harness_writes_the_table_json_and_ratios_and_survives_a_crashed_baseline(tmp_path, monkeypatch):
    """benchmarks/run.py writes its table, JSON and ratios, and runs a crashed baseline again.
    Trains its own runs: the benchmark times each variant's own training, which no shared run can stand in for.
    What is under test is the harness, not the speed, so its variants read a smaller MNIST (the first 8,192
    training and 2,000 test digits of the real one, under a TFGPU_DATA_DIR of its own) at 1,024 per replica:
    8 steps an epoch, as the shipped 4,096 per replica gives 6 on the whole set, at a third of the samples."""
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    real = bench.command

    def plain_tape_crashes_once(variant, *args):
        # A baseline dies of a real SIGSEGV the first time it starts, as the plain-Keras one did once in CI: the
        # tape script, whose tf.data pipeline does not meet that crash, so the plain-Keras baseline keeps its own
        # retry for the SIGSEGV it can die of (docs/limitations.md; its retry crashed too once, under load).
        cmd = real(variant, *args)
        if variant != "plain_tape":
            return cmd
        return [sys.executable, str(ROOT / "tests" / "scripts" / "crash_once.py"), str(tmp_path / "crashed"), *cmd]

    monkeypatch.setattr(bench, "command", plain_tape_crashes_once)
    env = child_env()
    for name in ("BASE_INSTALL_HIDES", "PYTHONPATH"):  # the harness's processes see the base install too
        monkeypatch.setenv(name, env[name])
    # TFGPU_DATA_DIR relative to the caller's directory, as the README writes it (../shared/data).
    data = write_mnist_subset(tmp_path / "data", SUBSET_TRAIN, SUBSET_TEST)
    monkeypatch.setenv("TFGPU_DATA_DIR", os.path.relpath(data, ROOT))
    monkeypatch.chdir(ROOT)
    out = tmp_path / "bench"
    code = bench.main(["--repeats", "1", "--epochs", "2", "--batches", "1024", "--replicas", "1",
                       "--startup-repeats", "1", "--out", str(out)])
    assert code == 0
    report = json.loads((out / "results.json").read_text())
    group = report["groups"]["1024x1"]
    assert set(group["variants"]) == {"keras_fit", "tfgpu_fit", "plain_tape", "tfgpu_custom", "floor"}
    for name, stats in group["variants"].items():
        assert stats["failed"] == 0 and stats["wall_seconds"]["median"] > 0
        if name == "plain_tape":
            assert stats["crashed"] == 1
        else:  # plain Keras's own SIGSEGV, once at most (else the run failed)
            assert stats["crashed"] <= (1 if name == "keras_fit" else 0), (name, stats)
        assert stats["samples_per_second"]["median"] > 0
        # one run of 2 epochs each: one steady epoch, so its fastest and its median are the same figure
        assert stats["best_samples_per_second"]["median"] == pytest.approx(stats["samples_per_second"]["median"])
        assert 0 < stats["first_step_seconds"]["median"] < stats["wall_seconds"]["median"]
        if name != "floor":
            assert stats["val_accuracy"]["median"] > 0.3
    crash = next(r for r in report["runs"] if r["variant"] == "plain_tape")["crashed"]
    assert [(c["exit"], c["signal"]) for c in crash] == [(-11, "SIGSEGV")]
    assert group["ratios"]["tfgpu_fit / keras_fit wall"] > 0
    assert len(group["parameters"]) == 1 and group["parameters"][0] > 0  # the same model everywhere
    assert len(group["targets"]) == 6
    assert group["targets"][1]["target"] == "tfgpu_custom samples/s >= 0.95 x floor (best epoch)"
    assert group["targets"][1]["measured"] == pytest.approx(group["ratios"]["tfgpu_custom / floor best epoch"])
    assert set(report["startup"]) == {"tfgpu --help", "tfgpu plan recipes/mnist.yaml", 'python -c "import tfgpu"',
                                      'python -c "import tensorflow"'}
    text = (out / "results.md").read_text()
    assert "| tfgpu_fit |" in text and "| target | measured | met |" in text and report["machine"]["cores"]
    assert "| samples/s | best epoch samples/s |" in text
    assert "### Start-up" in text and "Crashed and run again" in text and "plain_tape 1x" in text


@pytest.mark.slow
def test_sources_benchmark_writes_its_table_with_every_variant(tmp_path):
    """benchmarks/sources.py writes its PNG folder and TFRecord shards, then its table with every data-source
    variant. Trains its own runs: the benchmark times training on each data source, which no shared run can stand
    in for. What is under test is the script, so it reads the first 8,192 training and 2,000 test digits (its own
    TFGPU_DATA_DIR), written by the script itself as a PNG folder and TFRecord shards."""
    out = tmp_path / "bench"
    work = tmp_path / "work"
    env = child_env()
    env["TFGPU_DATA_DIR"] = str(write_mnist_subset(tmp_path / "data", SUBSET_TRAIN, SUBSET_TEST))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sources.py"), "--repeats", "1", "--epochs", "2",
                           "--replicas", "1", "--batch", "512", "--work", str(work), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "sources.json").read_text())
    group = report["groups"]["512x1"]
    assert set(group["variants"]) == {"tfgpu_npz", "tfgpu_png", "tfgpu_tfrecord", "keras_png"}
    for stats in group["variants"].values():
        assert stats["failed"] == 0 and stats["samples_per_second"]["median"] > 0
        assert stats["val_accuracy"]["median"] > 0.5
    assert len(group["parameters"]) == 1  # the same model everywhere
    tfgpu_rows = [r for r in report["runs"] if r["variant"].startswith("tfgpu")]
    assert all(r["cache"].startswith("memory") and r["train_samples"] == SUBSET_TRAIN for r in tfgpu_rows)
    assert len(list((work / "mnist_png" / "test").rglob("*.png"))) == SUBSET_TEST
    assert len(list((work / "mnist_tfrecord").glob("train-*.tfrecord"))) == 8
    assert [t["target"] for t in group["targets"]] == ["tfgpu_png samples/s >= 0.85 x tfgpu_npz",
                                                       "tfgpu_tfrecord samples/s >= 0.85 x tfgpu_npz",
                                                       "tfgpu_png wall < keras_png wall"]
    assert "| keras_png |" in (out / "sources.md").read_text()
