"""model.remat: the training forward pass in checkpointed segments gives the plain model's gradients, dropout masks
and moving statistics on a real 2-replica MirroredStrategy (Sequential, residual and nested models), a run's
figures in both loops, and less peak memory (benchmarks/remat_memory.py). The tests at the top need no TensorFlow."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from tfgpu.config import load_config
from tfgpu.errors import ConfigError
from tfgpu.training import preflight

from ..conftest import ROOT, child_env, one_paragraph, only_run_dir, run_cli, run_python

SEED = str(ROOT / "recipes" / "mnist.yaml")


@pytest.mark.parametrize("value,said", [
    ("full", "keras.RematScope mode"), ("{mode: larger_than}", "keras.RematScope mode"),
    ("{segments: 1}", "greater than or equal to 2"), ("{every: 2}", "every"),
])
def test_remat_takes_true_or_a_segment_count_and_says_why_not_keras_s_modes(value, said):
    with pytest.raises(ConfigError) as info:
        load_config(SEED, overrides=[f"model.remat={value}"])
    assert "model.remat" in str(info.value) and said in str(info.value)
    one_paragraph(info.value.report())


def test_remat_reads_true_as_the_default_segments_and_false_as_off():
    assert load_config(SEED, overrides=["model.remat=true"]).model.remat.segments is None
    assert load_config(SEED, overrides=["model.remat={segments: 3}"]).model.remat.segments == 3
    assert load_config(SEED, overrides=["model.remat=false"]).model.remat is None


def test_remat_on_jax_is_refused_before_tensorflow_starts():
    with pytest.raises(ConfigError) as info:
        preflight.check(load_config(SEED, overrides=["model.remat=true", "backend=jax"]), files=False)
    assert "backend: jax" in info.value.message and "use backend: tensorflow" in info.value.hint


#: One training step's gradients and state (moving statistics, seed generators) on 2 logical CPUs, with and without
#: Segments, from the same weights: per model, "name units checkpoints max|grad diff| max|state diff| max|grad|".
SAME_GRADIENTS = """
import os
import numpy as np, tensorflow as tf, keras
from tfgpu.errors import ConfigError
from tfgpu.training.loops.remat import Segments
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
keras.utils.set_random_seed(3)
L = keras.layers

def sequential():
    return keras.Sequential([keras.Input((12, 12, 3))] + [l for _ in range(3) for l in (
        L.Conv2D(8, 3, padding="same", activation="relu"), L.BatchNormalization(), L.Dropout(0.3))]
        + [L.Flatten(), L.Dense(5)])

def residual():
    x = inputs = keras.Input((12, 12, 3))
    x = L.Conv2D(8, 3, padding="same")(x)
    for _ in range(3):  # blocks whose skip connections join: cut after each Add, not inside
        y = L.Conv2D(8, 3, padding="same", activation="relu")(x)
        y = L.BatchNormalization()(y)
        y = L.Dropout(0.2)(y)
        x = L.Add()([x, y])
    return keras.Model(inputs, L.Dense(5)(L.GlobalAveragePooling2D()(x)))

def nested():  # augment_on: model's shape: random layers, then the model as one layer, cut inside too
    x = inputs = keras.Input((12, 12, 3))
    x = L.RandomFlip("horizontal")(x)
    inner = sequential()
    return keras.Model(inputs, inner(x))

class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = L.Dense(5)
    def call(self, x):
        return self.dense(L.Flatten()(x))

x = np.random.RandomState(0).rand(16, 12, 12, 3).astype("float32")
y = np.random.RandomState(1).randint(0, 5, 16)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
for name, build in (("sequential", sequential), ("residual", residual), ("nested", nested)):
    with strategy.scope():
        model = build()
        segments = Segments(model, None)
        start = [v.numpy() for v in model.variables]
        state0 = np.concatenate([v.numpy().ravel().astype("float64") for v in model.non_trainable_variables])
    results = []
    for forward in (lambda x: model(x, training=True), segments):
        for v, value in zip(model.variables, start):
            v.assign(value)
        @tf.function
        def step(x, y):
            def replica(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.nn.compute_average_loss(loss_fn(y, forward(x)), global_batch_size=16)
                grads = tape.gradient(loss, model.trainable_variables)
                return [tf.distribute.get_replica_context().all_reduce("sum", g) for g in grads]
            return strategy.run(replica, args=(x, y))
        data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(16))
        grads = step(*next(iter(data)))
        flat = np.concatenate([strategy.experimental_local_results(g)[0].numpy().ravel() for g in grads])
        state = np.concatenate([v.numpy().ravel().astype("float64") for v in model.non_trainable_variables])
        results.append((flat, state))
    (g0, s0), (g1, s1) = results
    moved = float(np.abs(s0 - state0).max())
    print(name, segments.cuts + 1, ",".join(segments.checkpoints), float(np.abs(g0 - g1).max()),
          float(np.abs(s0 - s1).max()), float(np.abs(g0).max()), moved)
