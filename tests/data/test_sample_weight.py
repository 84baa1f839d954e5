"""data.sample_weight (csv column) and data.keys.sample_weight (arrays): bad input, the weights each training
sample carries through validation_split and shuffling, and real training with both loops on breast_cancer."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from ..conftest import data_dir, one_paragraph, only_run_dir, recipe_with, run_cli, run_python


def breast_cancer_rows() -> tuple[list[str], list[list[str]]]:
    with (data_dir() / "breast_cancer" / "breast_cancer.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def weighted_csv(tmp_path: Path, weight_of, name: str = "weighted.csv") -> Path:
    """The real breast_cancer CSV with a ``weight`` column: ``weight_of(index, row)`` (a string or number)."""
    header, rows = breast_cancer_rows()
    path = tmp_path / name
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*header, "weight"])
        out.writerows([*row, weight_of(i, row)] for i, row in enumerate(rows))
    return path


def recipe(tmp_path: Path, path: Path, **data) -> Path:
    return recipe_with(tmp_path, "breast_cancer.yaml", "data", path=str(path), **data)


def test_plan_names_the_weight_column(tmp_path):
    result = run_cli("plan", str(recipe(tmp_path, weighted_csv(tmp_path, lambda i, r: 1), sample_weight="weight")),
                     "--set", "train.class_weight=balanced")
    assert result.returncode == 0, result.stderr
    assert "sample weights: column 'weight' (training loss only, times the class weights)" in result.stdout


@pytest.mark.parametrize("cell,said", [("-1", "is -1, below 0"), ("nan", "is 'nan', not a finite number"),
                                       ("", "is empty"), ("heavy", "is 'heavy', not a finite number")])
def test_a_bad_weight_cell_is_a_data_error_naming_the_line(tmp_path, cell, said):
    path = weighted_csv(tmp_path, lambda i, r: cell if i == 6 else 1)  # data row 7 is line 8
    result = run_cli("plan", str(recipe(tmp_path, path, sample_weight="weight")))
    assert result.returncode == 5, result.stderr
    assert f"{path}, line 8, weight column 'weight' {said}" in result.stderr
    one_paragraph(result.stderr.split("Fix:")[0])


def test_an_unknown_weight_column_is_a_data_error_like_an_unknown_label(tmp_path):
    path = weighted_csv(tmp_path, lambda i, r: 1)
    result = run_cli("plan", str(recipe(tmp_path, path, sample_weight="Weight")))
    assert result.returncode == 5, result.stderr
    assert "data.sample_weight" in result.stderr and "has no column 'Weight' (did you mean 'weight'?)" in result.stderr


@pytest.mark.parametrize("extra,expected", [
    ({"sample_weight": "target"}, "the weight column 'target' is also the label"),
    ({"sample_weight": "weight", "features": ["mean_radius", "weight"]}, "is also listed in data.features"),
])
def test_weight_column_that_is_the_label_or_a_feature_is_refused(tmp_path, extra, expected):
    path = recipe(tmp_path, weighted_csv(tmp_path, lambda i, r: 1), **extra)
    result = run_cli("plan", str(path))
    assert result.returncode == 3, result.stderr
    assert re.search(rf"{re.escape(str(path))}:\d+: 'data.sample_weight'", result.stderr), result.stderr
    assert expected in result.stderr


def test_sources_without_weights_refuse_it_naming_the_kinds_that_have_them(tmp_path):
    path = recipe_with(tmp_path, "mnist_images.yaml", "data", sample_weight="weight")
    result = run_cli("plan", str(path))
    assert result.returncode == 3, result.stderr
    assert re.search(rf"{re.escape(str(path))}:\d+: 'data.sample_weight': data.kind image_folder has no "
                     r"per-sample weights; data.sample_weight is read by kind csv .*by kind arrays", result.stderr)
    one_paragraph(result.stderr.split("Fix:")[0])
    result = run_cli("plan", str(recipe_with(tmp_path, "mnist_arrays.yaml", "data", sample_weight="w")))
    assert result.returncode == 3 and "data.keys: {sample_weight: NAME}" in result.stderr, result.stderr


def test_jax_backend_refuses_sample_weights(tmp_path):
    path = recipe(tmp_path, weighted_csv(tmp_path, lambda i, r: 1), sample_weight="weight")
    result = run_cli("plan", str(path), "--set", "backend=jax")
    assert result.returncode == 3, result.stderr
    assert "data.sample_weight" in result.stderr and "backend: tensorflow" in result.stderr


def test_arrays_weights_must_be_one_finite_non_negative_number_per_sample(tmp_path):
    x, y = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32), np.arange(40) % 2
    cases = {"short": np.ones(39), "negative": np.r_[np.ones(10), -2.0, np.ones(29)]}
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, **cases)
    base = ["plan", "recipes/tumour_area.yaml", "--set", f"data.path={tmp_path / 'd.npz'}"]
    for name, expected in (("short", "have shape (39,); expected (40,)"),
                           ("negative", "the weight of training sample 10 is -2.0"),
                           ("missing", "has no array 'missing'")):
        result = run_cli(*base, "--set", f"data.keys={{sample_weight: {name}}}")
        assert result.returncode == 5, (name, result.stderr)
        assert expected in result.stderr, result.stderr


PIPELINE = """
import json, sys
import numpy as np
from tfgpu.config import DataConfig
from tfgpu.data import LoadContext, prepare, source_for
cfg = DataConfig(**json.loads(sys.argv[1]))
source = source_for(cfg, "binary_crossentropy")
source.check()
data, pipes = prepare(source, cfg, LoadContext(global_batch_size=50, num_replicas=1, seed=7),
                      class_weight=json.loads(sys.argv[2]))
