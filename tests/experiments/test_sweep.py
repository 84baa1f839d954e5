"""``tfgpu sweep``: real Optuna studies whose trials are real ``tfgpu run`` processes on the breast-cancer CSV.

Placement on GPU hosts (whole GPUs, shares, MIG instances) is planned from NVML answers injected at the probe
seam (:class:`tests.devices.test_mig.FakeNvml`); on this CPU host the trials really run, two at a time.
"""

from __future__ import annotations

import csv
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import pytest
import yaml

from tfgpu.config import load_config
from tfgpu.devices.probe import Facts, probe, probe_packages
from tfgpu.errors import DeviceError
from tfgpu.experiments.placement import plan_slots

from ..conftest import RECIPES, child_env, one_paragraph, run_cli
from ..devices.test_mig import A100, FakeNvml, MIG1, MIG2, mig_probe

optuna = pytest.importorskip("optuna", reason="the test extra installs optuna (tfgpu[sweep])")

SWEEP = RECIPES / "breast_cancer_sweep.yaml"


def sweep_recipe(tmp_path: Path, name: str = "recipe.yaml", **sweep) -> Path:
    """``recipes/breast_cancer_sweep.yaml`` with ``sweep`` keys replaced and few epochs."""
    data = yaml.safe_load(SWEEP.read_text())
    data["train"]["epochs"] = sweep.pop("epochs", 4)
    data["sweep"].update(sweep)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sweep_dir(parent: Path) -> Path:
    found = [p for p in parent.iterdir() if "-sweep-" in p.name]
    assert len(found) == 1, found
    return found[0]


def study_of(directory: Path):
    record = json.loads((directory / "sweep.json").read_text())
    from tfgpu.tracking.study import open_storage

    return optuna.load_study(study_name=record["study"], storage=open_storage(record["storage"]))


# ------------------------------------------------------------------ placement, planned (no process started)


def a100s(n: int) -> FakeNvml:
    return FakeNvml([{"name": A100, "uuid": f"GPU-a100000{i}-0000-4000-8000-000000000000", "total": 40960,
                      "used": 0, "cc": "8.0", "mig": False} for i in range(n)])


def test_whole_gpus_give_one_slot_per_gpu_or_per_group(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    machine = probe(nvml=a100s(4))
    cfg = load_config(SWEEP)
    slots = plan_slots(cfg, machine, None, [0, 1])
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0", "1", "2", "3"]
    assert all(s.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and s.overrides == () and s.cpus is None for s in slots)
    two = plan_slots(load_config(SWEEP, ["sweep.per_trial.gpus=2"]), machine, None, [0, 1])
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in two] == ["0,1", "2,3"]
    assert [s.index for s in plan_slots(cfg, machine, 3, [0, 1])] == [0, 1, 2]  # --parallel 3: three of the four
    listed = plan_slots(load_config(SWEEP, ["devices.visible_gpus=[1, 3]"]), machine, None, [0, 1])
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in listed] == ["1", "3"]
    assert listed[0].overrides == ("devices.visible_gpus=all",)  # each trial sees its own GPU as GPU:0


def test_a_fraction_shares_each_gpu_with_a_memory_cap(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    half = load_config(SWEEP, ["sweep.per_trial.gpus=0.5"])
    slots = plan_slots(half, probe(nvml=a100s(2)), None, [0])
    assert [(s.env["CUDA_VISIBLE_DEVICES"], s.overrides) for s in slots] == [
        ("0", ("devices.memory_fraction=0.5",)), ("1", ("devices.memory_fraction=0.5",)),
        ("0", ("devices.memory_fraction=0.5",)), ("1", ("devices.memory_fraction=0.5",))]
    assert "share 2 of 2" in slots[2].label
    two = plan_slots(half, probe(nvml=a100s(2)), 2, [0])  # --parallel 2: one share of each GPU, not both of GPU 0
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in two] == ["0", "1"]
    most = plan_slots(load_config(SWEEP, ["sweep.per_trial.gpus=0.75"]), probe(nvml=a100s(1)), None, [0])
    assert len(most) == 1 and most[0].overrides == ("devices.memory_fraction=0.75",)  # one trial, still capped
    third = plan_slots(load_config(SWEEP, ["sweep.per_trial.gpus=0.3"]), probe(nvml=a100s(1)), None, [0])
    assert len(third) == 3 and third[0].overrides == ("devices.memory_fraction=0.3",)


