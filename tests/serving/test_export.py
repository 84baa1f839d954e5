"""`tfgpu export savedmodel|onnx|litert`: real runs exported, each artifact loaded in its own runtime here.

Three real runs, the suite's shared ones (tests/conftest.py: the seed recipe from the .npz on two replicas,
MNIST as a PNG class folder written at test time, the breast cancer CSV), copied, are each exported in the
three formats by the real CLI. The artifacts are then loaded by
TensorFlow's SavedModel loader, ONNX Runtime and the LiteRT interpreter in a fresh interpreter, fed the
raw validation inputs, and compared with the trained ``model.keras`` fed the same inputs preprocessed by
hand (/255 and a channel axis for the images) - not with tfgpu's own serving model.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pytest

from ..conftest import ROOT, copy_run, data_dir, one_paragraph, run_cli, run_python, signal_when

CANCER = data_dir() / "breast_cancer" / "breast_cancer.csv"
FORMATS = ("savedmodel", "onnx", "litert")
RECORD = {"savedmodel": "savedmodel/{name}/1/export.json", "onnx": "model.onnx.export.json",
          "litert": "model.tflite.export.json"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, two_replica_runs, image_run, breast_run) -> dict[str, Path]:
    """``{"mnist", "images", "csv"}`` -> a finished run directory: copies of the shared runs (tests/conftest.py:
    the seed recipe on two replicas, the image folder, the breast-cancer CSV), since exports write into them."""
    parent = tmp_path_factory.mktemp("runs")
    shared_runs = {"mnist": two_replica_runs["fit"][1], "images": image_run, "csv": breast_run}
    return {name: copy_run(run_dir, parent / name) for name, run_dir in shared_runs.items()}


@pytest.fixture(scope="module")
def exports(runs) -> dict[tuple[str, str], dict]:
    """Every run exported in every format by the CLI: ``{(run, format): {"result", "seconds", "record"}}``."""
    out = {}
    for name, run_dir in runs.items():
        for fmt in FORMATS:
            started = time.perf_counter()
            result = run_cli("export", fmt, str(run_dir))
            seconds = time.perf_counter() - started
            assert result.returncode == 0, f"{name} {fmt}: " + result.stdout[-2000:] + result.stderr[-3000:]
            recipe = json.loads((run_dir / "summary.json").read_text())["recipe"]
            path = run_dir / "export" / RECORD[fmt].format(name=Path(recipe).stem)
            out[name, fmt] = {"result": result, "seconds": seconds, "record": json.loads(path.read_text())}
    return out


#: For each run: loads its three artifacts in their runtimes and the trained model.keras in Keras, feeds them the
#: raw validation sample tfgpu recorded (re-read here from the data), prints the differences as JSON.
CHECK = """
import json, sys
import numpy as np


def check(run_dir, kind, data):
    from pathlib import Path
    run = Path(run_dir)
    summary = json.loads((run / "summary.json").read_text())
    if kind == "csv":
        import csv
        rows = list(csv.DictReader(open(data)))
        feats = summary["data"]["features"]
        x = np.array([[float(r[f]) for f in feats] for r in rows], dtype=np.float32)[:256]
    elif kind == "mnist":
        x = np.load(data)["x_test"][:256]
    else:
        from PIL import Image
        files = sorted(Path(data).glob("*/*.png"))[:256]
        x = np.stack([np.asarray(Image.open(f)) for f in files]).astype(np.uint8)[..., None]  # grey: 1 channel
    import keras
    model = keras.models.load_model(run / "model.keras", compile=False)
    if x.dtype == np.uint8:
        pixels = x.astype("float32") / 255.0
        ref = model.predict(pixels[..., None] if pixels.ndim == 3 else pixels, verbose=0)
    else:
        ref = model.predict(x, verbose=0)
    export = run / "export"
    name = Path(summary["recipe"]).stem
    out = {}
    import tensorflow as tf
    loaded = tf.saved_model.load(str(export / "savedmodel" / name / "1"))
    fn = loaded.signatures["serving_default"]
    out["savedmodel"] = fn(inputs=tf.constant(x))["outputs"].numpy()
    out["savedmodel_signature"] = [sorted(fn.structured_input_signature[1]), sorted(fn.structured_outputs)]
    import onnxruntime as ort
    sess = ort.InferenceSession(str(export / "model.onnx"), providers=["CPUExecutionProvider"])
    out["onnx"] = sess.run(None, {"inputs": x})[0]
    out["onnx_io"] = [[(i.name, i.type) for i in sess.get_inputs()], [o.name for o in sess.get_outputs()]]
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_path=str(export / "model.tflite"))
    inp = it.get_input_details()[0]
    it.resize_tensor_input(inp["index"], list(x.shape))
    it.allocate_tensors()
    it.set_tensor(inp["index"], x)
    it.invoke()
    out["litert"] = it.get_tensor(it.get_output_details()[0]["index"])
    out["litert_signature"] = it.get_signature_list()["serving_default"]
    def classes(p):
        return (p[:, 0] > 0.5).astype(int) if p.shape[-1] == 1 else p.argmax(-1)
    report = {"n": len(x), "dtype": str(x.dtype)}
    for fmt in ("savedmodel", "onnx", "litert"):
        got = np.asarray(out[fmt], dtype=np.float32)
        report[fmt] = {"shape": list(got.shape), "max_abs_diff": float(np.abs(got - ref).max()),
                       "same_classes": int((classes(got) == classes(ref)).sum())}
    report["savedmodel_signature"] = out["savedmodel_signature"]
    report["onnx_io"] = out["onnx_io"]
    report["litert_signature"] = out["litert_signature"]
    print("REPORT" + json.dumps(report))


