"""`tfgpu predict` as a user runs it: real runs trained on real MNIST PNGs and the breast-cancer CSV,
predicted in subprocesses, compared with `tfgpu evaluate` and with each other (arrays, replicas, formats),
and every bad input refused with its exit code and nothing written."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from ..conftest import SMALL_PNG, copy_run, data_dir, one_paragraph, run_cli, signal_when

SAMPLES = SMALL_PNG  # MNIST images per split written as PNGs


def _evaluate(run_dir: Path, *args: str) -> dict:
    result = run_cli("evaluate", str(run_dir), *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((run_dir / "evaluation.json").read_text())


def _predict(*args: str, code: int = 0):
    result = run_cli("predict", *args)
    assert result.returncode == code, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def png(small_png) -> Path:
    return small_png


@pytest.fixture(scope="module")
def image_run(tmp_path_factory, image_run) -> Path:
    """The shared image-folder run (tests/conftest.py), copied: evaluate and predict write beside it."""
    return copy_run(image_run, tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory, breast_run) -> Path:
    """The shared breast-cancer run, copied."""
    return copy_run(breast_run, tmp_path_factory.mktemp("runs"))


CANCER = data_dir() / "breast_cancer" / "breast_cancer.csv"


@pytest.mark.slow
def test_predict_on_the_validation_folder_gives_evaluates_accuracy(image_run, png, tmp_path):
    evaluated = _evaluate(image_run, "--split", "validation")["splits"]["validation"]
    out = tmp_path / "preds.csv"
    _predict(str(image_run), str(png / "test"), "--output", str(out))
    record = json.loads((tmp_path / "preds.csv.json").read_text())
    assert record["count"] == evaluated["samples"] == SAMPLES and record["labelled"] == SAMPLES
    assert abs(record["accuracy"] - evaluated["accuracy"]) * SAMPLES <= 1, (record["accuracy"], evaluated)
    assert record["num_replicas"] == 1 and record["samples_per_second"] > 0 and record["skipped"] == []
    rows = _rows(out)
    assert list(rows[0]) == ["id", "class", "probability", "top_k", "label", "correct"] and len(rows) == SAMPLES
    assert rows[0]["id"].endswith(".png") and rows[0]["label"] == Path(rows[0]["id"]).parent.name
    assert sum(r["correct"] == "true" for r in rows) == record["correct"]
    top = rows[0]["top_k"].split()
    assert len(top) == 3 and top[0] == f"{rows[0]['class']}:{rows[0]['probability']}"


@pytest.mark.slow
def test_predict_on_the_breast_cancer_csv_gives_evaluates_accuracy(csv_run, tmp_path):
    evaluated = _evaluate(csv_run, "--set", f"data.test_path={CANCER}", "--split", "test")["splits"]["test"]
    out = tmp_path / "preds.jsonl"
    _predict(str(csv_run), str(CANCER), "-o", str(out))
    record = json.loads((tmp_path / "preds.jsonl.json").read_text())
    assert record["count"] == evaluated["samples"] == 569
    assert abs(record["accuracy"] - evaluated["accuracy"]) * 569 <= 1, (record["accuracy"], evaluated)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["id"] == f"{CANCER}:2" and rows[0]["class"] in ("0", "1")
    assert [t["class"] for t in rows[0]["top_k"]] == sorted(["0", "1"], key=lambda c: c != rows[0]["class"])
    assert abs(sum(t["probability"] for t in rows[0]["top_k"]) - 1) < 1e-5
    # columns are found by name: reordered, with an extra column and no label, the same predictions
    table = list(csv.reader(CANCER.open()))
    order = list(reversed(range(len(table[0]) - 1)))
    shuffled = tmp_path / "shuffled.csv"
    with shuffled.open("w", newline="") as f:
        csv.writer(f).writerows([["note"] + [row[i] for i in order] for row in table[:11]])
    again = _predict(str(csv_run), str(shuffled)).stdout
    rows2 = list(csv.DictReader(again.splitlines()))
    assert list(rows2[0]) == ["id", "class", "probability", "top_k"] and len(rows2) == 10
    assert [r["class"] for r in rows2] == [r["class"] for r in rows[:10]]


@pytest.mark.slow
def test_arrays_two_replicas_and_output_formats_agree_with_the_folder(image_run, png, tmp_path):
    from recipes.make_examples import mnist  # noqa: PLC0415

    digits = mnist(SAMPLES)
    npz = tmp_path / "digits.npz"
    np.savez(npz, x=digits["x_test"], y=digits["y_test"])
    _predict(str(image_run), str(png / "test"), "-o", str(tmp_path / "folder.npy"), "--top-k", "5")
    _predict(str(image_run), str(npz), "-o", str(tmp_path / "arrays.jsonl"), "--top-k", "5")
    _predict(str(image_run), str(npz), "-o", str(tmp_path / "two.npy"), "--set", "devices.cpu_logical_devices=2",
             "--batch-size", "100")
    folder = np.load(tmp_path / "folder.npy")
    ids = (tmp_path / "folder.npy.ids.txt").read_text().splitlines()
    assert folder.shape == (SAMPLES, 10) and folder.dtype == np.float32 and len(ids) == SAMPLES
    np.testing.assert_allclose(folder.sum(axis=1), 1, atol=1e-5)
    # the PNGs are the test digits by class then index: put the folder's rows back in the array order
    order = np.argsort([int(Path(i).stem) for i in ids])
    rows = [json.loads(line) for line in (tmp_path / "arrays.jsonl").read_text().splitlines()]
    assert rows[0]["id"] == f"{npz}[0]" and len(rows[0]["top_k"]) == 5 and "correct" in rows[0]
    probs = np.array([[t["probability"] for t in r["top_k"]] for r in rows])
    np.testing.assert_allclose(probs[:, 0], folder[order].max(axis=1), atol=1e-6)
    assert [r["class"] for r in rows] == [str(c) for c in folder[order].argmax(axis=1)]
    two = np.load(tmp_path / "two.npy")
    record = json.loads((tmp_path / "two.npy.json").read_text())
    assert record["num_replicas"] == 2 and len(record["devices"]) == 2 and record["batch_size"] == 100
    np.testing.assert_allclose(two, folder[order], atol=1e-5)
    assert (two.argmax(axis=1) == folder[order].argmax(axis=1)).all()
    single = json.loads((tmp_path / "arrays.jsonl.json").read_text())
    assert record["accuracy"] == single["accuracy"]


@pytest.mark.slow
def test_bad_images_are_refused_listed_or_skipped(image_run, png, tmp_path):
    from PIL import Image  # noqa: PLC0415

    folder = tmp_path / "mixed" / "7"
    folder.mkdir(parents=True)
    for src in sorted((png / "test" / "7").iterdir())[:4]:
        shutil.copy(src, folder / src.name)
    (folder / "broken.png").write_bytes(b"not a png at all")
    (folder / "notes.txt").write_text("hello")
    # a JPEG cut short: Pillow reads its header, TensorFlow's decoder fails ("Premature end of JPEG data")
    jpeg = io.BytesIO()
    Image.open(sorted(folder.glob("*.png"))[0]).save(jpeg, format="JPEG", quality=95)
    (folder / "cut.jpg").write_bytes(jpeg.getvalue()[:len(jpeg.getvalue()) // 2])
    out = tmp_path / "out.csv"
    refused = _predict(str(image_run), str(tmp_path / "mixed"), "-o", str(out), code=5)
    assert "2 input file(s) cannot be used" in refused.stderr and "broken.png" in refused.stderr
    assert "notes.txt" in refused.stderr and "--skip-bad" in refused.stderr
    one_paragraph(refused.stderr.split("Fix:")[0])
    assert not out.exists() and not list(tmp_path.glob("*.json")) and not list(tmp_path.glob(".out*"))
    skipped = _predict(str(image_run), str(tmp_path / "mixed"), "-o", str(out), "--skip-bad")
    record = json.loads((tmp_path / "out.csv.json").read_text())
    assert record["count"] == 4 and len(_rows(out)) == 4 and "cut.jpg" not in out.read_text()
    assert {Path(s["path"]).name for s in record["skipped"]} == {"broken.png", "notes.txt", "cut.jpg"}
    assert "skipped " + str(folder / "cut.jpg") + ": TensorFlow cannot decode it" in skipped.stderr
    # an RGB image: the run's color_mode (grayscale) converts it, as training does; a run whose
    # channels came from its images (color_mode unset) refuses it, as training would
    rgb = tmp_path / "rgb.png"
    Image.open(folder / sorted(p.name for p in folder.glob("0*.png"))[0]).convert("RGB").save(rgb)
    _predict(str(image_run), str(rgb))
    refused = _predict(str(image_run), str(rgb), "--set", "data.color_mode=null", "-o", str(tmp_path / "rgb.csv"),
                       code=5)
    assert "an image of 3 channel(s), but the run's images have 1" in refused.stderr
    assert not (tmp_path / "rgb.csv").exists()


@pytest.mark.slow
def test_hidden_folders_are_skipped_and_mixed_labelled_inputs_keep_one_header(image_run, png, tmp_path):
    """A notebook's hidden checkpoint folder inside a labelled folder is not entered (its labels kept), and a
    labelled folder beside an unlabelled file gives one CSV header, the unlabelled row's label cells empty."""
    labelled = tmp_path / "val"
    for digit in ("3", "7"):
        (labelled / digit).mkdir(parents=True)
        for src in sorted((png / "test" / digit).iterdir())[:3]:
            shutil.copy(src, labelled / digit / src.name)
    hidden = labelled / ".ipynb_checkpoints" / "3"
    hidden.mkdir(parents=True)
    shutil.copy(sorted((png / "test" / "3").iterdir())[0], hidden / "copy-checkpoint.png")
    (labelled / ".ipynb_checkpoints" / "notes.txt").write_text("not an image")
    single = sorted((png / "test" / "5").iterdir())[0]
    out = tmp_path / "preds.csv"
    _predict(str(image_run), str(labelled), str(single), "-o", str(out))
    with open(out, newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == ["id", "class", "probability", "top_k", "label", "correct"] and len(table) == 1 + 7
    assert all(len(row) == 6 for row in table) and not any(".ipynb_checkpoints" in row[0] for row in table)
    assert [row[4] for row in table[1:7]] == ["3"] * 3 + ["7"] * 3 and table[7][4:] == ["", ""]
    record = json.loads((tmp_path / "preds.csv.json").read_text())
    assert record["count"] == 7 and record["labelled"] == 6


@pytest.mark.slow
def test_bad_tables_arrays_and_outputs_exit_with_their_code_and_write_nothing(csv_run, image_run, tmp_path):
    header, *rows = list(csv.reader(CANCER.open()))
    missing = tmp_path / "missing.csv"
    with missing.open("w", newline="") as f:
        csv.writer(f).writerows([header[1:], *[r[1:] for r in rows[:5]]])
    words = tmp_path / "words.csv"
    bad = [list(r) for r in rows[:5]]
    bad[2][3] = "big"
    with words.open("w", newline="") as f:
        csv.writer(f).writerows([header, *bad])
    out = tmp_path / "o.csv"
    cases = [
        ((str(csv_run), str(missing)), 5, f"has no column(s) {header[0]}"),
        ((str(csv_run), str(words)), 5, f"{words}, line 4, column '{header[3]}' is 'big', not a finite number"),
        ((str(csv_run), str(CANCER), "-o", str(tmp_path / "file.txt" / "o.csv")), 8, "cannot write --output"),
        ((str(csv_run), str(CANCER), "-o", str(tmp_path / "o.parquet")), 2, "'.parquet' is not an output format"),
    ]
    (tmp_path / "file.txt").write_text("a file, not a folder")
    mine = tmp_path / "mine.csv"
    shutil.copy(CANCER, mine)
    cases += [((str(csv_run), str(mine), "-o", str(mine)), 2, "would overwrite the input")]
    holes = np.ones((4, 30), np.float32)
    holes[2, 5] = np.nan
    np.save(tmp_path / "holes.npy", holes)
    cases += [((str(csv_run), str(tmp_path / "holes.npy")), 5, "holds nan at sample 2 (index [2, 5])")]
    np.save(tmp_path / "wrong.npy", np.zeros((3, 32, 32), np.uint8))
    np.save(tmp_path / "scaled.npy", np.full((3, 28, 28, 1), 0.5, np.float32))
    cases += [((str(image_run), str(tmp_path / "wrong.npy")), 5, "has shape (3, 32, 32); the run's model takes "
                                                                   "(N, 28, 28, 1)"),
              ((str(image_run), str(tmp_path / "scaled.npy")), 5, "not divided by 255"),
              ((str(image_run), str(CANCER)), 5, "is a CSV file, but the run trained on image_folder data")]
    for args, code, text in cases:
        result = _predict(*args[:2], *(args[2:] or ("-o", str(out))), code=code)
        assert text in result.stderr, (args, result.stderr)
        one_paragraph(result.stderr.split("Fix:")[0])
        assert not out.exists() and not list(tmp_path.glob("*.json")), args
    assert mine.read_bytes() == CANCER.read_bytes()


def test_a_run_without_model_keras_is_a_data_error(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy("recipes/breast_cancer.yaml", run_dir / "config.yaml")
    (run_dir / "summary.json").write_text(json.dumps({"data": {"input_shape": [30]}}))
    result = run_cli("predict", str(run_dir), str(CANCER), "-o", str(tmp_path / "p.csv"))
    assert result.returncode == 5, result.stderr
    assert "has no model.keras" in result.stderr and "save_model" in result.stderr
    one_paragraph(result.stderr.split("Fix:")[0])
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "p.csv.json").exists()


def test_folders_are_walked_in_path_order_without_entering_hidden_ones(tmp_path):
    """The one walk training and predict share: sorted by folder path then name, hidden folders never
    entered, hidden and system files left out."""
    from tfgpu.data.image_folder import walk_sorted

    for rel in ("b/2.png", "b/1.png", "a/x/3.png", "a-c/4.png", "a/.cache/5.png", ".git/objects/6", "a/.7.png",
                "a/Thumbs.db"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    walked = [(str(Path(d).relative_to(tmp_path)), files) for d, files in walk_sorted(tmp_path)]
    assert walked == [(".", []), ("a", []), ("a-c", ["4.png"]), ("a/x", ["3.png"]), ("b", ["1.png", "2.png"])]


def test_the_walk_follows_linked_folders_at_every_depth_and_enters_each_real_folder_once(tmp_path):
    """A class folder holding a link to a folder elsewhere (two levels down), a link back up the tree and a
    second link to the same folder: the linked images are found (os.walk drops links to folders unless told),
    each real folder once, and the walk ends."""
    from tfgpu.data.image_folder import walk_sorted

    elsewhere = tmp_path / "elsewhere" / "deep"
    elsewhere.mkdir(parents=True)
    (elsewhere / "9.png").write_bytes(b"")
    cls = tmp_path / "data" / "3"
    (cls / "sub").mkdir(parents=True)
    (cls / "1.png").write_bytes(b"")
    (cls / "sub" / "linked").symlink_to(elsewhere, target_is_directory=True)
    (cls / "sub" / "again").symlink_to(elsewhere, target_is_directory=True)
    (cls / "sub" / "up").symlink_to(cls, target_is_directory=True)
    walked = [(str(Path(d).relative_to(cls)), files) for d, files in walk_sorted(cls)]
    assert walked == [(".", ["1.png"]), ("sub", []), ("sub/again", ["9.png"])], walked


class _Classes:
    class_names = ["0", "1"]


def test_a_full_disk_under_the_output_is_exit_8_with_the_free_space_and_leaves_nothing(tmp_path):
    """The rows' temporary file on a full disk (a symlink to /dev/full: a real ENOSPC from the kernel): the
    project's DiskFull paragraph (exit 8, the file and the free space named), and no file left behind."""
    from tfgpu.errors import DiskFull
    from tfgpu.serving.predict import Output

    out = tmp_path / "preds.csv"
    (tmp_path / f".preds.csv.{os.getpid()}.tmp").symlink_to("/dev/full")
    writer = Output(out, _Classes(), 2)
    writer.open(2, 2)
    writer.write(["a", "b"], np.array([[0.9, 0.1], [0.2, 0.8]], np.float32), None)
    with pytest.raises(DiskFull) as caught:
        writer.commit()
    error = caught.value
    assert error.exit_code == 8
    assert f"the disk is full: cannot write {out} (No space left on device)" in error.message
    assert " free of " in error.message and "Nothing was written." in error.message and "--output" in error.hint
    one_paragraph(error.report())
    assert os.listdir(tmp_path) == []


def test_a_nan_or_infinite_output_is_never_counted_correct(tmp_path):
    """A row whose model output is NaN (a model that overflowed inside) has argmax class 0: it was counted
    correct against label 0 (issue 34, item 6: accuracy 1.0 over NaN rows). It is counted wrong, its CSV row
    says correct false, and the record counts the rows."""
    from tfgpu.serving.predict import Output

    out = tmp_path / "preds.csv"
    writer = Output(out, _Classes(), 2, labelled=True)
    writer.open(3, 2)
    writer.write(["nan", "inf", "fine"], np.array([[np.nan, np.nan], [np.inf, 0.0], [0.9, 0.1]], np.float32),
                 np.array([0, 0, 0]))
    writer.commit()
    assert writer.metrics() == {"labelled": 3, "correct": 1, "accuracy": 1 / 3, "not_finite": 2}
    assert [(r["id"], r["correct"]) for r in _rows(out)] == [("nan", "false"), ("inf", "false"), ("fine", "true")]


# --- issue 34: what predict may write, labels as users store them, signals and pipes -----------------------------


@pytest.mark.slow
def test_outputs_over_a_runs_files_or_for_a_missing_run_are_refused_and_create_nothing(image_run, csv_run, small_png,
                                                                                      tmp_path):
    """No --output may replace a file of a run directory (this run's or another's), its record included, or the
    data the run reads; a check that fails creates no folder; text labels that are not class names and numbers
    beyond float32 are data errors. All refused before TensorFlow starts, each file byte for byte as it was."""
    from recipes.make_examples import mnist  # noqa: PLC0415

    before = {p.name: p.read_bytes() for p in image_run.iterdir() if p.is_file()}
    digits = mnist(20)
    npz = tmp_path / "digits.npz"
    np.savez(npz, x=digits["x_test"], y=digits["y_test"])
    for output, over in ((image_run / "metrics.csv", "metrics.csv"), (image_run / "summary", "summary.json"),
                         (csv_run / "metrics.csv", "metrics.csv")):
        result = _predict(str(image_run), str(npz), "-o", str(output), code=2)
        assert f"would write over {output.parent / over}, a file of the run directory" in result.stderr
        one_paragraph(result.stderr.split("Fix:")[0])
    assert {p.name: p.read_bytes() for p in image_run.iterdir() if p.is_file()} == before
    # nor the data the run reads (copies here, the runs pointed at them with --set): its CSV, a file in its image
    # folder; refused once the run is read, still before TensorFlow
    data = tmp_path / "data"
    shutil.copytree(small_png / "test" / "7", data / "folder" / "7")
    shutil.copy(CANCER, data / "cancer.csv")
    kept = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    for run, given, output, key, value in (
            (csv_run, CANCER, data / "cancer.csv", "data.path", data / "cancer.csv"),
            (image_run, npz, data / "folder" / "7" / "p.csv", "data.validation_path", data / "folder")):
        result = _predict(str(run), str(given), "-o", str(output), "--set", f"{key}={value}", code=2)
        assert f"the training data ({key}: {value})" in result.stderr, result.stderr
        one_paragraph(result.stderr.split("Fix:")[0])
    assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == kept
    # a new file in the run directory may be written, and replaced by a later prediction (its record says what
    # it is); a file of the user's there may not
    from tfgpu.serving.predict import check_output  # noqa: PLC0415

    _predict(str(image_run), str(npz), "-o", str(image_run / "preds.csv"))
    assert json.loads((image_run / "preds.csv.json").read_text())["count"] == 20
    assert check_output(str(image_run / "preds.csv")) == image_run / "preds.csv"
    (image_run / "notes.csv").write_text("mine")
    refused = _predict(str(image_run), str(npz), "-o", str(image_run / "notes.csv"), code=2)
    assert "would write over" in refused.stderr and (image_run / "notes.csv").read_text() == "mine"
    for name in ("preds.csv", "preds.csv.json", "notes.csv"):
        (image_run / name).unlink()
    # a missing run: exit 5, and the output's folders are not made
    missing = _predict(str(tmp_path / "no-run"), str(npz), "-o", str(tmp_path / "out" / "new1" / "p.csv"), code=5)
    assert "is not a run directory" in missing.stderr and not (tmp_path / "out").exists()
    words = tmp_path / "words.npz"
    np.savez(words, x=digits["x_test"], y=np.array(["seven"] * 20))
    refused = _predict(str(image_run), str(words), code=5)
    assert "y holds text labels 'seven', which are not the run's class names (0, 1, 2" in refused.stderr
    one_paragraph(refused.stderr.split("Fix:")[0])
    header, *rows = list(csv.reader(CANCER.open()))
    rows[1][2] = "1e39"
    huge = tmp_path / "huge.csv"
    with huge.open("w", newline="") as f:
        csv.writer(f).writerows([header, *rows[:4]])
    refused = _predict(str(csv_run), str(huge), code=5)
    assert f"line 3, column '{header[2]}' is '1e39', beyond float32's range" in refused.stderr
    np.save(tmp_path / "huge.npy", np.full((2, 30), 1e39))
    refused = _predict(str(csv_run), str(tmp_path / "huge.npy"), code=5)
    assert "holds 1e+39 at sample 0 (index [0, 0]); every value must be a finite number within float32's range" \
        in refused.stderr


@pytest.mark.slow
def test_one_hot_and_named_labels_and_symlinked_class_folders_are_read_as_training_reads_them(image_run, png,
                                                                                              tmp_path):
    """One predict over a tree of linked class folders and the same digits as .npz with integer, one-hot and
    class-name labels: every form labels every sample as the integers do, and the linked folders are walked."""
    from recipes.make_examples import mnist  # noqa: PLC0415

    digits = mnist(200)
    x, y = digits["x_test"], digits["y_test"]
    np.savez(tmp_path / "int.npz", x=x, y=y)
    np.savez(tmp_path / "onehot.npz", x=x, y=np.eye(10, dtype=np.float32)[y])
    np.savez(tmp_path / "names.npz", x=x, y=y.astype(str))
    tree = tmp_path / "tree"
    tree.mkdir()
    for digit in ("3", "8"):
        (tree / digit).symlink_to(png / "test" / digit, target_is_directory=True)
    out = tmp_path / "p.csv"
    _predict(str(image_run), str(tree), *(str(tmp_path / f"{n}.npz") for n in ("int", "onehot", "names")),
             "-o", str(out))
    rows = _rows(out)
    by_input = {name: [r for r in rows if r["id"].startswith(str(tmp_path / f"{name}.npz"))]
                for name in ("int", "onehot", "names")}
    assert [r["label"] for r in by_input["int"]] == [str(c) for c in y]
    for name in ("onehot", "names"):
        assert [(r["label"], r["correct"]) for r in by_input[name]] == [(r["label"], r["correct"])
                                                                        for r in by_input["int"]], name
    linked = [r for r in rows if r["id"].startswith(str(tree))]
    assert len(linked) == len(list((png / "test" / "3").iterdir())) + len(list((png / "test" / "8").iterdir()))
    assert {r["label"] for r in linked} == {"3", "8"}
    record = json.loads((tmp_path / "p.csv.json").read_text())
    assert record["count"] == len(rows) == len(linked) + 600 and record["labelled"] == len(rows)


@pytest.fixture(scope="module")
def many_digits(tmp_path_factory) -> Path:
    """60,000 real test digits (the 10,000 six times) as one .npz: a prediction of several seconds."""
    from recipes.make_examples import mnist  # noqa: PLC0415

    digits = mnist(10000)
    path = tmp_path_factory.mktemp("many") / "many.npz"
    np.savez(path, x=np.concatenate([digits["x_test"]] * 6))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("signum, code, says", [(signal.SIGTERM, 75, "preempted: tfgpu predict: SIGTERM arrived"),
                                              (signal.SIGINT, 130, "interrupted")], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_predicting_exits_with_its_code_and_leaves_no_temporary_file(image_run, many_digits,
                                                                                        tmp_path, signum, code, says):
    """SIGTERM (or Ctrl-C) once the rows' temporary file is open: exit 75, try again (130 for Ctrl-C) with one
    paragraph, and no ``.p.csv.<pid>.tmp`` nor p.csv left (SIGTERM's default action exited 143 and left the file)."""
    got, stderr = signal_when(tmp_path, ".p.csv.*.tmp", "predict", str(image_run), str(many_digits),
                              "-o", str(tmp_path / "p.csv"), signum=signum)
    assert got == code, stderr[-3000:]
    assert f"tfgpu: {says}" in stderr and "Traceback" not in stderr, stderr[-3000:]
    if signum == signal.SIGTERM:
        assert "SIGTERM arrived while predicting 60,000 samples" in stderr
    one_paragraph(stderr[stderr.index("tfgpu: "):].split("Fix:")[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_pipe_closed_by_its_reader_ends_predict_quietly_with_141(image_run, many_digits):
    """``tfgpu predict RUN x.npz | head -3``: three rows, then exit 141 as for SIGPIPE, no message (it was 1,
    the code of an internal error)."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from ..conftest import ROOT, child_env  # noqa: PLC0415

    line = (f"'{sys.executable}' -m tfgpu.cli predict '{image_run}' '{many_digits}' | head -3; "
            'echo "${PIPESTATUS[0]}"')
    done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=300)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("id,class,probability,top_k") and len(lines) == 4, done.stdout
    assert lines[-1] == "141", done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr[-3000:]
