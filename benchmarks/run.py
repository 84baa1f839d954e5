"""tfgpu against the plain scripts it replaces: one command, a Markdown table and a JSON file.

    .venv/bin/python benchmarks/run.py                 # the full run (about 30 minutes on 2 cores)
    .venv/bin/python benchmarks/run.py --repeats 5 --epochs 5 --batches 4096,128 --replicas 1,2

Variants, each run in a fresh process with the same model (the seed CNN), data
($TFGPU_DATA_DIR/mnist), epochs, per-replica batch, learning rate and seed:

| variant | what |
| --- | --- |
| keras_fit | ``plain_keras.py``: MirroredStrategy, ``fit`` on NumPy, batch = per-replica x replicas |
| tfgpu_fit | ``tfgpu run recipes/mnist.yaml`` (``train.loop: fit``) |
| plain_tape | ``plain_tape.py``: the tf.distribute custom-training tutorial's GradientTape loop |
| tfgpu_custom | ``tfgpu run recipes/mnist.yaml --set train.loop=custom`` |
| floor | ``floor.py``: the same step on one staged batch in one tf.function (compute limit) |

The "replicas" are logical CPUs here (``devices.cpu_logical_devices``), GPUs on a GPU
machine only if the scripts are pointed at them; the learning rate is not scaled
(``train.lr_scaling=none``) so every variant does the same arithmetic.

A baseline that crashes (dies of a signal: TensorFlow's distributed iterator
has segfaulted at an epoch's end under load, see docs/benchmarks.md) is run
once more; the crash is recorded in the run's ``crashed`` list and counted in
the table's "crashed" column, and only a second crash counts as a failed run.
tfgpu's own variants are never retried: a crash there is a failure.

Order: repeat 1 runs every (batch, replicas) and every variant, then repeat 2, ...
(A B C D E A B C D E ...), so slow drifts of the machine hit every variant alike.
Reported per variant: medians and min-max of whole-run wall time (launch to exit),
time to the first finished training call (launch to its return), steady-state
training samples/s (median of the epochs after the first, validation excluded), the
fastest of those epochs ("best epoch": noise on a shared host only slows an epoch, so the
floor targets are stated on it, as timeit's documentation advises its minimum) and final
validation accuracy; then the ratios tfgpu / baseline and the targets.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VARIANTS = ("keras_fit", "tfgpu_fit", "plain_tape", "tfgpu_custom", "floor")
#: The hand-written scripts tfgpu is measured against: a crash of one of them is retried once.
BASELINES = ("keras_fit", "plain_tape", "floor")
METRICS = ("wall_seconds", "first_step_seconds", "samples_per_second", "best_samples_per_second", "val_accuracy")


def tfgpu_command() -> list[str]:
    """The installed ``tfgpu`` entry point beside this Python, else ``python -m tfgpu.cli``."""
    exe = Path(sys.executable).with_name("tfgpu")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tfgpu.cli"]


def command(variant: str, batch: int, replicas: int, epochs: int, seed: int, out: Path) -> list[str]:
    """The command line of one variant run."""
    common = ["--replicas", str(replicas), "--batch-per-replica", str(batch), "--epochs", str(epochs),
              "--seed", str(seed)]
    scripts = {"keras_fit": "plain_keras.py", "plain_tape": "plain_tape.py", "floor": "floor.py"}
    if variant in scripts:
        return [sys.executable, str(HERE / scripts[variant]), *common]
    loop = "fit" if variant == "tfgpu_fit" else "custom"
    sets = {"train.loop": loop, "train.epochs": epochs, "train.batch_size_per_replica": batch,
            "devices.cpu_logical_devices": replicas, "train.lr_scaling": "none", "tensorflow.seed": seed,
            "train.progress": "epoch", "output.save_model": "false"}
    args = [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    return [*tfgpu_command(), "run", str(ROOT / "recipes" / "mnist.yaml"), *args, "--output-dir", str(out)]


def run_once(variant: str, batch: int, replicas: int, epochs: int, seed: int, work: Path,
             env: dict[str, str]) -> dict[str, Any]:
    """Run one variant in a fresh process; return its figures (or ``error``)."""
    out = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=work))
    result_file = out / "result.json"
    cmd = command(variant, batch, replicas, epochs, seed, out)
    crashed: list[dict[str, Any]] = []
    while True:
        launched = time.time()
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=HERE, env={**env, "BENCH_RESULT": str(result_file)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.perf_counter() - start
        if proc.returncode >= 0 or variant not in BASELINES or crashed:
            break
        crashed.append(crash_record(proc.returncode, wall, proc.stdout))
        print(f"benchmark: {variant} crashed ({crashed[-1]['signal']}, exit {proc.returncode}) after {wall:.1f}s; "
              "running it once more", flush=True)
    row: dict[str, Any] = {"variant": variant, "batch_size_per_replica": batch, "replicas": replicas,
                           "wall_seconds": wall, "crashed": crashed}
    if proc.returncode != 0:
        row["error"] = f"exit {proc.returncode}: {proc.stdout[-2000:]}"
        return row
    if variant.startswith("tfgpu"):
        summaries = list(out.glob("*/summary.json"))
        s = json.loads(summaries[0].read_text())
        first_at = s["started_at"] + s["first_step_seconds"]
        rates = [e["samples_per_second"] for e in s["epochs"]]  # the steady epochs as summary.json's median's
        row.update(samples_per_second=s["samples_per_second"], val_accuracy=s["final_metrics"]["val_accuracy"],
                   best_samples_per_second=max(rates[1:] or rates),
                   steps_per_execution=s["steps_per_execution"], jit_compile=s["jit_compile"],
                   train_seconds=s["train_seconds"], parameters=s["model"]["parameters"],
                   startup_seconds=s.get("startup_seconds"), input=s.get("input"))
    else:
        r = json.loads(result_file.read_text())
        first_at = r["first_step_at"]
        row.update(samples_per_second=r["samples_per_second"], val_accuracy=r["val_accuracy"],
                   best_samples_per_second=r["best_samples_per_second"],
                   train_seconds=r["train_seconds"], parameters=r.get("parameters"))
    row["first_step_seconds"] = first_at - launched
    shutil.rmtree(out, ignore_errors=True)
    return row


def crash_record(code: int, seconds: float, output: str) -> dict[str, Any]:
    """What a crashed run leaves in results.json: its exit code, the signal, when, and its last output."""
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return {"exit": code, "signal": name, "seconds": seconds, "output_tail": output[-1500:]}


def spread(values: list[float]) -> Optional[dict[str, float]]:
    """Median, min and max (None when there are no values)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def startup(repeats: int, env: dict[str, str]) -> dict[str, Any]:
    """Wall time of the start-up commands, interleaved, each in a fresh process (seconds)."""
    tfgpu = tfgpu_command()
    commands = {
        "tfgpu --help": [*tfgpu, "--help"],
        "tfgpu plan recipes/mnist.yaml": [*tfgpu, "plan", str(ROOT / "recipes" / "mnist.yaml")],
        'python -c "import tfgpu"': [sys.executable, "-c", "import tfgpu"],
        'python -c "import tensorflow"': [sys.executable, "-c", "import tensorflow"],
    }
    times: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(repeats):
        for name, cmd in commands.items():
            start = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - start)
            if proc.returncode != 0:
                raise SystemExit(f"benchmark: '{name}' failed with exit {proc.returncode}")
    return {name: spread(t) for name, t in times.items()}


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem = None
    versions = subprocess.run([sys.executable, "-c", "import tensorflow as tf, keras; print(tf.__version__, "
                               "keras.__version__, len(tf.config.list_physical_devices('GPU')))"],
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, capture_output=True, text=True)
    tf_version, keras_version, gpus = (versions.stdout.split() + ["?", "?", "?"])[:3]
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem, 1) if mem else None,
            "gpus": gpus, "os": platform.platform(), "python": platform.python_version(),
            "tensorflow": tf_version, "keras": keras_version,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def summarise(rows: list[dict[str, Any]], batches: list[int], replicas: list[int],
              variants: list[str]) -> dict[str, Any]:
    """Per (batch, replicas, variant): the spread of each metric; then ratios and targets."""
    groups: dict[str, Any] = {}
    for b in batches:
        for r in replicas:
            key = f"{b}x{r}"
            groups[key] = {"batch_size_per_replica": b, "replicas": r, "variants": {}}
            for v in variants:
                runs = [x for x in rows if x["variant"] == v and x["batch_size_per_replica"] == b
                        and x["replicas"] == r]
                ok = [x for x in runs if "error" not in x]
                groups[key]["variants"][v] = {
                    "runs": len(runs), "failed": len(runs) - len(ok),
                    "crashed": sum(len(x.get("crashed", [])) for x in runs),
                    **{m: spread([x.get(m) for x in ok]) for m in METRICS}}
            # Every variant must train the same model: the same parameter count.
            groups[key]["parameters"] = sorted({x.get("parameters") for x in rows if "error" not in x
                                                and x["batch_size_per_replica"] == b and x["replicas"] == r},
                                               key=str)
            groups[key]["ratios"] = ratios(groups[key]["variants"])
            groups[key]["targets"] = targets(b, groups[key]["variants"], groups[key]["ratios"])
    return groups


