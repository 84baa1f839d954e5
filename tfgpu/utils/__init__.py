"""Helpers that know nothing of training: named imports, Keras's names read from its files, console lines, safe file writes, process liveness.

:mod:`.imports` (``"package.module:function"`` names from a recipe, and whether a package is importable
without importing it), :mod:`.keras_names` (the classes Keras exports, read from its package files),
:mod:`.console` (the ``tfgpu: ...`` lines and tables), :mod:`.files` (atomic writes, and a full disk as one
paragraph that names the file and the free space) and :mod:`.processes` (whether the process that wrote a
file still runs). Below everything but :mod:`tfgpu.errors`: nothing here imports another tfgpu package.
"""
