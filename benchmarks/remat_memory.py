"""Peak memory and speed of `model.remat` (checkpointed segments) against the same run without it.

    TFGPU_DATA_DIR=../shared/data .venv/bin/python benchmarks/remat_memory.py --repeats 3
    ... remat_memory.py --blocks 4 --batch 256 --repeats 1          # the small case tests/training/test_remat.py runs

Trains the seed data (`tfgpu run recipes/mnist.yaml`) with a deep CNN whose activations dominate the memory
(`--blocks` x [Conv2D, BatchNormalization, Dropout] at 28 x 28 x `--filters`, then Flatten and Dense), one replica,
each run in a fresh process, the variants interleaved run by run (plain, remat, plain, remat, ...). Per variant it
prints the median peak resident memory of the `tfgpu run` process (its `ru_maxrss`, MiB) and the median steady
samples/s (the epochs after the first), then remat's ratios to plain; `--json` also keeps each run's final metrics
(the same with and without remat: the recomputation gives the same numbers). On a GPU the peak device memory is what
falls; on CPU the activations live in host memory, so the process's peak shows the saving.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Runs `tfgpu run ARGS` as a child and prints the child's peak resident memory in MiB (Linux: ru_maxrss in KiB).
WRAPPER = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024); sys.exit(done.returncode)")


def layers(blocks: int, filters: int) -> str:
    """The ``model.layers`` override: ``blocks`` x [Conv2D, BatchNormalization, Dropout], Flatten, Dense."""
    block = (f"{{Conv2D: {{filters: {filters}, kernel_size: 3, padding: same, activation: relu}}}}, "
             "{BatchNormalization: {}}, {Dropout: {rate: 0.1}}")
    return "[" + ", ".join([block] * blocks) + ", {Flatten: {}}, {Dense: {units: 10, activation: softmax}}]"


def one_run(out: Path, remat: str, args: argparse.Namespace) -> tuple[float, float, dict, dict]:
    """(peak RSS MiB, steady samples/s, the summary's remat record, its final metrics) of one fresh `tfgpu run`."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tfgpu", "run", str(ROOT / "recipes" / "mnist.yaml"), "--output-dir", str(out),
               "--set", f"model.layers={layers(args.blocks, args.filters)}", "--set", f"model.remat={remat}",
               "--set", f"train.epochs={args.epochs}", "--set", f"train.steps_per_epoch={args.steps}",
               "--set", "train.validation_steps=1", "--set", f"train.batch_size_per_replica={args.batch}",
               "--set", "devices.cpu_logical_devices=1", "--set", f"train.loop={args.loop}",
               "--set", "train.checkpoint=false", "--set", "train.progress=none"]
    done = subprocess.run([sys.executable, "-c", WRAPPER, *command], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    peak = float(done.stdout.split()[-1])
    summary = json.loads(next(out.glob("*/summary.json")).read_text())
    rows = summary["epochs"][1:] or summary["epochs"]
    return peak, statistics.median(r["samples_per_second"] for r in rows), summary["remat"], summary["final_metrics"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--filters", type=int, default=32)
    parser.add_argument("--batch", type=int, default=512, help="samples per step (one replica)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="training steps per epoch")
    parser.add_argument("--loop", default="custom", choices=("fit", "custom"))
    parser.add_argument("--segments", default="true", help="model.remat's value: true or {segments: N}")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    variants = {"plain": "null", "remat": args.segments}
    peaks: dict[str, list[float]] = {v: [] for v in variants}
    speeds: dict[str, list[float]] = {v: [] for v in variants}
    record: dict = {}
    final: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name, value in variants.items():
                peak, speed, remat, metrics = one_run(Path(tmp) / f"{name}-{i}", value, args)
                final[name].append(metrics)
                peaks[name].append(peak)
                speeds[name].append(speed)
                record = remat or record
                print(f"  {name} #{i + 1}: peak {peak:.0f} MiB, {speed:.0f} samples/s", flush=True)
    figures = {name: {"peak_rss_mib": statistics.median(peaks[name]),
                      "samples_per_second": statistics.median(speeds[name]),
                      "runs": len(peaks[name]), "final_metrics": final[name]} for name in variants}
    figures["remat_record"] = record
    figures["peak_ratio"] = figures["remat"]["peak_rss_mib"] / figures["plain"]["peak_rss_mib"]
    figures["speed_ratio"] = figures["remat"]["samples_per_second"] / figures["plain"]["samples_per_second"]
    print(f"model: {args.blocks} x [Conv2D {args.filters}, BatchNormalization, Dropout] on 28x28, batch {args.batch}, "
          f"loop {args.loop}; remat: {record.get('segments')} segments of {record.get('cuts')} cuts")
    for name in variants:
        f = figures[name]
        print(f"{name:6s} peak RSS {f['peak_rss_mib']:7.0f} MiB   {f['samples_per_second']:7.0f} samples/s")
    print(f"remat / plain: peak memory x{figures['peak_ratio']:.2f}, speed x{figures['speed_ratio']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
