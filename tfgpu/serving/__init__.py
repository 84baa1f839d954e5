"""A finished run's model: evaluated, run on new inputs, exported.

:mod:`.evaluate` (``tfgpu evaluate``), :mod:`.predict` (``tfgpu predict``), :mod:`.inference` (what the
model takes and returns, and the serving model that does both), :mod:`.export` (``tfgpu export
savedmodel|onnx|litert``, each artifact checked in its own runtime) and :mod:`.fast_dev` (``tfgpu run
--fast-dev-run``: one batch of each split trained or evaluated, saved, reloaded and evaluated).
"""
