"""``tfgpu.setup()``: a configuration applied to this process before TensorFlow (or JAX) starts, and what it gave.

:func:`setup` is the public entry (re-exported as ``tfgpu.setup``): it loads the config, probes the
machine (:mod:`tfgpu.devices.probe`), plans (:mod:`tfgpu.devices.plan`), and applies the plan
(:mod:`tfgpu.devices.apply`, or :mod:`tfgpu.devices.jax_apply` on ``backend: jax``) while TensorFlow's
start-up lines are held back (:mod:`tfgpu.devices.startup_log`). :class:`Setup` is what it returns.
A process is configured once: the applied config and its :class:`Setup` are kept in ``_applied``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional, Union

from ..config import Config, load_config


class Setup:
    """What :func:`setup` applied.

    Attributes:
        config: the resolved configuration.
        plan: the :class:`~tfgpu.devices.plan.Plan` that was applied.
        physical_devices: physical devices TensorFlow reports, e.g.
            ``("/physical_device:CPU:0", "/physical_device:GPU:0")``.
        logical_devices: logical devices, e.g. ``("/device:CPU:0", "/device:CPU:1")``.
        strategy: the ``tf.distribute.Strategy`` to build models under; with
            ``backend: jax``, the ``keras.distribution.DataParallel`` tfgpu set
            for the whole process (``None`` on one device: nothing to enter).
        num_replicas: ``strategy.num_replicas_in_sync`` (over all workers); on
            JAX, the devices the batch is split over.
        global_batch_size: per-replica batch x replicas (samples per step).
        cluster: the multi-worker :class:`~tfgpu.cluster.spec.Cluster`, or ``None``.
        is_chief: whether this process writes outputs (``True`` on one machine).
        startup_log: TensorFlow's start-up lines while the settings were
            applied, each with whether it was shown
            (:class:`tfgpu.devices.startup_log.StartupLog`; ``.held`` is the text held
            back below ``tensorflow.log_level``).
        startup_log_file: the file holding the held-back lines
            (``<temp dir>/tfgpu-<uid>/startup-<pid>.log``; ``RUN_DIR/startup.log``
            for ``tfgpu run``), or ``None`` when nothing was held back.

    ``tfgpu launch`` applies a configuration without starting TensorFlow's
    context (the script may build its own strategy): there, ``strategy`` and
    ``logical_devices`` are made when first read. With ``backend: jax``,
    ``physical_devices`` and ``logical_devices`` are JAX's devices
    (``("cpu:0 (cpu)", ...)`` and ``("cpu:0", "cpu:1")``).
    """

    def __init__(self, config: Config, plan: Any, physical_devices: tuple[str, ...],
                 logical_devices: Optional[tuple[str, ...]] = None, strategy: Any = None,
                 startup_log: Any = None) -> None:
        self.config = config
        self.plan = plan
        self.physical_devices = physical_devices
        self._logical_devices = logical_devices
        self._strategy = strategy
        self.startup_log = startup_log
        self.startup_log_file: Optional[Path] = None

    @property
    def backend(self) -> str:
        """The Keras backend the configuration was applied for: ``"tensorflow"`` or ``"jax"``."""
        return self.plan.backend

    def scope(self) -> Any:
        """The context to build models in: ``strategy.scope()`` on TensorFlow; on JAX a no-op (the
        distribution tfgpu set applies to the whole process)."""
        if self.backend == "jax":
            import contextlib  # noqa: PLC0415

            return contextlib.nullcontext()
        return self.strategy.scope()

    @property
    def strategy(self) -> Any:
        if self.backend == "jax":
            return self._strategy
        if self._strategy is None:
            from .apply import start_strategy  # noqa: PLC0415

            self._strategy = start_strategy(self.plan)
        return self._strategy

    @property
    def logical_devices(self) -> tuple[str, ...]:
        if self._logical_devices is None:
            from .apply import logical_devices  # noqa: PLC0415

            self.strategy  # noqa: B018 - a MultiWorkerMirroredStrategy must exist before the context starts
            self._logical_devices = logical_devices()
        return self._logical_devices

    @property
    def num_replicas(self) -> int:
        if self.backend == "jax":
            return self.plan.num_replicas
        return int(self.strategy.num_replicas_in_sync)

    @property
    def global_batch_size(self) -> int:
        return self.plan.batch_size_per_replica * self.num_replicas

    @property
    def cluster(self) -> Any:
        return self.plan.cluster

    @property
    def is_chief(self) -> bool:
        return self.plan.cluster is None or self.plan.cluster.is_chief

    def __str__(self) -> str:
        s = self.plan.strategy
        workers = f" on {self.plan.num_workers} workers" if self.plan.cluster else ""
        if self.backend == "jax":
            return (f"tfgpu: Keras on JAX; {len(self.plan.gpus)} GPU(s); JAX devices: {', '.join(self.logical_devices)}; "
                    f"distribution: {type(self.strategy).__name__ if self.strategy else 'none'} "
                    f"({', '.join(s.devices) or 'default device'}); replicas: {self.num_replicas}; global batch: "
                    f"{self.plan.batch_size_per_replica} x {self.num_replicas} = {self.global_batch_size}")
        return (
            f"tfgpu: {len(self.plan.gpus)} GPU(s); logical devices: {', '.join(self.logical_devices)}; "
            f"strategy: {type(self.strategy).__name__} ({', '.join(s.devices) or 'default device'}){workers}; "
            f"replicas: {self.num_replicas}; global batch: {self.plan.batch_size_per_replica} x "
            f"{self.num_replicas} = {self.global_batch_size}"
        )

#: The config this process applied and what it gave (a second :func:`setup` with the same config returns it).
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
        the same object and changes nothing (so a script run by
        ``tfgpu launch`` may call it too).

    Raises:
        ConfigError: the configuration is invalid (or ``TF_CONFIG`` / the
            Slurm environment, for ``multi_worker_mirrored``).
        DeviceError: a device request this machine cannot satisfy.
        AlreadyInitializedError: TensorFlow already initialised its devices and
            a requested setting differs from what is in force (each is named).

    With ``backend: jax`` the same fields describe Keras on JAX (see
    :class:`Setup`); ``docs/jax.md`` lists the JAX variables set.

    TensorFlow's start-up lines below ``tensorflow.log_level`` (which it
    prints before its logging is set up, whatever ``TF_CPP_MIN_LOG_LEVEL``
    says) are held back while the settings are applied and written to
    ``Setup.startup_log_file`` (:mod:`tfgpu.devices.startup_log`); fd 2 is restored
    before this returns.

    Environment: ``TFGPU_CONFIG`` (config path when none is given);
    ``TFGPU_LOG_FILTER=0`` (do not hold start-up lines back);
    ``CUDA_VISIBLE_DEVICES`` (respected: indices count the GPUs it lets through);
    ``TF_CONFIG`` and ``SLURM_*`` (the cluster, for ``multi_worker_mirrored``).
    """
    return _setup(config, start=True, **sections)


