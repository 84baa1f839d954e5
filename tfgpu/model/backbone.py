"""``model.application``: a ``keras.applications`` model as the backbone, ``model.layers`` as the head.

The model tfgpu builds around the application is made of plain Keras layers, so
``model.keras`` reloads with ``keras.models.load_model`` (no ``safe_mode=False``,
no tfgpu import)::

    Input(data's shape) -> [Concatenate: grey to 3 channels] -> [Resizing: up to the application's minimum]
        -> preprocessing (the application's own preprocess_input, as layers) -> application -> head

Preprocessing. tfgpu's pipeline rescales 8-bit images to [0, 1] (``data.rescale:
auto``), while the applications expect pixels in [0, 255]. The preprocessing
layers take the pipeline's range (the factor back to [0, 255] is
``1 / data.rescale``; inputs that are not 8-bit are taken as [0, 1]) and do what
the application's ``preprocess_input`` does (``keras.applications.imagenet_utils``
modes):

- ``tf`` (MobileNet, MobileNetV2, ResNet*V2, InceptionV3, InceptionResNetV2,
  Xception, NASNet*): ``[-1, 1]``: ``keras.layers.Rescaling(scale, offset=-1)``.
- ``torch`` (DenseNet*): ``[0, 1]`` then ImageNet's mean and standard deviation per
  channel: ``Rescaling`` and ``keras.layers.Normalization(mean, variance)``.
- ``caffe`` (ResNet50/101/152, VGG16/19): RGB to BGR and ImageNet's mean subtracted,
  in [0, 255]: one fixed, non-trainable 1x1 ``Conv2D`` (a channel permutation
  times 255, the mean as its bias).
- inside (EfficientNet*, EfficientNetV2*, ConvNeXt*, MobileNetV3*): the application
  preprocesses its own inputs (``include_preprocessing=True``); tfgpu only brings
  them to [0, 255] with ``Rescaling``.

``data.normalize`` is refused with an application (it would standardise the
pixels before the application's own preprocessing).

Weights. ``weights: imagenet`` is Keras's own (``keras.utils.get_file`` into
``$KERAS_HOME/models``, ``~/.keras/models`` by default, downloading on a miss);
offline, a miss is a :class:`~tfgpu.errors.ConfigError` (exit 3) naming the file
and the folder to put it in. A file path is given to the application as its
``weights`` argument (``model.load_weights``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError

#: The preprocessing of each application module (``keras.src.applications.<module>``), see the module docstring.
MODES = {"convnext": "inside", "densenet": "torch", "efficientnet": "inside", "efficientnet_v2": "inside",
         "inception_resnet_v2": "tf", "inception_v3": "tf", "mobilenet": "tf", "mobilenet_v2": "tf",
         "mobilenet_v3": "inside", "nasnet": "tf", "resnet": "caffe", "resnet_v2": "tf", "vgg16": "caffe",
         "vgg19": "caffe", "xception": "tf"}

#: The smallest input side each module accepts (``min_size`` in its ``_obtain_input_shape`` call, Keras 3.15); 32 else.
MIN_SIZES = {"inception_v3": 75, "inception_resnet_v2": 75, "xception": 71}

#: ImageNet's channel statistics (RGB), as ``keras.applications.imagenet_utils`` uses them.
IMAGENET_MEAN_TORCH = (0.485, 0.456, 0.406)
IMAGENET_STD_TORCH = (0.229, 0.224, 0.225)
IMAGENET_MEAN_CAFFE_BGR = (103.939, 116.779, 123.68)

_COMMON = ["MobileNetV3Small", "MobileNetV2", "ResNet50", "EfficientNetB0", "ConvNeXtTiny"]


def application_names() -> Optional[dict[str, str]]:
    """``{name: module}`` of the applications Keras exports (read from its files, no import), or ``None``."""
    from ..utils.keras_names import class_names, exported  # noqa: PLC0415

    names = class_names("application")
    found = exported("keras.applications")
    if names is None or found is None:
        return None
    return {n: found[n].rsplit(".", 1)[-1] for n in names}


def _lookup(name: str, names: dict[str, str]) -> str:
    """The module of application ``name``.

    Raises:
        ConfigError: no such application, with the closest name.
    """
    if name in names:
        return names[name]
    import difflib  # noqa: PLC0415

    lower = {n.lower(): n for n in names}
    close = ([lower[name.lower()]] if name.lower() in lower
             else difflib.get_close_matches(name, list(names), n=1, cutoff=0.5))
    guess = f" Did you mean '{close[0]}'?" if close else ""
    raise ConfigError(
        f"model.application.name: '{name}' is not a keras.applications model.{guess}",
        f"use one of {', '.join(sorted(names))} (e.g. {', '.join(_COMMON)}).",
    )


def check(cfg: Any) -> None:
    """Check ``model.application`` without importing Keras: the name, a weights file, and ``data.normalize``.

    Args:
        cfg: the whole :class:`~tfgpu.config.Config`.

    Raises:
        ConfigError: an unknown application (with the closest name), a weights file that is not there,
            or ``data.normalize: true`` (exit 3).
    """
    app = cfg.model.application
    if app is None:
        return
    names = application_names()
    if names is not None:
        _lookup(app.name, names)
    if app.weights not in (None, "imagenet") and not Path(app.weights).expanduser().is_file():
        raise ConfigError(
            f"model.application.weights: {app.weights!r} is neither 'imagenet', null nor a file "
            f"(no file at {Path(app.weights).expanduser().resolve()}).",
            "give the path of a weights file for the application (e.g. one Keras downloaded into "
            "~/.keras/models), imagenet, or null for random initial weights.",
        )
    if cfg.data.normalize:
        raise ConfigError(
            "data.normalize: true with model.application: the application applies its own preprocess_input, "
            "which expects pixels, not standardised features.",
            "set data.normalize: false (tfgpu preprocesses the images as the application wants).",
        )


def pixel_factor(spec: Any) -> float:
    """The factor that brings the pipeline's inputs back to pixels in [0, 255].

    ``1 / data.rescale`` where the pipeline rescales; 1 for 8-bit inputs it does
    not rescale; 255 for other inputs (taken to be in [0, 1]).
    """
    if spec.rescale:
        return 1.0 / float(spec.rescale)
    return 1.0 if spec.x_dtype == "uint8" else 255.0


def cache_dir() -> Path:
    """Where ``keras.utils.get_file`` keeps the applications' weights: ``$KERAS_HOME/models`` (``~/.keras/models``)."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return Path(home) / "models"


