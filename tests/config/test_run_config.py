"""A run's saved configuration: `config.yaml` (as given) replays as the recipe did, `config.resolved.yaml` holds
every value, and `tfgpu run --resume` reads run directories written before and after the split.

The fast tests plan for faked machines (no TensorFlow); the last one runs a real one-epoch run and replays it.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tfgpu.config import load_config
from tfgpu.devices.plan import make_plan
from tfgpu.devices.probe import GpuInfo, Probe
from tfgpu.training.layout import CONFIG_FILE, RESOLVED_CONFIG_FILE, write_config
from tfgpu.training.resume import load_resumed

from ..conftest import RECIPES, only_run_dir, run_cli

SEED = str(RECIPES / "mnist.yaml")

#: Machines whose environment makes "set" and "left at its default" plan differently.
CPU_WITH_LOG_LEVEL = Probe(env={"TF_CPP_MIN_LOG_LEVEL": "1"})
TWO_GPUS = Probe(gpus=tuple(GpuInfo(i, f"Fake GPU {i}", 16384, f"GPU-{i:04d}", i) for i in range(2)),
                 env={"TF_CPP_MIN_LOG_LEVEL": "3"})

RECIPES_TO_REPLAY = [
    pytest.param(SEED, [], id="seed"),
    pytest.param(SEED, ["devices.log_device_placement=true"], id="placement-logging"),
    pytest.param(SEED, ["tensorflow.log_level=2"], id="explicit-default-log-level"),
    pytest.param(SEED, ["devices.memory_growth=null", "train.epochs=1"], id="explicit-null-growth"),
    pytest.param(str(RECIPES / "mnist_custom.yaml"), ["devices.cpu_logical_devices=2"], id="custom-two-cpus"),
]


def _saved(tmp_path, recipe, overrides):
    cfg = load_config(recipe, overrides=overrides)
    write_config(tmp_path, cfg)
    return cfg


def _plan(cfg, machine):
    p = make_plan(cfg, machine)
    return p.env, (*p.warnings, *p.notes), [str(c) for c in p.tf_calls]  # (notes: settings with nothing to apply to)


@pytest.mark.parametrize("machine", [CPU_WITH_LOG_LEVEL, TWO_GPUS], ids=["cpu", "two-gpus"])
@pytest.mark.parametrize("recipe, overrides", RECIPES_TO_REPLAY)
def test_replaying_the_saved_config_plans_as_the_recipe_did(tmp_path, recipe, overrides, machine):
    """`tfgpu run RUN_DIR/config.yaml` gets the first run's environment, warnings and calls."""
    cfg = _saved(tmp_path, recipe, overrides)
    replay = load_config(tmp_path / CONFIG_FILE)
    assert replay == cfg and replay.explicit_dict() == cfg.explicit_dict()
    assert _plan(replay, machine) == _plan(cfg, machine)
    assert load_config(tmp_path / RESOLVED_CONFIG_FILE) == cfg  # every value, the same config


def test_what_a_replay_of_every_value_would_have_changed(tmp_path):
    """Why config.yaml holds only the given keys: replaying every value (config.resolved.yaml, or config.yaml as
    it was) sets TF_CPP_MIN_LOG_LEVEL over the user's own and notes memory keys the recipe never set."""
    cfg = _saved(tmp_path, SEED, [])
    env, warnings, _ = _plan(load_config(tmp_path / CONFIG_FILE), CPU_WITH_LOG_LEVEL)
    assert "TF_CPP_MIN_LOG_LEVEL" not in env
    assert "devices.memory_growth" in " ".join(warnings) and "memory_limit_mib" not in " ".join(warnings)
    env, warnings, _ = _plan(load_config(tmp_path / RESOLVED_CONFIG_FILE), CPU_WITH_LOG_LEVEL)
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert "devices.memory_limit_mib" in " ".join(warnings)
    assert cfg.tensorflow.log_level == 2


def test_config_yaml_holds_the_keys_given_and_the_resolved_file_every_value(tmp_path):
    _saved(tmp_path, SEED, ["train.epochs=1", "output.dir=elsewhere", "tensorflow.log_level=2"])
    given = yaml.safe_load((tmp_path / CONFIG_FILE).read_text())
    assert given["train"] == {"loop": "fit", "epochs": 1, "batch_size_per_replica": 4096, "lr_scaling": "linear"}
    assert given["output"] == {"dir": "elsewhere"} and given["tensorflow"] == {"seed": 42, "log_level": 2}
    assert "soft_placement" not in given["devices"] and "checkpoint" not in given["train"]
    resolved = yaml.safe_load((tmp_path / RESOLVED_CONFIG_FILE).read_text())
    assert resolved["devices"]["soft_placement"] is True and resolved["train"]["checkpoint"]["every_epochs"] == 1
    assert resolved["train"]["epochs"] == 1 and resolved["output"]["dir"] == "elsewhere"
    assert (tmp_path / CONFIG_FILE).read_text().startswith("# The settings this run was given")


