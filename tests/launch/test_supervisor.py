"""The worker supervisor of `tfgpu run --workers N` and `tfgpu launch --workers N`, with real processes and signals:
the requeue signal forwarded (exit 75), workers that die with a SIGKILLed supervisor, a worker's teardown crash after
the run completed (exit 0, no restart), and one exit-code rule for both commands (issue 21, faults 2, 8 and 9).

Faults inside `tfgpu run` workers come from tests/scripts/worker_fault.py, started through the test-only seam
TFGPU_WORKER_PYTHON; launched workers are tests/scripts/launched_worker.py."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from tfgpu.errors import EXIT_CODES, WORKER_FAILED, worker_exit_code
from tfgpu.launch.workers import Outcome
from tfgpu.training.runner import _restartable

from ..conftest import ROOT, child_env, only_run_dir, run_cli
from ..training.test_faults import checkpoint_at, start, summary_of, wait_for

SCRIPTS = ROOT / "tests" / "scripts"
RECIPE = str(ROOT / "recipes" / "breast_cancer.yaml")
#: 8 steps per epoch on 2 workers (64 per global batch), a checkpoint every 4 steps, far more epochs than a test
#: waits for: the signal lands mid-training.
LONG = ["--set", "train.epochs=500", "--set", "train.checkpoint.every_steps=4"]
FAULTY = f"{sys.executable} {SCRIPTS / 'worker_fault.py'}"


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie waits for a reaper, but runs no more)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] not in ("Z", "X")


def wait_until_gone(pids: list[int], seconds: float = 10) -> list[int]:
    """The pids still alive after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def worker_pids(run_dir: Path) -> list[int]:
    return [w["pid"] for w in json.loads((run_dir / "workers" / "workers.json").read_text())["workers"]]


def launch(*args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tfgpu", "launch", *args], cwd=ROOT, env=child_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def launched_pids(pid_dir: Path, process: subprocess.Popen) -> list[int]:
    """Both launched workers' pids, once each has written its own (its SIGUSR1 handler is set by then)."""
    files = [pid_dir / f"worker-{i}.pid" for i in (0, 1)]
    wait_for(lambda: all(f.exists() for f in files), process, timeout=120, pause=0.1)
    return [int(f.read_text()) for f in files]


def run_workers(*args: str, **env: str) -> subprocess.CompletedProcess:
    return run_cli("run", RECIPE, "--workers", "2", *args, timeout=300, **env)


def launch_workers(tmp_path: Path, action: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfgpu", "launch", "--workers", "2", "--log-dir",
                           str(tmp_path / "logs"), "--", str(SCRIPTS / "launched_worker.py"), str(tmp_path / "pids"),
                           action], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)


def worker_error(stderr: str) -> str:
    assert "tfgpu: worker failed: " in stderr, stderr[-3000:]
    return stderr.split("tfgpu: worker failed: ", 1)[1]


# --- fast: no TensorFlow -------------------------------------------------------------------------------------


def test_the_exit_code_rule_passes_a_workers_own_code_on_and_turns_crashes_into_10():
    assert worker_exit_code(0) == 0
    assert worker_exit_code(-signal.SIGKILL) == worker_exit_code(-signal.SIGSEGV) == WORKER_FAILED == 10
    assert worker_exit_code(1) == 10  # an uncaught exception
    assert worker_exit_code(-signal.SIGINT) == 130  # interrupted, as a shell says
    for code in (3, 4, 5, 6, 7, 8, 75, 130, 42):
        assert worker_exit_code(code) == code
    assert EXIT_CODES[10] == "worker failed" and EXIT_CODES[75] == "preempted"


@pytest.mark.parametrize("code", [-signal.SIGKILL, -signal.SIGSEGV, -signal.SIGTERM, -signal.SIGINT, 1, 2, 3, 4, 5,
                                  6, 7, 8, 9, 10, 42, 75, 130, 137])
def test_a_restart_is_tried_exactly_when_the_rule_says_the_worker_crashed(code):
    failed = Outcome(worker_exit_code(code), [0, code], failed=1)
    assert _restartable(failed) == (worker_exit_code(code) == WORKER_FAILED)
    interrupted = Outcome(worker_exit_code(code), [0, code], failed=1, interrupted=True)
    assert not _restartable(interrupted)


