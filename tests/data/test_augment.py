"""data.augment / data.augment_on: bad input, what the pipeline yields, seeding, and a real 2-replica run."""

from __future__ import annotations

import json
import re

import pytest

from ..conftest import one_paragraph, only_run_dir, recipe_with, run_cli, run_python

AUGMENT = [{"RandomRotation": {"factor": 0.05}}, {"RandomZoom": {"height_factor": 0.1}},
           {"RandomTranslation": {"height_factor": 0.1, "width_factor": 0.1}}]


def recipe(tmp_path, name="mnist.yaml", **data):
    return recipe_with(tmp_path, name, "data", **data)


def test_unknown_layer_is_a_configuration_error_with_its_line_and_a_guess(tmp_path):
    path = recipe(tmp_path, augment=["RandomFlip", {"RandomZom": {"height_factor": 0.1}}])
    result = run_cli("plan", str(path))
    assert result.returncode == 3, result.stderr
    assert re.search(rf"{re.escape(str(path))}:\d+: 'data.augment': item 1: 'RandomZom' is not a Keras image "
                     r"preprocessing layer\. Did you mean 'RandomZoom'\?", result.stderr)
    assert "RandomTranslation" in result.stderr  # the list of valid layers
    one_paragraph(result.stderr.split("Fix:")[0])


@pytest.mark.parametrize("value", [[], "RandomFlip", [{"RandomFlip": {}, "RandomZoom": {}}], ["MixUp"]])
def test_malformed_or_non_augmenting_items_are_refused(tmp_path, value):
    result = run_cli("plan", str(recipe(tmp_path, augment=value)))
    assert result.returncode == 3, result.stderr
    assert "data.augment" in result.stderr and "Traceback" not in result.stderr


def test_csv_rows_cannot_be_augmented_before_tensorflow_starts(tmp_path):
    path = recipe(tmp_path, "breast_cancer.yaml", augment=["RandomFlip"])
    result = run_cli("plan", str(path))
    assert result.returncode == 3, result.stderr
    assert re.search(rf"{re.escape(str(path))}:\d+: 'data.augment': data.augment applies image layers, and "
                     "data.kind csv gives rows of features", result.stderr)


def test_jax_backend_refuses_pipeline_augmentation_and_says_to_use_the_model(tmp_path):
    path = recipe(tmp_path, augment=["RandomFlip"])
    result = run_cli("plan", str(path), "--set", "backend=jax", "--set", "train.loop=fit")
    assert result.returncode == 3, result.stderr
    assert "data.augment_on: model" in result.stderr and "PyDataset" in result.stderr


@pytest.mark.slow
def test_a_size_changing_layer_in_the_pipeline_fails_before_anything_is_written(tmp_path):
    path = recipe(tmp_path, augment=[{"RandomCrop": {"height": 24, "width": 24}}])
    out = tmp_path / "runs"
    result = run_cli("run", str(path), "--set", "train.epochs=1", "--output-dir", str(out))
    assert result.returncode == 3, result.stderr
    assert "RandomCrop changes the image size" in result.stderr and "augment_on: model" in result.stderr
    assert not out.exists() or not any(out.iterdir())


