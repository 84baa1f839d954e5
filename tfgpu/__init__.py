"""tfgpu: TensorFlow/Keras on GPUs, correctly and fast, from one YAML file.

Importing this package does not import TensorFlow. Public API:

- :func:`setup`: apply a device configuration before TensorFlow initialises.
- :func:`load_config`: load and validate a configuration.
- :func:`num_gpus`, :func:`try_gpu`, :func:`try_all_gpus`: the textbook helpers.
"""

from __future__ import annotations

from .config import Config, load_config
from .devices.setup import Setup, num_gpus, setup, try_all_gpus, try_gpu
from .errors import AlreadyInitializedError, ConfigError, DataError, DeviceError, TfgpuError, TrainingError
from .version import __version__

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
