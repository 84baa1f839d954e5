"""Big models on small GPUs: gradient accumulation and clipping under a real 2-replica MirroredStrategy (both
loops), the epoch cuts, train.max_time's stop and resume, and tfgpu run --fast-dev-run. The tests at the top need
no TensorFlow."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tfgpu.config import load_config
from tfgpu.config.schema import duration_seconds
from tfgpu.data.feed import train_steps
from tfgpu.errors import ConfigError
from tfgpu.training import preflight
from tfgpu.training.loops import gradients

from ..conftest import ROOT, one_paragraph, only_run_dir, run_cli, run_python, small_steps

SEED = str(ROOT / "recipes" / "mnist.yaml")
TWO_CPUS = ("--set", "devices.cpu_logical_devices=2")


def config(*overrides: str):
    return load_config(SEED, overrides=list(overrides))


def rows_of(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# --- no TensorFlow ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,seconds", [("3h50m", 13800), ("90m", 5400), ("1d12h", 129600), ("45s", 45),
                                          ("1.5h", 5400), ("03:50:00", 13800), ("1-00:00:00", 86400),
                                          ("10:30", 630), (120, 120)])
def test_max_time_reads_durations_as_people_and_slurm_write_them(text, seconds):
    assert duration_seconds(text) == seconds
    assert config(f"train.max_time={text}").train.max_time == seconds


@pytest.mark.parametrize("text", ["3 hours", "h", "0s", "-5", "", "1x"])
def test_a_duration_that_is_not_one_is_refused_with_the_forms_allowed(text):
    with pytest.raises(ConfigError) as info:
        config(f"train.max_time={text!r}" if text else "train.max_time=''")
    assert "train.max_time" in str(info.value)
    assert "3h50m" in str(info.value)


@pytest.mark.parametrize("overrides,named", [
    (["backend=jax", "train.gradient_accumulation_steps=4"], "backend: jax"),
    (["model.optimizer={name: adam, gradient_accumulation_steps: 4}"], "keras-team/keras#20582"),
    (["train.gradient_clipping={global_norm: 1.0}", "model.optimizer={name: sgd, clipnorm: 2.0}"], "clipnorm"),
    (["train.max_time=1h", "train.checkpoint=false"], "train.checkpoint"),
    (["train.steps_per_epoch=5", "data.cache=/tmp/tfgpu-cache"], "data.cache"),
    (["train.ema=true", "train.early_stopping={restore_best_weights: true}"], "restore_best_weights"),
    (["train.ema=true", "model.optimizer={name: adam, use_ema: true}"], "use_ema"),
])
def test_what_the_optimizer_step_cannot_do_is_refused_before_tensorflow_starts(overrides, named):
    with pytest.raises(ConfigError) as info:
        preflight.check(config(*overrides), files=False)
    assert named in str(info.value)
    one_paragraph(info.value.report())


def test_accumulation_refuses_a_builders_own_batches():
    cfg = load_config(None, overrides=["train.gradient_accumulation_steps=2", "data.kind=builder",
                                       "data.builder=tests.builders:small_cnn", "data.batched=true"])
    with pytest.raises(ConfigError) as info:
        gradients.check(cfg)
    assert "data.batched: true" in info.value.message and "K x the global batch" in info.value.message


@pytest.mark.parametrize("value,said", [("{}", "exactly one of"), ("{global_norm: 1, value: 2}", "global_norm, value"),
                                        ("{global_norm: 0}", "greater than 0")])
def test_gradient_clipping_takes_exactly_one_positive_bound(value, said):
    with pytest.raises(ConfigError) as info:
        config(f"train.gradient_clipping={value}")
    assert said in str(info.value)


def test_the_plan_shows_the_effective_batch_and_scales_the_rate_by_it():
    result = run_cli("plan", SEED, *TWO_CPUS, "--set", "train.gradient_accumulation_steps=4",
                     "--set", "train.batch_size_per_replica=16")
    assert result.returncode == 0, result.stderr
    assert "16 per replica x 2 = 32 global; x 4 accumulation steps = 128 per optimizer step" in result.stdout
    assert "Learning rate: x8 (linear scaling)" in result.stdout  # 2 replicas x 4 micro-batches


def test_jax_feeds_cut_an_epoch_to_whole_batches():
    assert train_steps(22_699, 128, 2) == (178, 42)
    assert train_steps(22_699, 128, 2, most=10) == (10, 128)
    assert train_steps(22_699, 128, 2, most=500) == (178, 42)


# --- real training ---------------------------------------------------------------------------------------------

#: Three optimizer steps of 128 rows: K=4 micro-batches of 16 per replica, or one of 64, on 2 replicas.
EQUIVALENT = ("--set", "train.epochs=1", "--set", "train.steps_per_epoch=3", "--set", "train.validation_steps=1",
              "--set", "train.lr_scaling=none", *TWO_CPUS)

WEIGHTS_DIFFER = """
import keras, numpy as np
ref, *others = (keras.saving.load_model(p).get_weights() for p in PATHS)
print(max(float(np.max(np.abs(x))) for x in ref))
for weights in others:
    print(max(float(np.max(np.abs(x - y))) for x, y in zip(weights, ref)))
