"""The floor: the machine's compute limit for the seed CNN's training step, in samples/s.

The same step as the other variants (forward, per-example loss scaled by
``tf.nn.compute_average_loss``, backward, Adam update, loss and accuracy
metrics updated on each replica) repeated on ONE batch staged on the replicas
before timing, inside ONE ``tf.function`` (a ``tf.range`` loop around
``strategy.run``): no input pipeline, no Python per step, no validation.
Each "epoch" is one call of as many steps as an epoch of the real data has;
steady samples/s is the median over the epochs after the first.

    python benchmarks/floor.py --replicas 2 --batch-per-replica 128 --epochs 5
    python benchmarks/floor.py --jit                    # the step compiled with XLA
    python benchmarks/floor.py --policy mixed_bfloat16  # another Keras dtype policy

It prints the steady samples/s; ``--jit`` and ``--policy`` reproduce the measurements
behind ``tensorflow.jit_compile: auto`` and the float32 default (docs/benchmarks.md).
"""

import argparse
import math
import os

import numpy as np
import tensorflow as tf
import keras

from timing import Clock, report


def seed_cnn():
    """The seed recipe's CNN (recipes/mnist.yaml), as every variant builds it."""
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])


def split_cpu(replicas):
    """Make ``replicas`` logical CPUs of the machine's one (before TensorFlow initialises its devices)."""
    if replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)


def mnist_arrays():
    """``(x_train, y_train, x_test, y_test)``: $TFGPU_DATA_DIR/mnist/mnist.npz (uint8 images and labels)."""
    with np.load(os.path.join(os.environ.get("TFGPU_DATA_DIR", "../shared/data"), "mnist", "mnist.npz")) as f:
        return f["x_train"], f["y_train"], f["x_test"], f["y_test"]


def in_memory_pipelines(x, y, global_batch, validation=None):
    """tfgpu's in-memory pipelines (``tfgpu.data.pipeline.build_pipelines``) over MNIST-shaped uint8 arrays, as
    ``tfgpu run recipes/mnist.yaml`` builds them (seed 42); ``validation``: ``(x, y)`` of a validation split."""
    from tfgpu.config.schema import DataConfig
    from tfgpu.data.base import Data, DataSpec, Split
    from tfgpu.data.pipeline import build_pipelines

    spec = DataSpec(kind="mnist", source="mnist.npz", sample_shape=(28, 28), x_dtype="uint8", add_channel=True,
                    rescale=1 / 255, num_classes=10, label_dtype="uint8")
    held = None if validation is None else Split("validation", "test", x=validation[0], y=validation[1],
                                                 size=len(validation[0]))
    data = Data(train=Split("train", "mnist", x=x, y=y, size=len(x)), validation=held, test=None, spec=spec)
    return build_pipelines(data, DataConfig(), global_batch, seed=42)


def staged_steps(strategy, jit=False):
    """``(steps(n, x, y), loss_tracker, model)``: a new seed CNN with Adam in ``strategy``'s scope, and a
    ``tf.function`` running ``n`` training steps on the staged per-replica batch ``(x, y)`` (loss and accuracy
    metrics updated on each replica, as the loops do)."""
    with strategy.scope():
        model = seed_cnn()
        optimizer = keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
        loss_tracker = keras.metrics.Mean()
        accuracy = keras.metrics.SparseCategoricalAccuracy()

    def forward_backward(x, y):
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            per_example = tf.cast(loss_fn(y, pred), tf.float32)
            loss = tf.nn.compute_average_loss(per_example)
        return tape.gradient(loss, model.trainable_variables), per_example, pred

    compute = tf.function(forward_backward, jit_compile=True) if jit else forward_backward

    def step(x, y):
        grads, per_example, pred = compute(x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        loss_tracker.update_state(per_example)
        accuracy.update_state(y, pred)

    @tf.function
    def steps(n, x, y):
        for _ in tf.range(n):
            strategy.run(step, args=(x, y))

    return steps, loss_tracker, model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--batch-per-replica", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--jit", action="store_true", help="compile each replica's forward and backward pass with XLA")
    parser.add_argument("--policy", default="float32", help="Keras dtype policy, e.g. mixed_bfloat16")
    args = parser.parse_args()

    split_cpu(args.replicas)
    keras.utils.set_random_seed(args.seed)
    keras.mixed_precision.set_global_policy(args.policy)

    x_train, y_train, _, _ = mnist_arrays()
    samples = len(x_train)
    strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")][:args.replicas])
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync
    steps_per_epoch = math.ceil(samples / global_batch)
    steps, loss_tracker, model = staged_steps(strategy, args.jit)

    # One global batch of real images (repeated if the set is smaller), staged on the replicas.
    index = np.arange(global_batch) % samples
    x = x_train[index][..., None].astype("float32") / 255.0
    batch = next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors((x, y_train[index])))))

    clock = Clock()
    for epoch in range(args.epochs):
        clock.epoch_begin()
        steps(tf.constant(steps_per_epoch), *batch)
        float(loss_tracker.result())  # wait for the device (a no-op on CPU, where calls are synchronous)
        clock.step_end()
        clock.train_end()
    # Val accuracy does not apply to one repeated batch; the first "step" is the first call.
    report(clock, steps_per_epoch * global_batch, None, parameters=model.count_params())
    steady = clock.train_seconds[1:] or clock.train_seconds
    print(f"floor: {steps_per_epoch * global_batch / sorted(steady)[len(steady) // 2]:.0f} samples/s "
          f"({args.batch_per_replica} per replica x {strategy.num_replicas_in_sync}, XLA {'on' if args.jit else 'off'}, "
          f"{args.policy})")


if __name__ == "__main__":
    main()