try:
    Segments(Subclassed(), None)
except ConfigError as exc:
    print("subclassed", exc.message.split(",")[0])
"""


@pytest.mark.slow
def test_segments_give_the_plain_model_s_gradients_masks_and_statistics_on_2_replicas():
    result = run_python(SAME_GRADIENTS)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.strip()}
    for name, stretches in (("sequential", 11), ("residual", 6), ("nested", 12)):
        _, units, checkpoints, grad_diff, state_diff, largest, moved = lines[name]
        assert int(units) == stretches, (name, units)
        # bit for bit: the same dropout masks (a different mask would change the gradient by far more than 0) ...
        assert float(grad_diff) == 0.0 and float(largest) > 1e-3, (name, grad_diff, largest)
        # ... and the moving statistics and seed generators updated once, as without remat
        assert float(state_diff) == 0.0 and float(moved) > 0, (name, state_diff, moved)
        assert len(checkpoints.split(",")) == {"sequential": 2, "residual": 1, "nested": 2}[name]
    assert "add" in lines["residual"][2]  # cut after a block's join, never inside the block
    assert "needs a keras.Sequential or functional model" in " ".join(lines["subclassed"])


def rows_of(run_dir) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_custom_loop_run_with_remat_logs_the_plain_run_s_figures_and_records_its_segments(tmp_path):
    common = ("--set", "devices.cpu_logical_devices=2", "--set", "train.epochs=1", "--set", "train.steps_per_epoch=3",
              "--set", "train.validation_steps=1", "--set", "train.batch_size_per_replica=32")
    runs = {}
    # the plain run in fit, which logs the custom loop's figures on the seed recipe (shown in test_gradients.py)
    remat = ("--set", "model.remat={segments: 3}", "--set", "train.loop=custom")
    for name, extra in (("plain", ()), ("custom", remat)):
        result = run_cli("run", SEED, *common, *extra, "--output-dir", str(tmp_path / name))
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = only_run_dir(tmp_path / name)
    assert ("rematerialisation: 3 segments recomputed in the backward pass (5 places to cut; activations kept after "
            "max_pooling2d, max_pooling2d_1)") in result.stdout
    summaries = {name: json.loads((run / "summary.json").read_text()) for name, run in runs.items()}
    assert summaries["plain"]["remat"] is None
    assert summaries["custom"]["remat"] == {"segments": 3, "cuts": 5,
                                            "checkpoints": ["max_pooling2d", "max_pooling2d_1"]}
    plain, remat = rows_of(runs["plain"])[0], rows_of(runs["custom"])[0]
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "gradient_norm"):
        assert float(remat[key]) == pytest.approx(float(plain[key]), rel=1e-6), key


@pytest.mark.slow
def test_remat_lowers_the_peak_memory_of_a_deep_cnn_and_trains_it_as_without_in_fit(tmp_path):
    out = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "remat_memory.py"), "--repeats", "1",
                           "--blocks", "6", "--batch", "256", "--epochs", "1", "--steps", "2", "--loop", "fit",
                           "--json", str(out)], capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "remat / plain: peak memory x" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["remat_record"]["segments"] == 4 and figures["remat_record"]["cuts"] == 19
    # BatchNormalization and Dropout in every block: the same masks and statistics, so the same figures
    (plain,), (remat,) = figures["plain"]["final_metrics"], figures["remat"]["final_metrics"]
    assert plain.keys() == remat.keys() and all(remat[k] == pytest.approx(plain[k], rel=1e-6) for k in plain)
    # measured 1,171 against 963 MiB on 2 cores: the activations of 6 blocks at batch 256 against about 2 blocks'
    assert figures["plain"]["peak_rss_mib"] - figures["remat"]["peak_rss_mib"] > 100, figures
