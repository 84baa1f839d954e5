"""Steps per call against the epoch's length: tfgpu's `auto` against longer calls, both loops, in one process.

    TFGPU_DATA_DIR=../shared/data python benchmarks/call_length.py
    ... call_length.py --replicas 2 --steps 89,128 --rounds 5 --epochs 4

`train.steps_per_execution: auto` is at most 32 steps a call, an epoch's last call the steps left, in
both loops (fit's calls once had to divide the epoch: 178 steps ran 2 a call, a prime count 1). For
each epoch length in STEPS (default: 89 and 97, primes; 128, a power of two; 177, odd; 178, 2 x 89),
each loop trains the seed CNN on STEPS x 128 x REPLICAS real MNIST training images (128 per replica)
with tfgpu's own loops (`tfgpu.training.loops.fit.train_fit`, `tfgpu.training.loops.custom.train_custom`)
and tfgpu's in-memory pipeline (`tfgpu.data.pipeline.build_pipelines`), under a MirroredStrategy over
REPLICAS logical CPUs, at three call lengths: `auto`, 64 and the whole epoch in one call (the longest
call, which the old rule gave a prime count before calls were bounded). The runs are interleaved run by
run (every variant once per round) so drifts of a shared machine hit them alike; each run's first epoch
is dropped (it traces). Prints each variant's median steady samples/s and min-max, and a table: per epoch
length and loop, `auto`'s speed over the best call length's (the target: at least 0.9), by wall time and
by the process's CPU time per sample (user + system, all threads, each epoch's: on a shared 2-core machine
CPU time drifts far less than wall time), and `auto` over the whole-epoch call paired by round (each
round's two runs, seconds apart: the host's drift hits them alike), per row and over all rows per loop.
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
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", default="89,97,128,177,178", help="epoch lengths in steps, comma-separated")
    args = parser.parse_args()

    import tensorflow as tf

    from floor import in_memory_pipelines, mnist_arrays, seed_cnn, split_cpu  # benchmarks/floor.py

    split_cpu(args.replicas)
    import keras

    from tfgpu.training.loops import Epochs, Job, epoch_stats_callback
    from tfgpu.training.loops.custom import train_custom
    from tfgpu.training.loops.fit import train_fit
    from tfgpu.training.trainer import resolve_steps_per_execution

    images, labels, _, _ = mnist_arrays()
    global_batch = 128 * args.replicas
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])

    variants = []
    pipes = {}
    for steps in (int(s) for s in args.steps.split(",")):
        n = min(steps * global_batch, len(images))
        assert math.ceil(n / global_batch) == steps, f"{steps} steps of {global_batch} need more than {len(images)} images"
        pipes[steps] = in_memory_pipelines(images[:n], labels[:n], global_batch)
        for loop in ("fit", "custom"):
            auto = resolve_steps_per_execution("auto", steps, loop)[0]
            variants += [(steps, loop, "auto", auto), (steps, loop, "64", min(64, steps)),
                         (steps, loop, "whole epoch", steps)]
    rates: dict = {v: [] for v in variants}
    runs: dict = {v: [] for v in variants}  # each round's median steady samples/s
    cpu: dict = {v: [] for v in variants}  # CPU microseconds per sample, each steady epoch
    keras.utils.set_random_seed(1)
    for r in range(args.rounds):
        for variant in variants:
            steps, loop, _, per_call = variant
            with strategy.scope():
                model = seed_cnn()
                optimizer = keras.optimizers.Adam()
                model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"],
                              steps_per_execution=per_call)
                loss = keras.losses.SparseCategoricalCrossentropy(reduction=None)
                metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
            record = Epochs()
            marks: list = []
            clock = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: marks.append(time.process_time()),
                                                   on_epoch_end=lambda e, logs: marks.append(time.process_time()))
            job = Job(model=model, train_epochs=pipes[steps].train_epochs, validation=None, epochs=args.epochs,
                      steps_per_epoch=steps, strategy=strategy, optimizer=optimizer, loss=loss, metrics=metrics,
                      steps_per_execution=per_call, terminate_on_nan=False, global_batch=global_batch,
                      train_blocks=pipes[steps].train_blocks)  # as tfgpu's loops read them (replica_batches)
            samples = steps * global_batch
            (train_fit if loop == "fit" else train_custom)(job, [clock, epoch_stats_callback(samples, record)],
                                                           "none", max_call_seconds=1e9)
            got = [row["samples_per_second"] for row in record.rows[1:]]
            rates[variant] += got
            runs[variant].append(statistics.median(got))
            cpu[variant] += [(marks[2 * e + 1] - marks[2 * e]) / samples * 1e6 for e in range(1, args.epochs)]
            print(r, *variant, [round(g) for g in got], [round(c, 1) for c in cpu[variant][-args.epochs + 1:]],
                  flush=True)
    print(f"\n{args.replicas} replica(s) x 128 per replica, {args.rounds} rounds of {args.epochs} epochs "
          "(the first dropped); median steady samples/s (min-max)\n")
    print("| steps per epoch | loop | auto (steps a call) | 64 a call | whole epoch in one call | auto / best "
          "| CPU us per sample: auto, 64, whole | auto / best, by CPU | auto / whole, paired by round |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    paired: dict = {"fit": [], "custom": []}  # auto / whole epoch, the two runs of the same round
    for steps in pipes:
        for loop in ("fit", "custom"):
            row = [v for v in variants if v[0] == steps and v[1] == loop]
            med = {v[2]: statistics.median(rates[v]) for v in row}
            cells = [f"{statistics.median(rates[v]):,.0f} ({min(rates[v]):,.0f}-{max(rates[v]):,.0f})" for v in row]
            cells[0] += f" ({row[0][3]}{', last ' + str(steps % row[0][3]) if steps % row[0][3] else ''})"
            per = {v[2]: statistics.median(cpu[v]) for v in row}
            pairs = [a / w for a, w in zip(runs[row[0]], runs[row[2]])]
            paired[loop] += pairs
            print(f"| {steps} | {loop} | " + " | ".join(cells) + f" | {med['auto'] / max(med.values()):.3f} | "
                  + ", ".join(f"{per[v[2]]:.1f}" for v in row) + f" | {min(per.values()) / per['auto']:.3f} | "
                  + f"{statistics.median(pairs):.3f} |")
    # Paired within a round, the drift of a shared host (seconds to tens of seconds) hits both runs alike.
    for loop, pairs in paired.items():
        quartiles = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else pairs * 3
        print(f"\n{loop}: auto / whole epoch paired by round, {len(pairs)} pairs: median {statistics.median(pairs):.3f}"
              f" (quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f})")


if __name__ == "__main__":
    main()
