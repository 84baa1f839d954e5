"""``tfgpu sweep``: an Optuna study whose trials are ordinary ``tfgpu run`` processes, packed onto the devices.

The sweep process never imports TensorFlow. It asks the study for a trial, starts ``tfgpu run RECIPE --set
KEY=VALUE ... --resume SWEEP_DIR/trials/trial-NNNN`` in a free slot (:mod:`tfgpu.experiments.placement`: a GPU or a share
of one, a MIG instance, or CPU cores), and tells the study the trial's result when the process ends. Each trial
is a whole tfgpu run, with its run directory, checks and checkpoints; inside it, :func:`trial_callbacks` reports
the metric to the study after every epoch and stops the trial when the pruner says so.

The sweep directory (``output.dir/NAME-sweep-YYYYmmdd-HHMMSS``):

- ``sweep.json``: the recipe, ``--set`` items, storage, study name, slots, this session's sampler seed and status
  (a database URL's userinfo masked, ``postgresql://***@host/db``: ``--resume`` takes the whole URL from
  ``TFGPU_SWEEP_STORAGE`` or ``--storage``; an MLflow URI without userinfo, :mod:`tfgpu.tracking.mlflow`);
- ``study.journal``: the study (Optuna's ``JournalFileBackend``; ``--storage URL`` uses a database instead);
- ``trials/trial-NNNN/``: each trial's run directory, ``trials/trial-NNNN.log`` its output;
- ``results.csv``: trial, parameters, metric, status, epochs, seconds, run directory (also printed);
- ``best.yaml``: the recipe with the best trial's parameters filled in (``tfgpu run best.yaml`` reproduces it).

A sweep that is stopped (Ctrl-C, SIGTERM) stops its trials with SIGTERM, so each saves a checkpoint; one that
is killed (SIGKILL) takes its trials with it (``PR_SET_PDEATHSIG``: they get SIGTERM). ``tfgpu sweep --resume
SWEEP_DIR`` keeps the finished trials and continues each interrupted one from its checkpoint in the same run
directory. A file lock per trial (``trials/.trial-NNNN.lock``, held while its process runs) means no two
processes ever run one trial, and new trials come from the study (Optuna numbers them), so several sweep
processes on one storage share the trials without duplicates.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from ..config import Config, load_config
from ..errors import ConfigError, Interrupted, Preempted, SweepError, TfgpuError
from ..tracking.study import (STORAGE_ENV, TRIAL_ENV, distributions, grid_size, import_optuna, open_storage, pruner,
                              sampler, session_seed)
from ..utils.console import say, table_lines, warn
from ..utils.urls import credentials, masked, redact

SWEEP_FILE = "sweep.json"
JOURNAL_FILE = "study.journal"
TRIALS_DIR = "trials"
RESULTS_FILE = "results.csv"
BEST_FILE = "best.yaml"
#: How often the sweep looks at its trial processes (seconds).
POLL_SECONDS = 0.2
#: A trial stopped from outside (exit 75, not by the sweep) is continued from its checkpoint at most this often.
MAX_ATTEMPTS = 3
#: Exit codes a trial ends with that say the recipe itself is wrong (config, devices, data, already initialised).
_RECIPE_CODES = (2, 3, 4, 5, 6)
#: The sweep's own user attributes on each trial.
_ATTRS = ("sweep_dir", "host", "run_dir", "slot", "attempts", "exit_code", "error", "pruned_at_epoch", "seconds",
          "epochs")

# The child's start: die with the sweep (SIGTERM: the run saves a checkpoint), pin to the slot's cores, exec tfgpu.
_EXEC = ("import ctypes, json, os, signal, sys\n"
         "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
         "if os.getppid() != int(sys.argv[1]): sys.exit(75)  # the sweep died before prctl\n"
         "cpus = json.loads(sys.argv[2])\n"
         "if cpus: os.sched_setaffinity(0, cpus)\n"
         "os.execv(sys.executable, [sys.executable, '-m', 'tfgpu.cli', *sys.argv[3:]])\n")


def direction_of(cfg: Config) -> str:
    """``sweep.direction``, or from the metric's name (:func:`tfgpu.experiments.compare.metric_direction`: losses and errors
    ``minimize``, the rest ``maximize``)."""
    from .compare import metric_direction  # noqa: PLC0415

    if cfg.sweep.direction:
        return cfg.sweep.direction
    return "minimize" if metric_direction(cfg.sweep.metric) == "min" else "maximize"


def _fmt(value: Any) -> str:
    """A parameter or metric value as the table shows it: a float as ``tfgpu runs`` shows metrics
    (:func:`tfgpu.experiments.compare.metric_text`), anything else as it is."""
    from .compare import metric_text  # noqa: PLC0415

    return metric_text(value) if isinstance(value, float) else str(value)


def set_item(key: str, value: Any) -> str:
    """A ``--set`` item for one parameter value, written as YAML reads it back (``1.0e-06``: PyYAML reads
    ``1e-06`` as text)."""
    import yaml  # noqa: PLC0415

    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30).strip()
    return f"{key}={text[:-3].strip() if text.endswith('...') else text}"


# The study ---------------------------------------------------------------------------------------------------------


def lock_path(spec: str, directory: Path) -> Path:
    """The file whose lock serialises counting and asking trials: beside a journal file or SQLite database
    (every sweep process on this machine that shares the storage uses it), else in ``directory`` (a database
    server: processes on several machines can each ask one trial beyond ``trials``, docs/sweep.md)."""
    if "://" not in spec:  # (not FILE.lock: Optuna's JournalFileBackend locks with that name itself)
        return Path(spec + ".tfgpu-ask.lock")
    if spec.startswith("sqlite:///"):
        return Path(spec[len("sqlite:///"):] + ".tfgpu-ask.lock")
    return directory / TRIALS_DIR / ".ask.lock"


# The sweep directory ------------------------------------------------------------------------------------------------

@dataclass
class Trial:
    """A trial process the sweep started."""

    number: int
    trial_id: int
    slot: Any
    run_dir: Path
    process: subprocess.Popen
    lock: Any
    log: Any
    started: float = field(default_factory=time.perf_counter)


@contextmanager
def _held(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for a moment (counting and asking trials)."""
    import fcntl  # noqa: PLC0415

    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _claim(path: Path) -> Any:
    """Hold ``path``'s lock for as long as a trial runs (``None``: another process holds it)."""
    import fcntl  # noqa: PLC0415

    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    return f