def test_mig_instances_each_get_a_slot_by_uuid_and_several_per_trial_are_refused(monkeypatch):
    machine = mig_probe(monkeypatch, None)  # GPU 0 in MIG mode (two instances), GPU 1 whole, GPU 2 a V100
    slots = plan_slots(load_config(SWEEP), machine, None, [0])
    assert sorted(s.env["CUDA_VISIBLE_DEVICES"] for s in slots) == sorted([MIG1, "1", "2", MIG2])
    assert all("MIG" in s.label for s in slots if s.env["CUDA_VISIBLE_DEVICES"].startswith("MIG-"))
    with pytest.raises(DeviceError) as exc:
        plan_slots(load_config(SWEEP, ["sweep.per_trial.gpus=2"]), machine, None, [0])
    one_paragraph(exc.value.report())
    assert "one MIG instance" in exc.value.message and "sweep.per_trial.gpus" in exc.value.message


def test_cpu_slots_split_the_cores_into_thread_limits():
    cfg = load_config(SWEEP, ["devices.visible_gpus=none"])
    slots = plan_slots(cfg, probe(nvml=a100s(2)), 2, [0, 1, 2, 3, 4])
    assert [s.cpus for s in slots] == [(0, 1, 2), (3, 4)]
    assert slots[0].overrides == ("tensorflow.intra_op_threads=3", "tensorflow.inter_op_threads=3")
    assert slots[1].env == {"OMP_NUM_THREADS": "2"} and slots[0].label == "CPU cores 0-2"
    shared = plan_slots(cfg, probe(nvml=a100s(0)), 3, [0, 1])
    assert [s.cpus for s in shared] == [(0,), (1,), (0,)] and "(shared)" in shared[2].label
    jax = plan_slots(load_config(SWEEP, ["backend=jax", "devices.visible_gpus=none"]), probe(nvml=a100s(0)), 2, [0, 1])
    assert jax[0].overrides == () and jax[0].cpus == (0,)  # JAX refuses the thread keys: the affinity alone


def test_plan_of_a_sweep_shows_the_slots_of_a_machine_file(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    machine = tmp_path / "four-a100.json"
    machine.write_text(json.dumps(Facts(machine=probe(nvml=a100s(4)), packages=probe_packages()).to_dict()))
    shown = run_cli("plan", str(SWEEP), "--machine", str(machine), "--set", "sweep.per_trial.gpus=0.5")
    assert shown.returncode == 0, shown.stderr
    assert "sweep: 8 trials, 8 at a time (8 slots" in shown.stdout
    assert "slot 7: GPU 3 (NVIDIA A100-SXM4-40GB (40960 MiB)), share 2 of 2" in shown.stdout
    assert "CUDA_VISIBLE_DEVICES=3 CUDA_DEVICE_ORDER=PCI_BUS_ID --set devices.memory_fraction=0.5" in shown.stdout
    as_json = json.loads(run_cli("plan", str(SWEEP), "--machine", str(machine), "--json").stdout)
    assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in as_json["sweep"]["slots"]] == ["0", "1", "2", "3"]
    here = run_cli("plan", str(SWEEP), "--parallel", "2", "--set", "devices.visible_gpus=none")
    assert here.returncode == 0, here.stderr
    assert "slot 1: CPU core" in here.stdout and "--set tensorflow.intra_op_threads=" in here.stdout


# ------------------------------------------------------------------ the recipe's errors, before any trial


