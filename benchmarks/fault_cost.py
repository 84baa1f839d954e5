"""What a fault costs with tfgpu's checkpoints: the work redone after each kind of stop, and the cost of a save.

    TFGPU_DATA_DIR=../shared/data python benchmarks/fault_cost.py [--loop fit|custom] [--out DIR]

Runs recipes/mnist.yaml (seed 42, 10 epochs; one checkpoint per epoch) and
stops it in three ways, each resumed with `tfgpu run --resume`:

- kill -9 0.6 s into epoch 5 (a crash, the OOM killer);
- kill -9 in the middle of a run with a checkpoint every 10 steps (45 steps per epoch, calls of 5);
- SIGTERM (preemption): a save at the next call, exit 75.

For each: the training seconds and steps redone (killed at - last checkpoint,
from the checkpoint's saved_at and the run's progress.json), the resume's
start-up seconds, and the final val accuracy against an uninterrupted run.
Then the median seconds of one checkpoint save (summary.json) and what it
adds per epoch. Prints a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = str(ROOT / "recipes" / "mnist.yaml")
STEPS = ["--set", "train.batch_size_per_replica=512", "--set", "train.steps_per_execution=5",
         "--set", "train.checkpoint.every_steps=10", "--set", "train.epochs=3"]


def state(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "checkpoint" / "state.json").read_text())
    except (OSError, ValueError):
        return None


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tfgpu", "run", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def wait_for_step(parent: Path, at_least: int, process: subprocess.Popen) -> tuple[Path, dict]:
    while True:
        for d in parent.iterdir() if parent.exists() else []:
            s = state(d)
            if s and s["global_step"] >= at_least:
                return d, s
        if process.poll() is not None:
            raise SystemExit(f"the run ended first (exit {process.returncode})")
        time.sleep(0.01)


def resume(run_dir: Path) -> dict:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tfgpu", "run", "--resume", str(run_dir)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    summary = json.loads((run_dir / "summary.json").read_text())
    restart = summary["restarts"][-1]
    return {"resume_wall_seconds": time.perf_counter() - began, "first_step_seconds": summary["first_step_seconds"],
            "val_accuracy": summary["final_metrics"]["val_accuracy"], "restart": restart, "summary": summary}


def whole(args: list[str], parent: Path) -> dict:
    subprocess.run([sys.executable, "-m", "tfgpu", "run", *args, "--output-dir", str(parent)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (run_dir,) = list(parent.iterdir())
    return json.loads((run_dir / "summary.json").read_text())


def fault(args: list[str], parent: Path, at_step: int, delay: float, sig: int) -> dict:
    process = start([*args, "--output-dir", str(parent)])
    run_dir, saved = wait_for_step(parent, at_step, process)
    time.sleep(delay)
    sent = time.time()
    process.send_signal(sig)
    process.wait()
    stopped = time.time()
    last = state(run_dir)
    out = resume(run_dir)
    r = out["restart"]
    return {"signal": signal.Signals(sig).name, "exit_code": process.returncode,
            "stop_seconds": stopped - sent,
            "checkpoint_global_step": last["global_step"], "checkpoint_reason": last["reason"],
            "redo_train_seconds": max(0.0, sent - last["saved_at"]) if sig == signal.SIGKILL else 0.0,
            "redo_steps_seen": r.get("redo_steps"),
            "resume_wall_seconds": round(out["resume_wall_seconds"], 2),
            "resume_first_step_seconds": round(out["first_step_seconds"], 2),
            "val_accuracy": out["val_accuracy"], "epochs": [e["epoch"] for e in out["summary"]["epochs"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loop", choices=["fit", "custom"], default="fit")
    parser.add_argument("--out", default=None)
    a = parser.parse_args()
    loop = ["--set", f"train.loop={a.loop}"]
    with tempfile.TemporaryDirectory(dir=a.out) as tmp:
        tmp = Path(tmp)
        seed_whole = whole([SEED, *loop], tmp / "whole")
        steps_whole = whole([SEED, *STEPS, *loop], tmp / "whole-steps")
        off = whole([SEED, *loop, "--set", "train.checkpoint=false"], tmp / "off")
        results = {
            "loop": a.loop,
            "uninterrupted_val_accuracy": seed_whole["final_metrics"]["val_accuracy"],
            "uninterrupted_steps_val_accuracy": steps_whole["final_metrics"]["val_accuracy"],
            "kill9_epoch5": fault([SEED, *loop], tmp / "k1", 24, 0.6, signal.SIGKILL),
            "kill9_mid_epoch": fault([SEED, *STEPS, *loop], tmp / "k2", 65, 0.1, signal.SIGKILL),
            "sigterm": fault([SEED, *STEPS, *loop], tmp / "k3", 65, 0.1, signal.SIGTERM),
            "save_seconds_median": seed_whole["checkpoint"]["save_seconds_median"],
            "save_seconds_median_steps_run": steps_whole["checkpoint"]["save_seconds_median"],
            "saves": seed_whole["checkpoint"]["saves"],
            "epoch_seconds_median_with": statistics.median(seed_whole["epoch_seconds"][1:]),
            "epoch_seconds_median_without": statistics.median(off["epoch_seconds"][1:]),
        }
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TFGPU_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    main()
