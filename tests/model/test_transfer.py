"""``model.init_from``, ``model.freeze`` and ``train.unfreeze``: bad input before TensorFlow, and real transfer.

The slow tests train a small CNN on real MNIST digits 0-4 (PNG folders written at test time),
then start a run on digits 5-9 (a new head, ``head_b``) from it and compare with the same run
from scratch: the transferred run's first-epoch validation loss is far lower and its last
validation accuracy no worse. Two-phase fine-tuning (freeze, then unfreeze at a lower rate)
and a ``--resume`` across the unfreeze epoch are run for real too.
"""

from __future__ import annotations

import csv
import json
import shutil
import signal
from pathlib import Path

import pytest

from ..conftest import ROOT, one_paragraph, only_run_dir, run_cli, run_python
from ..training.test_faults import checkpoint_at, resume, start, wait_for
from .test_backbone import write_digits

CNN = """  layers:
    - Conv2D: {filters: 16, kernel_size: 3, activation: relu}
    - MaxPooling2D: {}
    - Conv2D: {filters: 32, kernel_size: 3, activation: relu}
    - MaxPooling2D: {}
    - Flatten: {}
    - Dense: {units: 5, activation: softmax%s}"""


def recipe(tmp_path: Path, folder: Path, head: str = "", name: str = "recipe.yaml", epochs: int = 3,
           batch: int = 16) -> Path:
    path = tmp_path / name
    path.write_text(f"""data:
  kind: image_folder
  path: {folder / 'train'}
  validation_path: {folder / 'val'}
  color_mode: grayscale
model:
{CNN % head}
train:
  epochs: {epochs}
  batch_size_per_replica: {batch}
tensorflow:
  seed: 1
""")
    return path


def rows(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def train(tmp_path: Path, path: Path, *sets: str, needs: tuple[str, ...] = ()) -> tuple[Path, dict, str]:
    out = tmp_path / f"runs{len(list(tmp_path.glob('runs*')))}"
    result = run_cli("run", str(path), *sets, "--output-dir", str(out), needs=needs)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = only_run_dir(out)
    return run_dir, json.loads((run_dir / "summary.json").read_text()), result.stdout + result.stderr


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("digits")
    return {"a": write_digits(root / "a", range(5), 300, 150), "b": write_digits(root / "b", range(5, 10), 100, 50)}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, digits) -> Path:
    """A CNN trained 3 epochs on digits 0-4: the run the others start from.
    Trains its own run: the transfer source must know digits 0-4 only (a 5-unit head), which no shared run does."""
    tmp = tmp_path_factory.mktemp("first")
    run_dir, summary, _ = train(tmp, recipe(tmp, digits["a"]))
    assert summary["final_metrics"]["val_accuracy"] > 0.9
    return run_dir


# --- fast: bad input, no TensorFlow --------------------------------------------------------------------------


@pytest.mark.parametrize("setting, words", [
    ("model.init_from=/no/such/run", ["model.init_from: '/no/such/run': no such file or folder"]),
    ("model.init_from=EMPTY_DIR", ["is a folder without model.keras (a run that saved no model"]),
    ("model.init_from=TEXT_FILE", ["is neither a .keras nor a .weights.h5 file"]),
    ("train.unfreeze={epoch: 1}", ["train.unfreeze: {epoch: 1} but nothing is frozen"]),
    ("model.freeze=[application]", ["'application' names the model.application backbone"]),
])
def test_bad_transfer_settings_are_configuration_errors_before_tensorflow(tmp_path, setting, words):
    (tmp_path / "empty_run").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    setting = setting.replace("EMPTY_DIR", str(tmp_path / "empty_run")).replace("TEXT_FILE", str(tmp_path / "notes.txt"))
    result = run_cli("plan", str(recipe(tmp_path, tmp_path)), "--set", setting)
    assert result.returncode == 3, result.stdout + result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    one_paragraph(result.stderr)


@pytest.mark.parametrize("setting, words", [
    ("train.epochs=2", ["train.unfreeze.epoch: 2 is not before the run's end (train.epochs: 2)"]),
])
def test_unfreeze_refusals_say_why(tmp_path, setting, words):
    result = run_cli("plan", str(recipe(tmp_path, tmp_path)), "--set", "model.freeze=[conv2d]",
                     "--set", "train.unfreeze={epoch: 2}", "--set", setting)
    assert result.returncode == 3, result.stdout + result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


