"""What ``tfgpu plan`` and ``tfgpu run`` check before TensorFlow starts, and the plan's summary of the run.

:func:`check` is the one pre-flight check both commands call, so ``tfgpu plan
RECIPE`` fails with the same message and exit code as ``tfgpu run RECIPE``
would: a model is defined and its layer, optimizer, metric and loss names exist
(read from Keras's package files, :mod:`tfgpu.utils.keras_names`), a
``model.builder``'s module can be found, a run directory can be created under
``output.dir``, TensorBoard and MLflow are installed where asked for, an MLflow
tracking server answers (:func:`tfgpu.tracking.mlflow.check`), and the data source's
local files are there and readable (NumPy and Pillow only). Nothing is written
and neither TensorFlow nor Keras is imported. :func:`describe_run` says what the
run will do (data, model, loss, optimizer, epochs, loop, batch).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from ..config import Config
from ..data import Source, source_for
from ..errors import ConfigError
from ..model import backbone, transfer
from ..model.keras_model import check_names, require_model
from ..model.schedules import check_optimizer_rate, for_plan
from ..tracking import mlflow as tracking
from ..utils.imports import find_module
from .callbacks import check as check_callbacks
from . import ema
from .loops import gradients, remat
from .layout import check_parent, check_tensorboard


def check(cfg: Config, target: Optional[Path] = None, files: bool = True,
          keep: bool = True) -> tuple[Optional[Source], float]:
    """Every check of the recipe that needs no TensorFlow, in the order ``tfgpu run`` meets them.

    Args:
        cfg: the resolved config.
        target: the ``--resume`` directory (its parent is checked instead of ``output.dir``), or ``None``.
        files: check the output folder and the local data files (``False``: ``tfgpu plan --machine``,
            planning for another machine's files).
        keep: keep the data read for loading (``False``: ``tfgpu plan``: the same checks, as cheaply as the
            files allow, :meth:`tfgpu.data.base.Source.check`).

    Returns:
        ``(source, seconds)``: the data source, checked and ready to load
        (:func:`tfgpu.data.load`), and the seconds its file check took;
        ``(None, 0.0)`` with ``files=False``.

    Raises:
        ConfigError: no model, an unknown Keras name (with the closest one), a
            ``model.builder`` module that cannot be found, a ``train.callbacks``
            name or module that is not there (:func:`tfgpu.training.callbacks.check`), or TensorBoard
            or MLflow wanted but not installed (exit 3).
        TrackingError: ``output.mlflow``'s tracking server cannot be reached (11; with
            ``required: false`` a warning, :func:`tfgpu.tracking.mlflow.check`).
        OutputError: no run directory can be created under ``output.dir`` (8).
        DataError: a local data file or folder is missing, unreadable or malformed (5).
    """
    require_model(cfg.model)
    check_names(cfg.model)
    check_optimizer_rate(cfg.model.optimizer, cfg.train.lr_schedule)  # learning_rate: {CosineDecay: {...}}
    backbone.check(cfg)  # model.application: the name, a weights file
    transfer.check(cfg, resuming=target is not None)  # model.init_from (a run with a model), model.freeze, train.unfreeze
    if cfg.model.builder:
        find_module(cfg.model.builder, "model.builder", ConfigError)
    check_callbacks(cfg)
    gradients.check(cfg)  # train.gradient_accumulation_steps and gradient_clipping against the backend and optimizer
    ema.check(cfg)  # train.ema against restore_best_weights and the optimizer's own use_ema
    remat.check(cfg)  # model.remat against the backend
    _check_limits(cfg)
    if files:
        check_parent(cfg.output.dir if target is None else str(target.parent))
    check_tensorboard(cfg.output.tensorboard)
    tracking.check(cfg, contact=files)  # output.mlflow: the mlflow package; a tracking server answers (this machine)
    if not files:
        return None, 0.0
    source = source_for(cfg.data, cfg.model.loss, cfg.tensorflow.seed)
    checked = time.perf_counter()
    source.check(keep)  # local files, NumPy only: a data error comes before TensorFlow starts
    return source, time.perf_counter() - checked


def _check_limits(cfg: Config) -> None:
    """``train.max_time`` needs checkpoints (the run stops to be resumed); ``train.steps_per_epoch`` cannot cut a
    training split cached in a file (tf.data keeps a file cache only once a pass has read it all).

    Raises:
        ConfigError: either.
    """
    train = cfg.train
    if train.max_time is not None and not train.checkpoint.enabled:
        raise ConfigError(
            f"train.max_time: {train.max_time:g} s stops the run to be resumed, and train.checkpoint is off, so "
            "nothing would be kept to resume from.",
            "set train.checkpoint: true, or remove train.max_time.")
    if train.steps_per_epoch is not None and isinstance(cfg.data.cache, str):
        raise ConfigError(
            f"train.steps_per_epoch: {train.steps_per_epoch} reads part of each epoch, and data.cache: "
            f"{cfg.data.cache} caches the training split in a file, which tf.data keeps only once a pass has read "
            "it all.", "set data.cache: true (memory) or false while the epochs are cut, or remove "
            "train.steps_per_epoch.")


def _spec(spec: Any) -> str:
    """``adam`` or ``{name: adam, learning_rate: 0.01}`` -> ``adam`` / ``adam (learning_rate=0.01)``."""
    if not isinstance(spec, dict):
        return str(spec)
    args = ", ".join(f"{k}={v!r}" for k, v in spec.items() if k != "name")
    return f"{spec['name']} ({args})" if args else str(spec["name"])


def _layer_name(item: Any) -> str:
    return item if isinstance(item, str) else next(iter(item))


def describe_run(cfg: Config, plan: Any) -> dict[str, Any]:
    """What ``tfgpu run`` would train, as JSON-ready data (``tfgpu plan --json``'s ``"run"``).

    Args:
        cfg: the resolved config.
        plan: its :class:`~tfgpu.devices.plan_base.Plan` (replicas and batch sizes).

    Returns:
        ``{"data": {...}, "model": {...}, "train": {...}}``: the data kind, its
        path (or dataset name), validation and test splits; the layer class
        names or the builder, loss, optimizer and metrics; epochs, loop, and
        the batch per replica and global (samples per step).
    """
    d, m, t = cfg.data, cfg.model, cfg.train
    data: dict[str, Any] = {"kind": d.kind}
    if d.kind in ("mnist", "keras"):
        data["dataset"] = d.dataset_name
    elif d.name:
        data["name"] = d.name
    if d.builder:
        data["builder"] = d.builder
    data.update({k: v for k, v in (("path", d.path), ("label", d.label), ("validation_path", d.validation_path),
                                   ("validation_split", d.validation_split), ("test_path", d.test_path))
                 if v is not None})
    model: dict[str, Any] = ({"builder": m.builder, "builder_args": m.builder_args} if m.builder
                             else {"layers": [_layer_name(x) for x in m.layers or []]})
    if m.application is not None:  # tfgpu.model.backbone: the application, then the head
        model["application"] = {"name": m.application.name, "weights": m.application.weights}
    model.update({k: v for k, v in (("init_from", m.init_from), ("freeze", m.freeze)) if v})
    if m.remat is not None:  # tfgpu.training.loops.remat: the segments are counted when the model is built
        model["remat"] = m.remat.model_dump()
    model.update(loss=m.loss, optimizer=m.optimizer, metrics=list(m.metrics))
    train = {"epochs": t.epochs, "loop": t.loop, "batch_size_per_replica": plan.batch_size_per_replica,
             "gradient_accumulation_steps": t.gradient_accumulation_steps,
             "num_replicas": plan.num_replicas, "global_batch_size": plan.global_batch_size}
    train["lr_schedule"] = for_plan(t.lr_schedule, m.optimizer, plan.lr_scale, t.epochs)
    if t.lr_schedule is None and plan.lr_scale > 1:
        train["lr_schedule"] = {"name": None,
                                "line": f"learning rate: constant x{plan.lr_scale:g} from the first step, no warmup"
                                " (train.lr_schedule: constant warms up from the unscaled rate, as Goyal et al. 2017 "
                                "advise for a scaled rate)"}
    if d.augment:  # tfgpu.data.augment
        data["augment"] = {"layers": [_layer_name(x) for x in d.augment], "on": d.augment_on}
    if t.class_weight is not None:  # tfgpu.data.weights
        train["class_weight"] = t.class_weight
    if d.sample_weight is not None or "sample_weight" in d.keys:  # csv column / arrays key (Split.w)
        data["sample_weight"] = (f"column '{d.sample_weight}'" if d.sample_weight is not None
                                 else f"array '{d.keys['sample_weight']}'")
    if t.early_stopping is not None:  # tfgpu.training.callbacks
        train["early_stopping"] = t.early_stopping.model_dump()
    if t.callbacks:
        train["callbacks"] = [_layer_name(x) for x in t.callbacks]
    if t.unfreeze is not None:  # tfgpu.model.transfer
        train["unfreeze"] = t.unfreeze.model_dump()
    return {"data": data, "model": model, "train": train}


def describe_lines(run: dict[str, Any]) -> list[str]:
    """:func:`describe_run`'s data as the lines ``tfgpu plan`` prints first."""
    data, model, train = run["data"], run["model"], run["train"]
    where = " ".join(str(data[k]) for k in ("name", "builder", "path") if data.get(k))
    if data.get("dataset"):  # (a Keras built-in: tfgpu.data.keras_datasets)
        where = f"keras.datasets.{data['dataset']} ($TFGPU_DATA_DIR/{data['dataset']} if it is there, else Keras's download)"
    label = f" (label: {data['label']})" if data.get("label") else ""
    if data.get("validation_path"):
        validation = data["validation_path"]
    elif data.get("validation_split"):
        validation = f"{data['validation_split']:.0%} of the training samples (data.validation_split)"
    else:
        validation = "the source's own validation split, if any"
    layers = (f"builder {model['builder']}" if model.get("builder")
              else f"{len(model['layers'])} layers: {', '.join(model['layers'])}")
    if model.get("application"):
        app = model["application"]
        layers = (f"keras.applications.{app['name']} (weights: {app['weights']}), then "
                  + (f"the head: {', '.join(model['layers'])}" if model["layers"] else "a Dense head that fits the data"))
    if model.get("init_from") or model.get("freeze"):
        layers += "".join(f"; {k}: {model[k]}" for k in ("init_from", "freeze") if model.get(k))
    if model.get("remat"):
        segments = model["remat"]["segments"]
        layers += (f"; remat: {segments if segments else 'about the square root of the places to cut,'} segments "
                   "recomputed in the backward pass")
    metrics = ", ".join(_spec(x) for x in model["metrics"]) or "none"
    replicas = train["num_replicas"]
    return [
        "Run (what 'tfgpu run' would train; the checks before TensorFlow starts passed):",
        f"  data: {data['kind']} {where}{label}".rstrip(),
        f"  validation: {validation}; test: {data.get('test_path') or 'none'}",
        f"  model: {layers}",
        f"  loss: {_spec(model['loss'])}; optimizer: {_spec(model['optimizer'])}; metrics: {metrics}",
        f"  epochs: {train['epochs']}; loop: {train['loop']}; batch: "
        + (f"{train['batch_size_per_replica']} per replica x {replicas} replica{'s' if replicas != 1 else ''} = "
           f"{train['global_batch_size']} global" if train['batch_size_per_replica'] else
           "auto per replica (found when the run starts)")
        + (f" x {train['gradient_accumulation_steps']} accumulation steps" if train.get(
            "gradient_accumulation_steps", 1) > 1 else ""),
        *([f"  {train['lr_schedule']['line']}"] if train.get("lr_schedule") else []),
        *_training_lines(data, train),
    ]


def _training_lines(data: dict[str, Any], train: dict[str, Any]) -> list[str]:
    """The run block's lines for augmentation, class weights, early stopping, callbacks and the unfreeze."""
    lines = []
    if data.get("augment"):
        aug = data["augment"]
        lines.append(f"  augmentation: {', '.join(aug['layers'])} on training batches only, "
                     + ("in the tf.data pipeline (CPU)" if aug["on"] == "pipeline" else "in the model"))
    if train.get("class_weight") is not None:
        lines.append(f"  class weights: {train['class_weight']} (training loss only)")
    if data.get("sample_weight"):
        lines.append(f"  sample weights: {data['sample_weight']} (training loss only"
                     + (", times the class weights)" if train.get("class_weight") is not None else ")"))
    if train.get("early_stopping"):
        es = train["early_stopping"]
        lines.append(f"  early stopping: {es['monitor']} ({es['mode']}), patience {es['patience']}"
                     + (", the best epoch's weights kept" if es.get("restore_best_weights") else ""))
    if train.get("callbacks"):
        lines.append(f"  callbacks: {', '.join(train['callbacks'])}")
    if train.get("unfreeze"):
        uf = train["unfreeze"]
        lines.append(f"  unfreeze: at epoch {uf['epoch']}, learning rate x{uf['learning_rate_factor']:g}")
    return lines
