"""A script for ``tfgpu launch --workers 2`` (tests/launch/test_supervisor.py): ``launched_worker.py PID_DIR ACTION``.

Each worker (its index from ``TF_CONFIG``) exits 75 at SIGUSR1, as a ``tfgpu run`` worker does at the requeue
signal, writes its pid to ``PID_DIR/worker-<index>.pid`` and says so. Worker 1 then does ACTION: ``wait``,
``raise`` (an uncaught exception), ``sigkill`` (it kills itself) or ``exit:N``; worker 0 always waits (up to
120 s), until the supervisor stops it.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

pid_dir, action = Path(sys.argv[1]), sys.argv[2]
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def requeue(signum, frame):
    print(f"worker {index}: SIGUSR1 arrived; exiting with 75", flush=True)
    sys.exit(75)


signal.signal(signal.SIGUSR1, requeue)
pid_dir.mkdir(parents=True, exist_ok=True)
(pid_dir / f"worker-{index}.tmp").write_text(str(os.getpid()))
os.replace(pid_dir / f"worker-{index}.tmp", pid_dir / f"worker-{index}.pid")
print(f"worker {index} (pid {os.getpid()}) is running", flush=True)
if index == 1:
    if action == "raise":
        raise RuntimeError("launched_worker.py: worker 1 fails")
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action.startswith("exit:"):
        sys.exit(int(action.split(":", 1)[1]))
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(0.1)
