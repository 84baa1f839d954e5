"""``tfgpu run``: orchestration only (config -> data check -> setup -> data -> model -> loop -> results).

Each step is a function of its own module; this one orders them so that every
error a user can cause comes before anything is written: the config (3), the
output folder (8), local data files (5, before TensorFlow starts), the devices
(4, 6), the data itself (5), then the model against the data (3).
"""

from __future__ import annotations

import contextlib
import functools
import json
import hashlib
import math
import os
import platform
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

# None of these imports TensorFlow; each module imports it inside the function that needs it.
from . import __version__, keras_fixes
from .config import Config, load_config
from .data import LoadContext, prepare, prepare_for_jax, source_for
from .data.pipeline import normalization_stats, sample_batch
from .errors import ConfigError, Interrupted, OutputError, Preempted, TfgpuError, TrainingError
from .loops import epoch_stats_callback, progress_mode
from .loops.custom import train_custom
from .loops.fit import train_fit
from .model import (build_model, check_fits, describe_model, gist, make_loss, make_metrics, make_optimizer,
                    require_model, target_of)
from .results import (CONFIG_FILE, check_parent, check_tensorboard, create_run_dir, open_run_dir, replace_atomic,
                      write_config, write_json)
from . import checkpoint as ckpt
from .resume import RESUME_ENV, check_same_shape, is_run_dir, keep_metrics, load_resumed, restart_record

#: Set by ``tfgpu run --workers N`` for its workers: the run directory the chief writes.
RUN_DIR_ENV = "TFGPU_RUN_DIR"

# train.steps_per_execution: auto. At least this many steps per call (see
# resolve_steps_per_execution), so Python's per-call cost is spread over many steps.
AUTO_STEPS_PER_EXECUTION = 32


@dataclass(frozen=True)
class RunResult:
    """What a finished run produced.

    Attributes:
        run_dir: the run directory.
        summary: the contents of ``summary.json``.
    """

    run_dir: Path
    summary: dict[str, Any]


@dataclass
class _Built:
    """The model and what trains it, built inside the strategy's scope."""

    model: Any
    optimizer: Any
    learning_rate: float
    per_call: int
    loss: Any = None
    metrics: Any = None
    val_metrics: Any = None


def _say(text: str) -> None:
    print(f"tfgpu: {text}", flush=True)


def data_seed(cfg: Config, cluster: Any) -> Optional[int]:
    """The seed of the data's shuffles: ``tensorflow.seed``; with several workers and no seed, one derived
    from the cluster's addresses, the same on every worker (sharding a dataset by DATA or FILE between
    workers needs every worker to shuffle it alike, else they read overlapping parts)."""
    if cfg.tensorflow.seed is not None or cluster is None or cluster.num_workers == 1:
        return cfg.tensorflow.seed
    text = ",".join(f"{job}={','.join(hosts)}" for job, hosts in sorted(cluster.jobs.items()))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def load_data(cfg: Config, info: Any, source: Any, train: bool = True) -> tuple[Any, Any]:
    """A checked source's data and pipelines for the devices ``info`` describes (after :func:`tfgpu.setup`).

    ``train=False`` (evaluation) does not decode the training split. With
    several workers, the pipelines carry each worker's sharding policy.
    """
    cluster = info.cluster
    context = LoadContext(global_batch_size=info.global_batch_size, num_replicas=info.num_replicas,
                          seed=data_seed(cfg, cluster), num_workers=cluster.num_workers if cluster else 1,
                          worker_index=cluster.worker_index if cluster else 0)
    if info.backend == "jax":
        return prepare_for_jax(source, cfg.data, context, info.num_replicas, train)
    return prepare(source, cfg.data, context, train)


