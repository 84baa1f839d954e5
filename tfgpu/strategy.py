"""Plan -> ``tf.distribute`` strategy. Does nothing else."""

from __future__ import annotations

from typing import Any

from .plan import StrategyPlan


def build_strategy(spec: StrategyPlan) -> Any:
    """Build the strategy a plan names.

    Args:
        spec: the plan's :class:`~tfgpu.plan.StrategyPlan`.

    Returns:
        ``tf.distribute.MirroredStrategy`` (with the chosen cross-device ops),
        ``tf.distribute.OneDeviceStrategy``, or the default strategy.

    Wraps: https://www.tensorflow.org/api_docs/python/tf/distribute/MirroredStrategy
    and https://www.tensorflow.org/api_docs/python/tf/distribute/OneDeviceStrategy
    """
    import tensorflow as tf  # noqa: PLC0415

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