@pytest.mark.parametrize("change, says", [
    ({"parameters": {"train.batch_size": {"choice": [16, 32]}}}, "train.batch_size"),
    ({"sampler": "grid"}, "grid tries every combination"),
    ({"parameters": {"model.optimizer.learning_rate": {"log_uniform": [0, 1]}}}, "low > 0"),
    ({"pruner": {"median": {"n_warmup": 2}}}, "MedianPruner(n_warmup=2) was refused"),
    ({"enqueue": [{"train.batch_size_per_replica": 48}]}, "48, outside its search space choice [16, 32, 64]"),
    ({"parameters": {"train.epochs": {"uniform": [2, 5]}}}, "'train.epochs': Input should be a valid integer"),
    ({"parameters": {"train.batch_size_per_replica": {"choice": [16, "x", 64]}}}, "train.batch_size_per_replica=x"),
    ({"parameters": {"tensorflow.intra_op_threads": {"choice": [1, 2]}}}, "each trial's slot sets it"),
])
def test_a_bad_sweep_section_is_a_config_error_before_any_trial(tmp_path, change, says):
    data = yaml.safe_load(SWEEP.read_text())
    data["sweep"].update(change)
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(yaml.safe_dump(data))
    result = run_cli("sweep", str(recipe), "--output-dir", str(tmp_path / "runs"), timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr
    one_paragraph(result.stderr)
    assert says in result.stderr
    assert not (tmp_path / "runs").exists()  # refused before a sweep directory was made


def test_a_recipe_without_a_sweep_section_and_a_resume_of_no_sweep_are_refused(tmp_path):
    plain = run_cli("sweep", str(RECIPES / "breast_cancer.yaml"))
    assert plain.returncode == 3 and "has no sweep: section" in plain.stderr
    one_paragraph(plain.stderr)
    nothing = run_cli("sweep", "--resume", str(tmp_path))
    assert nothing.returncode == 12 and "is not a sweep directory" in nothing.stderr
    one_paragraph(nothing.stderr)


@pytest.mark.slow
def test_a_metric_the_run_does_not_log_stops_the_sweep_at_the_first_trial(tmp_path):
    recipe = sweep_recipe(tmp_path, metric="val_auc", trials=4, epochs=1)
    result = run_cli("sweep", str(recipe), "--output-dir", str(tmp_path / "runs"), timeout=300)
    assert result.returncode == 12, result.stdout + result.stderr
    one_paragraph(result.stderr)
    assert "sweep.metric: the run does not log 'val_auc'" in result.stderr and "before any trial completed" in result.stderr
    states = [t.state.name for t in study_of(sweep_dir(tmp_path / "runs")).trials]
    assert states == ["FAIL"]  # one trial, not four


# ------------------------------------------------------------------ real sweeps


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 4-trial sweep, 2 CPU slots at a time, then its best.yaml run again. Trains its own runs: the sweep's trials
    and the best.yaml rerun are the subject."""
    tmp = tmp_path_factory.mktemp("sweep")
    recipe = sweep_recipe(tmp, trials=4, epochs=6)
    started = time.perf_counter()
    result = run_cli("sweep", str(recipe), "--parallel", "2", cwd=tmp, timeout=600)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stdout + result.stderr
    directory = sweep_dir(tmp / "runs")
    again = run_cli("run", str(directory / "best.yaml"), cwd=tmp, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    return tmp, directory, result, seconds, again


@pytest.mark.slow
def test_a_sweep_runs_its_trials_two_at_a_time_and_prints_the_table(finished):
    tmp, directory, result, seconds, _ = finished
    rows = list(csv.DictReader((directory / "results.csv").open()))
    assert [r["trial"] for r in rows] == ["0", "1", "2", "3"]
    assert {r["status"] for r in rows} == {"completed"}
    assert list(rows[0]) == ["trial", "model.optimizer.learning_rate", "train.batch_size_per_replica", "val_loss",
                             "status", "epochs", "seconds", "run_dir"]
    for row in rows:  # each value is the trial's own run: its last epoch's val_loss
        summary = json.loads((tmp / row["run_dir"] / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["epochs_completed"] == 6 == int(row["epochs"])
        assert float(row["val_loss"]) == pytest.approx(summary["epochs"][-1]["val_loss"], abs=1e-9)
        config = yaml.safe_load((tmp / row["run_dir"] / "config.resolved.yaml").read_text())
        assert config["model"]["optimizer"]["learning_rate"] == pytest.approx(float(row["model.optimizer.learning_rate"]))
        assert config["train"]["batch_size_per_replica"] == int(row["train.batch_size_per_replica"])
        slot = next(s for s in json.loads((directory / "sweep.json").read_text())["slots"]
                    if f"--set tensorflow.intra_op_threads={config['tensorflow']['intra_op_threads']}" in
                    [f"--set {o}" for o in s["overrides"]])
        assert config["sweep"] is None and len(slot["cpus"]) == config["tensorflow"]["intra_op_threads"]
    assert "trial 1 starts on slot 1 (CPU core" in result.stdout  # two at a time
    header = next(line for line in result.stdout.splitlines() if line.startswith("trial  "))
    assert header.split() == list(rows[0])
    best = min(rows, key=lambda r: float(r["val_loss"]))
    assert any(line.startswith(f"*{best['trial']} ") for line in result.stdout.splitlines())
    record = json.loads((directory / "sweep.json").read_text())
    assert record["status"] == "completed" and len(record["slots"]) == 2
    assert (directory / "study.journal").is_file()


@pytest.mark.slow
def test_best_yaml_reproduces_the_best_trial_within_a_hundredth(finished):
    tmp, directory, _, _, again = finished
    rows = list(csv.DictReader((directory / "results.csv").open()))
    best = min(rows, key=lambda r: float(r["val_loss"]))
    text = (directory / "best.yaml").read_text()
    assert f"trial {best['trial']} of 4" in text.splitlines()[0]
    data = yaml.safe_load(text)
    assert "sweep" not in data and data["output"]["name"] == "recipe-best"
    assert data["model"]["optimizer"]["learning_rate"] == pytest.approx(float(best["model.optimizer.learning_rate"]))
    run = next((tmp / "runs").glob("recipe-best-*"))
    value = json.loads((run / "summary.json").read_text())["epochs"][-1]["val_loss"]
    assert abs(value - float(best["val_loss"])) < 0.01, (value, best)


@pytest.mark.slow
def test_the_trial_command_is_pinned_to_its_slot_and_linked_to_its_study(finished, monkeypatch):
    from tfgpu.experiments.placement import Slot
    from tfgpu.tracking.study import TRIAL_ENV
    from tfgpu.experiments.sweep import Sweep, set_item

    _, directory, *_ = finished
    record = json.loads((directory / "sweep.json").read_text())
    cfg = load_config(record["recipe"])
    gpu = Slot(0, "GPU 3", {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
               ("devices.memory_fraction=0.5",))
    sweep = Sweep(cfg, record["recipe"], [], directory, record["storage"], record["study"], [gpu], 4)
    frozen = sweep.study.trials[2]
    cmd, env = sweep.command(frozen, gpu)
    assert cmd[5:7] == ["run", record["recipe"]] and cmd[-2:] == ["--resume", str((directory / "trials/trial-0002").resolve())]
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    assert sets[-2:] == ["sweep=null", "devices.memory_fraction=0.5"]
    assert set_item("model.optimizer.learning_rate", frozen.params["model.optimizer.learning_rate"]) in sets
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and json.loads(env[TRIAL_ENV])["number"] == 2


@pytest.mark.slow
def test_pruning_stops_a_hopeless_trial(tmp_path):
    """The median pruner stops the trial with a hopeless learning rate after its warm-up, and the sweep says so.
    Trains its own runs: the sweep's trials are the subject."""
    good, hopeless = 0.01, 1.0e-6
    recipe = sweep_recipe(tmp_path, epochs=12, trials=2, sampler="random", metric="val_loss",
                          parameters={"model.optimizer.learning_rate": {"log_uniform": [1.0e-7, 0.1]},
                                      "train.batch_size_per_replica": {"choice": [16, 32, 64]}},
                          pruner={"median": {"n_startup_trials": 1, "n_warmup_steps": 1}},
                          enqueue=[{"model.optimizer.learning_rate": good, "train.batch_size_per_replica": 32},
                                   {"model.optimizer.learning_rate": hopeless, "train.batch_size_per_replica": 32}])
    result = run_cli("sweep", str(recipe), "--output-dir", str(tmp_path / "runs"), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    directory = sweep_dir(tmp_path / "runs")
    rows = {r["trial"]: r for r in csv.DictReader((directory / "results.csv").open())}
    assert rows["0"]["status"] == "completed" and rows["1"]["status"] == "pruned"
    assert float(rows["1"]["model.optimizer.learning_rate"]) == hopeless
    pruned = json.loads((directory / "trials/trial-0001/summary.json").read_text())
    assert pruned["status"] == "completed" and pruned["epochs_completed"] == 2  # pruned after epoch 2 (warm-up 1)
    assert "trial 1 pruned after epoch 2" in result.stdout
    assert "sweep: trial 1 pruned after epoch 2" in (directory / "trials/trial-0001.log").read_text()


def _sweep_until(args: list[str], cwd: Path, trial: int, epochs: int) -> subprocess.Popen:
    """``tfgpu sweep ARGS``, returned once trial ``trial`` has logged ``epochs`` more epochs than it had."""
    def logged() -> int:
        found = list((cwd / "runs").glob(f"*-sweep-*/trials/trial-{trial:04d}/metrics.csv"))
        return len(found[0].read_text().splitlines()) - 1 if found else 0

    before = logged()
    sweep = subprocess.Popen([sys.executable, "-m", "tfgpu.cli", "sweep", *args], cwd=cwd, env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while logged() < before + epochs:
        if time.time() > deadline or sweep.poll() is not None:
            sweep.kill()
            pytest.fail("".join(sweep.communicate()))
        time.sleep(0.1)
    return sweep


def _status_when_stopped(run_dir: Path) -> dict:
    deadline = time.time() + 60
    while json.loads((run_dir / "summary.json").read_text())["status"] == "running" and time.time() < deadline:
        time.sleep(0.2)
    return json.loads((run_dir / "summary.json").read_text())


def _sessions(recipe: Path, directory: Path, totals: Sequence[int], storage: Optional[Path] = None,
              shared: bool = False) -> tuple[list[dict], list[Optional[int]]]:
    """The points a sweep and its resumptions draw, without a trial: one :class:`Sweep` per session (as ``tfgpu
    sweep``, then ``--resume``, opens the study in ``directory``, or on ``storage`` shared with other sweeps), each
    asking trials until the study has ``totals[i]`` and telling each a value at once (its learning rate's distance
    from 3e-3, for TPE to learn from). Returns each trial's parameters, in order, and each session's seed."""
    from tfgpu.experiments.sweep import Sweep

    directory.mkdir(parents=True, exist_ok=True)
    spec = str((storage or directory / "study.journal").resolve())
    params, seeds = [], []
    for total in totals:
        sweep = Sweep(load_config(recipe, [f"sweep.trials={total}"]), str(recipe), [], directory, spec, "study", [],
                      total, shared)
        seeds.append(sweep.seed)
        while (found := sweep.next_trial()) is not None:
            frozen, resumed, lock = found
            lock.close()
            assert not resumed
            params.append(frozen.params)
            sweep.study.tell(frozen.number, abs(math.log(frozen.params["model.optimizer.learning_rate"] / 3e-3)))
    return params, seeds


def _points(params: list[dict]) -> set:
    return {tuple(sorted(p.items())) for p in params}


def test_a_resumed_sweep_draws_new_points_and_the_same_ones_each_time(tmp_path):
    """A resumed seeded sweep's sampler gets sweep.seed moved on by the trials the study holds (issue 34, item 4):
    2 trials, then resumed to 4, draw 4 different points (the shipped TPE's startup trials and random; before, the
    resumed sampler began its sequence again and trial 2 was trial 0), the same 4 each time, and a new sweep's
    first points are as before. A grid keeps sweep.seed, so neither its resumed sessions nor two sweeps sharing
    its study draw a point twice. No trial runs: each session asks and tells the study as the sweep does."""
    for name, change in [("tpe", {}), ("random", {"sampler": "random"})]:  # tpe: the shipped n_startup_trials 4
        recipe = sweep_recipe(tmp_path, f"{name}.yaml", **change)
        first, seeds = _sessions(recipe, tmp_path / name / "a", [2, 4])
        assert len(_points(first)) == 4, (name, first)
        assert seeds == [0, 2]  # sweep.seed, then sweep.seed + the 2 trials the study held
        assert _sessions(recipe, tmp_path / name / "b", [2, 4]) == (first, seeds)  # deterministic
        assert _sessions(recipe, tmp_path / name / "c", [4])[0][:2] == first[:2]  # a new study: sweep.seed itself

    grid = sweep_recipe(tmp_path, "grid.yaml", sampler="grid", parameters={
        "model.optimizer.learning_rate": {"choice": [1.0e-3, 3.0e-3, 1.0e-2]},
        "train.batch_size_per_replica": {"choice": [16, 32]}})
    points, seeds = _sessions(grid, tmp_path / "grid", [2, 4, 6])
    assert len(_points(points)) == 6 and seeds == [0, 0, 0]
    storage = tmp_path / "shared.journal"
    one, seeds_one = _sessions(grid, tmp_path / "machine0", [3], storage, shared=True)
    two, seeds_two = _sessions(grid, tmp_path / "machine1", [6], storage, shared=True)
    assert len(one) == len(two) == 3 and len(_points(one + two)) == 6 and seeds_one == seeds_two == [0]


@pytest.mark.slow
def test_a_sweep_stopped_then_killed_mid_trial_resumes_keeping_finished_trials(tmp_path):
    """A sweep stopped by SIGTERM, then SIGKILLed, mid-trial resumes that trial from its checkpoint and keeps the
    finished one; resumed to 3 trials, its sampler draws a new point, the one a replay of its sessions draws.
    Trains its own runs: it stops and kills the sweep mid-trial, which a shared run must not suffer."""
    recipe = sweep_recipe(tmp_path, epochs=40, trials=2, sampler="random", pruner="none")
    sweep = _sweep_until([str(recipe), "--output-dir", "runs"], tmp_path, trial=1, epochs=3)
    sweep.send_signal(signal.SIGTERM)  # the sweep stops its trial with SIGTERM: a checkpoint, exit 75
    out, err = sweep.communicate(timeout=120)
    directory = sweep_dir(tmp_path / "runs")
    assert sweep.returncode == 75, out + err
    one_paragraph(err)
    assert json.loads((directory / "sweep.json").read_text())["status"] == "interrupted"
    assert f"tfgpu sweep --resume {directory.relative_to(tmp_path)}" in err
    trial1 = directory / "trials/trial-0001"
    stopped = json.loads((trial1 / "summary.json").read_text())
    assert stopped["status"] == "preempted" and 3 <= stopped["epochs_completed"] < 40
    rows = {r["trial"]: r["status"] for r in csv.DictReader((directory / "results.csv").open())}
    assert rows == {"0": "completed", "1": "running"}
    first = (directory / "trials/trial-0000/summary.json").read_text()

    sweep = _sweep_until(["--resume", str(directory)], tmp_path, trial=1, epochs=3)
    sweep.kill()  # SIGKILL: the kernel sends the trial SIGTERM (PR_SET_PDEATHSIG), and it saves a checkpoint
    out, _ = sweep.communicate()
    assert "trial 1 continues on slot 0" in out
    killed = _status_when_stopped(trial1)
    assert killed["status"] == "preempted" and killed["epochs_completed"] >= stopped["epochs_completed"] + 3
    assert {t.number: t.state.name for t in study_of(directory).trials} == {0: "COMPLETE", 1: "RUNNING"}

    resumed = run_cli("sweep", "--resume", str(directory), "--trials", "3", cwd=tmp_path, timeout=400)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "trial 1 continues on slot 0" in resumed.stdout and "trial 0 " not in resumed.stdout
    assert (directory / "trials/trial-0000/summary.json").read_text() == first  # the finished trial was kept
    summary = json.loads((trial1 / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs_completed"] == 40
    assert len(summary["restarts"]) == 2  # continued from its checkpoint twice, never started again
    epochs = [int(r["epoch"]) for r in csv.DictReader((trial1 / "metrics.csv").open())]
    assert epochs == list(range(40))
    trials = sorted(study_of(directory).trials, key=lambda t: t.number)
    assert {t.number: t.state.name for t in trials} == {0: "COMPLETE", 1: "COMPLETE", 2: "COMPLETE"}
    assert {r["status"] for r in csv.DictReader((directory / "results.csv").open())} == {"completed"}
    # seed 0 again would have drawn trial 2 as trial 0; seed 0 + the study's 2 trials draws a new point
    params = [t.params for t in trials]
    assert len(_points(params)) == 3, params
    record = json.loads((directory / "sweep.json").read_text())
    assert record["status"] == "completed" and record["sampler_seed"] == 2
    assert _sessions(recipe, tmp_path / "replay", [2, 3])[0] == params  # the same sessions draw the same points


@pytest.mark.slow
def test_a_sweep_interrupted_before_any_trial_finished_is_interrupted_and_resumes(tmp_path):
    """Ctrl-C during the first trial: sweep.json says interrupted, not failed (issue 34, item 14), the exit is
    130, and --resume continues the trial to the end. Trains its own run: it interrupts the sweep mid-trial."""
    recipe = sweep_recipe(tmp_path, epochs=30, trials=1, sampler="random", pruner="none")
    sweep = _sweep_until([str(recipe), "--output-dir", "runs"], tmp_path, trial=0, epochs=1)
    sweep.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C: the sweep stops its trial with SIGTERM
    out, err = sweep.communicate(timeout=120)
    directory = sweep_dir(tmp_path / "runs")
    assert sweep.returncode == 130, out + err
    one_paragraph(err)
    assert "interrupted (Ctrl-C)" in err and f"tfgpu sweep --resume {directory.relative_to(tmp_path)}" in err
    assert json.loads((directory / "sweep.json").read_text())["status"] == "interrupted"
    stopped = json.loads((directory / "trials/trial-0000/summary.json").read_text())
    assert stopped["status"] == "preempted" and 1 <= stopped["epochs_completed"] < 30  # no trial finished
    assert [t.state.name for t in study_of(directory).trials] == ["RUNNING"]

    resumed = run_cli("sweep", "--resume", str(directory), cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "trial 0 continues on slot 0" in resumed.stdout
    assert json.loads((directory / "sweep.json").read_text())["status"] == "completed"
    assert json.loads((directory / "trials/trial-0000/summary.json").read_text())["epochs_completed"] == 30


@pytest.mark.slow
def test_two_sweep_processes_on_one_storage_share_the_trials_without_duplicates(tmp_path):
    """Two sweep processes on one journal storage run each of the study's 5 trials once, both doing some.
    Trains its own runs: the two sweeps' trials are the subject."""
    recipe = sweep_recipe(tmp_path, epochs=3, trials=5, sampler="random")
    storage = tmp_path / "shared.journal"
    procs = [subprocess.Popen([sys.executable, "-m", "tfgpu.cli", "sweep", str(recipe), "--storage", str(storage),
                               "--study", "shared", "--output-dir", f"machine{i}"], cwd=tmp_path, env=child_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    study = optuna.load_study(study_name="shared", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(storage))))
    assert sorted(t.number for t in study.trials) == [0, 1, 2, 3, 4]
    assert {t.state.name for t in study.trials} == {"COMPLETE"}
    ran = [sorted(int(p.name.split("-")[1]) for p in sweep_dir(tmp_path / f"machine{i}").glob("trials/trial-*")
                  if p.is_dir()) for i in range(2)]
    assert sorted(ran[0] + ran[1]) == [0, 1, 2, 3, 4] and ran[0] and ran[1], ran  # each trial once, both worked
    for trial in study.trials:  # each trial ran once, in the sweep directory of the process that asked it
        run_dir = (tmp_path / trial.user_attrs["run_dir"]).resolve()
        assert run_dir.parent.parent == Path(trial.user_attrs["sweep_dir"]) and run_dir.parent.parent.parent.name in (
            "machine0", "machine1")
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
        assert (run_dir.parent / f"trial-{trial.number:04d}.log").read_text().count("# attempt") == 1


# ------------------------------------------------------------------ parameter values and --sweep FILE


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(), st.booleans(), st.none(),
                 st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=20)))
def test_every_parameter_value_reaches_the_trial_as_the_sampler_chose_it(value):
    from tfgpu.config.source import parse_override
    from tfgpu.experiments.sweep import set_item

    path, back = parse_override(set_item("train.some_key", value))
    assert path == ("train", "some_key")
    assert back == value and type(back) is type(value)


def test_the_sweep_section_can_come_from_its_own_file(tmp_path):
    from tfgpu.experiments.sweep import prepare

    data = yaml.safe_load(SWEEP.read_text())
    (tmp_path / "only.yaml").write_text(yaml.safe_dump({"sweep": {**data["sweep"], "trials": 3}}))
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump(data["sweep"]))
    recipe = str(RECIPES / "breast_cancer.yaml")
    assert prepare(recipe, [], str(tmp_path / "only.yaml"), None).sweep.trials == 3
    assert prepare(recipe, ["sweep.trials=5"], str(tmp_path / "bare.yaml"), None).sweep.trials == 5  # --set wins
    cfg = prepare(recipe, ["sweep.trials=5"], str(tmp_path / "bare.yaml"), 6)
    assert cfg.sweep.trials == 6 and cfg.sweep.metric == "val_loss"  # and --trials over both
    assert set(cfg.sweep.parameters) == {"model.optimizer.learning_rate", "train.batch_size_per_replica"}


def test_a_grid_sweep_tells_every_point_without_stopping_the_study():
    """Optuna's GridSampler stops the study (Study.stop) after its last point, which raises outside
    Study.optimize; the sweep asks and tells, and its grid sampler does not stop it."""
    from tfgpu.tracking.study import distributions, grid_size, sampler

    cfg = load_config(SWEEP, ["sweep.sampler=grid", "sweep.parameters={train.batch_size_per_replica: "
                              "{choice: [16, 32]}, model.optimizer.learning_rate: {choice: [0.01, 0.001]}}"])
    study = optuna.create_study(sampler=sampler(cfg))
    seen = set()
    for _ in range(grid_size(cfg)):
        trial = study.ask(distributions(cfg))
        seen.add(tuple(sorted(trial.params.items())))
        study.tell(trial, 0.5)
    assert grid_size(cfg) == 4 and len(seen) == 4 and len(study.trials) == 4


def test_a_trials_error_is_quoted_whole_from_its_log(tmp_path):
    from tfgpu.experiments.sweep import _error_of

    log = tmp_path / "trial-0000.log"
    log.write_text("# attempt 1: tfgpu run r.yaml\nEpoch 1/2 - loss: 0.3\ntfgpu: configuration error: invalid "
                   "configuration:\n  - --set train.epochs=3.5: 'train.epochs': Input should be a valid integer.\n"
                   "Fix: correct the keys above.\n")
    assert _error_of(log) == ("configuration error: invalid configuration: - --set train.epochs=3.5: 'train.epochs': "
                              "Input should be a valid integer. Fix: correct the keys above.")