def _median(stats: dict[str, Any], variant: str, metric: str) -> Optional[float]:
    s = stats.get(variant, {}).get(metric)
    return s["median"] if s else None


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def ratios(stats: dict[str, Any]) -> dict[str, Optional[float]]:
    """The ratios of medians the targets are stated in."""
    m = lambda v, k: _median(stats, v, k)  # noqa: E731
    acc = lambda a, b: None if m(a, "val_accuracy") is None or m(b, "val_accuracy") is None else (  # noqa: E731
        100 * (m(a, "val_accuracy") - m(b, "val_accuracy")))
    return {
        "tfgpu_fit / keras_fit wall": _ratio(m("tfgpu_fit", "wall_seconds"), m("keras_fit", "wall_seconds")),
        "tfgpu_custom / plain_tape wall": _ratio(m("tfgpu_custom", "wall_seconds"), m("plain_tape", "wall_seconds")),
        "tfgpu_custom / tfgpu_fit wall": _ratio(m("tfgpu_custom", "wall_seconds"), m("tfgpu_fit", "wall_seconds")),
        "tfgpu_fit / floor samples/s": _ratio(m("tfgpu_fit", "samples_per_second"), m("floor", "samples_per_second")),
        "tfgpu_custom / floor samples/s": _ratio(m("tfgpu_custom", "samples_per_second"),
                                                 m("floor", "samples_per_second")),
        "tfgpu_fit / floor best epoch": _ratio(m("tfgpu_fit", "best_samples_per_second"),
                                               m("floor", "best_samples_per_second")),
        "tfgpu_custom / floor best epoch": _ratio(m("tfgpu_custom", "best_samples_per_second"),
                                                  m("floor", "best_samples_per_second")),
        "keras_fit / floor samples/s": _ratio(m("keras_fit", "samples_per_second"), m("floor", "samples_per_second")),
        "plain_tape / floor samples/s": _ratio(m("plain_tape", "samples_per_second"),
                                               m("floor", "samples_per_second")),
        "tfgpu_fit - keras_fit val acc (points)": acc("tfgpu_fit", "keras_fit"),
        "tfgpu_custom - plain_tape val acc (points)": acc("tfgpu_custom", "plain_tape"),
    }


