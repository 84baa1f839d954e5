"""What reading the batches costs the training step: calls of the same step, interleaved call by call.

    TFGPU_DATA_DIR=../shared/data python benchmarks/feed_cost.py                  # 1 replica, 128 per replica
    ... feed_cost.py --replicas 2 --batch-per-replica 128 --calls 150

One model (the seed CNN, Adam, loss and accuracy metrics updated on each replica, as the loops do) and one
step, run ``--steps`` steps a call (a ``tf.range`` loop in one ``tf.function``) on:

| variant | the batches |
| --- | --- |
| floor | one batch staged on the replicas before timing (``floor.py``'s step) |
| batch_by_batch | tfgpu's in-memory pipeline read a global batch at a time (a gather and a transform each) |
| blocks | the same pipeline read in blocks of a call's batches (``replica_batches.Blocks``, what the loops use) |

The variants take turns call by call (floor, batch_by_batch, blocks, floor, ...), so the machine's drifts, which
on a shared 2-core host move a call's time by 10-25 % within seconds, hit all of them alike. Reported: each
variant's median call time, and its speed over the floor's as the median of the per-round ratios.
Both pipelines read the real MNIST training images in the same seeded order.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--batch-per-replica", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32, help="steps a call")
    parser.add_argument("--calls", type=int, default=100, help="timed calls of each variant")
    args = parser.parse_args()
    import tensorflow as tf

    from floor import in_memory_pipelines, mnist_arrays, seed_cnn, split_cpu

    split_cpu(args.replicas)
    import keras

    from tfgpu.training.loops.replica_batches import Blocks, Feed, block_steps, steps_function

    x, y, _, _ = mnist_arrays()
    global_batch = args.batch_per_replica * args.replicas
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    feed = Feed.of(strategy)
    pipes = in_memory_pipelines(x, y, global_batch)
    epochs = math.ceil((args.calls + 2) * args.steps / pipes.steps_per_epoch) + 1
    block = block_steps(pipes.train.element_spec, global_batch, args.steps)

    with strategy.scope():
        model, optimizer = seed_cnn(), keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
        loss, accuracy = keras.metrics.Mean(), keras.metrics.SparseCategoricalAccuracy()

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            pred = model(xb, training=True)
            per_example = tf.cast(loss_fn(yb, pred), tf.float32)
            mean = tf.nn.compute_average_loss(per_example)
        grads = tape.gradient(mean, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        loss.update_state(per_example)
        accuracy.update_state(yb, pred)

    def step(batch):
        strategy.run(replica_step, args=feed.args(batch))

    staged = next(iter(pipes.train))
    several = steps_function(step)
    blocks = Blocks(pipes.train_epochs(epochs, block=block), global_batch)
    batches = feed.iterator(pipes.train_epochs(epochs))
    in_blocks = steps_function(step, blocks)

    @tf.function
    def floor(n):
        for _ in tf.range(n):
            step(staged)

    steps = tf.constant(args.steps, tf.int32)
    variants = {"floor": lambda: floor(steps), "batch_by_batch": lambda: several(batches, steps),
                "blocks": lambda: in_blocks(blocks, steps)}
    for run in variants.values():  # traced, and warm
        run()
        run()
    seconds: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.calls):
        for name, run in variants.items():
            began = time.perf_counter()
            run()
            float(loss.result())
            seconds[name].append(time.perf_counter() - began)
    print(f"{args.replicas} replica(s) x {args.batch_per_replica}, {args.steps} steps a call, blocks of {block} "
          f"batches, {args.calls} calls each\n")
    print("| variant | median call (ms) | speed / floor's (median of the per-round ratios) |")
    print("| --- | --- | --- |")
    for name, times in seconds.items():
        paired = statistics.median(f / t for f, t in zip(seconds["floor"], times))
        print(f"| {name} | {statistics.median(times) * 1000:.1f} | {paired:.3f} |")


if __name__ == "__main__":
    main()
