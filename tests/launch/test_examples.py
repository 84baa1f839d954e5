"""The shipped examples: recipes/gpu.yaml with recipes/scripts/train.py under tfgpu launch, and the hint a
missing examples/ folder gives (recipes/make_examples.py writes it)."""

from __future__ import annotations

import re
import shutil

import pytest

from ..conftest import ROOT, one_paragraph, run_cli

ACCURACY = re.compile(r"^test accuracy: (\d\.\d+) \(10000 test images\)$", re.MULTILINE)


def test_gpu_yaml_is_device_settings_only_and_plans_on_a_cpu():
    result = run_cli("plan", "recipes/gpu.yaml", "--launch")
    assert result.returncode == 0, result.stderr
    assert "keras.utils.set_random_seed(42)" in result.stdout and "Replicas: 1; batch: 128 per replica" in result.stdout


@pytest.mark.slow
def test_train_py_under_launch_trains_one_epoch_to_a_real_accuracy():
    """recipes/scripts/train.py under ``tfgpu launch`` trains one epoch of MNIST to a test accuracy above 0.9.
    Trains its own run: the shipped script under tfgpu launch is the subject, not a tfgpu run."""
    result = run_cli("launch", "recipes/gpu.yaml", "--", "recipes/scripts/train.py", "--epochs", "1", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 replica(s), global batch 128, 1 epoch(s) of 177 steps" in result.stdout  # 22,699 // 128
    assert float(ACCURACY.search(result.stdout).group(1)) > 0.9


@pytest.mark.slow
def test_train_py_on_two_launched_workers_uses_multi_worker_mirrored_strategy(tmp_path):
    """train.py on two launched workers trains one model with MultiWorkerMirroredStrategy: both report the same
    accuracy. Trains its own run: the shipped script on two launched workers is the subject, not a tfgpu run."""
    result = run_cli("launch", "recipes/gpu.yaml", "--workers", "2", "--log-dir", str(tmp_path), "--",
                     "recipes/scripts/train.py", "--steps", "50", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in (0, 1)]
    for i, log in enumerate(logs):
        assert f"MultiWorkerMirroredStrategy: 2 replica(s) (worker {i}), global batch 256, 1 epoch(s) of 50 steps" in log
    accuracies = [ACCURACY.search(log).group(1) for log in logs]
    assert accuracies[0] == accuracies[1] and float(accuracies[0]) > 0.8  # the workers trained one model together


@pytest.mark.parametrize(("recipe", "key"), [("mnist_images", "data.path: 'examples/mnist_png/train'"),
                                             ("mnist_tfrecord", "examples/mnist_tfrecord/train-*.tfrecord"),
                                             ("tumour_area", "data.path: 'examples/breast_cancer_area.npz'"),
                                             ("mnist_tfds", "not prepared in examples/tensorflow_datasets")])
def test_a_missing_examples_folder_names_the_script_that_writes_it(tmp_path, recipe, key):
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")  # a checkout where make_examples.py has not run
    result = run_cli("plan", f"recipes/{recipe}.yaml", cwd=tmp_path)
    assert result.returncode == 5, result.stderr
    one_paragraph(result.stderr)
    assert key in result.stderr
    assert "written by 'python recipes/make_examples.py'" in result.stderr.split("Fix:")[1]


def test_a_missing_path_elsewhere_gets_no_examples_hint(tmp_path):
    result = run_cli("plan", str(ROOT / "recipes" / "mnist_images.yaml"), "--set", "data.path=photos/train", "--set",
                     "data.test_path=null", cwd=tmp_path)
    assert result.returncode == 5, result.stderr
    assert "data.path: 'photos/train' does not exist" in result.stderr and "make_examples" not in result.stderr