# --- fault 9: one exit-code rule for `run --workers` and `launch --workers` -----------------------------------


@pytest.mark.slow
def test_a_killed_worker_gives_10_from_run_and_launch_and_the_message_names_the_signal(tmp_path):
    run = run_workers("--max-restarts", "0", "--output-dir", str(tmp_path / "runs"),
                      TFGPU_WORKER_PYTHON=FAULTY, TEST_FAULT="kill", TEST_FAULT_WORKER="1")
    assert run.returncode == 10, run.stderr[-3000:]
    assert "worker 1 of 2" in worker_error(run.stderr) and "was killed by SIGKILL" in worker_error(run.stderr)
    launched = launch_workers(tmp_path, "sigkill")
    assert launched.returncode == 10, launched.stderr[-3000:]
    message = worker_error(launched.stderr)
    assert "worker 1 of 2" in message and "was killed by SIGKILL" in message and "Traceback" not in launched.stderr


@pytest.mark.slow
def test_an_uncaught_exception_in_a_worker_gives_10_from_run_and_launch(tmp_path):
    run = run_workers("--max-restarts", "1", "--output-dir", str(tmp_path / "runs"),
                      TFGPU_WORKER_PYTHON=FAULTY, TEST_FAULT="raise", TEST_FAULT_WORKER="1")
    assert run.returncode == 10, run.stderr[-3000:]
    message = worker_error(run.stderr)
    assert "exited with code 1 (an uncaught exception)" in message and "RuntimeError: worker_fault.py" in message
    assert "1 restart(s) were used (--max-restarts 1)" in message  # a crash: restarted, then no restart was left
    launched = launch_workers(tmp_path, "raise")
    assert launched.returncode == 10, launched.stderr[-3000:]
    message = worker_error(launched.stderr)
    assert "exited with code 1 (an uncaught exception)" in message and "RuntimeError: launched_worker.py" in message


@pytest.mark.slow
def test_a_workers_own_code_is_passed_on_by_run_and_launch_without_a_restart(tmp_path):
    run = run_workers("--output-dir", str(tmp_path / "runs"),
                      TFGPU_WORKER_PYTHON=FAULTY, TEST_FAULT="no_data", TEST_FAULT_WORKER="1")
    assert run.returncode == 5, run.stderr[-3000:]
    assert "exited with code 5 (data error)" in worker_error(run.stderr) and "restarting" not in run.stdout
    workers = json.loads((only_run_dir(tmp_path / "runs") / "workers" / "workers.json").read_text())
    assert workers["restarts"] == 0 and workers["workers"][1]["exit_code"] == 5
    launched = launch_workers(tmp_path, "exit:5")
    assert launched.returncode == 5, launched.stderr[-3000:]
    assert "exited with code 5" in worker_error(launched.stderr)


# --- fault 8: a worker's crash after the run completed ---------------------------------------------------------


@pytest.mark.slow
def test_a_worker_crash_after_the_run_completed_is_no_failure_and_no_restart(tmp_path):
    """A worker that dies of SIGSEGV after the run completed: exit 0, no restart, the crash noted once as a
    warning. Trains its own run: a fault injected into one of its two workers is the subject."""
    result = run_workers("--set", "train.epochs=2", "--output-dir", str(tmp_path),
                         TFGPU_WORKER_PYTHON=FAULTY, TEST_FAULT="segv_after", TEST_FAULT_WORKER="1")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    s = summary_of(run_dir)
    assert s["status"] == "completed" and not s.get("restarts") and "already completed" not in result.stderr
    assert "restarting" not in result.stdout and (run_dir / "model.keras").exists()
    workers = json.loads((run_dir / "workers" / "workers.json").read_text())
    assert workers["restarts"] == 0 and workers["failed"] is None
    assert [w["exit_code"] for w in workers["workers"]] == [0, -signal.SIGSEGV]
    note = workers["after_completion"]
    assert "worker 1 of 2" in note and "was killed by SIGSEGV after the run had completed" in note
    assert s["worker_note"] == note and note in result.stdout  # said once, as a warning


# --- fault 2: the requeue signal, and workers that die with their supervisor ------------------------------------


