"""``train.loop: fit``: ``keras.Model.fit`` under the strategy's scope."""

from __future__ import annotations

from . import Job, check_loss

VERBOSE = {"bar": 1, "epoch": 2, "none": 0}


def train_fit(job: Job, callbacks: list, progress: str, start: tuple[int, int] = (0, 0)) -> None:
    """Train a compiled model with ``model.fit``, from the start or from a checkpoint's position.

    Args:
        job: the model and its data (:class:`~tfgpu.loops.Job`). fit reads one
            dataset of all the epochs (``job.train_epochs``) with
            ``steps_per_epoch``, so Keras keeps one iterator for the whole run
            instead of building a distributed iterator every epoch (0.1-0.4 s
            each with MirroredStrategy on 2 CPU cores, measured); Keras splits
            each global batch across the replicas.
        callbacks: Keras callbacks (CSVLogger with ``append=True``: a resumed
            run calls fit twice).
        progress: ``"bar"``, ``"epoch"`` or ``"none"``.
        start: ``(epoch, step)`` to start from, both counted from 0: epochs
            before ``epoch`` and the first ``step`` steps of it are done (a
            checkpoint's position). fit cannot start inside an epoch, so the
            rest of that epoch is one fit call of ``steps_per_epoch - step``
            steps (its training metrics cover those steps), the later epochs another.

    Raises:
        TrainingError: the loss became NaN or infinite (with ``job.terminate_on_nan``:
            ``keras.callbacks.TerminateOnNaN``).

    Wraps: https://keras.io/api/models/model_training_apis/#fit-method
    """
    if job.terminate_on_nan:
        import keras  # noqa: PLC0415

        callbacks = [*callbacks, keras.callbacks.TerminateOnNaN()]
    epochs, steps_per_epoch = job.epochs, job.steps_per_epoch
    epoch, step = start
    calls = []
    if step:
        calls.append((epoch, epoch + 1, steps_per_epoch - step, epoch * steps_per_epoch + step))
        epoch += 1
    if epoch < epochs:
        calls.append((epoch, epochs, steps_per_epoch, epoch * steps_per_epoch))
    for first, end, steps, skip in calls:
        # The dataset is shuffled by tf.data, so fit must not try to shuffle it.
        history = job.model.fit(job.train_epochs(epochs, skip), validation_data=job.validation, initial_epoch=first,
                                epochs=end, steps_per_epoch=steps, callbacks=callbacks, verbose=VERBOSE[progress],
                                shuffle=False)
        losses = history.history.get("loss", [])
        if job.terminate_on_nan and losses:
            check_loss(float(losses[-1]), first + len(losses), " (keras.callbacks.TerminateOnNaN)")