def _setup(config: Any = None, start: bool = True, keep_log: bool = True, **sections: Any) -> Setup:
    """:func:`setup`; ``start=False`` leaves TensorFlow's context unstarted (``tfgpu launch``'s bootstrap);
    ``keep_log=False`` leaves the held-back start-up lines to the caller (``tfgpu run`` writes them into the run
    directory)."""
    global _applied
    from .plan import make_plan  # noqa: PLC0415
    from .probe import probe  # noqa: PLC0415
    from .startup_log import (NO_DRIVER_EXPECTED, default_file, gpus_hidden, hold_back, level_in_force,  # noqa: PLC0415
                              write_held)

    cfg = load_config(config, **sections)
    if _applied is not None and _applied[0] == cfg:
        return _applied[1]
    if cfg.backend == "jax":
        from .jax_apply import apply_jax_config as apply_config  # noqa: PLC0415
    else:
        from .apply import apply_config  # noqa: PLC0415
    machine = probe()
    plan = make_plan(cfg, machine)  # the level and the visible GPUs TensorFlow will start with
    expected = NO_DRIVER_EXPECTED if machine.no_driver else ()  # cuInit's 303: what the probe already knows
    with hold_back(level_in_force(plan.env), gpus_hidden({**os.environ, **plan.env}), expected) as log:
        plan, applied = apply_config(cfg, machine, start=start, plan=plan)
    note = log.note()
    if note:
        print(note, file=sys.stderr, flush=True)
    result = Setup(cfg, plan, applied.physical_devices, applied.logical_devices, applied.strategy, log)
    if keep_log:
        try:
            result.startup_log_file = write_held(log, default_file())
        except OSError:  # a full or read-only temp dir: the lines were only TensorFlow's start-up notices
            result.startup_log_file = None
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
