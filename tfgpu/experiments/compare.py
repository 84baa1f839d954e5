"""``tfgpu runs`` and ``tfgpu compare``: the run directories under a folder, and two or more runs side by side.

Everything is read from the files a run directory holds (:mod:`tfgpu.training.layout`):
``summary.json`` (status, times, devices, the per-epoch rows, the final
metrics), ``metrics.csv`` (the per-epoch rows of a run killed before its
summary had them), and ``config.resolved.yaml`` (every setting; an older run's
``config.yaml``). Nothing here imports TensorFlow, and matplotlib is imported
only by :func:`plot_curves`.

A run directory holds ``summary.json`` and ``config.yaml``. :func:`find_run_dirs`
looks for them below a folder (``tfgpu sweep`` keeps its trials nested,
``SWEEP_DIR/trials/<run>``), without entering a run directory's own folders
(``checkpoint/``, ``tensorboard/``, ...) or hidden ones (a worker's scratch
directory). Any run directory can be read: a failed, interrupted or preempted
run with no finished epoch, a run still going, one whose process was killed (its
``"running"`` is shown as ``stale``: :func:`tfgpu.utils.processes.stale_status`), one
written by an earlier tfgpu (missing keys) or trained on JAX. What a run does
not record is ``None`` in the data and ``-`` in the text.

The main metric of a run is the first metric it logged besides the loss (the
first of ``model.metrics``, e.g. ``accuracy``), else the loss. Its validation
copy (``val_accuracy``) is what ``tfgpu runs`` ranks by, where the run has one.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import yaml

from ..errors import DataError, OutputError, UsageError
from ..training.layout import CONFIG_FILE, RESOLVED_CONFIG_FILE
from ..training.loops import NOT_METRICS
from ..utils.console import table_lines
from ..utils.files import replace_atomic
from ..utils.imports import importable
from ..utils.processes import stale_status

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.csv"
#: How deep below DIR ``tfgpu runs DIR`` looks for run directories (DIR/sweep/trials/run is depth 3).
MAX_DEPTH = 6
#: The formats ``tfgpu compare --plot FILE`` writes, by FILE's extension.
PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
#: The figure's size in inches and its resolution: 1100 x 450 pixels as PNG.
FIGURE_INCHES = (11.0, 4.5)
FIGURE_DPI = 100
#: The fix for a missing matplotlib.
PLOTS_EXTRA = "pip install 'tfgpu[plots]' (or pip install matplotlib)"

# Keys of an epoch row that are not the model's figures.
_NOT_METRICS = ("epoch", "learning_rate", "lr", *NOT_METRICS)
# A metric whose name holds one of these is better lower (losses and errors); any other is better higher.
_LOWER_IS_BETTER = ("loss", "error", "crossentropy", "hinge", "mae", "mse", "rmse", "msle", "mape", "poisson",
                    "kl_divergence", "kld", "logcosh", "log_cosh", "huber", "false_positives", "false_negatives",
                    "perplexity")
_SPLIT_PREFIXES = ("val_", "test_")


# ------------------------------------------------------------------------------------------------- reading


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a run directory: it holds ``summary.json`` and ``config.yaml``.

    Args:
        path: a folder (a missing one or a file is not a run directory).

    Returns:
        ``True`` for a run directory of any status and tfgpu version.
    """
    try:
        return (path / SUMMARY_FILE).is_file() and (path / CONFIG_FILE).is_file()
    except OSError:
        return False


def find_run_dirs(directory: Path, max_depth: int = MAX_DEPTH) -> list[Path]:
    """The run directories at or below ``directory``, in no particular order.

    ``directory`` itself, when it is one; else its sub-folders, recursively up
    to ``max_depth`` levels below it. A run directory's own sub-folders
    (``checkpoint/``, ``workers/``, ...) and hidden folders (a worker's scratch
    directory ``.NAME.worker-1-<pid>.tmp``) are not entered; folders that cannot
    be read are passed over.

    Args:
        directory: the folder to search.
        max_depth: how many levels below ``directory`` to look (0: ``directory`` only).

    Returns:
        The run directories' paths (under ``directory``, as it was given).
    """
    if is_run_dir(directory):
        return [directory]
    found: list[Path] = []
    if max_depth <= 0:
        return found
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return found
    for entry in entries:
        try:
            if entry.name.startswith(".") or not entry.is_dir():
                continue
        except OSError:
            continue
        found += find_run_dirs(Path(entry.path), max_depth - 1)
    return found


def read_json(path: Path) -> Optional[dict[str, Any]]:
    """A JSON object file's contents (``summary.json``), or ``None`` when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _number(value: Any) -> Optional[float]:
    """``value`` as a float when it is a number (a bool is not), else ``None``; NaN and infinities are kept."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _finite(value: Any) -> Optional[float]:
    number = _number(value)
    return number if number is not None and math.isfinite(number) else None


