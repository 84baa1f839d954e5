"""Slurm for real: a two-node cluster on this machine (containers/slurm/start.sh: one slurmctld, two slurmd each in its
own network namespace), the script `tfgpu export slurm` writes run unchanged by `sbatch`, preempted and requeued by
Slurm itself, against a `tfgpu run --workers 2` of the same recipe.

It needs root and Debian's slurm-wlm, munge and iproute2; without them it is skipped with the reason, and
``TFGPU_SLURM_TESTS=required`` (set by .ci/run, which installs them) makes that a failure.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..conftest import ROOT, child_env, only_run_dir, run_cli

pytestmark = pytest.mark.slow

START, STOP = ROOT / "containers" / "slurm" / "start.sh", ROOT / "containers" / "slurm" / "stop.sh"
TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "ip", "nsenter", "unshare")
#: The seed recipe, 4 epochs of 10 steps of 2 x 128 rows, validation on 5 batches: a few seconds an epoch.
SHORT = ("--set", "train.epochs=4", "--set", "train.steps_per_epoch=10", "--set", "train.validation_steps=5",
         "--set", "train.batch_size_per_replica=128")


@dataclass
class Cluster:
    state: Path
    env: dict

    def __call__(self, *args: str, cwd: Path = ROOT, timeout: int = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, env=self.env, cwd=cwd, timeout=timeout)

    def state_of(self, job: str) -> str:
        """The job's state as squeue says it (``""``: it has left the queue)."""
        return self("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()


def missing() -> str:
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (slurmd and network namespaces)"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    return f"not installed: {', '.join(absent)} (apt-get install slurm-wlm munge iproute2)" if absent else ""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Cluster:
    problem = missing()
    if problem:
        if os.environ.get("TFGPU_SLURM_TESTS") == "required":
            pytest.fail(f"TFGPU_SLURM_TESTS=required, but {problem}")
        pytest.skip(problem)
    state = tmp_path_factory.mktemp("slurm")
    started = subprocess.run(["bash", str(START), str(state)], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    # the jobs find tfgpu on PATH, as on a cluster where the environment is installed
    env = child_env(SLURM_CONF=str(state / "slurm.conf"),
                    PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    cluster = Cluster(state, env)
    nodes = cluster("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
    assert nodes == ["n1", "idle", "n2", "idle"], nodes
    yield cluster
    subprocess.run(["bash", str(STOP), str(state)], capture_output=True, timeout=120)


def epochs_of(run_dir: Path) -> list[int]:
    if not (run_dir / "metrics.csv").exists():
        return []
    with open(run_dir / "metrics.csv", newline="") as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


def wait_for(check, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def test_the_exported_job_trains_on_two_nodes_is_requeued_by_slurm_and_matches_workers_2(slurm, tmp_path):
    jobs = {}
    for loop, port in (("fit", 8888), ("custom", 8890)):  # both at once: each node runs a worker of each
        script = tmp_path / f"{loop}.sbatch"
        exported = run_cli("export", "slurm", str(ROOT / "recipes" / "mnist.yaml"), "--workers", "2",
                           "--gpus-per-worker", "0", "--name", f"mnist-{loop}", *SHORT, "--set", f"train.loop={loop}",
                           "--set", f"distribute.port={port}", "-o", str(script))
        assert exported.returncode == 0, exported.stderr
        submitted = slurm("sbatch", "--parsable", str(script), cwd=tmp_path)
        assert submitted.returncode == 0, submitted.stderr
        jobs[loop] = submitted.stdout.strip()
    errors = tmp_path / "reference.err"  # a file, not a pipe nobody reads until the end
    with open(errors, "w") as err:
        reference = subprocess.Popen([sys.executable, "-m", "tfgpu.cli", "run", str(ROOT / "recipes" / "mnist.yaml"),
                                      *SHORT, "--workers", "2", "--output-dir", str(tmp_path / "reference")],
                                     stdout=subprocess.DEVNULL, stderr=err, env=child_env(), cwd=ROOT)
    runs = {loop: tmp_path / "runs" / f"mnist-{loop}-{job}" for loop, job in jobs.items()}
    # mid-training, the two ways Slurm stops a job for a requeue: the requeue signal sent to the batch shell (as
    # --signal=B:USR1@120 sends it before the time limit), which the script passes on and tfgpu answers with a
    # checkpoint, exit 75 and `scontrol requeue`; and an administrator's `scontrol requeue` (SIGTERM to every task)
    stops = {"fit": ("scancel", "--signal=USR1", "--batch", jobs["fit"]),
             "custom": ("scontrol", "requeue", jobs["custom"])}

    def stop_each_after_its_second_epoch() -> bool:
        for loop in [loop for loop in stops if len(epochs_of(runs[loop])) >= 2]:
            stopped = slurm(*stops.pop(loop))
            assert stopped.returncode == 0, stopped.stderr
        return not stops

    wait_for(stop_each_after_its_second_epoch, "each job's second epoch")
    wait_for(lambda: not any(slurm.state_of(job) for job in jobs.values()), "both jobs to end", timeout=300)
    assert reference.wait(timeout=300) == 0, errors.read_text()[-3000:]
    expected = json.loads((only_run_dir(tmp_path / "reference") / "summary.json").read_text())
    for loop, job in jobs.items():
        output = (tmp_path / f"mnist-{loop}-{job}.out").read_text()
        summary = json.loads((runs[loop] / "summary.json").read_text())
        assert summary["status"] == "completed", output[-3000:]
        assert summary["cluster"]["source"] == "Slurm" and summary["cluster"]["jobs"]["worker"] == [
            f"n1:{8888 if loop == 'fit' else 8890}", f"n2:{8888 if loop == 'fit' else 8890}"]
        assert epochs_of(runs[loop]) == [0, 1, 2, 3], output[-3000:]  # each epoch once, across the requeue
        # the run's total in every progress line, also in the resumed remainder of an epoch (a fit call of its own)
        assert {total for _, total in re.findall(r"^Epoch (\d+)/(\d+) ", output, re.M)} == {"4"}, output[-3000:]
        (restart,) = summary["restarts"]
        assert restart["previous_status"] == "preempted", restart
        assert abs(summary["final_metrics"]["val_accuracy"] - expected["final_metrics"]["val_accuracy"]) <= 0.005
    fit_output = (tmp_path / f"mnist-fit-{jobs['fit']}.out").read_text()
    # the chief's scontrol is among the processes the requeue ends with SIGTERM: it ignores it, and reports success
    assert f"Slurm job {jobs['fit']} was requeued ('scontrol requeue {jobs['fit']}" in fit_output, fit_output[-3000:]
    assert "failed with exit code" not in fit_output, fit_output[-3000:]
    assert "SIGUSR1 arrived" in fit_output and "SIGTERM arrived" in (
        tmp_path / f"mnist-custom-{jobs['custom']}.out").read_text()
    assert ".tmp" not in fit_output  # every worker names the run directory to resume, not its scratch folder


def test_doctor_in_an_allocation_reports_what_slurm_gave_and_whether_the_workers_match(slurm, tmp_path):
    doctor = "tfgpu doctor --no-tensorflow --json --set distribute.strategy=multi_worker_mirrored"
    in_step = slurm("srun", "-N", "2", "-n", "2", "bash", "-c", f"{doctor} > doctor-$SLURM_PROCID.json",
                    cwd=tmp_path, timeout=120)
    assert in_step.returncode == 0, in_step.stderr
    in_shell = slurm("sbatch", "--wait", "-N", "2", "--output=batch.out", "--wrap", f"{doctor} > doctor-batch.json",
                     cwd=tmp_path, timeout=120)
    assert in_shell.returncode == 0, in_shell.stderr
    said = {}
    for name in ("0", "1", "batch"):
        findings = json.loads((tmp_path / f"doctor-{name}.json").read_text())["findings"]
        said[name] = [(f["level"], f["seen"]) for f in findings if f["check"] == "slurm"]
    for rank, node in (("0", "n1"), ("1", "n2")):
        (gave_level, gave), (level, workers) = said[rank]
        assert gave_level == "ok" and "2 nodes (n1, n2), 2 tasks (1, 1 per node)" in gave, gave
        assert f"this process is task {rank} of step 0 on {node}" in gave, gave
        assert "GPUs: none asked" in gave and "0 visible to this process" in gave, gave
        assert level == "ok" and "2 worker(s), one per task, the chief task 0 on n1" in workers, workers
    # the batch script's shell is no task: 'tfgpu run' there would be one process, not the two workers
    (_, gave), (level, outside) = said["batch"]
    assert "not a task of a job step" in gave and level == "warning" and "outside a job step" in outside
