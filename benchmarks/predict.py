"""``tfgpu predict`` against a plain ``model.predict`` script, on the same model and data, 1 and 2 replicas.

    .venv/bin/python benchmarks/predict.py                       # about 4 minutes on 2 cores
    .venv/bin/python benchmarks/predict.py --repeats 3 --samples 10000 --replicas 1,2

Trains one run of ``recipes/mnist_images.yaml`` (1 epoch) on MNIST PNGs written
from the offline digits, then predicts the ``--samples`` test digits two ways, each
from the raw uint8 pixels to float32 probabilities:

| variant | what |
| --- | --- |
| tfgpu_png | ``tfgpu predict RUN test/ test/``: the PNG folder (decoded as in training) |
| plain_png | ``keras.utils.image_dataset_from_directory(test/, shuffle=False)`` + ``/255`` + ``prefetch`` + ``model.predict`` |
| tfgpu_npz | ``tfgpu predict RUN digits.npz digits.npz ...``: the same digits as a uint8 array, ``--tile`` times over |
| plain_npz | ``model.predict(x.astype("float32")[..., None] / 255)`` on the same array (the conversion timed too) |

Each variant is a fresh process; variants are interleaved (each once, then again,
``--repeats`` times). Each process passes over the data ``--passes`` times
(tfgpu: the same input given that many times, each timed in the record's
``per_input``; plain: that many ``model.predict`` calls). Steady samples/s is
the median of the passes after the first, so tracing and the first pipeline
fill are left out. The medians over repeats (min-max) are written to ``--out``
(``benchmarks/results/predict.{md,json}``). tfgpu's figure includes writing
its ``.npy`` output; the plain script keeps its outputs in memory.
With ``--replicas 2``, both sides use 2 logical CPUs: tfgpu through
``--set devices.cpu_logical_devices=2``, the plain script through
``tf.config.set_logical_device_configuration`` and a ``MirroredStrategy`` scope.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLAIN = """
import json, sys, time
import numpy as np
import tensorflow as tf
replicas, kind, data, model_path, batch = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
passes = int(sys.argv[6])
if replicas > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
import keras
strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")][:replicas])
with strategy.scope():
    model = keras.models.load_model(model_path, compile=False)
if kind == "png":
    ds = keras.utils.image_dataset_from_directory(data, labels=None, color_mode="grayscale", image_size=(28, 28),
                                                  shuffle=False, batch_size=batch)
    count = len(ds.file_paths)
    ds = ds.map(lambda x: x / 255.0).prefetch(tf.data.AUTOTUNE)
    go = lambda: model.predict(ds, verbose=0)
else:
    raw = np.load(data)["x"]
    count = len(raw)
    go = lambda: model.predict(raw.astype("float32")[..., None] / 255.0, batch_size=batch, verbose=0)
times = []
for _ in range(passes):
    t = time.perf_counter(); out = go(); times.append(time.perf_counter() - t)
steady = sorted(times[1:])[len(times[1:]) // 2]
print("RESULT", json.dumps({"samples_per_second": count / steady, "first_pass": count / times[0],
                            "classes": np.asarray(out).argmax(1)[:50].tolist()}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "KERAS_", "CUDA_"))}
    env.setdefault("TFGPU_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


def _check(result: subprocess.CompletedProcess) -> None:
    if result.returncode:
        sys.exit(f"failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")


def tfgpu_rate(run_dir: Path, data: str, replicas: int, batch: int, passes: int, out: Path) -> float:
    target = out / "p.npy"
    cmd = [sys.executable, "-m", "tfgpu.cli", "predict", str(run_dir), *[data] * passes, "-o", str(target),
           "--batch-size", str(batch), "--set", f"devices.cpu_logical_devices={replicas}"]
    _check(subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT))
    record = json.loads((out / "p.npy.json").read_text())
    return statistics.median(p["count"] / p["seconds"] for p in record["per_input"][1:])


def plain_rate(run_dir: Path, kind: str, data: str, replicas: int, batch: int, passes: int) -> float:
    cmd = [sys.executable, "-c", textwrap.dedent(PLAIN), str(replicas), kind, data, str(run_dir / "model.keras"),
           str(batch), str(passes)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT)
    _check(result)
    return json.loads(result.stdout.split("RESULT", 1)[1])["samples_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=10000, help="test digits predicted (at most 10,000)")
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--batch", type=int, default=256, help="global batch, both sides")
    parser.add_argument("--passes", type=int, default=3, help="passes over the data per process (2 or more)")
    parser.add_argument("--tile", type=int, default=4, help="the .npz holds the digits this many times over")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "predict"))
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("TFGPU_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    import numpy as np  # noqa: PLC0415

    from recipes.make_examples import mnist, write_png_folder  # noqa: PLC0415

    work = Path(tempfile.mkdtemp(prefix="tfgpu-bench-predict-"))
    png = write_png_folder(work / "png", args.samples)
    digits = mnist(args.samples)
    np.savez(work / "digits.npz", x=np.tile(digits["x_test"], (args.tile, 1, 1)), y=np.tile(digits["y_test"], args.tile))
    runs = work / "runs"
    _check(subprocess.run([sys.executable, "-m", "tfgpu.cli", "run", "recipes/mnist_images.yaml",
                           "--set", f"data.path={png / 'train'}", "--set", "data.test_path=null",
                           "--set", "train.epochs=1", "--output-dir", str(runs)],
                          capture_output=True, text=True, env=_env(), cwd=ROOT))
    run_dir = next(runs.iterdir())
    results: dict[str, dict[int, list[float]]] = {}
    for replicas in [int(r) for r in args.replicas.split(",")]:
        for _ in range(args.repeats):
            for name, go in (
                ("tfgpu_png", lambda: tfgpu_rate(run_dir, str(png / "test"), replicas, args.batch, args.passes, work)),
                ("plain_png", lambda: plain_rate(run_dir, "png", str(png / "test"), replicas, args.batch, args.passes)),
                ("tfgpu_npz", lambda: tfgpu_rate(run_dir, str(work / "digits.npz"), replicas, args.batch, args.passes,
                                                 work)),
                ("plain_npz", lambda: plain_rate(run_dir, "npz", str(work / "digits.npz"), replicas, args.batch,
                                                 args.passes)),
            ):
                rate = go()
                results.setdefault(name, {}).setdefault(replicas, []).append(rate)
                print(f"{name} replicas={replicas}: {rate:,.0f} samples/s", flush=True)
    lines = ["| variant | replicas | steady samples/s, median (min-max) | vs plain |", "| --- | --- | --- | --- |"]
    for name, per in results.items():
        for replicas, rates in per.items():
            plain = statistics.median(results[name.replace("tfgpu", "plain")][replicas])
            med = statistics.median(rates)
            lines.append(f"| {name} | {replicas} | {med:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | "
                         f"{med / plain:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(f"{args.samples} digits (npz: x{args.tile}), global batch {args.batch}, "
                                      f"{args.passes} passes, {args.repeats} repeats\n\n" + text)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
