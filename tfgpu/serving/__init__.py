"""A finished run's model: evaluated, run on new inputs, exported.

:mod:`.evaluate` (``tfgpu evaluate``), :mod:`.predict` (``tfgpu predict``), :mod:`.inference` (what the
model takes and returns, and the serving model that does both) and :mod:`.export` (``tfgpu export
savedmodel|onnx|litert``, each artifact checked in its own runtime).
"""
