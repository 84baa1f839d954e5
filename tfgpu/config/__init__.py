"""The configuration: schema, defaults, YAML loading and overrides.

One YAML file (a *recipe*) configures everything. Precedence, lowest first:

1. the defaults (:mod:`.schema`);
2. the file given (or the dict passed to :func:`tfgpu.setup`, or the file named
   by the ``TFGPU_CONFIG`` environment variable when nothing is passed);
3. overrides: ``--set a.b=value`` on the command line, keyword arguments to
   :func:`tfgpu.setup` (``setup("gpu.yaml", devices={"memory_growth": False})``).

Environment variables do not override individual keys. Two are read where they
apply: ``TFGPU_CONFIG`` (above) and ``TFGPU_DATA_DIR`` (see :mod:`tfgpu.data`).
Environment variables that TensorFlow itself reads (``TF_CPP_MIN_LOG_LEVEL``,
``TF_GPU_ALLOCATOR``) are kept when the config leaves the key at its default,
and replaced when the config sets it (see :mod:`tfgpu.devices.plan`).

YAML is read with ``yaml.safe_load`` semantics only: tags that construct Python
objects are refused. Unknown keys, duplicate keys, wrong types and values out of
range raise :class:`~tfgpu.errors.ConfigError` naming the key path, the value
received, what is allowed and the file:line it came from.

The package is split by job: :mod:`.schema` (the sections, their defaults and
checks), :mod:`.source` (YAML with line positions, ``--set`` and keyword
overrides, :func:`load_config`), :mod:`.messages` (validation errors ->
one-paragraph messages) and :mod:`.keras_specs` (recipe entries that name Keras
classes, ``train.lr_schedule`` and ``data.augment``, checked against Keras's
exported names without importing Keras). Everything public is re-exported here. Nothing in it
imports TensorFlow.
"""

import os

# Pydantic looks for its plugins (the ``pydantic`` entry points of every installed distribution: 0.05-0.1 s of
# 'tfgpu plan' in a virtual environment of 150 packages) when the first model class is built. tfgpu's config
# classes need none, so the search is skipped while they are built (PYDANTIC_DISABLE_PLUGINS, which pydantic
# reads at each build: https://docs.pydantic.dev/latest/concepts/plugins/#disabling-plugins); the user's value
# is restored at once, so their own models still get their plugins.
_PLUGINS_ENV = "PYDANTIC_DISABLE_PLUGINS"
_user_plugins = os.environ.get(_PLUGINS_ENV)
os.environ[_PLUGINS_ENV] = "__all__"
try:
    from .schema import (Config, DataConfig, DevicesConfig, DistributeConfig, FeatureSpec, ModelConfig,
                         OutputConfig, TensorflowConfig, TrainConfig, normalise_device, run_name)
finally:
    if _user_plugins is None:
        del os.environ[_PLUGINS_ENV]
    else:
        os.environ[_PLUGINS_ENV] = _user_plugins
from .source import CONFIG_ENV, load_config, parse_override  # noqa: E402

__all__ = [
    "CONFIG_ENV", "Config", "DataConfig", "DevicesConfig", "DistributeConfig", "FeatureSpec", "ModelConfig",
    "OutputConfig", "TensorflowConfig", "TrainConfig", "load_config", "normalise_device", "parse_override",
    "run_name",
]