def _outputs(cfg: Config, recipe: Optional[str], info: Any, resume: Optional[Path]) -> Path:
    """The directory this process writes: the chief's run directory (new; the one being resumed; or the one
    the supervisor made, ``TFGPU_RUN_DIR``); for another worker, a scratch directory beside it, removed when
    the run ends (TensorFlow's documented non-chief pattern: every worker saves, since saving reads
    synchronised variables collectively, but only the chief's files are kept)."""
    name = cfg.output.name or (Path(recipe).stem if recipe else "run")
    given = str(resume) if resume else os.environ.get(RUN_DIR_ENV)
    if info.is_chief:
        if resume:
            return open_run_dir(resume)
        if given:
            path = Path(given)
            if not path.is_dir() or (path / CONFIG_FILE).exists():
                raise OutputError(f"{RUN_DIR_ENV}: '{given}' is not an empty run directory made for this run.",
                                  f"unset {RUN_DIR_ENV}; 'tfgpu run --workers N' sets it for its workers.")
            return path
        return create_run_dir(cfg.output.dir, name)
    cluster = info.cluster
    where = Path(given).parent if given else Path(cfg.output.dir)
    stem = Path(given).name if given else f".{name}"
    path = where / f"{stem}.worker-{cluster.worker_index}-{os.getpid()}.tmp"
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise OutputError(f"output.dir: worker {cluster.worker_index} cannot create its scratch directory {path}: "
                          f"{exc.strerror or exc}.", "set output.dir to a directory every worker can write.") from None
    return path


def _resume_target(resume: Optional[str]) -> tuple[Optional[Path], str]:
    """The run directory to continue (``--resume``, or a restarted worker's ``TFGPU_RUN_DIR``) and why."""
    if resume:
        return Path(resume), "tfgpu run --resume"
    if os.environ.get(RESUME_ENV) and os.environ.get(RUN_DIR_ENV):
        return Path(os.environ[RUN_DIR_ENV]), os.environ[RESUME_ENV]
    return None, ""


def run(recipe: Optional[str], overrides: Sequence[str] = (), output_dir: Optional[str] = None,
        resume: Optional[str] = None) -> RunResult:
    """Train the recipe's model and write a new run directory, or continue one (``resume``).

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
        Interrupted: Ctrl-C; likewise with ``"status": "interrupted"``.
        Preempted: SIGTERM or the requeue signal; a checkpoint was saved
            (``"status": "preempted"``, exit code 75).
    """
    started = time.perf_counter()
    started_at = time.time()
    extra = [f"output.dir={output_dir}"] if output_dir else []
    resume_dir, why = _resume_target(resume)
    previous: Optional[dict[str, Any]] = None
    if resume_dir is not None and is_run_dir(resume_dir):
        cfg, previous = load_resumed(resume_dir, recipe, [*overrides, *extra])
    else:
        cfg = load_config(recipe, overrides=[*overrides, *extra])
    from . import setup  # noqa: PLC0415  (tfgpu/__init__.py imports nothing from here)

    require_model(cfg.model)
    check_parent(cfg.output.dir if resume_dir is None else str(resume_dir.parent))
    check_tensorboard(cfg.output.tensorboard)
    source = source_for(cfg.data, cfg.model.loss, cfg.tensorflow.seed)
    checked = time.perf_counter()
    source.check()  # local files, NumPy only: a data error comes before TensorFlow starts
    check_seconds = time.perf_counter() - checked
    info = setup(cfg)
    plan = info.plan
    chief = info.is_chief
    if chief:
        for warning in plan.warnings:
            _say(f"warning: {warning}")

    loading = time.perf_counter()
    data, pipes = load_data(cfg, info, source)
    pipes.info["seconds"] = {"check": check_seconds, "load": time.perf_counter() - loading}
    if previous is not None:
        check_same_shape(previous, info, pipes.steps_per_epoch)
    built = _build(cfg, info, data, pipes.steps_per_epoch)
    profile = _profile_calls(cfg, pipes.steps_per_epoch, built.per_call)

    run_dir = _outputs(cfg, recipe, info, resume_dir)
    resumed = None
    if previous is not None:
        resumed = (resume_dir, previous, why)
    try:
        return _run(cfg, recipe, info, data, pipes, built, profile, run_dir, started, started_at, resumed)
    finally:
        if not chief:
            shutil.rmtree(run_dir, ignore_errors=True)