def _fake_scontrol(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol-calls"
    fake = bin_dir / "scontrol"  # Slurm's own command, found on PATH
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return {"SLURM_JOB_ID": "4242", "PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


@pytest.mark.slow
def test_the_requeue_signal_to_run_workers_saves_a_checkpoint_and_exits_75(tmp_path):
    """SIGUSR1 (Slurm's --signal=USR1@...) to the supervisor mid-training: forwarded, the workers agree on a step,
    save and exit 75; the chief alone asks Slurm to requeue; the supervisor says how to resume. Trains its own run:
    it sends SIGUSR1 mid-training, which a shared run must not suffer."""
    slurm, calls = _fake_scontrol(tmp_path)
    out_dir = tmp_path / "runs"
    process = start(RECIPE, "--workers", "2", *LONG, "--output-dir", str(out_dir), **slurm)
    pids: list[int] = []
    try:
        run_dir = wait_for(checkpoint_at(out_dir, 8), process, timeout=240)
        pids = worker_pids(run_dir)
        process.send_signal(signal.SIGUSR1)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 75, err[-3000:]
        assert "tfgpu: preempted: the 2 workers saved a checkpoint" in err
        assert f"'tfgpu run --resume {run_dir} --workers 2'" in err and "Traceback" not in err
        workers = json.loads((run_dir / "workers" / "workers.json").read_text())
        assert [w["exit_code"] for w in workers["workers"]] == [75, 75] and workers["restarts"] == 0
        assert "SIGUSR1 arrived" in out + err and calls.read_text() == "requeue 4242\n"
        assert summary_of(run_dir)["status"] == "preempted"
        assert wait_until_gone(pids, 1) == []
    finally:
        process.kill()
        kill_all(pids)


@pytest.mark.slow
def test_workers_die_with_a_sigkilled_run_supervisor(tmp_path):
    """SIGKILL to the supervisor of ``tfgpu run --workers 2`` mid-training: no worker outlives it. Trains its own
    run: it kills the supervisor mid-training, which a shared run must not suffer."""
    # No progress lines: a chief that prints would die of the broken pipe to its supervisor anyway, and its peer
    # of the lost collective; quiet workers train on unless the kernel kills them (PR_SET_PDEATHSIG).
    process = start(RECIPE, "--workers", "2", *LONG, "--set", "train.progress=none", "--output-dir", str(tmp_path))
    # Training, past every start-up step.
    sigkill_leaves_no_worker(process, lambda: worker_pids(wait_for(checkpoint_at(tmp_path, 8), process, timeout=240)))


@pytest.mark.slow
def test_launched_workers_die_with_a_sigkilled_launch(tmp_path):
    process = launch("--workers", "2", "--log-dir", str(tmp_path / "logs"), "--",
                     str(SCRIPTS / "launched_worker.py"), str(tmp_path / "pids"), "wait")
    sigkill_leaves_no_worker(process, lambda: launched_pids(tmp_path / "pids", process))


def sigkill_leaves_no_worker(process: subprocess.Popen, workers: Callable[[], list[int]]) -> None:
    """SIGKILL ``process`` (a supervisor) once ``workers()`` gives its live workers' pids: none may outlive it."""
    pids: list[int] = []
    try:
        pids = workers()
        assert pids and all(alive(p) for p in pids)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
        assert wait_until_gone(pids, 5) == [], "workers outlived their supervisor"
    finally:
        process.kill()
        kill_all(pids)


@pytest.mark.slow
def test_the_requeue_signal_reaches_launched_workers_and_their_75_is_passed_on(tmp_path):
    process = launch("--workers", "2", "--log-dir", str(tmp_path / "logs"), "--",
                     str(SCRIPTS / "launched_worker.py"), str(tmp_path / "pids"), "wait")
    pids: list[int] = []
    try:
        pids = launched_pids(tmp_path / "pids", process)
        process.send_signal(signal.SIGUSR1)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 75, err[-3000:]
        for i in (0, 1):
            assert f"worker {i}: SIGUSR1 arrived" in (tmp_path / "logs" / f"worker-{i}.log").read_text()
        assert "tfgpu launch: SIGUSR1 reached the 2 workers; each exited with code 75 (preempted)." in err
        assert "worker failed" not in err
    finally:
        process.kill()
        kill_all(pids)
