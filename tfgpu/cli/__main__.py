"""``python -m tfgpu.cli``: the command line (as the ``tfgpu`` script)."""

from .main import main

main()