def _run(cfg: Config, recipe: Optional[str], info: Any, data: Any, pipes: Any, built: _Built, profile: Any,
         run_dir: Path, started: float, started_at: float, resumed: Optional[tuple]) -> RunResult:
    """Write the run directory, train, save and test (every worker; only the chief's directory is kept)."""
    plan, chief = info.plan, info.is_chief
    home = resumed[0] if resumed else run_dir  # where the chief's files are (a non-chief reads its checkpoint)
    state = ckpt.read_state(home) if resumed else None
    start = ckpt.Position(state["epoch"], state["step"]) if state else ckpt.Position()
    write_config(run_dir, cfg)
    write_json(run_dir / "plan.json", plan.to_dict())
    summary = _summary(cfg, recipe, run_dir, started_at, info, data, pipes, built, profile)
    kept: list[dict[str, float]] = []
    if resumed:
        previous, why = resumed[1], resumed[2]
        summary["restarts"] = [*previous.get("restarts", []), restart_record(home, previous, why)]
        summary["first_started_at"] = previous.get("first_started_at", previous.get("started_at"))
        if chief:
            kept = keep_metrics(run_dir, start.epoch)
    write_json(run_dir / "summary.json", summary)
    if chief:
        _banner(run_dir, info, data, pipes, built, cfg)

    import keras  # noqa: PLC0415

    samples = summary["data"]["train_samples"]
    stats = epoch_stats_callback(samples)
    stats.rows.extend(kept)
    callbacks = [stats, keras.callbacks.CSVLogger(str(run_dir / "metrics.csv"), append=True)]
    if cfg.output.tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(log_dir=str(run_dir / "tensorboard"),
                                                     profile_batch=tuple(profile["calls"]) if profile else 0))
    saver, stop = None, None
    if cfg.train.checkpoint.enabled:
        saver, stop = _checkpointing(cfg, info, built, pipes, run_dir, home, state, start)
        callbacks.append(saver)
        summary["checkpoint"] = {"dir": str(home / ckpt.CHECKPOINT_DIR), "every_epochs": cfg.train.checkpoint.every_epochs,
                                 "every_steps": cfg.train.checkpoint.every_steps,
                                 "restored_from": {"epoch": start.epoch, "step": start.step} if state else None}
        if chief and state:
            _say(f"resumed from the checkpoint at epoch {start.epoch + 1} step {start.step} "
                 f"(global step {state['global_step']}); metrics.csv keeps epochs 1-{start.epoch}")
    progress = progress_mode(cfg.train.progress) if chief else "none"
    finish = functools.partial(_finish, summary, stats, started, run_dir, saver)
    try:
        with (stop or contextlib.nullcontext()):
            _train(cfg, info, built, pipes, callbacks, progress, summary, start)
        if cfg.output.save_model:
            replace_atomic(run_dir / "model.keras", built.model.save, run_dir / ".model.tmp.keras",
                           "check the disk space and permissions; the run's metrics are kept.")
        _test(built.model, data, pipes, summary, stats)
    except KeyboardInterrupt:
        finish("interrupted")
        raise Interrupted(
            f"interrupted after {len(stats.rows)} of {cfg.train.epochs} epochs; {run_dir} keeps the config, "
            "the metrics of the finished epochs and summary.json.",
            f"continue it with 'tfgpu run --resume {run_dir}'" if saver else "run again to train from the start.",
        ) from None
    except Preempted as exc:  # raised by the checkpoint callback, which does not know the run directory
        finish("preempted", str(exc))
        raise Preempted(exc.message, f"continue with 'tfgpu run --resume {run_dir}' (exit code 75 means: run "
                                     "this job again).") from None
    except TfgpuError as exc:
        finish("failed", str(exc))
        raise
    except Exception as exc:  # TensorFlow's errors (OOM, bad shapes, ...) during training
        finish("failed", f"{type(exc).__name__}: {exc}")
        raise TrainingError(
            f"training failed in epoch {min(len(stats.rows) + 1, cfg.train.epochs)}: {type(exc).__name__}: "
            f"{gist(exc)}.",
            (f"{run_dir} keeps what was written" if chief else "the chief's run directory keeps what was written")
            + "; run with --debug for the traceback.",
        ) from exc
    finish("completed")
    if saver is not None and chief and cfg.output.save_model:
        shutil.rmtree(run_dir / ckpt.CHECKPOINT_DIR, ignore_errors=True)  # model.keras holds the result now
    final = summary["final_metrics"]
    if chief:
        _say(f"done in {summary['wall_seconds']:.1f}s: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items())
             + f"; {run_dir}")
    return RunResult(run_dir, summary)


