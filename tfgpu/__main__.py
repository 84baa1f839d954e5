"""``python -m tfgpu``: the command line (what ``tfgpu run --workers N`` starts each worker with)."""

from .launch.workers import die_with_parent

die_with_parent()  # a worker of tfgpu run --workers N dies with its supervisor (does nothing otherwise)

from .cli import main  # noqa: E402

main()