def _read_csv_rows(path: Path) -> list[dict[str, Any]]:
    """``metrics.csv``'s rows with their numbers as floats (``epoch`` as an int); ``[]`` when it cannot be read."""
    rows: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8", newline="") as f:
            for record in csv.DictReader(f):
                row: dict[str, Any] = {}
                for key, text in record.items():
                    if key is None or text in (None, ""):
                        continue
                    try:
                        row[key] = float(text)
                    except ValueError:
                        continue
                if "epoch" in row and math.isfinite(row["epoch"]):
                    row["epoch"] = int(row["epoch"])
                rows.append(row)
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    return rows


def _epoch_rows(path: Path, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The finished epochs' rows: ``summary.json``'s, or ``metrics.csv``'s where it has more (a run killed between
    checkpoints, or with checkpoints off, whose summary was last written before those epochs)."""
    epochs = summary.get("epochs")
    rows = [r for r in epochs if isinstance(r, dict)] if isinstance(epochs, list) else []
    if summary.get("status") in (None, "running") or not rows:
        from_csv = _read_csv_rows(path / METRICS_FILE)
        if len(from_csv) > len(rows):
            return from_csv
    return rows


def _read_settings(path: Path) -> dict[str, Any]:
    """Every setting the run used (``config.resolved.yaml``; an older run's ``config.yaml`` holds them all), as
    dotted keys; ``{}`` when neither can be read."""
    for name in (RESOLVED_CONFIG_FILE, CONFIG_FILE):
        try:
            data = yaml.safe_load((path / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            return flatten(data)
    return {}


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys: ``{"model": {"optimizer": {"learning_rate": 0.01}}}`` ->
    ``{"model.optimizer.learning_rate": 0.01}``.

    A list that holds mappings or lists is indexed (``model.layers[0].Dense.units``); a list of plain values
    (``model.metrics``) is one value.

    Args:
        data: a mapping (or any value, which becomes ``{prefix: data}``).
        prefix: the dotted key ``data`` lives under (``""``: the top).

    Returns:
        ``{dotted key: value}``, in the mapping's order; an empty mapping is one value (``{}``).
    """
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(data, list) and any(isinstance(v, (dict, list)) for v in data):
        out = {}
        for i, value in enumerate(data):
            out.update(flatten(value, f"{prefix}[{i}]"))
        return out
    return {prefix: data}


def metric_direction(name: str) -> str:
    """Whether a metric is better higher or lower, from its name.

    Args:
        name: a logged metric, e.g. ``val_accuracy``, ``loss``, ``test_mae`` (the ``val_``/``test_`` prefix is
            ignored).

    Returns:
        ``"min"`` for losses and errors (``loss``, ``mae``, ``mean_squared_error``, ``*crossentropy``, ...),
        ``"max"`` for any other (``accuracy``, ``auc``, ``precision``, ``recall``, ``r2_score``, ...).
    """
    base = _base(name).lower()
    return "min" if any(word in base for word in _LOWER_IS_BETTER) else "max"


def _base(name: str) -> str:
    for prefix in _SPLIT_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _metric_keys(rows: Sequence[dict[str, Any]], final: dict[str, Any]) -> list[str]:
    """The metrics a run logged, in the order it logged them (the epochs' rows, then the final ones: ``test_*``)."""
    keys: list[str] = []
    for source in (*rows, final):
        for key, value in source.items():
            if key not in _NOT_METRICS and key not in keys and _number(value) is not None:
                keys.append(key)
    return keys


def _configured_metrics(settings: dict[str, Any]) -> list[str]:
    """The names ``model.metrics`` gives its metrics, as Keras logs them: ``accuracy``, ``AUC`` -> ``auc``,
    ``{F1Score: {...}}`` -> ``f1_score``, ``{AUC: {name: pr_auc}}`` -> ``pr_auc`` (a list of mappings is flattened:
    ``model.metrics[0].AUC.name``)."""
    specs: dict[int, Any] = {}
    if isinstance(settings.get("model.metrics"), list):
        specs = dict(enumerate(settings["model.metrics"]))
    for key, value in settings.items():  # the flattened form of a list holding mappings
        match = re.fullmatch(r"model\.metrics\[(\d+)\](?:\.([^.]+))?(?:\.(.+))?", key)
        if match:
            index, name, arg = int(match.group(1)), match.group(2), match.group(3)
            entry = specs.setdefault(index, {"class": name})
            if arg == "name" and isinstance(entry, dict):
                entry["name"] = value
            elif name is None:
                specs[index] = value
    out = []
    for _, spec in sorted(specs.items()):
        if isinstance(spec, dict):
            name = spec.get("name") if isinstance(spec.get("name"), str) else spec.get("class")
            if name is None and len(spec) == 1:
                only, args = next(iter(spec.items()))
                name = args.get("name") if isinstance(args, dict) and isinstance(args.get("name"), str) else only
        else:
            name = spec
        if isinstance(name, str):
            out.append(re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower())
    return out


def main_metric(logged: Sequence[str], settings: dict[str, Any]) -> str:
    """A run's main metric: the first compiled metric it logged, else its first logged metric besides the loss,
    else ``"loss"``.

    Args:
        logged: the metric names the run logged (training, ``val_`` and ``test_`` copies).
        settings: the run's settings as dotted keys (``model.metrics`` is read), ``{}`` when unknown.

    Returns:
        A training metric's name, e.g. ``"accuracy"`` (its validation copy is ``"val_" + name``).
    """
    bases = [_base(k) for k in logged]
    for name in _configured_metrics(settings):
        if name in bases and name != "loss":
            return name
    train = [k for k in logged if not k.startswith(_SPLIT_PREFIXES) and k != "loss"]
    others = [b for b in bases if b != "loss"]
    return (train or others or ["loss"])[0]


def _devices_text(summary: dict[str, Any]) -> Optional[str]:
    """``"1 CPU"``, ``"4 GPU"``, ``"2 workers x 2 GPU"``: the devices the run trained on (``None``: not recorded)."""
    devices = summary.get("strategy_devices") or summary.get("logical_devices")
    if not isinstance(devices, list) or not devices:
        return None
    counts: dict[str, int] = {}
    for device in devices:
        match = re.search(r"(gpu|cpu|tpu)(?::|_)(\d+)\s*$", str(device), re.IGNORECASE) or \
            re.search(r"(gpu|cpu|tpu)", str(device), re.IGNORECASE)
        kind = match.group(1).upper() if match else str(device)
        counts[kind] = counts.get(kind, 0) + 1
    text = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    workers = summary.get("num_workers")
    if isinstance(workers, int) and workers > 1:
        text = f"{workers} workers x {text}"
    return text


def device_figures(rows: Sequence[dict[str, Any]]) -> dict[str, Optional[float]]:
    """A run's device figures over its epochs (``metrics.csv``'s telemetry columns, :mod:`tfgpu.training.telemetry`):
    ``mfu_percent`` and ``input_wait_percent`` (medians over the epochs after the first, which traces; the first
    when it is the only one), ``gpu_utilization_percent`` (the mean over those epochs) and ``gpu_memory_peak_mib``
    (the highest of any epoch); ``None`` where the run did not record it."""
    steady = list(rows[1:]) or list(rows)

    def values(key: str, among: Sequence[dict[str, Any]]) -> list[float]:
        return [v for v in (_finite(r.get(key)) for r in among) if v is not None]

    mfu, wait, util = values("mfu_percent", steady), values("input_wait_percent", steady), values(
        "gpu_utilization_percent", steady)
    memory = values("gpu_memory_peak_mib", rows)
    return {"mfu_percent": statistics.median(mfu) if mfu else None,
            "input_wait_percent": statistics.median(wait) if wait else None,
            "gpu_utilization_percent": statistics.fmean(util) if util else None,
            "gpu_memory_peak_mib": max(memory) if memory else None}


def read_run(path: Path, name: Optional[str] = None) -> dict[str, Any]:
    """One run directory as data: what ``tfgpu runs`` shows of it and what ``tfgpu compare`` compares.

    Args:
        path: a run directory (:func:`is_run_dir`); an unreadable ``summary.json`` gives status ``unreadable``.
        name: how to call the run (default: the directory's name).

    Returns:
        A dict: ``name``, ``path``, ``status`` (as shown: ``completed``, ``failed``, ``interrupted``,
        ``preempted``, ``running``, ``stale`` for a ``running`` whose process has ended, ``unreadable``),
        ``status_recorded`` (``summary.json``'s), ``stale`` (why, or ``None``), ``error`` (its first line),
        ``recipe``, ``started_at`` (Unix time, seconds), ``started`` (local time, ``YYYY-mm-dd HH:MM:SS``),
        ``epochs_completed``, ``epochs_planned``, ``main_metric``, ``metric`` (the main metric's validation copy
        where logged), ``best`` and ``best_epoch`` (1-based) of it, ``final`` (its value in ``final_metrics``: the kept
        model's epoch, the last unless early stopping restored the best),
        ``wall_seconds``, ``samples_per_second`` (steady-state training samples per second), the
        :func:`device_figures` (``mfu_percent``, ``input_wait_percent``, ``gpu_utilization_percent``,
        ``gpu_memory_peak_mib``), ``devices``, ``backend``, ``strategy``, ``num_replicas``,
        ``global_batch_size``, ``final_metrics``, ``metrics`` (the logged metric names), ``epochs`` (the per-epoch rows) and ``settings`` (dotted keys). What the run does
        not record is ``None``.
    """
    summary = read_json(path / SUMMARY_FILE)
    readable = summary is not None
    summary = summary or {}
    rows = _epoch_rows(path, summary)
    final_metrics = summary.get("final_metrics") if isinstance(summary.get("final_metrics"), dict) else {}
    if not final_metrics and rows:
        final_metrics = {k: v for k, v in rows[-1].items() if k not in _NOT_METRICS}
    settings = _read_settings(path)
    logged = _metric_keys(rows, final_metrics)
    main = main_metric(logged, settings)
    metric = f"val_{main}" if f"val_{main}" in logged else main
    best, best_epoch = best_value(rows, metric)
    recorded = summary.get("status") if isinstance(summary.get("status"), str) else None
    stale = stale_status(summary) if recorded == "running" else None
    status = ("stale" if stale else recorded) if readable else "unreadable"
    started_at = _number(summary.get("started_at"))
    planned = summary.get("epochs_planned")
    if not isinstance(planned, int):
        planned = settings.get("train.epochs") if isinstance(settings.get("train.epochs"), int) else None
    done = summary.get("epochs_completed")
    done = max(done, len(rows)) if isinstance(done, int) else len(rows)
    error = summary.get("error")
    return {
        "name": name or path.name,
        "path": str(path),
        "status": status or "-",
        "status_recorded": recorded,
        "stale": stale,
        "error": (str(error).strip().splitlines() or [None])[0] if error else None,
        "recipe": summary.get("recipe") if isinstance(summary.get("recipe"), str) else None,
        "started_at": started_at,
        "started": _local_time(started_at),
        "epochs_completed": done,
        "epochs_planned": planned,
        "main_metric": main,
        "metric": metric if logged else None,
        "best": best,
        "best_epoch": best_epoch,
        "final": _number(final_metrics.get(metric)) if metric in final_metrics
        else (_number(rows[-1].get(metric)) if rows else None),
        "wall_seconds": _number(summary.get("wall_seconds")),
        "samples_per_second": _number(summary.get("samples_per_second")),
        **device_figures(rows),
        "devices": _devices_text(summary),
        "backend": summary.get("backend") if isinstance(summary.get("backend"), str) else None,
        "strategy": summary.get("strategy") if isinstance(summary.get("strategy"), str) else None,
        "num_replicas": summary.get("num_replicas") if isinstance(summary.get("num_replicas"), int) else None,
        "global_batch_size": (summary.get("global_batch_size")
                              if isinstance(summary.get("global_batch_size"), int) else None),
        "final_metrics": {k: _number(v) for k, v in final_metrics.items() if _number(v) is not None},
        "metrics": logged,
        "epochs": rows,
        "settings": settings,
    }


def _local_time(seconds: Optional[float]) -> Optional[str]:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if seconds else None
    except (OverflowError, OSError, ValueError):
        return None


def best_value(rows: Sequence[dict[str, Any]], metric: str) -> tuple[Optional[float], Optional[int]]:
    """The best value of ``metric`` over the epochs (its :func:`metric_direction`), and its epoch.

    Args:
        rows: the per-epoch rows (``epoch`` counted from 0; a row without it counts by its place).
        metric: the key, e.g. ``val_accuracy``.

    Returns:
        ``(value, epoch counted from 1)``; the first epoch wins a tie; ``(None, None)`` when no epoch logged a
        finite value.
    """
    lower = metric_direction(metric) == "min"
    best: tuple[Optional[float], Optional[int]] = (None, None)
    for i, row in enumerate(rows):
        value = _finite(row.get(metric))
        if value is None:
            continue
        if best[0] is None or (value < best[0] if lower else value > best[0]):
            best = (value, _epoch_of(row, i))
    return best


def _epoch_of(row: dict[str, Any], index: int) -> int:
    epoch = row.get("epoch")
    return int(epoch) + 1 if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) and \
        math.isfinite(epoch) else index + 1