def _read_summary(run_dir: Path) -> dict[str, Any]:
    from .compare import read_json  # noqa: PLC0415

    return read_json(run_dir / "summary.json") or {}


def metric_value(summary: dict[str, Any], metric: str) -> Optional[float]:
    """The trial's value: ``metric`` of the model it kept, ``None`` when it was not logged.

    ``summary.json``'s ``final_metrics``: the last epoch's figures, or the best epoch's when
    ``train.early_stopping.restore_best_weights`` restored its weights (``final_metrics_epoch``), or its
    ``test_*`` figure; else the last row of ``epochs`` (a run that ended before its summary was finished).
    """
    rows = summary.get("epochs") or []
    value = (summary.get("final_metrics") or {}).get(metric)
    if value is None and rows:
        value = rows[-1].get(metric)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _error_of(log: Path) -> str:
    """The last error a trial's log reports (``tfgpu: <kind>: ...`` through its ``Fix:`` line, as one line, without
    the ``tfgpu: `` prefix), else its last line."""
    from .. import errors  # noqa: PLC0415

    kinds = {cls.kind for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.TfgpuError)}
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    starts = [i for i, line in enumerate(lines) if line.startswith("tfgpu: ")
              and line[len("tfgpu: "):].split(":", 1)[0] in kinds]
    if not starts:
        return lines[-1] if lines else ""
    paragraph = []
    for line in lines[starts[-1]:]:
        paragraph.append(line)
        if line.startswith("Fix:"):
            break
    return " ".join(paragraph)[len("tfgpu: "):]