def _preprocessing(keras: Any, mode: str, factor: float) -> list[Any]:
    """Keras layers that turn the pipeline's inputs into what the application's ``preprocess_input`` makes."""
    import numpy as np  # noqa: PLC0415

    if mode == "inside":
        return [] if factor == 1.0 else [keras.layers.Rescaling(factor, name="to_pixels")]
    if mode == "tf":  # x / 127.5 - 1 on pixels
        return [keras.layers.Rescaling(factor / 127.5, offset=-1.0, name="preprocess_tf")]
    if mode == "torch":  # x / 255, then (x - mean) / std per channel
        return [keras.layers.Rescaling(factor / 255.0, name="to_unit"),
                keras.layers.Normalization(axis=-1, mean=list(IMAGENET_MEAN_TORCH),
                                           variance=[s * s for s in IMAGENET_STD_TORCH], name="preprocess_torch")]
    # caffe: RGB -> BGR, minus the mean, on pixels: a fixed 1x1 convolution.
    kernel = np.zeros((1, 1, 3, 3), np.float32)
    for out, inp in enumerate((2, 1, 0)):
        kernel[0, 0, inp, out] = factor
    conv = keras.layers.Conv2D(3, 1, name="preprocess_caffe", trainable=False)
    conv.build((None, None, None, 3))
    conv.set_weights([kernel, -np.asarray(IMAGENET_MEAN_CAFFE_BGR, np.float32)])
    return [conv]


