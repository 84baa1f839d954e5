"""Speed and accuracy of Keras dtype policies through the whole `tfgpu run`, both loops.

    TFGPU_DATA_DIR=../shared/data .venv/bin/python benchmarks/precision.py --repeats 3 --epochs 3 \
        --batch 128 --replicas 1,2 --policies float32,mixed_bfloat16
    ... precision.py --loops fit --set backend=jax          # the same on Keras's JAX backend

`benchmarks/floor.py --policy` times the seed CNN's step alone; this runs the recipe
(`tfgpu run recipes/mnist.yaml`, `train.lr_scaling=none`) once per (loop, replicas, policy),
each in a fresh process, the variants interleaved run by run (A B C D A B C D ...) so the drifts of
a shared machine hit them alike. Per variant it prints the median and min-max of the steady
samples/s (median over each run's epochs after the first, validation excluded, from
``summary.json``) and of the last epoch's validation accuracy, then each policy's ratio to the first
policy's median. Replicas are logical CPUs (``devices.cpu_logical_devices``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(out: Path, loop: str, replicas: int, policy: str, epochs: int, batch: int,
            extra: list[str]) -> tuple[float, float]:
    """(steady samples/s, last validation accuracy) of one fresh `tfgpu run`."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tfgpu", "run", str(ROOT / "recipes" / "mnist.yaml"), "--output-dir", str(out),
               "--set", f"train.loop={loop}", "--set", f"train.epochs={epochs}",
               "--set", f"train.batch_size_per_replica={batch}", "--set", "train.lr_scaling=none",
               "--set", f"devices.cpu_logical_devices={replicas}",
               "--set", f"tensorflow.mixed_precision={policy}", *(a for kv in extra for a in ("--set", kv))]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads(next(out.glob("*/summary.json")).read_text())
    assert summary["mixed_precision"] == policy, summary["mixed_precision"]
    rows = summary["epochs"]
    return statistics.median(r["samples_per_second"] for r in rows[1:]), rows[-1]["val_accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128, help="samples per replica")
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--loops", default="fit,custom")
    parser.add_argument("--policies", default="float32,mixed_bfloat16")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="another config override, e.g. backend=jax (repeatable)")
    args = parser.parse_args()
    policies = args.policies.split(",")
    variants = [(loop, int(r), p) for loop in args.loops.split(",") for r in args.replicas.split(",")
                for p in policies]
    got: dict = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for n, v in enumerate(variants):
                rate, accuracy = one_run(Path(tmp) / f"{repeat}-{n}", *v, args.epochs, args.batch, args.set)
                got[v].append((rate, accuracy))
                print(repeat, *v, f"{rate:,.0f} samples/s", f"val_accuracy {accuracy:.4f}", flush=True)
    print(f"\n{args.batch} per replica, {args.epochs} epochs, {args.repeats} runs each"
          f"{''.join(' --set ' + kv for kv in args.set)}; median (min-max)\n")
    print("| loop | replicas | policy | steady samples/s | val accuracy | speed vs " + policies[0] + " |")
    print("| --- | --- | --- | --- | --- | --- |")
    for loop, replicas, policy in variants:
        rates = [g[0] for g in got[(loop, replicas, policy)]]
        accs = [g[1] for g in got[(loop, replicas, policy)]]
        base = statistics.median(g[0] for g in got[(loop, replicas, policies[0])])
        print(f"| {loop} | {replicas} | {policy} | {statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"
              f" | {statistics.median(accs):.4f} ({min(accs):.4f}-{max(accs):.4f}) | "
              f"{statistics.median(rates) / base:.2f}x |")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
