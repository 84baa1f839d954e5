"""What bounded steps per call cost: tfgpu's loops with the new `auto` against the old one, in one process.

    TFGPU_DATA_DIR=../shared/data python benchmarks/call_length.py REPLICAS ROUNDS EPOCHS STEPS
    e.g. ... call_length.py 1 6 5 178     # 128 per replica on one replica: fit 2 vs 89, custom 32 vs 89
         ... call_length.py 2 6 5 89      # two logical CPUs, a prime step count: fit 1 vs 89, custom 32 vs 89

`train.steps_per_execution: auto` was the smallest divisor of the epoch's steps from 32 up
(178 steps: 89, a prime count: the whole epoch); it is now at most 32 (fit: the largest
divisor up to 32, custom: 32 with a shorter last call and calls timed). Each variant trains the
seed CNN on STEPS batches of 128 x REPLICAS MNIST training images with tfgpu's own loops
(`tfgpu.training.loops.fit.train_fit`, `tfgpu.training.loops.custom.train_custom`) under OneDeviceStrategy or a
MirroredStrategy over logical CPUs (ReductionToOneDevice, as tfgpu plans it); runs of EPOCHS
epochs, the variants interleaved run by run (A B C D A B C D ...) so drifts of a shared machine
hit them alike, each run's first epoch dropped (it traces). Prints each run's steady samples/s
and, per variant, the median and min-max.
"""

from __future__ import annotations

import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(replicas: int, rounds: int, epochs: int, steps: int) -> None:
    import numpy as np
    import tensorflow as tf

    if replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    import keras

    from tfgpu.training.loops import Epochs, Job, epoch_stats_callback
    from tfgpu.training.loops.custom import train_custom
    from tfgpu.training.loops.fit import train_fit
    from tfgpu.training.trainer import resolve_steps_per_execution

    with np.load(os.path.join(os.environ.get("TFGPU_DATA_DIR", "../shared/data"), "mnist", "mnist.npz")) as f:
        x, y = f["x_train"], f["y_train"]
    global_batch = 128 * replicas
    n = steps * global_batch
    x, y = (x[:n, :, :, None] / 255.0).astype("float32"), y[:n].astype("int64")
    strategy = (tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)],
                                               cross_device_ops=tf.distribute.ReductionToOneDevice())
                if replicas > 1 else tf.distribute.OneDeviceStrategy("/cpu:0"))
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).cache()
    options = tf.data.Options()  # as tfgpu's in-memory pipelines (tfgpu.data.pipeline.options)
    options.autotune.enabled = False
    options.experimental_optimization.apply_default_optimizations = False

    def train_epochs(count: int, skip: int = 0):
        return batches.repeat(count).skip(skip).prefetch(tf.data.AUTOTUNE).with_options(options)

    def seed_cnn():
        return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                                 keras.layers.MaxPooling2D(), keras.layers.Conv2D(32, 3, activation="relu"),
                                 keras.layers.MaxPooling2D(), keras.layers.Flatten(),
                                 keras.layers.Dense(10, activation="softmax")])

    variants = []
    for loop in ("fit", "custom"):
        old = next(d for d in range(min(32, steps), steps + 1) if steps % d == 0)  # the old rule
        variants += [(loop, "new", resolve_steps_per_execution("auto", steps, loop)[0]), (loop, "old", old)]
    print("steps per epoch", steps, "variants (loop, rule, steps per call):", variants, flush=True)
    rates: dict = {v: [] for v in variants}
    keras.utils.set_random_seed(1)
    for r in range(rounds):
        for loop, rule, per_call in variants:
            with strategy.scope():
                model = seed_cnn()
                optimizer = keras.optimizers.Adam()
                model.compile(optimizer, "sparse_categorical_crossentropy", steps_per_execution=per_call)
                optimizer.build(model.trainable_variables)
                loss = keras.losses.SparseCategoricalCrossentropy(reduction=None)
            record = Epochs()
            job = Job(model=model, train_epochs=train_epochs, validation=None, epochs=epochs, steps_per_epoch=steps,
                      strategy=strategy, optimizer=optimizer, loss=loss, steps_per_execution=per_call,
                      terminate_on_nan=False)
            (train_fit if loop == "fit" else train_custom)(job, [epoch_stats_callback(n, record)], "none")
            got = [row["samples_per_second"] for row in record.rows[1:]]
            rates[(loop, rule, per_call)] += got
            print(r, loop, rule, per_call, [round(g) for g in got], flush=True)
    for (loop, rule, per_call), got in rates.items():
        print(f"{loop} {rule} ({per_call} per call): median {statistics.median(got):,.0f} samples/s, "
              f"min-max {min(got):,.0f}-{max(got):,.0f}, {len(got)} epochs")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