def _weights_error(app: Any, exc: BaseException) -> ConfigError:
    """An offline miss of ``weights: imagenet`` -> the file Keras looks for and where to put it."""
    text = str(exc)
    url = re.search(r"https?://\S+?\.h5", text)
    name = url.group(0).rsplit("/", 1)[-1] if url else None
    where = cache_dir() / name if name else cache_dir()
    return ConfigError(
        f"model.application.weights: imagenet: Keras could not download the {app.name} weights"
        + (f" ({url.group(0)})" if url else "") + f" and they are not in its cache ({where}): {text.splitlines()[0]}.",
        (f"on a machine with network access download {url.group(0)} and put it at {where} (the folder is "
         "$KERAS_HOME/models, ~/.keras/models by default), or set model.application.weights to the file's path, "
         "or to null for random initial weights." if url else
         "put the weights file Keras names into that folder, or set weights to a file's path, or null."),
    )


def build(app: Any, input_shape: tuple[int, ...], factor: float) -> tuple[Any, Any]:
    """The application and the layers before it, as a functional model's input and features.

    Args:
        app: ``model.application`` (:class:`~tfgpu.config.schema.ApplicationConfig`).
        input_shape: one sample's shape from the data, ``(height, width, channels)``.
        factor: :func:`pixel_factor` of the data.

    Returns:
        ``(inputs, features)``: a ``keras.Input`` and the application's output tensor.

    Raises:
        ConfigError: an unknown application, inputs that are not images (rank 3, 1 or 3 channels),
            bad arguments, or ImageNet weights that cannot be found (offline).

    Wraps: https://keras.io/api/applications/ (``keras.applications.<Name>(include_top, weights,
    input_shape, pooling)``), https://keras.io/api/layers/preprocessing_layers/image_preprocessing/resizing/
    """
    import keras  # noqa: PLC0415

    names = application_names() or {n: "" for n in dir(keras.applications) if n[:1].isupper()}
    module = _lookup(app.name, names)
    if len(input_shape) != 3 or input_shape[-1] not in (1, 3):
        raise ConfigError(
            f"model.application: {app.name} takes images (height, width, 1 or 3 channels); the data's samples "
            f"have shape {tuple(input_shape)}.",
            "use image data (e.g. data.kind: image_folder or mnist), or model.layers without an application.",
        )
    height, width, channels = input_shape
    smallest = MIN_SIZES.get(module, 32)
    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    if channels == 1:
        x = keras.layers.Concatenate(axis=-1, name="grey_to_rgb")([x, x, x])
    if height < smallest or width < smallest:
        x = keras.layers.Resizing(max(height, smallest), max(width, smallest), name="resize")(x)
    for layer in _preprocessing(keras, MODES.get(module, "tf"), factor):
        x = layer(x)
    shape = (max(height, smallest), max(width, smallest), 3)
    weights = app.weights if app.weights in (None, "imagenet") else str(Path(app.weights).expanduser())
    args = {"include_top": app.include_top, "weights": weights, "input_shape": shape, **app.args}
    if not app.include_top:
        args["pooling"] = app.pooling
    try:
        backbone = getattr(keras.applications, app.name)(**args)
    except Exception as exc:  # Keras raises ValueError for bad arguments, Exception for a failed download
        if "URL fetch failure" in str(exc) or "fetch failure" in str(exc).lower():
            raise _weights_error(app, exc) from None
        from ..errors import gist  # noqa: PLC0415

        raise ConfigError(
            f"model.application: keras.applications.{app.name}("
            f"{', '.join(f'{k}={v!r}' for k, v in args.items())}) failed: {gist(exc)}.",
            f"check the arguments against https://keras.io/api/applications/ for {app.name}.",
        ) from None
    if not app.trainable:
        backbone.trainable = False
    return inputs, backbone(x)


def head_layer(keras: Any, target: Any, loss_family: str) -> Any:
    """The head when ``model.layers`` is not given: a Dense layer that fits the data (``target``)."""
    activation = None if loss_family == "regression" else "sigmoid" if target.units == 1 else "softmax"
    return keras.layers.Dense(target.units, activation=activation, name="head")
