"""``model.application``: a keras.applications backbone, checked before TensorFlow and trained for real.

The slow tests train MobileNetV3Small (``weights: null``, ``minimalistic``: the cheapest application)
on a folder of real MNIST digits written at test time; the model.keras reloads with plain
``keras.models.load_model`` and ``tfgpu evaluate`` reproduces the recorded figure.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ..conftest import data_dir, one_paragraph, only_run_dir, run_cli, run_python


def write_digits(root: Path, digits: range, per_class: int, val_per_class: int) -> Path:
    """Real MNIST digits as PNG class folders ``root/{train,val}/<digit>/<n>.png`` (Pillow only)."""
    from PIL import Image  # noqa: PLC0415

    with np.load(data_dir() / "mnist" / "mnist.npz") as d:
        sets = {"train": (d["x_train"], d["y_train"], per_class), "val": (d["x_test"], d["y_test"], val_per_class)}
        for split, (xs, ys, n) in sets.items():
            for k in digits:
                folder = root / split / str(k)
                folder.mkdir(parents=True, exist_ok=True)
                for i, idx in enumerate(np.flatnonzero(ys == k)[:n]):
                    Image.fromarray(xs[idx]).save(folder / f"{i}.png")
    return root


def recipe(tmp_path: Path, folder: Path, model: str, train: str = "epochs: 1\n  batch_size_per_replica: 32") -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"""data:
  kind: image_folder
  path: {folder / 'train'}
  validation_path: {folder / 'val'}
  color_mode: grayscale
model:
{model}
train:
  {train}
tensorflow:
  seed: 1
""")
    return path


APP = """  application: {name: MobileNetV3Small, weights: null, args: {minimalistic: true}}
  layers:
    - Dense: {units: 5, activation: softmax}"""


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return write_digits(tmp_path_factory.mktemp("digits"), range(5), 60, 40)


def plan(path: Path, *sets: str):
    return run_cli("plan", str(path), *sets)


@pytest.mark.parametrize("setting, words", [
    ("model.application=ResNet5", ["'ResNet5' is not a keras.applications model", "Did you mean 'ResNet50'?"]),
    ("model.application=mobilenetv2", ["Did you mean 'MobileNetV2'?"]),
    ("model.application={name: MobileNetV2, weights: /no/such/weights.h5}",
     ["model.application.weights: '/no/such/weights.h5' is neither 'imagenet', null nor a file"]),
    ("data.normalize=true", ["data.normalize: true with model.application"]),
    ("model.builder=tests.builders:small_cnn", ["both application and builder are set"]),
])
def test_bad_application_settings_are_configuration_errors_before_tensorflow(tmp_path, digits, setting, words):
    result = plan(recipe(tmp_path, digits, APP), "--set", setting)
    assert result.returncode == 3, result.stdout + result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    one_paragraph(result.stderr)
    assert "Traceback" not in result.stderr


def test_plan_accepts_an_application_with_the_default_head(tmp_path, digits):
    result = plan(recipe(tmp_path, digits, "  application: {name: MobileNetV3Small, weights: null}"))
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_preprocessing_layers_equal_each_applications_preprocess_input():
    """tf, torch and caffe modes as Keras layers on [0, 1] inputs == preprocess_input on the pixels."""
    result = run_python("""
        import json, numpy as np, keras
        from tfgpu.model import backbone
        x = np.random.default_rng(0).uniform(0, 255, (2, 8, 8, 3)).astype("float32")
        out = {}
        for mode, fn in (("tf", keras.applications.mobilenet_v2.preprocess_input),
                         ("torch", keras.applications.densenet.preprocess_input),
                         ("caffe", keras.applications.resnet50.preprocess_input)):
            y = x / 255
            for layer in backbone._preprocessing(keras, mode, 255.0):
                y = layer(y)
            out[mode] = float(np.abs(np.asarray(y) - np.asarray(fn(x.copy()))).max())
        print(json.dumps(out))
    """, TF_CPP_MIN_LOG_LEVEL="3")
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(found) == {"tf", "torch", "caffe"} and max(found.values()) < 1e-4, found


@pytest.mark.slow
def test_a_mobilenet_backbone_trains_on_two_replicas_and_model_keras_reloads(tmp_path, digits):
    """A MobileNetV3Small backbone trains on 2 replicas; model.keras reloads in plain Keras and evaluate agrees.
    Trains its own run: the backbone under test (model.application) is one no shared run has."""
    out = tmp_path / "runs"
    result = run_cli("run", str(recipe(tmp_path, digits, APP)), "--set", "devices.cpu_logical_devices=2",
                     "--output-dir", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = only_run_dir(out)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["num_replicas"] == 2
    assert "Functional" in summary["model"]["layers"] and "Resizing" in summary["model"]["layers"]
    recorded = summary["final_metrics"]["val_accuracy"]
    # plain Keras, no tfgpu import, safe mode on: every layer around the application is a Keras layer
    loaded = run_python(f"""
        import json, keras
        m = keras.models.load_model({str(run_dir / 'model.keras')!r})
        print(json.dumps([layer.name for layer in m.layers]))
    """, TF_CPP_MIN_LOG_LEVEL="3")
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    names = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert names[:4] == ["image", "grey_to_rgb", "resize", "to_pixels"] and "MobileNetV3Small" in names
    evaluated = run_cli("evaluate", str(run_dir))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    figures = json.loads((run_dir / "evaluation.json").read_text())
    assert abs(figures["splits"]["validation"]["accuracy"] - recorded) < 1e-4, (figures["splits"], recorded)


@pytest.mark.slow
def test_imagenet_weights_offline_name_the_file_and_where_to_put_it(tmp_path, digits):
    """No network here: the miss is exit 3 naming Keras's file and cache; nothing is written.
    Trains its own run where the weights download (not here): imagenet weights are a setting no shared run has."""
    out = tmp_path / "runs"
    home = tmp_path / "keras_home"
    app = APP.replace("weights: null, args: {minimalistic: true}", "weights: imagenet")
    result = run_cli("run", str(recipe(tmp_path, digits, app)), "--output-dir", str(out), KERAS_HOME=str(home))
    if result.returncode == 0:  # a machine with network access: Keras downloaded it into the cache named
        assert any((home / "models").glob("weights_mobilenet_v3_small*.h5"))
        return
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-3000:]
    expected = home / "models" / "weights_mobilenet_v3_small_224_1.0_float_no_top_v2.h5"
    assert f"put it at {expected}" in result.stderr, result.stderr[-3000:]
    assert "https://storage.googleapis.com/tensorflow/keras-applications/mobilenet_v3/" in result.stderr
    assert not out.exists() or not any(out.iterdir())
