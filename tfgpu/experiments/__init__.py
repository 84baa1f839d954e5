"""Many runs: sweeps, where their trials run, and runs side by side.

:mod:`.sweep` (``tfgpu sweep``: an Optuna study whose trials are ``tfgpu run`` processes),
:mod:`.placement` (the slots trials run in: GPUs, shares of one, MIG instances, CPU cores; pure) and
:mod:`.compare` (``tfgpu runs`` and ``tfgpu compare``). What a single run reports is :mod:`tfgpu.tracking`'s.
"""