# --- slow: real training -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_init_from_an_mnist_run_converges_faster_on_other_digits_than_from_scratch(tmp_path, digits, first_run):
    """A run started from first_run learns digits 5-9 faster than the same run from scratch, and no worse.
    Trains its own runs: the setting under test (model.init_from) changes the training, against a scratch baseline."""
    path = recipe(tmp_path, digits["b"], head=", name: head_b")
    init_dir, init, out = train(tmp_path, path, "--set", f"model.init_from={first_run}")
    scratch_dir, _, _ = train(tmp_path, path)
    assert init["init_from"] == {"path": str(first_run / "model.keras"), "loaded": ["conv2d", "conv2d_1"],
                                 "skipped": ["head_b (not in model.keras)"]}
    assert "init_from: " in out and "2 layers loaded; not loaded (initial weights): head_b" in out
    a, b = rows(init_dir), rows(scratch_dir)
    figures = {"init": [(r["val_loss"], r["val_accuracy"]) for r in a],
               "scratch": [(r["val_loss"], r["val_accuracy"]) for r in b]}
    print("transfer figures (val_loss, val_accuracy) per epoch:", figures)
    assert a[0]["val_loss"] < 0.8 * b[0]["val_loss"], figures       # measured 0.73 vs 1.16, 0.80 vs 1.27
    assert a[-1]["val_accuracy"] >= b[-1]["val_accuracy"] - 0.02, figures


@pytest.mark.slow
def test_no_matching_layer_and_a_freeze_pattern_matching_nothing_write_nothing(tmp_path, digits, first_run):
    other = tmp_path / "other.yaml"
    other.write_text(recipe(tmp_path, digits["b"]).read_text().replace("filters: 16", "filters: 8")
                     .replace("filters: 32", "filters: 4").replace("softmax}", "softmax, name: head_b}"))
    out = tmp_path / "runs"
    result = run_cli("run", str(other), "--set", f"model.init_from={first_run}", "--output-dir", str(out))
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-3000:]
    assert "model.init_from: no layer of this model matches" in result.stderr
    result = run_cli("run", str(other), "--set", "model.freeze=[backbone]", "--output-dir", str(out))
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-3000:]
    assert "model.freeze[0]: 'backbone' matches no layer name" in result.stderr and "conv2d_1" in result.stderr
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.slow
def test_init_from_a_weights_file_loads_the_layers_that_fit(tmp_path, digits, first_run):
    """A .weights.h5 holds no layer names: layers are matched by class and position, and by shape.
    Trains its own run: the setting under test (model.init_from a .weights.h5, narrower layers) changes the training."""
    weights = tmp_path / "first.weights.h5"
    saved = run_python(f"""
        import keras
        keras.models.load_model({str(first_run / 'model.keras')!r}).save_weights({str(weights)!r})
    """, TF_CPP_MIN_LOG_LEVEL="3")
    assert saved.returncode == 0, saved.stderr[-2000:]
    narrower = tmp_path / "narrower.yaml"
    narrower.write_text(recipe(tmp_path, digits["b"], head=", name: head_b").read_text().replace("filters: 32", "filters: 8"))
    _, summary, out = train(tmp_path, narrower, "--set", f"model.init_from={weights}", "--set", "train.epochs=1")
    assert summary["init_from"] == {"path": str(weights), "loaded": ["conv2d"],
                                    "skipped": ["conv2d_1 (no match)", "head_b (no match)"]}
    assert "UserWarning" not in out


