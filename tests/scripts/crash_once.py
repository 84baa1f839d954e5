"""``crash_once.py MARKER COMMAND...``: dies of SIGSEGV the first time (MARKER remembers), then runs COMMAND.

A real crash of a real process, for the benchmark harness's retry of a crashed baseline (tests/training/test_speed.py).
"""

import os
import signal
import sys

marker = sys.argv[1]
if not os.path.exists(marker):
    open(marker, "w").close()
    os.kill(os.getpid(), signal.SIGSEGV)
os.execv(sys.argv[2], sys.argv[2:])
