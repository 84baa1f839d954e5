"""``train.ema``: an exponential moving average of the weights, validated, saved and served in their place.

Keras's own (``use_ema=True``, ``ema_momentum``: each optimizer step ``average = m x average + (1 - m) x weight``,
in the optimizer's variables, so a checkpoint holds the averages and ``--resume`` continues them). tfgpu adds what
a run needs around it:

- each epoch's validation runs on the averages (Keras's ``SwapEMAWeights(swap_on_epoch=False)``: swapped in for
  ``on_test_begin`` and back for ``on_test_end``), so ``val_*`` in ``metrics.csv`` and the monitors of early
  stopping read the averaged model; the training figures are the raw weights' (they are what the step computes);
- when training ends, the averages replace the weights (``optimizer.finalize_variable_values``) before
  ``model.keras`` is saved, so the test split, ``tfgpu evaluate``, ``predict`` and ``export`` use them;
- Keras's ``fit`` also finalizes at the end of every ``fit`` call, which would put the averages into the weights
  mid-run wherever tfgpu calls ``fit`` twice (a mid-epoch resume, ``train.unfreeze``): inside :func:`held` that
  is left to the end of training.

Wraps: https://keras.io/api/optimizers/#base-optimizer-class (``use_ema``, ``ema_momentum``) and
https://keras.io/api/callbacks/swap_ema_weights/
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

from ..errors import ConfigError
from ..model.keras_model import inner_optimizer


def check(cfg: Any) -> None:
    """Refuse what the averages cannot go with, before TensorFlow starts.

    Raises:
        ConfigError: ``train.early_stopping.restore_best_weights`` (it restores raw weights of the best epoch over
            the averages); Keras's ``use_ema`` given to ``model.optimizer`` as well.
    """
    ema = cfg.train.ema
    if ema is None:
        return
    es = cfg.train.early_stopping
    if es is not None and es.restore_best_weights:
        raise ConfigError(
            "train.ema with train.early_stopping.restore_best_weights: true: the run's result is the averaged "
            "weights, and restoring the best epoch would put its raw weights over them.",
            "keep one: train.ema (the averages, validated each epoch), or restore_best_weights.")
    spec = cfg.model.optimizer
    if isinstance(spec, dict) and any(spec.get(k) is not None for k in ("use_ema", "ema_momentum")):
        raise ConfigError("train.ema and model.optimizer's use_ema/ema_momentum both ask for the averages.",
                          "keep train.ema: {momentum: ...} and remove use_ema/ema_momentum from model.optimizer.")


def configure(optimizer: Any, ema: Any) -> None:
    """Give ``optimizer`` (the inner one of a ``LossScaleOptimizer``) Keras's EMA, before it is built."""
    if ema is None:
        return
    inner = inner_optimizer(optimizer)
    inner.use_ema, inner.ema_momentum, inner.ema_overwrite_frequency = True, float(ema.momentum), None


def momentum_of(optimizer: Any) -> Optional[float]:
    """The EMA momentum ``optimizer`` keeps averages with, or ``None``."""
    inner = inner_optimizer(optimizer)
    return float(inner.ema_momentum) if getattr(inner, "use_ema", False) else None


def callbacks(optimizer: Any) -> list:
    """``[keras.callbacks.SwapEMAWeights(swap_on_epoch=False)]`` when ``optimizer`` keeps averages, else ``[]``."""
    if momentum_of(optimizer) is None:
        return []
    import keras  # noqa: PLC0415

    return [keras.callbacks.SwapEMAWeights(swap_on_epoch=False)]


@contextlib.contextmanager
def held(optimizer: Any) -> Iterator[None]:
    """Inside: ``optimizer.finalize_variable_values`` does nothing (Keras's ``fit`` calls it at each ``fit``'s end);
    :func:`finalize` does it once, when training is over."""
    if momentum_of(optimizer) is None:
        yield
        return
    optimizer.finalize_variable_values = lambda var_list: None
    try:
        yield
    finally:
        optimizer.__dict__.pop("finalize_variable_values", None)


def finalize(optimizer: Any, model: Any) -> None:
    """Put the averages into ``model``'s trainable weights (Keras's ``finalize_variable_values``; on TensorFlow each
    replica's copy, through the strategy)."""
    if momentum_of(optimizer) is not None:
        optimizer.finalize_variable_values(model.trainable_variables)


def facts(optimizer: Any) -> Optional[dict[str, Any]]:
    """``summary.json``'s ``ema``: the momentum and where the averages are used, or ``None``."""
    momentum = momentum_of(optimizer)
    if momentum is None:
        return None
    return {"momentum": momentum,
            "used_for": "each epoch's validation (val_*), then model.keras: the test split, tfgpu evaluate, "
                        "predict and export",
            "training_figures": "the raw weights' (loss and metrics of the training step)"}