for run_dir, kind, data in json.loads(sys.argv[1]):
    check(run_dir, kind, data)
"""


def check_in_runtimes(*checks: tuple[Path, str, str]) -> list[dict]:
    """:data:`CHECK` for each ``(run_dir, kind, data)``, in one process (TensorFlow and the runtimes start once)."""
    argv = json.dumps([[str(run_dir), kind, data] for run_dir, kind, data in checks])
    result = run_python(CHECK.replace("import json, sys", f"import json, sys\nsys.argv = ['-', {argv!r}]", 1),
                        TF_CPP_MIN_LOG_LEVEL="3")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return [json.loads(ln[len("REPORT"):]) for ln in result.stdout.splitlines() if ln.startswith("REPORT")]


@pytest.fixture(scope="module")
def runtime_reports(runs, exports, small_png) -> dict[str, dict]:
    """:data:`CHECK`'s report of each run's three artifacts: ``{kind: report}`` (the images: the shared PNG digits'
    test folder, tests/conftest.py)."""
    data = {"mnist": data_dir() / "mnist" / "mnist.npz", "csv": data_dir() / "breast_cancer" / "breast_cancer.csv",
            "images": small_png / "test"}
    kinds = sorted(runs)
    return dict(zip(kinds, check_in_runtimes(*((runs[kind], kind, str(data[kind])) for kind in kinds))))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mnist", "images", "csv"])
def test_each_artifact_loads_in_its_runtime_and_agrees_with_the_trained_model(exports, runtime_reports, kind):
    """Raw inputs (uint8 digits from the .npz or the PNG files, float rows of the CSV) into each artifact; the
    trained model.keras fed them as the pipeline does (/255, channel axis; the CSV normalised inside)."""
    report = runtime_reports[kind]
    assert report["n"] >= 100
    for fmt in FORMATS:
        assert report[fmt]["max_abs_diff"] <= 1e-4, (fmt, report)
        assert report[fmt]["same_classes"] == report["n"], (fmt, report)
        assert report[fmt]["shape"][1] == (1 if kind == "csv" else 10)
        # tfgpu's own figures, printed and recorded, are within the same bound on the run's validation sample
        record = exports[kind, fmt]["record"]
        assert record["verification"]["passed"] is True
        assert record["verification"]["max_abs_diff"] <= 1e-4
        assert record["verification"]["classes_identical"] == record["verification"]["samples"] > 0
        assert f"{record['verification']['max_abs_diff']:.2e}" in exports[kind, fmt]["result"].stdout
    assert report["savedmodel_signature"] == [["inputs"], ["outputs"]]
    dtype = "float" if kind == "csv" else "uint8"
    assert report["onnx_io"] == [[["inputs", f"tensor({dtype})"]], ["outputs"]]
    assert report["litert_signature"] == {"inputs": ["inputs"], "outputs": ["outputs"]}


@pytest.mark.slow
def test_export_json_tells_a_client_everything(runs, exports):
    mnist = exports["mnist", "onnx"]["record"]
    assert mnist["input"] == {"name": "inputs", "shape": [-1, 28, 28], "dtype": "uint8", "range": {"min": 0, "max": 255},
                              "layout": "pixels (batch, height, width)", "features": None, "image_size": [28, 28]}
    assert mnist["output"]["name"] == "outputs" and mnist["output"]["shape"] == [-1, 10]
    assert mnist["output"]["dtype"] == "float32" and mnist["task"] == "classification"
    assert mnist["class_names"] == [str(i) for i in range(10)]
    summary = json.loads((runs["mnist"] / "summary.json").read_text())
    assert mnist["source_run"]["run_dir"] == str(runs["mnist"].resolve())
    assert mnist["source_run"]["final_metrics"] == summary["final_metrics"]
    assert mnist["versions"]["tensorflow"] and mnist["versions"]["keras"] and mnist["versions"]["onnxruntime"]
    assert mnist["versions"]["tfgpu"] and mnist["format"] == "onnx"
    assert mnist["verification"]["samples"] == 256 and mnist["verification"]["split"] == "validation"
    images = exports["images", "litert"]["record"]
    assert images["input"]["shape"] == [-1, 28, 28, 1] and images["input"]["dtype"] == "uint8"
    assert images["class_names"] == [str(i) for i in range(10)]
    assert images["versions"]["ai-edge-litert"]
    csv = exports["csv", "savedmodel"]["record"]
    assert csv["input"]["dtype"] == "float32" and csv["input"]["shape"] == [-1, 30]
    assert csv["input"]["features"][0] == "mean_radius" and len(csv["input"]["features"]) == 30
    area = csv["input"]["range"]["mean_area"]
    assert 100 < area["min"] < area["max"] < 3000  # observed on the training rows, raw (normalised inside)
    assert csv["output"]["shape"] == [-1, 1] and csv["class_names"] == ["0", "1"]
    assert csv["savedmodel"]["signature"] == "serving_default" and csv["savedmodel"]["version"] == 1
    # nothing else beside the artifacts: no temporary folder left behind
    for run_dir in runs.values():
        assert not [p.name for p in (run_dir / "export").rglob(".*")]


@pytest.mark.slow
def test_savedmodel_versions_follow_tf_servings_layout(runs, exports, tmp_path):
    run_dir = runs["csv"]
    default = run_dir / "export" / "savedmodel" / "breast_cancer"  # the fixture's export made version 1
    again = run_cli("export", "savedmodel", str(run_dir))
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(p.name for p in default.iterdir()) == ["1", "2"]  # the next free version
    assert (default / "2" / "saved_model.pb").is_file() and (default / "2" / "variables").is_dir()
    base = tmp_path / "models" / "cancer"
    chosen = run_cli("export", "savedmodel", str(run_dir), "-o", str(base), "--version", "7")
    assert chosen.returncode == 0, chosen.stderr[-2000:]
    assert sorted(p.name for p in base.iterdir()) == ["7"] and (base / "7" / "saved_model.pb").is_file()
    record = json.loads((base / "7" / "export.json").read_text())["savedmodel"]
    assert record["model_name"] == "cancer" and record["version"] == 7 and record["signature"] == "serving_default"
    taken = run_cli("export", "savedmodel", str(run_dir), "--version", "2")
    assert taken.returncode == 3 and "already exists" in taken.stderr and "(3)" in taken.stderr, taken.stderr
    one_paragraph(taken.stderr)
    assert sorted(p.name for p in default.iterdir()) == ["1", "2"]


@pytest.mark.slow
def test_a_failed_export_leaves_nothing_behind(runs, tmp_path):
    """The run's data moved (the check sample cannot be read): exit 5, and not even the folders -o named."""
    target = tmp_path / "new" / "deeper" / "model.onnx"
    result = run_cli("export", "onnx", str(runs["csv"]), "-o", str(target), "--set", f"data.path={tmp_path}/gone.csv")
    assert result.returncode == 5, result.stderr[-2000:]
    assert "data.path" in result.stderr and "gone.csv" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_export_never_writes_over_a_runs_files(runs, tmp_path):
    """``-o RUN/model.keras`` (the trained model: its checkpoint is gone once a run completes), another run's
    summary.json, or a name a run writes (its checkpoint folder, gone once it completed): exit 2 before any work,
    every run file as it was (it exited 0 and replaced model.keras with ONNX bytes)."""
    run_dir, other = runs["csv"], runs["images"]
    before = {p: p.read_bytes() for r in (run_dir, other) for p in r.iterdir() if p.is_file()}
    for fmt, output, over in (("onnx", run_dir / "model.keras", run_dir / "model.keras"),
                              ("litert", other / "summary.json", other / "summary.json"),
                              ("onnx", run_dir / "metrics.csv", run_dir / "metrics.csv"),
                              ("onnx", run_dir / "checkpoint", run_dir / "checkpoint")):
        result = run_cli("export", fmt, str(run_dir), "-o", str(output))
        assert result.returncode == 2, result.stderr[-2000:]
        assert f"would write over {over}, a file of the run directory" in result.stderr, result.stderr
        one_paragraph(result.stderr.split("Fix:")[0])
    assert {p: p.read_bytes() for r in (run_dir, other) for p in r.iterdir() if p.is_file()} == before
    # nor over the data a run reads (a copy here, the run pointed at it with --set): the CSV itself, a file or a
    # SavedModel folder inside an image folder
    data = tmp_path / "data"
    (data / "7").mkdir(parents=True)
    shutil.copy(CANCER, data / "cancer.csv")
    kept = (data / "cancer.csv").read_bytes()
    for fmt, run, output, key, value in (("onnx", run_dir, data / "cancer.csv", "data.path", data / "cancer.csv"),
                                         ("litert", other, data / "7" / "m.tflite", "data.path", data),
                                         ("savedmodel", other, data / "7" / "sm", "data.path", data)):
        result = run_cli("export", fmt, str(run), "-o", str(output), "--set", f"{key}={value}")
        assert result.returncode == 2, result.stderr[-2000:]
        assert f"the training data ({key}: {value})" in result.stderr, result.stderr
        one_paragraph(result.stderr.split("Fix:")[0])
    assert (data / "cancer.csv").read_bytes() == kept and sorted(p.name for p in data.rglob("*")) == ["7", "cancer.csv"]
    # nor over a recipe or a run's file with the Slurm script or TFJob manifest
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((ROOT / "recipes" / "breast_cancer.yaml").read_text().replace(
        "${TFGPU_DATA_DIR}/breast_cancer/breast_cancer.csv", str(data / "cancer.csv")))
    text = recipe.read_text()
    for kind, output, says in (("slurm", recipe, f"would write over the recipe {recipe}"),
                               ("tfjob", data / "cancer.csv", "would write over the training data (data.path: "),
                               ("slurm", run_dir / "config.yaml", "a file of the run directory")):
        image = ["--image", "localhost/tfgpu:gpu"] if kind == "tfjob" else []
        result = run_cli("export", kind, str(recipe), *image, "-o", str(output))
        assert result.returncode == 2 and says in result.stderr, result.stderr[-2000:]
    assert recipe.read_text() == text and (data / "cancer.csv").read_bytes() == kept
    assert {p: p.read_bytes() for r in (run_dir, other) for p in r.iterdir() if p.is_file()} == before