def _checkpointing(cfg: Config, info: Any, built: _Built, pipes: Any, run_dir: Path, home: Path,
                   state: Optional[dict], start: Any) -> tuple[Any, Any]:
    """The checkpoint callback and the stop-signal watcher; restores ``state`` first (every worker)."""
    settings, chief = cfg.train.checkpoint, info.is_chief
    write_dir = run_dir / ckpt.CHECKPOINT_DIR
    with info.scope():
        if cfg.train.loop == "fit":
            files = ckpt.FitFiles(built.model, write_dir)
        else:
            files = ckpt.CustomFiles(built.model, built.optimizer, write_dir)
        if state is not None:
            files.restore(state, home / ckpt.CHECKPOINT_DIR)
    stop = ckpt.StopSignals(settings.requeue_signal)

    def on_stop(saved: dict) -> str:
        job = os.environ.get("SLURM_JOB_ID")
        return ckpt.requeue(job) if job else "no Slurm job to requeue (SLURM_JOB_ID is not set)"

    agree = ckpt.agreement(info.strategy) if info.plan.num_workers > 1 else None
    saver = ckpt.checkpoint_callback(files, write_dir, chief, pipes.steps_per_epoch, cfg.train.epochs,
                                     settings.every_epochs, settings.every_steps, start, cfg.train.loop, stop, agree,
                                     on_stop)
    return saver, stop


def _build(cfg: Config, info: Any, data: Any, steps_per_epoch: int) -> _Built:
    """Build and compile the model in the strategy's scope, and check it on two samples.

    Raises:
        ConfigError: the model, loss or metrics do not fit the data (before anything is written).
    """
    import keras  # noqa: PLC0415

    spec, plan = data.spec, info.plan
    target = target_of(spec.task, spec.num_classes, spec.target_shape, cfg.model.loss)
    normalization = normalization_stats(data) if cfg.data.normalize else None
    per_call = resolve_steps_per_execution(cfg.train.steps_per_execution, steps_per_epoch)
    if cfg.train.loop == "fit" and plan.num_workers > 1:
        # Keras's several-steps-per-call loop (a tf.while_loop over get_next_as_optional) fails under
        # MultiWorkerMirroredStrategy with "You must feed a value for placeholder tensor
        # 'while/cond/Placeholder'" (Keras 3.15.1, TF 2.21, seen here), so fit runs one step per call.
        if per_call > 1 and cfg.train.steps_per_execution != "auto":
            _say(f"warning: train.steps_per_execution: {cfg.train.steps_per_execution} is 1 with loop: fit and "
                 "several workers (Keras's multi-step loop fails under MultiWorkerMirroredStrategy); "
                 "loop: custom runs several steps per call")
        per_call = 1
    with info.scope():
        model = build_model(cfg.model, spec.input_shape, target, normalization)
        optimizer, learning_rate = make_optimizer(cfg.model.optimizer, plan.lr_scale)
        if cfg.train.loop == "custom" and plan.mixed_precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # fit wraps it itself
        # fit trains with what compile sets; for the custom loop it makes the saved
        # model.keras ready to evaluate and train further.
        metrics = make_metrics(cfg.model.metrics, cfg.model.loss)
        # On JAX the last evaluation batch carries padding of sample weight 0 (tfgpu.data.feed); Keras applies
        # sample weights to weighted_metrics only, which are the same metrics when no weights are given.
        by_weight = {"weighted_metrics": metrics} if plan.backend == "jax" else {"metrics": metrics}
        model.compile(optimizer=optimizer, loss=make_loss(cfg.model.loss), **by_weight,
                      jit_compile=plan.jit_compile, steps_per_execution=per_call)
        built = _Built(model, optimizer, learning_rate, per_call)
        if cfg.train.loop == "custom":
            built.loss = make_loss(cfg.model.loss, per_example=True)
            built.metrics = make_metrics(cfg.model.metrics, cfg.model.loss)
            built.val_metrics = make_metrics(cfg.model.metrics, cfg.model.loss, prefix="val_")
    # A loss or metric that does not fit the labels fails here, as a configuration error, before
    # anything is written, rather than inside the first training step.
    check_fits(model, cfg.model.loss, cfg.model.metrics, *sample_batch(data), task=spec.task)
    return built


