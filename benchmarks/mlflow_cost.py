"""What MLflow tracking (``output.mlflow``) costs a run: per epoch, and over the whole `tfgpu run`.

    TFGPU_DATA_DIR=../shared/data .venv/bin/python benchmarks/mlflow_cost.py --repeats 5 --epochs 20
    ... mlflow_cost.py --recipe recipes/mnist.yaml --epochs 3 --set train.batch_size_per_replica=512

Runs the recipe (default recipes/breast_cancer.yaml: 15 steps of 32 samples an epoch, so
the epochs are short and the logging's share is at its largest), each run a fresh process,
in three variants interleaved run by run (A B C A B C ...) so the drifts of a shared
machine hit them alike:

| variant | what |
| --- | --- |
| off | no tracking (``output.mlflow: false``) |
| server | a real ``mlflow server`` on 127.0.0.1 (SQLite backend, ``--workers 1``, started once, before the runs) |
| sqlite | a local ``sqlite:///`` store, no server (the database made once, before the runs) |

Per variant: the median and min-max of the whole run's wall time (launch to exit: the
mlflow import, the MLflow run's start, parameters and tags, every epoch, the artifacts and
the status), of the per-epoch logging time (``summary.json`` ``mlflow.log_seconds_median``:
``MlflowClient.log_batch`` inside the callback's ``on_epoch_end``, timed by tfgpu) and of
the median epoch (``epoch_seconds``, epochs after the first); then the wall-time ratio
against ``off`` and the logging's share of an epoch. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("off", "server", "sqlite")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(where: Path) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` (SQLite backend, artifacts proxied into ``where``) and its URI, once it answers."""
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner: 2 processes, not 9
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server",
         "--backend-store-uri", f"sqlite:///{where / 'server.db'}", "--artifacts-destination", str(where / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=where, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    return process, uri
        except OSError:
            time.sleep(0.25)
        if process.poll() is not None:
            break
    os.killpg(process.pid, signal.SIGKILL)
    raise SystemExit("mlflow server did not start")


def one_run(out: Path, recipe: str, epochs: int, uri: str | None, extra: list[str]) -> dict:
    """One fresh `tfgpu run`: wall seconds, per-epoch logging seconds, the median epoch's seconds."""
    out.mkdir(parents=True)
    tracking = ["--set", f"output.mlflow={{tracking_uri: '{uri}', experiment: mlflow-cost}}"] if uri else []
    command = [sys.executable, "-m", "tfgpu", "run", recipe, "--output-dir", str(out),
               "--set", f"train.epochs={epochs}", "--set", "train.progress=none", *tracking,
               *(a for kv in extra for a in ("--set", kv))]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=out)
    wall = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads(next(out.glob("*/summary.json")).read_text())
    logged = summary.get("mlflow") or {}
    if uri:
        assert logged.get("epochs_logged") == epochs, logged
    return {"wall": wall, "log": logged.get("log_seconds_median"),
            "epoch": statistics.median(summary["epoch_seconds"][1:])}


def span(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    med = statistics.median(values) * scale
    return f"{med:.{digits}f} ({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "breast_cancer.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="another config override (repeatable)")
    parser.add_argument("--work", default=None, help="where the runs and the stores go (default: a temporary folder)")
    args = parser.parse_args()
    args.recipe = str(Path(args.recipe).resolve())  # each run starts in its own folder (a local store's ./mlruns)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        server, server_uri = start_server(work)
        local_uri = f"sqlite:///{work / 'local.db'}"
        subprocess.run([sys.executable, "-c", f"from mlflow import MlflowClient; "
                        f"MlflowClient({local_uri!r}).search_experiments()"], check=True, capture_output=True)
        uris = {"off": None, "server": server_uri, "sqlite": local_uri}
        results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        try:
            for repeat in range(args.repeats):
                for variant in VARIANTS:
                    r = one_run(work / f"{variant}-{repeat}", args.recipe, args.epochs, uris[variant], args.set)
                    results[variant].append(r)
                    print(repeat, variant, f"wall {r['wall']:.2f} s", f"epoch {r['epoch'] * 1000:.0f} ms",
                          f"log {r['log'] * 1000:.1f} ms/epoch" if r["log"] is not None else "", flush=True)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait()
    off_wall = statistics.median(r["wall"] for r in results["off"])
    print(f"\n{Path(args.recipe).name}, {args.epochs} epochs, {args.repeats} runs each; median (min-max)\n")
    print("| variant | wall s | wall vs off | logging ms per epoch | epoch ms (after the first) | logging / epoch |")
    print("| --- | --- | --- | --- | --- | --- |")
    for variant in VARIANTS:
        rows = results[variant]
        walls, epochs = [r["wall"] for r in rows], [r["epoch"] for r in rows]
        logs = [r["log"] for r in rows if r["log"] is not None]
        share = f"{statistics.median(logs) / statistics.median(epochs):.1%}" if logs else "-"
        print(f"| {variant} | {span(walls)} | {statistics.median(walls) / off_wall:.2f}x "
              f"({statistics.median(walls) - off_wall:+.2f} s) | {span(logs, 1000, 1) if logs else '-'} "
              f"| {span(epochs, 1000, 0)} | {share} |")


if __name__ == "__main__":
    os.environ.setdefault("TFGPU_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    main()