def targets(batch: int, stats: dict[str, Any], r: dict[str, Optional[float]]) -> list[dict[str, Any]]:
    """The targets for this configuration: what, the bound, the measured value, met or not.

    Issue 35: fit >= 0.9 and the custom loop >= 0.95 of the floor's samples/s everywhere (each run's fastest
    steady epoch, median over the repeats: on a shared host noise only slows a run, and identical runs of the
    floor differ by a fifth in their median epoch, docs/benchmarks.md "Noise"); at 128 per replica,
    where per-step overhead is what the plain scripts lose, fit's wall <= 0.75 x plain Keras's and the custom
    loop's <= 0.6 x the plain GradientTape loop's. At 4096 (3-6 steps an epoch) fit's wall stays bounded by
    plain Keras's.
    """
    small = batch < 4096
    rows = [
        ("tfgpu_fit samples/s >= 0.9 x floor (best epoch)", r["tfgpu_fit / floor best epoch"], ">=", 0.9),
        ("tfgpu_custom samples/s >= 0.95 x floor (best epoch)", r["tfgpu_custom / floor best epoch"], ">=", 0.95),
        (f"tfgpu_fit wall <= {0.75 if small else 1:g} x keras_fit", r["tfgpu_fit / keras_fit wall"], "<=",
         0.75 if small else 1.0),
        ("tfgpu_fit val acc within 0.5 point of keras_fit", r["tfgpu_fit - keras_fit val acc (points)"], "abs<=",
         0.5),
        *([("tfgpu_custom wall <= 0.6 x plain_tape", r["tfgpu_custom / plain_tape wall"], "<=", 0.6)] if small else []),
        # "within 10% of fit": the custom loop may be faster, not more than 10% slower.
        ("tfgpu_custom wall <= 1.1 x tfgpu_fit", r["tfgpu_custom / tfgpu_fit wall"], "<=", 1.10),
    ]
    out = []
    for name, value, op, bound in rows:
        if value is None:
            met = None
        elif op == ">=":
            met = value >= bound
        elif op == "<=":
            met = value <= bound
        else:
            met = abs(value) <= bound
        out.append({"target": name, "measured": value, "met": met})
    return out