def _profile_calls(cfg: Config, steps_per_epoch: int, per_call: int) -> Optional[dict[str, list[int]]]:
    """``train.profile_steps`` -> the training calls to profile and the steps they hold.

    Keras's TensorBoard callback counts calls (``steps_per_execution`` steps each).

    Raises:
        ConfigError: the first step lies beyond the run.
    """
    steps = cfg.train.profile_steps
    if steps is None:
        return None
    total = cfg.train.epochs * steps_per_epoch
    if steps[0] > total:
        raise ConfigError(
            f"train.profile_steps: {steps} starts after the run's last step ({cfg.train.epochs} epochs x "
            f"{steps_per_epoch} steps = {total}).",
            f"profile steps between 1 and {total}, e.g. [{min(2, total)}, {min(5, total)}].",
        )
    calls = [math.ceil(steps[0] / per_call), math.ceil(min(steps[1], total) / per_call)]
    return {"steps_asked": list(steps), "calls": calls,
            "steps": [(calls[0] - 1) * per_call + 1, calls[1] * per_call]}


def _summary(cfg: Config, recipe: Optional[str], run_dir: Path, started_at: float, info: Any, data: Any,
             pipes: Any, built: _Built, profile: Optional[dict]) -> dict[str, Any]:
    import keras  # noqa: PLC0415

    plan = info.plan
    train = data.train
    samples = train.size if train.batches is None else pipes.steps_per_epoch * info.global_batch_size
    described = {
        **data.spec.to_dict(),
        "train_samples": samples,
        "validation_samples": data.validation.size if data.validation else 0,
        "test_samples": data.test.size if data.test else 0,
        "splits": {s.name: s.origin for s in data.splits()},
        "validation_is_test": data.validation_is_test,
        "normalize": cfg.data.normalize,
        **pipes.info,
    }
    return {
        "status": "running",
        "recipe": str(recipe) if recipe else None,
        "run_dir": str(run_dir),
        "cwd": os.getcwd(),
        "started_at": started_at,
        "loop": cfg.train.loop,
        "backend": plan.backend,
        "versions": _versions(plan.backend, keras.__version__),
        "physical_devices": list(info.physical_devices),
        "logical_devices": list(info.logical_devices),
        "gpus": [g.name for g in plan.gpus],
        "strategy": type(info.strategy).__name__ if info.strategy is not None else None,
        "strategy_devices": list(plan.strategy.devices),
        "cross_device_ops": plan.strategy.cross_device_ops,
        "cluster": plan.cluster.to_dict() if plan.cluster else None,
        "num_workers": plan.num_workers,
        "keras_fixes": keras_fixes.applied() if plan.cluster else {},
        "num_replicas": info.num_replicas,
        "batch_size_per_replica": plan.batch_size_per_replica,
        "global_batch_size": info.global_batch_size,
        "steps_per_epoch": pipes.steps_per_epoch,
        "steps_per_execution": built.per_call,
        "lr_scaling": plan.lr_scaling,
        "learning_rate": built.learning_rate,
        "jit_compile": plan.jit_compile,
        "jit_compile_reason": plan.jit_compile_reason,
        "mixed_precision": plan.mixed_precision,
        "data": described,
        "model": describe_model(built.model),
        "tensorboard": str(run_dir / "tensorboard") if cfg.output.tensorboard else None,
        "profile": profile,
        "epochs_planned": cfg.train.epochs,
        "epochs": [],
        "warnings": list(plan.warnings),
    }


def _versions(backend: str, keras_version: str) -> dict[str, Optional[str]]:
    """tfgpu, Python, Keras and the backend's packages (TensorFlow's version only where it is imported, so a
    JAX run never imports it)."""
    import sys  # noqa: PLC0415
    from importlib import metadata  # noqa: PLC0415

    versions: dict[str, Optional[str]] = {"tfgpu": __version__, "keras": keras_version,
                                          "python": platform.python_version()}
    tf = sys.modules.get("tensorflow")
    versions["tensorflow"] = getattr(tf, "__version__", None)
    if backend == "jax":
        for name in ("jax", "jaxlib"):
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                versions[name] = None
    return versions