_ROW_KEYS = ("name", "path", "status", "status_recorded", "stale", "error", "recipe", "started_at", "started",
             "epochs_completed", "epochs_planned", "main_metric", "metric", "best", "best_epoch", "final",
             "wall_seconds", "samples_per_second", "mfu_percent", "input_wait_percent", "gpu_utilization_percent",
             "gpu_memory_peak_mib", "devices", "backend", "strategy", "num_replicas", "global_batch_size")


def list_runs(directory: str | Path, max_depth: int = MAX_DEPTH) -> list[dict[str, Any]]:
    """The run directories at or below ``directory``, oldest first: what ``tfgpu runs DIR`` shows.

    Args:
        directory: the folder to search (:func:`find_run_dirs`).
        max_depth: how many levels below it to look.

    Returns:
        One dict per run, by start time (a run without one: by its ``summary.json``'s modification time), with
        the keys of :func:`read_run` but ``epochs``, ``settings``, ``final_metrics`` and ``metrics``; ``name`` is
        the path below ``directory`` (``trials/breast_cancer-20261126-152757``; ``.`` for ``directory``
        itself). ``[]`` when it holds none.

    Raises:
        DataError: ``directory`` does not exist or is a file.
    """
    folder = Path(directory)
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise DataError(f"tfgpu runs: DIR '{directory}' {what}; DIR is a folder holding run directories (default "
                        "runs, where tfgpu run writes them).",
                        "name the folder tfgpu run wrote into (its output.dir or --output-dir, e.g. 'tfgpu runs "
                        "runs'), or train a run first (tfgpu run RECIPE).")
    found = []
    for path in find_run_dirs(folder, max_depth):
        run = read_run(path, path.relative_to(folder).as_posix() if path != folder else ".")
        found.append(({k: run[k] for k in _ROW_KEYS}, _start_key(run, path)))
    return [row for row, _ in sorted(found, key=lambda item: item[1])]