def test_defaults_only_save_an_empty_mapping_that_loads(tmp_path):
    _saved(tmp_path, {}, [])
    assert yaml.safe_load((tmp_path / CONFIG_FILE).read_text()) == {}
    assert load_config(tmp_path / CONFIG_FILE) == load_config({})


@pytest.mark.parametrize("machine", [CPU_WITH_LOG_LEVEL, TWO_GPUS], ids=["cpu", "two-gpus"])
def test_resume_of_a_new_run_directory_plans_as_the_first_run(tmp_path, machine):
    """A key the recipe set to its default value (log_level 2) stays set on resume, as in the first run."""
    cfg = _saved(tmp_path, SEED, ["tensorflow.log_level=2", "devices.log_device_placement=true"])
    resumed, summary = load_resumed(tmp_path, None, ["train.progress=none"])
    assert summary == {} and resumed.train.progress == "none"
    assert resumed.explicit_dict() == {**cfg.explicit_dict(),
                                       "train": {**cfg.explicit_dict()["train"], "progress": "none"}}
    assert _plan(resumed, machine) == _plan(cfg, machine)
    # the recipe itself may be given again: the same config
    again, _ = load_resumed(tmp_path, SEED, ["tensorflow.log_level=2", "devices.log_device_placement=true"])
    assert again == cfg


@pytest.mark.parametrize("machine", [CPU_WITH_LOG_LEVEL, TWO_GPUS], ids=["cpu", "two-gpus"])
def test_resume_of_an_old_run_directory_reads_its_non_defaults_as_given(tmp_path, machine):
    """Run directories written before config.resolved.yaml hold every value in config.yaml; resume still plans
    them as the recipe did (the keys at their defaults are read as unset)."""
    cfg = load_config(SEED, overrides=["devices.cpu_logical_devices=2"])
    (tmp_path / CONFIG_FILE).write_text(cfg.to_yaml())  # what tfgpu wrote until now
    resumed, _ = load_resumed(tmp_path, None, [])
    assert resumed == cfg and _plan(resumed, machine) == _plan(cfg, machine)
    assert load_resumed(tmp_path, str(tmp_path / CONFIG_FILE), [])[0] == cfg


def test_resume_compares_with_the_values_the_checkpoint_was_trained_with(tmp_path):
    """A setting that differs from config.resolved.yaml is refused, naming both values, even where the run's
    config.yaml (as given) does not list it."""
    _saved(tmp_path, SEED, [])
    result = run_cli("run", "--resume", str(tmp_path), "--set", "train.checkpoint.every_steps=5",
                     "--set", "data.shuffle_buffer=100", "--set", "train.batch_size_per_replica=128", timeout=120)
    assert result.returncode == 3, result.stderr
    assert "data.shuffle_buffer: None in the run, 100 now" in result.stderr
    assert "train.batch_size_per_replica: 4096 in the run, 128 now" in result.stderr
    assert "every_steps" not in result.stderr.split("Fix:")[0]  # train.checkpoint may change
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_real_run_replays_with_the_same_plan(tmp_path):
    """`tfgpu run`, then `tfgpu plan RUN_DIR/config.yaml`: the same environment and warnings as the run's plan.json
    (here: the user's TF_CPP_MIN_LOG_LEVEL is kept, and no warning about memory keys the recipe never set).
    Trains its own run: it trains under the user's TF_CPP_MIN_LOG_LEVEL, which no shared run sets."""
    env = {"TF_CPP_MIN_LOG_LEVEL": "1"}
    result = run_cli("run", SEED, "--set", "train.epochs=1", "--set", "train.batch_size_per_replica=2048",
                     "--set", "output.save_model=false", "--output-dir", str(tmp_path / "runs"), **env)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    assert {CONFIG_FILE, RESOLVED_CONFIG_FILE, "plan.json", "summary.json", "metrics.csv"} <= {
        p.name for p in run_dir.iterdir()}
    ran = json.loads((run_dir / "plan.json").read_text())
    assert "TF_CPP_MIN_LOG_LEVEL" not in ran["env"]
    replay = run_cli("plan", str(run_dir / CONFIG_FILE), "--json", timeout=120, **env)
    assert replay.returncode == 0, replay.stderr
    planned = json.loads(replay.stdout)["plan"]
    assert (planned["env"], planned["warnings"], planned["tf_calls"]) == (ran["env"], ran["warnings"], ran["tf_calls"])
    assert json.loads(replay.stdout)["config"] == yaml.safe_load((run_dir / RESOLVED_CONFIG_FILE).read_text())
