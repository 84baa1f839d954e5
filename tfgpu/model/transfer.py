"""Starting from earlier weights and fine-tuning: ``model.init_from``, ``model.freeze`` and ``train.unfreeze``.

- ``model.init_from``: a run directory (its ``model.keras``), a ``.keras`` file or
  a ``.weights.h5`` file. From a ``.keras`` file the model is loaded
  (``keras.models.load_model(compile=False)``) and each of the new model's layers
  takes the weights of the source's layer of the same name when all their shapes
  agree (``layer.set_weights``); the others (a new head) keep their initial
  weights and are listed. A ``.weights.h5`` file holds no layer names (Keras
  keys its layers by class and position), so it is loaded with
  ``model.load_weights(skip_mismatch=True)`` and the layers whose weights it
  changed are the loaded ones. On ``--resume`` the run's checkpoint is restored
  after this, so it wins.
- ``model.freeze``: layer names (a name that is a layer's whole name matches that
  layer only) or name prefixes (any depth, e.g. ``conv1_`` inside a ResNet), or ``application`` (the ``model.application`` backbone):
  ``layer.trainable = False`` before the model is compiled.
- ``train.unfreeze: {epoch: N, learning_rate_factor: F}``: ``fit`` trains epochs
  ``0..N-1``, then the frozen layers become trainable again except
  ``BatchNormalization`` layers, which stay frozen and so in inference mode (Keras 3
  runs a BatchNormalization layer with ``trainable=False`` in inference mode; a
  nested ``backbone(x, training=False)``, the guide's Keras 2 recipe, is overridden
  by the outer model's ``training`` in Keras 3), the learning rate is multiplied by
  ``F`` (a new optimizer of the same class and settings) and the model is
  recompiled in the strategy's scope; ``fit`` goes on from ``initial_epoch=N`` with
  the same callbacks, so ``metrics.csv``, checkpoints and ``--resume`` see one run
  (a run resumed at or after ``N`` is unfrozen before its checkpoint is restored).
  See https://keras.io/guides/transfer_learning/.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError
from .keras_model import inner_optimizer

MODEL_FILE = "model.keras"


def source_path(value: str) -> Path:
    """``model.init_from`` -> the file to read (a run directory's ``model.keras``).

    Raises:
        ConfigError: nothing there, a run directory without ``model.keras``, or a file that is neither
            ``.keras`` nor ``.weights.h5`` (exit 3).
    """
    path = Path(value).expanduser()
    if path.is_dir():
        model = path / MODEL_FILE
        if not model.is_file():
            saved = sorted(p.name for p in path.glob("*.keras")) or sorted(p.name for p in path.glob("*.weights.h5"))
            raise ConfigError(
                f"model.init_from: {value!r} is a folder without {MODEL_FILE} (a run that saved no model: it failed, "
                "was stopped, or had output.save_model: false)"
                + (f"; it holds {', '.join(saved)}" if saved else "") + ".",
                "give a run directory that completed with output.save_model: true, or the path of a .keras or "
                ".weights.h5 file.",
            )
        return model
    if not path.is_file():
        raise ConfigError(
            f"model.init_from: {value!r}: no such file or folder ({path.resolve()}).",
            "give an earlier run's directory (RUN_DIR), its model.keras, or a .weights.h5 file.",
        )
    if not (path.name.endswith(".keras") or path.name.endswith(".weights.h5")):
        raise ConfigError(
            f"model.init_from: {value!r} is neither a .keras nor a .weights.h5 file.",
            "give an earlier run's directory, a model saved by keras.Model.save (.keras), or weights saved by "
            "keras.Model.save_weights (.weights.h5).",
        )
    return path


def frozen_something(cfg: Any) -> bool:
    """The recipe freezes layers (``model.freeze`` or ``model.application.trainable: false``)."""
    app = cfg.model.application
    return bool(cfg.model.freeze) or (app is not None and not app.trainable)


def check(cfg: Any, resuming: bool = False) -> None:
    """The checks of ``model.init_from``, ``model.freeze`` and ``train.unfreeze`` that need no TensorFlow.

    Args:
        cfg: the whole :class:`~tfgpu.config.Config`.
        resuming: ``tfgpu run --resume``: ``init_from`` is not checked (the run's checkpoint replaces it;
            a resumed run without one reports a missing source when the model is built).

    Raises:
        ConfigError: see :func:`source_path`; ``application`` frozen without ``model.application``;
            ``train.unfreeze`` with nothing frozen, at or after the last epoch, on
            the JAX backend or with a learning-rate schedule (exit 3).
    """
    if cfg.model.init_from and not resuming:
        source_path(cfg.model.init_from)
    if "application" in (cfg.model.freeze or []) and cfg.model.application is None:
        raise ConfigError(
            "model.freeze: 'application' names the model.application backbone, but the recipe has no "
            "model.application.",
            "add model.application, or freeze layers by name or name prefix.",
        )
    unfreeze = cfg.train.unfreeze
    if unfreeze is None:
        return
    if not frozen_something(cfg):
        raise ConfigError(
            f"train.unfreeze: {{epoch: {unfreeze.epoch}}} but nothing is frozen (no model.freeze, and no "
            "model.application with trainable: false).",
            "freeze layers first, e.g. model.freeze: [application], or remove train.unfreeze.",
        )
    if unfreeze.epoch >= cfg.train.epochs:
        raise ConfigError(
            f"train.unfreeze.epoch: {unfreeze.epoch} is not before the run's end (train.epochs: "
            f"{cfg.train.epochs}); epochs are counted from 0, so the second phase would never run.",
            f"set train.unfreeze.epoch between 1 and {cfg.train.epochs - 1}, or raise train.epochs.",
        )
    if getattr(cfg.train, "lr_schedule", None) is not None:
        raise ConfigError(
            "train.unfreeze with train.lr_schedule: tfgpu scales a constant learning rate at the unfreeze epoch, "
            "not a schedule.",
            "remove train.lr_schedule, or run two tfgpu runs (the second with model.init_from: FIRST_RUN_DIR).",
        )


def _all_layers(model: Any) -> list[Any]:
    """Every layer of ``model`` at any depth (``Layer._flatten_layers``), outermost first."""
    return list(model._flatten_layers(include_self=False, recursive=True))


def _applications(model: Any) -> list[Any]:
    import keras  # noqa: PLC0415

    return [layer for layer in model.layers if isinstance(layer, keras.Model)]


def freeze(model: Any, patterns: list[str], app_frozen: bool) -> list[Any]:
    """Set ``trainable = False`` on the layers ``model.freeze`` names; call before compiling.

    Args:
        model: the built model.
        patterns: layer names or name prefixes, or ``application``.
        app_frozen: ``model.application.trainable: false`` (the application counts as frozen).

    Returns:
        The layers frozen (for :func:`thaw`).

    Raises:
        ConfigError: a pattern that matches no layer, listing the model's layer names (exit 3).
    """
    frozen = [layer for layer in _applications(model)] if app_frozen else []
    layers = _all_layers(model)
    for i, pattern in enumerate(patterns):
        found = (_applications(model) if pattern == "application"
                 else [layer for layer in layers if layer.name == pattern]
                 or [layer for layer in layers if layer.name.startswith(pattern)])
        if not found:
            top = [layer.name for layer in model.layers]
            raise ConfigError(
                f"model.freeze[{i}]: {pattern!r} matches no layer name (nor the start of one) in the model "
                f"({len(layers)} layers).",
                f"use a name or prefix of a layer: the model's layers are {', '.join(top)}"
                + (" (and the application's own, e.g. "
                   + ", ".join(layer.name for layer in _all_layers(_applications(model)[0])[:8]) + ", ...)"
                   if _applications(model) else "") + "; 'application' freezes the whole backbone.",
            )
        for layer in found:
            layer.trainable = False
            if layer not in frozen:
                frozen.append(layer)
    return frozen


def thaw(frozen: list[Any]) -> None:
    """Make the frozen layers trainable again, but leave every BatchNormalization layer frozen (inference mode)."""
    import keras  # noqa: PLC0415

    for layer in frozen:
        layer.trainable = True
        for inner in [layer, *(layer._flatten_layers(include_self=False, recursive=True)
                               if hasattr(layer, "_flatten_layers") else [])]:
            if isinstance(inner, keras.layers.BatchNormalization):
                inner.trainable = False


def _shapes(layer: Any) -> list[tuple]:
    return [tuple(w.shape) for w in layer.weights]


def load_matching(model: Any, path: Path) -> tuple[list[str], list[str]]:
    """Load ``path``'s weights into the layers of ``model`` that match; see the module docstring.

    Returns:
        ``(loaded, skipped)``: the names of the model's layers (with weights) that took the source's
        weights, and of those that kept their initial ones (``name (why)``).

    Raises:
        ConfigError: the file cannot be read, or no layer matches (exit 3).
    """
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from ..errors import gist  # noqa: PLC0415

    with_weights = [layer for layer in model.layers if layer.weights]
    loaded: list[str] = []
    skipped: list[str] = []
    try:
        if path.name.endswith(".weights.h5"):
            before = [[np.array(w) for w in layer.get_weights()] for layer in with_weights]
            with warnings.catch_warnings():  # Keras warns of each object skipped; the banner lists them
                warnings.simplefilter("ignore", UserWarning)
                model.load_weights(str(path), skip_mismatch=True)
            for layer, old in zip(with_weights, before):
                new = layer.get_weights()
                changed = any(a.shape != b.shape or not np.array_equal(a, b) for a, b in zip(old, new))
                (loaded if changed else skipped).append(layer.name if changed else f"{layer.name} (no match)")
        else:
            source = keras.models.load_model(str(path), compile=False)
            by_name = {layer.name: layer for layer in source.layers}
            for layer in with_weights:
                other = by_name.get(layer.name)
                if other is None:
                    skipped.append(f"{layer.name} (not in {path.name})")
                elif _shapes(other) != _shapes(layer):
                    skipped.append(f"{layer.name} (shapes {_shapes(other)} there, {_shapes(layer)} here)")
                else:
                    layer.set_weights(other.get_weights())
                    loaded.append(layer.name)
    except ConfigError:
        raise
    except Exception as exc:  # Keras raises ValueError, OSError and others for files it cannot read
        raise ConfigError(
            f"model.init_from: {path} cannot be loaded: {type(exc).__name__}: {gist(exc)}.",
            "give a file saved by keras.Model.save (.keras) or keras.Model.save_weights (.weights.h5), with the "
            "same Keras version; a model with custom layers needs them registered.",
        ) from None
    if not loaded:
        raise ConfigError(
            f"model.init_from: no layer of this model matches {path} by name and weight shapes "
            f"(this model's layers: {', '.join(layer.name for layer in with_weights)}; "
            f"{'; '.join(skipped[:6])}).",
            "start from a run whose model shares layers with this one (the same layer names and sizes), or "
            "remove model.init_from.",
        )
    return loaded, skipped


@dataclass
class Transfer:
    """What ``init_from`` and ``freeze`` did to a model, and the unfreeze to come.

    Attributes:
        init_from: ``{path, loaded, skipped}`` or ``None``.
        frozen: the layers frozen.
        unfreeze_epoch: the epoch of ``train.unfreeze`` or ``None``.
        factor: its ``learning_rate_factor``.
        unfrozen: the unfreeze has been done (``fit`` went past it, or a resume landed after it).
    """

    init_from: Optional[dict[str, Any]] = None
    frozen: list[Any] = field(default_factory=list)
    unfreeze_epoch: Optional[int] = None
    factor: float = 1.0
    unfrozen: bool = False

    def facts(self) -> dict[str, Any]:
        """``summary.json``'s fields: ``init_from``, ``frozen_layers``, ``unfreeze``."""
        out: dict[str, Any] = {}
        if self.init_from is not None:
            out["init_from"] = self.init_from
        if self.frozen:
            out["frozen_layers"] = [layer.name for layer in self.frozen]
        if self.unfreeze_epoch is not None:
            out["unfreeze"] = {"epoch": self.unfreeze_epoch, "learning_rate_factor": self.factor}
        return out

    def banner(self) -> list[str]:
        """The lines the chief prints before training."""
        lines = []
        if self.init_from is not None:
            info = self.init_from
            lines.append(f"init_from: {info['path']}: {len(info['loaded'])} layers loaded"
                         + (f"; not loaded (initial weights): {', '.join(info['skipped'])}" if info["skipped"] else ""))
        if self.frozen:
            lines.append(f"frozen: {', '.join(layer.name for layer in self.frozen)}"
                         + (f" for the first {self.unfreeze_epoch} epoch{'s' if self.unfreeze_epoch > 1 else ''} "
                            f"(train.unfreeze: then trainable, BatchNormalization excepted, at x{self.factor:g} the "
                            "learning rate)" if self.unfreeze_epoch is not None else ""))
        return lines


def prepare(cfg: Any, model: Any, num_workers: int = 1, restoring: Optional[dict[str, Any]] = None) -> Transfer:
    """Apply ``model.init_from`` and ``model.freeze`` to a built, uncompiled model (in the strategy's scope).

    With ``restoring`` (``--resume`` of a run with a checkpoint: the run's summary so far) ``init_from``
    is not applied, as the checkpoint's weights replace the model's; the summary's ``init_from`` is kept.

    Raises:
        ConfigError: see :func:`load_matching` and :func:`freeze`; ``train.unfreeze`` on several workers.
    """
    out = Transfer()
    if restoring is not None:
        out.init_from = restoring.get("init_from")
    elif cfg.model.init_from:
        path = source_path(cfg.model.init_from)
        loaded, skipped = load_matching(model, path)
        out.init_from = {"path": str(path), "loaded": loaded, "skipped": skipped}
    app = cfg.model.application
    if frozen_something(cfg):
        out.frozen = freeze(model, list(cfg.model.freeze or []), app is not None and not app.trainable)
    if cfg.train.unfreeze is not None:
        check_workers(cfg, num_workers)
        out.unfreeze_epoch, out.factor = cfg.train.unfreeze.epoch, cfg.train.unfreeze.learning_rate_factor
    return out


def check_workers(cfg: Any, num_workers: int) -> None:
    """Refuse ``train.unfreeze`` on several workers (``tfgpu run --workers N`` checks it before any worker starts).

    Raises:
        ConfigError: ``train.unfreeze`` is set and ``num_workers`` > 1.
    """
    if cfg.train.unfreeze is not None and num_workers > 1:
        raise ConfigError(
            f"train.unfreeze: {{epoch: {cfg.train.unfreeze.epoch}, ...}} with {num_workers} workers is not "
            "supported: the second phase rebuilds the optimizer and recompiles in the middle of the run, which tfgpu "
            "does not do under MultiWorkerMirroredStrategy.",
            "train on one worker (several replicas are fine), or make two tfgpu runs (the second with "
            "model.init_from: FIRST_RUN_DIR and no model.freeze).",
        )


def stop_after(epochs: int) -> Any:
    """A Keras callback that stops ``fit`` after ``epochs`` epochs (counted from 0: the end of epoch
    ``epochs - 1``); its ``reached`` says whether it did (rather than another callback before).

    Wraps: https://keras.io/api/callbacks/base_callback/ (``model.stop_training``)
    """
    import keras  # noqa: PLC0415

    class StopAfter(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.reached = False

        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            if epoch + 1 >= epochs:
                self.reached = True
                self.model.stop_training = True

    return StopAfter()


def unfreeze(trainer: Any) -> None:
    """The second phase: thaw the frozen layers, scale the learning rate, recompile in the strategy's scope.

    Sets ``trainer.optimizer`` and ``trainer.learning_rate`` to the new ones. A new
    optimizer (same class and settings, ``learning_rate x factor``) is built, as
    the old one has no slots for the layers now trainable.

    Wraps: https://keras.io/guides/transfer_learning/ (fine-tuning),
    https://keras.io/api/models/model_training_apis/#compile-method
    """
    transfer: Transfer = trainer.transfer
    if transfer.unfrozen:
        return
    model = trainer.model
    with trainer.info.scope():
        thaw(transfer.frozen)
        old = trainer.optimizer
        inner = inner_optimizer(old)  # the custom loop's LossScaleOptimizer (mixed_float16) wraps it
        settings = inner.get_config()
        rate = float(settings["learning_rate"]) * transfer.factor
        new = type(inner).from_config({**settings, "learning_rate": rate})
        compile_args = dict(model._compile_config.config)
        compile_args["optimizer"] = new
        model.compile(**compile_args)
        if inner is not old:
            new = type(old)(new)  # fit wraps its own; the custom loop scales the loss with this one
        new.build(model.trainable_variables)
    trainer.optimizer, trainer.learning_rate = new, rate
    if trainer.files is not None:
        trainer.files.track(new)  # the custom loop's checkpoint saves the new optimizer from now on
    transfer.unfrozen = True