"""


def weights_differ(reference: Path, *others: Path) -> list[float]:
    """The largest difference between each of ``others``' ``model.keras`` weights and ``reference``'s, then the
    largest of ``reference``'s weights: one process for all."""
    paths = [str(p / "model.keras") for p in (reference, *others)]
    result = run_python(WEIGHTS_DIFFER.replace("PATHS", repr(paths)))
    assert result.returncode == 0, result.stderr[-3000:]
    largest, *diffs = (float(x) for x in result.stdout.split())
    return [*diffs, largest]


@pytest.mark.slow
def test_four_micro_batches_of_16_train_the_weights_one_batch_of_64_does_on_2_replicas_in_both_loops(tmp_path):
    runs = {}
    for name, loop, k, per_replica in (("fit-4", "fit", 4, 16), ("custom-4", "custom", 4, 16), ("fit-1", "fit", 1, 64)):
        parent = tmp_path / name
        result = run_cli("run", SEED, *EQUIVALENT, "--set", f"train.loop={loop}",
                         "--set", f"train.gradient_accumulation_steps={k}",
                         "--set", f"train.batch_size_per_replica={per_replica}", "--output-dir", str(parent))
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = only_run_dir(parent)
    accumulated = summary_of(runs["fit-4"])
    assert (accumulated["gradient_accumulation_steps"], accumulated["global_batch_size"],
            accumulated["effective_batch_size"], accumulated["steps_per_epoch"]) == (4, 32, 128, 3)
    assert summary_of(runs["fit-1"])["effective_batch_size"] == 128
    fit, custom, largest = weights_differ(runs["fit-1"], runs["fit-4"], runs["custom-4"])
    assert fit < 1e-5 and custom < 1e-5 and largest > 0.05, (fit, custom, largest)  # the same, trained weights
    # the same gradient, all-reduced once a step: the same global norm, and the same training figures
    one = rows_of(runs["fit-1"])[0]
    for name in ("fit-4", "custom-4"):
        four = rows_of(runs[name])[0]
        for key in ("gradient_norm", "gradient_norm_max", "loss", "accuracy"):
            assert float(four[key]) == pytest.approx(float(one[key]), rel=1e-5), (name, key)
        assert 0 < float(four["gradient_norm"]) <= float(four["gradient_norm_max"])


@pytest.mark.slow
def test_global_norm_clipping_on_2_replicas_clips_the_all_reduced_gradient_as_1_replica_does(tmp_path):
    # SGD (Adam would hide a clipped gradient's scale); the gradient's norm is about 0.5, clipped to 0.05
    common = ("--set", "model.optimizer={name: sgd, learning_rate: 0.5}", "--set", "train.lr_scaling=none",
              "--set", "train.epochs=1", "--set", "train.steps_per_epoch=4", "--set", "train.validation_steps=1",
              "--set", "train.gradient_clipping={global_norm: 0.05}", "--set", "train.loop=custom")
    runs = {}
    for replicas in (2, 1):
        parent = tmp_path / str(replicas)
        result = run_cli("run", SEED, *common, "--set", f"devices.cpu_logical_devices={replicas}",
                         "--set", f"train.batch_size_per_replica={64 // replicas}", "--output-dir", str(parent))
        assert result.returncode == 0, result.stderr[-3000:]
        assert "gradient clipping: global_clipnorm 0.05, after the all-reduce" in result.stdout
        runs[replicas] = only_run_dir(parent)
    assert summary_of(runs[2])["gradient_clipping"] == {"global_clipnorm": 0.05}
    assert float(rows_of(runs[2])[0]["gradient_norm"]) > 0.2  # clipping did act, on every step
    diff, _ = weights_differ(runs[1], runs[2])
    # Keras's own clipping, before its all-reduce, clips each replica's half to 0.05: twice the step
    assert diff < 1e-5, diff