class Sweep:
    """One ``tfgpu sweep`` process: its study, its slots and its trial processes.

    Args:
        cfg: the recipe's configuration (with ``sweep``).
        recipe: the recipe's path.
        overrides: the ``--set`` items every trial gets.
        directory: the sweep directory.
        storage: the study's storage (:func:`open_storage`'s spec).
        study_name: the study's name in the storage.
        slots: :func:`tfgpu.experiments.placement.plan_slots`.
        trials: the study's number of trials in all.
        shared: the storage was given (``--storage``): other sweep processes may share the study, so the
            sampler's seed is mixed with this sweep directory's path.

    Attributes:
        seed: the seed this process gave its sampler (:func:`tfgpu.tracking.study.session_seed`: ``sweep.seed``,
            moved on by the trials the study already held, so a resumed sweep draws new points).

    Raises:
        SweepError: the study cannot be created or opened, or it exists with the other direction.
    """

    def __init__(self, cfg: Config, recipe: str, overrides: Sequence[str], directory: Path, storage: str,
                 study_name: str, slots: list, trials: int, shared: bool = False) -> None:
        self.cfg, self.recipe, self.overrides = cfg, recipe, list(overrides)
        self.directory, self.storage_spec, self.study_name = directory, storage, study_name
        self.slots, self.trials = slots, trials
        self.cwd = os.getcwd()  # the trials' (the recipe's relative paths are read from it)
        self.running: dict[int, Trial] = {}
        self.stopping: Optional[str] = None
        self.finished = 0
        self.recipe_error: Optional[tuple[int, str, int]] = None
        self.signalled: Optional[str] = None  # set by the signal handler; the loop stops the trials
        self.alive_orphans = False  # a killed sweep's trial whose process still runs (it is stopping)
        self.parent_env: dict[str, str] = {}
        self.tracking: Optional[dict[str, Any]] = None  # the sweep's MLflow run (output.mlflow)
        optuna = import_optuna()
        self.storage = open_storage(storage)
        self.direction = direction_of(cfg)
        try:
            try:  # (a resumed study: its sampler continues the sequence, session_seed)
                before = len(self.storage.get_all_trials(self.storage.get_study_id_from_name(study_name),
                                                         deepcopy=False))
            except KeyError:  # a new study
                before = 0
            self.seed = session_seed(cfg, before, str(directory.resolve()) if shared else "")
            self.study = optuna.create_study(study_name=study_name, storage=self.storage,
                                             sampler=sampler(cfg, self.seed), pruner=pruner(cfg.sweep.pruner),
                                             direction=self.direction, load_if_exists=True)
        except TfgpuError:
            raise
        except Exception as exc:
            raise SweepError(f"--storage: the study {study_name!r} cannot be created or opened in "
                             f"{masked(storage)!r}: "
                             f"{redact(str(exc).splitlines()[0] if str(exc) else repr(exc), storage)}.",
                             "check the storage, or name another study with --study.") from None
        if self.study.direction.name.lower() != self.direction:
            raise SweepError(
                f"sweep.direction: the study {study_name!r} in {masked(storage)!r} already exists and is to "
                f"{self.study.direction.name.lower()} (received {self.direction} for {cfg.sweep.metric}).",
                "use the study's direction, or another study name (--study).")
        self.distributions = distributions(cfg)
        (directory / TRIALS_DIR).mkdir(parents=True, exist_ok=True)
        self.count_lock = lock_path(storage, directory)
        self._enqueue()

    # Which trial next ---------------------------------------------------------------------------------------------

    def _enqueue(self) -> None:
        """``sweep.enqueue`` once per study (the first sweep process on a storage enqueues them)."""
        if not self.cfg.sweep.enqueue:
            return
        with _held(self.count_lock):
            if self.study.user_attrs.get("tfgpu_enqueued"):
                return
            for params in self.cfg.sweep.enqueue:
                self.study.enqueue_trial(params)
            self.study.set_user_attr("tfgpu_enqueued", True)

    def _counted(self) -> int:
        """The study's trials that are running or done (enqueued, waiting ones are not yet trials)."""
        waiting = self._optuna_state("WAITING")
        return sum(1 for t in self.study.get_trials(deepcopy=False) if t.state != waiting)

    def _optuna_state(self, name: str) -> Any:
        return getattr(import_optuna().trial.TrialState, name)

    def _orphans(self) -> list[Any]:
        """This sweep directory's trials left running by a process that ended (to continue from their checkpoints)."""
        running = self._optuna_state("RUNNING")
        mine = str(self.directory.resolve())
        busy = {t.number for t in self.running.values()}
        return [t for t in self.study.get_trials(deepcopy=False, states=(running,))
                if t.user_attrs.get("sweep_dir") == mine and t.number not in busy]

    def next_trial(self) -> Optional[tuple[Any, bool, Any]]:
        """``(frozen trial, resumed, lock)`` for a free slot, or ``None`` when nothing is left to start."""
        self.alive_orphans = False
        for orphan in self._orphans():
            run_dir = self.run_dir(orphan.number)
            lock = _claim(self._lock_path(orphan.number))
            if lock is None:  # its process holds the lock (a trial outlives a killed sweep until it stops)
                self.alive_orphans = True
                continue
            summary = _read_summary(run_dir)
            from ..utils.processes import process_alive  # noqa: PLC0415

            if summary.get("status") == "running" and process_alive(summary.get("process")):
                lock.close()  # its process outlived a killed sweep and is stopping (SIGTERM); take it over later
                self.alive_orphans = True
                continue
            if summary.get("status") == "completed":
                self._finish(orphan.number, orphan._trial_id, run_dir, 0)
                lock.close()
                continue
            return orphan, True, lock
        if self.stopping or self.recipe_error:
            return None
        grid = grid_size(self.cfg)
        with _held(self.count_lock):
            limit = min(self.trials, grid) if grid is not None else self.trials
            if self._counted() >= limit:
                return None
            trial = self.study.ask(self.distributions)
            run_dir = self.run_dir(trial.number)
            for key, value in {"sweep_dir": str(self.directory.resolve()), "host": socket.gethostname(),
                               "run_dir": str(run_dir)}.items():  # (before the lock is released: never unowned)
                trial.set_user_attr(key, value)
        lock = _claim(self._lock_path(trial.number))
        frozen = self.storage.get_trial(trial._trial_id)
        return frozen, False, lock

    def run_dir(self, number: int) -> Path:
        return self.directory / TRIALS_DIR / f"trial-{number:04d}"

    def _lock_path(self, number: int) -> Path:
        return self.directory / TRIALS_DIR / f".trial-{number:04d}.lock"

    # Starting and reaping ------------------------------------------------------------------------------------------

    def command(self, frozen: Any, slot: Any) -> tuple[list[str], dict[str, str]]:
        """The trial process's command and environment (data: tested without starting anything)."""
        params = [set_item(k, v) for k, v in frozen.params.items()]
        sets = [*self.overrides, *params, "sweep=null", *slot.overrides]
        args = ["run", self.recipe, *[a for s in sets for a in ("--set", s)],
                "--resume", str(self.run_dir(frozen.number).resolve())]
        cmd = [sys.executable, "-c", _EXEC, str(os.getpid()), json.dumps(list(slot.cpus) if slot.cpus else []), *args]
        env = {k: v for k, v in os.environ.items() if k != TRIAL_ENV}
        env.update(slot.env)
        env.update(self.parent_env)
        env["PYTHONUNBUFFERED"] = "1"
        env[TRIAL_ENV] = json.dumps({"storage": self.storage_spec, "study": self.study_name,
                                     "trial_id": frozen._trial_id, "number": frozen.number,
                                     "metric": self.cfg.sweep.metric, "pruner": self.cfg.sweep.pruner})
        return cmd, env

    def start(self, frozen: Any, resumed: bool, lock: Any, slot: Any) -> None:
        cmd, env = self.command(frozen, slot)
        attempts = int(frozen.user_attrs.get("attempts", 0)) + 1
        self.storage.set_trial_user_attr(frozen._trial_id, "attempts", attempts)
        self.storage.set_trial_user_attr(frozen._trial_id, "slot", slot.label)
        log_path = self.directory / TRIALS_DIR / f"trial-{frozen.number:04d}.log"
        log = open(log_path, "a", encoding="utf-8")
        log.write(f"# attempt {attempts}: {shlex.join(['tfgpu', *cmd[5:]])}\n")
        log.flush()
        # start_new_session: Ctrl-C reaches the sweep, which stops the trials in order; pass_fds: the trial's
        # process holds its lock too, so a trial that outlives a killed sweep is never run twice
        process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=self.cwd, start_new_session=True, pass_fds=(lock.fileno(),))
        self.running[slot.index] = Trial(frozen.number, frozen._trial_id, slot, self.run_dir(frozen.number),
                                         process, lock, log)
        if self.stopping:  # a stop arrived while it was being started
            process.send_signal(signal.SIGTERM)
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in frozen.params.items())
        say(f"trial {frozen.number} {'continues' if resumed else 'starts'} on slot {slot.index} ({slot.label}): "
            f"{params}")

    def reap(self) -> None:
        """Tell the study about each trial process that ended."""
        for index, trial in list(self.running.items()):
            code = trial.process.poll()
            if code is None:
                continue
            del self.running[index]
            trial.log.close()
            try:
                self._finish(trial.number, trial.trial_id, trial.run_dir, code,
                             self.directory / TRIALS_DIR / f"trial-{trial.number:04d}.log")
            finally:
                trial.lock.close()

    def _finish(self, number: int, trial_id: int, run_dir: Path, code: int, log: Optional[Path] = None) -> None:
        summary = _read_summary(run_dir)
        frozen = self.storage.get_trial(trial_id)
        state = self._optuna_state
        if frozen.state != state("RUNNING"):
            return
        set_attr = self.storage.set_trial_user_attr
        set_attr(trial_id, "exit_code", code)
        if summary:
            set_attr(trial_id, "seconds", summary.get("wall_seconds"))
            set_attr(trial_id, "epochs", summary.get("epochs_completed"))
        metric = self.cfg.sweep.metric
        if code == 0 and summary.get("status") == "completed":
            pruned = frozen.user_attrs.get("pruned_at_epoch")
            if pruned is not None:
                self.study.tell(number, state=state("PRUNED"))
                say(f"trial {number} pruned after epoch {pruned + 1}")
                self.finished += 1
                return
            value = metric_value(summary, metric)
            if value is None:
                set_attr(trial_id, "error", f"the run logged no finite {metric}")
                self.study.tell(number, state=state("FAIL"))
                warn(f"trial {number} logged no finite {metric} (its metrics: "
                     f"{', '.join(sorted((summary.get('final_metrics') or {}).keys())) or 'none'}); marked failed")
                self.finished += 1
                return
            self.study.tell(number, value)
            self.finished += 1
            say(f"trial {number} finished: {metric} {value:.4f} in {summary.get('wall_seconds', 0):.1f}s")
            if self.tracking:
                from ..tracking import mlflow as tracking  # noqa: PLC0415

                tracking.log_parent_metrics(self.tracking, {f"best_{metric}": self.study.best_value,
                                                            "trials_finished": self.finished}, self.finished)
            return
        if self.stopping and code < 0:  # killed by the sweep's second stop: continued by --resume
            return
        if code == Preempted.exit_code and (self.stopping or frozen.user_attrs.get("attempts", 1) < MAX_ATTEMPTS):
            say(f"trial {number} stopped with a checkpoint (exit 75); "
                + ("'tfgpu sweep --resume' continues it" if self.stopping else "it continues"))
            return  # still RUNNING in the study: continued from its checkpoint (now, or by --resume)
        error = _error_of(log) if log else ""
        set_attr(trial_id, "error", error[:500])
        self.study.tell(number, state=state("FAIL"))
        self.finished += 1
        warn(f"trial {number} failed (exit {code}): {error or 'see ' + str(log)}")
        if code in _RECIPE_CODES and not any(t.state == state("COMPLETE") for t in self.study.get_trials(deepcopy=False)):
            self.recipe_error = (number, error, code)

    # The loop ------------------------------------------------------------------------------------------------------

    def stop(self, why: str) -> None:
        """Stop starting trials; SIGTERM the running ones (each saves a checkpoint and exits 75). A second
        stop kills them (SIGKILL): their last checkpoints are kept."""
        if self.stopping:
            say(f"{why} again: killing {len(self.running)} trial(s) (SIGKILL; their last checkpoints are kept)")
            for trial in self.running.values():
                try:
                    trial.process.kill()
                except ProcessLookupError:
                    pass
            return
        self.stopping = why
        say(f"{why}: stopping {len(self.running)} trial(s) with SIGTERM (each saves a checkpoint)")
        for trial in self.running.values():
            try:
                trial.process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def loop(self) -> None:
        """Run trials in the free slots until the study has its trials (or the sweep is stopped)."""
        while True:
            if self.signalled:
                why, self.signalled = self.signalled, None
                self.stop(why)
            self.reap()
            if self.recipe_error and not self.stopping:
                self.stop(f"trial {self.recipe_error[0]} found an error in the recipe")
            free = [s for s in self.slots if s.index not in self.running]
            started = False
            for slot in free:
                found = self.next_trial() if not self.stopping else None
                if found is None:
                    break
                self.start(*found, slot)
                started = True
            if not self.running and not started and not (self.alive_orphans and not self.stopping):
                return
            time.sleep(POLL_SECONDS)


