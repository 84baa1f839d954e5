"""`tfgpu runs` and `tfgpu compare` as a user meets them: two real breast-cancer runs that differ only in their
learning rate and a real failed one, beside copies of the first made into a killed run, an older tfgpu's and a
JAX run's; the table, the JSON, the settings that differ, the metrics, the learning-curve picture, and each
error's exit code and message."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import one_paragraph, run_cli, run_python

RECIPE = "recipes/breast_cancer.yaml"
RATES = {"fast": "0.01", "slow": "0.001"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _train(parent: Path, rate: str, code: int = 0) -> Path:
    before = set(parent.iterdir()) if parent.exists() else set()
    result = run_cli("run", RECIPE, "--set", "train.epochs=3", "--set", f"model.optimizer.learning_rate={rate}",
                     "--output-dir", str(parent))
    assert result.returncode == code, result.stdout[-3000:] + result.stderr[-3000:]
    (new,) = set(parent.iterdir()) - before
    return new


def _edit_summary(run_dir: Path, **fields) -> dict:
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary.update(fields)
    for key in [k for k, v in fields.items() if v is ...]:
        del summary[key]
    path.write_text(json.dumps(summary, indent=2))
    return summary


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """``work/runs/``: the two real runs (learning rate 0.01 and 0.001, 3 epochs each); under
    ``runs/sweep/trials/`` a real failed run (learning rate 1e30: the loss is NaN in epoch 1, exit 7) and
    copies of the first made into what else a user's folder holds: ``killed`` (its process was killed:
    summary.json still says running), ``old`` (an older tfgpu: no config.resolved.yaml, fewer summary keys)
    and ``jax`` (trained on JAX). Trains its own runs: the comparison needs runs that differ only in their learning
    rate, and a failed one, which the shared runs are not."""
    work = tmp_path_factory.mktemp("work")
    parent = work / "runs"
    out = {"work": work, "parent": parent}
    for name, rate in RATES.items():
        out[name] = _train(parent, rate)
    trials = parent / "sweep" / "trials"
    trials.mkdir(parents=True)
    out["failed"] = _train(trials, "1.0e+30", code=7)
    for name in ("killed", "old", "jax"):
        out[name] = trials / name
        shutil.copytree(out["fast"], out[name])
    started = json.loads((out["failed"] / "summary.json").read_text())["started_at"]
    _edit_summary(out["killed"], status="running", started_at=started + 2, epochs_completed=..., wall_seconds=...,
                  samples_per_second=..., final_metrics=...,
                  process={"pid": _dead_pid(), "host": socket.gethostname(), "start": None})
    summary = json.loads((out["old"] / "summary.json").read_text())
    keep = ("status", "recipe", "epochs", "final_metrics", "wall_seconds")
    (out["old"] / "summary.json").write_text(json.dumps({k: summary[k] for k in keep}))
    (out["old"] / "config.resolved.yaml").rename(out["old"] / "config.yaml")
    # ... with GPU figures per epoch, as a run on GPUs records them (this machine has none)
    gpu_rows = [{**row, "gpu_utilization_percent": util, "gpu_memory_peak_mib": memory}
                for row, util, memory in zip(_summary(out["jax"])["epochs"], (10.0, 80.0, 90.0),
                                             (2048.0, 12083.0, 11000.0))]
    _edit_summary(out["jax"], backend="jax", strategy=None, strategy_devices=["cpu:0", "cpu:1"], num_replicas=2,
                  logical_devices=["cpu:0", "cpu:1"], started_at=started + 3, epochs=gpu_rows)
    (out["fast"] / "checkpoint" / "summary.json").parent.mkdir(exist_ok=True)  # a run's own folder: not entered
    (out["fast"] / "checkpoint" / "summary.json").write_text("{}")
    (out["fast"] / "checkpoint" / "config.yaml").write_text("{}")
    return out


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _ok(*args: str, cwd: Path | None = None, needs: tuple[str, ...] = ()):
    result = run_cli(*args, needs=needs, **({"cwd": cwd} if cwd else {}))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stderr == "", result.stderr
    return result


def _error(code: int, *args: str, cwd: Path | None = None) -> str:
    result = run_cli(*args, **({"cwd": cwd} if cwd else {}))
    assert result.returncode == code, result.stdout[-3000:] + result.stderr[-3000:]
    one_paragraph(result.stderr)
    assert result.stdout == ""
    return " ".join(result.stderr.split())


def _table(text: str) -> dict[str, list[str]]:
    """The rows of a table printed by tfgpu runs, by their first cell (cells are separated by 2+ spaces)."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("RUN "))
    end = lines.index("", header) if "" in lines[header:] else len(lines)
    return {cells[0]: cells for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[header:end])}


