"""Where the Keras backends differ: how a config's device settings reach TensorFlow or JAX.

The TensorFlow backend is :mod:`tfgpu.plan` / :mod:`tfgpu.apply` themselves;
:mod:`tfgpu.backends.jax_plan` (pure) and :mod:`tfgpu.backends.jax_apply`
(process state) are the JAX backend's counterparts. Importing this package
imports neither TensorFlow nor JAX.
"""
