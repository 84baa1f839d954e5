"""PROCESSES"""

from __future__ import annotations

import os
from typing import Any, Optional


def process_record() -> dict[str, Any]:
    """Who writes a run directory: ``{"pid", "host", "start"}`` (``start``: the process's start time in clock ticks
    since boot, from ``/proc/self/stat``, so a reused pid is told apart; ``None`` off Linux)."""
    import socket  # noqa: PLC0415

    return {"pid": os.getpid(), "host": socket.gethostname(), "start": _start_ticks(os.getpid())}


def _start_ticks(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_alive(record: Optional[dict[str, Any]]) -> Optional[bool]:
    """Whether the process :func:`process_record` described still runs: ``None`` when this cannot be told (another
    host, or no record: a run directory written by an earlier tfgpu)."""
    import socket  # noqa: PLC0415

    if not record or record.get("host") != socket.gethostname() or not isinstance(record.get("pid"), int):
        return None
    pid = record["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, owned by another user
        pass
    start = record.get("start")
    return start is None or _start_ticks(pid) == start


def stale_status(summary: dict[str, Any]) -> Optional[str]:
    """Why a ``summary.json`` that says ``"running"`` is out of date, or ``None`` (it is not, or cannot be told).

    The process that wrote it ended without recording how (killed, crashed, or
    its disk filled up so that the last write failed).
    """
    if summary.get("status") != "running" or process_alive(summary.get("process")) is not False:
        return None
    process = summary["process"]
    return (f"summary.json says \"running\", but its process (pid {process.get('pid')} on {process.get('host')}) "
            "has ended without recording how the run ended (killed, crashed, or its disk was full)")
