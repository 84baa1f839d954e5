"""Carry out a :class:`~tfgpu.devices.plan.Plan`: where a configuration's settings reach this process.

It writes ``os.environ`` (before TensorFlow is imported), imports TensorFlow,
and makes the plan's ``tf.config`` / Keras calls in order: every setting a
config asks for is applied here and nowhere else. Other code changes process
state only for a job of its own: :mod:`tfgpu.devices.seen_by_tf` (the short-lived child
process of :func:`tfgpu.devices.probe.probe_tensorflow`) turns memory growth on for
each GPU before listing logical devices when it was given no config, so the
probe never takes a GPU's memory; :mod:`tfgpu.training.checkpoint` and
:mod:`tfgpu.launch.workers` install signal handlers while a run or launch lasts (and
put the previous ones back); :mod:`tfgpu.devices.startup_log` points fd 2 at its filter
while :func:`tfgpu.setup` applies a plan (and restores it); :mod:`tfgpu.launch.bootstrap` sets ``sys.argv`` and
``sys.path`` for the script it runs and installs :mod:`tfgpu.devices.keras_fixes`
(as :func:`start_strategy` does here) for several workers. A setting that
TensorFlow can no longer change (its devices were already initialised) is
compared with what is in force: equal is fine, different is collected, and all
such settings are reported together in one
:class:`~tfgpu.errors.AlreadyInitializedError` instead of TensorFlow's bare
``RuntimeError``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..errors import AlreadyInitializedError, DeviceError
from .plan import Plan, TfCall, make_plan
from .probe import GpuInfo, Probe


@dataclass(frozen=True)
class Applied:
    """What TensorFlow reports after the plan was applied.

    Attributes:
        physical_devices: e.g. ``("/physical_device:CPU:0", "/physical_device:GPU:0")``.
        logical_devices: e.g. ``("/device:CPU:0", "/device:CPU:1")``.
        tf_was_imported: TensorFlow had been imported before tfgpu applied the plan.
        strategy: the plan's ``tf.distribute`` strategy.

    ``logical_devices`` and ``strategy`` are ``None`` when the plan was
    applied with ``start=False`` (TensorFlow's context not started).
    """

    physical_devices: tuple[str, ...]
    logical_devices: Optional[tuple[str, ...]]
    tf_was_imported: bool
    strategy: Any = None


def set_environment(env: dict[str, str]) -> dict[str, Optional[str]]:
    """Set the plan's environment variables; returns their previous values."""
    previous = {}
    for key, value in env.items():
        previous[key] = os.environ.get(key)
        os.environ[key] = value
    return previous


def import_tensorflow() -> Any:
    """Import TensorFlow (and Keras 3 with its TensorFlow backend)."""
    import tensorflow as tf  # noqa: PLC0415 - the one place TensorFlow is imported for configuring

    return tf


def gpu_count() -> int:
    """Physical GPUs TensorFlow sees (``tf.config.list_physical_devices('GPU')``)."""
    tf = import_tensorflow()
    return len(tf.config.list_physical_devices("GPU"))


def _device(tf: Any, name: Optional[str]) -> Any:
    kind, index = name.split(":")
    devices = tf.config.list_physical_devices(kind)
    if int(index) >= len(devices):
        raise DeviceError(
            f"physical device {name} does not exist; TensorFlow lists {[d.name for d in devices]}.",
            "run 'tfgpu plan' to compare what tfgpu expected with what TensorFlow sees.",
        )
    return devices[int(index)]


def _limits(configs: Optional[list]) -> Optional[list]:
    if configs is None:
        return None
    return [c.memory_limit for c in configs]


def _apply_call(tf: Any, call: TfCall) -> Optional[str]:
    """Make one call; return why it conflicts with what is in force, or None."""
    api = call.api
    if api == "tf.config.experimental.set_memory_growth":
        device = _device(tf, call.device)
        try:
            tf.config.experimental.set_memory_growth(device, call.value)
        except RuntimeError:
            current = tf.config.experimental.get_memory_growth(device)
            if current != call.value:
                return f"memory growth on {call.device} is already {current}"
        return None
    if api == "tf.config.set_logical_device_configuration":
        device = _device(tf, call.device)
        wanted = [tf.config.LogicalDeviceConfiguration(memory_limit=v) for v in call.value]
        try:
            tf.config.set_logical_device_configuration(device, wanted)
        except RuntimeError:
            current = tf.config.get_logical_device_configuration(device)
            if _limits(current) != list(call.value):
                have = len(current) if current else 1
                return f"{call.device} is already initialised as {have} logical device(s) (limits {_limits(current)})"
        return None
    if api.startswith("tf.config.threading.set_"):
        setter = getattr(tf.config.threading, api.rsplit(".", 1)[1])
        getter = getattr(tf.config.threading, api.rsplit(".", 1)[1].replace("set_", "get_"))
        try:
            setter(call.value)
        except RuntimeError:
            if getter() != call.value:
                return f"the thread count is already fixed at {getter() or 'TensorFlow’s choice (0)'}"
        return None
    simple: dict[str, Callable[[], Any]] = {
        "tf.config.set_soft_device_placement": lambda: tf.config.set_soft_device_placement(call.value),
        "tf.debugging.set_log_device_placement": lambda: tf.debugging.set_log_device_placement(call.value),
        "tf.config.experimental.enable_op_determinism": tf.config.experimental.enable_op_determinism,
        "keras.utils.set_random_seed": lambda: _keras().utils.set_random_seed(call.value),
        "keras.mixed_precision.set_global_policy": lambda: _keras().mixed_precision.set_global_policy(call.value),
    }
    simple[api]()
    return None


def _keras() -> Any:
    import keras  # noqa: PLC0415

    return keras


def _tensorflow_gpus(tf: Any) -> tuple[GpuInfo, ...]:
    """The GPUs TensorFlow lists (names from ``get_device_details``; no memory totals)."""
    gpus = []
    for i, device in enumerate(tf.config.list_physical_devices("GPU")):
        details = tf.config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        gpus.append(GpuInfo(i, details.get("device_name", "GPU"),
                            compute_capability=".".join(str(x) for x in capability) if capability else None))
    return tuple(gpus)


def apply_config(config: Any, machine: Probe, start: bool = True,
                 plan: Optional[Plan] = None) -> tuple[Plan, Applied]:
    """Plan ``config`` for ``machine``, reconcile with the GPUs TensorFlow lists, and apply.

    NVML and TensorFlow can disagree: NVML lists GPUs that a CPU-only
    TensorFlow (or one missing CUDA libraries) cannot use, or NVML cannot be
    read while TensorFlow sees GPUs. Before anything is initialised, the plan's
    environment is set and TensorFlow's physical GPUs are listed (listing does
    not initialise them); on disagreement the plan is remade for what
    TensorFlow will use, with a warning saying why.

    ``plan``: :func:`tfgpu.devices.plan.make_plan`'s for ``config`` and ``machine``
    when the caller made it already (default: made here).

    Returns:
        The plan applied, and :class:`Applied`.

    Raises:
        DeviceError: a request neither NVML's nor TensorFlow's GPUs can meet.
        AlreadyInitializedError: see :func:`apply_plan`.
    """
    tf_was_imported = "tensorflow" in sys.modules
    plan = plan if plan is not None else make_plan(config, machine)
    if not tf_was_imported:
        set_environment(plan.env)
        tf = import_tensorflow()
        plan = reconcile(config, machine, plan, _tensorflow_gpus(tf), "TensorFlow",
                         "a CPU-only TensorFlow, or CUDA libraries it cannot load")
    return plan, apply_plan(plan, tf_was_imported, start)


def reconcile(config: Any, machine: Probe, plan: Plan, seen: tuple[GpuInfo, ...], backend: str,
              cause: str) -> Plan:
    """The plan again when NVML and the backend disagree about the GPUs, with a warning saying why.

    NVML lists GPUs the backend cannot use (``cause``, e.g. a CPU-only build): the plan is made for the CPU.
    NVML could not be read but the backend sees GPUs (``seen``): the plan is made for those, without their
    memory totals. Otherwise ``plan`` is returned as it is.

    Raises:
        DeviceError: the config cannot be planned for the CPU (e.g. a GPU index it asks for).
    """
    if plan.gpus and not seen:
        why = f"NVML lists {len(machine.gpus)} GPU(s) but {backend} sees none ({cause})"
        try:
            plan = make_plan(config, dataclasses.replace(machine, gpus=()))
        except DeviceError as exc:
            raise DeviceError(f"{why}, so {exc.message}", "run 'tfgpu doctor' to find out why.") from None
        return dataclasses.replace(plan, warnings=plan.warnings + (
            f"{why}; running on the CPU ('tfgpu doctor' says why)",))
    if not plan.gpus and seen and machine.nvml_error and config.devices.visible_gpus == "all":
        plan = make_plan(config, dataclasses.replace(machine, gpus=seen))
        return dataclasses.replace(plan, warnings=plan.warnings + (
            f"NVML could not be read ({machine.nvml_error}) but {backend} sees {len(seen)} GPU(s); planned "
            "for those, without their memory totals",))
    return plan


def apply_plan(plan: Plan, tf_was_imported: Optional[bool] = None, start: bool = True) -> Applied:
    """Set the environment, import TensorFlow, make the plan's calls, build the strategy.

    Order: environment, ``tf.config`` calls (before devices initialise), the
    strategy (a MultiWorkerMirroredStrategy configures collective ops, which
    must precede the context's start), then the logical devices are listed
    (which starts the context).

    Args:
        plan: from :func:`tfgpu.devices.plan.make_plan`.
        tf_was_imported: whether TensorFlow was imported before tfgpu began
            (default: whether it is imported now).
        start: build the strategy and list the logical devices; ``False``
            leaves TensorFlow's context unstarted (``tfgpu launch``'s
            bootstrap: the script may build its own strategy).

    Returns:
        :class:`Applied`: the physical and logical devices TensorFlow reports.

    Raises:
        AlreadyInitializedError: TensorFlow initialised its devices before this
            call and one or more settings differ from what is in force; the
            message names each config key, what was asked and what holds.

    Wraps: https://www.tensorflow.org/api_docs/python/tf/config
    """
    if tf_was_imported is None:
        tf_was_imported = "tensorflow" in sys.modules
    previous = set_environment(plan.env)
    tf = import_tensorflow()
    conflicts: list[tuple[str, str, str]] = []
    if tf_was_imported and previous.get("CUDA_VISIBLE_DEVICES") != plan.env.get("CUDA_VISIBLE_DEVICES",
                                                                           previous.get("CUDA_VISIBLE_DEVICES")):
        seen = len(tf.config.list_physical_devices("GPU"))
        if seen != len(plan.gpus):
            conflicts.append(("devices.visible_gpus", f"CUDA_VISIBLE_DEVICES={plan.env['CUDA_VISIBLE_DEVICES']}",
                              f"TensorFlow started with {previous.get('CUDA_VISIBLE_DEVICES')!r} and sees {seen} GPU(s)"))
    if "keras" in sys.modules and _keras().backend.backend() != "tensorflow":
        conflicts.append(("KERAS_BACKEND", "KERAS_BACKEND=tensorflow",
                          f"Keras was imported with the {_keras().backend.backend()} backend"))
    for call in plan.tf_calls:
        why = _apply_call(tf, call)
        if why:
            conflicts.append((call.setting, str(call), why))
    if conflicts:
        items = "\n".join(f"  - {key}: {what} cannot be applied: {why}." for key, what, why in conflicts)
        raise AlreadyInitializedError(
            "TensorFlow initialised its devices before tfgpu.setup() ran, so these settings cannot "
            f"take effect:\n{items}",
            "call tfgpu.setup() before any other TensorFlow code (right after the imports, before "
            "building a model or listing logical devices), or run in a fresh process (restart the "
            "notebook kernel).",
        )
    physical = tuple(d.name for d in tf.config.list_physical_devices())
    if not start:
        return Applied(physical, None, tf_was_imported)
    strategy = start_strategy(plan)
    return Applied(physical, logical_devices(), tf_was_imported, strategy)


def logical_devices() -> tuple[str, ...]:
    """TensorFlow's logical devices (starts its context): e.g. ``("/device:CPU:0", "/device:CPU:1")``."""
    tf = import_tensorflow()
    return tuple(d.name for d in tf.config.list_logical_devices())


def start_strategy(plan: Plan) -> Any:
    """Build the plan's strategy (:func:`tfgpu.devices.strategy.build_strategy`); for multi-worker, install the Keras fixes.

    Raises:
        AlreadyInitializedError: a MultiWorkerMirroredStrategy was asked for
            after TensorFlow's context started (collective ops can no longer
            be configured).
    """
    from .strategy import build_strategy  # noqa: PLC0415

    if plan.strategy.kind != "multi_worker_mirrored":
        return build_strategy(plan.strategy)
    from . import keras_fixes  # noqa: PLC0415

    keras_fixes.install()
    try:
        return build_strategy(plan.strategy)
    except (RuntimeError, ValueError) as exc:
        if "ollective" not in str(exc):
            raise
        raise AlreadyInitializedError(
            f"distribute.strategy: multi_worker_mirrored cannot start: TensorFlow's context was started before "
            f"tfgpu.setup() ran, and collective ops must be configured first ({exc}).",
            "call tfgpu.setup() before any other TensorFlow code, or run in a fresh process.",
        ) from None
