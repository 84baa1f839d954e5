"""Who trains together: the cluster of workers and which one this process is, and the files a scheduler takes.

:mod:`.spec` reads the cluster from ``distribute.cluster``, ``TF_CONFIG`` or Slurm's variables and
writes ``TF_CONFIG`` for a worker (pure: no TensorFlow, no process state); :mod:`.manifests` writes a
recipe as a Slurm batch script or a Kubeflow TFJob manifest (``tfgpu export slurm|tfjob``: pure text,
nothing started). Starting and supervising worker processes is :mod:`tfgpu.launch`'s.
"""
