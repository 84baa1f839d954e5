"""What ``tfgpu run`` prints as it goes: one home for its ``tfgpu: ...`` lines.

The lines go to stdout (errors go to stderr through
:meth:`tfgpu.errors.TfgpuError.report`); only the chief of a multi-worker run
prints them, which its callers decide. Importing this imports nothing else.
"""

from __future__ import annotations


def say(text: str) -> None:
    """Print ``tfgpu: <text>`` and flush (a worker's log is read while it runs)."""
    print(f"tfgpu: {text}", flush=True)


def warn(text: str) -> None:
    """Print ``tfgpu: warning: <text>``."""
    say(f"warning: {text}")
