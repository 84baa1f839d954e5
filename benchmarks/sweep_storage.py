"""The sweep's default storage: Optuna's journal file against SQLite, with several local processes on one study.

    .venv/bin/python benchmarks/sweep_storage.py                       # about 1 minute on 2 cores
    .venv/bin/python benchmarks/sweep_storage.py --processes 2,4,8 --trials 25 --epochs 20 --repeats 3

Each of ``--processes`` worker processes does what a ``tfgpu sweep`` process and its trials do to the
storage, ``--trials`` times: ``ask`` a trial (TPE sampler), set three user attributes, ``report`` ``--epochs``
intermediate values with ``should_prune`` after each (the trial's per-epoch callback), then ``tell``. There is
no training, so the figure is the storage's own cost: wall seconds for all processes, milliseconds per
storage-touching call, and the errors (SQLite's ``database is locked``). Medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def storage_of(kind: str, where: str):
    import optuna

    if kind == "journal":
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(os.path.join(where, "s.journal")))
    return optuna.storages.RDBStorage(f"sqlite:///{os.path.join(where, 's.db')}")


def worker(kind: str, where: str, trials: int, epochs: int, out: "mp.Queue") -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    errors = 0
    calls = 0
    study = optuna.load_study(study_name="bench", storage=storage_of(kind, where),
                              pruner=optuna.pruners.MedianPruner(n_startup_trials=100))
    dist = {"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)}
    for _ in range(trials):
        try:
            trial = study.ask(dist)
            for key in ("sweep_dir", "host", "run_dir"):
                trial.set_user_attr(key, "x")
            for epoch in range(epochs):
                trial.report(trial.params["lr"] * (epochs - epoch), epoch)
                trial.should_prune()
            study.tell(trial, trial.params["lr"])
            calls += 5 + 2 * epochs
        except Exception as exc:  # noqa: BLE001  (counting SQLite's "database is locked" and the like)
            errors += 1
            print(f"{kind}: {type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
    out.put((calls, errors))


def once(kind: str, processes: int, trials: int, epochs: int) -> tuple[float, int, int]:
    import optuna

    with tempfile.TemporaryDirectory() as where:
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        optuna.create_study(study_name="bench", storage=storage_of(kind, where))
        out: mp.Queue = mp.Queue()
        procs = [mp.Process(target=worker, args=(kind, where, trials, epochs, out)) for _ in range(processes)]
        started = time.perf_counter()
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
        seconds = time.perf_counter() - started
        return seconds, sum(r[0] for r in results), sum(r[1] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="2,4")
    parser.add_argument("--trials", type=int, default=20, help="trials per process")
    parser.add_argument("--epochs", type=int, default=15, help="reports per trial")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    mp.set_start_method("spawn")
    print("| processes | storage | wall s (median) | ms per call | errors |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.processes.split(",")):
        for kind in ("journal", "sqlite"):
            runs = [once(kind, n, args.trials, args.epochs) for _ in range(args.repeats)]
            wall = statistics.median(r[0] for r in runs)
            calls = statistics.median(r[1] for r in runs)
            errors = sum(r[2] for r in runs)
            print(f"| {n} | {kind} | {wall:.2f} | {1000 * wall * n / max(calls, 1):.2f} | {errors} |", flush=True)


if __name__ == "__main__":
    main()
