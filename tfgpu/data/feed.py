"""The JAX backend's input pipeline: in-memory splits -> ``keras.utils.PyDataset`` of global batches. No TensorFlow.

Keras's JAX trainer reads a ``PyDataset`` batch by batch and, under
``keras.distribution.DataParallel``, splits each global batch along its first
axis over the devices, which needs a batch size divisible by the number of
devices (otherwise Keras fails: keras-team/keras#21167). So:

- training: each epoch is a fresh permutation of the samples (from
  ``tensorflow.seed`` and the epoch number, so a resumed run continues the
  same order), cut into global batches (per-replica batch x devices, always
  divisible); the last partial batch is kept, rounded down to a multiple of
  the devices (at most devices - 1 samples, different ones each epoch, are left
  out of that epoch);
- validation and test: every sample, in order; a last batch that does not
  divide is padded to a multiple of the devices with copies of its last sample
  whose sample weight is 0, so the metrics are exact (``tfgpu run`` compiles
  them as ``weighted_metrics``: Keras applies sample weights to those only);
  the loss Keras reports for such a batch is divided by its padded size (low by
  at most (devices - 1) / samples, relatively).

Each batch is gathered, cast to float32, rescaled and given its channel axis in
NumPy (:func:`tfgpu.data.pipeline.transform_numpy`), as the TensorFlow path
does in ``tf.data``.

Wraps: https://keras.io/api/utils/python_utils/#pydataset-class and
https://keras.io/api/distribution/data_parallel/
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

from ..config import DataConfig
from ..config.schema import NEEDS_TENSORFLOW
from ..errors import DataError
from ..utils.lazy import numpy as np
from .base import Data, DataSpec, LoadContext, Source, Split
from .pipeline import Cuts, Pipelines, materialize, transform_numpy


@functools.lru_cache(maxsize=None)
def _classes() -> tuple[type, type]:
    """The two ``PyDataset`` classes (made on first use: importing Keras picks its backend)."""
    import keras  # noqa: PLC0415

    class TrainFeed(keras.utils.PyDataset):
        """Global training batches over ``epochs`` epochs, the first ``skip`` batches left out.

        Item ``i`` is ``(x, y)``: ``x`` float32 of shape ``(batch, *input_shape)``, ``y`` the labels.
        """

        def __init__(self, x: np.ndarray, y: np.ndarray, spec: DataSpec, global_batch: int, replicas: int,
                     seed: int, epochs: int, skip: int, most: Optional[int] = None) -> None:
            super().__init__(workers=1, use_multiprocessing=False)
            self.x, self.y, self.spec = x, y, spec
            self.global_batch, self.seed, self.skip = global_batch, seed, skip
            self.steps, self.last = train_steps(len(x), global_batch, replicas, most)
            self.total = epochs * self.steps - skip
            self._order: tuple[int, Optional[np.ndarray]] = (-1, None)

        def __len__(self) -> int:
            return self.total

        def order(self, epoch: int) -> np.ndarray:
            """The sample order of ``epoch`` (counted from 0): the same for the same seed and epoch."""
            if self._order[0] != epoch:
                rng = np.random.default_rng([self.seed, epoch])
                self._order = (epoch, rng.permutation(len(self.x)))
            return self._order[1]

        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            if not 0 <= index < self.total:
                raise IndexError(index)
            epoch, batch = divmod(index + self.skip, self.steps)
            start = batch * self.global_batch
            size = self.last if batch == self.steps - 1 else self.global_batch
            chosen = np.sort(self.order(epoch)[start:start + size])  # sorted: faster gathers, same samples
            return transform_numpy(self.spec, self.x[chosen], self.y[chosen])

    class EvalFeed(keras.utils.PyDataset):
        """One pass over a split in order: ``(x, y, sample_weight)``, the last batch padded with weight 0."""

        def __init__(self, x: np.ndarray, y: np.ndarray, spec: DataSpec, global_batch: int, replicas: int,
                     most: Optional[int] = None) -> None:
            super().__init__(workers=1, use_multiprocessing=False)
            self.x, self.y, self.spec = x, y, spec
            self.global_batch, self.replicas = global_batch, replicas
            whole = math.ceil(len(x) / global_batch)
            self.steps = whole if most is None else min(most, whole)

        def __len__(self) -> int:
            return self.steps

        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            if not 0 <= index < self.steps:
                raise IndexError(index)
            chosen = np.arange(index * self.global_batch, min(len(self.x), (index + 1) * self.global_batch))
            weights = np.ones(len(chosen), np.float32)
            pad = -len(chosen) % self.replicas
            if pad:
                chosen = np.concatenate([chosen, np.full(pad, chosen[-1])])
                weights = np.concatenate([weights, np.zeros(pad, np.float32)])
            x, y = transform_numpy(self.spec, self.x[chosen], self.y[chosen])
            return x, y, weights

    return TrainFeed, EvalFeed


def train_steps(samples: int, global_batch: int, replicas: int, most: Optional[int] = None) -> tuple[int, int]:
    """``(steps per epoch, samples in the last batch)`` for training on ``replicas`` devices, at most ``most``
    steps (``train.steps_per_epoch``: then full batches).

    The last partial batch is rounded down to a multiple of ``replicas``; when
    that leaves nothing, it is dropped. Example: 22,699 samples, global batch
    128 on 2 devices -> 178 steps, the last of 42 samples (43 rounded down).

    Raises:
        DataError: fewer samples than devices (no batch could be split).
    """
    if samples < replicas:
        raise DataError(f"the training split has {samples} sample(s), fewer than the {replicas} devices the batch "
                        "is split over.", "use more data, or fewer devices (devices.visible_gpus).")
    full, rest = divmod(samples, global_batch)
    rest -= rest % replicas
    steps, last = (full + 1, rest) if rest else (full, global_batch)
    return (most, global_batch) if most is not None and most < steps else (steps, last)


def build_feeds(data: Data, global_batch: int, replicas: int, seed: Optional[int], train: bool = True,
                cuts: Any = None) -> Pipelines:
    """The training, validation and test feeds of in-memory data, for Keras on JAX.

    Args:
        data: the loaded data; every split in memory (``x``, ``y`` NumPy arrays).
        global_batch: samples per step over all devices (per-replica batch x ``replicas``).
        replicas: the devices each batch is split over.
        seed: the shuffle seed (``tensorflow.seed``); ``None``: a random one.
        train: build the training feed (``False`` for ``tfgpu evaluate``: the
            training split may be left undecoded).
        cuts: a :class:`~tfgpu.data.pipeline.Cuts`: the steps each pass is cut to (its ``accumulation`` must be
            1 on JAX, :func:`tfgpu.training.loops.gradients.check`).

    Returns:
        :class:`~tfgpu.data.pipeline.Pipelines` whose datasets are ``PyDataset``\\ s
        (``train_epochs(epochs, skip)`` one for the whole run, as on TensorFlow).

    Raises:
        DataError: a split is not in memory (callers decode streamed splits first).
    """
    train_feed, eval_feed = _classes()
    cuts = cuts or Cuts()
    seed = seed if seed is not None else int(np.random.SeedSequence().entropy % 2**32)

    def evaluation(split: Optional[Split], most: Optional[int]) -> tuple[Any, int]:
        if split is None:
            return None, 0
        feed = eval_feed(in_memory(split).x, split.y, data.spec, global_batch, replicas, most)
        return feed, len(feed)

    def in_memory(split: Split) -> Split:
        if not split.in_memory:
            raise DataError(f"data ({split.name}: {split.origin}) is not in memory; the JAX backend reads "
                            "every split from memory.", "set data.cache: true, or use a smaller dataset.")
        return split

    validation, validation_steps = evaluation(data.validation, cuts.validation_steps)
    test, test_steps = evaluation(data.test, cuts.test_steps)
    if not train:
        return Pipelines(None, validation, test, 0, validation_steps, test_steps, {})
    split = in_memory(data.train)
    steps, last = train_steps(len(split.x), global_batch, replicas, cuts.steps_per_epoch)

    def train_epochs(epochs: int, skip: int = 0) -> Any:
        return train_feed(split.x, split.y, data.spec, global_batch, replicas, seed, epochs, skip,
                          cuts.steps_per_epoch)

    left_out = len(split.x) - (steps - 1) * global_batch - last
    info = {"feed": {"kind": "keras.utils.PyDataset (NumPy, no TensorFlow)", "devices": replicas,
                     "last_train_batch": last, "train_samples_left_out_per_epoch": left_out,
                     "evaluation_padding": "the last batch padded to a multiple of the devices, sample weight 0"}}
    return Pipelines(train_epochs(1), validation, test, steps, validation_steps, test_steps, info, train_epochs)


def prepare_for_jax(source: Source, cfg: DataConfig, context: LoadContext, replicas: int,
                    train: bool = True, cuts: Any = None) -> tuple[Data, Pipelines]:
    """Keras on JAX, :func:`tfgpu.data.prepare`'s counterpart: a checked source's data, in memory, and its
    ``keras.utils.PyDataset`` feeds (:func:`build_feeds`).

    Call after :func:`tfgpu.setup` with ``backend: jax``; ``replicas`` are the
    devices each global batch (``context.global_batch_size``) is split over.

    In-memory sources (mnist, keras, arrays, csv, NumPy from a builder) need no
    TensorFlow. Streamed splits are decoded into memory first with tf.data,
    which needs TensorFlow (installed beside JAX it only reads data: Keras's
    ``TF_FORCE_GPU_ALLOW_GROWTH=true`` keeps it off the GPUs' memory).

    Raises:
        DataError: the kind needs TensorFlow and it is not installed; a builder
            that returns pre-batched datasets; a split too large for memory.
    """
    from ..devices.jax_apply import tensorflow_importable  # noqa: PLC0415

    kind = cfg.kind
    missing_tf = (f"data.kind: {kind} needs TensorFlow, which is not installed here; with backend: jax tfgpu reads "
                  "data without TensorFlow only from memory (kinds mnist, keras, arrays, csv, or a builder "
                  "returning NumPy arrays)")
    fix = ("pip install tensorflow-cpu (tf.data only; JAX keeps the GPUs), or write the data out as arrays "
           "(data.kind: arrays, a .npz file)")
    if kind in NEEDS_TENSORFLOW and not tensorflow_importable():
        raise DataError(f"{missing_tf}: it {NEEDS_TENSORFLOW[kind]}.", fix)
    try:
        data = source.load(context)
    except ModuleNotFoundError as exc:
        if exc.name != "tensorflow":
            raise
        raise DataError(f"{missing_tf}: it imported TensorFlow.", fix) from None
    streamed = [s for s in data.splits() if not s.in_memory and (train or s.name != "train")]
    if any(s.batches is not None for s in streamed):
        raise DataError("data.batched: true: the builder's datasets are batched by tf.data, and with backend: jax "
                        "tfgpu batches the data itself, so that each global batch divides over the devices.",
                        "set data.batched: false and return unbatched samples (or NumPy arrays).")
    if streamed and not tensorflow_importable():
        raise DataError(f"{missing_tf}: its splits are tf.data datasets.", fix)
    # Decodes streamed splits into memory (tf.data); in-memory splits pass through without TensorFlow.
    data, cache = materialize(data, cfg.model_copy(update={"cache": True}), context.seed,
                              skip=() if train else ("train",))
    left = [s.name for s in data.splits() if not s.in_memory and (train or s.name != "train")]
    if left:
        raise DataError(f"data ({', '.join(left)}): too large to decode into memory ({cache[left[0]]}); with "
                        "backend: jax tfgpu reads every split from memory.",
                        "use backend: tensorflow (which streams it), or less data.")
    pipes = build_feeds(data, context.global_batch_size, replicas, context.seed, train, cuts)
    pipes.info["cache"] = cache
    return data, pipes
