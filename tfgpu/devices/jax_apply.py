"""Carry out a ``backend: jax`` plan: the JAX counterpart of :mod:`tfgpu.devices.apply`. Never imports TensorFlow.

It writes ``os.environ`` (the plan's JAX variables, before Keras and JAX are
imported: JAX reads them when it starts its backends, at the first JAX
operation), imports Keras on JAX, checks that JAX's devices are the ones
planned and makes the plan's Keras calls: the seed, the dtype policy and
``keras.distribution.set_distribution(keras.distribution.DataParallel(...))``.
Settings that can no longer take effect (Keras imported with another backend,
JAX's backends already started with other variables) are reported together in
one :class:`~tfgpu.errors.AlreadyInitializedError`.

Wraps: https://keras.io/api/distribution/ and
https://docs.jax.dev/en/latest/gpu_memory_allocation.html
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from ..errors import AlreadyInitializedError, DeviceError
from ..utils.imports import importable
from .plan import Plan, make_plan
from .probe import GpuInfo, Probe

#: Variables JAX reads once, when its backends start (``KERAS_BACKEND``: Keras, at its first import).
READ_AT_START = ("CUDA_VISIBLE_DEVICES", "JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_CLIENT_MEM_FRACTION",
                 "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_FLAGS")


def tensorflow_importable() -> bool:
    """Whether TensorFlow can be imported in this process (looked up, not imported; ``False`` where an import
    hook blocks it): :func:`tfgpu.utils.imports.importable`."""
    return importable("tensorflow")


def _backends_started() -> bool:
    """Whether JAX already started its backends (then it no longer reads its variables)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge  # noqa: PLC0415 - the one place JAX says it; no public API

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return True  # cannot tell: assume started, so a difference is reported, not ignored


def _conflicts(plan: Plan) -> list[tuple[str, str, str]]:
    out = []
    if "keras" in sys.modules:
        import keras  # noqa: PLC0415

        have = keras.backend.backend()
        if have != "jax":
            out.append(("backend", "KERAS_BACKEND=jax", f"Keras was already imported with the {have} backend "
                        "(Keras reads KERAS_BACKEND once, when it is first imported)"))
    if _backends_started():
        for key in READ_AT_START:
            if key in plan.env and os.environ.get(key, "") != plan.env[key]:
                out.append((plan.env_settings.get(key, key), f"{key}={plan.env[key]}",
                            f"JAX already started its backends with {key}={os.environ.get(key)!r}"))
    return out


def apply_jax_config(config: Any, machine: Probe, start: bool = True,
                     plan: Optional[Plan] = None) -> tuple[Plan, Any]:
    """Plan ``config`` (``backend: jax``) for ``machine``, set JAX's environment, import Keras, make the Keras calls.

    NVML and JAX can disagree: NVML lists GPUs that a jaxlib without its CUDA
    plugin cannot use. Then the plan is remade for JAX's CPU devices, with a
    warning saying why.

    Args:
        config: the validated configuration.
        machine: :func:`tfgpu.devices.probe.probe`'s facts.
        start: unused on JAX (there is no context to leave unstarted); kept so
            :func:`tfgpu.devices.apply.apply_config` and this have one signature.
        plan: :func:`tfgpu.devices.plan.make_plan`'s for ``config`` and ``machine`` when
            the caller made it already (default: made here).

    Returns:
        The plan applied, and :class:`tfgpu.devices.apply.Applied` whose devices are
        JAX's as Keras names them (``"cpu:0"``, ``"gpu:1"``) and whose
        ``strategy`` is the ``keras.distribution.DataParallel`` set (or ``None``).

    Raises:
        AlreadyInitializedError: Keras was imported with another backend, or
            JAX started its backends with other settings.
        DeviceError: JAX's devices are not the ones planned.

    Environment: sets the plan's variables (``docs/jax.md`` lists them).
    """
    from .apply import Applied, reconcile, set_environment  # noqa: PLC0415

    plan = plan if plan is not None else make_plan(config, machine)
    conflicts = _conflicts(plan)
    if conflicts:
        items = "\n".join(f"  - {key}: {what} cannot be applied: {why}." for key, what, why in conflicts)
        raise AlreadyInitializedError(
            f"Keras or JAX started before tfgpu.setup() ran, so these settings cannot take effect:\n{items}",
            "call tfgpu.setup() before importing Keras or running any JAX operation, or run in a fresh process "
            "(restart the notebook kernel).")
    set_environment(plan.env)
    import jax  # noqa: PLC0415
    import keras  # noqa: PLC0415

    seen = tuple(keras.distribution.list_devices())
    gpus_seen = tuple(GpuInfo(i, d.device_kind) for i, d in enumerate(jax.devices()) if d.platform == "gpu")
    plan = reconcile(config, machine, plan, gpus_seen, "JAX",
                     "jaxlib without its CUDA plugin: pip install -U 'jax[cuda12]'")
    if not set(plan.logical_devices) <= set(seen):
        raise DeviceError(
            f"JAX's devices are {', '.join(seen)}, but the plan expected {', '.join(plan.logical_devices)}.",
            "set JAX's variables through the config, not the environment (devices.cpu_logical_devices for "
            "CPU devices), and call tfgpu.setup() before any JAX operation; 'tfgpu devices --set backend=jax' "
            "shows what JAX sees.")
    distribution = None
    for call in plan.tf_calls:
        if call.api == "keras.utils.set_random_seed":
            keras.utils.set_random_seed(call.value)
        elif call.api == "keras.mixed_precision.set_global_policy":
            keras.mixed_precision.set_global_policy(call.value)
        elif call.api == "keras.distribution.set_distribution":
            distribution = keras.distribution.DataParallel(devices=list(call.value))
            keras.distribution.set_distribution(distribution)
    physical = tuple(f"{d.platform}:{d.id} ({d.device_kind})" for d in jax.devices())
    return plan, Applied(physical, plan.logical_devices, "tensorflow" in sys.modules, distribution)
