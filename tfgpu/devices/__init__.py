"""Everything before and while TensorFlow (or JAX) starts: the machine, the plan, applying it, and what it gave.

In the order a run uses them: :mod:`.probe` reads the machine (NVML, the environment, the packages)
without importing TensorFlow; :mod:`.plan` (TensorFlow, and the entry :func:`~tfgpu.devices.plan.make_plan`)
and :mod:`.jax_plan` turn config + probe into a :class:`~tfgpu.devices.plan_base.Plan` (pure data, the
types and shared steps in :mod:`.plan_base`); :mod:`.apply` and :mod:`.jax_apply` carry it out (the only
writers of ``os.environ`` and ``tf.config``), :mod:`.strategy` builds the ``tf.distribute`` strategy and
:mod:`.keras_fixes` patches what multi-worker ``fit`` needs; :mod:`.startup_log` holds TensorFlow's
start-up lines back and :mod:`.lean_import` the optional packages it only probes for; :mod:`.setup` is ``tfgpu.setup()``. :mod:`.seen_by_tf` and :mod:`.seen_by_jax` are
child processes that report what the framework sees. :mod:`.doctor` (``tfgpu doctor``), :mod:`.smoke` (``tfgpu doctor --smoke``: a known step on each device, exact
all-reduce sums) and :mod:`.bench` (``tfgpu bench``) diagnose and time the same machine; :mod:`.monitor` samples
its GPUs (NVML) and the host while a run trains, against the peaks of :mod:`.peaks`.
"""
