"""tfgpu on each data source against the in-memory .npz, and against a plain image-folder script.

    .venv/bin/python benchmarks/sources.py                    # about 15 minutes on 2 cores
    .venv/bin/python benchmarks/sources.py --repeats 3 --epochs 5 --batch 128 --replicas 1,2

The same digits (the offline MNIST, ``$TFGPU_DATA_DIR/mnist/mnist.npz``) stored
three ways, written once into ``--work`` by ``recipes/make_examples.py``:

| variant | what |
| --- | --- |
| tfgpu_npz | ``tfgpu run recipes/mnist_arrays.yaml``: the .npz in memory (the reference) |
| tfgpu_png | ``tfgpu run recipes/mnist_images.yaml``: a PNG class folder (22,699 + 10,000 files) |
| tfgpu_tfrecord | ``tfgpu run recipes/mnist_tfrecord.yaml``: 8 TFRecord shards per split (PNG bytes) |
| keras_png | ``plain_image_folder.py``: ``keras.utils.image_dataset_from_directory`` + the tutorial's cache/shuffle/prefetch + ``fit``, on the same folder |

Every variant trains the seed CNN with the same epochs, per-replica batch,
learning rate (unscaled) and seed, validating on the 10,000 test digits. Each
run is a fresh process; runs are interleaved (every variant once, then again);
medians and min-max are reported of whole-run wall time, time to the first
finished training call (it includes reading and decoding the files), steady
training samples/s (epochs after the first, validation excluded: with
``cache: true`` every source is decoded once before training) and validation
accuracy. Results: ``--out`` (default ``benchmarks/results/sources.{md,json}``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from run import ROOT, machine, markdown_group, markdown_header, spread, tfgpu_command

HERE = Path(__file__).resolve().parent
VARIANTS = ("tfgpu_npz", "tfgpu_png", "tfgpu_tfrecord", "keras_png")
METRICS = ("wall_seconds", "first_step_seconds", "samples_per_second", "val_accuracy")


def prepare(work: Path, env: dict[str, str]) -> dict[str, Path]:
    """Write the PNG folder and TFRecord shards into ``work`` once (reused when they are there)."""
    png, records = work / "mnist_png", work / "mnist_tfrecord"
    if not (png / "test").is_dir() or not list(records.glob("test-*.tfrecord")):
        code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
                "from recipes.make_examples import write_png_folder, write_tfrecords; "
                "write_png_folder(Path(sys.argv[2])); write_tfrecords(Path(sys.argv[3]), shards=8)")
        subprocess.run([sys.executable, "-c", code, str(ROOT), str(png), str(records)], env=env, check=True)
    return {"png": png, "tfrecord": records}


def command(variant: str, batch: int, replicas: int, epochs: int, seed: int, out: Path,
            paths: dict[str, Path]) -> list[str]:
    """The command line of one variant run."""
    if variant == "keras_png":
        return [sys.executable, str(HERE / "plain_image_folder.py"), "--train", str(paths["png"] / "train"),
                "--validation", str(paths["png"] / "test"), "--replicas", str(replicas), "--batch-per-replica",
                str(batch), "--epochs", str(epochs), "--seed", str(seed)]
    recipe, data = {
        "tfgpu_npz": ("mnist_arrays.yaml", {}),
        "tfgpu_png": ("mnist_images.yaml", {"data.path": paths["png"] / "train", "data.test_path": paths["png"] / "test"}),
        "tfgpu_tfrecord": ("mnist_tfrecord.yaml", {"data.path": f"{paths['tfrecord']}/train-*.tfrecord",
                                                   "data.test_path": f"{paths['tfrecord']}/test-*.tfrecord"}),
    }[variant]
    sets = {**data, "data.validation_split": "null", "train.epochs": epochs, "train.batch_size_per_replica": batch,
            "devices.cpu_logical_devices": replicas, "train.lr_scaling": "none", "tensorflow.seed": seed,
            "train.progress": "epoch", "output.save_model": "false"}
    args = [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    return [*tfgpu_command(), "run", str(ROOT / "recipes" / recipe), *args, "--output-dir", str(out)]


def run_once(variant: str, batch: int, replicas: int, epochs: int, seed: int, work: Path, env: dict[str, str],
             paths: dict[str, Path]) -> dict[str, Any]:
    """Run one variant in a fresh process; return its figures (or ``error``)."""
    out = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=work))
    result_file = out / "result.json"
    launched = time.time()
    start = time.perf_counter()
    proc = subprocess.run(command(variant, batch, replicas, epochs, seed, out, paths), cwd=HERE,
                          env={**env, "BENCH_RESULT": str(result_file)}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    row: dict[str, Any] = {"variant": variant, "batch_size_per_replica": batch, "replicas": replicas,
                           "wall_seconds": time.perf_counter() - start}
    if proc.returncode != 0:
        row["error"] = f"exit {proc.returncode}: {proc.stdout[-2000:]}"
        return row
    if variant.startswith("tfgpu"):
        s = json.loads(next(out.glob("*/summary.json")).read_text())
        first_at = s["started_at"] + s["first_step_seconds"]
        row.update(samples_per_second=s["samples_per_second"], val_accuracy=s["final_metrics"]["val_accuracy"],
                   parameters=s["model"]["parameters"], train_samples=s["data"]["train_samples"],
                   cache=s["data"]["cache"]["train"])
    else:
        r = json.loads(result_file.read_text())
        first_at = r["first_step_at"]
        row.update(samples_per_second=r["samples_per_second"], val_accuracy=r["val_accuracy"],
                   parameters=r.get("parameters"))
    row["first_step_seconds"] = first_at - launched
    shutil.rmtree(out, ignore_errors=True)
    return row


def summarise(rows: list[dict[str, Any]], batch: int, replicas: list[int], variants: list[str]) -> dict[str, Any]:
    """Per replica count: each variant's spread of each metric, the ratios and the targets."""
    groups: dict[str, Any] = {}
    for r in replicas:
        stats = {}
        for v in variants:
            runs = [x for x in rows if x["variant"] == v and x["replicas"] == r]
            ok = [x for x in runs if "error" not in x]
            stats[v] = {"runs": len(runs), "failed": len(runs) - len(ok),
                        **{m: spread([x.get(m) for x in ok]) for m in METRICS}}
        med = lambda v, m: (stats.get(v, {}).get(m) or {}).get("median")  # noqa: E731
        ratio = lambda a, b: a / b if a is not None and b else None  # noqa: E731
        ratios = {
            "tfgpu_png / tfgpu_npz samples/s": ratio(med("tfgpu_png", "samples_per_second"),
                                                     med("tfgpu_npz", "samples_per_second")),
            "tfgpu_tfrecord / tfgpu_npz samples/s": ratio(med("tfgpu_tfrecord", "samples_per_second"),
                                                          med("tfgpu_npz", "samples_per_second")),
            "tfgpu_png / keras_png wall": ratio(med("tfgpu_png", "wall_seconds"), med("keras_png", "wall_seconds")),
            "tfgpu_png / keras_png samples/s": ratio(med("tfgpu_png", "samples_per_second"),
                                                     med("keras_png", "samples_per_second")),
            "tfgpu_png / tfgpu_npz wall": ratio(med("tfgpu_png", "wall_seconds"), med("tfgpu_npz", "wall_seconds")),
            "tfgpu_tfrecord / tfgpu_npz wall": ratio(med("tfgpu_tfrecord", "wall_seconds"),
                                                     med("tfgpu_npz", "wall_seconds")),
        }
        checks = [("tfgpu_png samples/s >= 0.85 x tfgpu_npz", ratios["tfgpu_png / tfgpu_npz samples/s"], ">=", 0.85),
                  ("tfgpu_tfrecord samples/s >= 0.85 x tfgpu_npz", ratios["tfgpu_tfrecord / tfgpu_npz samples/s"],
                   ">=", 0.85),
                  ("tfgpu_png wall < keras_png wall", ratios["tfgpu_png / keras_png wall"], "<", 1.0)]
        targets = [{"target": t, "measured": v, "met": None if v is None else (v >= b if op == ">=" else v < b)}
                   for t, v, op, b in checks]
        params = sorted({x.get("parameters") for x in rows if "error" not in x and x["replicas"] == r}, key=str)
        groups[f"{batch}x{r}"] = {"batch_size_per_replica": batch, "replicas": r, "variants": stats,
                                  "ratios": ratios, "targets": targets, "parameters": params}
    return groups