PIPELINE = """
    import json, os, numpy as np, tfgpu
    tfgpu.setup(tensorflow={"seed": 7})
    from tfgpu.config import DataConfig
    from tfgpu.data.base import Data, DataSpec, Split
    from tfgpu.data.pipeline import build_pipelines
    mnist = np.load(os.path.join(os.environ["TFGPU_DATA_DIR"], "mnist", "mnist.npz"))
    x, y = mnist["x_train"][:256], mnist["y_train"][:256]
    spec = DataSpec("mnist", "slice", (28, 28), "uint8", add_channel=True, rescale=1 / 255, num_classes=10)
    data = Data(Split("train", "t", x=x, y=y, size=256), Split("validation", "v", x=x, y=y, size=256), None, spec)
    def batches(augment, seed):
        cfg = DataConfig(name="mnist", augment=augment, shuffle_buffer=1)  # shuffle_buffer 1: in order
        pipes = build_pipelines(data, cfg, 64, seed=seed)
        train = [b[0].numpy() for b in pipes.train_epochs(2, 0)]
        val = [b[0].numpy() for b in pipes.validation]
        return train, val, pipes.info.get("augment")
    plain, plain_val, _ = batches(None, 7)
    aug, aug_val, info = batches(AUGMENT, 7)
    again, _, _ = batches(AUGMENT, 7)
    other, _, _ = batches(AUGMENT, 8)
    resumed = [b[0].numpy() for b in build_pipelines(data, DataConfig(name="mnist", augment=AUGMENT, shuffle_buffer=1),
                                                       64, seed=7).train_epochs(2, 5)]
    print(json.dumps({
        "steps": len(aug),
        "train_changed": [float(np.abs(a - p).mean()) for a, p in zip(aug, plain)],
        "val_equal": all(np.array_equal(a, p) for a, p in zip(aug_val, plain_val)),
        "same_seed_equal": all(np.array_equal(a, b) for a, b in zip(aug, again)),
        "other_seed_differs": any(not np.array_equal(a, b) for a, b in zip(aug, other)),
        "resumed_equal": all(np.array_equal(a, b) for a, b in zip(aug[5:], resumed)),
        "range": [float(min(a.min() for a in aug)), float(max(a.max() for a in aug))],
        "info": info}))
"""


@pytest.mark.slow
def test_augmentation_changes_training_batches_only_and_is_seeded():
    result = run_python(PIPELINE.replace("AUGMENT", repr(AUGMENT)), TF_CPP_MIN_LOG_LEVEL="3")
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["steps"] == 8  # 256 samples / 64, two epochs
    assert all(d > 0.005 for d in out["train_changed"])  # every training batch is transformed
    assert out["val_equal"]  # validation batches are not
    assert out["same_seed_equal"] and out["other_seed_differs"]
    assert out["resumed_equal"]  # skipping 5 batches (a resume) gives the same augmented batches after them
    assert 0.0 <= out["range"][0] and out["range"][1] <= 1.0 + 1e-6  # value_range (0, 1) after rescale
    assert out["info"] == {"layers": ["RandomRotation", "RandomZoom", "RandomTranslation"], "on": "pipeline",
                           "seed": 7, "value_range": [0.0, 1.0]}


@pytest.mark.slow
@pytest.mark.parametrize("loop,placement", [("fit", "pipeline"), ("custom", "model")])
def test_mnist_trains_with_augmentation_at_two_replicas(tmp_path, loop, placement):
    """MNIST learns through augmentation on two replicas, in the pipeline (fit) or in the model (custom).
    Trains its own run: the setting under test (augmentation layers) changes the training."""
    path = recipe(tmp_path, augment=AUGMENT, augment_on=placement)
    out = tmp_path / "runs"
    result = run_cli("run", str(path), "--set", "devices.cpu_logical_devices=2", "--set", "train.epochs=2",
                     "--set", "train.batch_size_per_replica=128", "--set", f"train.loop={loop}",
                     "--output-dir", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(out)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["num_replicas"] == 2 and summary["data"]["augment"]["on"] == placement
    assert "augmentation: RandomRotation, RandomZoom, RandomTranslation on training batches only" in result.stdout
    assert summary["final_metrics"]["val_accuracy"] >= 0.9  # learns through the augmentation (0.96 measured)
    if placement == "model":  # the saved model holds the layers, inactive at inference
        check = run_python(f"""
            import keras, numpy as np
            m = keras.models.load_model({str(run_dir / 'model.keras')!r})
            x = np.random.default_rng(0).random((4, 28, 28, 1)).astype("float32")
            a, b = m.predict(x, verbose=0), m(x, training=False)  # inference: the layers pass x through
            trained = m(x, training=True)
            print([l.__class__.__name__ for l in m.layers][:4], bool(np.allclose(a, b, atol=1e-5))
                  and not np.allclose(a, trained, atol=1e-5))
        """, TF_CPP_MIN_LOG_LEVEL="3")
        assert check.returncode == 0, check.stderr[-2000:]
        assert "RandomRotation" in check.stdout and check.stdout.strip().endswith("True")
