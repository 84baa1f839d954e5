"""Plan -> ``tf.distribute`` strategy. Does nothing else."""

from __future__ import annotations

from typing import Any

from .plan import StrategyPlan


def build_strategy(spec: StrategyPlan) -> Any:
    """Build the strategy a plan names.

    Args:
        spec: the plan's :class:`~tfgpu.devices.plan.StrategyPlan`.

    Returns:
        ``tf.distribute.MirroredStrategy`` (with the chosen cross-device ops),
        ``tf.distribute.MultiWorkerMirroredStrategy`` (with the chosen
        collective implementation and the plan's cluster),
        ``tf.distribute.OneDeviceStrategy``, or the default strategy.

    MultiWorkerMirroredStrategy configures TensorFlow's collective ops, which
    must happen before TensorFlow's context starts (before the first op or
    ``tf.config.list_logical_devices``): :func:`tfgpu.devices.apply.apply_plan` builds
    it at that point. Its constructor waits for every worker of the cluster.

    Wraps: https://www.tensorflow.org/api_docs/python/tf/distribute/MirroredStrategy,
    https://www.tensorflow.org/api_docs/python/tf/distribute/MultiWorkerMirroredStrategy
    and https://www.tensorflow.org/api_docs/python/tf/distribute/OneDeviceStrategy
    """
    import tensorflow as tf  # noqa: PLC0415

    if spec.kind == "multi_worker_mirrored":
        implementation = {"auto": "AUTO", "ring": "RING", "nccl": "NCCL"}[spec.cross_device_ops or "auto"]
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=getattr(tf.distribute.experimental.CommunicationImplementation, implementation))
        cluster = spec.cluster
        resolver = None
        if cluster is not None and cluster.source != "single worker":
            resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                tf.train.ClusterSpec({job: list(hosts) for job, hosts in cluster.jobs.items()}),
                task_type=cluster.task_type, task_id=cluster.task_index, rpc_layer="grpc")
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)
    if spec.kind == "default":
        return tf.distribute.get_strategy()
    if spec.kind == "one_device":
        return tf.distribute.OneDeviceStrategy(spec.devices[0])
    ops = {
        None: None,
        "nccl": tf.distribute.NcclAllReduce,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "reduce_to_one_device": tf.distribute.ReductionToOneDevice,
    }[spec.cross_device_ops]
    return tf.distribute.MirroredStrategy(devices=list(spec.devices), cross_device_ops=ops() if ops else None)
