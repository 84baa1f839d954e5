"""``tfgpu bench input``: the pipeline alone against the model's step on a staged batch, and the verdict."""

from __future__ import annotations

import json

import pytest

from tfgpu.training.input_bench import verdict

from ..conftest import run_cli


def test_the_verdict_predicts_the_share_of_time_input_takes():
    # with GPUs the pipeline runs beside the step: training waits when the pipeline is slower
    name, message, share, expected = verdict(6_000.0, 10_000.0, gpus=1)
    assert (name, share, expected) == ("input-bound", pytest.approx(40.0), 6_000.0)
    assert message.startswith("input-bound: input would take about 40 % of the training time")
    assert verdict(12_000.0, 10_000.0, gpus=2)[::2] == ("compute-bound", 0.0)
    assert verdict(12_000.0, 10_000.0, gpus=2)[3] == 10_000.0
    # on CPUs both share the cores: the times add up (the augmenting image folder: 41 % predicted, 43 % measured)
    name, message, share, expected = verdict(25_567.0, 17_744.0, gpus=0)
    assert name == "input-bound" and share == pytest.approx(41.0, abs=0.1)
    assert expected == pytest.approx(10_475, abs=1) and "share the CPU cores" in message
    name, _, share, _ = verdict(417_965.0, 25_000.0, gpus=0)  # the seed recipe, in memory
    assert name == "compute-bound" and share == pytest.approx(5.6, abs=0.1)


@pytest.mark.slow
def test_the_seed_recipe_is_compute_bound():
    """MNIST in memory: the pipeline only gathers rows, many times faster than the CNN's step."""
    result = run_cli("bench", "input", "recipes/mnist.yaml", "--set", "devices.cpu_logical_devices=2",
                     "--set", "train.batch_size_per_replica=128", "--steps", "20", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert (data["loop"], data["global_batch"], data["replicas"], data["steps"]) == ("fit", 256, 2, 20)
    assert data["pipeline_steady"] > 5 * data["step"] > 0
    assert data["verdict"] == "compute-bound" and data["fix"] == "" and data["input_percent"] < 10


@pytest.mark.slow
def test_an_augmenting_image_folder_read_from_disk_is_input_bound_and_named_its_fix(small_png):
    """PNGs decoded every epoch (data.cache: false) and augmented, on the CPU cores the step needs too."""
    result = run_cli("bench", "input", "recipes/mnist_images.yaml", "--set", f"data.path={small_png / 'train'}",
                     "--set", "data.test_path=null", "--set", "data.cache=false",
                     "--set", "data.augment=[{RandomRotation: {factor: 0.05}}, {RandomZoom: {height_factor: 0.1}}]",
                     "--set", "train.batch_size_per_replica=64", "--steps", "10")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "pipeline alone, second pass" in out and "model step on a staged batch (fit)" in out
    assert "verdict: input-bound: input would take about" in out, out
    assert "to feed it faster: data.cache: true (decode once); data.augment_on: model" in out
