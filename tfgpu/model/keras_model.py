"""``model:`` section -> Keras model, optimizer, loss and metrics.

Layers, optimizers, losses and metrics are named by Keras's own class names
(``Conv2D``, ``Adam``, ``SparseCategoricalCrossentropy``) or their snake_case
forms (``adam``, ``sparse_categorical_crossentropy``), with arguments as a
mapping. Unknown names raise :class:`~tfgpu.errors.ConfigError` with the
closest Keras name.
"""

from __future__ import annotations

import difflib
import inspect
import math
from dataclasses import dataclass
from typing import Any, Optional

from ..config import ModelConfig
from ..errors import ConfigError, gist
from ..utils.imports import import_function, keyword_arguments
from ..utils.keras_names import name_table, snake


def _keras() -> Any:
    import keras  # noqa: PLC0415

    return keras


def imported_names(kind: str, module: Any, base: type) -> dict[str, str]:
    """:func:`tfgpu.utils.keras_names.name_table` of the classes an imported Keras module exports that subclass ``base``."""
    return name_table(kind, [attr for attr in dir(module) if inspect.isclass(obj := getattr(module, attr))
                             and issubclass(obj, base) and obj is not base])


def file_names(kind: str) -> Optional[dict[str, str]]:
    """:func:`tfgpu.utils.keras_names.name_table` of the classes Keras's package files export (no import), or
    ``None`` where they cannot be read (:func:`tfgpu.utils.keras_names.class_names`)."""
    from ..utils.keras_names import class_names  # noqa: PLC0415

    classes = class_names(kind)
    return None if classes is None else name_table(kind, classes)


