"""``worker_fault.py -m tfgpu run ...``: a ``tfgpu run --workers N`` worker, with a fault in one of them (tests only).

tests/launch/test_supervisor.py sets ``TFGPU_WORKER_PYTHON="python tests/scripts/worker_fault.py"`` (the test-only seam of
``tfgpu.launch.workers.prepare_run``), so every worker runs this, which runs ``tfgpu`` as ``python -m`` would, in this
same process (runpy). The worker whose ``TF_CONFIG`` task index is ``TEST_FAULT_WORKER`` gets ``TEST_FAULT``:

- ``raise``: an uncaught exception before tfgpu starts (Python exits with 1 and a traceback);
- ``kill``: the process SIGKILLs itself before tfgpu starts;
- ``no_data``: tfgpu runs with ``TFGPU_DATA_DIR`` naming a folder that does not exist: its own data error (5);
- ``segv_after``: tfgpu runs to its end; once the chief's summary.json says ``completed``, the process dies of
  SIGSEGV, as TensorFlow's teardown crash does.

The other workers run unchanged.
"""

import json
import os
import runpy
import signal
import sys
import time

if len(sys.argv) < 3 or sys.argv[1] != "-m":
    raise SystemExit("usage: worker_fault.py -m MODULE [ARGS...]")
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
fault = os.environ.get("TEST_FAULT") if os.environ.get("TEST_FAULT_WORKER") == str(index) else None
if fault == "raise":
    raise RuntimeError(f"worker_fault.py: a fault injected into worker {index}")
if fault == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if fault == "no_data":
    os.environ["TFGPU_DATA_DIR"] = os.path.join(os.getcwd(), "no-such-data-folder")
sys.argv = [sys.argv[2], *sys.argv[3:]]
sys.path[0] = os.getcwd()  # as python -m
code = 0
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
if fault == "segv_after" and code in (0, None):
    summary = os.path.join(os.environ["TFGPU_RUN_DIR"], "summary.json")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(summary, encoding="utf-8") as f:
                if json.load(f).get("status") == "completed":
                    break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    print(f"worker_fault.py: worker {index} finished; now it dies of SIGSEGV", flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)
raise SystemExit(code)