epochs = []
for x, y, w in pipes.train_epochs(2).as_numpy_iterator():
    epochs.extend(zip(x.tolist(), y.tolist(), w.tolist()))
val = next(pipes.validation.as_numpy_iterator())
print(json.dumps({"samples": epochs, "validation_parts": len(val), "info": pipes.info.get("sample_weight"),
                  "train": data.train.size}))
"""


def read_pipeline(data: dict, class_weight=None) -> dict:
    result = run_python(f"import sys; sys.argv[1:] = {[json.dumps(data), json.dumps(class_weight)]!r}\n" + PIPELINE)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_training_batches_carry_each_rows_own_weight_through_split_and_shuffle(tmp_path):
    """Each row's weight is its (distinct) row number: every training sample must arrive with its own row's
    weight, times its class weight, after validation_split, in two differently shuffled epochs."""
    header, rows = breast_cancer_rows()
    path = weighted_csv(tmp_path, lambda i, r: (i + 1) / 1000)
    weight_of = {tuple(np.float32(float(v)) for v in row[:-1]): (i + 1) / 1000 for i, row in enumerate(rows)}
    assert len(weight_of) == len(rows)  # the features identify the row
    out = read_pipeline({"kind": "csv", "path": str(path), "label": "target", "sample_weight": "weight",
                         "validation_split": 0.2, "seed": 0}, class_weight={"0": 3.0})
    samples, n = out["samples"], out["train"]
    assert n == 455 and len(samples) == 2 * n
    first, second = samples[:n], samples[n:]
    assert [s[0] for s in first] != [s[0] for s in second]  # reshuffled
    seen = set()
    for x, y, w in samples:
        row_weight = weight_of[tuple(np.float32(v) for v in x)]
        assert w == pytest.approx(row_weight * (3.0 if y == 0 else 1.0), rel=1e-6)
        seen.add(row_weight)
    assert len(seen) == n  # every training row, each once per epoch
    assert out["validation_parts"] == 2  # validation batches stay (x, y): unweighted
    info = out["info"]
    assert info["source"] == "column 'weight'"
    kept = sorted(seen)
    assert info["min"] == pytest.approx(kept[0]) and info["max"] == pytest.approx(kept[-1])
    assert info["mean"] == pytest.approx(np.mean(kept), rel=1e-5)


@pytest.mark.slow
def test_arrays_weights_follow_their_samples(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(120, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    importance = np.arange(1, 121, dtype=np.float64) / 10
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, importance=importance)
    out = read_pipeline({"kind": "arrays", "path": str(tmp_path / "d.npz"), "keys": {"sample_weight": "importance"},
                         "validation_split": 0.25})
    assert out["train"] == 90 and out["info"]["source"] == "array 'importance'"
    by_x = {tuple(row): w for row, w in zip(x.tolist(), importance)}
    for xs, _, w in out["samples"]:
        assert w == pytest.approx(by_x[tuple(np.float32(v) for v in xs)])


@pytest.mark.slow
@pytest.mark.parametrize("loop,replicas", [("fit", 1), ("custom", 2)])
def test_zero_weights_train_nothing_with_either_loop(tmp_path, loop, replicas):
    """All weights 0: the training loss is 0 and the model does not change (val_loss is the same every epoch).
    Trains its own run: the setting under test (data.sample_weight, all 0) changes the training."""
    path = recipe(tmp_path, weighted_csv(tmp_path, lambda i, r: 0), sample_weight="weight")
    result = run_cli("run", str(path), "--set", "train.epochs=3", "--set", f"train.loop={loop}",
                     "--set", f"devices.cpu_logical_devices={replicas}", "--output-dir", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sample weights: column 'weight' (min 0, max 0, mean 0; training loss only)" in result.stdout
    run = only_run_dir(tmp_path / "runs")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["data"]["sample_weight"] == {"source": "column 'weight'", "min": 0.0, "max": 0.0, "mean": 0.0}
    with (run / "metrics.csv").open() as f:
        epochs = list(csv.DictReader(f))
    assert len(epochs) == 3
    assert all(float(e["loss"]) == 0.0 for e in epochs)
    assert len({e["val_loss"] for e in epochs}) == 1 and float(epochs[0]["val_loss"]) > 0.1
