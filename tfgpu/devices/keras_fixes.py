"""Two narrow fixes that make Keras 3's ``model.fit`` work under ``MultiWorkerMirroredStrategy``.

With two or more workers, Keras 3 (3.15.1 here, TensorFlow 2.21) fails in
``fit``/``evaluate``: ``ValueError: Attempt to convert a value (PerReplica:...)
with an unsupported type ... to a Tensor`` (upstream: keras-team/keras#20585,
tensorflow/tensorflow#72388). Both causes are in
``keras/src/backend/tensorflow/trainer.py``:

1. ``TensorFlowTrainer._maybe_symbolic_build`` takes a sample batch to build
   the model's variables with ``strategy.reduce("MEAN", <first distributed
   batch>, axis=None)``, which ``CollectiveAllReduceStrategy`` cannot do with
   input ``PerReplica`` values. Fixed: under multi-worker, the first local
   replica's batch is used (a sample batch only fixes shapes and dtypes).
2. ``reduce_per_replica`` reduces a step's scalar logs with
   ``strategy.reduce("MEAN", v, axis=0)``, and a scalar has no axis 0
   ("Invalid reduction dimension 0 for input with 0 dimensions"). Fixed: a
   scalar (rank 0) is reduced with ``axis=None`` (the mean over all replicas);
   everything else goes to Keras's own function unchanged.

Each fix is applied only when the installed Keras still holds the faulty call
(its source is read), so an upstream fix is never patched twice, and it acts
only under a ``MultiWorkerMirroredStrategy`` with more than one worker: every
other strategy takes Keras's own code path. :func:`install` is idempotent.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

_FAULTY_BUILD = re.compile(r'distribute_strategy\.reduce\(\s*"MEAN"')
_FAULTY_REDUCE = re.compile(r'strategy\.reduce\(\s*"MEAN",\s*v,\s*axis=0\s*\)')

_installed: dict[str, bool] = {}


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def needed() -> dict[str, bool]:
    """Which of the two faulty calls the installed Keras still has: ``{"symbolic_build": ..., "reduce_per_replica": ...}``."""
    from keras.src.backend.tensorflow import trainer  # noqa: PLC0415

    if _installed:
        return dict(_installed)
    return {"symbolic_build": bool(_FAULTY_BUILD.search(_source(trainer.TensorFlowTrainer._maybe_symbolic_build))),
            "reduce_per_replica": bool(_FAULTY_REDUCE.search(_source(trainer.reduce_per_replica)))}


def install() -> dict[str, str]:
    """Install the fixes the installed Keras needs; returns ``{fix: "applied" | "not needed"}``.

    Safe to call more than once and under any strategy (the fixed code paths
    only differ from Keras's under multi-worker ``MultiWorkerMirroredStrategy``).
    Imports Keras and TensorFlow.
    """
    import keras  # noqa: PLC0415
    from keras.src.backend.tensorflow import trainer  # noqa: PLC0415

    if _installed:
        return applied()
    wanted = needed()
    result = {}
    if wanted["symbolic_build"]:
        original_build = trainer.TensorFlowTrainer._maybe_symbolic_build

        def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
            strategy = self._distribute_strategy
            if strategy is None or iterator is None or not trainer._collective_all_reduce_multi_worker(strategy):
                return original_build(self, iterator=iterator, data_batch=data_batch)
            for _, _, it in iterator:
                batch = next(it)
                data_batch = keras.tree.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0]
                    if isinstance(v, trainer.tf.distribute.DistributedValues) else v, batch)
                break
            with strategy.scope():
                self._symbolic_build(data_batch=data_batch)

        trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
        result["symbolic_build"] = "applied"
    else:
        result["symbolic_build"] = "not needed"
    if wanted["reduce_per_replica"]:
        original_reduce = trainer.reduce_per_replica
        tf = trainer.tf

        def reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
            mean = reduction == "mean" or (reduction == "auto" and not isinstance(strategy, tf.distribute.TPUStrategy))
            if not (mean and trainer._collective_all_reduce_multi_worker(strategy)):
                return original_reduce(values, strategy, reduction)

            def one(v: Any) -> Any:
                if strategy.experimental_local_results(v)[0].shape.rank == 0:
                    return strategy.reduce("MEAN", v, axis=None)
                return original_reduce(v, strategy, reduction)

            return keras.tree.map_structure(one, values)

        trainer.reduce_per_replica = reduce_per_replica
        result["reduce_per_replica"] = "applied"
    else:
        result["reduce_per_replica"] = "not needed"
    _installed.update({name: state == "applied" for name, state in result.items()})
    return result


def applied() -> dict[str, str]:
    """What :func:`install` did in this process: ``{fix: "applied" | "not needed"}`` (empty before it ran)."""
    return {name: "applied" if done else "not needed" for name, done in _installed.items()}