def _banner(run_dir: Path, info: Any, data: Any, pipes: Any, built: _Built, cfg: Config) -> None:
    plan, spec = info.plan, data.spec
    _say(f"run directory {run_dir}")
    if plan.backend == "jax":
        _say(f"backend: jax; JAX devices: {', '.join(info.logical_devices)}")
        _say("distribution: " + (f"keras.distribution.DataParallel over {', '.join(plan.strategy.devices)}"
                                 if info.strategy is not None else
                                 f"none ({', '.join(plan.strategy.devices) or 'the default device'})"))
    else:
        _say(f"devices: {', '.join(info.logical_devices)}")
        _say(f"strategy: {type(info.strategy).__name__} on {', '.join(plan.strategy.devices) or 'the default device'}"
             + (f" ({plan.strategy.cross_device_ops})" if plan.strategy.cross_device_ops else "")
             + (" of each worker" if plan.cluster else ""))
    if plan.cluster:
        _say(f"cluster: {plan.cluster.describe()}; sharding: {pipes.info['sharding']['policy']} "
             f"({pipes.info['sharding']['reason']})")
    sizes = ", ".join(f"{s.name} {s.size:,}" for s in data.splits())
    what = (f"{spec.num_classes} classes" if spec.task == "classification" else "regression")
    _say(f"data: {spec.source}: {sizes}; input {spec.input_shape}, {what}"
         + (" (validation = the test split)" if data.validation_is_test else "")
         + ("" if data.validation else " (no validation data)"))
    _say(f"global batch: {plan.batch_size_per_replica} per replica x {info.num_replicas} replicas = "
         f"{info.global_batch_size}; {pipes.steps_per_epoch} steps per epoch; loop: {cfg.train.loop}; "
         f"learning rate {built.learning_rate:g}"
         + (f" ({plan.lr_scaling} scaling)" if plan.lr_scaling != "none" else ""))
    _say(f"steps per call: {built.per_call}; XLA: {'on' if plan.jit_compile else 'off'} ({plan.jit_compile_reason}); "
         f"precision: {plan.mixed_precision}")


def _train(cfg: Config, info: Any, built: _Built, pipes: Any, callbacks: list, progress: str,
           summary: dict[str, Any], start: Any) -> None:
    if cfg.train.loop == "fit":
        train_fit(built.model, pipes.train_epochs, pipes.validation, cfg.train.epochs, pipes.steps_per_epoch,
                  callbacks, progress, cfg.train.terminate_on_nan, (start.epoch, start.step))
    else:
        summary["traces"] = train_custom(
            info.strategy, built.model, built.optimizer, built.loss, built.metrics, built.val_metrics,
            pipes.train_epochs, pipes.validation, cfg.train.epochs, pipes.steps_per_epoch, pipes.validation_steps,
            callbacks, progress, jit_compile=info.plan.jit_compile, terminate_on_nan=cfg.train.terminate_on_nan,
            steps_per_execution=built.per_call, start=(start.epoch, start.step))


def evaluate_split(model: Any, dataset: Any, steps: int) -> dict[str, float]:
    """``model.evaluate`` over one pass of a pipeline: ``{loss: ..., <metric>: ...}`` as floats.

    Wraps https://keras.io/api/models/model_training_apis/#evaluate-method
    """
    result = model.evaluate(dataset, steps=steps, return_dict=True, verbose=0)
    return {k: float(v) for k, v in result.items()}


def _test(model: Any, data: Any, pipes: Any, summary: dict[str, Any], stats: Any) -> None:
    """Evaluate the test split once (``test_*`` metrics); when validation is the test split, its last figures."""
    if pipes.test is not None:
        metrics = evaluate_split(model, pipes.test, pipes.test_steps)
        summary["test_metrics"] = {f"test_{k}": v for k, v in metrics.items()}
        summary["test_metrics_from"] = f"model.evaluate on the test split ({data.test.origin})"
    elif data.validation_is_test and stats.rows:
        last = stats.rows[-1]
        summary["test_metrics"] = {f"test_{k[4:]}": v for k, v in last.items() if k.startswith("val_")}
        summary["test_metrics_from"] = "the last epoch's validation, which is the test split"


