"""The run: ``tfgpu run`` from the checks before TensorFlow to the last file written.

:mod:`.runner` (orchestration: reads as the run's pipeline), :mod:`.preflight` (the checks ``tfgpu plan``
shares), :mod:`.trainer` (the model, optimizer, callbacks and loop, built once), :mod:`.loops` (``fit`` and the
``GradientTape`` loop, and their one optimizer step: gradient accumulation, all-reduce, clipping, in
:mod:`.loops.gradients`), :mod:`.callbacks` (``train.early_stopping``, ``train.callbacks``),
:mod:`.checkpoint` (saves, the position to resume from, stopping cleanly on a signal or ``train.max_time``),
:mod:`.resume` (``--resume``), :mod:`.rundir` (a run directory's life, one owner from creation to its last
status), :mod:`.layout` (the run directory's files and how they are written), :mod:`.telemetry` (each epoch's
device statistics, input wait and MFU), :mod:`.input_bench` (``tfgpu bench input``: the pipeline against the
step), :mod:`.batch_finder` and :mod:`.batch_trial` (``batch_size_per_replica: auto``, ``tfgpu
find-batch-size``) and :mod:`.lr_find` (``tfgpu lr-find``, the learning-rate range test).
"""
