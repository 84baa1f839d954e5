"""``train.loop: fit``: ``keras.Model.fit`` under the strategy's scope."""

from __future__ import annotations

from typing import Any

from . import check_loss

VERBOSE = {"bar": 1, "epoch": 2, "none": 0}


def train_fit(model: Any, train: Any, val: Any, epochs: int, steps_per_epoch: int, callbacks: list, progress: str, terminate_on_nan: bool = True) -> None:
    """Train a compiled model with ``model.fit``.

    Args:
        model: a model compiled inside the strategy's scope.
        train, val: finite ``tf.data`` datasets of global batches ``(x, y)``;
            Keras splits each global batch across the replicas.
        epochs: passes over ``train``.
        steps_per_epoch: the number of batches in one pass of ``train``; it
            must be a multiple of the model's ``steps_per_execution``. The
            training set is repeated and fit is given this count, so Keras keeps
            one iterator for the whole run instead of building a new distributed
            iterator every epoch (0.1-0.4 s each with MirroredStrategy on 2 CPU
            cores, measured). Validation reads ``val`` to its end each epoch;
            ``val`` may be ``None`` (no validation).
        callbacks: Keras callbacks (CSVLogger, ...).
        progress: ``"bar"``, ``"epoch"`` or ``"none"``.
        terminate_on_nan: stop at the first NaN or infinite batch loss
            (``keras.callbacks.TerminateOnNaN``).

    Raises:
        TrainingError: the loss became NaN or infinite (with ``terminate_on_nan``).

    Wraps: https://keras.io/api/models/model_training_apis/#fit-method
    """
    if terminate_on_nan:
        import keras  # noqa: PLC0415

        callbacks = [*callbacks, keras.callbacks.TerminateOnNaN()]
    # The dataset is shuffled by tf.data, so fit must not try to shuffle it.
    history = model.fit(train.repeat(epochs), validation_data=val, epochs=epochs, steps_per_epoch=steps_per_epoch,
                        callbacks=callbacks, verbose=VERBOSE[progress], shuffle=False)
    losses = history.history.get("loss", [])
    if terminate_on_nan and losses:
        check_loss(float(losses[-1]), len(losses), " (keras.callbacks.TerminateOnNaN)")
