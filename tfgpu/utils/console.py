"""What ``tfgpu run`` prints as it goes: one home for its ``tfgpu: ...`` lines.

The lines go to stdout (errors go to stderr through
:meth:`tfgpu.errors.TfgpuError.report`); only the chief of a multi-worker run
prints them, which its callers decide. :func:`table_lines` aligns the commands' tables. Importing this
imports nothing else but ``typing``.
"""

from __future__ import annotations

from typing import Sequence


def say(text: str) -> None:
    """Print ``tfgpu: <text>`` and flush (a worker's log is read while it runs)."""
    print(f"tfgpu: {text}", flush=True)


def warn(text: str) -> None:
    """Print ``tfgpu: warning: <text>``."""
    say(f"warning: {text}")


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] = ()) -> list[str]:
    """Aligned text lines: ``header`` then ``rows`` (cells as text), columns two spaces apart, each left-aligned
    (``right[i]``: right-aligned), trailing spaces stripped (``tfgpu bench``, ``runs``, ``compare``, ``sweep``)."""
    cells = [list(header)] + [list(r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    align = list(right) + [False] * (len(header) - len(right))
    return ["  ".join(c.rjust(w) if align[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in cells]