# Results ------------------------------------------------------------------------------------------------------------

def result_rows(study: Any, metric: str) -> list[dict[str, Any]]:
    """One row per trial of the study: trial, each parameter, the metric, status, epochs, seconds, run directory."""
    rows = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        row: dict[str, Any] = {"trial": t.number}
        row.update(t.params)
        row[metric] = t.value if t.state.name == "COMPLETE" else (
            t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None)
        row["status"] = {"COMPLETE": "completed", "FAIL": "failed"}.get(t.state.name, t.state.name.lower())
        row["epochs"] = t.user_attrs.get("epochs")
        row["seconds"] = t.user_attrs.get("seconds")
        row["run_dir"] = t.user_attrs.get("run_dir", "")
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], best: Optional[int]) -> str:
    """The results as aligned text; the best trial marked with ``*``."""
    if not rows:
        return "(no trials)"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[("*" if row.get("trial") == best and c == "trial" else "") + (
        "-" if row.get(c) is None else f"{row[c]:.1f}" if c == "seconds" and isinstance(row.get(c), float)
        else _fmt(row[c])) for c in columns] for row in rows]
    return "\n".join(table_lines(columns, cells))


def write_results(directory: Path, rows: list[dict[str, Any]]) -> Path:
    """``results.csv`` (atomically)."""
    from ..utils.files import write_atomic  # noqa: PLC0415

    columns = list(dict.fromkeys(k for row in rows for k in row)) or ["trial"]
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    path = directory / RESULTS_FILE
    write_atomic(path, out.getvalue())
    return path


