"""tfgpu: TensorFlow/Keras on GPUs, correctly and fast, from one YAML file.

Importing this package imports neither TensorFlow nor pydantic: the names below that need the config or
the device set-up are imported when first used (PEP 562). Public API:

- :func:`setup`: apply a device configuration before TensorFlow initialises.
- :func:`load_config`: load and validate a configuration.
- :func:`num_gpus`, :func:`try_gpu`, :func:`try_all_gpus`: the textbook helpers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import AlreadyInitializedError, ConfigError, DataError, DeviceError, TfgpuError, TrainingError
from .version import __version__

if TYPE_CHECKING:
    from .config import Config, load_config
    from .devices.setup import Setup, num_gpus, setup, try_all_gpus, try_gpu

#: The public names that need pydantic (the config) or the device set-up, imported when first used (PEP 562):
#: ``import tfgpu.errors`` or ``tfgpu --help`` then does not build the config's models (0.1-0.15 s of pydantic).
_LAZY = {"Config": ".config", "load_config": ".config", "Setup": ".devices.setup", "num_gpus": ".devices.setup",
         "setup": ".devices.setup", "try_all_gpus": ".devices.setup", "try_gpu": ".devices.setup"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tfgpu' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

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
