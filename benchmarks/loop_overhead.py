"""Where the training time goes: tfgpu's loops against the floor, in one process, with each feed.

    TFGPU_DATA_DIR=../shared/data python benchmarks/loop_overhead.py                 # 1 replica, 128
    ... loop_overhead.py --replicas 2 --batch-per-replica 128 --rounds 8 --epochs 5

Variants, interleaved run by run (every variant once per round), each a fresh model trained for EPOCHS
epochs on the real MNIST training images, the first epoch dropped (it traces):

| variant | what |
| --- | --- |
| floor | the seed CNN's step on one batch staged on the replicas, in a `tf.range` loop (as `floor.py`) |
| custom | `tfgpu.training.loops.custom.train_custom` over tfgpu's in-memory pipeline, the feed tfgpu chooses (CPU replicas: in blocks) |
| custom_distributed | the same with tf.distribute's distributed iterator (`Feed(strategy, plain=False)`) |
| fit | `tfgpu.training.loops.fit.train_fit`, the feed tfgpu chooses |
| fit_distributed | the same with tf.distribute's distributed iterator |

Reported per variant: median steady samples/s (min-max) and the process's CPU seconds per 1,000 samples
(user + system, all threads: on a shared 2-core machine CPU time drifts less than wall time), and each
against the floor. No validation (`--validation` adds the 10,000 test digits, validated each epoch:
fit's `train_seconds` then shows what happens before validation starts).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
VARIANTS = ("floor", "custom", "custom_distributed", "fit", "fit_distributed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--batch-per-replica", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--validation", action="store_true")
    args = parser.parse_args()
    import tensorflow as tf

    from floor import in_memory_pipelines, mnist_arrays, seed_cnn, split_cpu, staged_steps  # benchmarks/floor.py

    split_cpu(args.replicas)
    import keras

    from tfgpu.training.loops import Epochs, Job, epoch_stats_callback
    from tfgpu.training.loops.custom import train_custom
    from tfgpu.training.loops.replica_batches import Feed
    from tfgpu.training.loops.fit import train_fit

    x, y, x_test, y_test = mnist_arrays()
    n, global_batch = len(x), args.batch_per_replica * args.replicas
    steps, per_call = math.ceil(n / global_batch), min(32, math.ceil(n / global_batch))
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    pipes = in_memory_pipelines(x, y, global_batch, (x_test, y_test) if args.validation else None)

    def floor() -> list[tuple[float, float]]:
        steps_of, tracker, _ = staged_steps(strategy)
        batch = next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(
            ((x[:global_batch, :, :, None] / 255).astype("float32"), y[:global_batch].astype("int32"))))))
        out = []
        for _ in range(args.epochs):
            wall, cpu = time.perf_counter(), time.process_time()
            steps_of(tf.constant(steps), *batch)
            float(tracker.result())
            out.append((n / (time.perf_counter() - wall), (time.process_time() - cpu) / n * 1000))
        return out[1:]

    class CpuClock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.began = time.process_time()

        def on_test_begin(self, logs=None):
            self.rows.append((time.process_time() - self.began) / n * 1000)
            self.began = None

        def on_epoch_end(self, epoch, logs=None):
            if self.began is not None:
                self.rows.append((time.process_time() - self.began) / n * 1000)

    def tfgpu(variant: str) -> list[tuple[float, float]]:
        loop, _, how = variant.partition("_")
        with strategy.scope():
            model, optimizer = seed_cnn(), keras.optimizers.Adam()
            model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"], steps_per_execution=per_call)
            loss = keras.losses.SparseCategoricalCrossentropy(reduction=None)
            metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
            val_metrics = [keras.metrics.SparseCategoricalAccuracy(name="val_accuracy")]
        record, clock = Epochs(), CpuClock()
        job = Job(model=model, train_epochs=pipes.train_epochs, validation=pipes.validation, epochs=args.epochs,
                  steps_per_epoch=steps, validation_steps=pipes.validation_steps, strategy=strategy,
                  optimizer=optimizer, loss=loss, metrics=metrics, val_metrics=val_metrics,
                  steps_per_execution=per_call, terminate_on_nan=False, global_batch=global_batch,
                  train_blocks=pipes.train_blocks, feed=Feed(strategy, plain=False) if how == "distributed" else None)
        (train_fit if loop == "fit" else train_custom)(job, [epoch_stats_callback(n, record), clock], "none",
                                                       max_call_seconds=1e9)
        return [(r["samples_per_second"], c) for r, c in zip(record.rows[1:], clock.rows[1:])]

    variants = [v for v in args.variants.split(",") if v]
    print(f"{args.replicas} replica(s) x {args.batch_per_replica}: {steps} steps an epoch, {per_call} a call; "
          f"tfgpu's feed here: {Feed.of(strategy).describe}", flush=True)
    got: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            rows = floor() if v == "floor" else tfgpu(v)
            got[v] += rows
            print(r, v, [round(s) for s, _ in rows], flush=True)
    base = {k: statistics.median(s[i] for s in got["floor"]) for i, k in enumerate(("rate", "cpu"))} \
        if got.get("floor") else None
    print("\n| variant | samples/s | / floor | CPU s per 1,000 samples | floor / this |")
    print("| --- | --- | --- | --- | --- |")
    for v, rows in got.items():
        rate, cpu = statistics.median(s for s, _ in rows), statistics.median(c for _, c in rows)
        spread = f"{min(s for s, _ in rows):,.0f}-{max(s for s, _ in rows):,.0f}"
        print(f"| {v} | {rate:,.0f} ({spread}) | {rate / base['rate'] if base else float('nan'):.3f} | "
              f"{cpu:.4f} | {base['cpu'] / cpu if base else float('nan'):.3f} |")


if __name__ == "__main__":
    main()