def best_recipe(recipe: str, overrides: Sequence[str], params: dict[str, Any], devices: Sequence[str] = ()
                ) -> dict[str, Any]:
    """The recipe as written, with the sweep's ``--set`` items, ``params`` and ``devices`` (what the trial's slot
    gave it: :func:`trial_devices`) set, and no ``sweep`` section."""
    import yaml  # noqa: PLC0415

    from ..config.source import _set_path, parse_override  # noqa: PLC0415

    data = yaml.safe_load(Path(recipe).read_text(encoding="utf-8")) or {}
    for item in [*overrides, *(set_item(k, v) for k, v in params.items()), *devices]:
        path, value = parse_override(item)
        _set_path(data, path, value, f"--set {item}")
    data.pop("sweep", None)
    output = data.setdefault("output", {}) if isinstance(data.get("output", {}), dict) else {}
    if isinstance(output.get("mlflow"), dict) and isinstance(output["mlflow"].get("tracking_uri"), str):
        output["mlflow"]["tracking_uri"] = credentials(output["mlflow"]["tracking_uri"])[0]  # (in the environment)
    output.setdefault("name", f"{Path(recipe).stem}-best")
    return data


def without_credentials(item: str) -> str:
    """A ``--set`` item with the userinfo taken out of an ``output.mlflow.tracking_uri`` it sets (also inside
    ``output.mlflow={...}`` or ``output={...}``): what ``sweep.json`` and the trials' command lines hold. The
    credentials reach the trials in their environment (:func:`tfgpu.tracking.mlflow.export_credentials`)."""
    from ..config.source import parse_override  # noqa: PLC0415

    try:
        path, value = parse_override(item)
    except Exception:  # noqa: BLE001  (not this function's to refuse: load_config already read it)
        return item
    dotted = ".".join(str(p) for p in path)
    if dotted == "output.mlflow.tracking_uri" and isinstance(value, str) and credentials(value)[0] != value:
        return set_item(dotted, credentials(value)[0])
    if dotted in ("output", "output.mlflow") and isinstance(value, dict):
        inner = value.get("mlflow") if dotted == "output" else value
        if isinstance(inner, dict) and isinstance(inner.get("tracking_uri"), str):
            clean = credentials(inner["tracking_uri"])[0]
            if clean != inner["tracking_uri"]:
                inner["tracking_uri"] = clean
                return set_item(dotted, value)
    return item


def _resumed_storage(saved: Optional[str], directory: Path) -> Optional[str]:
    """The storage a resumed sweep reopens: ``sweep.json``'s, or, when its credentials were masked there,
    the whole URL from :data:`~tfgpu.tracking.study.STORAGE_ENV` (the same database as the masked one).

    Raises:
        SweepError: ``sweep.json``'s storage is masked and the environment lacks it, or names another database.
    """
    if not saved or "://" not in saved or credentials(saved)[1:] == (None, None) or masked(saved) != saved:
        return saved  # (no userinfo, or one written in full by an earlier tfgpu)
    given = os.environ.get(STORAGE_ENV)
    if given and masked(given) == saved:
        return given
    received = f"{STORAGE_ENV}={masked(given)!r}" if given else f"neither --storage nor {STORAGE_ENV}"
    raise SweepError(
        f"--resume: the study's storage {saved!r} ({directory / SWEEP_FILE} storage) holds credentials, which "
        f"tfgpu never writes to a file, so the sweep cannot reopen it from there (received {received}); the "
        "storage must be the same database URL, with its user and password.",
        f"export {STORAGE_ENV}='{saved.replace('***', 'USER:PASSWORD', 1)}' (the whole URL; or give it with "
        f"--storage), then run tfgpu sweep --resume {directory} again.")


def trial_devices(cfg: Config, slots: Sequence[Any]) -> list[str]:
    """The ``--set`` items that give a run the devices a trial had on a GPU slot: ``per_trial.gpus`` GPUs
    (``devices.visible_gpus: [0, ...]``) and, for a share, ``devices.memory_fraction``; none on CPU slots (a
    trial's thread limits only divide the cores, and do not change what is trained)."""
    if not any("CUDA_VISIBLE_DEVICES" in slot.env for slot in slots):
        return []
    want = cfg.sweep.per_trial.gpus
    items = [set_item("devices.visible_gpus", list(range(max(1, int(want)))))]
    return items + [set_item("devices.memory_fraction", want)] if want < 1 else items