def _split_spec(spec: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(spec, str):
        return spec, {}
    args = dict(spec)
    return args.pop("name"), args


_MODULES = {"layer": "keras.layers", "optimizer": "keras.optimizers", "loss": "keras.losses", "metric": "keras.metrics"}
_COMMON = {
    "layer": ["Conv2D", "MaxPooling2D", "Flatten", "Dense", "Dropout", "BatchNormalization"],
    "optimizer": ["adam", "sgd", "rmsprop", "adamw"],
    "loss": ["sparse_categorical_crossentropy", "categorical_crossentropy"],
    "metric": ["accuracy", "sparse_top_k_categorical_accuracy"],
}


def _unknown(key: str, kind: str, name: str, table: dict[str, Any]) -> ConfigError:
    close = difflib.get_close_matches(name, list(table), n=1, cutoff=0.6)
    guess = f" Did you mean '{close[0]}'?" if close else ""
    common = [n for n in _COMMON[kind] if n in table or n == "accuracy"]
    return ConfigError(
        f"{key}: '{name}' is not a Keras {kind}.{guess}",
        f"use a class name from {_MODULES[kind]} "
        + ("as Keras spells it (Conv2D, not conv2d)" if kind == "layer" else "(or its snake_case form)")
        + f", e.g. {', '.join(common)}.",
    )


#: Keras's short names for losses and metrics (``keras.losses.get("mse")``), by the class's snake_case name.
ALIASES = {"mse": "mean_squared_error", "mae": "mean_absolute_error", "mape": "mean_absolute_percentage_error",
           "msle": "mean_squared_logarithmic_error", "logcosh": "log_cosh", "kld": "kl_divergence",
           "rmse": "root_mean_squared_error"}


def lookup(key: str, kind: str, name: str, table: dict[str, str]) -> str:
    """The exported class name ``name`` spells in ``table`` (:func:`tfgpu.utils.keras_names.name_table`); aliases
    (``mse``) spelled out.

    Raises:
        ConfigError: no such name, with the closest one (``Did you mean 'Dense'?``).
    """
    if kind in ("loss", "metric"):
        name = ALIASES.get(name.lower(), name)
    found = table.get(name) if kind == "layer" else table.get(name) or table.get(name.lower())
    if found is None:
        raise _unknown(key, kind, name, table)
    return found


def _resolve(key: str, kind: str, spec: Any, module: Any, base: type) -> tuple[type, dict[str, Any]]:
    """A spec (name or mapping) -> the Keras class it names, and its arguments."""
    name, args = _split_spec(spec)
    return getattr(module, lookup(key, kind, name, imported_names(kind, module, base))), args


def _construct(key: str, cls: type, args: dict[str, Any]) -> Any:
    try:
        return cls(**args)
    except Exception as exc:  # Keras raises TypeError, ValueError and others for bad arguments
        raise ConfigError(
            f"{key}: {cls.__name__}({', '.join(f'{k}={v!r}' for k, v in args.items())}) failed: {gist(exc)}.",
            f"check the arguments against https://keras.io/api/ for {cls.__name__}.",
        ) from None


def inner_optimizer(optimizer: Any) -> Any:
    """The optimizer that holds the learning rate, the EMA and the clipping settings: ``optimizer`` itself, or the
    one a ``keras.optimizers.LossScaleOptimizer`` wraps (the custom loop's, under ``mixed_float16``).

    Wraps: https://keras.io/api/mixed_precision/loss_scale_optimizer/
    """
    return getattr(optimizer, "inner_optimizer", optimizer)


def make_optimizer(spec: Any, lr_scale: float = 1.0, lr_schedule: Optional[dict[str, Any]] = None,
                   steps: tuple[int, int] = (1, 1)) -> tuple[Any, float]:
    """Build the optimizer; scale its learning rate by ``lr_scale``; give it ``train.lr_schedule``.

    Args:
        spec: ``model.optimizer``. Its ``learning_rate`` may also be a Keras
            schedule by class name, ``{CosineDecay: {initial_learning_rate: ..,
            decay_steps: ..}}`` (used as given: no scaling, no ``train.lr_schedule``).
        lr_scale: the ``train.lr_scaling`` factor.
        lr_schedule: ``train.lr_schedule`` as the schema checked it, or ``None`` (a constant rate).
        steps: ``(epochs, steps_per_epoch)``: the run's length, which the schedule spans.

    Returns:
        ``(optimizer, learning_rate)``; the rate is the scaled float value (a
        schedule's peak), ``nan`` for a user's own schedule.

    Raises:
        ConfigError: unknown optimizer or schedule, bad arguments, or scaling
            or ``train.lr_schedule`` asked for a schedule given in ``model.optimizer``.

    Wraps: https://keras.io/api/optimizers/ and https://keras.io/api/optimizers/learning_rate_schedules/
    """
    keras = _keras()
    cls, args = _resolve("model.optimizer", "optimizer", spec, keras.optimizers, keras.optimizers.Optimizer)
    base = args.get("learning_rate")
    if base is None:
        param = inspect.signature(cls).parameters.get("learning_rate")
        if param is None or param.default is inspect.Parameter.empty:
            return _construct("model.optimizer", cls, args), float("nan")
        base = param.default
    if isinstance(base, bool) or (isinstance(base, (int, float)) and not base > 0):
        raise ConfigError(
            f"model.optimizer: learning_rate must be a number > 0. Received: {base!r}.",
            "set e.g. learning_rate: 0.001.",
        )
    if isinstance(base, str):
        try:
            float(base)
        except ValueError:
            pass
        else:
            raise ConfigError(
                f"model.optimizer: learning_rate {base!r} was read as text, not a number: YAML 1.1 reads "
                "a number with an exponent only when it has a dot and a signed exponent.",
                f"write {float(base)!r}, or with a dot and a sign, e.g. 1.0e-3 or 1.0e+2.",
            )
    if not isinstance(base, (int, float)):
        if lr_scale != 1.0 or lr_schedule is not None:
            raise ConfigError(
                "model.optimizer: the learning rate is a schedule, which tfgpu cannot scale"
                + (" (train.lr_scaling)" if lr_scale != 1.0 else "") + " or combine with train.lr_schedule.",
                "give model.optimizer a number as learning_rate and the schedule as train.lr_schedule "
                "(e.g. {name: cosine, warmup_epochs: 2}), which scales and warms it up; or set "
                "train.lr_scaling: none and remove train.lr_schedule.",
            )
        if isinstance(base, dict) and len(base) == 1:  # {CosineDecay: {...}}: a Keras schedule by class name
            from ..config.keras_specs import class_of  # noqa: PLC0415

            (name, sargs), = base.items()
            try:
                sname = class_of(str(name))
            except ValueError as exc:
                raise ConfigError(f"model.optimizer: learning_rate: {exc}.",
                                  "name a keras.optimizers.schedules class, e.g. {CosineDecay: "
                                  "{initial_learning_rate: 0.001, decay_steps: 1000}}.") from None
            if sname is None or not isinstance(sargs, dict):
                raise ConfigError(f"model.optimizer: learning_rate: {{{name}: ...}} is not a Keras schedule with "
                                  "its arguments.", "write e.g. {CosineDecay: {initial_learning_rate: 0.001, "
                                  "decay_steps: 1000}}, or use train.lr_schedule.")
            schedule = _construct("model.optimizer.learning_rate",
                                  getattr(keras.optimizers.schedules, sname), dict(sargs))
            return _construct("model.optimizer", cls, {**args, "learning_rate": schedule}), float("nan")
        return _construct("model.optimizer", cls, args), float("nan")
    rate = float(base) * lr_scale
    if lr_schedule is not None:
        from .schedules import keras_schedule, resolve  # noqa: PLC0415

        sched = resolve(lr_schedule, float(base), lr_scale, *steps)
        return _construct("model.optimizer", cls, {**args, "learning_rate": keras_schedule(sched)}), rate
    return _construct("model.optimizer", cls, {**args, "learning_rate": rate}), rate


def loss_name(spec: Any) -> str:
    """The snake_case name of a loss spec, aliases spelled out (``"mse"`` -> ``"mean_squared_error"``)."""
    name = snake(_split_spec(spec)[0]) if isinstance(spec, (str, dict)) and _split_spec(spec)[0] else ""
    return ALIASES.get(name, name)


#: Losses that train on values (regression), and those that take one probability per sample for two classes.
REGRESSION_LOSSES = ("mean_squared_error", "mean_absolute_error", "mean_absolute_percentage_error",
                     "mean_squared_logarithmic_error", "huber", "log_cosh", "cosine_similarity", "poisson")
BINARY_LOSSES = ("binary_crossentropy", "binary_focal_crossentropy", "hinge", "squared_hinge")


def loss_family(spec: Any) -> str:
    """``model.loss`` -> ``"regression"`` (mse, mae, ...), ``"binary"`` (binary_crossentropy, ...) or ``"classes"``."""
    name = loss_name(spec)
    return "regression" if name in REGRESSION_LOSSES else "binary" if name in BINARY_LOSSES else "classes"


def make_loss(spec: Any, per_example: bool = False) -> Any:
    """Build the loss as a ``keras.losses.Loss`` instance.

    Args:
        spec: name or mapping from ``model.loss``.
        per_example: no reduction (``reduction=None``): the loss returns one
            value per example, shape ``(batch,)``, for the custom loop.

    Raises:
        ConfigError: unknown loss or bad arguments.
    """
    keras = _keras()
    cls, args = _resolve("model.loss", "loss", spec, keras.losses, keras.losses.Loss)
    if per_example:
        args = {**args, "reduction": None}
    return _construct("model.loss", cls, args)


def make_metrics(specs: list[Any], loss: Any, prefix: str = "") -> list[Any]:
    """Build metric objects; ``accuracy``/``acc`` picks the variant that fits the loss.

    Args:
        specs: ``model.metrics``.
        loss: ``model.loss`` (decides what ``accuracy`` means).
        prefix: prepended to each metric's name (``"val_"`` for validation).

    Raises:
        ConfigError: unknown metric or bad arguments.
    """
    keras = _keras()
    lname = loss_name(loss)
    out = []
    for i, spec in enumerate(specs):
        name, args = _split_spec(spec)
        if name in ("accuracy", "acc"):
            if "sparse_categorical" in lname:
                cls = keras.metrics.SparseCategoricalAccuracy
            elif "categorical" in lname:
                cls = keras.metrics.CategoricalAccuracy
            elif "binary" in lname:
                cls = keras.metrics.BinaryAccuracy
            else:
                cls = keras.metrics.Accuracy
            args = {"name": name, **args}
        else:
            cls, args = _resolve(f"model.metrics[{i}]", "metric", spec, keras.metrics, keras.metrics.Metric)
        metric = _construct(f"model.metrics[{i}]", cls, args)
        if prefix:
            metric = _construct(f"model.metrics[{i}]", cls, {**args, "name": prefix + metric.name})
        out.append(metric)
    return out


def _layer_spec(item: Any) -> tuple[str, dict[str, Any]]:
    """A ``model.layers`` item (``Name`` or ``{Name: {args}}``) -> ``(name, args)``."""
    if isinstance(item, str):
        return item, {}
    (name, args), = item.items()
    return name, dict(args or {})


def _layer(i: int, item: Any) -> Any:
    keras = _keras()
    name, args = _layer_spec(item)
    cls = getattr(keras.layers, lookup(f"model.layers[{i}]", "layer", name,
                                       imported_names("layer", keras.layers, keras.layers.Layer)))
    return _construct(f"model.layers[{i}] ({name})", cls, args)


def check_names(cfg: ModelConfig) -> None:
    """Check, without importing Keras, that the model's layer, optimizer, metric and loss names exist.

    The same names and the same messages as building them (:func:`build_model`,
    :func:`make_optimizer`, :func:`make_metrics`, :func:`make_loss`), in the
    order the build meets them; names are read from Keras's package files
    (:func:`file_names`). Where those cannot be read, nothing is checked (the build still is).

    Raises:
        ConfigError: an unknown name, with the closest Keras name.
    """
    def check(key: str, kind: str, name: str) -> None:
        table = file_names(kind)
        if table is not None:
            lookup(key, kind, name, table)

    if not cfg.builder:
        for i, item in enumerate(cfg.layers or []):
            check(f"model.layers[{i}]", "layer", _layer_spec(item)[0])
    check("model.optimizer", "optimizer", _split_spec(cfg.optimizer)[0])
    for i, spec in enumerate(cfg.metrics):
        name = _split_spec(spec)[0]
        if name not in ("accuracy", "acc"):
            check(f"model.metrics[{i}]", "metric", name)
    check("model.loss", "loss", _split_spec(cfg.loss)[0])


def _from_builder(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> Any:
    keras = _keras()
    func = import_function(cfg.builder, "model.builder", ConfigError, "a keras.Model")
    kwargs = keyword_arguments(func, {"input_shape": input_shape, "num_classes": num_classes}, cfg.builder_args)
    try:
        model = func(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"model.builder: {cfg.builder}(**{kwargs}) failed: {gist(exc)}.",
                          "match model.builder_args to the function's parameters.") from None
    except SystemExit as exc:  # sys.exit() in a builder must not end tfgpu silently
        raise ConfigError(
            f"model.builder: {cfg.builder}(**{kwargs}) called sys.exit({exc.code!r}) instead of returning a model.",
            "return a keras.Model from the function; raise an exception to report a problem.",
        ) from None
    except Exception as exc:  # the builder's own error
        raise ConfigError(
            f"model.builder: {cfg.builder}(**{kwargs}) raised {type(exc).__name__}: {gist(exc)}.",
            "fix the builder function or model.builder_args (run with --debug for the traceback).",
        ) from exc
    if not isinstance(model, keras.Model):
        raise ConfigError(
            f"model.builder: {cfg.builder} returned {type(model).__name__}, not a keras.Model.",
            "return a keras.Model (keras.Sequential or the functional API) from the function.",
        )
    return model


def require_model(cfg: ModelConfig) -> None:
    """Raise :class:`ConfigError` unless the recipe defines a model (imports no Keras)."""
    if not cfg.defined:
        raise ConfigError(
            "model: the recipe defines no model (neither model.layers nor model.builder is set).",
            "add model.layers (a list of Keras layers) or model.builder ('module:function'); a config of device "
            "settings for your own script (tfgpu.setup() or tfgpu launch, e.g. recipes/gpu.yaml) needs no model: "
            "check it with 'tfgpu plan CONFIG --launch'.",
        )


@dataclass(frozen=True)
class Target:
    """What the model's output must be for the data and the loss.

    Attributes:
        units: values per sample in the output, ``(batch, units)``.
        num_classes: what a model builder gets as ``num_classes``: the classes
            (classification) or the values per target (regression).
        what: the data's side, in words (``the data has 10 classes``).
        layer: a last layer that fits, in recipe syntax.
    """

    units: int
    num_classes: int
    what: str
    layer: str


def target_of(task: str, num_classes: Optional[int], target_shape: tuple[int, ...], loss: Any) -> Target:
    """What the model must output for the labels and ``model.loss``.

    Classification: ``num_classes`` values per sample, or 1 with a binary loss
    (``binary_crossentropy``, ...) on two classes; regression: the target's
    size (1 for a scalar).
    """
    if task == "regression":
        units = int(math.prod(target_shape)) if target_shape else 1
        plural = "s" if units != 1 else ""
        return Target(units, units, f"the targets have {units} value{plural} per sample",
                      f"Dense: {{units: {units}}} (no activation)")
    classes = int(num_classes or 2)
    if loss_family(loss) == "binary" and classes == 2:
        return Target(1, classes,
                      f"the data has 2 classes and the loss '{_split_spec(loss)[0]}' takes one "
                      "probability per sample", "Dense: {units: 1, activation: sigmoid}")
    return Target(classes, classes, f"the data has {classes} classes",
                  f"Dense: {{units: {classes}, activation: softmax}}")


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], target: Target,
                normalization: Optional[tuple[Any, Any]] = None, pixel_factor: float = 255.0,
                augment_layers: Optional[list] = None) -> Any:
    """Build the (uncompiled) Keras model; call inside ``strategy.scope()``.

    Args:
        cfg: the ``model`` section.
        input_shape: one sample's shape, e.g. ``(28, 28, 1)``.
        target: what the output must be (:func:`target_of`).
        normalization: ``(mean, variance)`` per feature (the last input axis):
            a ``keras.layers.Normalization`` with them is put at the model's
            input (``data.normalize``), so the saved model takes raw features.
        pixel_factor: with ``model.application``: the factor that brings the
            inputs back to pixels in [0, 255] (:func:`tfgpu.model.backbone.pixel_factor`).
        augment_layers: ``data.augment`` with ``augment_on: model`` (:func:`tfgpu.data.augment.model_layers`):
            put before the model (a functional model wrapping it), active in training only.

    Returns:
        A ``keras.Model`` mapping float32 ``(batch, *input_shape)`` to
        ``(batch, target.units)``.

    Raises:
        ConfigError: no model defined, an unknown layer or bad arguments, a
            builder that fails or returns no model, or an output shape that
            does not fit the data.

    Wraps: https://keras.io/api/layers/preprocessing_layers/numerical/normalization/
    """
    keras = _keras()
    require_model(cfg)
    if augment_layers:  # data.augment, augment_on: model: the layers, then the model built for their output
        inputs = x = keras.Input(shape=input_shape)
        for layer in augment_layers:
            x = layer(x)
        inner = build_model(cfg, tuple(x.shape[1:]), target, normalization, pixel_factor)
        return keras.Model(inputs, inner(x), name=inner.name)
    units = target.units
    norm = (keras.layers.Normalization(axis=-1, mean=normalization[0], variance=normalization[1], name="normalize")
            if normalization is not None else None)
    if cfg.application is not None:  # tfgpu.model.backbone: the application, then model.layers as the head
        from .backbone import build as build_backbone, head_layer  # noqa: PLC0415

        inputs, x = build_backbone(cfg.application, input_shape, pixel_factor)
        head = ([_layer(i, item) for i, item in enumerate(cfg.layers)] if cfg.layers is not None
                else [head_layer(keras, target, loss_family(cfg.loss))])
        try:
            for layer in head:
                x = layer(x)
        except Exception as exc:  # Keras raises ValueError and others for shapes that do not fit
            raise ConfigError(
                f"model.layers: the head does not fit the {cfg.application.name} features of shape "
                f"{tuple(x.shape)}: {gist(exc)}.",
                "with application.pooling: null the features are a feature map: add Flatten or "
                "GlobalAveragePooling2D before Dense.",
            ) from None
        model = keras.Model(inputs, x, name=f"{cfg.application.name.lower()}_transfer")
    elif cfg.builder:
        model = _from_builder(cfg, input_shape, target.num_classes)
        if norm is not None:
            inputs = keras.Input(shape=input_shape)
            model = keras.Model(inputs, model(norm(inputs)), name=model.name)
    else:
        layers = [_layer(i, item) for i, item in enumerate(cfg.layers)]
        try:
            model = keras.Sequential([keras.Input(shape=input_shape), *([norm] if norm is not None else []), *layers])
        except Exception as exc:  # Keras raises ValueError, TypeError and others for shapes that do not fit
            raise ConfigError(
                f"model.layers: the layers do not fit inputs of shape {input_shape}: {gist(exc)}.",
                "check each layer's expected input rank (e.g. add Flatten before Dense).",
            ) from None
    try:
        out = model.output_shape
    except Exception as exc:  # e.g. a layer that produces no output
        raise ConfigError(
            f"model: the model has no usable output for inputs of shape {input_shape}: {gist(exc)}.",
            f"end the model with a layer of {units} unit{'s' if units != 1 else ''}, e.g. {target.layer}.",
        ) from None
    if not isinstance(out, tuple) or not all(isinstance(d, (int, type(None))) for d in out):
        raise ConfigError(
            f"model: the model has several outputs ({out}); tfgpu trains one output of shape (batch, {units}).",
            "return a model with a single output layer.",
        )
    if len(out) != 2:
        raise ConfigError(
            f"model: the model outputs shape {out}, but {target.what}, so it must output (batch, {units}): "
            "one row of values per sample.",
            "add Flatten (or GlobalAveragePooling2D) before the last Dense layer.",
        )
    if out[-1] != units:
        raise ConfigError(
            f"model: the model outputs {out[-1]} values per sample (output shape {out}), but {target.what}, "
            f"so it must output {units}.",
            f"end the model with {target.layer}.",
        )
    return model


