"""``tfgpu run``: orchestration only. :func:`run` reads as its pipeline; each step is another module's.

Every error a user can cause comes before anything is written: the config (3),
the output folder (8), local data files (5, before TensorFlow starts), the
devices (4, 6), the data itself (5), then the model against the data (3).
:func:`run_workers` starts and supervises ``tfgpu run --workers N``'s local workers;
:func:`dry_run` (``tfgpu run --dry-run``) goes as far as :func:`run` does before it writes anything.
The checks before TensorFlow starts are :func:`tfgpu.training.preflight.check`'s, which ``tfgpu plan`` runs too.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

# None of these imports TensorFlow; each module imports it inside the function that needs it.
from ..config import Config
from ..data import load
from ..errors import Interrupted, Preempted, TfgpuError
from ..tracking import mlflow as tracking
from ..utils.console import say, warn
from ..utils.files import replace_atomic, write_json
from . import batch_finder, preflight
from . import checkpoint as ckpt
from .layout import CONFIG_FILE
from .resume import RESUME_ENV, check_same_shape, is_run_dir, load_resumed, request
from .rundir import RunDir
from .trainer import Trainer


@dataclass(frozen=True)
class RunResult:
    """What a finished run produced.

    Attributes:
        run_dir: the run directory.
        summary: the contents of ``summary.json``.
    """

    run_dir: Path
    summary: dict[str, Any]


def run(recipe: Optional[str], overrides: Sequence[str] = (), output_dir: Optional[str] = None,
        resume: Optional[str] = None) -> RunResult:
    """Train the recipe's model and write a new run directory, or continue one (``resume``).

    The pipeline:

    1. :func:`tfgpu.training.resume.request`: the config (a resumed run's own, checked
       against the settings its checkpoint was trained with);
    2. :func:`tfgpu.training.preflight.check`: before TensorFlow starts, a model, a writable output
       folder, TensorBoard, and the local data files;
    3. :func:`tfgpu.setup`: the devices and the strategy, TensorFlow's
       start-up lines held back below ``tensorflow.log_level``;
    4. :func:`tfgpu.data.load`: the data and its pipelines;
    5. :class:`~tfgpu.training.trainer.Trainer`: the model, optimizer, loss and metrics
       built in the strategy's scope and checked against the data, and the callbacks built once
       (:func:`tfgpu.training.callbacks.check_built`: arguments a callback refuses stop the run here);
    6. :meth:`RunDir.open <tfgpu.training.rundir.RunDir.open>` and ``begin``: the run
       directory with its config, plan, start-up log and summary;
    7. :func:`train`: training, ``model.keras`` and the test split, inside
       :meth:`RunDir.running <tfgpu.training.rundir.RunDir.running>`, which records how the run ended.

    Args:
        recipe: path of the YAML recipe (``None``: ``TFGPU_CONFIG``, else the
            defaults; with ``resume``: the run's own ``config.yaml``).
        overrides: ``"section.key=value"`` strings (``--set``).
        output_dir: overrides ``output.dir``.
        resume: a run directory to continue from its last checkpoint; one
            that does not exist yet (or is empty) gets a new run (for job
            scripts that are requeued).

    Returns:
        :class:`RunResult`.

    Raises:
        ConfigError, DeviceError, DataError, AlreadyInitializedError: before
            anything is written (on resume, also: a changed setting that matters).
        TrainingError: training failed; the run directory keeps what was
            written, and ``summary.json`` says ``"status": "failed"``.
        DiskFull: the disk or the quota filled up (exit 8); what was written
            and the last checkpoint are kept, ``--resume`` continues.
        Interrupted: Ctrl-C; likewise with ``"status": "interrupted"``.
        Preempted: SIGTERM or the requeue signal (exit code 75), handled
            from the moment the config is read: while training a checkpoint
            is saved at the next call boundary; at any other moment the run
            stops at once, naming what it was doing (``"status": "preempted"``
            once the run directory exists; the requeue signal also requeues
            the Slurm job).
    """
    started = (time.perf_counter(), time.time())
    extra = [f"output.dir={output_dir}"] if output_dir else []
    cfg, resumed, target = request(recipe, [*overrides, *extra], resume)
    stop = ckpt.StopSignals(cfg.train.checkpoint.requeue_signal)
    stop.limit(cfg.train.max_time)  # train.max_time, counted from here: a stop like the requeue signal
    stop.chief = _chief_by_config(cfg)  # until TensorFlow's cluster is known (then info.is_chief)
    with stop.installed():
        try:
            return _run(cfg, recipe, resumed, target, stop, started)
        except Preempted as exc:
            raise _preempted(exc, stop, target) from None
        except TfgpuError:
            if stop.outside and stop.received:  # the handler's Preempted, caught on its way up by code that
                # reported it as its own error (a data reader's "cannot read FILE: SIGTERM arrived while ...")
                raise _preempted(stop.stopped(), stop, target) from None
            raise


def _run(cfg: Config, recipe: Optional[str], resumed: Any, target: Optional[Path], stop: ckpt.StopSignals,
         started: tuple[float, float]) -> RunResult:
    """:func:`run`'s pipeline, with ``stop`` handling SIGTERM and the requeue signal from its first step."""
    from ..devices.setup import _setup  # noqa: PLC0415  (tfgpu/__init__.py imports nothing from here)

    stop.doing = "checking the config and the data files"
    source, check_seconds = preflight.check(cfg, target)
    stop.doing = "finding the batch size (train.batch_size_per_replica: auto)"
    cfg, search = batch_finder.resolved(cfg, say)  # the cached answer, or trials in child processes
    marks = {"checks": time.perf_counter()}  # the start-up, piece by piece (summary.json: startup_seconds)
    stop.doing = "starting TensorFlow"
    with stop.held():  # (an exception raised into TensorFlow's import aborts the process)
        info = _setup(cfg, keep_log=False)
        stop.reassert()  # a multi-worker strategy's start replaced the SIGTERM handler (StopSignals.reassert)
    marks["tensorflow"] = time.perf_counter()
    stop.chief = info.is_chief
    if info.is_chief:
        for warning in info.plan.warnings:
            warn(warning)
    stop.doing = "loading the data"
    loading = time.perf_counter()
    seed = run_seed(cfg, info, resumed)
    data, pipes = load(cfg, info, source, seed=seed)
    pipes.info["seconds"] = {"check": check_seconds, "load": time.perf_counter() - loading}
    marks["data"] = time.perf_counter()
    if resumed is not None:
        check_same_shape(resumed.summary, info, pipes.steps_per_epoch)
    stop.doing = "building the model"
    # a resumed run with a checkpoint restores it: model.init_from is not applied again (tfgpu.model.transfer)
    trainer = Trainer(cfg, info, data, pipes, restoring=resumed.summary if resumed is not None and resumed.state is not None else None)
    trainer.stop = stop
    marks["model"] = time.perf_counter()
    stop.doing = "writing the run directory"
    # output.mlflow: the chief's MLflow run, created (or continued) here and ended however the run ends
    with RunDir.open(cfg, recipe, info, target) as run_dir, tracking.tracked(cfg, info, run_dir, resumed) as mlflow:
        try:
            found = {"batch_size_search": batch_finder.asdict(search)} if search is not None else {}
            run_dir.begin(cfg, info, {**trainer.facts(), "data_seed": seed, **mlflow, **found}, resumed, started)
            run_dir.startup(started[0], marks)
        except Preempted as exc:  # (the requeue, if any, is done on the way out: run)
            raise Preempted(exc.message, _resume_hint(run_dir.home)) from None
        return train(run_dir, trainer, resumed)


def dry_run(recipe: Optional[str], overrides: Sequence[str] = (), output_dir: Optional[str] = None,
            resume: Optional[str] = None) -> list[str]:
    """``tfgpu run --dry-run``: :func:`run`'s steps 1-5, then stop; nothing is written.

    The config (with ``resume``: the run's own, checked against the settings
    its checkpoint was trained with, as :func:`run` does), :func:`tfgpu.training.preflight.check`,
    :func:`tfgpu.setup` (TensorFlow starts with the plan's devices and
    strategy), :func:`tfgpu.data.load` (the data and its pipelines), and
    :class:`~tfgpu.training.trainer.Trainer` (the model, optimizer, loss and metrics
    built in the strategy's scope and run on the first two training samples:
    :func:`tfgpu.model.keras_model.check_fits`; the callbacks of ``train.early_stopping`` and
    ``train.callbacks`` built against a stand-in run: :func:`tfgpu.training.callbacks.check_built`;
    with ``resume``, ``model.init_from`` skipped as :func:`run` skips it). No run directory, ``output.dir``, start-up
    log or cache file is created (a Keras dataset that is not local is still
    downloaded, as :func:`tfgpu.data.load` does).

    Args:
        recipe, overrides, output_dir, resume: as for :func:`run`.

    Returns:
        The lines to print: the run's banner (devices, strategy, data, batches)
        and what was checked.

    Raises:
        ConfigError, OutputError, DataError, DeviceError, AlreadyInitializedError:
            what :func:`run` would raise before writing anything; ConfigError
            also for a cluster of several workers (``multi_worker_mirrored``),
            which one dry-run process cannot join.
    """
    from ..devices.setup import _setup  # noqa: PLC0415
    from ..cluster.spec import resolve_cluster  # noqa: PLC0415
    from ..errors import ConfigError  # noqa: PLC0415

    extra = [f"output.dir={output_dir}"] if output_dir else []
    cfg, resumed, target = request(recipe, [*overrides, *extra], resume)
    source, _ = preflight.check(cfg, target)
    cfg, _ = batch_finder.resolved(cfg, say)  # train.batch_size_per_replica: auto (the cache, or trials)
    if cfg.distribute.strategy == "multi_worker_mirrored":
        workers = resolve_cluster(cfg.distribute, os.environ).num_workers
        if workers > 1:
            raise ConfigError(
                f"tfgpu run --dry-run: the config trains on a cluster of {workers} workers "
                "(distribute.strategy: multi_worker_mirrored), which one dry-run process cannot join.",
                "check the recipe with 'tfgpu plan RECIPE' (each worker's plan), or dry-run it on one process "
                "with --set distribute.strategy=auto.",
            )
    info = _setup(cfg, keep_log=False)
    for warning in info.plan.warnings:
        warn(warning)
    data, pipes = load(cfg, info, source, seed=run_seed(cfg, info, resumed))
    if resumed is not None:
        check_same_shape(resumed.summary, info, pipes.steps_per_epoch)
    # as run builds it: a resumed run's checkpoint replaces model.init_from's weights, which are not loaded
    trainer = Trainer(cfg, info, data, pipes,
                      restoring=resumed.summary if resumed is not None and resumed.state is not None else None)
    model = trainer.model
    where = (f"would continue {target} from its checkpoint" if resumed is not None else
             f"would write a new run directory in {target}" if target is not None else
             f"would write a new run directory under {cfg.output.dir}")
    return [*trainer.banner(), f"model: {model.name}, {model.count_params():,} parameters",
            "dry run passed: the config, the output folder and the data files; TensorFlow started with the plan; "
            "the data loaded; the model, optimizer, loss and metrics built in the strategy's scope and run on two "
            "training samples; the callbacks (train.early_stopping, train.callbacks) built. Nothing was written; "
            f"'tfgpu run' without --dry-run {where}."]


def run_seed(cfg: Config, info: Any, resumed: Any) -> Optional[int]:
    """The seed of the run's data shuffles, the same for its whole life.

    ``tensorflow.seed`` when set. Otherwise the seed the run was created with
    (``summary.json``'s ``data_seed``) when it resumes, so a mid-epoch resume
    skips the batches of the very shuffle it was cut in; for a new run, one
    drawn now, or with several workers one derived from the cluster's
    addresses (:func:`tfgpu.data.data_seed`: the same on every worker).
    """
    import secrets  # noqa: PLC0415

    from ..data import data_seed  # noqa: PLC0415

    if cfg.tensorflow.seed is not None:
        return cfg.tensorflow.seed
    kept = resumed.summary.get("data_seed") if resumed is not None else None
    if kept is not None:
        return int(kept)
    derived = data_seed(cfg, info.cluster)
    return derived if derived is not None else secrets.randbelow(2 ** 31)


def _chief_by_config(cfg: Config) -> bool:
    """Whether this process is the run's chief, before TensorFlow starts: the cluster the plan will resolve
    (:func:`tfgpu.cluster.spec.resolve_cluster`) for ``multi_worker_mirrored``, else the one process is."""
    from ..cluster.spec import resolve_cluster  # noqa: PLC0415
    from ..errors import ConfigError  # noqa: PLC0415

    if cfg.distribute.strategy != "multi_worker_mirrored":
        return True
    try:
        return resolve_cluster(cfg.distribute, os.environ).is_chief
    except ConfigError:  # the plan reports it when TensorFlow starts
        return True


def _preempted(exc: Preempted, stop: ckpt.StopSignals, run_dir: Optional[Path]) -> Preempted:
    """A stop signal's :class:`Preempted` with the requeue done (the requeue signal, outside training) and the fix."""
    said = ""
    if stop.requeue and stop.outside and stop.chief and os.environ.get("SLURM_JOB_ID"):
        said = f" {ckpt.requeue(os.environ['SLURM_JOB_ID'])}."  # (in training the chief's checkpoint callback did)
    if exc.hint:
        return Preempted(exc.message + said, exc.hint) if said else exc
    if run_dir is not None and is_run_dir(run_dir):
        return Preempted(exc.message + said, _resume_hint(run_dir))
    return Preempted(exc.message + said, "nothing was trained or written; run the same command again (exit code 75 "
                                         "means: run this job again).")


def _resume_hint(run_dir: Path) -> str:
    return f"continue with 'tfgpu run --resume {run_dir}' (exit code 75 means: run this job again)."


def train(run_dir: RunDir, trainer: Trainer, resumed: Any) -> RunResult:
    """Train (from ``resumed``'s checkpoint, if any), save ``model.keras`` and test, in ``run_dir``.

    Every worker trains; only the chief prints and keeps its directory.
    """
    cfg, chief = trainer.cfg, run_dir.chief
    if chief:
        say(f"run directory {run_dir.path}")
        for line in trainer.banner():
            say(line)
    state = resumed.state if resumed is not None else None
    start = resumed.start if resumed is not None else ckpt.Position()
    stop = trainer.stop or ckpt.StopSignals(None)
    with run_dir.running(trainer.outcome, stop.ending):
        stop.doing = "restoring the checkpoint"
        callbacks = trainer.callbacks(run_dir, state, start)
        if chief and state:
            say(f"resumed from the checkpoint at epoch {start.epoch + 1} step {start.step} "
                f"(global step {state['global_step']}); metrics.csv keeps epochs 1-{start.epoch}"
                + ("" if trainer.saver is not None else "; train.checkpoint is off now, so nothing more is saved"))
        stop.doing = "training"
        run_dir.training_started = time.perf_counter()
        trainer.train(callbacks, start)
        if chief and trainer.early_stopping is not None:
            say(trainer.early_stopping.describe())
        if cfg.output.save_model:
            stop.doing = "saving model.keras"
            replace_atomic(run_dir.path / "model.keras", trainer.save, run_dir.path / ".model.tmp.keras",
                           "check the disk space and permissions; the run's metrics are kept.")
        stop.doing = "testing"
        # held: a signal is handled when the evaluation returns (raised into Keras's evaluate under load, a SIGTERM
        # once crashed the process with SIGSEGV before anything was written); model.keras is saved already
        with stop.held():
            run_dir.record(trainer.test(run_dir.epochs.rows))
        stop.doing = "finishing"
    if trainer.saver is not None and cfg.output.save_model:
        run_dir.drop_checkpoint()  # model.keras holds the result now
    summary = run_dir.summary
    xla = summary.get("xla") or {}
    if chief and xla.get("trace_and_compile_seconds") is not None:
        say(f"first training call {xla['first_call_seconds']:.2f} s: "
            + ("tracing and XLA compiling" if xla["compiled"] else "tracing") + " the step "
            f"{xla['trace_and_compile_seconds']:.2f} s, its {xla['first_call_steps']} steps the rest")
    if chief:
        say(f"done in {summary['wall_seconds']:.1f}s: "
            + ", ".join(f"{k} {v:.4f}" for k, v in summary["final_metrics"].items()) + f"; {run_dir.path}")
    return RunResult(run_dir.path, summary)


def run_workers(recipe: Optional[str], overrides: Sequence[str], output_dir: Optional[str], workers: int,
                resume: Optional[str] = None, max_restarts: int = 3) -> RunResult:
    """``tfgpu run RECIPE --workers N``: N local worker processes on 127.0.0.1, supervised and restarted.

    Everything a user can get wrong in the recipe, the output folder or local
    data files is checked here first, before any worker starts. Then one run
    directory is made (or ``resume``'s is reopened); the workers (``python -m
    tfgpu run``, each with its ``TF_CONFIG``) train under
    MultiWorkerMirroredStrategy; the chief writes the run directory, every
    worker's output goes to ``RUN_DIR/workers/worker-<i>.log`` (the chief's
    also to this terminal). When a worker is killed or crashes, the others are
    stopped and the group starts again from the last checkpoint, up to
    ``max_restarts`` times (like torchrun's ``--max-restarts``); each restart
    is recorded in ``summary.json`` (``restarts``) and ``workers/workers.json``.
    A worker that fails after the chief wrote ``"status": "completed"`` (a
    crash in its teardown) is not restarted: the run succeeded, and the note
    is kept in ``summary.json`` (``worker_note``) and ``workers.json``.
    Ctrl-C, SIGTERM and ``train.checkpoint.requeue_signal`` are caught for the
    whole supervision (restarts included) and forwarded to the workers; the
    workers die with this process, even when it is SIGKILLed.

    Raises:
        ConfigError, DataError, OutputError: before any worker starts.
        WorkerError: a worker failed and no restart was left (or the failure
            was one a restart repeats: a code of the worker's own, such as
            tfgpu's errors); the message names it, how it ended and its log
            (exit code: :func:`~tfgpu.errors.worker_exit_code` of the
            worker's: its own code, else 10).
        Preempted: SIGTERM or the requeue signal reached the workers; they
            saved a checkpoint (75).
    """
    from ..launch.workers import load_for_workers  # noqa: PLC0415

    extra = [f"output.dir={output_dir}"] if output_dir else []
    resume_dir = Path(resume) if resume else None
    resuming = resume_dir is not None and is_run_dir(resume_dir)
    if resuming and recipe is None:
        recipe = str(resume_dir / CONFIG_FILE)
    cfg, overrides = load_for_workers(recipe, [*overrides, *extra], workers)
    if resuming:
        load_resumed(resume_dir, recipe, overrides)  # a changed setting is refused before any worker starts
    preflight.check(cfg, resume_dir)
    cfg, search = batch_finder.resolved(cfg, say)  # auto: found once here, every worker given the answer
    if search is not None:
        overrides = [*overrides, f"train.batch_size_per_replica={search.batch}"]
    run_dir = RunDir.for_group(cfg, recipe, resume_dir)
    say(f"{workers} workers on 127.0.0.1 (MultiWorkerMirroredStrategy); run directory {run_dir.path}; "
        f"worker logs in {run_dir.path / 'workers'}")
    group = _Group(recipe, list(overrides), workers, run_dir.path, max_restarts, cfg.train.checkpoint.requeue_signal)
    attempts, outcome, supervisor = group.supervise(resuming)
    if outcome.failed is None:
        summary = run_dir.load_summary()
        if attempts[-1].get("after_completion"):  # a worker crashed in its teardown: say so beside the result
            summary["worker_note"] = attempts[-1]["after_completion"]
            write_json(run_dir.path / "summary.json", summary)
        return RunResult(run_dir.path, summary)
    raise _group_failure(group, run_dir, attempts, outcome, supervisor)


@dataclass
class _Group:
    """The local workers of ``tfgpu run --workers N`` and how often they may restart."""

    recipe: Optional[str]
    overrides: list[str]
    workers: int
    run_dir: Path
    max_restarts: int
    requeue_signal: Optional[str] = None

    def supervise(self, resuming: bool) -> tuple[list[dict[str, Any]], Any, Any]:
        """Start the workers; restart them all from the last checkpoint when one crashes or is killed.

        Ctrl-C, SIGTERM and the requeue signal are caught from before the first
        worker starts until the last one exits, restarts included
        (:class:`~tfgpu.launch.workers.Forwarding`), and forwarded to the workers; a
        signal ends the group (one that comes while it restarts stops the
        restart). A worker that fails after the chief wrote ``"status":
        "completed"`` (a crash in its teardown) is no reason to restart: the
        run stands, with the note in ``after_completion``.

        Returns the attempts (as ``workers/workers.json`` records them), the last outcome and its supervisor.
        """
        from ..launch.workers import Forwarding, Supervisor, free_ports, prepare_run  # noqa: PLC0415

        env = dict(os.environ)
        env.pop(RESUME_ENV, None)
        if resuming:
            env[RESUME_ENV] = "tfgpu run --resume"
        attempts: list[dict[str, Any]] = []
        with Forwarding(self.requeue_signal) as signals:
            while True:
                children = prepare_run(self.recipe, self.overrides, self.workers, free_ports(self.workers),
                                       self.run_dir, env)
                supervisor = Supervisor(children, signals=signals, finished=lambda: _completed(self.run_dir))
                supervisor.start()
                attempt = {"workers": [{"index": c.index, "pid": p.pid, "exit_code": None, "log": str(c.log),
                                        "TF_CONFIG": c.env["TF_CONFIG"]}
                                       for c, p in zip(children, supervisor.processes)],
                           "resumed": RESUME_ENV in env}
                attempts.append(attempt)
                _record_workers(self.run_dir, attempts)  # the pids, while they run
                outcome = supervisor.wait()
                for w, code in zip(attempt["workers"], outcome.codes):
                    w["exit_code"] = code
                attempt.update(failed=outcome.failed, seconds=outcome.seconds)
                _record_workers(self.run_dir, attempts)
                for scratch in self.run_dir.parent.glob(f"{self.run_dir.name}.worker-*.tmp"):
                    shutil.rmtree(scratch, ignore_errors=True)  # a killed worker could not remove its own
                if outcome.failed is not None and _completed(self.run_dir):
                    note = (f"{supervisor.ended(outcome.failed)} after the run had completed (summary.json says "
                            "so); the run stands and was not restarted.")
                    attempt.update(failed=None, after_completion=note)
                    _record_workers(self.run_dir, attempts)
                    warn(note)
                    outcome.failed, outcome.exit_code = None, 0
                if signals.received:
                    outcome.interrupted = True  # also one that came after the workers ended: no restart
                if outcome.failed is None or not _restartable(outcome) or len(attempts) > self.max_restarts:
                    return attempts, outcome, supervisor
                why = supervisor.failure(outcome, "tfgpu run --workers").message.split("\n")[0]
                attempt["restarted_because"] = why
                _record_workers(self.run_dir, attempts)
                say(f"{why}\ntfgpu: restarting the {self.workers} workers from the last checkpoint "
                    f"(restart {len(attempts)} of at most {self.max_restarts})")
                env[RESUME_ENV] = why


def _completed(run_dir: Path) -> bool:
    """The chief wrote ``"status": "completed"`` into ``run_dir/summary.json``."""
    from ..errors import OutputError  # noqa: PLC0415

    try:
        return (ckpt.read_json(run_dir / "summary.json") or {}).get("status") == "completed"
    except OutputError:
        return False


def _group_failure(group: _Group, run_dir: RunDir, attempts: list[dict[str, Any]], outcome: Any,
                   supervisor: Any) -> Exception:
    """The error a failed worker group ends with; ``summary.json`` says how it ended when the chief could not."""
    workers, path = group.workers, run_dir.path
    if all(c == 75 for c in outcome.codes):
        state = ckpt.read_state(path) or {}
        return Preempted(f"the {workers} workers saved a checkpoint at epoch {state.get('epoch', 0) + 1} step "
                         f"{state.get('step')} (global step {state.get('global_step')}) and stopped; {path} "
                         "keeps the run.",
                         f"continue with 'tfgpu run --resume {path} --workers {workers}' "
                         "(exit code 75 means: run this job again).")
    error = supervisor.failure(outcome, "tfgpu run --workers")
    summary = run_dir.load_summary()
    if summary.get("status") == "running":  # the chief was stopped before it could say so
        summary.update(status="interrupted" if outcome.interrupted else "failed", error=error.message)
    summary["worker_error"] = error.message
    if len(attempts) > 1:
        summary["worker_restarts_exhausted"] = _restartable(outcome)
    if path.exists():
        write_json(path / "summary.json", summary)
    if outcome.interrupted and outcome.exit_code == 130:
        return Interrupted(f"interrupted; {path} keeps what was written and every worker's log.",
                           f"continue with 'tfgpu run --resume {path} --workers {workers}'.")
    if _restartable(outcome):
        error.hint = (f"read the worker's log for the cause; {len(attempts) - 1} restart(s) were used "
                      f"(--max-restarts {group.max_restarts}); continue with 'tfgpu run --resume {path} "
                      f"--workers {workers}'.")
    return error


def _restartable(outcome: Any) -> bool:
    """A failure that a restart from the checkpoint can get past: a worker that crashed or was killed
    (:func:`~tfgpu.errors.worker_exit_code` says 10), unless a signal reached the supervisor. A code of the
    worker's own (tfgpu's errors, a preemption, an interruption) would only happen again."""
    from ..errors import WORKER_FAILED, worker_exit_code  # noqa: PLC0415

    return not outcome.interrupted and worker_exit_code(outcome.codes[outcome.failed]) == WORKER_FAILED


def _record_workers(run_dir: Path, attempts: list[dict[str, Any]]) -> None:
    """``RUN_DIR/workers/workers.json``: each start of the group (pids, TF_CONFIG, exit codes, why it restarted);
    ``workers`` is the last one's."""
    write_json(run_dir / "workers" / "workers.json", {**{k: v for k, v in attempts[-1].items()},
                                                     "restarts": len(attempts) - 1, "attempts": attempts})
