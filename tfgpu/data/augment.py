"""``data.augment``: Keras image preprocessing layers applied to training batches, seeded.

``data.augment`` is a list of Keras image preprocessing layers
(``keras.layers.RandomFlip``, ``RandomRotation``, ``RandomZoom``, ...), each
``ClassName`` or ``{ClassName: {args}}`` as in ``model.layers``. With
``data.augment_on: pipeline`` (the default, the Keras guide's recommendation
for GPU training) they run in the training ``tf.data`` pipeline, on the CPU,
on whole global batches, in a parallel ``map`` before the ``prefetch``
(:func:`augmenter`); validation and test batches are never augmented. With
``augment_on: model`` they are the model's first layers (:func:`build_layers`),
active only in training (``model(x, training=True)``).

Seeding: layer ``i`` gets the seed ``seed + i`` (``tensorflow.seed``); in the
pipeline each global batch's random draws come from ``(layer seed, draw,
global step)`` through stateless ops, so two runs with the same seed augment
every batch alike whatever order tf.data's parallel calls run in, and a resumed
run augments the batches it has left as the uninterrupted run would. (A Keras
layer alone draws from a ``keras.random.SeedGenerator`` variable, whose draws a
parallel ``map`` takes in a varying order.)

Which names exist is read from Keras's package files (:mod:`tfgpu.utils.keras_names`)
before TensorFlow starts (:func:`check_names`).

Wraps: https://keras.io/api/layers/preprocessing_layers/ and
https://keras.io/guides/preprocessing_layers/
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from ..config.keras_specs import RESHAPING, spec_of


def build_layers(items: list[Any], seed: Optional[int], value_range: Optional[tuple[float, float]] = None) -> list:
    """The Keras layers of ``data.augment``, each seeded with ``seed + i`` (``None``: unseeded).

    Args:
        items: ``data.augment``.
        seed: the base seed (``tensorflow.seed``).
        value_range: the range of the pixel values the layers see (``(0, 1)`` after ``rescale: 1/255``);
            passed as ``value_range`` to the layers that take one, unless the item sets it.

    Raises:
        ConfigError: bad arguments for a layer (the message Keras gave).
    """
    import keras  # noqa: PLC0415

    from ..errors import ConfigError  # noqa: PLC0415

    layers = []
    for i, item in enumerate(items):
        name, args = spec_of(item)
        cls = getattr(keras.layers, name)
        params = inspect.signature(cls.__init__).parameters
        if "seed" in params and "seed" not in args and seed is not None:
            args["seed"] = (seed + i) % 2**31
        if "value_range" in params and "value_range" not in args and value_range is not None:
            args["value_range"] = list(value_range)
        try:
            layers.append(cls(**args))
        except Exception as exc:  # Keras raises TypeError, ValueError and others for bad arguments
            text = " ".join(str(exc).split())[:300]
            raise ConfigError(
                f"data.augment[{i}]: {name}({', '.join(f'{k}={v!r}' for k, v in args.items())}) failed: {text}.",
                f"check the arguments against https://keras.io/api/layers/preprocessing_layers/ for {name}.",
            ) from None
    return layers


def check_data(items: list[Any], input_shape: tuple[int, ...], placement: str) -> None:
    """Refuse augmentation the data cannot take (after loading, before anything is written).

    Raises:
        ConfigError: inputs that are not images (rank 3: height, width, channels), or a layer that changes
            the image size with ``augment_on: pipeline``.
    """
    from ..errors import ConfigError  # noqa: PLC0415

    names = [spec_of(item)[0] for item in items]
    if len(input_shape) != 3:
        raise ConfigError(
            f"data.augment: {', '.join(names)} are image layers, but one input of this data has shape "
            f"{tuple(input_shape)}, not (height, width, channels).",
            "remove data.augment for non-image data (CSV rows, feature vectors).",
        )
    reshaping = [n for n in names if n in RESHAPING]
    if reshaping and placement == "pipeline":
        raise ConfigError(
            f"data.augment: {reshaping[0]} changes the image size, and with augment_on: pipeline only the training "
            "batches would have the new size (validation and test batches are not augmented).",
            "set data.augment_on: model (the model then crops or resizes every input, randomly only in training).",
        )


class _BatchSeeds:
    """Stateless seeds for one layer in one traced batch: ``(layer seed + 7919 x draw, global step)``."""

    def __init__(self, base: int, step: Any) -> None:
        self.base, self.step, self.draws = base, step, 0

    def generator(self) -> Any:
        import tensorflow as tf  # noqa: PLC0415
        from keras.src.random.seed_generator import SeedGenerator  # noqa: PLC0415

        outer = self

        class Seeds(SeedGenerator):
            def __init__(self) -> None:  # no state variable: each draw is a function of the batch's step
                pass

            def next(self, ordered: bool = True) -> Any:
                outer.draws += 1
                return tf.stack([tf.constant(outer.base + 7919 * outer.draws, tf.int64), tf.cast(outer.step, tf.int64)])

        return Seeds()


def augmenter(layers: list, seed: Optional[int]) -> Any:
    """``(step, (x, y[, w])) -> (x', y[, w])``: the layers applied in training mode to one global batch.

    ``step`` is the batch's global step (``Dataset.enumerate(skip)``), so each
    batch's draws depend on the seed and the step only (the module docstring).
    """
    import numpy as np  # noqa: PLC0415

    base = seed if seed is not None else int(np.random.default_rng().integers(2**31))
    bases = [(base + 1_000_003 * (i + 1)) % 2**40 for i in range(len(layers))]

    def apply(step: Any, batch: tuple) -> tuple:
        x, rest = batch[0], batch[1:]
        for layer, layer_base in zip(layers, bases):
            seeds = _BatchSeeds(layer_base, step).generator()
            object.__setattr__(layer, "_get_seed_generator", lambda backend=None, s=seeds: s)
            x = layer(x, training=True)
        return (x, *rest)

    return apply


def value_range_of(spec: Any) -> Optional[tuple[float, float]]:
    """The pixel range the layers see: ``(0, 1)`` after ``rescale: 1/255``, ``(0, 255)`` for unscaled uint8."""
    if spec.rescale is not None and abs(spec.rescale * 255 - 1) < 1e-9:
        return (0.0, 1.0)
    if spec.rescale is None and spec.x_dtype == "uint8":
        return (0.0, 255.0)
    return None


def model_layers(data_cfg: Any, seed: Optional[int], spec: Any) -> Optional[list]:
    """``data.augment`` as layers for the model's start (``augment_on: model``), else ``None``; call in the
    strategy's scope (the layers' seed generators are variables)."""
    if not data_cfg.augment or data_cfg.augment_on != "model":
        return None
    check_data(data_cfg.augment, spec.input_shape, "model")  # (the JAX feed does not call training_extras)
    return build_layers(data_cfg.augment, seed, value_range_of(spec))