def write_best(sweep: Sweep) -> Optional[Path]:
    """``best.yaml``: the recipe with the best trial's parameters (``None`` when no trial completed)."""
    import yaml  # noqa: PLC0415

    from ..utils.files import write_atomic  # noqa: PLC0415

    try:
        best = sweep.study.best_trial
    except ValueError:
        return None
    data = best_recipe(sweep.recipe, sweep.overrides, best.params, trial_devices(sweep.cfg, sweep.slots))
    head = (f"# tfgpu sweep {sweep.directory}: trial {best.number} of {sweep.trials}, {sweep.cfg.sweep.metric} "
            f"{best.value:.6g} ({sweep.direction})\n# from {sweep.recipe}; run it with: tfgpu run "
            f"{sweep.directory / BEST_FILE}\n")
    path = sweep.directory / BEST_FILE
    write_atomic(path, head + yaml.safe_dump(data, sort_keys=False))
    return path


# The command --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SweepResult:
    """What ``tfgpu sweep`` produced.

    Attributes:
        directory: the sweep directory.
        rows: :func:`result_rows`.
        best: the best trial's number, or ``None``.
        best_value: its metric value, or ``None``.
    """

    directory: Path
    rows: list[dict[str, Any]]
    best: Optional[int]
    best_value: Optional[float]


