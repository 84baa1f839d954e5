"""A run's state has one owner and one file (summary.json), and the faults of issue 21 that lived in the copies:
a resume that restores nothing, signals outside training, a committed save lost after a restore, a NaN checkpoint,
a data seed that changes on restart. Real processes, real signals, kill -9 inside saves."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any
from types import SimpleNamespace

import pytest

from tfgpu.config import load_config
from tfgpu.training.checkpoint import read_state
from tfgpu.utils.processes import stale_status

from ..conftest import ROOT, one_paragraph, only_run_dir, run_cli, run_python, small_steps
from .test_faults import SEED, checkpoint_at, epochs_in, fake_scontrol, resume, small, start, summary_of, wait_for


def rows_of(run_dir: Path) -> list[dict[str, float]]:
    import csv

    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


# --- fast: no TensorFlow -------------------------------------------------------------------------------------


def test_the_run_seed_is_kept_across_restarts_whatever_the_cluster():
    """Without tensorflow.seed, a restarted multi-worker run (new ports, other nodes) keeps the seed it began with."""
    from tfgpu.cluster.spec import Cluster
    from tfgpu.training.runner import run_seed

    cfg = load_config(str(ROOT / "recipes" / "breast_cancer.yaml"), overrides=["tensorflow.seed=null"])
    first = SimpleNamespace(cluster=Cluster(jobs={"worker": ["127.0.0.1:4001", "127.0.0.1:4002"]}, task_type="worker",
                                            task_index=0))
    again = SimpleNamespace(cluster=Cluster(jobs={"worker": ["127.0.0.1:5001", "127.0.0.1:5002"]}, task_type="worker",
                                            task_index=0))
    seed = run_seed(cfg, first, None)
    assert seed == run_seed(cfg, first, None)  # every worker of one start derives the same
    assert run_seed(cfg, again, None) != seed  # a new cluster derives another...
    resumed = SimpleNamespace(summary={"data_seed": seed})
    assert run_seed(cfg, again, resumed) == seed  # ...but the run keeps its own
    single = SimpleNamespace(cluster=None)
    drawn = run_seed(cfg, single, None)
    assert isinstance(drawn, int) and run_seed(cfg, single, SimpleNamespace(summary={"data_seed": drawn})) == drawn
    assert run_seed(load_config(str(ROOT / "recipes" / "breast_cancer.yaml"), overrides=["tensorflow.seed=7"]),
                    again, resumed) == 7


# --- real runs -----------------------------------------------------------------------------------------------


def _kill_after_epochs(tmp_path: Path, data: Path, epochs: int, *args: str) -> Path:
    """A run of the seed recipe at 512 per replica on :func:`small_mnist` (15 steps an epoch) killed (-9) once
    its checkpoint holds ``epochs`` epochs."""
    process = start(SEED, "--set", "train.batch_size_per_replica=512", *args, "--output-dir", str(tmp_path),
                    **small(data))
    run_dir = wait_for(checkpoint_at(tmp_path, epochs * small_steps(512)), process, pause=0.01)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_resume_with_checkpoint_off_continues_from_the_checkpoint(tmp_path, loop, small_mnist):
    """Fault 1: --resume --set train.checkpoint=false used to train fresh weights and report a normal run.
    Trains its own run: it kills the run after two epochs and resumes it, which a shared run must not suffer."""
    run_dir = _kill_after_epochs(tmp_path, small_mnist, 2, "--set", "train.epochs=4", "--set", f"train.loop={loop}")
    state = read_state(run_dir)
    assert state["epoch"] >= 2 and state["step"] == 0
    result = resume(run_dir, "--set", "train.checkpoint=false", **small(small_mnist))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = rows_of(run_dir)
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2, 3]
    done = state["epoch"]
    # A fresh model's first epoch (row 0) is far behind; a continued one is at least as good as where it stopped.
    assert rows[done]["loss"] < rows[0]["loss"] * 0.6, rows
    assert rows[done]["accuracy"] > rows[done - 1]["accuracy"] - 0.02, rows
    assert "train.checkpoint is off now, so nothing more is saved" in result.stdout + result.stderr
    s = summary_of(run_dir)
    assert s["status"] == "completed" and s["checkpoint"]["restored_from"] == {"epoch": done, "step": 0}


def _save_in_progress(run_dir: Path, since: float) -> bool:
    """A checkpoint file written after ``since`` holds another step than the committed save (it is being
    written, or written and not committed yet)."""
    folder, state = run_dir / "checkpoint", read_state(run_dir)
    if state is None or not folder.is_dir():
        return False
    for path in folder.iterdir():
        try:
            if path.stat().st_mtime < since:
                continue
        except OSError:
            continue
        if path.name.startswith("ckpt-") and path.name.endswith(".weights.h5"):
            if int(path.name[5:].split(".")[0]) > state["global_step"]:
                return True
        if path.name == "latest.weights.h5":  # tfgpu before issue 21: Keras's BackupAndRestore file
            try:
                if hashlib.sha256(path.read_bytes()).hexdigest() != state["files"]["sha256"]:
                    return True
            except OSError:
                return True
    return False


@pytest.mark.slow
def test_kills_inside_the_first_save_after_each_resume_never_lose_the_committed_checkpoint(tmp_path):
    """Fault 4: after a resume from a cut save, the next save overwrote the committed copy (Keras's
    double checkpoint); a second cut left no file with the committed hash. Cut the first save after every resume.
    Trains its own run: it kills the run inside checkpoint saves and resumes it, which a shared run must not suffer."""
    big = ["--set", "model.layers=[{Flatten: {}}, {Dense: {units: 5000, activation: relu}}, "
                    "{Dense: {units: 10, activation: softmax}}]",
           "--set", "train.batch_size_per_replica=2048", "--set", "train.steps_per_execution=1",
           "--set", "train.checkpoint.every_steps=1", "--set", "train.epochs=3", "--set", "output.save_model=false"]
    process = start(SEED, *big, "--output-dir", str(tmp_path))
    run_dir = wait_for(checkpoint_at(tmp_path, 1), process, pause=0.01)
    cuts = 0
    for attempt in range(10):
        since = time.time()
        if attempt:
            process = start("--resume", str(run_dir))
        wait_for(lambda: _save_in_progress(run_dir, since), process, pause=0.002)
        process.send_signal(signal.SIGKILL)
        process.communicate()
        cuts += 1
        if cuts >= 3:
            break
    # the rest without a save per step (a setting a resume may change): the cut saves are what is under test
    result = resume(run_dir, "--set", "train.checkpoint.every_steps=null")
    assert result.returncode == 0, result.stderr[-3000:]
    s = summary_of(run_dir)
    assert s["status"] == "completed" and epochs_in(run_dir) == [0, 1, 2] and len(s["restarts"]) == cuts
    assert s["final_metrics"]["val_accuracy"] > 0.8
    left = sorted(p.name for p in (run_dir / "checkpoint").iterdir() if p.name != "progress.json")
    assert left == [f"ckpt-{s['checkpoint']['committed']['global_step']}.weights.h5"], left


@pytest.mark.slow
def test_a_nan_loss_never_commits_a_checkpoint_of_nan_weights(tmp_path):
    """Fault 5: TerminateOnNaN's graceful stop still ran the epoch-end save, committing NaN weights.
    Trains its own run: the NaN loss it provokes (an SGD rate of 1e12) ends the run with exit 7."""
    result = run_cli("run", "recipes/mnist.yaml", "--set", "model.optimizer={name: sgd, learning_rate: 1.0e+12}",
                     "--set", "train.batch_size_per_replica=512", "--set", "train.epochs=3",
                     "--output-dir", str(tmp_path))
    assert result.returncode == 7, result.stderr[-3000:]
    assert "loss became nan in epoch 1" in result.stderr and "Traceback" not in result.stderr
    run_dir = only_run_dir(tmp_path)
    state = read_state(run_dir)
    if state is not None:  # a committed checkpoint, if any, holds finite weights
        import h5py
        import numpy as np

        def finite(name, obj):
            if isinstance(obj, h5py.Dataset):
                assert np.all(np.isfinite(obj[()])), name

        with h5py.File(run_dir / "checkpoint" / state["files"]["weights"], "r") as f:
            f.visititems(finite)
    assert summary_of(run_dir)["status"] == "failed"


def wait_until_caught(process: Any, signum: int, timeout: float = 120) -> None:
    """Wait until ``process`` has a handler for ``signum`` (the ``SigCgt`` mask of ``/proc/PID/status``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        with open(f"/proc/{process.pid}/status") as status:
            mask = next((int(line.split()[1], 16) for line in status if line.startswith("SigCgt:")), 0)
        if mask >> (signum - 1) & 1:
            return
        time.sleep(0.02)
    pytest.fail(f"the process never handled signal {signum} (exit {process.poll()})")


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1"])
def test_a_stop_signal_before_training_ends_the_run_as_preempted_not_killed(tmp_path, sig):
    """Fault 2: outside training, SIGTERM (and SIGUSR1, the default requeue signal, whose default action ends the
    process) killed tfgpu run with no requeue. Now it stops with 75, says where it was, and requeues.
    Starts its own run: it signals the run while TensorFlow starts, which a finished shared run cannot offer."""
    bin_dir, calls = fake_scontrol(tmp_path)
    process = start(SEED, "--output-dir", str(tmp_path / "runs"), SLURM_JOB_ID="4242",
                    PATH=f"{bin_dir}:{os.environ['PATH']}")
    # as soon as tfgpu handles the signal (it has read the config; TensorFlow starts next): not a fixed delay, which
    # on a slow machine ended before the handlers were set, and the signal's default action killed the process
    wait_until_caught(process, getattr(signal, sig))
    process.send_signal(getattr(signal, sig))
    out, err = process.communicate(timeout=120)
    assert process.returncode == 75, (process.returncode, err[-3000:])
    line = [t for t in err.splitlines() if t.startswith("tfgpu: preempted:")]
    assert line and f"{sig} arrived while" in line[0], err[-2000:]
    one_paragraph(err[err.index("tfgpu: preempted:"):])
    if sig == "SIGUSR1":
        assert calls.read_text().split() == ["requeue", "4242"]
        assert "Slurm job 4242 was requeued" in err
    else:
        assert not calls.exists()
    runs = tmp_path / "runs"
    for run_dir in (runs.iterdir() if runs.exists() else []):  # none was made yet, or it says how it ended
        assert summary_of(run_dir)["status"] != "running"


def test_a_stop_signal_inside_a_data_check_is_not_reported_as_a_damaged_file(tmp_path):
    """A SIGTERM landing while the data check reads mnist.npz was caught by the reader's ``except Exception`` and
    reported as "cannot read mnist.npz as a .npz file: SIGTERM arrived ..." with exit 5 (seen with 4 test workers
    on 2 cores). It ends as preempted (75), naming what it interrupted. The signal is real; only its moment is
    pinned, by sending it from inside the reader's ``numpy.load`` call (no TensorFlow starts)."""
    code = f"""
        import os, signal
        import numpy as np
        real_load = np.load
        def load_then_signal(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return real_load(*args, **kwargs)
        np.load = load_then_signal
        from tfgpu.cli.main import main
        main(["run", {SEED!r}, "--output-dir", {str(tmp_path)!r}])
    """
    result = run_python(code, timeout=120)
    assert result.returncode == 75, (result.returncode, result.stderr[-3000:])
    assert "tfgpu: preempted: SIGTERM arrived while checking the config and the data files" in result.stderr
    assert "cannot read" not in result.stderr and "data error" not in result.stderr
    one_paragraph(result.stderr[result.stderr.index("tfgpu: preempted:"):])
    assert list(tmp_path.iterdir()) == []  # nothing was written


@pytest.mark.slow
def test_a_stop_signal_while_the_test_split_is_evaluated_ends_as_preempted(tmp_path):
    """Fault 2: after training (model.keras, the test split) a signal is handled too; --resume then finishes.
    Trains its own run: it signals the run during its test split and resumes it, which a shared run must not suffer."""
    process = start(SEED, "--set", "train.epochs=1", "--set", "data.validation_split=0.1",
                    "--output-dir", str(tmp_path))

    def saved():
        dirs = list(tmp_path.iterdir()) if tmp_path.exists() else []
        return dirs and (dirs[0] / "model.keras").exists() and dirs[0]

    run_dir = wait_for(saved, process, pause=0.005)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    s = summary_of(run_dir)
    if process.returncode == 0:  # the test split was already done: nothing left to stop
        assert s["status"] == "completed"
        pytest.xfail("the signal came after the run had finished")
    assert process.returncode == 75, err[-3000:]
    assert "SIGTERM arrived while" in err and s["status"] == "preempted"
    result = resume(run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert summary_of(run_dir)["status"] == "completed" and "test_accuracy" in summary_of(run_dir)["test_metrics"]


@pytest.mark.slow
def test_without_a_seed_a_resumed_run_keeps_its_data_seed(tmp_path, small_mnist):
    """Fault 6: the shuffle seed is drawn once, when the run is created, and read back on every resume.
    Trains its own run: it kills a run without tensorflow.seed and resumes it, which a shared run must not suffer."""
    run_dir = _kill_after_epochs(tmp_path, small_mnist, 1, "--set", "train.epochs=3", "--set", "tensorflow.seed=null")
    killed = summary_of(run_dir)
    seed = killed["data_seed"]
    assert isinstance(seed, int)
    assert killed["status"] == "running" and "has ended" in stale_status(killed)  # kill -9 left it; known stale
    result = resume(run_dir, **small(small_mnist))
    assert result.returncode == 0, result.stderr[-3000:]
    s = summary_of(run_dir)
    assert s["status"] == "completed" and s["data_seed"] == seed and epochs_in(run_dir) == [0, 1, 2]
    assert "has ended" in s["restarts"][0]["previous_status_stale"]


@pytest.mark.slow
def test_summary_is_the_one_state_file(two_replica_runs):
    """The commit record, the status, the data seed and the epochs live in summary.json; no other state file."""
    for loop, (_, run_dir) in two_replica_runs.items():
        s = summary_of(run_dir)
        committed = s["checkpoint"]["committed"]
        assert committed["epoch"] == 2 and committed["step"] == 0 and committed["loop"] == loop
        assert s["epochs_completed"] == 2 and s["data_seed"] == 42 and s["status"] == "completed"
        assert not (run_dir / "checkpoint").exists()  # model.keras holds the result
        assert sorted(p.name for p in run_dir.iterdir() if p.suffix == ".json") == ["plan.json", "summary.json"]
        json.dumps(s)


@pytest.mark.slow
def test_a_stop_in_an_epochs_last_call_saves_after_its_validation_and_resume_finishes(tmp_path, small_mnist):
    """The seed recipe runs each epoch in one call (6 steps on the full MNIST, 2 on :func:`small_mnist`, which this
    test reads), so a SIGTERM lands in an epoch's last call: the stop
    used to save the position (epoch e, step 6) before the epoch's validation and row, and the resumed fit ran
    a zero-step epoch (it crashed, exit 139, in the container test). Now the stop waits for the epoch's end.
    Trains its own run: it stops the run with SIGTERM and resumes it, which a shared run must not suffer."""
    process = start(SEED, "--set", "train.epochs=4", "--output-dir", str(tmp_path), **small(small_mnist))
    run_dir = wait_for(checkpoint_at(tmp_path, small_steps(4096)), process, pause=0.01)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 75, err[-3000:]
    state = read_state(run_dir)
    # epoch 2's last call, unless the signal landed between epoch 1's save and epoch 2's call (seen under load)
    assert state["step"] == 0 and state["epoch"] >= 1, state
    assert epochs_in(run_dir) == list(range(state["epoch"]))  # every epoch the checkpoint holds has its row
    result = resume(run_dir, **small(small_mnist))
    assert result.returncode == 0, result.stderr[-3000:]
    assert epochs_in(run_dir) == [0, 1, 2, 3] and summary_of(run_dir)["status"] == "completed"
