"""``train.loop: fit``: ``keras.Model.fit`` under the strategy's scope."""

from __future__ import annotations

from typing import Any

VERBOSE = {"bar": 1, "epoch": 2, "none": 0}


def train_fit(model: Any, train: Any, val: Any, epochs: int, callbacks: list, progress: str) -> None:
    """Train a compiled model with ``model.fit``.

    Args:
        model: a model compiled inside the strategy's scope.
        train, val: ``tf.data`` datasets of global batches ``(x, y)``; Keras
            splits each global batch across the replicas.
        epochs: passes over ``train``.
        callbacks: Keras callbacks (CSVLogger, TerminateOnNaN, ...).
        progress: ``"bar"``, ``"epoch"`` or ``"none"``.

    Wraps: https://keras.io/api/models/model_training_apis/#fit-method
    """
    # The dataset is shuffled by tf.data, so fit must not try to shuffle it.
    model.fit(train, validation_data=val, epochs=epochs, callbacks=callbacks, verbose=VERBOSE[progress],
              shuffle=False)
