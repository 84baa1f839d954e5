"""train.class_weight: the weights computed, bad input, and real training on breast_cancer with both loops."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest

from tfgpu.data import weights
from tfgpu.errors import ConfigError

from ..conftest import data_dir, one_paragraph, only_run_dir, recipe_with, run_cli


def breast_cancer_labels() -> np.ndarray:
    with (data_dir() / "breast_cancer" / "breast_cancer.csv").open() as f:
        return np.array([int(float(row["target"])) for row in csv.DictReader(f)])


def recipe(tmp_path, name="breast_cancer.yaml", **train):
    return recipe_with(tmp_path, name, "train", **train)


def test_balanced_weights_on_breast_cancer_are_sklearns():
    y = breast_cancer_labels()
    assert np.bincount(y).tolist() == [212, 357]  # malignant, benign
    w = weights.resolve("balanced", y, "classification", 2, None)
    assert w == pytest.approx([569 / (2 * 212), 569 / (2 * 357)])  # n_samples / (n_classes * count_c)
    assert w == pytest.approx([1.341981, 0.796919], abs=1e-6)
    assert float((w[y]).sum()) == pytest.approx(569)  # balanced weights keep the total weight


def test_weights_by_class_name_or_index_and_unknown_classes():
    y = np.array([0, 1, 2, 2])
    named = weights.resolve({"dog": 3.0, 0: 0.5}, y, "classification", 3, ("cat", "dog", "fish"))
    assert named.tolist() == [0.5, 3.0, 1.0]
    assert weights.describe(named, ("cat", "dog", "fish")) == {"cat": 0.5, "dog": 3.0, "fish": 1.0}
    with pytest.raises(ConfigError, match=r"'cow' is not a class of the data; the classes are 0: cat, 1: dog, 2: fish"):
        weights.resolve({"cow": 2.0}, y, "classification", 3, ("cat", "dog", "fish"))
    with pytest.raises(ConfigError, match=r"3 is not a class of the data; the classes are 0 to 2"):
        weights.resolve({3: 2.0}, y, "classification", 3, None)
    with pytest.raises(ConfigError, match="regression task"):
        weights.resolve("balanced", y.astype(float), "regression", None, None)


@pytest.mark.parametrize("value", ["balance", {"0": -1}, {}])
def test_bad_setting_is_refused_before_tensorflow_with_its_line(tmp_path, value):
    path = recipe(tmp_path, class_weight=value)
    result = run_cli("plan", str(path))
    assert result.returncode == 3, result.stderr
    assert re.search(rf"{re.escape(str(path))}:\d+: 'train.class_weight'", result.stderr), result.stderr
    one_paragraph(result.stderr.split("Fix:")[0])


def test_jax_backend_refuses_class_weight(tmp_path):
    result = run_cli("plan", str(recipe(tmp_path, class_weight="balanced")), "--set", "backend=jax")
    assert result.returncode == 3 and "train.class_weight" in result.stderr and "backend: tensorflow" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("setting,expected", [({5: 2.0}, "5 is not a class of the data; the classes are 0 to 1"),
                                              ("balanced", "regression task")])
def test_unknown_class_or_regression_fails_before_anything_is_written(tmp_path, setting, expected):
    path = recipe(tmp_path, class_weight=setting)
    args = ["run", str(path), "--set", "train.epochs=1", "--output-dir", str(tmp_path / "runs")]
    if setting == "balanced":  # a regression loss on the same data
        args += ["--set", "model.loss=mse", "--set", "model.metrics=[mae]"]
    result = run_cli(*args)
    assert result.returncode == 3, result.stderr[-2000:]
    assert expected in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_balanced_class_weight_trains_alike_with_both_loops(tmp_path):
    """Balanced class weights give the same loss with both loops, and another loss than unweighted training.
    Trains its own runs: the setting under test (train.class_weight) changes the training, and its unweighted
    baseline runs on two replicas like them, which breast_run does not."""
    runs = {}
    for loop, setting in (("fit", "balanced"), ("custom", "balanced"), ("fit", None)):
        out = tmp_path / f"{loop}-{setting}"
        result = run_cli("run", str(recipe(tmp_path, class_weight=setting)), "--set", "train.epochs=5",
                         "--set", "devices.cpu_logical_devices=2", "--set", f"train.loop={loop}",
                         "--output-dir", str(out))
        assert result.returncode == 0, result.stderr[-3000:]
        runs[loop, setting] = (result, json.loads((only_run_dir(out) / "summary.json").read_text()))
    result, summary = runs["fit", "balanced"]
    recorded = summary["data"]["class_weight"]
    assert recorded["setting"] == "balanced"
    # computed from the training split (455 rows after validation_split 0.2), malignant weighted up
    w0, w1 = recorded["weights"]["0"], recorded["weights"]["1"]
    assert w0 > 1.2 and w1 < 0.85
    assert 1 / (2 * w0) + 1 / (2 * w1) == pytest.approx(1, abs=1e-5)  # count_c / n = 1 / (2 w_c) sums to 1
    assert re.search(r"class weights \(balanced\): 0 1\.\d+, 1 0\.\d+ \(training loss only\)", result.stdout)
    fit_loss = summary["final_metrics"]["loss"]
    custom_loss = runs["custom", "balanced"][1]["final_metrics"]["loss"]
    plain_loss = runs["fit", None][1]["final_metrics"]["loss"]
    assert custom_loss == pytest.approx(fit_loss, rel=0.02)  # the custom step weighs the loss as fit does
    assert abs(plain_loss - fit_loss) > 1e-4  # and the weights change training
    for _, s in runs.values():
        assert s["final_metrics"]["val_accuracy"] >= 0.9
    assert "class_weight" not in runs["fit", None][1]["data"]