def conv_weights(*run_dirs: Path) -> list[list[float]]:
    """Each run's ``conv2d`` weights (sums of absolute values), read in one process (one TensorFlow start)."""
    found = run_python(f"""
        import json, keras
        print(json.dumps([[float(abs(w).sum()) for w in keras.models.load_model(p).get_layer('conv2d').get_weights()]
                          for p in {[str(d / 'model.keras') for d in run_dirs]!r}]))
    """, TF_CPP_MIN_LOG_LEVEL="3")
    assert found.returncode == 0, found.stderr[-2000:]
    return json.loads(found.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_freeze_keeps_weights_and_unfreeze_trains_them_at_the_scaled_rate(tmp_path, digits, first_run, loop):
    """Frozen layers keep first_run's weights; train.unfreeze thaws them after epoch 1 at a tenth of the rate.
    Trains its own runs: the settings under test (model.freeze, train.unfreeze) change the training."""
    path = recipe(tmp_path, digits["b"], head=", name: head_b")
    frozen_dir, frozen, _ = train(tmp_path, path, "--set", f"model.init_from={first_run}", "--set", f"train.loop={loop}",
                                  "--set", "model.freeze=[conv2d]", "--set", "train.epochs=1")
    assert frozen["frozen_layers"] == ["conv2d"]
    two_dir, two, out = train(tmp_path, path, "--set", f"model.init_from={first_run}", "--set", "model.freeze=[conv2d]",
                              "--set", "train.unfreeze={epoch: 1, learning_rate_factor: 0.1}", "--set", f"train.loop={loop}")
    assert two["unfreeze"] == {"epoch": 1, "learning_rate_factor": 0.1} and two["status"] == "completed"
    assert "frozen: conv2d for the first 1 epoch (train.unfreeze" in out
    assert "Epoch 1/3 " in out and "Epoch 2/3 " in out  # one run, also in the progress lines
    rates = [r["learning_rate"] for r in rows(two_dir)]
    assert rates == pytest.approx([1e-3, 1e-4, 1e-4], rel=1e-5)
    first, after_frozen, after_two = conv_weights(first_run, frozen_dir, two_dir)
    assert after_frozen == first  # frozen for the whole run: the weights it started from
    assert after_two != first  # thawed after epoch 1: trained


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_resume_after_the_unfreeze_epoch_restores_the_second_phase(tmp_path, digits, first_run, loop):
    """Stopped (SIGTERM) after the unfreeze epoch, --resume goes on at the second phase's rate from the checkpoint.
    Trains its own run: it stops and resumes the run after the unfreeze epoch, which a shared run must not suffer."""
    out = tmp_path / "runs"
    source = tmp_path / "source.keras"
    shutil.copy(first_run / "model.keras", source)
    path = recipe(tmp_path, digits["a"], head=", name: head_b", epochs=5, batch=4)
    process = start(str(path), "--set", f"model.init_from={source}", "--set", "model.freeze=[conv2d]",
                    "--set", "train.unfreeze={epoch: 1, learning_rate_factor: 0.1}", "--set", "train.progress=epoch",
                    "--set", f"train.loop={loop}", "--output-dir", str(out))
    steps = 1500 // 4
    run_dir = wait_for(checkpoint_at(out, 2 * steps), process)  # two epochs done: past the unfreeze
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=120)
    assert process.returncode == 75
    source.unlink()  # the checkpoint is restored: init_from is neither needed nor applied again
    result = resume(run_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = rows(run_dir)
    assert [int(r["epoch"]) for r in table] == [0, 1, 2, 3, 4]
    assert [r["learning_rate"] for r in table] == pytest.approx([1e-3] + [1e-4] * 4, rel=1e-5)
    assert table[-1]["val_accuracy"] > 0.9
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["init_from"]["loaded"] == ["conv2d", "conv2d_1"] and summary["status"] == "completed"


@pytest.mark.slow
def test_unfreeze_on_the_jax_backend_trains_the_frozen_layer_after_the_switch(tmp_path):
    """Keras on JAX: the recompile at train.unfreeze makes a new jitted step over the thawed variables.
    Trains its own runs: the JAX backend and the freeze/unfreeze under test are settings no shared run has."""
    recipe_file = ROOT / "recipes" / "breast_cancer.yaml"
    common = ("--set", "backend=jax", "--set", "tensorflow.seed=1", "--set", "model.freeze=[dense]",
              "--set", "train.progress=none")
    frozen_dir, _, _ = train(tmp_path, recipe_file, *common, "--set", "train.epochs=1", needs=("jax",))
    two_dir, two, _ = train(tmp_path, recipe_file, *common, "--set", "train.epochs=2",
                            "--set", "train.unfreeze.epoch=1", needs=("jax",))
    assert two["status"] == "completed" and two["unfreeze"] == {"epoch": 1, "learning_rate_factor": 0.1}
    assert [r["learning_rate"] for r in rows(two_dir)] == pytest.approx([0.01, 0.001], rel=1e-5)
    found = run_python(f"""
        import json, keras, numpy as np
        kernels = [[l for l in keras.models.load_model(p).layers if l.name == "dense"][0].get_weights()[0]
                   for p in ({str(frozen_dir / "model.keras")!r}, {str(two_dir / "model.keras")!r})]
        print(json.dumps(bool(np.allclose(kernels[0], kernels[1]))))
    """, needs=("jax",), KERAS_BACKEND="jax")
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip().splitlines()[-1] == "false"  # the same start (seed 1), trained after the switch