# ------------------------------------------------------------------------------------------------- tfgpu runs


@pytest.mark.slow
def test_runs_lists_every_run_directory_with_its_figures(runs):
    result = _ok("runs", cwd=runs["work"])  # DIR defaults to runs/
    rows = _table(result.stdout)
    assert result.stdout.startswith("6 runs under runs, oldest first:")
    assert rows["RUN"] == ["RUN", "STATUS", "RECIPE", "STARTED", "EPOCHS", "METRIC", "BEST", "FINAL", "WALL",
                           "SAMPLES/S", "MFU", "WAIT", "GPU", "DEVICES"]
    fast, slow = runs["fast"].name, runs["slow"].name
    failed = f"sweep/trials/{runs['failed'].name}"
    # By start time (the copies were given later ones; "old" has none: its summary.json's time, the latest);
    # nested ones found, and the run's own checkpoint/ not entered.
    assert [name for name in rows if name != "RUN"] == [fast, slow, failed, "sweep/trials/killed",
                                                         "sweep/trials/jax", "sweep/trials/old"]
    for name in (fast, slow):
        summary = _summary(runs["parent"] / name)
        final = summary["final_metrics"]["val_accuracy"]
        values = [row["val_accuracy"] for row in summary["epochs"]]
        best = max(values)
        cells = rows[name]
        assert cells[1:3] == ["completed", "breast_cancer.yaml"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", cells[3])
        assert cells[4:6] == ["3/3", "val_accuracy"]
        assert cells[6] == f"{best:.4f} @{values.index(best) + 1}"
        assert cells[7] == f"{final:.4f}"
        assert cells[8] == f"{summary['wall_seconds']:.1f}s"
        assert cells[9] == f"{summary['samples_per_second']:.0f}"
        # the device figures: the median MFU and input wait of the epochs after the first; no GPU here
        steady = summary["epochs"][1:]
        assert cells[10] == f"{statistics.median(r['mfu_percent'] for r in steady):.3g}%"
        assert cells[11] == f"{statistics.median(r['input_wait_percent'] for r in steady):.3g}%"
        assert cells[12:] == ["-", "1 CPU"]
    wall = _summary(runs["failed"])["wall_seconds"]
    assert rows[failed][1:3] + rows[failed][4:] == ["failed", "breast_cancer.yaml", "0/3", "-", "-", "-",
                                                    f"{wall:.1f}s", "-", "-", "-", "-", "1 CPU"]
    assert rows["sweep/trials/killed"][1] == "stale" and rows["sweep/trials/killed"][4] == "3/3"
    assert "stale: summary.json says running, but its process has ended" in result.stdout
    assert rows["sweep/trials/old"][1:4] == ["completed", "breast_cancer.yaml", "-"]  # no started_at
    assert rows["sweep/trials/old"][4:8] == ["3/3", "val_accuracy", rows[fast][6], rows[fast][7]]  # train.epochs
    assert rows["sweep/trials/old"][9:] == ["-", rows[fast][10], rows[fast][11], "-", "-"]  # from its epochs
    assert rows["sweep/trials/jax"][12:] == ["85% 11.8G", "2 CPU"]  # mean of epochs 2-3, the highest memory


@pytest.mark.slow
def test_runs_json(runs):
    data = json.loads(_ok("runs", str(runs["parent"]), "--json").stdout)
    by_name = {row["name"]: row for row in data}
    summary = _summary(runs["slow"])
    row = by_name[runs["slow"].name]
    assert row["path"] == str(runs["slow"])
    assert row["status"] == row["status_recorded"] == "completed" and row["stale"] is None
    assert row["recipe"] == RECIPE and row["started_at"] == summary["started_at"]
    assert (row["epochs_completed"], row["epochs_planned"]) == (3, 3)
    assert (row["main_metric"], row["metric"]) == ("accuracy", "val_accuracy")
    assert row["final"] == summary["final_metrics"]["val_accuracy"]
    values = [r["val_accuracy"] for r in summary["epochs"]]
    assert row["best"] == max(values) and row["best_epoch"] == values.index(max(values)) + 1
    assert row["wall_seconds"] == summary["wall_seconds"]
    assert row["samples_per_second"] == summary["samples_per_second"]
    assert row["mfu_percent"] == statistics.median(r["mfu_percent"] for r in summary["epochs"][1:])
    assert row["mfu_percent"] > 0 and row["gpu_utilization_percent"] is None and row["gpu_memory_peak_mib"] is None
    assert (row["devices"], row["backend"], row["num_replicas"], row["global_batch_size"]) == \
        ("1 CPU", "tensorflow", 1, 32)
    failed = by_name[f"sweep/trials/{runs['failed'].name}"]
    assert (failed["status"], failed["epochs_completed"], failed["best"], failed["final"], failed["metric"]) == \
        ("failed", 0, None, None, None)
    assert failed["error"].startswith("the training loss became nan in epoch 1")
    killed = by_name["sweep/trials/killed"]
    assert (killed["status"], killed["status_recorded"]) == ("stale", "running")
    assert "has ended without recording how the run ended" in killed["stale"]
    assert by_name["sweep/trials/old"]["started_at"] is None and data[-1]["name"] == "sweep/trials/old"


@pytest.mark.slow
def test_runs_of_one_run_directory_and_of_a_folder_without_runs(runs, tmp_path):
    rows = _table(_ok("runs", str(runs["fast"])).stdout)
    assert list(rows) == ["RUN", "."]
    result = _ok("runs", str(tmp_path))
    assert result.stdout.strip() == f"No run directory under {tmp_path} (a run directory holds summary.json and " \
                                    "config.yaml)."
    assert json.loads(_ok("runs", str(tmp_path), "--json").stdout) == []


def test_runs_of_a_missing_folder_is_a_data_error(tmp_path):
    message = _error(5, "runs", cwd=tmp_path)
    assert message.startswith("tfgpu: data error: tfgpu runs: DIR 'runs' does not exist; DIR is a folder")
    assert "Fix: name the folder tfgpu run wrote into" in message
    (tmp_path / "file").write_text("x")
    assert "DIR 'file' is a file" in _error(5, "runs", "file", cwd=tmp_path)


# ------------------------------------------------------------------------------------------------- tfgpu compare


@pytest.mark.slow
def test_compare_shows_the_settings_that_differ_and_the_metrics(runs):
    fast, slow, failed = runs["fast"], runs["slow"], runs["failed"]
    text = _ok("compare", str(fast), str(slow), str(failed)).stdout
    lines = text.splitlines()
    at = lines.index("Settings that differ (2 of %d):" % int(re.search(r"of (\d+)\)", text).group(1)))
    assert re.split(r"\s{2,}", lines[at + 1].strip()) == ["SETTING", fast.name, slow.name, failed.name]
    assert re.split(r"\s{2,}", lines[at + 2].strip()) == ["model.optimizer.learning_rate", "0.01", "0.001", "1e+30"]
    assert re.split(r"\s{2,}", lines[at + 3].strip()) == ["output.dir", *map(str, (fast.parent, slow.parent,
                                                                                 failed.parent))]
    assert lines[at + 4] == ""  # only those two: the failed run was written to another folder
    metrics = {tuple(re.split(r"\s{2,}", line.strip())[:2]): re.split(r"\s{2,}", line.strip())[2:]
               for line in lines[lines.index(next(x for x in lines if x.startswith("Metrics"))) + 2:] if line}
    s_fast, s_slow = _summary(fast), _summary(slow)
    assert metrics[("val_accuracy", "final")] == [f"{s_fast['final_metrics']['val_accuracy']:.4f}",
                                                  f"{s_slow['final_metrics']['val_accuracy']:.4f}", "-"]
    losses = [r["val_loss"] for r in s_slow["epochs"]]
    assert metrics[("val_loss", "best (min)")][1] == f"{min(losses):.4f} @{losses.index(min(losses)) + 1}"
    assert list(metrics)[:2] == [("accuracy", "final"), ("accuracy", "best (max)")]  # the main metric first


@pytest.mark.slow
def test_compare_json(runs):
    fast, slow = runs["fast"], runs["slow"]
    data = json.loads(_ok("compare", str(fast), str(slow), "--json").stdout)
    assert [r["name"] for r in data["runs"]] == [fast.name, slow.name]
    assert data["settings"] == [{"key": "model.optimizer.learning_rate", "values": [0.01, 0.001]}]
    assert data["settings_compared"] > 50 and data["main_metric"] == "accuracy" and data["plot"] is None
    keys = [m["key"] for m in data["settings"]]
    assert "train.epochs" not in keys and "model.loss" not in keys and "output.dir" not in keys
    metrics = {m["metric"]: m for m in data["metrics"]}
    assert list(metrics) == ["accuracy", "val_accuracy", "loss", "val_loss"]
    assert (metrics["loss"]["direction"], metrics["val_accuracy"]["direction"]) == ("min", "max")
    for run, value in zip((fast, slow), metrics["val_accuracy"]["values"]):
        summary = _summary(run)
        per_epoch = [r["val_accuracy"] for r in summary["epochs"]]
        assert value == {"final": summary["final_metrics"]["val_accuracy"], "best": max(per_epoch),
                         "best_epoch": per_epoch.index(max(per_epoch)) + 1}
    assert data["runs"][0]["epochs"] == _summary(fast)["epochs"]


@pytest.mark.slow
def test_compare_plot_draws_the_learning_curves(runs, tmp_path):
    from matplotlib.image import imread  # noqa: PLC0415

    fast, slow, failed = runs["fast"], runs["slow"], runs["failed"]
    png = tmp_path / "curves.png"
    result = _ok("compare", str(fast), str(slow), str(failed), "--plot", str(png), "--json", needs=("plots",))
    plot = json.loads(result.stdout)["plot"]
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary file left
    image = imread(png)
    assert image.shape[:2] == (450, 1100) and plot["size_px"] == [1100, 450]
    assert image[..., :3].std() > 0.05  # something is drawn
    assert plot["skipped"] == [failed.name] and plot["format"] == "png"
    assert [p["metric"] for p in plot["panels"]] == ["loss", "accuracy"]
    for panel in plot["panels"]:
        assert panel["xlabel"] == "epoch" and panel["ylabel"] == panel["metric"]
        lines = {line["label"]: line for line in panel["lines"]}
        assert list(lines) == [f"{fast.name} train", f"{fast.name} validation", f"{slow.name} train",
                               f"{slow.name} validation"]
        for run in (fast, slow):
            epochs = _summary(run)["epochs"]
            train, validation = lines[f"{run.name} train"], lines[f"{run.name} validation"]
            assert train["x"] == validation["x"] == [1, 2, 3]
            assert train["y"] == pytest.approx([e[panel["metric"]] for e in epochs], rel=1e-12)
            assert validation["y"] == pytest.approx([e[f"val_{panel['metric']}"] for e in epochs], rel=1e-12)
            assert (train["linestyle"], validation["linestyle"]) == ("-", "--")
            assert train["color"] == validation["color"]
        assert lines[f"{fast.name} train"]["color"] != lines[f"{slow.name} train"]["color"]
    text = _ok("compare", str(fast), str(slow), "--plot", str(png), needs=("plots",)).stdout
    assert text.splitlines()[-1] == f"tfgpu: wrote {png}: learning curves of loss, accuracy per epoch"


@pytest.mark.slow
def test_plot_curves_in_process_reads_its_lines_back_from_the_figure(runs, tmp_path):
    from tfgpu.experiments.compare import compare_runs, plot_curves  # noqa: PLC0415

    comparison = compare_runs([runs["slow"], runs["old"], runs["jax"]])
    assert [r["name"] for r in comparison["runs"]] == [runs["slow"].name, "old", "jax"]
    assert comparison["runs"][1]["settings"]["model.optimizer.learning_rate"] == 0.01  # from its config.yaml
    svg = tmp_path / "curves.svg"
    plot = plot_curves(comparison["runs"], svg)
    assert svg.read_text().lstrip().startswith("<?xml") and plot["format"] == "svg"
    assert [len(p["lines"]) for p in plot["panels"]] == [6, 6]


@pytest.mark.slow
def test_a_dollar_sign_in_a_run_name_is_drawn_as_written(runs, tmp_path):
    """Run names are text, not mathtext: ``lr-$\\frac$`` (a TeX command without its arguments) crashed the plot in
    matplotlib's mathtext parser; it is drawn as written, in the title and the legend."""
    from tfgpu.experiments.compare import compare_runs, plot_curves  # noqa: PLC0415

    names = ["lr-$\\frac$", "cost $5 $x"]
    for name in names:
        shutil.copytree(runs["slow"], tmp_path / name)
    png = tmp_path / "curves.png"
    plot = plot_curves(compare_runs([tmp_path / n for n in names])["runs"], png)
    assert png.stat().st_size > 0 and all(n in plot["title"] for n in names)
    assert {line["run"] for line in plot["panels"][0]["lines"]} == set(names)


@pytest.mark.slow
def test_compare_of_runs_that_share_a_folder_name(runs, tmp_path):
    copy = tmp_path / "elsewhere" / runs["fast"].name
    shutil.copytree(runs["fast"], copy)
    data = json.loads(_ok("compare", str(runs["fast"]), str(copy), "--json").stdout)
    assert [r["name"] for r in data["runs"]] == [f"runs/{copy.name}", f"elsewhere/{copy.name}"]
    assert data["settings"] == []
    assert "Settings: all" in _ok("compare", str(runs["fast"]), str(copy)).stdout


@pytest.mark.slow
def test_compare_errors(runs, tmp_path):
    fast, slow = str(runs["fast"]), str(runs["slow"])
    message = _error(2, "compare", fast)
    assert message == (f"tfgpu: usage error: tfgpu compare: needs two or more RUN directories, received 1 ('{fast}'). "
                       "Fix: name two or more run directories, e.g. 'tfgpu compare runs/a runs/b' ('tfgpu runs' "
                       "lists them).")
    missing = str(tmp_path / "nope")
    assert f"tfgpu: data error: tfgpu compare: RUN '{missing}' does not exist" in _error(5, "compare", fast, missing)
    parent = str(runs["parent"])
    message = _error(5, "compare", fast, parent)
    assert f"RUN '{parent}' is not a run directory: it has no summary.json and no config.yaml; it holds 6 run " \
           f"directories below it" in message and f"Fix: list them with 'tfgpu runs {parent}'" in message
    assert "is a file, not a run directory" in _error(5, "compare", fast, f"{fast}/summary.json")
    message = _error(8, "compare", fast, slow, "--plot", str(tmp_path / "no" / "curves.png"))
    assert f"--plot '{tmp_path / 'no' / 'curves.png'}': its folder '{tmp_path / 'no'}' does not exist" in message
    assert "Fix: create it first" in message
    message = _error(2, "compare", fast, slow, "--plot", str(tmp_path / "curves.jpg"))
    assert "has the extension '.jpg', but the picture is written as .png, .svg, .pdf" in message
    (tmp_path / "dir.png").mkdir()
    assert "is a folder; --plot names the picture's file" in _error(8, "compare", fast, slow, "--plot",
                                                                    str(tmp_path / "dir.png"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.png"]  # nothing was written


@pytest.mark.slow
def test_compare_plot_without_matplotlib_names_the_extra(runs, tmp_path):
    result = run_python(f"""
        import sys
        sys.modules["matplotlib"] = None  # as if the plots extra were not installed
        sys.argv = ["tfgpu", "compare", {str(runs['fast'])!r}, {str(runs['slow'])!r}, "--plot",
                    {str(tmp_path / 'curves.png')!r}]
        from tfgpu.cli import main
        main()
    """)
    assert result.returncode == 2, result.stderr
    one_paragraph(result.stderr)
    assert "matplotlib, which is not installed (the plots extra)" in result.stderr
    assert "Fix: pip install 'tfgpu[plots]' (or pip install matplotlib), or leave --plot out" in result.stderr
    assert not (tmp_path / "curves.png").exists()


def test_importing_the_module_starts_neither_tensorflow_nor_matplotlib():
    result = run_python("""
        import sys
        import tfgpu.experiments.compare, tfgpu.cli
        print(sorted(m for m in ("tensorflow", "keras", "matplotlib", "jax") if m in sys.modules))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_metric_direction_and_main_metric():
    from tfgpu.experiments.compare import flatten, main_metric, metric_direction  # noqa: PLC0415

    assert [metric_direction(m) for m in ("val_accuracy", "auc", "test_precision", "loss", "val_mae",
                                          "mean_squared_error", "sparse_categorical_crossentropy")] == \
        ["max", "max", "max", "min", "min", "min", "min"]
    assert main_metric(["loss", "auc", "accuracy", "val_loss"], {"model.metrics": ["accuracy", "AUC"]}) == "accuracy"
    assert main_metric(["loss", "val_loss", "mae", "val_mae"], {}) == "mae"
    metrics = flatten({"model": {"metrics": [{"AUC": {"name": "pr_auc"}}, "accuracy"]}})
    assert main_metric(["accuracy", "loss", "pr_auc", "val_pr_auc"], metrics) == "pr_auc"
    assert main_metric(["accuracy", "f1_score", "loss"], {"model.metrics": ["F1Score", "accuracy"]}) == "f1_score"
    assert main_metric(["loss", "val_loss"], {"model.metrics": []}) == "loss"
    assert flatten({"model": {"layers": [{"Dense": {"units": 16}}], "metrics": ["accuracy"]}, "a": {}}) == \
        {"model.layers[0].Dense.units": 16, "model.metrics": ["accuracy"], "a": {}}


def test_the_readers_never_crash_on_odd_run_directories(tmp_path):
    from tfgpu.experiments.compare import describe_runs, list_runs  # noqa: PLC0415

    for name, summary in {"broken": "{not json", "list": "[1, 2]", "empty": "{}",
                          "nan": json.dumps({"status": "failed", "epochs": [{"epoch": 0, "loss": float("nan")}],
                                             "started_at": "yesterday", "epochs_planned": "x", "error": " "}),
                          "far": json.dumps({"status": "completed", "started_at": 1e300, "epochs": "none"}),
                          "running": json.dumps({"status": "running", "process": {"pid": os.getpid(),
                                                                                  "host": socket.gethostname()}})
                          }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(summary)
        (tmp_path / name / "config.yaml").write_text(": not yaml [" if name == "broken" else "train: {epochs: 2}\n")
    (tmp_path / "nan" / "metrics.csv").write_text("epoch,loss\n0,nan\n1,oops\n")
    (tmp_path / ".hidden").mkdir()
    shutil.copytree(tmp_path / "empty", tmp_path / ".hidden" / "run")
    rows = {r["name"]: r for r in list_runs(tmp_path)}
    assert sorted(rows) == ["broken", "empty", "far", "list", "nan", "running"]
    assert (rows["far"]["started"], rows["far"]["epochs_completed"], rows["nan"]["error"]) == (None, 0, None)
    assert (rows["broken"]["status"], rows["list"]["status"], rows["empty"]["status"]) == \
        ("unreadable", "unreadable", "-")
    assert rows["running"]["status"] == "running" and rows["running"]["stale"] is None  # this process is alive
    assert (rows["nan"]["epochs_completed"], rows["nan"]["epochs_planned"], rows["nan"]["best"]) == (1, 2, None)
    assert rows["empty"]["epochs_planned"] == 2  # from config.yaml
    text = describe_runs(list(rows.values()), tmp_path)
    assert "unreadable" in text and "Traceback" not in text
