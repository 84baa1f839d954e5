"""``train.class_weight``: per-sample weights in the training batches.

``train.class_weight: balanced`` gives class ``c`` the weight
``n_samples / (n_classes * count_c)`` over the training labels (scikit-learn's
``compute_class_weight("balanced")``); ``{class: weight}`` names classes by
name (image folders' class folder names, where the source has names) or by
index, the others keeping weight 1. The training pipeline then yields
``(x, y, w)`` batches with ``w[i] = weight[y[i]]``: ``keras.Model.fit`` applies
them as ``sample_weight`` (the same as its ``class_weight`` argument, which
Keras does not take with a ``tf.data`` dataset of several outputs, nor under
every strategy), and the custom loop multiplies each sample's loss by its
weight before ``tf.nn.compute_average_loss``. Validation and test batches are
not weighted.

Wraps: https://keras.io/api/models/model_training_apis/#fit-method (``sample_weight``)
and https://scikit-learn.org/stable/modules/generated/sklearn.utils.class_weight.compute_class_weight.html
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from ..errors import ConfigError
from ..utils.lazy import numpy as np


def class_indices(y: np.ndarray, target_shape: Sequence[int]) -> np.ndarray:
    """Each sample's class index: the label itself, or the argmax of a one-hot label."""
    y = np.asarray(y)
    if len(target_shape) == 1 and target_shape[0] > 1:
        return y.argmax(axis=-1).astype(np.int64)
    return y.reshape(len(y)).astype(np.int64)


def balanced(y: np.ndarray, num_classes: int) -> np.ndarray:
    """``n_samples / (n_classes * count_c)`` per class (sklearn's ``balanced``); a class with no samples gets 1."""
    counts = np.bincount(y, minlength=num_classes)[:num_classes].astype(np.float64)
    out = np.ones(num_classes)
    present = counts > 0
    out[present] = len(y) / (num_classes * counts[present])
    return out


def resolve(setting: Union[str, dict, None], y: np.ndarray, task: str, num_classes: Optional[int],
            class_names: Optional[Sequence[str]], target_shape: Sequence[int] = ()) -> Optional[np.ndarray]:
    """``train.class_weight`` -> one float weight per class (index order), or ``None`` when unset.

    Args:
        setting: ``balanced``, ``{class name or index: weight}`` or ``None``.
        y: the training labels.
        task: ``classification`` or ``regression``.
        num_classes: the data's classes.
        class_names: the classes' names where the source has them (image folders), else ``None``.
        target_shape: one label's shape (one-hot labels: ``(classes,)``).

    Raises:
        ConfigError: a regression task, or a class that is neither a name nor an index of the data,
            listing the classes.
    """
    if setting is None:
        return None
    if task != "classification":
        raise ConfigError(
            "train.class_weight: the data is a regression task (model.loss is a regression loss), so there are "
            "no classes to weigh.",
            "remove train.class_weight, or use a classification loss with class labels.",
        )
    n = int(num_classes or 2)
    if setting == "balanced":
        return balanced(class_indices(y, target_shape), n)
    names = [str(c) for c in class_names] if class_names is not None else [str(i) for i in range(n)]
    weights = np.ones(n)
    for key, value in setting.items():
        text = str(key)
        if text in names:
            index = names.index(text)
        elif isinstance(key, int) or text.isdigit():
            index = int(text)
        else:
            index = -1
        if not 0 <= index < n:
            listed = ", ".join(f"{i}: {name}" for i, name in enumerate(names)) if class_names is not None \
                else f"0 to {n - 1}"
            raise ConfigError(
                f"train.class_weight: {key!r} is not a class of the data; the classes are {listed}.",
                "name a class by its name or its index.",
            )
        weights[index] = float(value)
    return weights


def describe(weights: Optional[np.ndarray], class_names: Optional[Sequence[str]]) -> Optional[dict[str, float]]:
    """The weights as ``{class name (or index): weight}`` for ``summary.json`` and the banner."""
    if weights is None:
        return None
    names = [str(c) for c in class_names] if class_names is not None else [str(i) for i in range(len(weights))]
    return {name: round(float(w), 6) for name, w in zip(names, weights)}


def weigher(weights: np.ndarray, target_shape: Sequence[int]) -> Any:
    """``(x, y[, w]) -> (x, y, w')``: each sample's class weight (times a weight ``w`` the batch has), float32."""
    import tensorflow as tf  # noqa: PLC0415

    table = tf.constant(np.asarray(weights, np.float32))
    one_hot = len(target_shape) == 1 and target_shape[0] > 1

    def apply(x: Any, y: Any, w: Any = None) -> tuple[Any, Any, Any]:
        index = tf.argmax(y, axis=-1) if one_hot else tf.reshape(tf.cast(y, tf.int64), [-1])
        weight = tf.gather(table, index)
        return x, y, weight if w is None else weight * w

    return apply
