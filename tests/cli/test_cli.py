"""The command line as a user meets it: exit codes, messages, no tracebacks, no lost work."""

from __future__ import annotations

import json

import pytest

from ..conftest import run_cli

RECIPE = "recipes/mnist.yaml"


def test_help_lists_the_commands():
    result = run_cli("--help")
    assert result.returncode == 0
    assert "run" in result.stdout and "plan" in result.stdout and "Exit codes" in result.stdout


def test_plan_shows_strategy_replicas_and_global_batch():
    result = run_cli("plan", RECIPE, "--set", "devices.cpu_logical_devices=2")
    assert result.returncode == 0, result.stderr
    assert "Strategy: mirrored on /cpu:0, /cpu:1, cross-device ops reduce_to_one_device" in result.stdout
    assert "Replicas: 2; batch: 4096 per replica x 2 = 8192 global" in result.stdout
    assert "tf.config.set_logical_device_configuration(<CPU:0>" in result.stdout
    data = json.loads(run_cli("plan", RECIPE, "--json").stdout)
    assert data["plan"]["global_batch_size"] == 4096 and data["config"]["train"]["epochs"] == 10


def test_config_error_exit_code_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochs: 0\n")
    result = run_cli("run", str(bad), "--output-dir", str(tmp_path / "runs"))
    assert result.returncode == 3
    assert "tfgpu: configuration error" in result.stderr and "bad.yaml:2" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()
    debug = run_cli("run", str(bad), "--debug")
    assert debug.returncode == 3 and "Traceback" in debug.stderr


def test_unknown_key_on_the_command_line():
    result = run_cli("plan", RECIPE, "--set", "train.epoch=3")
    assert result.returncode == 3
    assert "--set train.epoch=3: unknown key 'train.epoch'. Did you mean 'train.epochs'?" in result.stderr


def test_impossible_gpu_request_is_a_device_error():
    result = run_cli("plan", RECIPE, "--set", "devices.visible_gpus=[3]")
    assert result.returncode == 4
    assert "GPU index 3 was requested" in result.stderr and "Traceback" not in result.stderr


def test_missing_data_is_a_data_error_and_writes_nothing(tmp_path):
    result = run_cli("run", RECIPE, "--set", f"data.path={tmp_path / 'nowhere'}", "--output-dir", str(tmp_path / "r"))
    assert result.returncode == 5
    assert "data.path" in result.stderr and "does not exist" in result.stderr
    assert not (tmp_path / "r").exists()


def test_unknown_layer_is_a_config_error_with_a_suggestion(tmp_path):
    result = run_cli("run", RECIPE, "--set", "model.layers=[Conv2d, Flatten, {Dense: {units: 10}}]",
                     "--output-dir", str(tmp_path))
    assert result.returncode == 3
    assert "model.layers[0]: 'Conv2d' is not a Keras layer. Did you mean 'Conv2D'?" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_model_that_does_not_fit_the_classes(tmp_path):
    result = run_cli("run", RECIPE, "--set", "model.layers=[Flatten, {Dense: {units: 5}}]", "--output-dir", str(tmp_path))
    assert result.returncode == 3
    assert "outputs 5 values per sample" in result.stderr and "10 classes" in result.stderr


@pytest.mark.slow
def test_builder_that_returns_no_model(tmp_path):
    result = run_cli("run", RECIPE, "--set", "model.builder=tests.builders:not_a_model", "--set", "model.layers=null",
                     "--output-dir", str(tmp_path))
    assert result.returncode == 3
    assert "returned str, not a keras.Model" in result.stderr


def test_unwritable_output_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run_cli("run", RECIPE, "--set", "train.epochs=1", "--output-dir", str(blocker / "runs"))
    assert result.returncode == 8
    assert "cannot create a run directory" in result.stderr


def test_recipe_without_a_model_is_a_config_error(tmp_path):
    result = run_cli("run", RECIPE, "--set", "model.layers=null", "--output-dir", str(tmp_path))
    assert result.returncode == 3
    assert "defines no model" in result.stderr and list(tmp_path.iterdir()) == []
