"""The shared fast path: any source's :class:`~tfgpu.data.base.Data` -> the ``tf.data`` pipelines the loops read.

In memory (``kind: mnist``, ``keras``, ``arrays``, ``csv``, NumPy from a
builder, and every streamed source with ``cache: true`` once decoded): the
samples stay in memory once, as one array in their stored dtype (uint8 images)
that TensorFlow reads in place (:func:`aligned`, :func:`held_bytes`); each
epoch the sample *indices* are shuffled (one permutation per epoch from
``tensorflow.seed``), batched into global batches, and each batch is gathered,
cast to float32, rescaled and given its channel axis in one vectorised
``map`` (parallel), then prefetched; validation and test batches are gathered
the same way, in order. Shuffling indices instead of samples is what makes it
cheap (about 1.7x the samples/s of shuffling MNIST's images, measured on 2 cores).

Streamed (``image_folder``, ``tfrecord``, unbatched builder datasets): with
``cache: true`` (the default) a split is decoded once, before training, with
parallel decoding, into memory, and then takes the path above; so every epoch,
the first included, runs at the in-memory speed, and a file that cannot be
decoded is a data error before anything is written. It is streamed instead when
``cache`` is ``false``, a folder (``tf.data.Dataset.cache`` files there), or
when the decoded splits together would take more than half of the memory available
(shared by the workers on one host: :func:`memory_allowance`):
files are read in parallel (``interleave`` / parallel ``map``), reshuffled
(file order, then a ``shuffle_buffer`` of samples, default 10,000), batched,
transformed as above, prefetched.

Common to both: the last partial batch is kept and its batch dimension is
``None`` from the start (no retrace), auto-sharding is explicit, and tf.data's
model-based autotuner is off (its thread stalled the destruction of
MirroredStrategy iterators for seconds; see ``options``).

Wraps: https://www.tensorflow.org/api_docs/python/tf/data/Dataset and
https://www.tensorflow.org/guide/data_performance
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Collection, Optional

from ..config import DataConfig
from ..errors import DataError
from ..utils.lazy import numpy as np
from .base import Data, DataSpec, Reader, Split, tf_error_text

#: A streamed split is decoded into memory (``cache: true``) only if it takes at most
#: this fraction of the memory available when the run starts (shared by the workers on one
#: host: :func:`memory_allowance`).
MEMORY_FRACTION = 0.5
#: Arrays held in memory start at a multiple of this many bytes, so that TensorFlow can use their
#: buffer in place (a tensor's buffer must be aligned to Eigen's ``EIGEN_MAX_ALIGN_BYTES``, 64 on
#: x86 builds with AVX-512). NumPy's large arrays start 16 bytes into a page; ``tf.constant``
#: copies any array, and an unaligned one twice over (docs/data.md#memory has the commands).
ALIGNMENT = 64
#: Bytes a training sample adds in memory: its place in the epoch's order (an int32 index) and,
#: while an epoch's order is drawn, in the range it is drawn from.
INDEX_BYTES = 8
#: The ``cache`` summary of a builder's batched split whose float32 batches are cached in memory.
BATCHES_CACHED = "memory (float32 batches cached in the first epoch"
#: Samples in the shuffle buffer of a streamed split, unless ``data.shuffle_buffer`` says otherwise.
STREAM_SHUFFLE_BUFFER = 10_000


@dataclass(frozen=True)
class Pipelines:
    """The datasets the loops read, with their step counts.

    Attributes:
        train: global batches ``(x float32 (batch, *input_shape), y (batch, *target_shape))``, one pass.
        train_epochs: ``(epochs, skip) -> dataset``: ``epochs`` passes of ``train`` (each reshuffled), less
            the first ``skip`` batches, the one dataset a loop reads for a whole run. Resuming from global
            step ``skip`` reads exactly the batches an uninterrupted run reads from there when
            ``tensorflow.seed`` is set; the skipped batches are not transformed (in memory: only their
            sample indices are drawn), so skipping is cheap.
        validation, test: the same, in a fixed order, or ``None``.
        steps_per_epoch, validation_steps, test_steps: batches in one pass of each (0 when absent).
        info: what was done, for the run summary: ``cache`` (per split: memory,
            file or none, with why), ``sharding`` (the auto-shard policy and why).
        global_batch: the rows of a global batch (an epoch's last batch may have fewer).
        train_blocks: ``train_epochs`` also takes ``block`` (an int): each element then holds the rows of
            ``block`` consecutive global batches, in order (an epoch's last element the epoch's remaining
            batches; the first, after ``skip``, starts at batch ``skip``), so that a loop can gather and
            transform the batches of a whole call at once (:class:`tfgpu.training.loops.replica_batches.Blocks`).
            Only an in-memory training split drawn in a whole permutation per epoch, without augmentation or
            class weights, can (``False`` otherwise).
    """

    train: Any
    validation: Any
    test: Any
    steps_per_epoch: int
    validation_steps: int
    test_steps: int
    info: dict[str, Any] = field(default_factory=dict)
    train_epochs: Any = None
    global_batch: int = 0
    train_blocks: bool = False


def options(policy: str = "DATA", rewrite: bool = True) -> Any:
    """``tf.data.Options``: the auto-shard policy, and tf.data's model-based autotuner off.

    ``rewrite=False`` (in-memory splits) also turns tf.data's default static
    optimisations off: applying them rewrites the dataset's graph, and the
    rewrite copies the tensors its functions capture, here the whole split
    (docs/data.md#memory has the command). They have nothing to fuse in that
    pipeline (the ``map`` is parallel and followed by a ``prefetch`` already).
    Without the rewrite, ``tf.distribute``'s iterators over them crash unless
    :func:`keep_multi_device_inputs_alive` is installed (``_in_memory`` does).

    The autotuner runs a thread per iterator whose timed wait (doubling up to
    60 s) an iterator's destruction waits out (gdb: ~RootDataset::Iterator ->
    Model::OptimizeLoop): 0.5-15 s stalls when iterators were replaced, in 2
    runs of 4; none in 6 runs with it off, at the same samples/s.
    (MirroredStrategy's per-device datasets still autotune; see loops/custom.py.)
    AUTOTUNE then means: ``map`` with one call per core of tf.data's thread
    pool, prefetch with its legacy autotuner (the buffer grows while the
    consumer waits).
    """
    import tensorflow as tf  # noqa: PLC0415

    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
    opts.autotune.enabled = False
    if not rewrite:
        opts.experimental_optimization.apply_default_optimizations = False
    return opts


def choose_sharding(files: int, workers: int, in_memory: bool) -> tuple[str, str]:
    """The auto-shard policy for one split, and why.

    ``FILE`` (each worker reads its own files) when the split is read from at
    least as many files as there are workers; else ``DATA`` (each worker takes
    its part of every global batch). With one worker nothing is sharded between
    workers, and MirroredStrategy splits each global batch across the replicas.
    """
    if workers <= 1:
        return "DATA", "one worker: each replica takes its slice of every global batch"
    if not in_memory and files >= workers:
        return "FILE", f"{files} files for {workers} workers: each worker reads its own files"
    why = "in memory" if in_memory else f"{files} file(s) for {workers} workers"
    return "DATA", f"{why}: each worker takes its part of every global batch"


def transform(spec: DataSpec) -> Any:
    """The batch transform ``(x, y) -> (x', y')``: x to float32, rescaled, channel axis; y to its training dtype."""
    import tensorflow as tf  # noqa: PLC0415

    label_dtype = tf.as_dtype(spec.label_dtype)

    def apply(x: Any, y: Any) -> tuple[Any, Any]:
        x = tf.cast(x, tf.float32)
        if spec.rescale is not None:
            x = x * spec.rescale
        if spec.add_channel:
            x = tf.expand_dims(x, -1)
        return x, (tf.cast(y, label_dtype) if y.dtype != label_dtype else y)

    return apply


def transform_numpy(spec: DataSpec, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`transform` in NumPy, for a few samples (the model check) and normalisation statistics."""
    x = x.astype(np.float32)
    if spec.rescale is not None:
        x = x * np.float32(spec.rescale)
    if spec.add_channel:
        x = x[..., None]
    return x, y.astype(spec.label_dtype)


def available_bytes() -> Optional[int]:
    """Memory available to this process now (``MemAvailable``), in bytes, or ``None`` if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_allowance(available: Optional[int], workers_on_host: int = 1) -> Optional[float]:
    """Bytes this worker's decoded splits may take together, or ``None`` when the memory available is unknown.

    :data:`MEMORY_FRACTION` of ``available``, shared equally by the workers on
    this host (``tfgpu run --workers N`` starts N on one machine, and each holds
    its own copy of the data): 2 workers on one host get a quarter each.
    """
    return None if available is None else MEMORY_FRACTION * available / max(1, workers_on_host)


def decoded_bytes(spec: DataSpec, samples: int) -> int:
    """Bytes a split's inputs take in memory, decoded (stored dtype, e.g. uint8 images)."""
    return samples * int(math.prod(spec.sample_shape)) * np.dtype(spec.x_dtype).itemsize


def label_bytes(spec: DataSpec, samples: int) -> int:
    """Bytes a split's labels take in memory (their stored dtype)."""
    return samples * int(math.prod(spec.target_shape)) * np.dtype(spec.label_dtype).itemsize


def held_bytes(spec: DataSpec, samples: int, train: bool = False, workers: int = 1) -> int:
    """Bytes a split held in memory takes (what the budget counts).

    Inputs and labels in their stored dtypes, and for training :data:`INDEX_BYTES`
    a sample. Besides the batches in flight, that is all the pipeline keeps on
    one worker: TensorFlow reads the arrays in place (:func:`aligned`), and
    in-memory batches are gathered every epoch, not cached. With several
    ``workers``, twice the arrays: tf.distribute's auto-sharding rewrites each
    worker's dataset graph, and the rewrite copies the tensors it captures.
    """
    arrays = (decoded_bytes(spec, samples) + label_bytes(spec, samples)) * (2 if workers > 1 else 1)
    return arrays + (samples * INDEX_BYTES if train else 0)


def cached_bytes(spec: DataSpec, samples: int) -> int:
    """Bytes a ``tf.data`` cache of transformed batches takes: float32 inputs (4x uint8) and the labels."""
    return samples * int(math.prod(spec.input_shape)) * 4 + label_bytes(spec, samples)


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous array whose buffer starts at a multiple of :data:`ALIGNMENT` bytes."""
    dtype = np.dtype(dtype)
    nbytes = int(math.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def shareable(a: np.ndarray) -> bool:
    """TensorFlow can hold ``a``'s buffer in place (through DLPack): numbers, C-contiguous, writeable, aligned."""
    return bool(a.dtype.kind in "iuf" and a.dtype.isnative and a.flags.c_contiguous and a.flags.writeable
                and a.ctypes.data % ALIGNMENT == 0)


def aligned(a: np.ndarray, dtype: Any = None) -> np.ndarray:
    """``a`` (as ``dtype``) itself where TensorFlow can hold it in place (:func:`shareable`), else an aligned copy."""
    dtype = a.dtype.newbyteorder("=") if dtype is None else np.dtype(dtype)
    if (a.dtype == dtype and shareable(a)) or dtype.kind not in "iuf":
        return a if a.dtype == dtype else a.astype(dtype)
    out = aligned_empty(a.shape, dtype)
    out[...] = a
    return out


def to_memory(dataset: Any, what: str, spec: Optional[DataSpec] = None,
              reader: Optional[Reader] = None, size: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
    """Read a dataset of ``(x, y)`` samples once, in parallel, into NumPy arrays.

    With ``spec`` and the number of samples (``size``) known, the samples are
    written straight into :func:`aligned_empty` arrays of the stored dtypes: one
    copy held, never two (:func:`held_bytes`). Otherwise (or when ``size`` was
    wrong) the batches are joined at the end.

    Raises:
        DataError: a sample cannot be decoded (naming the file, when the reader can find it).
    """
    import tensorflow as tf  # noqa: PLC0415

    xs, ys = [], []
    filled, x_all, y_all = 0, None, None
    if spec is not None and size:
        x_all = aligned_empty((size, *spec.sample_shape), spec.x_dtype)
        y_all = aligned_empty((size, *spec.target_shape), spec.label_dtype)
    try:
        for x, y in dataset.batch(1024).prefetch(tf.data.AUTOTUNE).as_numpy_iterator():
            if (x_all is not None and not xs and filled + len(x) <= size and x.shape[1:] == x_all.shape[1:]
                    and y.shape[1:] == y_all.shape[1:]):
                x_all[filled:filled + len(x)], y_all[filled:filled + len(x)] = x, y
                filled += len(x)
                continue
            xs.append(x)
            ys.append(y)
    except (tf.errors.OpError, ValueError) as exc:
        where = reader.locate_error(exc) if reader is not None else None
        raise DataError(
            f"{what}: a sample cannot be read: {where or tf_error_text(exc)}.",
            "replace or remove that file (or record); images of different sizes need data.image_size.",
        ) from None
    if x_all is not None and not xs and filled == size:
        return x_all, y_all
    if filled:  # the count was not the size: join what was read
        xs.insert(0, x_all[:filled])
        ys.insert(0, y_all[:filled])
    if not xs:
        raise DataError(f"{what}: there are no samples.", "check the source's files.")
    return (_joined(xs, spec.x_dtype if spec is not None else xs[0].dtype),
            _joined(ys, spec.label_dtype if spec is not None else ys[0].dtype))


def _joined(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """``np.concatenate(parts).astype(dtype)`` into one :func:`aligned_empty` array (no second copy)."""
    out = aligned_empty((sum(len(p) for p in parts), *parts[0].shape[1:]), dtype)
    start = 0
    for part in parts:
        out[start:start + len(part)] = part
        start += len(part)
    return out


def _cache_dir(setting: str, data_cfg: DataConfig, split: Split) -> Path:
    """``data.cache: <folder>``: the cache file prefix for one split, named after what it holds.

    tf.data reuses a cache file whatever it holds, so the name carries a digest
    of the data section and the split's origin: another config never reads it.
    """
    digest = hashlib.sha256(json.dumps([data_cfg.model_dump(mode="json"), split.origin, split.size],
                                       sort_keys=True).encode()).hexdigest()[:12]
    folder = Path(os.path.expandvars(setting)).expanduser()
    return folder / f"tfgpu-{split.name}-{digest}"


def materialize(data: Data, data_cfg: DataConfig, seed: Optional[int] = None,
                skip: tuple[str, ...] = (), workers_on_host: int = 1, global_batch: Optional[int] = None,
                workers: int = 1) -> tuple[Data, dict[str, str]]:
    """With ``cache: true``, decode each streamed split into memory (when it fits); else leave it streamed.

    The splits decoded together may take at most :func:`memory_allowance`:
    :data:`MEMORY_FRACTION` of the memory available, divided by the workers on
    this host. A split counts what it will hold (:func:`held_bytes`: twice its
    arrays with several ``workers``); a builder's batched validation or test
    split, whose float32 batches ``tf.data`` caches in its first epoch, counts
    those (:func:`cached_bytes` of ``size x global_batch`` samples, at most) and
    is read every epoch instead when they do not fit. ``skip`` names splits that
    are not needed (``tfgpu evaluate`` does not train, so it does not decode the
    training split).

    Returns:
        The data (streamed splits replaced by in-memory ones where decoded), and
        per split what was done, in words, for the run summary.

    Raises:
        DataError: a sample cannot be decoded (with the file, where the reader can tell).
    """
    info: dict[str, str] = {}
    splits = {}
    available = available_bytes()
    allowance = memory_allowance(available, workers_on_host)  # for all splits together

    def too_big(need: int, what: str) -> str:
        shared = f", shared by the {workers_on_host} workers on this host," if workers_on_host > 1 else ""
        return (f"none: {what} it would take {_size(need)}; half of the {_size(available)} available{shared} "
                f"leaves {_size(allowance)} for it")

    for split in data.splits():
        if split.in_memory:
            held = held_bytes(data.spec, len(split.x), split.name == "train", workers)
            info[split.name] = f"memory (read before training: {_size(held)})"
            if allowance is not None:  # what it will hold beyond its arrays, which MemAvailable already lacks
                allowance = max(0.0, allowance - (held - held_bytes(data.spec, len(split.x))))
            continue
        if split.name in skip:
            info[split.name] = "none (not needed)"
            continue
        if split.batches is not None:
            need = cached_bytes(data.spec, split.size * global_batch) if global_batch and split.size else 0
            if data_cfg.cache is not True or split.name == "train" or not need:
                info[split.name] = "none (batched by the builder)"
            elif allowance is None or need <= allowance:
                info[split.name] = f"{BATCHES_CACHED}: at most {_size(need)})"
                allowance = allowance - need if allowance is not None else None
            else:
                info[split.name] = too_big(need, "cached as float32 batches") + "; read from the builder every epoch"
            continue
        need = held_bytes(data.spec, split.size or 0, split.name == "train", workers)
        if data_cfg.cache is True and (allowance is None or need <= allowance):
            x, y = to_memory(split.reader.dataset(shuffle=False, seed=seed), f"data ({split.name}: {split.origin})",
                             data.spec, split.reader, split.size)
            splits[split.name] = split.with_arrays(x, y)
            info[split.name] = f"memory (decoded once before training: {_size(need)})"
            allowance = allowance - need if allowance is not None else None
        elif data_cfg.cache is True:
            info[split.name] = too_big(need, "decoded") + "; set data.cache to a folder to cache on disk"
        elif data_cfg.cache is False:
            info[split.name] = "none (data.cache: false): read and decoded every epoch"
        else:
            info[split.name] = f"file {_cache_dir(data_cfg.cache, data_cfg, split)}"
    if splits:
        data = replace(data, **{name: splits.get(name, getattr(data, name))
                                for name in ("train", "validation", "test")})
    if data.spec.task == "classification" and (data.spec.num_classes is None or splits):
        data = replace(data, spec=replace(data.spec, num_classes=_classes(data, skip)))
    return data, info


def _size(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _classes(data: Data, skip: tuple[str, ...] = ()) -> int:
    """The classes, checked against every label held in memory (a builder's labels are first read here).

    Without ``num_classes`` in the spec: the largest label + 1.

    Raises:
        DataError: a label outside ``[0, num_classes)``, or no ``num_classes`` for streamed labels.
    """
    held = [s for s in data.splits() if s.in_memory]
    if data.spec.num_classes is None and any(not s.in_memory and s.name not in skip for s in data.splits()):
        raise DataError(
            "data.num_classes: the builder's datasets have class labels and are streamed (not read into memory), "
            "so tfgpu cannot count the classes.",
            "set data.num_classes to the number of classes.",
        )
    low = min(int(s.y.min()) for s in held)
    top = max(int(s.y.max()) for s in held)
    count = data.spec.num_classes or max(2, top + 1)
    if low < 0 or top >= count:
        raise DataError(f"{data.spec.source}: a label is {low if low < 0 else top}, outside [0, {count}); class "
                        f"labels must be the numbers 0 to {count - 1}.",
                        "renumber the labels from 0, or set data.num_classes to the number of classes.")
    return count


def sample_batch(data: Data, n: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` training samples as the pipeline delivers them (float32 inputs with their channel axis)."""
    split = data.train
    if split.in_memory:
        return transform_numpy(data.spec, split.x[:n], split.y[:n])
    ds = split.batches() if split.batches is not None else split.reader.dataset(shuffle=False, seed=None).batch(n)
    x, y = next(ds.take(1).as_numpy_iterator())
    return transform_numpy(data.spec, x[:n], y[:n])


def normalization_stats(data: Data) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the training inputs per feature (the last axis), as the model sees them.

    In memory: computed in NumPy in chunks (float64 sums); streamed: one pass
    over the training split. The same numbers ``keras.layers.Normalization.adapt``
    computes (population variance).
    """
    split, spec = data.train, data.spec
    if split.in_memory:
        chunks = (split.x[i:i + 8192] for i in range(0, len(split.x), 8192))
    else:
        ds = split.batches() if split.batches is not None else split.reader.dataset(False, None).batch(4096)
        chunks = (x for x, _ in ds.as_numpy_iterator())
    total = count = total_sq = 0
    for x in chunks:
        x, _ = transform_numpy(spec, x, np.zeros(len(x)))
        flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
        total = total + flat.sum(axis=0)
        total_sq = total_sq + (flat * flat).sum(axis=0)
        count += len(flat)
    mean = total / count
    variance = np.maximum(total_sq / count - mean * mean, 0.0)
    return mean.astype(np.float32), variance.astype(np.float32)


def keep_multi_device_inputs_alive() -> bool:
    """Work around a use-after-free in TensorFlow's ``MultiDeviceIterator`` that in-memory splits expose.

    ``tf.distribute`` (``MirroredStrategy``, Keras's ``fit``/``evaluate``, the
    custom loop) reads a dataset through an ``OwnedMultiDeviceIterator``, which
    wraps it in a new ``with_options`` dataset that only the iterator's C++
    resource holds. When tf.data has no optimisation to apply (in-memory splits:
    ``rewrite=False`` in :func:`options`), the iterator's ``RootDataset`` borrows
    that dataset instead of owning a rewritten copy, and ``~MultiDeviceIterator``
    (TF 2.21) releases it before it stops its background thread. An iterator
    destroyed while that thread is inside ``GetNext`` (Keras does this in every
    ``evaluate``: ``_maybe_symbolic_build`` reads one batch, then
    ``EpochIterator.reset`` drops the iterator) lets the thread call into freed
    memory: SIGSEGV (exit 139) in about 1 run in 20 of ``recipes/mnist.yaml``,
    or a hang. Here each such iterator also holds the dataset it was
    initialised with, as its last attribute, so it is released after the
    iterator's resources, when the background thread has stopped.

    Returns:
        ``True`` once installed (idempotent); ``False`` where this TensorFlow lacks the code it wraps.
    """
    import threading  # noqa: PLC0415

    from tensorflow.python.data.ops import multi_device_iterator_ops as mdi  # noqa: PLC0415

    owned = getattr(mdi, "OwnedMultiDeviceIterator", None)
    if owned is not None and getattr(owned, "_tfgpu_keeps_dataset", False):
        return True
    ops = getattr(mdi, "gen_dataset_ops", None)
    if owned is None or not hasattr(ops, "multi_device_iterator_init"):
        return False
    passed = threading.local()

    class _Ops:  # gen_dataset_ops as multi_device_iterator_ops sees it, noting the dataset an iterator starts on
        def __getattr__(self, name: str) -> Any:
            return getattr(ops, name)

        def multi_device_iterator_init(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
            passed.dataset = dataset
            return ops.multi_device_iterator_init(dataset, *args, **kwargs)

    init = owned.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        passed.dataset = None
        try:
            init(self, *args, **kwargs)
            self._tfgpu_dataset = passed.dataset  # set last: attributes are released in the order they were set
        finally:
            passed.dataset = None

    mdi.gen_dataset_ops = _Ops()
    owned.__init__ = __init__
    owned._tfgpu_keeps_dataset = True
    return True


def _held(a: np.ndarray) -> Any:
    """``a`` as a CPU tensor on the same buffer (DLPack, no copy) where it is :func:`shareable`, else a copy."""
    import tensorflow as tf  # noqa: PLC0415

    if shareable(a):
        try:
            return tf.experimental.dlpack.from_dlpack(a.__dlpack__())  # holds a reference to ``a``
        except (AttributeError, BufferError, TypeError, ValueError, tf.errors.OpError):
            pass  # NumPy or TensorFlow without it: a copy
    return tf.constant(a)


def _in_memory(split: Split, spec: DataSpec, global_batch: int, opts: Any, train: bool,
               shuffle_buffer: Optional[int], seed: Optional[int], most: Optional[int] = None) -> Any:
    """A split held in memory: the validation/test dataset, or for training ``(epochs, skip) -> dataset``.

    The arrays are held once: the tensors the batches are gathered from share
    their buffers (:func:`_held`), and validation and test batches are gathered
    in order every pass, like training batches, instead of being cached as
    float32 (4x the uint8 images). A training split with weights (``split.w``) gives ``(x, y, w)`` batches,
    each sample's weight gathered with it.
    """
    import tensorflow as tf  # noqa: PLC0415

    apply = transform(spec)
    n = len(split.x)
    keep_multi_device_inputs_alive()  # these pipelines run without tf.data's rewrite (options)
    x, y = _held(split.x), _held(split.y)
    w = _held(aligned(np.asarray(split.w), np.float32)) if train and split.w is not None else None

    def gather(i: Any) -> tuple:
        batch = apply(tf.gather(x, i), tf.gather(y, i))
        return batch if w is None else (*batch, tf.gather(w, i))

    def gathered(indices: Any) -> Any:
        ds = indices.map(gather, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.prefetch(tf.data.AUTOTUNE).with_options(opts)

    if not train:
        return gathered(tf.data.Dataset.range(n).batch(global_batch).take(-1 if most is None else most))
    if windowed(shuffle_buffer, n):  # a window of the samples, as tf.data shuffles
        window = tf.data.Dataset.range(n).shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        window = window.batch(global_batch).take(-1 if most is None else most)  # (each repeat reshuffles)
        return lambda epochs, skip=0: gathered(window.repeat(epochs).skip(skip))  # skipped: indices only
    # All samples: each epoch's order is one tensor of indices (INDEX_BYTES), drawn from (seed, epoch); a
    # shuffle buffer of all the indices would hold a tensor each, about 215 bytes an index (docs/data.md#memory).
    key = tf.constant(seed if seed is not None else int(np.random.default_rng().integers(2**31)), tf.int64)
    index_dtype = tf.int32 if n < 2**31 else tf.int64
    steps = _cut(math.ceil(n / global_batch), most)
    used = min(n, steps * global_batch)  # train.steps_per_epoch: the first rows of each epoch's order

    def epochs_of(epochs: int, skip: int = 0, block: int = 1) -> Any:
        first, skip = divmod(skip, steps)  # whole epochs are not drawn; a skipped batch costs its indices only
        done = tf.constant(skip * global_batch, tf.int64)  # samples of the first epoch already trained on

        def batches_of(epoch: Any) -> Any:
            order = tf.random.experimental.stateless_shuffle(tf.range(n, dtype=index_dtype),
                                                             seed=tf.stack([key, epoch]))
            order = order[tf.cast(done * tf.cast(epoch == first, tf.int64), index_dtype):used]
            return tf.data.Dataset.from_tensor_slices(order).batch(global_batch * block)

        indices = tf.data.Dataset.range(first, max(first, epochs)).flat_map(batches_of)
        if block == 1:
            return gathered(indices)
        # A block is one call's batches: gathered one at a time, the next while the call trains (BLOCK_BYTES)
        return indices.map(gather).prefetch(1).with_options(opts)

    return epochs_of


def windowed(shuffle_buffer: Optional[int], samples: int) -> bool:
    """Whether an in-memory training split is shuffled in a window (``data.shuffle_buffer`` below its size)
    rather than drawn in a whole permutation each epoch."""
    return shuffle_buffer is not None and shuffle_buffer < samples


def _streamed(split: Split, spec: DataSpec, data_cfg: DataConfig, global_batch: int, opts: Any, train: bool,
              seed: Optional[int], cache_batches: bool = True, most: Optional[int] = None) -> Any:
    """A streamed split: the validation/test dataset, or for training ``(epochs, skip) -> dataset``.

    ``cache_batches``: a builder's batched validation/test split is cached in
    memory, as float32 batches, in its first pass (with ``cache: true``).
    """
    import tensorflow as tf  # noqa: PLC0415

    apply = transform(spec)
    if split.batches is not None:
        ds = split.batches().take(-1 if most is None else most)
        if data_cfg.cache is True and not train and cache_batches:
            ds = ds.map(apply, num_parallel_calls=tf.data.AUTOTUNE).cache()
            return ds.prefetch(tf.data.AUTOTUNE).with_options(opts)
    else:
        reader = split.reader
        on_disk = isinstance(data_cfg.cache, str)
        # Cached on disk, the order is fixed by the cache; otherwise the reader reshuffles its files.
        ds = reader.dataset(shuffle=train and not on_disk, seed=seed)
        if on_disk:
            prefix = _cache_dir(data_cfg.cache, data_cfg, split)
            prefix.parent.mkdir(parents=True, exist_ok=True)
            ds = ds.cache(str(prefix))
        if train and (on_disk or not reader.shuffles):
            ds = ds.shuffle(data_cfg.shuffle_buffer or STREAM_SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True)
        ds = ds.batch(global_batch)
    batches = ds.take(-1 if most is None else most)  # train.steps_per_epoch: each repeat reads its first batches

    def epochs_of(epochs: int, skip: int = 0) -> Any:
        ds = batches.repeat(epochs).skip(skip)  # a skipped batch is read, not transformed
        return ds.map(apply, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE).with_options(opts)

    return epochs_of if train else epochs_of(1)


def training_extras(data: Data, data_cfg: DataConfig, seed: Optional[int], class_weight: Any = None
                    ) -> tuple[Any, dict[str, Any]]:
    """``data.augment`` (``augment_on: pipeline``) and ``train.class_weight`` as one batch function, and what
    they are for the run summary.

    Returns:
        ``(post, info)``: ``post(step, (x, y)) -> (x', y[, w])`` for the training
        batches (``None`` when there is nothing to do), and ``{"augment": ...,
        "class_weight": ..., "sample_weight": {source, min, max, mean}}`` (``summary.json``'s
        ``data`` section; the training batches carry sample weights already, :func:`_in_memory`, and class
        weights multiply them).

    Raises:
        ConfigError: augmentation of non-image inputs, a size-changing layer in the pipeline; class weights
            for a regression task or a class the data does not have, ``balanced`` without the training labels
            in memory.
    """
    from ..config.keras_specs import spec_of  # noqa: PLC0415
    from ..errors import ConfigError  # noqa: PLC0415
    from . import augment, weights  # noqa: PLC0415

    spec, info, steps = data.spec, {}, []
    if data.train.w is not None:  # data.sample_weight / data.keys.sample_weight, after validation_split
        w = np.asarray(data.train.w, np.float64)
        info["sample_weight"] = {"source": spec.details.get("sample_weight"), "min": round(float(w.min()), 6),
                                 "max": round(float(w.max()), 6), "mean": round(float(w.mean()), 6)}
    if data_cfg.augment:
        augment.check_data(data_cfg.augment, spec.input_shape, data_cfg.augment_on)
        value_range = augment.value_range_of(spec)
        info["augment"] = {"layers": [spec_of(item)[0] for item in data_cfg.augment],
                           "on": data_cfg.augment_on, "seed": seed,
                           "value_range": list(value_range) if value_range else None}
        if data_cfg.augment_on == "pipeline":
            layers = augment.build_layers(data_cfg.augment, seed, value_range)
            steps.append(augment.augmenter(layers, seed))
    if class_weight is not None:
        if class_weight == "balanced" and not data.train.in_memory and spec.task == "classification":
            raise ConfigError(
                "train.class_weight: balanced counts the training labels, and this training split is streamed, "
                "not held in memory.", "set data.cache: true, or give the weights: {class: weight}.")
        labels = data.train.y if data.train.in_memory else np.zeros(0, np.int64)
        table = weights.resolve(class_weight, labels, spec.task, spec.num_classes, spec.class_names,
                                spec.target_shape)
        info["class_weight"] = {"setting": class_weight, "weights": weights.describe(table, spec.class_names)}
        weigh = weights.weigher(table, spec.target_shape)
        steps.append(lambda step, batch: weigh(*batch))
    if not steps:
        return None, info

    def post(step: Any, batch: Any) -> Any:
        for fn in steps:
            batch = fn(step, batch)
        return batch

    return post, info


@dataclass(frozen=True)
class Cuts:
    """How the training batches are grouped and how much of each split an epoch reads.

    Attributes:
        accumulation: global batches per training step (``train.gradient_accumulation_steps``): a training batch
            holds ``accumulation x global_batch`` rows, which the step runs as micro-batches.
        steps_per_epoch: at most this many training steps an epoch (``train.steps_per_epoch``), each epoch the
            first of its own shuffle; ``None``: the whole split.
        validation_steps, test_steps: at most this many batches of each (``train.validation_steps``,
            ``train.test_steps``); ``None``: the whole split.
    """

    accumulation: int = 1
    steps_per_epoch: Optional[int] = None
    validation_steps: Optional[int] = None
    test_steps: Optional[int] = None


def _cut(steps: int, most: Optional[int]) -> int:
    return steps if most is None else min(steps, most)


def build_pipelines(data: Data, data_cfg: DataConfig, global_batch: int, seed: Optional[int] = None,
                    workers: int = 1, cache_batches: Optional[Collection[str]] = None,
                    class_weight: Any = None, cuts: Cuts = Cuts()) -> Pipelines:
    """The training, validation and test pipelines of (already :func:`materialize`\\ d) data.

    Args:
        data: the loaded data.
        data_cfg: the ``data`` section (``shuffle_buffer``, ``cache``).
        global_batch: samples per step over all replicas.
        seed: ``tensorflow.seed`` for the shuffles.
        workers: input pipelines (machines); 1 here.
        cache_batches: the builder's batched splits whose float32 batches fit in memory
            (:func:`materialize` decides); ``None``: every one, with ``cache: true``.
        class_weight: ``train.class_weight`` (:func:`training_extras`; with ``data.augment``, only the
            training batches change: ``(x, y, w)`` with weights).
        cuts: :class:`Cuts`: training batches of ``accumulation x global_batch`` rows, and the steps each
            split's pass is cut to.

    Returns:
        :class:`Pipelines`: the datasets, in global batches, and their step counts.
    """
    files = len(data.train.reader.files) if data.train.reader is not None else 0
    policy, why = choose_sharding(files, workers, data.train.in_memory)
    opts, in_memory_opts = options(policy), options(policy, rewrite=False)

    def make(split: Optional[Split], train: bool, most: Optional[int]) -> tuple[Any, int]:
        if split is None:
            return None, 0
        rows = global_batch * cuts.accumulation if train else global_batch
        steps = split.size if split.batches is not None else math.ceil(split.size / rows)
        if split.in_memory:
            ds = _in_memory(split, data.spec, rows, in_memory_opts, train, data_cfg.shuffle_buffer, seed, most)
        else:
            ds = _streamed(split, data.spec, data_cfg, rows, opts, train, seed,
                           cache_batches is None or split.name in cache_batches, most)
        return ds, _cut(steps, most)

    train_epochs, steps = make(data.train, True, cuts.steps_per_epoch)
    validation, validation_steps = make(data.validation, False, cuts.validation_steps)
    test, test_steps = make(data.test, False, cuts.test_steps)
    post, extras = training_extras(data, data_cfg, seed, class_weight)
    if post is not None:  # augmentation and weights: training batches only, numbered by their global step
        import tensorflow as tf  # noqa: PLC0415

        batches, post_opts = train_epochs, in_memory_opts if data.train.in_memory else opts

        def train_epochs(epochs: int, skip: int = 0) -> Any:
            ds = batches(epochs, skip).enumerate(skip).map(post, num_parallel_calls=tf.data.AUTOTUNE)
            return ds.prefetch(tf.data.AUTOTUNE).with_options(post_opts)

    blocks = post is None and data.train.in_memory and not windowed(data_cfg.shuffle_buffer, len(data.train.x))
    return Pipelines(train_epochs(1), validation, test, steps, validation_steps, test_steps,
                     {"sharding": {"policy": policy, "reason": why}, **extras}, train_epochs,
                     global_batch * cuts.accumulation, blocks)