def _start_key(run: dict[str, Any], path: Path) -> tuple[float, str]:
    started = run["started_at"]
    if started is None:
        try:
            started = (path / SUMMARY_FILE).stat().st_mtime
        except OSError:
            started = 0.0
    return started, run["name"]


# ------------------------------------------------------------------------------------------------- comparing


def _check_run_arg(given: str) -> Path:
    path = Path(given)
    if not path.exists():
        raise DataError(f"tfgpu compare: RUN '{given}' does not exist; each RUN is a run directory (the folder "
                        "tfgpu run printed, runs/<recipe>-<time>).",
                        "list the run directories with 'tfgpu runs' and name two or more of them.")
    if not path.is_dir():
        raise DataError(f"tfgpu compare: RUN '{given}' is a file, not a run directory; each RUN is a folder "
                        "holding summary.json and config.yaml (runs/<recipe>-<time>).",
                        "name the run's folder, e.g. the one 'tfgpu runs' lists.")
    if not is_run_dir(path):
        inside = find_run_dirs(path)
        missing = " and no ".join(n for n in (SUMMARY_FILE, CONFIG_FILE) if not (path / n).is_file())
        where = (f"; it holds {len(inside)} run directories below it" if inside else "")
        raise DataError(f"tfgpu compare: RUN '{given}' is not a run directory: it has no {missing}{where}. Each "
                        "RUN is a folder tfgpu run wrote (runs/<recipe>-<time>).",
                        f"list them with 'tfgpu runs {given}' and name two or more." if inside else
                        "name run directories, e.g. those 'tfgpu runs' lists.")
    return path


