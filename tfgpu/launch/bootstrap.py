"""``python -m tfgpu.launch.bootstrap SCRIPT [ARGS]`` (or ``-m MODULE [ARGS]``): what ``tfgpu launch`` starts.

It applies the configuration named by ``TFGPU_CONFIG`` with ``tfgpu.setup()``
in this process, leaving TensorFlow's context unstarted (so the script may
build any strategy, MultiWorkerMirroredStrategy included), and then runs the
script as ``__main__`` with :mod:`runpy`: ``sys.argv`` is the script's own,
``sys.path[0]`` its folder, and its exit code, exceptions, signals and stdin
are its own, as with ``python SCRIPT ARGS``. A ``tfgpu.setup()`` call in the
script with the same configuration returns the same result and changes
nothing. With several workers (``TF_CONFIG`` lists more than one), the Keras
fixes of :mod:`tfgpu.devices.keras_fixes` are installed so that ``model.fit`` works
under MultiWorkerMirroredStrategy.

Errors of the configuration itself exit with tfgpu's codes (3-6) and a
one-paragraph message before the script starts. First of all, the process
asks to die with the ``tfgpu launch`` that started it
(:func:`tfgpu.launch.workers.die_with_parent`).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Optional, Sequence

USAGE = "usage: python -m tfgpu.launch.bootstrap SCRIPT [ARGS...] | -m MODULE [ARGS...]"


def _workers() -> int:
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "") or "{}").get("cluster", {})
        return sum(len(v) for k, v in cluster.items() if k in ("chief", "worker"))
    except (ValueError, AttributeError, TypeError):
        return 1


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Apply the config, then run the script or module as ``__main__`` (does not return if it exits)."""
    from .workers import die_with_parent  # noqa: PLC0415

    die_with_parent()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0] == "-m" and len(args) < 2):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    from ..devices.setup import _setup  # noqa: PLC0415
    from ..errors import TfgpuError  # noqa: PLC0415

    try:
        _setup(None, start=False)
        if _workers() > 1:
            from ..devices import keras_fixes  # noqa: PLC0415

            keras_fixes.install()
    except TfgpuError as exc:
        print(exc.report(), file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    script = args[0]
    if not Path(script).is_file():
        print(f"tfgpu launch: the script {script!r} does not exist (cwd {os.getcwd()}).", file=sys.stderr)
        raise SystemExit(2)
    sys.argv = [script, *args[1:]]
    sys.path[0] = str(Path(script).resolve().parent)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