def resolve_steps_per_execution(setting: Any, steps_per_epoch: int) -> int:
    """``train.steps_per_execution`` -> training steps per ``tf.function`` call.

    The result is the smallest divisor of ``steps_per_epoch`` that is at least
    the setting (``auto``: :data:`AUTO_STEPS_PER_EXECUTION`), so every call is
    full and an epoch is exactly one pass: ``fit`` reads a repeated dataset with
    ``steps_per_epoch`` and Keras always runs whole calls, so a call that did not
    divide the epoch would run into the next one. Examples: 178 steps and ``auto``
    give 89; 6 steps give 6 (the whole epoch in one call); a prime step count
    gives the whole epoch.
    """
    wanted = AUTO_STEPS_PER_EXECUTION if setting == "auto" else int(setting)
    return next(d for d in range(min(wanted, steps_per_epoch), steps_per_epoch + 1) if steps_per_epoch % d == 0)


def _finish(summary: dict[str, Any], stats: Any, started: float, run_dir: Path, saver: Any, status: str,
            error: Optional[str] = None) -> None:
    rows = stats.rows
    if saver is not None:
        saves = saver.saves
        summary["checkpoint"].update(saves=len(saves), save_seconds_median=statistics.median(saves) if saves else None,
                                     save_seconds_max=max(saves) if saves else None)
    summary["status"] = status
    summary["epochs"] = rows
    summary["epochs_completed"] = len(rows)
    summary["wall_seconds"] = time.perf_counter() - started
    summary["first_step_seconds"] = stats.first_step_at - started if stats.first_step_at is not None else None
    summary["epoch_seconds"] = [r["epoch_seconds"] for r in rows]
    summary["train_seconds"] = [r["train_seconds"] for r in rows]
    steady = [r["samples_per_second"] for r in rows[1:]] or [r["samples_per_second"] for r in rows]
    summary["samples_per_second"] = statistics.median(steady) if steady else None
    last = rows[-1] if rows else {}
    summary["final_metrics"] = {k: v for k, v in last.items()
                                if k not in ("epoch", "epoch_seconds", "train_seconds", "samples_per_second")}
    if summary.get("test_metrics_from", "").startswith("model.evaluate"):  # not a copy of the validation figures
        summary["final_metrics"].update(summary["test_metrics"])
    if error:
        summary["error"] = error
    write_json(run_dir / "summary.json", summary)