@pytest.mark.slow
def test_sighup_during_an_export_exits_75_and_leaves_no_staging_folder(runs, tmp_path):
    """SIGHUP (a closed terminal; SIGTERM goes the same way, tested with predict) once the staging folder exists
    (TensorFlow starting, or converting): exit 75 with one paragraph, and nothing left, not the hidden
    ``.m.onnx.tmp-*`` folder (the signal's default action left it, exit 143)."""
    code, stderr = signal_when(tmp_path, ".m.onnx.tmp-*", "export", "onnx", str(runs["csv"]), "-o",
                               str(tmp_path / "m.onnx"), signum=signal.SIGHUP)
    assert code == 75, stderr[-3000:]
    assert "tfgpu: preempted: tfgpu export onnx: SIGHUP arrived while" in stderr
    one_paragraph(stderr.split("Fix:")[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


HIDE = """
import sys
sys.modules[{module!r}] = None  # as if the package were not installed
sys.argv = ["tfgpu", "export", {fmt!r}, {run!r}]
from tfgpu.cli import main
main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("fmt, module, extra", [("onnx", "onnxruntime", "onnx"), ("onnx", "tf2onnx", "onnx"),
                                                ("litert", "ai_edge_litert", "litert")])
def test_a_missing_runtime_names_the_extra_to_install(runs, fmt, module, extra, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(runs["mnist"], run_dir, ignore=shutil.ignore_patterns("export"))
    result = run_python(HIDE.format(module=module, fmt=fmt, run=str(run_dir)))
    assert result.returncode == 3, result.stderr[-2000:]
    assert f"pip install 'tfgpu[{extra}]'" in result.stderr and module in result.stderr
    one_paragraph(result.stderr)
    assert not (run_dir / "export").exists()


def test_a_run_without_model_keras_is_a_data_error(tmp_path):
    run_dir = tmp_path / "failed-run"
    run_dir.mkdir()
    shutil.copy(ROOT / "recipes" / "mnist.yaml", run_dir / "config.yaml")
    (run_dir / "summary.json").write_text(json.dumps({"status": "failed", "data": {"input_shape": [28, 28, 1]}}))
    for fmt in FORMATS:
        result = run_cli("export", fmt, str(run_dir))
        assert result.returncode == 5, result.stderr
        assert "no model.keras" in result.stderr and "save_model" in result.stderr
        one_paragraph(result.stderr)
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "summary.json"]


def test_an_unwritable_output_is_an_output_error_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(ROOT / "recipes" / "breast_cancer.yaml", run_dir / "config.yaml")
    (run_dir / "model.keras").write_bytes(b"not loaded: the output is checked first")
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "recipe": "recipes/breast_cancer.yaml",
                                                      "data": {"input_shape": [30], "stored_dtype": "float32"}}))
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    started = time.perf_counter()
    result = run_cli("export", "savedmodel", str(run_dir), "-o", str(blocker / "models" / "cancer"))
    assert result.returncode == 8, result.stderr
    assert str(blocker) in result.stderr and "-o" in result.stderr
    one_paragraph(result.stderr)
    folder = run_cli("export", "litert", str(run_dir), "-o", str(tmp_path))
    assert folder.returncode == 8 and "is a folder" in folder.stderr, folder.stderr
    assert time.perf_counter() - started < 30  # no TensorFlow started, no model loaded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "run"]


class _Run:
    def __init__(self, task: str) -> None:
        self.task = task


def test_the_agreement_check_is_absolute_for_probabilities_relative_for_large_values_and_forgives_near_ties():
    import numpy as np

    from tfgpu.serving.export import compare

    probs = np.array([[0.7, 0.2, 0.1], [0.50004, 0.49996, 0.0]], np.float32)
    assert compare(probs, probs + 5e-5, _Run("classification"))["passed"]
    assert not compare(probs, probs + 2e-4, _Run("classification"))["passed"]
    flipped = np.array([[0.7, 0.2, 0.1], [0.49996, 0.50004, 0.0]], np.float32)  # a near tie flips: allowed
    check = compare(probs, flipped, _Run("classification"))
    assert check["passed"] and check["classes_identical"] == 1 and check["near_ties"] == 1
    clear = np.array([[0.2, 0.7, 0.1], [0.50004, 0.49996, 0.0]], np.float32)  # a clear class changes: refused
    assert not compare(probs, clear, _Run("classification"))["passed"]
    prices = np.array([[2048.0], [250000.0], [0.5]], np.float32)
    near = prices + np.array([[2.4e-4], [0.02], [5e-5]], np.float32)
    assert compare(prices, near, _Run("regression"))["passed"]  # float32's own spacing at 2,048 and 250,000
    assert not compare(prices, prices + np.array([[1.0], [0.0], [0.0]], np.float32), _Run("regression"))["passed"]
    assert not compare(prices, prices[:2], _Run("regression"))["passed"]


def test_a_failed_replace_puts_the_earlier_export_back(tmp_path):
    """Exporting onto an earlier model.onnx: when the record cannot be moved into place, the earlier artifact
    and record are restored as they were, and the new ones are gone."""
    from tfgpu.serving.export import _replace_pair
    from tfgpu.errors import OutputError

    old_model, old_record = tmp_path / "model.onnx", tmp_path / "model.onnx.export.json"
    old_model.write_text("earlier model")
    old_record.write_text("earlier record")
    staging = tmp_path / ".staging"
    staging.mkdir()
    (staging / "artifact").write_text("new model")  # and no new record: the second move fails
    with pytest.raises(OutputError):
        _replace_pair(staging, [(staging / "artifact", old_model), (staging / "export.json", old_record)], "export onnx")
    assert old_model.read_text() == "earlier model" and old_record.read_text() == "earlier record"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".staging", "model.onnx", "model.onnx.export.json"]
    (staging / "export.json").write_text("new record")
    (staging / "artifact").write_text("new model")
    _replace_pair(staging, [(staging / "artifact", old_model), (staging / "export.json", old_record)], "export onnx")
    assert old_model.read_text() == "new model" and old_record.read_text() == "new record"
