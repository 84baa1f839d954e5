"""``tfgpu run --resume RUN_DIR``: reopen a run directory, check it may continue, and record the restart.

None of this imports TensorFlow. The checkpoint itself is :mod:`tfgpu.training.checkpoint`'s.
"""

from __future__ import annotations

import csv
import io
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..config import Config, load_config
from ..errors import ConfigError, OutputError
from ..utils.files import write_atomic
from ..utils.processes import process_alive, stale_status
from .checkpoint import CHECKPOINT_DIR, PROGRESS_FILE, Position, read_json, read_state
from .layout import CONFIG_FILE, RESOLVED_CONFIG_FILE

#: Settings a resumed run may change: they do not change what is trained or on what.
MAY_CHANGE = ("train.progress", "train.checkpoint", "train.profile_steps", "train.terminate_on_nan", "train.max_time",
              "output",
              "tensorflow.log_level", "tensorflow.intra_op_threads", "tensorflow.inter_op_threads")
#: Set (to why) for the workers of a restarted ``tfgpu run --workers N`` group: resume ``TFGPU_RUN_DIR``.
RESUME_ENV = "TFGPU_RESUME"
#: Set by ``tfgpu run --workers N`` for its workers: the run directory the chief writes.
RUN_DIR_ENV = "TFGPU_RUN_DIR"


@dataclass(frozen=True)
class Resumed:
    """A run being continued (its directory is the one :func:`request` returns with it).

    Attributes:
        summary: its last ``summary.json``.
        why: what resumes it (``tfgpu run --resume``, or why a worker group restarted).
        state: the commit record of its last checkpoint (:func:`tfgpu.training.checkpoint.read_state`), or ``None``.
    """

    summary: dict[str, Any]
    why: str
    state: Optional[dict[str, Any]]

    @property
    def start(self) -> Position:
        """Where training continues: the checkpoint's position (the start when there is none)."""
        return Position(self.state["epoch"], self.state["step"]) if self.state else Position()


def resume_target(resume: Optional[str]) -> tuple[Optional[Path], str]:
    """The run directory to continue (``--resume``, or a restarted worker's ``TFGPU_RUN_DIR``) and why."""
    if resume:
        return Path(resume), "tfgpu run --resume"
    if os.environ.get(RESUME_ENV) and os.environ.get(RUN_DIR_ENV):
        return Path(os.environ[RUN_DIR_ENV]), os.environ[RESUME_ENV]
    return None, ""


