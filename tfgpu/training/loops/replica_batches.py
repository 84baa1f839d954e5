"""How a training step gets its batch: tf.distribute's distributed iterator, or, on CPU replicas, a plain one.

``strategy.experimental_distribute_dataset`` reads a dataset through a
``MultiDeviceIterator``: a background thread per device fills a buffer, and
each device's batches come from a generator dataset that calls a function per
batch. On GPUs that is what copies each replica's part to its device while the
previous step computes. On CPU replicas (one machine's memory) there is nothing
to copy, and it costs host CPU that the step needs: about 0.4 ms a batch on
this project's 2-core machine, 4 us a sample at 128 per replica, 2.8-5.5 % of
the seed CNN's training step (docs/benchmarks.md, "Where the time went").

So when every replica is a CPU device of this machine (``MirroredStrategy`` or
``OneDeviceStrategy``; not ``MultiWorkerMirroredStrategy``, which shards the
input between workers), the loops read the global batches with a plain
``tf.data`` iterator and each replica takes its rows in the step
(:meth:`Feed.args`): the same rows tf.distribute gives it (``ceil(b / N)`` rows
each, in order, for a batch of ``b`` rows over ``N`` replicas, so a short last
batch leaves the last replicas fewer or none), so a run trains on the same
numbers either way. Anywhere else, tf.distribute's iterator.

Wraps: https://www.tensorflow.org/api_docs/python/tf/distribute/Strategy#experimental_distribute_dataset
and https://www.tensorflow.org/api_docs/python/tf/distribute/Strategy#experimental_distribute_values_from_function
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

#: ``summary.json``'s ``input`` for each way (:attr:`Feed.describe`).
PLAIN = "a plain tf.data iterator of global batches, each replica taking its rows in the step (CPU replicas)"
DISTRIBUTED = "tf.distribute's distributed iterator (strategy.experimental_distribute_dataset)"
#: Added to :data:`PLAIN` when the loops read a split held in memory in :class:`Blocks`.
IN_BLOCKS = "; held in memory, read {block} batches at a time (one gather and transform a block)"


def reads_plainly(strategy: Any) -> bool:
    """Whether the loops under ``strategy`` read a plain iterator (:class:`Feed`): every replica a CPU device of
    this machine, under ``MirroredStrategy`` or ``OneDeviceStrategy``.

    The default strategy (``distribute.strategy: default``: one replica, wherever TensorFlow places each op) counts
    as plain: its ``experimental_distribute_dataset`` returns the dataset itself.
    """
    import tensorflow as tf  # noqa: PLC0415

    if type(strategy).__name__ == "_DefaultDistributionStrategy":  # tf.distribute.get_strategy() outside any scope
        return True
    if not isinstance(strategy, (tf.distribute.MirroredStrategy, tf.distribute.OneDeviceStrategy)):
        return False
    devices = strategy.extended.worker_devices
    return bool(devices) and all(tf.DeviceSpec.from_string(d).device_type == "CPU" for d in devices)


def split_rows(rows: Any, replicas: int) -> list[tuple[Any, Any]]:
    """``[(start, end)]`` of each replica's rows in a batch of ``rows`` rows (a tensor or an int): ``ceil(rows /
    replicas)`` each, in order, the last ones fewer or none, as tf.distribute splits a batch among replicas.

    E.g. ``split_rows(171, 2)`` is ``[(0, 86), (86, 171)]``, ``split_rows(10, 4)`` ``[(0, 3), (3, 6), (6, 9),
    (9, 10)]``, ``split_rows(1, 2)`` ``[(0, 1), (1, 1)]``.
    """
    return [part_bounds(rows, replicas, i) for i in range(replicas)]


def part_bounds(rows: Any, parts: int, i: Any) -> tuple[Any, Any]:
    """``(start, end)`` of part ``i`` (an int or an int32 tensor) of ``parts`` in ``rows`` rows: ``ceil(rows /
    parts)`` rows each, in order, the last fewer or none (:func:`split_rows`' parts; also the micro-batches of
    :func:`tfgpu.training.loops.gradients.accumulate`)."""
    each = (rows + parts - 1) // parts
    start = each * i
    return _at_most(start, rows), _at_most(start + each, rows)


def _at_most(value: Any, bound: Any) -> Any:
    if isinstance(value, int) and isinstance(bound, int):
        return min(value, bound)
    import tensorflow as tf  # noqa: PLC0415

    return tf.minimum(value, bound)


@dataclass(frozen=True)
class Feed:
    """The batches of one run's loops, read the way :func:`reads_plainly` chooses.

    Attributes:
        strategy: the ``tf.distribute.Strategy``.
        plain: read a plain iterator of global batches, split among the replicas in the step.
    """

    strategy: Any
    plain: bool

    @classmethod
    def of(cls, strategy: Any) -> "Feed":
        """The feed :func:`reads_plainly` chooses for ``strategy``."""
        return cls(strategy, reads_plainly(strategy))

    @property
    def describe(self) -> str:
        """How the batches reach the replicas, in words (``summary.json``: ``input``)."""
        return PLAIN if self.plain else DISTRIBUTED

    def iterator(self, dataset: Any) -> Any:
        """An iterator over ``dataset``'s global batches: plain, or tf.distribute's (one per-replica value each)."""
        if self.plain:
            return iter(dataset)
        return iter(self.strategy.experimental_distribute_dataset(dataset))

    def block(self, blocks: bool, element_spec: Any, global_batch: int, most: int) -> int:
        """The global batches the loops read at a time: :func:`block_steps` when the feed is plain and the
        pipeline makes blocks (``blocks``: :attr:`tfgpu.data.pipeline.Pipelines.train_blocks`), else 1."""
        if not (self.plain and blocks and global_batch):
            return 1
        return block_steps(element_spec, global_batch, most)

    def said(self, block: int) -> str:
        """:attr:`describe`, with how many batches a block holds when the loops read ``block`` at a time."""
        return self.describe + (IN_BLOCKS.format(block=block) if block > 1 else "")

    def training(self, job: Any, epochs: int, skip: int) -> tuple[Any, Any]:
        """``(dataset, source)``: ``job``'s training batches for ``epochs`` less the first ``skip``
        (``job.train_epochs(epochs, skip)``), and what the loop reads them from: :class:`Blocks` of
        :func:`block_steps` batches when the feed is plain and the pipeline makes blocks
        (``job.train_blocks``) of more than one batch, else :meth:`iterator` over ``dataset``.

        Args:
            job: a :class:`tfgpu.training.loops.Job` (``train_epochs``, ``train_blocks``, ``global_batch``,
                ``steps_per_execution``).
            epochs: the passes in the dataset, counted from the first; skip: batches already trained on.
        """
        dataset = job.train_epochs(epochs, skip)
        block = self.block(job.train_blocks, dataset.element_spec, job.global_batch, job.steps_per_execution)
        if block > 1:
            return dataset, Blocks(job.train_epochs(epochs, skip, block=block), job.global_batch)
        return dataset, self.iterator(dataset)

    def args(self, batch: Any) -> Any:
        """A batch read from :meth:`iterator` as ``strategy.run``'s arguments: each replica's rows (in a
        ``tf.function``). A batch of tf.distribute's, or one for one replica, is passed as it is.

        Args:
            batch: a tuple ``(x, y)`` or ``(x, y, w)``, each of shape ``(b, ...)``, from :meth:`iterator`.

        Returns:
            The same structure of per-replica values, replica ``i`` holding the rows :func:`split_rows` gives it.
        """
        replicas = self.strategy.num_replicas_in_sync
        if not self.plain or replicas == 1:
            return batch
        import tensorflow as tf  # noqa: PLC0415

        rows = tf.shape(tf.nest.flatten(batch)[0])[0]
        bounds = split_rows(rows, replicas)

        def rows_of(context: Any) -> Any:
            start, end = bounds[context.replica_id_in_sync_group]
            return tf.nest.map_structure(lambda t: t[start:end], batch)

        return self.strategy.experimental_distribute_values_from_function(rows_of)


#: The most bytes the rows of one block of training batches may hold (:func:`block_steps`): the loop holds the
#: block it trains on, tf.data one more, and one being gathered (about 3 x this at most, in host memory).
BLOCK_BYTES = 32 * 2**20


def block_steps(element_spec: Any, global_batch: int, most: int, limit: int = BLOCK_BYTES) -> int:
    """How many global batches one block of :class:`Blocks` holds: as many as ``limit`` bytes allow, at most
    ``most`` (a call's steps), at least 1 (1: read batch by batch).

    Args:
        element_spec: the training dataset's ``element_spec`` (tensors of shape ``(batch, ...)``, fully known
            past the batch axis; otherwise 1).
        global_batch: rows in a global batch.
        most: the most steps a call runs (``train.steps_per_execution`` resolved).
        limit: bytes a block may hold (:data:`BLOCK_BYTES`).

    E.g. MNIST's float32 images and uint8 labels at 128 rows a batch are 401,536 bytes a batch: 32 fit in
    32 MiB, so ``block_steps(spec, 128, 32)`` is 32; at 4096 rows, 2.
    """
    import tensorflow as tf  # noqa: PLC0415

    row = 0
    for spec in tf.nest.flatten(element_spec):
        if not isinstance(spec, tf.TensorSpec) or not spec.shape[1:].is_fully_defined():
            return 1
        row += spec.shape[1:].num_elements() * spec.dtype.size
    return max(1, min(most, limit // max(1, row * global_batch)))


class Blocks:
    """One run's training batches read a block at a time: each element of the dataset holds the rows of several
    consecutive global batches (:attr:`tfgpu.data.pipeline.Pipelines.train_blocks`), and the training call takes
    each step's batch from the block it holds, reading the next block when that one is used up.

    Why: a batch read from a ``tf.data`` iterator costs a ``get_next`` and, in memory, a gather and a transform
    (about 6 % of the seed CNN's step at 128 rows on 2 CPU cores: docs/benchmarks.md, "Where the time went"); a
    block pays them once for a call's batches. The steps see the same batches in the same order either way.
    Only with a plain feed (:class:`Feed`, CPU replicas): a distributed iterator would split a block among the
    replicas. What a call has not used of its block is kept for the next call (:attr:`block`, :attr:`taken`).

    Attributes:
        iterator: the iterator over the blocks.
        global_batch: rows in a global batch (the last batch of an epoch, at the end of its block, may have fewer).
        block: the block being read (at first an empty one), a structure of tensors of shape ``(rows, ...)``.
        taken: how many of its batches the steps have taken (an int32 scalar tensor).
    """

    def __init__(self, dataset: Any, global_batch: int) -> None:
        import tensorflow as tf  # noqa: PLC0415

        self.iterator = iter(dataset)
        self.global_batch = global_batch
        self.element_spec = dataset.element_spec
        self.spec = tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype),
                                          dataset.element_spec)
        self.block = tf.nest.map_structure(lambda s: tf.zeros([0, *s.shape[1:]], s.dtype), self.spec)
        self.taken = tf.constant(0, tf.int32)


def steps_function(step: Any, blocks: Optional[Blocks] = None) -> Any:
    """``(source, steps) -> logs``: ``steps`` (an int32 tensor, at least 1) calls of ``step(batch)`` in one
    ``tf.function`` call, each on the next global batch of ``source``; ``logs`` is the last call's return.

    Args:
        step: ``batch -> logs`` (traced; ``batch`` a global batch as :meth:`Feed.iterator` yields them; logs
            ``None`` are returned as an int32 0).
        blocks: a :class:`Blocks` (``source`` is then one like it: the same element spec and global batch,
            e.g. a resumed run's rest of an epoch and its later epochs); ``None``: ``source`` is an iterator
            of global batches.

    A call of any length is one trace: the step count is a tensor.

    The returned function's ``input_wait`` is a float64 variable: the seconds its calls spent waiting in the
    iterator's ``get_next`` (``tf.timestamp()`` before and after each read, summed; with ``blocks``, the reads of
    each new block), the input wait :mod:`tfgpu.training.telemetry` reports. Two timestamps and an add a read.
    """
    import tensorflow as tf  # noqa: PLC0415

    given = step
    waited = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="input_wait_seconds")

    def read_next(iterator: Any) -> Any:
        """``next(iterator)``, the time it blocked added to ``waited``."""
        began = tf.timestamp()
        with tf.control_dependencies([began]):
            batch = next(iterator)
        with tf.control_dependencies(tf.nest.flatten(batch)):
            waited.assign_add(tf.timestamp() - began)
        return batch

    def step(batch: Any) -> Any:  # (a loop cannot carry None: a step without logs gives 0)
        logs = given(batch)
        return tf.zeros([], tf.int32) if logs is None else logs

    if blocks is None:
        @tf.function
        def several(iterator: Any, steps: Any) -> Any:
            logs = step(read_next(iterator))
            for _ in tf.range(steps - 1):
                logs = step(read_next(iterator))
            return logs

        several.input_wait = waited
        return several

    rows_each = blocks.global_batch

    def next_batch(iterator: Any, block: Any, taken: Any) -> tuple[Any, Any, Any]:
        if taken * rows_each >= tf.shape(tf.nest.flatten(block)[0])[0]:  # used up: the next block
            block = read_next(iterator)
            taken = tf.zeros_like(taken)
        start = taken * rows_each
        end = tf.minimum(start + rows_each, tf.shape(tf.nest.flatten(block)[0])[0])
        return block, taken + 1, tf.nest.map_structure(lambda t: t[start:end], block)

    def read(iterator: Any, steps: Any, block: Any, taken: Any) -> Any:
        block, taken, batch = next_batch(iterator, block, taken)
        logs = step(batch)
        for _ in tf.range(steps - 1):
            tf.autograph.experimental.set_loop_options(
                shape_invariants=[(block, tf.nest.map_structure(lambda s: s.shape, blocks.spec))])
            block, taken, batch = next_batch(iterator, block, taken)
            logs = step(batch)
        return logs, block, taken

    traced = tf.function(read, input_signature=[tf.data.IteratorSpec(blocks.element_spec),
                                                tf.TensorSpec([], tf.int32), blocks.spec,
                                                tf.TensorSpec([], tf.int32)])

    def several(source: Blocks, steps: Any) -> Any:
        logs, source.block, source.taken = traced(source.iterator, steps, source.block, source.taken)
        return logs

    several.experimental_get_tracing_count = traced.experimental_get_tracing_count  # as a tf.function's
    several.input_wait = waited
    return several
