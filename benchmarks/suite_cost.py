"""Where the test suite's CPU goes: every Python process it starts, with its CPU seconds and what it imported.

    .venv/bin/python benchmarks/suite_cost.py                       # the README's test command, measured
    .venv/bin/python benchmarks/suite_cost.py -- tests/serving -n 0  # pytest's arguments (after --)

For the run it installs a ``.pth`` file in this interpreter's site-packages (and removes it after, also on
Ctrl-C), so every Python process of this environment, however a test builds its environment, appends one JSON
line at exit: its CPU seconds (user + system, its own, not its children's), wall seconds, argv, the test that
started it (``PYTEST_CURRENT_TEST``, inherited) and whether it imported TensorFlow or JAX. Processes that die of
a signal (kill -9 tests, workers a supervisor kills) write no line; the machine's busy CPU seconds over the run
(``/proc/stat``) are read too, so what no line covers (those, the container engine and the builds inside it,
the pytest workers' own CPU) shows as the difference.

It prints the suite's accounting: CPU by kind of process, the TensorFlow starts and their floor (each start at
the CPU seconds of ``python -c "import tensorflow"`` measured first, as ``.ci/run`` does), the test files and
tests by CPU, and the shortest wall the suite could have on this machine's cores at full use, with and without
the work above each process's start. The log stays in ``benchmarks/results/suite_cost-*.jsonl``.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOK = "_tfgpu_suite_cost"
RECORDER = '''\
import atexit, json, os, sys, time
_t0 = time.monotonic()
def _record():
    try:
        t = os.times()
        row = {{"cpu": round(t.user + t.system, 3), "wall": round(time.monotonic() - _t0, 3), "argv": sys.argv[:6],
               "test": os.environ.get("PYTEST_CURRENT_TEST", ""), "tf": "tensorflow" in sys.modules,
               "jax": "jax" in sys.modules}}
        with open({log!r}, "a") as f:
            f.write(json.dumps(row) + "\\n")
    except Exception:
        pass
atexit.register(_record)
'''


def busy_cpu_seconds() -> float:
    """The machine's busy CPU seconds since boot (``/proc/stat``: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def calibrate(log: Path) -> tuple[float, float]:
    """CPU seconds, as the recorder counts them, of one TensorFlow start (median of three ``import tensorflow``
    processes in the environment the suite gives its processes: ``tests/conftest.py:child_env``) and of the
    smallest ``tfgpu run`` (the seed recipe, one epoch of 512 digits: two steps, with its start-up log process)."""
    sys.path.insert(0, str(ROOT))
    from tests.conftest import child_env, write_mnist_subset  # noqa: PLC0415  (the suite's own environment)

    for _ in range(3):
        subprocess.run([sys.executable, "-c", "import tensorflow"], env=child_env(), check=True, capture_output=True)
    starts = sorted(json.loads(line)["cpu"] for line in log.read_text().splitlines())
    with tempfile.TemporaryDirectory() as tmp:
        write_mnist_subset(Path(tmp), 512, 256)
        subprocess.run([sys.executable, "-m", "tfgpu.cli", "run", "recipes/mnist.yaml", "--set", "train.epochs=1",
                        "--set", "train.batch_size_per_replica=256", "--output-dir", str(Path(tmp) / "runs")],
                       env=child_env(TFGPU_DATA_DIR=tmp), cwd=ROOT, check=True, capture_output=True)
    rows = [json.loads(line)["cpu"] for line in log.read_text().splitlines()]
    log.unlink()
    return starts[1], sum(rows[3:])


def report(rows: list[dict], wall: float, busy: float, start: float, smallest: float, cores: int) -> str:
    """The accounting as Markdown: ``rows`` the processes' lines, ``wall`` and ``busy`` the run's seconds and the
    machine's busy CPU seconds over it, ``start`` and ``smallest`` :func:`calibrate`'s figures."""
    tf = [r for r in rows if r["tf"]]
    jax = [r for r in rows if r["jax"] and not r["tf"]]
    other = [r for r in rows if not r["tf"] and not r["jax"]]
    cpu = lambda rs: sum(r["cpu"] for r in rs)  # noqa: E731
    floor = start * len(tf)
    # each TensorFlow process at most as dear as the smallest run: what no cut of training steps goes below
    least = sum(min(r["cpu"], smallest) for r in tf)
    lines = [f"suite: {wall:.0f} s wall on {cores} cores; the machine busy {busy:.0f} CPU s "
             f"({busy / (wall * cores):.0%} of its cores); one TensorFlow start {start:.2f} CPU s, the smallest "
             f"`tfgpu run` {smallest:.2f}", "",
             "| processes | count | CPU s |", "| --- | ---: | ---: |",
             f"| importing TensorFlow | {len(tf)} | {cpu(tf):.0f} |",
             f"| of which their TensorFlow starts (count x {start:.2f}) | | {floor:.0f} |",
             f"| importing JAX, not TensorFlow | {len(jax)} | {cpu(jax):.0f} |",
             f"| the rest (tfgpu's light commands, helpers, pytest and its workers) | {len(other)} | {cpu(other):.0f} |",
             f"| no line: killed processes, the container engine and its builds, the rest of the machine | | {busy - cpu(rows):.0f} |", "",
             f"At full use of {cores} cores the suite cannot take less than {busy / cores / 60:.1f} minutes with this "
             f"work; with every TensorFlow process cut to at most the smallest run (a model built, two steps), "
             f"{(busy - cpu(tf) + least) / cores / 60:.1f}; with none doing more than start TensorFlow, "
             f"{(busy - cpu(tf) + floor) / cores / 60:.1f}.", ""]
    for title, key in (("test file", lambda r: r["test"].split("::")[0]),
                       ("test", lambda r: r["test"].rsplit(" (", 1)[0])):
        by = collections.defaultdict(lambda: [0, 0, 0.0])
        for r in rows:
            b = by[key(r) or "(no test: the pytest workers, this script)"]
            b[0] += 1
            b[1] += r["tf"]
            b[2] += r["cpu"]
        lines += [f"| {title} | processes | TensorFlow | CPU s |", "| --- | ---: | ---: | ---: |"]
        lines += [f"| {k} | {n} | {t} | {c:.0f} |" for k, (n, t, c) in sorted(by.items(), key=lambda kv: -kv[1][2])[:25]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    pytest_args = argv[1:] if argv[:1] == ["--"] else argv
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"suite_cost-{datetime.datetime.now():%Y%m%d-%H%M%S}.jsonl"
    site = Path(sysconfig.get_paths()["purelib"])
    module, pth = site / f"{HOOK}.py", site / f"{HOOK}.pth"
    calibration = log.with_suffix(".calibration.jsonl")
    module.write_text(RECORDER.format(log=str(calibration)))
    pth.write_text(f"import {HOOK}\n")  # after the module: a process that starts between the two finds it
    try:
        start, smallest = calibrate(calibration)
        module.write_text(RECORDER.format(log=str(log)))
        busy0, t0 = busy_cpu_seconds(), time.monotonic()
        code = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT).returncode
        busy, wall = busy_cpu_seconds() - busy0, time.monotonic() - t0
    finally:
        pth.unlink(missing_ok=True)
        module.unlink(missing_ok=True)
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    cores = len(os.sched_getaffinity(0))
    text = report(rows, wall, busy, start, smallest, cores)
    log.with_suffix(".md").write_text(text + "\n")
    print(text)
    print(f"pytest exited {code}; the processes' log: {log}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
