"""Data sources (one module per ``data.kind``) behind one interface, and the shared ``tf.data`` fast path.

Use::

    source = source_for(cfg.data, cfg.model.loss, cfg.tensorflow.seed)
    source.check()                                    # local files, before TensorFlow starts: DataError (exit 5)
    # (tfgpu plan: source.check(keep=False): the same checks, as cheaply as the files allow, nothing kept)
    data, pipes = prepare(source, cfg.data, context)  # after tfgpu.setup(): source.load, decoding, pipelines
    # backend: jax: feed.prepare_for_jax(source, cfg.data, context, replicas): keras.utils.PyDataset feeds, no TF

``docs/data.md`` documents every kind and key. Importing this package does not
import TensorFlow.
"""

from __future__ import annotations

import hashlib
import importlib
from typing import Any, Optional

from ..config import Config, DataConfig
from .base import DATA_DIR_ENV, Data, DataSpec, LoadContext, Source, Split

#: ``data.kind`` -> the module and class of its source (imported when a recipe needs it: ``tfgpu plan``
#: loads one source, not eight).
SOURCES: dict[str, str] = {
    "mnist": "keras_datasets:KerasSource",
    "keras": "keras_datasets:KerasSource",
    "arrays": "arrays:ArraysSource",
    "image_folder": "image_folder:ImageFolderSource",
    "csv": "csv:CsvSource",
    "tfrecord": "tfrecord:TfrecordSource",
    "builder": "builder:BuilderSource",
    "tfds": "tfds:TfdsSource",
}

__all__ = ["DATA_DIR_ENV", "Data", "DataSpec", "LoadContext", "SOURCES", "Source", "Split", "data_seed", "load",
           "prepare", "source_class", "source_for"]


def source_class(kind: str) -> type[Source]:
    """The :class:`~tfgpu.data.base.Source` subclass of ``data.kind`` (its module imported now)."""
    module, name = SOURCES[kind].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def source_for(cfg: DataConfig, loss: Any = "sparse_categorical_crossentropy",
               tf_seed: Optional[int] = None) -> Source:
    """The source of ``data.kind``, ready for :meth:`~tfgpu.data.base.Source.check`.

    Args:
        cfg: the ``data`` section.
        loss: ``model.loss`` (with the labels, it decides classification or regression).
        tf_seed: ``tensorflow.seed`` (the default seed of ``validation_split``).
    """
    return source_class(cfg.kind)(cfg, loss, tf_seed)


def prepare(source: Source, cfg: DataConfig, context: LoadContext, train: bool = True,
            class_weight: Any = None, cuts: Any = None) -> tuple[Data, Any]:
    """Load a checked source, decode streamed splits into memory where ``cache`` says so, and build the pipelines.

    Call after :func:`tfgpu.setup` (this imports TensorFlow). ``train=False``
    (evaluation) leaves the training split undecoded. ``class_weight``: ``train.class_weight``
    (the training batches then carry per-sample weights). ``cuts``: a :class:`~tfgpu.data.pipeline.Cuts`
    (accumulation and the steps each pass is cut to; default none).

    Returns:
        ``(data, pipelines)``: the :class:`Data` (in memory where decoded) and
        :class:`~tfgpu.data.pipeline.Pipelines`, whose ``info`` records the
        cache and sharding choices.

    Raises:
        DataError: the data cannot be read or does not fit the config.
    """
    from .pipeline import BATCHES_CACHED, Cuts, build_pipelines, materialize  # noqa: PLC0415

    data = source.load(context)
    data, cache = materialize(data, cfg, context.seed, skip=() if train else ("train",),
                              workers_on_host=context.workers_on_host, global_batch=context.global_batch_size,
                              workers=context.num_workers)
    cached = {name for name, how in cache.items() if how.startswith(BATCHES_CACHED)}
    pipes = build_pipelines(data, cfg, context.global_batch_size, context.seed, context.num_workers, cached,
                            class_weight=class_weight if train else None, cuts=cuts or Cuts())
    pipes.info["cache"] = cache
    return data, pipes


def host_of(address: str) -> str:
    """The host of a ``host:port`` address, by name; ``localhost``, ``127.x.x.x`` and ``::1`` are one."""
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or address.startswith("[") else address
    host = host.strip("[]").lower()
    return "localhost" if host in ("localhost", "::1") or host.startswith("127.") else host


def workers_on_host(cluster: Any) -> int:
    """How many of ``cluster``'s workers (the chief included) run on this process's host; 1 without a cluster.

    ``tfgpu run --workers N`` starts N on 127.0.0.1: each holds its own copy of
    the data, so the memory a worker may decode into is divided by this
    (:func:`tfgpu.data.pipeline.memory_allowance`). Hosts are compared by name.
    """
    if cluster is None:
        return 1
    here = host_of(cluster.address)
    return max(1, sum(host_of(address) == here for hosts in cluster.jobs.values() for address in hosts))


def data_seed(cfg: Config, cluster: Any) -> Optional[int]:
    """The seed of the data's shuffles: ``tensorflow.seed``; with several workers and no seed, one derived
    from the cluster's addresses, the same on every worker (sharding a dataset by DATA or FILE between
    workers needs every worker to shuffle it alike, else they read overlapping parts)."""
    if cfg.tensorflow.seed is not None or cluster is None or cluster.num_workers == 1:
        return cfg.tensorflow.seed
    text = ",".join(f"{job}={','.join(hosts)}" for job, hosts in sorted(cluster.jobs.items()))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def load(cfg: Config, info: Any, source: Source, train: bool = True, seed: Optional[int] = None) -> tuple[Data, Any]:
    """A checked source's data and pipelines for the devices ``info`` describes (after :func:`tfgpu.setup`).

    ``train=False`` (evaluation) does not decode the training split. With
    several workers, the pipelines carry each worker's sharding policy. On
    ``backend: jax``, :func:`prepare_for_jax`'s feeds (no TensorFlow); else
    :func:`prepare`'s ``tf.data`` pipelines. ``seed``: the shuffles' seed
    (the run's, :func:`tfgpu.training.runner.run_seed`); default :func:`data_seed`.
    ``train.gradient_accumulation_steps``, ``train.steps_per_epoch``, ``train.validation_steps`` and
    ``train.test_steps`` shape the batches (:class:`~tfgpu.data.pipeline.Cuts`).

    Raises:
        DataError: the data cannot be read or does not fit the config.
    """
    cluster = info.cluster
    context = LoadContext(global_batch_size=info.global_batch_size, num_replicas=info.num_replicas,
                          seed=seed if seed is not None else data_seed(cfg, cluster),
                          num_workers=cluster.num_workers if cluster else 1,
                          worker_index=cluster.worker_index if cluster else 0,
                          workers_on_host=workers_on_host(cluster))
    from .pipeline import Cuts  # noqa: PLC0415

    cuts = Cuts(accumulation=cfg.train.gradient_accumulation_steps, steps_per_epoch=cfg.train.steps_per_epoch,
                validation_steps=cfg.train.validation_steps, test_steps=cfg.train.test_steps)
    if info.backend == "jax":
        from .feed import prepare_for_jax  # noqa: PLC0415

        return prepare_for_jax(source, cfg.data, context, info.num_replicas, train, cuts)
    return prepare(source, cfg.data, context, train, class_weight=cfg.train.class_weight, cuts=cuts)