def check_fits(model: Any, loss_spec: Any, metric_specs: list[Any], x: Any, y: Any,
               task: str = "classification") -> None:
    """Run the model, the loss and the metrics on a few samples before anything is written.

    Catches a model that cannot take the data's inputs, and a loss or metric that
    does not fit the labels and the model's outputs (e.g. ``categorical_crossentropy``,
    which needs one-hot labels, with MNIST's integer labels), as a
    :class:`ConfigError` instead of a failure inside the first training step.

    Args:
        model: the built model.
        loss_spec, metric_specs: ``model.loss`` and ``model.metrics``.
        x, y: a small batch as the pipeline makes it (float32 inputs, labels).
        task: ``classification`` (integer class labels) or ``regression`` (value targets).
    """
    classes = task == "classification"
    labels = "integer classes" if classes else "values"
    try:
        pred = model(x, training=False)
    except Exception as exc:
        raise ConfigError(
            f"model: the model cannot take the data's inputs (a batch of shape {tuple(x.shape)}, float32): "
            f"{type(exc).__name__}: {gist(exc)}.",
            "build the model for the input_shape tfgpu passes (e.g. an image's shape with its channel axis).",
        ) from None
    shape = tuple(pred.shape)
    name = _split_spec(loss_spec)[0]
    try:
        make_loss(loss_spec)(y, pred)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"model.loss: '{name}' does not fit the labels ({labels}, shape {tuple(y.shape)}) and the "
            f"model's outputs (shape {shape}): {type(exc).__name__}: {gist(exc)}.",
            "for integer class labels use sparse_categorical_crossentropy (categorical_crossentropy needs "
            "one-hot labels)." if classes else "for value targets use a regression loss, e.g. mse, mae or huber.",
        ) from None
    for i, metric in enumerate(make_metrics(metric_specs, loss_spec)):
        try:
            metric.update_state(y, pred)
        except Exception as exc:
            raise ConfigError(
                f"model.metrics[{i}]: '{_split_spec(metric_specs[i])[0]}' does not fit the labels (shape "
                f"{tuple(y.shape)}) and the model's outputs (shape {shape}): {type(exc).__name__}: {gist(exc)}.",
                "use a metric for integer class labels, e.g. accuracy or sparse_top_k_categorical_accuracy."
                if classes else "use a metric for value targets, e.g. mae or root_mean_squared_error.",
            ) from None




def describe_model(model: Any) -> dict[str, Any]:
    """Name, parameter count and layer classes of a model (for the run summary)."""
    return {
        "name": model.name,
        "parameters": int(model.count_params()),
        "layers": [type(layer).__name__ for layer in model.layers],
    }