@pytest.mark.slow
def test_max_time_saves_exits_75_and_resume_gives_every_cut_epoch_once(tmp_path, small_mnist):
    parent = tmp_path / "runs"
    first = run_cli("run", SEED, "--set", "train.epochs=2", "--set", "train.batch_size_per_replica=512",
                    "--set", "train.steps_per_execution=5", "--set", "train.steps_per_epoch=10",
                    "--set", "train.max_time=1s", "--output-dir", str(parent), TFGPU_DATA_DIR=str(small_mnist))
    assert first.returncode == 75, first.stderr[-3000:]
    assert "train.max_time (1 s from the process's start) ran out: stopped at epoch 1 step 5" in first.stderr
    run_dir = only_run_dir(parent)
    assert summary_of(run_dir)["status"] == "preempted"
    resumed = run_cli("run", "--resume", str(run_dir), "--set", "train.max_time=null",
                      TFGPU_DATA_DIR=str(small_mnist))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = summary_of(run_dir)
    assert summary["status"] == "completed"
    assert summary["steps_per_epoch"] == 10 < small_steps(512)  # cut: the split has 15
    assert summary["limits"]["steps_per_epoch"] == 10
    assert [int(r["epoch"]) for r in rows_of(run_dir)] == [0, 1]


@pytest.mark.slow
def test_fast_dev_run_trains_saves_reloads_and_evaluates_one_batch_and_keeps_nothing(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = run_cli("run", SEED, "--fast-dev-run", TMPDIR=str(scratch))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fast dev run passed in" in result.stdout
    assert "model.keras reloaded and evaluated (validation loss" in result.stdout
    assert "nothing kept" in result.stdout
    assert list(scratch.iterdir()) == []  # its run directory is gone
    kept = tmp_path / "kept"
    result = run_cli("run", SEED, "--fast-dev-run", "--keep", str(kept), TMPDIR=str(scratch))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(kept)
    summary = summary_of(run_dir)
    assert (summary["status"], summary["steps_per_epoch"], summary["epochs_planned"]) == ("completed", 1, 1)
    assert (run_dir / "model.keras").is_file() and summary["checkpoint"]["saves"] == 1  # (a completed run's is removed)
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    assert evaluation["splits"]["validation"]["samples"] == 4096  # one batch of the 10,000
    assert f"kept in {run_dir}" in result.stdout


def test_fast_dev_run_refuses_what_it_cannot_do():
    result = run_cli("run", SEED, "--fast-dev-run", "--workers", "2")
    assert result.returncode == 2
    assert "does not take --workers" in result.stderr
    result = run_cli("run", SEED, "--keep", "/tmp/x")
    assert result.returncode == 2 and "--keep DIR goes with --fast-dev-run" in result.stderr


# --- tfgpu lr-find -------------------------------------------------------------------------------------------

def test_the_steepest_descent_is_found_before_the_lowest_loss():
    from tfgpu.training.lr_find import rates_between, smooth, steepest

    rates = rates_between(1e-4, 1.0, 41)
    assert rates[0] == pytest.approx(1e-4) and rates[-1] == pytest.approx(1.0) and rates[20] == pytest.approx(1e-2)
    # flat, a fall centred at 1e-2, the lowest at 1e-1, then a climb
    losses = [2.0 - 1.5 / (1 + (1e-2 / r) ** 3) + (5.0 if r > 0.2 else 0.0) for r in rates]
    assert steepest(rates, losses) == pytest.approx(1e-2, rel=0.3)
    assert steepest(rates, [1.0] * 41) is None  # it never falls
    assert smooth([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])  # bias-corrected: no pull towards 0


@pytest.mark.slow
def test_lr_find_draws_the_curve_and_suggests_a_rate_that_trains(tmp_path):
    picture = tmp_path / "lr.png"
    small = ("--set", "train.batch_size_per_replica=64", *TWO_CPUS)
    result = run_cli("lr-find", SEED, *small, "-o", str(picture), needs=("plots",))
    assert result.returncode == 0, result.stderr[-3000:]
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 20_000
    with open(tmp_path / "lr.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert 20 <= len(rows) <= 100 and float(rows[0]["learning_rate"]) == pytest.approx(1e-7)
    line = next(line for line in result.stdout.splitlines() if line.startswith("use it: tfgpu run"))
    setting = line.split("--set ", 1)[1].strip("'")
    rate = float(setting.split("learning_rate: ")[1].rstrip("}"))
    assert 1e-4 < rate < 0.1, result.stdout  # Adam on the seed CNN: not the range's ends
    trained = run_cli("run", SEED, *small, "--set", setting, "--set", "train.epochs=1",
                      "--set", "train.steps_per_epoch=60", "--output-dir", str(tmp_path / "runs"))
    assert trained.returncode == 0, trained.stderr[-3000:]
    val_accuracy = float(rows_of(only_run_dir(tmp_path / "runs"))[0]["val_accuracy"])
    assert val_accuracy > 0.85, val_accuracy  # 60 steps of 128 at the suggested rate


# --- train.batch_size_per_replica: auto ----------------------------------------------------------------------

def test_out_of_memory_is_told_from_other_errors_through_the_run_s_own_wrapping():
    from tfgpu.training.batch_finder import is_out_of_memory

    class ResourceExhaustedError(Exception):  # TensorFlow's name; its class lives in TensorFlow
        pass

    try:
        try:
            raise ResourceExhaustedError("OOM when allocating tensor with shape[4096,26,26,16]")
        except ResourceExhaustedError as exc:
            raise RuntimeError("training failed") from exc  # what tfgpu run's TrainingError carries
    except RuntimeError as wrapped:
        assert is_out_of_memory(wrapped)
    assert is_out_of_memory(RuntimeError("INTERNAL: RESOURCE_EXHAUSTED: Out of memory while trying to allocate"))
    assert is_out_of_memory(RuntimeError("cuDNN launch failure: CUDNN_STATUS_ALLOC_FAILED"))
    assert not is_out_of_memory(ValueError("Input 0 of layer conv2d is incompatible with the layer"))


@pytest.mark.slow
def test_auto_batch_finds_the_seam_s_limit_exactly_caches_it_and_the_run_uses_it(tmp_path, small_mnist):
    cache = tmp_path / "cache"
    env = {"TFGPU_DATA_DIR": str(small_mnist), "XDG_CACHE_HOME": str(cache)}
    found = run_cli("find-batch-size", SEED, *TWO_CPUS, "--start", "32", "--most", "40",
                    TFGPU_FAKE_OOM_ABOVE="37", **env)
    assert found.returncode == 0, found.stderr[-3000:]
    # 32 trains; 40 (the most) fails; then 36 trains, 38 fails, 37 trains: the limit, exactly
    tried = [line.split(":")[0] for line in found.stdout.splitlines() if line.startswith("batch ")]
    assert tried == [f"batch {n} per replica" for n in (32, 40, 36, 38, 37)], found.stdout
    assert "auto = 33 (the largest that trained is 37, 38 ran out of memory; 37 less 10%; 5 trials)" in found.stdout
    table = json.loads((cache / "tfgpu" / "batch_sizes.json").read_text())
    (entry,) = table.values()
    assert (entry["batch"], entry["largest_ok"], entry["smallest_oom"]) == (33, 37, 38)
    assert "OOM when allocating" in entry["tried"][1]["why"]
    parent = tmp_path / "runs"
    run = run_cli("run", SEED, *TWO_CPUS, "--set", "train.batch_size_per_replica=auto", "--set", "train.epochs=1",
                  "--set", "train.steps_per_epoch=3", "--output-dir", str(parent), **env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "auto = 33" in run.stdout and "from the cache" in run.stdout
    summary = summary_of(only_run_dir(parent))
    assert summary["batch_size_per_replica"] == 33 and summary["batch_size_search"]["cached"] is True
    assert "batch_size_per_replica: 33" in (only_run_dir(parent) / "config.yaml").read_text()
    plan = run_cli("plan", SEED, *TWO_CPUS, "--set", "train.batch_size_per_replica=auto", **env)
    assert "batch: 33 per replica x 2 = 66 global" in plan.stdout


@pytest.mark.slow
def test_auto_batch_on_real_cpus_stops_at_the_training_split_over_the_replicas(tmp_path, small_mnist):
    # no seam: 2 logical CPUs of this machine's memory, which holds the whole split in one step
    result = run_cli("find-batch-size", SEED, *TWO_CPUS, "--start", "2048", TFGPU_DATA_DIR=str(small_mnist),
                     XDG_CACHE_HOME=str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr[-3000:]
    tried = [line for line in result.stdout.splitlines() if line.startswith("batch ")]
    assert [line.split(":")[0] for line in tried] == [f"batch {n} per replica" for n in (2048, 3840)]
    assert all(": trained (" in line for line in tried)
    assert "auto = 3840 (3840 trained and is the most worth trying" in result.stdout  # 7,680 digits / 2


# --- model.sync_batchnorm and train.ema -----------------------------------------------------------------------

SYNC_BN = """
import numpy as np, tfgpu
info = tfgpu.setup({"devices": {"cpu_logical_devices": 2}, "distribute": {"strategy": "mirrored"}})
import keras
from tfgpu.training.trainer import sync_batchnorm
rng = np.random.default_rng(0)
# replica 0 gets rows around 0, replica 1 rows around 10: each replica's variance is about 1, the global one 26
x = np.concatenate([rng.normal(0, 1, (4, 3)), rng.normal(10, 1, (4, 3))]).astype("float32")
for sync in (True, False):
    with info.strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(momentum=0.0)])
        names = sync_batchnorm(model, sync, "tensorflow")
        model.compile(optimizer="sgd", loss="mse")
    model.fit(x, x, batch_size=8, epochs=1, shuffle=False, verbose=0)
    bn = model.layers[0]
    print(sync, len(names), float(np.abs(bn.moving_mean.numpy() - x.mean(0)).max()),
          float(np.abs(bn.moving_variance.numpy() - x.var(0)).max()))
"""


@pytest.mark.slow
def test_sync_batchnorm_gives_each_replica_the_global_batch_s_statistics():
    result = run_python(SYNC_BN)
    assert result.returncode == 0, result.stderr[-3000:]
    synced, unsynced = (line.split() for line in result.stdout.splitlines()[-2:])
    assert synced[:2] == ["True", "1"] and float(synced[2]) < 1e-4 and float(synced[3]) < 1e-3
    assert unsynced[:2] == ["False", "0"] and float(unsynced[3]) > 20  # a replica's own variance, not the batch's


#: The seed CNN with SGD and EMA; 2 epochs of 3 steps of 64 rows (validation: one batch); a step a call.
EMA_RUN = ("--set", "model.optimizer={name: sgd, learning_rate: 0.1}", "--set", "train.ema={momentum: 0.5}",
           "--set", "train.lr_scaling=none", "--set", "train.epochs=2", "--set", "train.steps_per_epoch=3",
           "--set", "train.validation_steps=1", "--set", "train.steps_per_execution=1", "--set", "train.loop=custom")
TWO_BY_32 = ("--set", "devices.cpu_logical_devices=2", "--set", "train.batch_size_per_replica=32")


@pytest.mark.slow
def test_ema_on_2_replicas_trains_as_on_1_survives_a_stop_and_resume_and_is_what_is_saved(tmp_path):
    runs = {}
    for name, extra in (("two", TWO_BY_32), ("one", ("--set", "train.batch_size_per_replica=64")),
                        ("stopped", (*TWO_BY_32, "--set", "train.max_time=1s")),
                        ("raw", (*TWO_BY_32, "--set", "train.ema=null"))):
        parent = tmp_path / name
        result = run_cli("run", SEED, *EMA_RUN, *extra, "--output-dir", str(parent))
        assert result.returncode == (75 if name == "stopped" else 0), result.stderr[-3000:]
        runs[name] = only_run_dir(parent)
        if name == "two":
            assert "EMA of the weights: momentum 0.5; validation and model.keras use the averages" in result.stdout
    assert summary_of(runs["two"])["ema"]["momentum"] == 0.5
    stopped = runs["stopped"]
    assert summary_of(stopped)["status"] == "preempted"
    resumed = run_cli("run", "--resume", str(stopped), "--set", "train.max_time=null")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # the averages on 2 replicas are 1 replica's; the stop saved them and the resume went on; they are not the raw
    one, after_resume, raw, _ = weights_differ(runs["two"], runs["one"], stopped, runs["raw"])
    assert one < 1e-5 and after_resume < 1e-5 and raw > 1e-3, (one, after_resume, raw)
    # model.keras holds what the last validation measured: the averages
    evaluated = run_cli("evaluate", str(runs["two"]), "--set", "train.validation_steps=1")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads((runs["two"] / "evaluation.json").read_text())["splits"]["validation"]
    last = rows_of(runs["two"])[-1]
    assert report["loss"] == pytest.approx(float(last["val_loss"]), rel=1e-5)
    assert report["samples"] == 64  # one batch of the global 2 x 32
