"""Worker processes: each child's command and environment computed as data, then started and supervised.

:mod:`.workers` prepares the children of ``tfgpu run --workers N`` and ``tfgpu launch`` (pure), starts
them, forwards signals, and stops the group when one fails (exit codes passed on); :mod:`.bootstrap` is
what ``tfgpu launch`` runs in each child: the config applied, then the user's script as ``__main__``.
"""