def request(recipe: Optional[str], overrides: Sequence[str], resume: Optional[str]
            ) -> tuple[Config, Optional[Resumed], Optional[Path]]:
    """``tfgpu run``'s config, the run it continues, and the directory ``--resume`` named.

    A ``--resume`` directory that holds no run yet (it does not exist, or is
    empty) starts a new run there: the third value is that directory, the
    second ``None``.

    Raises:
        ConfigError: the config is invalid, or a setting that matters differs from the run's.
        OutputError: the run completed already, is still running, or its files cannot be read.
    """
    target, why = resume_target(resume)
    if target is None or not is_run_dir(target):
        return load_config(recipe, overrides=overrides), None, target
    cfg, previous = load_resumed(target, recipe, overrides)
    return cfg, Resumed(previous, why, read_state(target)), target


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def changed_settings(saved: Config, now: Config) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, new value)`` for each setting that differs and matters (not in :data:`MAY_CHANGE`)."""
    before, after = _flat(saved.to_dict()), _flat(now.to_dict())
    keys = sorted(set(before) | set(after))
    return [(k, before.get(k), after.get(k)) for k in keys
            if before.get(k) != after.get(k) and not any(k == m or k.startswith(m + ".") for m in MAY_CHANGE)]


def _as_given(saved: Config) -> dict[str, Any]:
    """An old run directory's ``config.yaml`` (every setting, written before ``config.resolved.yaml`` existed) as
    the first run's recipe most likely gave it: the settings that differ from the defaults. Loading them marks only
    those as set, so planning treats the rest as defaults again (e.g. an unset ``log_level``); a key the recipe set
    to its default value cannot be told apart and is read as unset."""
    defaults = Config().to_dict()

    def differ(value: Any, default: Any) -> Any:
        if isinstance(value, dict) and isinstance(default, dict):
            out = {k: differ(v, default.get(k, _MISSING)) for k, v in value.items()}
            return {k: v for k, v in out.items() if v is not _MISSING}
        return _MISSING if value == default else value

    data = saved.to_dict()
    given = differ(data, defaults)
    given["data"] = {**given.get("data", {}), "kind": data["data"]["kind"]}
    return given


_MISSING = object()


def is_run_dir(path: Path) -> bool:
    """``path`` holds a run (its ``config.yaml``)."""
    return (path / CONFIG_FILE).is_file()


def saved_config(run_dir: Path) -> tuple[Config, Config]:
    """A run directory's config as given (to run with) and as resolved (what the checkpoint was trained with).

    A directory written by this tfgpu has both files (:func:`tfgpu.training.layout.write_config`); an older one only a
    ``config.yaml`` with every setting, whose non-default settings stand for what was given (:func:`_as_given`).

    Raises:
        ConfigError: a file is missing or invalid.
    """
    given_file, resolved_file = run_dir / CONFIG_FILE, run_dir / RESOLVED_CONFIG_FILE
    if resolved_file.is_file():
        return load_config(str(given_file)), load_config(str(resolved_file))
    saved = load_config(str(given_file))
    return load_config(_as_given(saved)), saved


def load_resumed(run_dir: Path, recipe: Optional[str], overrides: Sequence[str]) -> tuple[Config, dict[str, Any]]:
    """The config to continue ``run_dir`` with, and its last ``summary.json``.

    The config is the run's ``config.yaml`` (or ``recipe``, when given) with
    ``overrides``; it must equal the saved one (``config.resolved.yaml``: the
    values the checkpoint was trained with) except for :data:`MAY_CHANGE`.

    Raises:
        ConfigError: a setting that matters differs (each is named, with both values).
        OutputError: the run already completed, or its files cannot be read.
    """
    given, saved = saved_config(run_dir)
    own = recipe is None or Path(recipe).resolve() == (run_dir / CONFIG_FILE).resolve()
    cfg = load_config(given if own else recipe, overrides=overrides)
    changed = changed_settings(saved, cfg)
    if changed:
        listed = "; ".join(f"{k}: {a!r} in the run, {b!r} now" for k, a, b in changed[:6])
        raise ConfigError(
            f"--resume {run_dir}: {len(changed)} setting(s) differ from the run's saved settings ({listed}): the "
            "checkpoint was trained with the saved values, and continuing with others would mix two runs.",
            "resume with the run's own settings (drop the recipe and --set), or start a new run. Only "
            + ", ".join(MAY_CHANGE) + " may change.")
    summary = read_json(run_dir / "summary.json") or {}
    if summary.get("status") == "completed":
        raise OutputError(f"--resume {run_dir}: the run already completed ({summary.get('epochs_completed')} epochs); "
                          "there is nothing to continue.", "start a new run: tfgpu run RECIPE.")
    process = summary.get("process") or {}
    if summary.get("status") == "running" and process.get("pid") != os.getpid() and process_alive(process):
        raise OutputError(f"--resume {run_dir}: the run is still running (pid {process.get('pid')} on this machine, "
                          "status \"running\"); two processes would write the same run directory.",
                          f"wait for it to end, or stop it (kill {process.get('pid')}; SIGTERM saves a checkpoint), "
                          "then resume.")
    return cfg, summary


def check_same_shape(summary: dict[str, Any], info: Any, steps_per_epoch: int) -> None:
    """The resumed process trains with the replicas, global batch and epoch length the run had.

    Raises:
        ConfigError: they differ (another number of GPUs or workers), naming both.
    """
    now = {"num_replicas": info.num_replicas, "global_batch_size": info.global_batch_size,
           "steps_per_epoch": steps_per_epoch}
    differ = [(k, summary[k], v) for k, v in now.items() if k in summary and summary[k] != v]
    if differ:
        listed = "; ".join(f"{k} {a} in the run, {b} now" for k, a, b in differ)
        workers = summary.get("num_workers") or 1
        raise ConfigError(
            f"--resume: this process would train differently from the run ({listed}): the devices or workers "
            "differ, so the steps in the checkpoint would not mean the same samples.",
            f"resume on the same devices: the run had {summary.get('num_replicas')} replica(s) on {workers} "
            f"worker(s){' (tfgpu run --resume RUN_DIR --workers %d)' % workers if workers > 1 else ''}.")


def keep_metrics(run_dir: Path, epochs: int) -> list[dict[str, float]]:
    """Cut ``metrics.csv`` to its first ``epochs`` epochs (a later row is redone); returns those rows.

    Rows of epochs the checkpoint does not hold would be written again, so
    they are dropped; the file keeps its header.
    """
    path = run_dir / "metrics.csv"
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
        fields = list(rows[0].keys()) if rows else None
    kept = [r for r in rows if int(float(r["epoch"])) < epochs]
    if fields is not None:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
        write_atomic(path, out.getvalue())
    return [{k: (int(float(v)) if k == "epoch" else float(v)) for k, v in r.items() if v not in ("", None)}
            for r in kept]


def restart_record(run_dir: Path, summary: dict[str, Any], why: str) -> dict[str, Any]:
    """What ``summary.json``'s ``restarts`` gets for this resume: from where, and what the stop cost.

    ``redo_steps``/``redo_seconds``: training since the last checkpoint that
    is done again (from the chief's ``progress.json``, written at most every
    0.2 s, so up to that much more); ``down_seconds``: from the last progress
    to this restart.
    """
    state = read_state(run_dir)
    progress = read_json(run_dir / CHECKPOINT_DIR / PROGRESS_FILE)
    now = time.time()
    stale = stale_status(summary)
    record: dict[str, Any] = {
        "number": len(summary.get("restarts", [])) + 1, "at": now, "why": why,
        "previous_status": summary.get("status"), "previous_error": summary.get("error"),
        **({"previous_status_stale": stale} if stale else {}),
        "from": ({k: state[k] for k in ("epoch", "step", "global_step", "saved_at", "reason")} if state
                 else {"epoch": 0, "step": 0, "global_step": 0, "saved_at": None, "reason": "no checkpoint yet"}),
    }
    if progress is not None:
        done = record["from"]["global_step"]
        record["last_progress"] = progress
        record["redo_steps"] = max(0, progress["global_step"] - done)
        record["redo_seconds"] = (max(0.0, progress["at"] - state["saved_at"]) if state
                                  else progress["at"] - summary.get("started_at", progress["at"]))
        record["down_seconds"] = now - progress["at"]
    return record