def _names(paths: Sequence[Path]) -> list[str]:
    """Each run's name: its folder's, or, where two share one, as much of its path as tells them apart."""
    names = [p.name for p in paths]
    if len(set(names)) == len(names):
        return names
    resolved = [p.resolve() for p in paths]
    for depth in range(2, 64):
        names = ["/".join(r.parts[-depth:]) for r in resolved]
        if len(set(names)) == len(names):
            return names
    return [f"{n}#{i + 1}" for i, n in enumerate(names)]


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (_number(a) is not None and _number(b) is not None and a == b)


def compare_runs(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Two or more runs side by side: the settings that differ and their metrics, final and best.

    Args:
        paths: the run directories, in the order to show them.

    Returns:
        A dict:

        - ``runs``: :func:`read_run` of each (``name``: its folder's name, or more of its path where two share
          one), in the order given;
        - ``settings``: ``[{"key", "values"}]``, one per dotted key of the resolved configs whose value is not the
          same in every run (a run that lacks the key, written by an earlier tfgpu, has ``None`` and counts as
          ``null``), in the configs' order; ``settings_compared``:
          how many keys were compared;
        - ``metrics``: ``[{"metric", "direction", "values"}]``, one per metric any run logged (the main metric's
          training, ``val_`` and ``test_`` copies first, then the loss's, then the others), ``direction``
          ``"max"`` or ``"min"`` (:func:`metric_direction`), ``values`` one ``{"final", "best", "best_epoch"}``
          per run (``best_epoch`` counted from 1; ``None`` where the run did not log it: ``test_*`` metrics
          have a final value only);
        - ``main_metric``: the first run's main metric (:func:`main_metric`), which :func:`plot_curves` draws.

    Raises:
        UsageError: fewer than two runs are given.
        DataError: a path does not exist, or is not a run directory.
    """
    if len(paths) < 2:
        raise UsageError(f"tfgpu compare: needs two or more RUN directories, received {len(paths)} "
                         f"({', '.join(repr(str(p)) for p in paths) or 'none'}).",
                         "name two or more run directories, e.g. 'tfgpu compare runs/a runs/b' ('tfgpu runs' "
                         "lists them).")
    checked = [_check_run_arg(str(p)) for p in paths]
    runs = [read_run(path, name) for path, name in zip(checked, _names(checked))]
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run["settings"] if k not in set(keys)]
    settings = []
    for key in keys:
        values = [run["settings"].get(key) for run in runs]  # a key a run lacks (an older tfgpu) counts as null
        if any(not _same(values[0], v) for v in values[1:]):
            settings.append({"key": key, "values": values})
    main = next((run["main_metric"] for run in runs if run["metrics"]), "loss")
    metrics = []
    for name in _metric_order([k for run in runs for k in run["metrics"]], main):
        values = []
        for run in runs:
            if name not in run["metrics"]:
                values.append({"final": None, "best": None, "best_epoch": None})
                continue
            best, epoch = best_value(run["epochs"], name)
            final = run["final_metrics"].get(name)
            if final is None and run["epochs"]:
                final = _number(run["epochs"][-1].get(name))
            values.append({"final": final, "best": best, "best_epoch": epoch})
        metrics.append({"metric": name, "direction": metric_direction(name), "values": values})
    return {"runs": runs, "settings": settings, "settings_compared": len(keys), "metrics": metrics,
            "main_metric": main}


def _metric_order(names: Iterable[str], main: str) -> list[str]:
    unique = list(dict.fromkeys(names))
    bases = list(dict.fromkeys(_base(n) for n in unique))
    ordered_bases = [b for b in (main, "loss") if b in bases] + [b for b in bases if b not in (main, "loss")]
    return [f"{p}{b}" for b in ordered_bases for p in ("", *_SPLIT_PREFIXES) if f"{p}{b}" in unique]


# ------------------------------------------------------------------------------------------------- plotting


def check_plot_file(file: str | Path) -> Path:
    """Check, before anything is read or drawn, that ``tfgpu compare --plot FILE`` can write ``FILE``.

    Args:
        file: the picture's path: ``.png`` (or ``.svg``, ``.pdf``).

    Returns:
        ``file`` as a :class:`~pathlib.Path`.

    Raises:
        UsageError: its extension is not one of :data:`PLOT_FORMATS`, or matplotlib is not installed (the fix:
            ``pip install 'tfgpu[plots]'``).
        OutputError: its folder does not exist or cannot be written, or it is a folder.
    """
    path = Path(file)
    if path.suffix.lower() not in PLOT_FORMATS:
        raise UsageError(f"tfgpu compare: --plot '{file}' has the extension '{path.suffix}', but the picture is "
                         f"written as {', '.join(PLOT_FORMATS)} (chosen by the extension).",
                         f"name a PNG file, e.g. --plot {path.with_suffix('.png').name}.")
    parent = path.parent
    if not parent.is_dir():
        what = "is a file" if parent.exists() else "does not exist"
        raise OutputError(f"tfgpu compare: --plot '{file}': its folder '{parent}' {what}; the picture goes in an "
                          "existing folder this process can write.",
                          f"create it first (mkdir -p {parent}), or name a file in an existing folder.")
    if path.is_dir():
        raise OutputError(f"tfgpu compare: --plot '{file}' is a folder; --plot names the picture's file.",
                          f"name a file, e.g. --plot {path / 'curves.png'}.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"tfgpu compare: --plot '{file}': its folder '{parent}' is not writable.",
                          "name a file in a folder this process can write.")
    if not importable("matplotlib"):
        raise UsageError(f"tfgpu compare: --plot '{file}' draws the learning curves with matplotlib, which is not "
                         "installed (the plots extra).",
                         f"{PLOTS_EXTRA}, or leave --plot out to compare the runs as text.")
    return path


def plot_curves(runs: Sequence[dict[str, Any]], file: str | Path, metric: Optional[str] = None) -> dict[str, Any]:
    """Draw the runs' learning curves into one picture: the loss, and the main metric, per epoch.

    One figure with two panels (one when ``metric`` is the loss): per run a solid
    training curve and a dashed validation curve in the run's colour; the x axis
    is the epoch counted from 1; one legend below the panels names each line.
    A run with no finished epoch draws nothing and is named in ``skipped``; NaN
    and infinite values are left out. The file is written atomically (a
    temporary file, then a rename), with matplotlib's Agg canvas: no display is
    needed or used.

    Args:
        runs: :func:`read_run` dicts (``compare_runs(...)["runs"]``): ``name`` and ``epochs`` are read.
        file: where to write: ``.png`` (:data:`FIGURE_INCHES` at :data:`FIGURE_DPI`: 1100 x 450 pixels, 25
            pixels taller per run beyond four, for the legend), ``.svg`` or ``.pdf``.
        metric: the training metric of the second panel (default: the first run's ``main_metric``).

    Returns:
        What was drawn, read back from the figure's axes: ``file``, ``format``, ``size_px`` (``[width, height]``
        in pixels), ``title``, ``skipped`` (names of runs without epochs) and ``panels``: one per panel,
        ``{"metric", "title", "xlabel", "ylabel", "lines"}`` with ``lines`` ``[{"label", "run", "split"
        ("train"/"validation"), "x" (epochs from 1), "y", "linestyle", "color" (#rrggbb)}]``.

    Raises:
        UsageError: matplotlib is not installed, or the extension is not one of :data:`PLOT_FORMATS`.
        OutputError: the file cannot be written (:func:`check_plot_file`; a full disk:
            :class:`~tfgpu.errors.DiskFull`).
    """
    path = check_plot_file(file)
    from matplotlib import rc_context  # noqa: PLC0415 - the plots extra, only here

    # run names and metric names are drawn as written: a '$' in one is not the start of mathtext (which failed
    # to parse 'lr=$1e-3' and crashed the plot)
    with rc_context({"text.parse_math": False}):
        return _draw(runs, path, metric)


def _draw(runs: Sequence[dict[str, Any]], path: Path, metric: Optional[str]) -> dict[str, Any]:
    """:func:`plot_curves`'s figure, drawn and saved to ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 - the plots extra, only here
    from matplotlib.colors import to_hex  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    main = metric or next((r.get("main_metric") for r in runs if r.get("metrics")), None) or "loss"
    panels = ["loss"] + ([main] if main != "loss" else [])
    extra = 0.25 * max(0, len(runs) - 4)  # the legend's rows below the panels, one per run
    fig = Figure(figsize=(FIGURE_INCHES[0], FIGURE_INCHES[1] + extra), dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    skipped = [r["name"] for r in runs if not r.get("epochs")]
    for ax, name in zip(axes, panels):
        for i, run in enumerate(runs):
            rows = run.get("epochs") or []
            colour = f"C{i % 10}"
            for split, key, style in (("train", name, "-"), ("validation", f"val_{name}", "--")):
                points = [(_epoch_of(row, j), _finite(row.get(key))) for j, row in enumerate(rows)]
                points = [(x, y) for x, y in points if y is not None]
                if points:
                    ax.plot([x for x, _ in points], [y for _, y in points], linestyle=style, color=colour,
                            marker="o", markersize=3, label=f"{run['name']} {split}")
        ax.set_title(f"{name} per epoch (solid: train, dashed: validation)", fontsize="medium")
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if not ax.get_lines():
            ax.text(0.5, 0.5, "no finished epoch", ha="center", va="center", transform=ax.transAxes)
    handles: dict[str, Any] = {}
    for ax in axes:  # one legend for both panels, below them: a row per run, train left and validation right
        for line in ax.get_lines():
            handles.setdefault(line.get_label(), line)
    if handles:
        order = sorted(handles, key=lambda label: label.endswith(" validation"))
        fig.legend([handles[k] for k in order], order, loc="outside lower center", fontsize="small",
                   ncols=2 if len({k.endswith(" validation") for k in order}) == 2 else 1)
    title = "tfgpu compare: " + ", ".join(r["name"] for r in runs)
    fig.suptitle(title if len(title) <= 150 else f"tfgpu compare: {len(runs)} runs")
    fmt = PLOT_FORMATS[path.suffix.lower()]
    replace_atomic(path, lambda tmp: fig.savefig(tmp, format=fmt), path.with_name(f".{path.name}.tmp"),
                   "name a file in a folder this process can write, with free space.")
    drawn = []
    for ax, name in zip(axes, panels):
        lines = []
        for line in ax.get_lines():
            label = line.get_label()
            run_name, _, split = label.rpartition(" ")
            lines.append({"label": label, "run": run_name, "split": split,
                          "x": [int(x) for x in line.get_xdata()], "y": [float(y) for y in line.get_ydata()],
                          "linestyle": line.get_linestyle(), "color": to_hex(line.get_color())})
        drawn.append({"metric": name, "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                      "lines": lines})
    width, height = (round(float(v) * FIGURE_DPI) for v in fig.get_size_inches())
    return {"file": str(path), "format": fmt, "size_px": [width, height], "title": fig.get_suptitle(),
            "skipped": skipped, "panels": drawn}


# ------------------------------------------------------------------------------------------------- text


def metric_text(value: Any) -> str:
    """A metric or speed for a table: 4 decimals (large or tiny values in 4 significant digits), ``-`` for none."""
    number = _number(value)
    if number is None:
        return "-"
    if not math.isfinite(number):
        return str(number)
    return f"{number:.4f}" if 1e-3 <= abs(number) < 1e5 or number == 0 else f"{number:.4g}"


def _duration(seconds: Optional[float]) -> str:
    """``4.7s``, ``3m05s``, ``2h04m``; ``-`` for none."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _setting(value: Any, present: bool = True) -> str:
    if not present:
        return "-"
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


#: The columns of ``tfgpu runs``, in order.
RUNS_COLUMNS = ("RUN", "STATUS", "RECIPE", "STARTED", "EPOCHS", "METRIC", "BEST", "FINAL", "WALL", "SAMPLES/S",
                "MFU", "WAIT", "GPU", "DEVICES")


def _percent(value: Any) -> str:
    return f"{value:.3g}%" if _finite(value) is not None else "-"


def _gpu_text(run: dict[str, Any]) -> str:
    """``87% 11.8G``: mean GPU utilisation and peak GPU memory (GiB), ``-`` without GPUs."""
    util, memory = run.get("gpu_utilization_percent"), run.get("gpu_memory_peak_mib")
    if _finite(util) is None and _finite(memory) is None:
        return "-"
    return " ".join(filter(None, [f"{util:.0f}%" if _finite(util) is not None else None,
                                  f"{memory / 1024:.1f}G" if _finite(memory) is not None else None]))


def _epochs_text(run: dict[str, Any]) -> str:
    done, planned = run.get("epochs_completed"), run.get("epochs_planned")
    return f"{done if done is not None else '-'}/{planned if planned is not None else '-'}"


def _best_text(value: Optional[float], epoch: Optional[int]) -> str:
    return "-" if value is None else f"{metric_text(value)} @{epoch}"


def describe_runs(runs: Sequence[dict[str, Any]], directory: str | Path) -> str:
    """``tfgpu runs``'s table: one line per run (:func:`list_runs`), oldest first.

    Args:
        runs: :func:`list_runs`'s rows.
        directory: the folder they were found in (named in the line above the table).

    Returns:
        The text, without a trailing newline: a heading line, then the columns :data:`RUNS_COLUMNS` (``-`` where a
        run does not record the value), or one line saying there is no run directory.
    """
    if not runs:
        return f"No run directory under {directory} (a run directory holds summary.json and config.yaml)."
    rows = []
    for run in runs:
        sps = run.get("samples_per_second")
        rows.append([run["name"], run.get("status") or "-", Path(run["recipe"]).name if run.get("recipe") else "-",
                     (run.get("started") or "-")[:16], _epochs_text(run), run.get("metric") or "-",
                     _best_text(run.get("best"), run.get("best_epoch")), metric_text(run.get("final")),
                     _duration(run.get("wall_seconds")), f"{sps:.0f}" if _finite(sps) is not None else "-",
                     _percent(run.get("mfu_percent")), _percent(run.get("input_wait_percent")), _gpu_text(run),
                     run.get("devices") or "-"])
    right = [False, False, False, False, True, False, True, True, True, True, True, True, True, False]
    head = f"{len(runs)} run{'s' if len(runs) != 1 else ''} under {directory}, oldest first:"
    stale = [r["name"] for r in runs if r.get("stale")]
    notes = ["", f"stale: summary.json says running, but its process has ended (killed, crashed or out of disk): "
                 f"{', '.join(stale)}; continue it with 'tfgpu run --resume RUN_DIR'."] if stale else []
    return "\n".join([head, *table_lines(RUNS_COLUMNS, rows, right), *notes])


def describe_comparison(comparison: dict[str, Any], plot: Optional[dict[str, Any]] = None) -> str:
    """``tfgpu compare``'s text: the runs, the settings that differ, the metrics side by side.

    Args:
        comparison: :func:`compare_runs`'s result.
        plot: :func:`plot_curves`'s result, when a picture was written (its path ends the text).

    Returns:
        The text, without a trailing newline.
    """
    runs = comparison["runs"]
    names = [r["name"] for r in runs]
    lines = ["Runs:"]
    lines += ["  " + line for line in table_lines(
        ["RUN", "STATUS", "EPOCHS", "WALL", "SAMPLES/S", "MFU", "WAIT", "GPU", "DEVICES", "PATH"],
        [[r["name"], r["status"], _epochs_text(r), _duration(r["wall_seconds"]),
          f"{r['samples_per_second']:.0f}" if _finite(r["samples_per_second"]) is not None else "-",
          _percent(r["mfu_percent"]), _percent(r["input_wait_percent"]), _gpu_text(r),
          r["devices"] or "-", r["path"]] for r in runs], [False, False, True, True, True, True, True, True])]
    settings = comparison["settings"]
    lines.append("")
    if settings:
        lines.append(f"Settings that differ ({len(settings)} of {comparison['settings_compared']}):")
        lines += ["  " + line for line in table_lines(
            ["SETTING", *names],
            [[s["key"], *(_setting(v, s["key"] in r["settings"]) for v, r in zip(s["values"], runs))]
             for s in settings])]
    else:
        lines.append(f"Settings: all {comparison['settings_compared']} are the same.")
    lines.append("")
    if comparison["metrics"]:
        lines.append("Metrics (final: the kept model's, test_*: the test split's; best: over the epochs, @epoch):")
        rows = []
        for m in comparison["metrics"]:
            rows.append([m["metric"], "final", *(metric_text(v["final"]) for v in m["values"])])
            if any(v["best"] is not None for v in m["values"]):
                rows.append([m["metric"], f"best ({m['direction']})",
                             *(_best_text(v["best"], v["best_epoch"]) for v in m["values"])])
        lines += ["  " + line for line in table_lines(["METRIC", "", *names], rows, [False, False, *([True] * len(runs))])]
    else:
        lines.append("Metrics: none of these runs finished an epoch.")
    if plot is not None:
        lines.append("")
        drawn = ", ".join(p["metric"] for p in plot["panels"])
        skipped = f" ({', '.join(plot['skipped'])}: no finished epoch, not drawn)" if plot["skipped"] else ""
        lines.append(f"tfgpu: wrote {plot['file']}: learning curves of {drawn} per epoch{skipped}")
    return "\n".join(lines)


def as_json(data: Any) -> str:
    """``data`` as strict JSON (NaN and infinities as ``null``), indented: what ``--json`` prints.

    Args:
        data: :func:`list_runs`'s or :func:`compare_runs`'s result (with the plot's).

    Returns:
        The JSON text.
    """
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(data), indent=2, default=str)