def markdown(report: dict[str, Any]) -> str:
    lines = markdown_header(report, " (reading and decoding included)")
    for group in report["groups"].values():
        lines += markdown_group(group, "####")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=128, help="per-replica batch size")
    parser.add_argument("--replicas", default="1,2", help="replica counts (logical CPUs), comma-separated")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--work", help="where the PNG folder and TFRecords are written (kept; default: a temporary "
                        "folder, removed)")
    parser.add_argument("--out", default=str(HERE / "results"), help="directory for sources.json and sources.md")
    args = parser.parse_args(argv)
    replicas = [int(x) for x in args.replicas.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    if set(variants) - set(VARIANTS) or args.repeats < 1 or args.epochs < 2:
        parser.error(f"variants must be among {', '.join(VARIANTS)}; --repeats >= 1 and --epochs >= 2")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    env["TFGPU_DATA_DIR"] = str(Path(env.get("TFGPU_DATA_DIR") or ROOT.parent / "shared" / "data").expanduser()
                                .resolve())
    if not (Path(env["TFGPU_DATA_DIR"]) / "mnist" / "mnist.npz").is_file():
        print(f"benchmark: no mnist/mnist.npz under TFGPU_DATA_DIR={env['TFGPU_DATA_DIR']}.", file=sys.stderr)
        return 5
    rows: list[dict[str, Any]] = []
    total = args.repeats * len(replicas) * len(variants)
    with tempfile.TemporaryDirectory(prefix="tfgpu-sources-") as scratch:
        work = Path(args.work).resolve() if args.work else Path(scratch)
        paths = prepare(work, env)
        for rep in range(args.repeats):
            for r in replicas:
                for v in variants:
                    row = run_once(v, args.batch, r, args.epochs, args.seed, Path(scratch), env, paths)
                    row["repeat"] = rep
                    rows.append(row)
                    status = "FAILED " + row["error"][:300] if "error" in row else (
                        f"wall {row['wall_seconds']:.1f}s, first step {row['first_step_seconds']:.2f}s, "
                        f"{row['samples_per_second']:.0f} samples/s, val acc {row['val_accuracy'] or 0:.4f}")
                    print(f"[{len(rows)}/{total}] {v} {args.batch}x{r}: {status}", flush=True)
    report = {"command": "python benchmarks/sources.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(), "repeats": args.repeats, "epochs": args.epochs, "seed": args.seed, "runs": rows,
              "groups": summarise(rows, args.batch, replicas, variants)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sources.json").write_text(json.dumps(report, indent=2))
    text = markdown(report)
    (out / "sources.md").write_text(text)
    print()
    print(text)
    print(f"benchmark: wrote {out / 'sources.json'} and {out / 'sources.md'}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