def _restartable(outcome: Any) -> bool:
    """A failure that a restart from the checkpoint can get past: a worker killed by a signal or crashed, not one
    of tfgpu's own errors (which would happen again), a preemption or an interruption."""
    code = outcome.codes[outcome.failed]
    return not outcome.interrupted and (code < 0 or code not in (3, 4, 5, 6, 7, 8, 75, 130))


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

    Raises:
        ConfigError, DataError, OutputError: before any worker starts.
        WorkerError: a worker failed and no restart was left (or the failure
            was one a restart repeats: tfgpu's own error codes); the message
            names it, how it ended and its log (exit code: the worker's own
            tfgpu code, else 10).
        Preempted: SIGTERM reached the workers; they saved a checkpoint (75).
    """
    from .launch import Supervisor, free_ports, load_for_workers, prepare_run  # noqa: PLC0415

    extra = [f"output.dir={output_dir}"] if output_dir else []
    resume_dir = Path(resume) if resume else None
    resuming = resume_dir is not None and is_run_dir(resume_dir)
    if resuming and recipe is None:
        recipe = str(resume_dir / CONFIG_FILE)
    cfg, overrides = load_for_workers(recipe, [*overrides, *extra], workers)
    if resuming:
        load_resumed(resume_dir, recipe, overrides)  # a changed setting is refused before any worker starts
    require_model(cfg.model)
    check_parent(cfg.output.dir if resume_dir is None else str(resume_dir.parent))
    check_tensorboard(cfg.output.tensorboard)
    source_for(cfg.data, cfg.model.loss, cfg.tensorflow.seed).check()
    if resume_dir is not None:
        run_dir = open_run_dir(resume_dir)
    else:
        run_dir = create_run_dir(cfg.output.dir, cfg.output.name or (Path(recipe).stem if recipe else "run"))
    env = dict(os.environ)
    env.pop(RESUME_ENV, None)
    if resuming:
        env[RESUME_ENV] = "tfgpu run --resume"
    _say(f"{workers} workers on 127.0.0.1 (MultiWorkerMirroredStrategy); run directory {run_dir}; "
         f"worker logs in {run_dir / 'workers'}")
    attempts: list[dict[str, Any]] = []
    while True:
        children = prepare_run(recipe, overrides, workers, free_ports(workers), run_dir, env)
        supervisor = Supervisor(children)
        supervisor.start()
        attempt = {"workers": [{"index": c.index, "pid": p.pid, "exit_code": None, "log": str(c.log),
                                "TF_CONFIG": c.env["TF_CONFIG"]} for c, p in zip(children, supervisor.processes)],
                   "resumed": RESUME_ENV in env}
        attempts.append(attempt)
        _record_workers(run_dir, attempts)  # the pids, while they run
        outcome = supervisor.wait()
        for w, code in zip(attempt["workers"], outcome.codes):
            w["exit_code"] = code
        attempt.update(failed=outcome.failed, seconds=outcome.seconds)
        _record_workers(run_dir, attempts)
        for scratch in run_dir.parent.glob(f"{run_dir.name}.worker-*.tmp"):  # a killed worker could not remove its own
            shutil.rmtree(scratch, ignore_errors=True)
        if outcome.failed is None or not _restartable(outcome) or len(attempts) > max_restarts:
            break
        error = supervisor.failure(outcome, "tfgpu run --workers")
        why = error.message.split("\n")[0]
        attempt["restarted_because"] = why
        _record_workers(run_dir, attempts)
        _say(f"{why}\ntfgpu: restarting the {workers} workers from the last checkpoint "
             f"(restart {len(attempts)} of at most {max_restarts})")
        env[RESUME_ENV] = why
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"status": "failed"}
    if outcome.failed is not None:
        if all(c == 75 for c in outcome.codes):
            state = ckpt.read_state(run_dir) or {}
            raise Preempted(f"the {workers} workers saved a checkpoint at epoch {state.get('epoch', 0) + 1} step "
                            f"{state.get('step')} (global step {state.get('global_step')}) and stopped; {run_dir} "
                            "keeps the run.",
                            f"continue with 'tfgpu run --resume {run_dir} --workers {workers}' "
                            "(exit code 75 means: run this job again).")
        error = supervisor.failure(outcome, "tfgpu run --workers")
        if summary.get("status") == "running":  # the chief was stopped before it could say so
            summary.update(status="interrupted" if outcome.interrupted else "failed", error=error.message)
        summary["worker_error"] = error.message
        if len(attempts) > 1:
            summary["worker_restarts_exhausted"] = _restartable(outcome)
        if summary_path.exists() or run_dir.exists():
            write_json(summary_path, summary)
        if outcome.interrupted and outcome.exit_code == 130:
            raise Interrupted(f"interrupted; {run_dir} keeps what was written and every worker's log.",
                              f"continue with 'tfgpu run --resume {run_dir} --workers {workers}'.")
        if _restartable(outcome):
            error.hint = (f"read the worker's log for the cause; {len(attempts) - 1} restart(s) were used "
                          f"(--max-restarts {max_restarts}); continue with 'tfgpu run --resume {run_dir} "
                          f"--workers {workers}'.")
        raise error
    return RunResult(run_dir, summary)


def _record_workers(run_dir: Path, attempts: list[dict[str, Any]]) -> None:
    """``RUN_DIR/workers/workers.json``: each start of the group (pids, TF_CONFIG, exit codes, why it restarted);
    ``workers`` is the last one's."""
    write_json(run_dir / "workers" / "workers.json", {**{k: v for k, v in attempts[-1].items()},
                                                     "restarts": len(attempts) - 1, "attempts": attempts})
