"""``tfgpu run``: orchestration only (config -> setup -> data -> model -> loop -> results)."""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from .config import load_config
from .errors import Interrupted, TfgpuError, TrainingError


@dataclass(frozen=True)
class RunResult:
    """What a finished run produced.

    Attributes:
        run_dir: the run directory.
        summary: the contents of ``summary.json``.
    """

    run_dir: Path
    summary: dict[str, Any]


def _say(text: str) -> None:
    print(f"tfgpu: {text}", flush=True)


def run(recipe: Optional[str], overrides: Sequence[str] = (), output_dir: Optional[str] = None) -> RunResult:
    """Train the recipe's model and write a new run directory.

    Args:
        recipe: path of the YAML recipe (``None``: ``TFGPU_CONFIG``, else the defaults).
        overrides: ``"section.key=value"`` strings (``--set``).
        output_dir: overrides ``output.dir``.

    Returns:
        :class:`RunResult`.

    Raises:
        ConfigError, DeviceError, DataError, AlreadyInitializedError: before
            anything is written.
        TrainingError: training failed; the run directory keeps what was
            written, and ``summary.json`` says ``"status": "failed"``.
        Interrupted: Ctrl-C; likewise with ``"status": "interrupted"``.
    """
    started = time.perf_counter()
    extra = [f"output.dir={output_dir}"] if output_dir else []
    cfg = load_config(recipe, overrides=[*overrides, *extra])
    from . import setup  # noqa: PLC0415
    from .data import load_arrays, make_datasets, needs_download, sample_batch  # noqa: PLC0415
    from .model import require_model  # noqa: PLC0415
    from .results import check_parent  # noqa: PLC0415

    require_model(cfg.model)
    check_parent(cfg.output.dir)
    # Local files are read first (NumPy only), so a data error comes before TensorFlow starts.
    # The Keras download needs TensorFlow: then setup() first, as nothing may import
    # TensorFlow before the plan's environment is set.
    arrays = None if needs_download(cfg.data.path) else load_arrays(cfg.data.name, cfg.data.path)
    info = setup(cfg)
    if arrays is None:
        arrays = load_arrays(cfg.data.name, cfg.data.path)
    plan = info.plan
    for warning in plan.warnings:
        _say(f"warning: {warning}")

    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from .loops import epoch_stats_callback, progress_mode  # noqa: PLC0415
    from .model import build_model, check_fits, describe_model, gist, make_loss, make_metrics, make_optimizer  # noqa: PLC0415
    from .results import create_run_dir, replace_atomic, write_atomic, write_json  # noqa: PLC0415

    strategy = info.strategy
    replicas = info.num_replicas
    global_batch = info.global_batch_size
    loop = cfg.train.loop
    with strategy.scope():
        model = build_model(cfg.model, arrays.input_shape, arrays.num_classes)
        optimizer, learning_rate = make_optimizer(cfg.model.optimizer, plan.lr_scale)
        if loop == "fit":
            loss = make_loss(cfg.model.loss)
            metrics = make_metrics(cfg.model.metrics, cfg.model.loss)
            model.compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=cfg.tensorflow.jit_compile)
        else:
            if cfg.tensorflow.mixed_precision == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            loss = make_loss(cfg.model.loss, per_example=True)
            metrics = make_metrics(cfg.model.metrics, cfg.model.loss)
            val_metrics = make_metrics(cfg.model.metrics, cfg.model.loss, prefix="val_")
            # Compiled only so the saved model.keras can be evaluated and trained further;
            # the custom loop uses its own step, not compile's.
            model.compile(optimizer=optimizer, loss=make_loss(cfg.model.loss),
                          metrics=make_metrics(cfg.model.metrics, cfg.model.loss))

    # A loss or metric that does not fit the labels fails here, as a configuration error, before
    # anything is written, rather than inside the first training step.
    check_fits(model, cfg.model.loss, cfg.model.metrics, *sample_batch(arrays))

    train_ds, val_ds = make_datasets(arrays, global_batch, cfg.data.shuffle_buffer, cfg.tensorflow.seed, cfg.data.cache)
    samples = len(arrays.x_train)
    steps = math.ceil(samples / global_batch)

    name = cfg.output.name or (Path(recipe).stem if recipe else "run")
    run_dir = create_run_dir(cfg.output.dir, name)
    write_atomic(run_dir / "config.yaml", cfg.to_yaml())
    write_json(run_dir / "plan.json", plan.to_dict())

    jit = cfg.tensorflow.jit_compile
    summary: dict[str, Any] = {
        "status": "running",
        "recipe": str(recipe) if recipe else None,
        "run_dir": str(run_dir),
        "loop": loop,
        "versions": {"tfgpu": _version(), "tensorflow": tf.__version__, "keras": keras.__version__,
                     "python": platform.python_version()},
        "physical_devices": list(info.physical_devices),
        "logical_devices": list(info.logical_devices),
        "gpus": [g.name for g in plan.gpus],
        "strategy": type(strategy).__name__,
        "strategy_devices": list(plan.strategy.devices),
        "cross_device_ops": plan.strategy.cross_device_ops,
        "num_replicas": replicas,
        "batch_size_per_replica": plan.batch_size_per_replica,
        "global_batch_size": global_batch,
        "steps_per_epoch": steps,
        "lr_scaling": plan.lr_scaling,
        "learning_rate": learning_rate,
        "jit_compile": (jit is True) if loop == "custom" else jit,  # the custom loop: XLA only when asked
        "mixed_precision": plan.mixed_precision,
        "data": {"source": arrays.source, "train_samples": samples, "validation_samples": len(arrays.x_test)},
        "model": describe_model(model),
        "epochs_planned": cfg.train.epochs,
        "epochs": [],
        "warnings": list(plan.warnings),
    }
    write_json(run_dir / "summary.json", summary)

    _say(f"run directory {run_dir}")
    _say(f"devices: {', '.join(info.logical_devices)}")
    _say(f"strategy: {type(strategy).__name__} on {', '.join(plan.strategy.devices) or 'the default device'}"
         + (f" ({plan.strategy.cross_device_ops})" if plan.strategy.cross_device_ops else ""))
    _say(f"global batch: {plan.batch_size_per_replica} per replica x {replicas} replicas = {global_batch}; "
         f"{steps} steps per epoch; loop: {loop}; learning rate {learning_rate:g}"
         + (f" ({plan.lr_scaling} scaling)" if plan.lr_scaling != "none" else ""))

    stats = epoch_stats_callback(samples)
    callbacks = [stats, keras.callbacks.CSVLogger(str(run_dir / "metrics.csv"))]
    progress = progress_mode(cfg.train.progress)
    try:
        if loop == "fit":
            from .loops.fit import train_fit  # noqa: PLC0415

            train_fit(model, train_ds, val_ds, cfg.train.epochs, callbacks, progress, cfg.train.terminate_on_nan)
        else:
            from .loops.custom import train_custom  # noqa: PLC0415

            train_custom(strategy, model, optimizer, loss, metrics, val_metrics, train_ds, val_ds,
                         cfg.train.epochs, steps, callbacks, progress, jit_compile=jit is True,
                         terminate_on_nan=cfg.train.terminate_on_nan)
        if cfg.output.save_model:
            replace_atomic(run_dir / "model.keras", model.save, run_dir / ".model.tmp.keras",
                           "check the disk space and permissions; the run's metrics are kept.")
    except KeyboardInterrupt:
        _finish(summary, stats.rows, "interrupted", started, run_dir)
        raise Interrupted(
            f"interrupted after {len(stats.rows)} of {cfg.train.epochs} epochs; {run_dir} keeps the config, "
            "the metrics of the finished epochs and summary.json.",
            "run again to train from the start.",
        ) from None
    except TfgpuError as exc:
        _finish(summary, stats.rows, "failed", started, run_dir, str(exc))
        raise
    except Exception as exc:  # TensorFlow's errors (OOM, bad shapes, ...) during training
        _finish(summary, stats.rows, "failed", started, run_dir, f"{type(exc).__name__}: {exc}")
        raise TrainingError(
            f"training failed in epoch {len(stats.rows) + 1}: {type(exc).__name__}: {gist(exc)}.",
            f"{run_dir} keeps what was written; run with --debug for the traceback.",
        ) from exc
    _finish(summary, stats.rows, "completed", started, run_dir)
    final = summary["final_metrics"]
    _say(f"done in {summary['wall_seconds']:.1f}s: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items())
         + f"; {run_dir}")
    return RunResult(run_dir, summary)


def _finish(summary: dict[str, Any], rows: list[dict[str, float]], status: str, started: float,
            run_dir: Path, error: Optional[str] = None) -> None:
    from .results import write_json  # noqa: PLC0415

    summary["status"] = status
    summary["epochs"] = rows
    summary["epochs_completed"] = len(rows)
    summary["wall_seconds"] = time.perf_counter() - started
    summary["epoch_seconds"] = [r["epoch_seconds"] for r in rows]
    steady = [r["samples_per_second"] for r in rows[1:]] or [r["samples_per_second"] for r in rows]
    summary["samples_per_second"] = sorted(steady)[len(steady) // 2] if steady else None
    last = rows[-1] if rows else {}
    summary["final_metrics"] = {k: v for k, v in last.items()
                                if k not in ("epoch", "epoch_seconds", "samples_per_second")}
    if error:
        summary["error"] = error
    write_json(run_dir / "summary.json", summary)


def _version() -> str:
    from . import __version__  # noqa: PLC0415

    return __version__