def _fmt(s: Optional[dict[str, float]], digits: int) -> str:
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def markdown_header(report: dict[str, Any], first_step: str) -> list[str]:
    """The lines before the tables: the machine, the command, the method (``first_step`` says what it counts)."""
    m = report["machine"]
    return [
        f"Measured {m['date']} on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['gpus']} GPUs; "
        f"{m['os']}; Python {m['python']}, TensorFlow {m['tensorflow']}, Keras {m['keras']}.",
        "",
        f"Command: `{report['command']}`",
        "",
        f"{report['repeats']} repeats, {report['epochs']} epochs, seed {report['seed']}; medians with min-max in "
        f"brackets. Wall: launch to exit. First step: launch to the return of the first training call{first_step}. "
        "Samples/s: training only (validation excluded), median of the epochs after the first; best epoch: the "
        "fastest of them (the floor targets are stated on it: noise on a shared host only slows an epoch).",
    ]


def markdown_group(group: dict[str, Any], heading: str = "###") -> list[str]:
    """One configuration's tables: the variants, then the ratios and the targets."""
    b, r = group["batch_size_per_replica"], group["replicas"]
    best = any(s.get("best_samples_per_second") for s in group["variants"].values())  # (not in sources.py's)
    lines = ["", f"{heading} {b} per replica x {r} replica{'s' if r > 1 else ''} (global batch {b * r})", "",
             "| variant | wall s | first step s | samples/s |" + (" best epoch samples/s |" if best else "")
             + " val acc | failed | crashed, run again |",
             "| --- " * (7 + best) + "|"]
    for v, s in group["variants"].items():
        lines.append(f"| {v} | {_fmt(s['wall_seconds'], 1)} | {_fmt(s['first_step_seconds'], 2)} | "
                     f"{_fmt(s['samples_per_second'], 0)} | "
                     + (f"{_fmt(s.get('best_samples_per_second'), 0)} | " if best else "")
                     + f"{_fmt(s['val_accuracy'], 4)} | "
                     f"{s['failed']}/{s['runs']} | {s.get('crashed', 0)} |")
    crashes = {v: s.get("crashed", 0) for v, s in group["variants"].items() if s.get("crashed")}
    if crashes:
        lines += ["", "Crashed and run again (a signal, not an error; results.json's `crashed` has each exit and "
                      "its last output): " + ", ".join(f"{v} {n}x" for v, n in crashes.items()) + "."]
    params = group.get("parameters", [])
    if len(params) > 1:
        lines += ["", f"**The variants trained different models: parameter counts {params}.**"]
    lines += ["", "| ratio (of medians) | value |", "| --- | --- |"]
    lines += [f"| {k} | {'-' if v is None else f'{v:.3f}'} |" for k, v in group["ratios"].items()]
    lines += ["", "| target | measured | met |", "| --- | --- | --- |"]
    for t in group["targets"]:
        value = "-" if t["measured"] is None else f"{t['measured']:.3f}"
        met = "-" if t["met"] is None else ("yes" if t["met"] else "NO")
        lines.append(f"| {t['target']} | {value} | {met} |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: machine, command, one table per configuration, ratios, targets, start-up."""
    lines = markdown_header(report, "")
    for group in report["groups"].values():
        lines += markdown_group(group)
    lines += startup_pieces(report["runs"])
    if report.get("startup"):
        lines += ["", "### Start-up (wall seconds, fresh process each)", "", "| command | seconds |", "| --- | --- |"]
        lines += [f"| `{k}` | {_fmt(v, 3)} |" for k, v in report["startup"].items()]
    return "\n".join(lines) + "\n"


def startup_pieces(rows: list[dict[str, Any]]) -> list[str]:
    """tfgpu's runs' ``startup_seconds`` (summary.json: the seconds to the first call's return, piece by piece),
    median per variant and configuration, as a Markdown table (nothing for runs from before it was recorded)."""
    pieces = ("checks", "tensorflow", "data", "model", "run_directory", "first_call")
    keys = sorted({(x["variant"], x["batch_size_per_replica"], x["replicas"]) for x in rows
                   if x.get("startup_seconds")}, key=lambda k: (k[0], -k[1], k[2]))
    if not keys:
        return []
    lines = ["", "### tfgpu's start-up, piece by piece (summary.json `startup_seconds`, medians, seconds)", "",
             "| variant | per replica x replicas | " + " | ".join(pieces) + " | sum |", "| --- " * (len(pieces) + 3) + "|"]
    for v, b, r in keys:
        got = [x["startup_seconds"] for x in rows if (x["variant"], x["batch_size_per_replica"], x["replicas"])
               == (v, b, r) and x.get("startup_seconds")]
        medians = [statistics.median(g[p] for g in got if g.get(p) is not None) for p in pieces]
        lines.append(f"| {v} | {b}x{r} | " + " | ".join(f"{m:.2f}" for m in medians) + f" | {sum(medians):.2f} |")
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each variant (at least 5 for the targets)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batches", default="4096,128", help="per-replica batch sizes, comma-separated")
    parser.add_argument("--replicas", default="1,2", help="replica counts (logical CPUs), comma-separated")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--startup-repeats", type=int, default=10, help="0 skips the start-up timings")
    parser.add_argument("--out", default=str(HERE / "results"), help="directory for results.json and results.md")
    parser.add_argument("--from-json", metavar="FILE", help="re-summarise the runs of an earlier results.json "
                        "(no training) and write its tables again")
    args = parser.parse_args(argv)
    if args.from_json:
        report = json.loads(Path(args.from_json).read_text())
        rows = report["runs"]
        report["groups"] = summarise(rows, sorted({r["batch_size_per_replica"] for r in rows}, reverse=True),
                                     sorted({r["replicas"] for r in rows}),
                                     [v for v in VARIANTS if any(r["variant"] == v for r in rows)])
        return write_report(report, Path(args.out))
    batches = [int(x) for x in args.batches.split(",")]
    replicas = [int(x) for x in args.replicas.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or args.repeats < 1 or args.epochs < 2:
        parser.error(f"variants must be among {', '.join(VARIANTS)} (received {', '.join(unknown) or 'ok'}); "
                     "--repeats >= 1 and --epochs >= 2 (steady state is the epochs after the first)")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    env.setdefault("TFGPU_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    # Absolute, because the variants run from benchmarks/: a relative path such as the
    # README's ../shared/data means the caller's directory.
    env["TFGPU_DATA_DIR"] = str(Path(env["TFGPU_DATA_DIR"]).expanduser().resolve())
    if not (Path(env["TFGPU_DATA_DIR"]) / "mnist" / "mnist.npz").is_file():
        print(f"benchmark: no mnist/mnist.npz under TFGPU_DATA_DIR={env['TFGPU_DATA_DIR']}; set TFGPU_DATA_DIR to "
              "the directory that holds mnist/mnist.npz.", file=sys.stderr)
        return 5
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.repeats < 5:
        print(f"benchmark: {args.repeats} repeats; the targets are stated for 5 or more.", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    total = args.repeats * len(batches) * len(replicas) * len(variants)
    with tempfile.TemporaryDirectory(prefix="tfgpu-bench-") as work:
        for rep in range(args.repeats):
            for b in batches:
                for r in replicas:
                    for v in variants:
                        row = run_once(v, b, r, args.epochs, args.seed, Path(work), env)
                        row["repeat"] = rep
                        rows.append(row)
                        status = "FAILED " + row["error"][:300] if "error" in row else (
                            f"wall {row['wall_seconds']:.1f}s, first step {row['first_step_seconds']:.2f}s, "
                            f"{row['samples_per_second']:.0f} samples/s, val acc {row['val_accuracy'] or 0:.4f}")
                        print(f"[{len(rows)}/{total}] {v} {b}x{r}: {status}", flush=True)
    report = {
        "command": "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(), "repeats": args.repeats, "epochs": args.epochs, "seed": args.seed,
        "runs": rows, "groups": summarise(rows, batches, replicas, variants),
        "startup": startup(args.startup_repeats, env) if args.startup_repeats else None,
    }
    return write_report(report, out)


def write_report(report: dict[str, Any], out: Path) -> int:
    """Write results.json and results.md to ``out``, print the Markdown; 1 if any run failed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    text = markdown(report)
    (out / "results.md").write_text(text)
    print()
    print(text)
    print(f"benchmark: wrote {out / 'results.json'} and {out / 'results.md'}")
    return 1 if any("error" in r for r in report["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
