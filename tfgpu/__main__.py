"""``python -m tfgpu``: the command line (what ``tfgpu run --workers N`` starts each worker with)."""

from .cli import main

main()
