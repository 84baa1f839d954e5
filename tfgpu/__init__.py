"""tfgpu: TensorFlow/Keras on GPUs, correctly and fast, from one YAML file.

Importing this package does not import TensorFlow. Public API:

- :func:`setup`: apply a device configuration before TensorFlow initialises.
- :func:`load_config`: load and validate a configuration.
- :func:`num_gpus`, :func:`try_gpu`, :func:`try_all_gpus`: the textbook helpers.
"""

from __future__ import annotations

from dataclasses import dataclass
import os
from typing import Any, Optional, Union

from .config import Config, load_config
from .errors import (
    AlreadyInitializedError,
    ConfigError,
    DataError,
    DeviceError,
    TfgpuError,
    TrainingError,
)

__version__ = "0.1.0"

__all__ = [
    "setup",
    "load_config",
    "num_gpus",
    "try_gpu",
    "try_all_gpus",
    "Setup",
    "Config",
    "TfgpuError",
    "ConfigError",
    "DeviceError",
    "DataError",
    "AlreadyInitializedError",
    "TrainingError",
    "__version__",
]


@dataclass(frozen=True)
class Setup:
    """What :func:`setup` applied.

    Attributes:
        config: the resolved configuration.
        plan: the :class:`~tfgpu.plan.Plan` that was applied.
        physical_devices: physical devices TensorFlow reports, e.g.
            ``("/physical_device:CPU:0", "/physical_device:GPU:0")``.
        logical_devices: logical devices, e.g. ``("/device:CPU:0", "/device:CPU:1")``.
        strategy: the ``tf.distribute.Strategy`` to build models under.
        num_replicas: ``strategy.num_replicas_in_sync``.
        global_batch_size: per-replica batch x replicas (samples per step).
    """

    config: Config
    plan: Any
    physical_devices: tuple[str, ...]
    logical_devices: tuple[str, ...]
    strategy: Any
    num_replicas: int
    global_batch_size: int

    def __str__(self) -> str:
        s = self.plan.strategy
        return (
            f"tfgpu: {len(self.plan.gpus)} GPU(s); logical devices: {', '.join(self.logical_devices)}; "
            f"strategy: {type(self.strategy).__name__} ({', '.join(s.devices) or 'default device'}); "
            f"replicas: {self.num_replicas}; global batch: {self.plan.batch_size_per_replica} x "
            f"{self.num_replicas} = {self.global_batch_size}"
        )


_applied: Optional[tuple[Any, Setup]] = None


def setup(config: Union[str, "os.PathLike[str]", dict, Config, None] = None, **sections: Any) -> Setup:
    """Apply a device configuration before TensorFlow initialises its devices.

    Call it at the top of a script, before any other TensorFlow code::

        import tfgpu
        info = tfgpu.setup("gpu.yaml")          # or a dict, or nothing
        import tensorflow as tf                 # already configured
        with info.strategy.scope():
            model = ...

    Args:
        config: a YAML path, a dict with the recipe layout, a :class:`Config`,
            or ``None``: the file named by ``TFGPU_CONFIG``, else the defaults.
        **sections: overrides by section, deep-merged over ``config``, e.g.
            ``devices={"memory_growth": False}``.

    Returns:
        :class:`Setup`: physical and logical devices, the strategy, replicas.
        Calling ``setup`` again with the same resolved configuration returns
        the same object and changes nothing.

    Raises:
        ConfigError: the configuration is invalid.
        DeviceError: a device request this machine cannot satisfy.
        AlreadyInitializedError: TensorFlow already initialised its devices and
            a requested setting differs from what is in force (each is named).

    Environment: ``TFGPU_CONFIG`` (config path when none is given);
    ``CUDA_VISIBLE_DEVICES`` (respected: indices count the GPUs it lets through).
    """
    global _applied
    from .apply import apply_config  # noqa: PLC0415
    from .probe import probe  # noqa: PLC0415
    from .strategy import build_strategy  # noqa: PLC0415

    cfg = load_config(config, **sections)
    if _applied is not None and _applied[0] == cfg:
        return _applied[1]
    plan, applied = apply_config(cfg, probe())
    strategy = build_strategy(plan.strategy)
    result = Setup(
        config=cfg,
        plan=plan,
        physical_devices=applied.physical_devices,
        logical_devices=applied.logical_devices,
        strategy=strategy,
        num_replicas=int(strategy.num_replicas_in_sync),
        global_batch_size=plan.batch_size_per_replica * int(strategy.num_replicas_in_sync),
    )
    _applied = (cfg, result)
    return result


def num_gpus() -> int:
    """Number of physical GPUs TensorFlow sees.

    Imports TensorFlow. Wraps ``tf.config.list_physical_devices("GPU")``
    (https://www.tensorflow.org/api_docs/python/tf/config/list_physical_devices).
    """
    from .apply import gpu_count  # noqa: PLC0415

    return gpu_count()


def try_gpu(i: int = 0) -> Any:
    """``tf.device("/GPU:i")`` if GPU ``i`` exists, else ``tf.device("/CPU:0")``.

    Use as a context manager: ``with tfgpu.try_gpu(): x = tf.ones((2, 3))``.
    Imports TensorFlow. Wraps https://www.tensorflow.org/api_docs/python/tf/device
    """
    import tensorflow as tf  # noqa: PLC0415

    if num_gpus() >= i + 1:
        return tf.device(f"/GPU:{i}")
    return tf.device("/CPU:0")


def try_all_gpus() -> list:
    """``[tf.device("/GPU:0"), ...]`` for every GPU, or ``[tf.device("/CPU:0")]``.

    Imports TensorFlow. Wraps https://www.tensorflow.org/api_docs/python/tf/device
    """
    import tensorflow as tf  # noqa: PLC0415

    devices = [tf.device(f"/GPU:{i}") for i in range(num_gpus())]
    return devices if devices else [tf.device("/CPU:0")]