def _check_parameters(cfg: Config, recipe: str, overrides: Sequence[str]) -> None:
    """Each parameter's key and values validated as the trials will set them: every choice, a range's ends and a
    value inside it (a float range gives floats: ``train.epochs: {uniform: ...}`` is refused here, not by each
    trial), and each enqueued set."""
    sweep = cfg.sweep
    sets: list[list[str]] = []
    for key, spec in sweep.parameters.items():  # one key at a time: every choice, a range's ends and inside
        kind, args = next(iter(spec.items()))
        if kind == "choice":
            values = list(args)
        elif kind in ("int", "log_int"):
            values = [args[0], (args[0] + args[1]) // 2, args[1]]
        else:
            values = [float(args[0]), args[0] + 0.37 * (args[1] - args[0]), float(args[1])]  # floats, as sampled
        sets += [[set_item(key, value)] for value in values]
    sets += [[set_item(k, v) for k, v in params.items()] for params in sweep.enqueue]
    for items in sets:
        try:
            load_config(recipe, [*overrides, *items, "sweep=null"])
        except ConfigError as exc:
            raise ConfigError(f"sweep.parameters: a trial's settings ({', '.join(items)}) are refused: {exc.message}",
                              exc.hint) from None


def prepare(recipe: str, overrides: Sequence[str], sweep_file: Optional[str], trials: Optional[int]) -> Config:
    """The recipe's configuration with its sweep (``--sweep FILE`` merged, ``--trials``), checked.

    Raises:
        ConfigError: no ``sweep:`` section, or a parameter that the recipe's schema refuses.
    """
    given: list[str] = []
    if sweep_file:
        import yaml  # noqa: PLC0415

        try:
            data = yaml.safe_load(Path(sweep_file).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"--sweep: the sweep file {sweep_file!r} cannot be read: {exc}.",
                              "name a YAML file holding a sweep: section.") from None
        if not isinstance(data, dict) or not isinstance(data.get("sweep", data), dict):
            raise ConfigError(f"--sweep: {sweep_file!r} holds no mapping (received {type(data).__name__}).",
                              "write 'sweep:' with metric, parameters and the rest (docs/sweep.md).")
        given = [set_item("sweep", data.get("sweep", data))]  # first: the --set items go over it
    cfg = load_config(recipe, [*given, *overrides])
    if cfg.sweep is None:
        raise ConfigError(
            f"tfgpu sweep: the recipe {recipe!r} has no sweep: section (received none, and no --sweep FILE).",
            "add a sweep: section with metric and parameters (docs/sweep.md), or give one with --sweep FILE.")
    if trials is not None:
        cfg = cfg.model_copy(update={"sweep": cfg.sweep.model_copy(update={"trials": trials})})
    _check_parameters(cfg, recipe, overrides)
    sampler(cfg)  # the sampler's and the pruner's arguments, before a sweep directory is made
    pruner(cfg.sweep.pruner)
    return cfg


def run_sweep(recipe: Optional[str], overrides: Sequence[str] = (), trials: Optional[int] = None,
              parallel: Optional[int] = None, storage: Optional[str] = None, resume: Optional[str] = None,
              study_name: Optional[str] = None, sweep_file: Optional[str] = None,
              output_dir: Optional[str] = None) -> SweepResult:
    """Run (or continue) a sweep: ``tfgpu sweep``.

    Args:
        recipe: the recipe with a ``sweep:`` section (with ``resume``: ``None`` reads the sweep's own).
        overrides: ``--set`` items, for the sweep and every trial.
        trials: ``--trials N`` (the study's trials in all).
        parallel: ``--parallel K`` (:func:`tfgpu.experiments.placement.plan_slots`).
        storage: ``--storage URL`` (default: ``SWEEP_DIR/study.journal``).
        resume: ``--resume SWEEP_DIR``: keep its finished trials, continue the interrupted ones.
        study_name: ``--study NAME`` (default: the sweep directory's name).
        sweep_file: ``--sweep FILE``: the sweep section from its own file.
        output_dir: the sweep directory's parent (default ``output.dir``).

    Returns:
        :class:`SweepResult`.

    Raises:
        ConfigError: the recipe or its sweep section is invalid (before any trial starts).
        DeviceError: ``per_trial`` asks for devices this machine does not have.
        SweepError: no trial finished, or the storage or study cannot be opened (exit 12).
        Interrupted, Preempted: Ctrl-C or SIGTERM: the trials were stopped with checkpoints;
            ``tfgpu sweep --resume SWEEP_DIR`` continues.
    """
    from ..training import preflight  # noqa: PLC0415
    from .placement import plan_slots, slot_lines  # noqa: PLC0415
    from ..devices.probe import probe  # noqa: PLC0415
    from ..training.layout import create_run_dir
    from ..utils.files import write_json  # noqa: PLC0415
    from ..config import run_name  # noqa: PLC0415

    saved: dict[str, Any] = {}

    def absolute(path: Optional[str]) -> Optional[str]:  # (a resumed sweep reads paths from its first cwd)
        return str(Path(path).resolve()) if path and "://" not in path else path

    recipe, sweep_file, storage = absolute(recipe), absolute(sweep_file), absolute(storage)
    if resume:
        directory = Path(resume).resolve()
        try:
            saved = json.loads((directory / SWEEP_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SweepError(f"--resume: {resume!r} is not a sweep directory ({SWEEP_FILE} cannot be read: "
                             f"{getattr(exc, 'strerror', None) or exc}).",
                             "name the directory 'tfgpu sweep' printed (output.dir/NAME-sweep-...).") from None
        if not isinstance(saved, dict) or not isinstance(saved.get("recipe"), str):
            raise SweepError(f"--resume: {directory / SWEEP_FILE} is not a sweep's record (received "
                             f"{type(saved).__name__}{' without a recipe' if isinstance(saved, dict) else ''}).",
                             "name the directory 'tfgpu sweep' printed, whose sweep.json it wrote.")
        recipe = recipe or saved["recipe"]
        overrides = [*saved.get("overrides", []), *overrides]
        sweep_file = sweep_file or saved.get("sweep_file")
        storage = storage or _resumed_storage(saved.get("storage"), directory)
        study_name = study_name or saved.get("study")
        trials = trials or saved.get("trials")
    if recipe is None:
        raise ConfigError("tfgpu sweep: no recipe was given (received neither RECIPE nor --resume SWEEP_DIR).",
                          "name a recipe with a sweep: section (tfgpu sweep recipes/breast_cancer_sweep.yaml).")
    if saved.get("cwd") and Path(saved["cwd"]).is_dir() and Path(saved["cwd"]).resolve() != Path.cwd().resolve():
        os.chdir(saved["cwd"])  # the recipe's relative paths, as the sweep first read them
    cfg = prepare(recipe, overrides, sweep_file, trials)
    sample = load_config(recipe, [*overrides, "sweep=null", *([set_item("output.dir", output_dir)] if output_dir else [])])
    preflight.check(sample, None)  # (output.mlflow: its credentials now in this process's environment, the trials')
    overrides = [without_credentials(item) for item in overrides]  # (sweep.json, the trials' command lines)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    slots = plan_slots(cfg, probe(), parallel if parallel is not None else saved.get("parallel"), cores)
    if not resume:
        directory = create_run_dir(output_dir or cfg.output.dir, f"{run_name(cfg, recipe)}-sweep")
    shared = bool(storage) and masked(storage) != masked(saved.get("storage", "")) or bool(saved.get("shared"))
    storage = storage or str((directory / JOURNAL_FILE).resolve())
    study_name = study_name or directory.name
    record = {"recipe": str(Path(recipe).resolve()), "overrides": list(overrides), "sweep_file": sweep_file,
              "storage": masked(storage), "study": study_name, "trials": cfg.sweep.trials,
              "parallel": parallel if parallel is not None else saved.get("parallel"),
              "metric": cfg.sweep.metric, "direction": direction_of(cfg), "cwd": os.getcwd(), "shared": shared,
              "slots": [s.to_dict() for s in slots], "status": "running", "started_at": time.time()}
    write_json(directory / SWEEP_FILE, {**saved, **record, "started_at": saved.get("started_at", record["started_at"])})
    say(f"sweep directory {directory}")
    for line in slot_lines(slots, cfg.sweep.trials):
        say(line)
    started = time.perf_counter()
    try:
        sweep = Sweep(cfg, record["recipe"], overrides, directory, storage, study_name, slots, cfg.sweep.trials, shared)
        parent = _start_tracking(cfg, sweep, record["recipe"], saved.get("mlflow"))
    except BaseException as exc:
        _set_status(directory, "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed")
        raise
    # (this session's sampler seed: a resumed sweep's is moved on by the trials it found, Sweep.seed)
    _set_status(directory, "running", sampler_seed=sweep.seed, **({"mlflow": parent} if parent else {}))
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, frame: Any) -> None:
        sweep.signalled = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"  # (the loop stops the trials)

    for s in previous:
        signal.signal(s, on_signal)
    status, clean = "failed", False
    hint = f"free space on that filesystem, then continue: tfgpu sweep --resume {directory}"
    try:
        try:
            sweep.loop()
        except OSError as exc:  # the study's storage, a trial's log: a full disk is DiskFull, with --resume
            from ..utils.files import disk_full, disk_full_error, failed_file  # noqa: PLC0415

            code = disk_full(exc)
            if code is None:
                raise
            raise disk_full_error(code, failed_file(exc, directory), directory,
                                  "The finished trials, the study and the trials' checkpoints are kept.", hint) from None
        except Exception as exc:  # the storage's own errors (a database that went away, a locked SQLite file)
            if not type(exc).__module__.startswith(("optuna", "sqlalchemy")):
                raise
            raise SweepError(f"the study's storage {masked(storage)!r} failed: {type(exc).__name__}: "
                             f"{redact(str(exc).splitlines()[0] if str(exc) else '', storage)}.",
                             f"check the storage, then continue: tfgpu sweep --resume {directory}") from None
        clean = True
        if sweep.stopping in ("Ctrl-C", "SIGTERM"):
            status = "interrupted"  # finished trials or none: --resume continues it
        elif sweep.recipe_error or _best(sweep.study) is None:
            status = "failed"  # (the recipe's error stopped it, or every trial failed)
        else:
            status = "completed"
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for trial in sweep.running.values():  # (only after an unexpected error: stop them, keep their checkpoints)
            trial.process.send_signal(signal.SIGTERM)
        rows, best_path, seconds = _record_end(sweep, status, started, ok=clean)
        _end_tracking(parent, sweep, status)
    best = _best(sweep.study)
    print(table(rows, best.number if best else None), flush=True)
    if sweep.stopping and sweep.stopping in ("Ctrl-C", "SIGTERM"):
        hint = f"continue it with: tfgpu sweep --resume {directory}"
        if sweep.stopping == "Ctrl-C":
            raise Interrupted(f"the sweep was interrupted (Ctrl-C); its trials saved checkpoints in {directory}.", hint)
        raise Preempted(f"the sweep was stopped (SIGTERM); its trials saved checkpoints in {directory}.", hint)
    if sweep.recipe_error:
        number, error, code = sweep.recipe_error
        raise SweepError(
            f"trial {number} stopped with exit {code} before any trial completed, an error in the recipe that "
            f"every trial would meet: {error}",
            f"fix the recipe (its log: {directory / TRIALS_DIR / f'trial-{number:04d}.log'}), then run tfgpu sweep "
            "again.")
    if best is None:
        raise SweepError(f"no trial of the sweep completed (received {len(rows)} trial(s), none with a finite "
                         f"{cfg.sweep.metric}); the results are in {directory / RESULTS_FILE}.",
                         f"read the trials' logs in {directory / TRIALS_DIR}, fix the recipe and run again.")
    say(f"best: trial {best.number}, {cfg.sweep.metric} {best.value:.4f}; {best_path}")
    say(f"done in {seconds:.1f}s: {directory}")
    return SweepResult(directory, rows, best.number, best.value)


def _best(study: Any) -> Any:
    """The study's best trial (``optuna.Study.best_trial``), ``None`` when no trial completed."""
    try:
        return study.best_trial
    except ValueError:
        return None


def _set_status(directory: Path, status: str, **more: Any) -> None:
    from ..utils.files import write_json  # noqa: PLC0415

    write_json(directory / SWEEP_FILE, {**json.loads((directory / SWEEP_FILE).read_text(encoding="utf-8")),
                                        "status": status, **more})


def _record_end(sweep: Sweep, status: str, started: float, ok: bool) -> tuple[list, Optional[Path], float]:
    """``results.csv``, ``best.yaml`` and ``sweep.json``'s status at the end. After an error (``ok`` false) a
    failure here is a warning, so the first error is the one reported."""
    seconds = time.perf_counter() - started
    try:
        rows = result_rows(sweep.study, sweep.cfg.sweep.metric)
        write_results(sweep.directory, rows)
        best_path = write_best(sweep)
        _set_status(sweep.directory, status, seconds=seconds)
    except Exception as exc:
        if ok:
            raise
        warn(f"the sweep's results could not be written ({type(exc).__name__}: "
             f"{redact(str(exc), sweep.storage_spec)[:300]})")
        return [], None, seconds
    return rows, best_path, seconds


# MLflow: the sweep's own run, whose children the trials are ------------------------------------------------------

def _start_tracking(cfg: Config, sweep: Sweep, recipe: str, saved: Optional[dict[str, Any]]
                    ) -> Optional[dict[str, Any]]:
    """The sweep's own MLflow run (``output.mlflow``), whose children the trials' runs are (``saved``: a resumed
    sweep's run, continued); ``None`` when off."""
    if cfg.output.mlflow is None:
        return None
    from ..tracking import mlflow as tracking  # noqa: PLC0415
    from ..config import run_name  # noqa: PLC0415

    if saved:
        sweep.parent_env.update(tracking.child_environment(saved))
        sweep.tracking = saved
        return saved

    params = {"sweep.metric": cfg.sweep.metric, "sweep.direction": sweep.direction, "sweep.trials": sweep.trials,
              "sweep.sampler": cfg.sweep.sampler_name, "sweep.pruner": cfg.sweep.pruner_name,
              "sweep.slots": len(sweep.slots), "recipe": recipe,
              **{f"sweep.parameters.{k}": json.dumps(v) for k, v in cfg.sweep.parameters.items()}}
    ref = tracking.start_parent_run(cfg, sweep.directory.name, params, {"tfgpu.sweep_dir": str(sweep.directory)},
                                    experiment=run_name(cfg, recipe))  # the experiment its trials' runs go to
    sweep.parent_env.update(tracking.child_environment(ref))
    sweep.tracking = ref
    return ref


def _end_tracking(ref: Optional[dict[str, Any]], sweep: Sweep, status: str) -> None:
    if not ref:
        return
    from ..tracking import mlflow as tracking  # noqa: PLC0415

    # (not sweep.json: a database URL in it may hold a password)
    tracking.end_parent_run(ref, status, [sweep.directory / RESULTS_FILE, sweep.directory / BEST_FILE])


# Inside a trial -------------------------------------------------------------------------------------------------------

