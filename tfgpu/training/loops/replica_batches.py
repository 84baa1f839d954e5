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
from typing import Any

#: ``summary.json``'s ``input`` for each way (:attr:`Feed.describe`).
PLAIN = "a plain tf.data iterator of global batches, each replica taking its rows in the step (CPU replicas)"
DISTRIBUTED = "tf.distribute's distributed iterator (strategy.experimental_distribute_dataset)"


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
    each = (rows + replicas - 1) // replicas
    bounds = []
    for i in range(replicas):
        start = each * i
        bounds.append((_at_most(start, rows), _at_most(start + each, rows)))
    return bounds


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
