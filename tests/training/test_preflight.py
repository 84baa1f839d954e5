"""``tfgpu plan`` as a pre-flight check (the same checks, messages and exit codes as ``tfgpu run`` before
TensorFlow starts), its summary of the run, and ``tfgpu run --dry-run`` (everything before the run directory)."""

from __future__ import annotations

import json
import pytest

from ..conftest import ROOT, copy_run, one_paragraph, run_cli, run_python

BREAST = "recipes/breast_cancer.yaml"
MNIST = "recipes/mnist.yaml"

NO_MODEL = """\
data:
  kind: csv
  path: ${TFGPU_DATA_DIR}/breast_cancer/breast_cancer.csv
  label: target
"""

#: (recipe, --set overrides, exit code, a fragment of the message): what issue 22 found `plan` let through.
CASES = {
    "optimizer": (MNIST, ["model.optimizer=adamm"], 3, "model.optimizer: 'adamm' is not a Keras optimizer. "
                                                       "Did you mean 'adam'?"),
    "loss": (MNIST, ["model.loss=categorical_crosentropy"], 3,
             "model.loss: 'categorical_crosentropy' is not a Keras loss. Did you mean 'categorical_crossentropy'?"),
    "layer": (MNIST, ["model.layers=[{Dens: {units: 10}}]"], 3,
              "model.layers[0]: 'Dens' is not a Keras layer. Did you mean 'Dense'?"),
    "metric": (MNIST, ["model.metrics=[accuracy, top_k_categorical_acuracy]"], 3,
               "model.metrics[1]: 'top_k_categorical_acuracy' is not a Keras metric. "
               "Did you mean 'top_k_categorical_accuracy'?"),
    "no_model": ("NO_MODEL", [], 3, "model: the recipe defines no model"),
    "builder": (MNIST, ["model.layers=null", "model.builder=no_such_module:build"], 3,
                "model.builder: cannot import module 'no_such_module'"),
    "data_path": (BREAST, ["data.path=nope.csv"], 5, "data.path: 'nope.csv' does not exist"),
    "label": (BREAST, ["data.label=diagnosis"], 5, "has no column 'diagnosis'"),
    "images_missing": ("IMAGES", [], 5, "data.path: 'examples/mnist_png/train' does not exist"),
}


def _args(case: str, tmp_path) -> tuple[list[str], object]:
    """The CLI arguments of a case and the folder to run it in (an empty one: no examples/ there)."""
    recipe, sets, _, _ = CASES[case]
    if recipe == "NO_MODEL":
        (tmp_path / "no_model.yaml").write_text(NO_MODEL)
        recipe = str(tmp_path / "no_model.yaml")
    elif recipe == "IMAGES":
        recipe = str(ROOT / "recipes" / "mnist_images.yaml")  # its data.path is relative: examples/... in tmp_path
    else:
        recipe = str(ROOT / recipe)
    return [recipe, *[a for s in sets for a in ("--set", s)]], tmp_path


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_fails_as_run_does_before_tensorflow(case, tmp_path):
    args, cwd = _args(case, tmp_path)
    code, fragment = CASES[case][2], CASES[case][3]
    planned = run_cli("plan", *args, cwd=cwd)
    assert planned.returncode == code, planned.stdout + planned.stderr
    assert fragment in planned.stderr
    one_paragraph(planned.stderr)
    assert planned.stdout == ""  # no plan is printed for a recipe that cannot run
    out = tmp_path / "runs"
    ran = run_cli("run", *args, "--output-dir", str(out), cwd=cwd)
    assert ran.returncode == code, ran.stderr[-3000:]
    assert ran.stderr == planned.stderr  # the same message, word for word
    assert not out.exists()


def test_plan_checks_take_well_under_a_second_without_tensorflow(tmp_path):
    """Each case through the real `plan` command in one process: timed, and TensorFlow/Keras never imported."""
    runs = [(_args(case, tmp_path)[0], CASES[case][2]) for case in sorted(CASES)]
    ok = [str(ROOT / BREAST), "--set", "train.epochs=3"]
    result = run_python(f"""
        import json, os, sys, time
        from click.testing import CliRunner
        from tfgpu.cli import main
        os.chdir({str(tmp_path)!r})
        seconds = []
        for args, code in {runs!r} + [({ok!r}, 0)]:
            started = time.perf_counter()
            got = CliRunner().invoke(main, ["plan", *args])
            seconds.append(time.perf_counter() - started)
            assert got.exit_code == code, (args, got.exit_code, got.output)
        print(json.dumps({{"seconds": seconds, "tf": "tensorflow" in sys.modules, "keras": "keras" in sys.modules}}))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert not found["tf"] and not found["keras"]
    assert max(found["seconds"]) < 1.0, found["seconds"]


@pytest.mark.slow
def test_file_parsed_keras_names_equal_the_imported_modules():
    """The names `plan` reads from Keras's files are exactly the classes the imported modules export."""
    result = run_python("""
        import json
        import keras
        from keras.optimizers import schedules
        from tfgpu.model.keras_model import file_names, imported_names
        kinds = {"layer": (keras.layers, keras.layers.Layer), "optimizer": (keras.optimizers, keras.optimizers.Optimizer),
                 "loss": (keras.losses, keras.losses.Loss), "metric": (keras.metrics, keras.metrics.Metric),
                 "schedule": (schedules, schedules.LearningRateSchedule),
                 "callback": (keras.callbacks, keras.callbacks.Callback)}
        out = {}
        for kind, (module, base) in kinds.items():
            real, parsed = imported_names(kind, module, base), file_names(kind)
            out[kind] = {"count": len(real), "same": real == parsed,
                         "only_imported": sorted(set(real) - set(parsed or {})),
                         "only_parsed": sorted(set(parsed or {}) - set(real))}
        print(json.dumps(out))
    """, TF_CPP_MIN_LOG_LEVEL="3")
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    for kind, row in found.items():
        assert row["same"], (kind, row)
        assert row["count"] > 10, (kind, row)
    assert found["layer"]["count"] > 100 and found["loss"]["count"] > 20


def test_plan_shows_what_the_run_trains():
    result = run_cli("plan", BREAST, "--set", "train.epochs=3", "--set", "devices.cpu_logical_devices=2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    block = lines[lines.index(next(line for line in lines if line.startswith("Run ("))):]
    assert "  data: csv ${TFGPU_DATA_DIR}/breast_cancer/breast_cancer.csv (label: target)" in block
    assert "  validation: 20% of the training samples (data.validation_split); test: none" in block
    assert "  model: 2 layers: Dense, Dense" in block
    assert "  loss: binary_crossentropy; optimizer: adam (learning_rate=0.01); metrics: accuracy" in block
    assert "  epochs: 3; loop: fit; batch: 32 per replica x 2 replicas = 64 global" in block
    assert result.stdout.index("Run (") < result.stdout.index("Strategy: mirrored")  # then the device plan

    data = json.loads(run_cli("plan", BREAST, "--json", "--set", "train.epochs=3",
                              "--set", "devices.cpu_logical_devices=2").stdout)
    train = data["run"]["train"]
    assert train["epochs"] == 3 and train["num_replicas"] == 2
    assert train["global_batch_size"] == train["batch_size_per_replica"] * train["num_replicas"] == 64
    assert data["run"]["model"]["layers"] == ["Dense", "Dense"] and data["run"]["data"]["validation_split"] == 0.2
    assert data["run"]["files_checked"] is True


#: Where a recipe names user code as 'package.module:name' (``--set`` overrides of the breast-cancer recipe).
USER_CODE = {
    "train.callbacks": ["train.callbacks=['evilpkg.cb:Foo']"],
    "model.builder": ["model.layers=null", "model.builder=evilpkg.cb:build"],
    "data.builder": ["data={kind: builder, builder: 'evilpkg.cb:data'}"],
    "namespace package": ["train.callbacks=['nspkg.cb:Foo']"],  # a folder without __init__.py
}
#: Modules `plan` cannot find, exit 3: the first two with the words of before issue 34; a parent that is no
#: package in ``import``'s words (``importlib.util.find_spec`` said "__path__ attribute not found on ...").
NOT_FOUND = {
    "nopkg.cb:Foo": "train.callbacks[0]: cannot import module 'nopkg.cb' (received 'nopkg.cb:Foo'): "
                    "No module named 'nopkg'.",
    "evilpkg.nope:Foo": "train.callbacks[0]: cannot import module 'evilpkg.nope' (received 'evilpkg.nope:Foo'): "
                        "No module named 'evilpkg.nope'.",
    "evilpkg.cb.sub:Foo": "train.callbacks[0]: cannot import module 'evilpkg.cb.sub' (received "
                          "'evilpkg.cb.sub:Foo'): No module named 'evilpkg.cb.sub'; 'evilpkg.cb' is not a package.",
}


def test_plan_finds_user_modules_without_running_them(tmp_path):
    """Issue 34: `plan` runs nothing. A package in the current directory named by train.callbacks, model.builder
    or data.builder is found, but neither its __init__.py nor the module is run (each writes a marker file)."""
    marker = tmp_path / "ran"
    for folder, code in (("evilpkg", "__init__.py"), ("evilpkg", "cb.py"), ("nspkg", "cb.py")):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / code).write_text(f"open({str(marker)!r}, 'a').write('{folder}/{code} ran\\n')\n")
    for key, sets in USER_CODE.items():
        result = run_cli("plan", str(ROOT / BREAST), *[a for s in sets for a in ("--set", s)], cwd=tmp_path)
        assert result.returncode == 0, (key, result.stderr)
        assert "Run (" in result.stdout
        assert not marker.exists(), (key, marker.read_text())
    for name, message in NOT_FOUND.items():
        result = run_cli("plan", str(ROOT / BREAST), "--set", f"train.callbacks=['{name}']", cwd=tmp_path)
        assert result.returncode == 3, result.stderr
        assert message in result.stderr
        one_paragraph(result.stderr)
        assert not marker.exists(), (name, marker.read_text())


def test_plan_without_recipe_or_for_launch_checks_no_model():
    """The defaults have no model: `plan` alone (tfgpu.setup()'s settings) and `plan --launch` still plan."""
    for args in ([], ["--launch"], [MNIST, "--launch", "--set", "model.optimizer=adamm"]):
        result = run_cli("plan", *args)
        assert result.returncode == 0, result.stderr
        assert "Run (" not in result.stdout and "Strategy:" in result.stdout


def test_plan_for_another_machine_does_not_read_local_files(tmp_path):
    facts = json.loads(run_cli("devices", "--json", "--no-tensorflow").stdout)
    saved = tmp_path / "facts.json"
    saved.write_text(json.dumps(facts))
    result = run_cli("plan", BREAST, "--machine", str(saved), "--set", "data.path=/on/the/cluster.csv")
    assert result.returncode == 0, result.stderr
    assert "data files were not checked" in result.stdout
    bad = run_cli("plan", BREAST, "--machine", str(saved), "--set", "model.loss=binary_crosentropy")
    assert bad.returncode == 3 and "Did you mean 'binary_crossentropy'?" in bad.stderr


def test_plan_help_says_workers_starts_nothing():
    result = run_cli("plan", "--help")
    assert "Plan as worker 0 of N local workers" in result.stdout
    assert "Start N local worker processes" not in result.stdout
    assert "--dry-run" in run_cli("run", "--help").stdout


@pytest.mark.slow
def test_dry_run_checks_everything_and_writes_nothing(tmp_path):
    out = tmp_path / "runs"
    result = run_cli("run", str(ROOT / BREAST), "--dry-run", "--output-dir", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dry run passed" in result.stdout and "run on two training samples" in result.stdout
    assert "data: CSV" in result.stdout and "train 455, validation 114" in result.stdout
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no start-up log, cache or run directory anywhere here


@pytest.mark.slow
def test_dry_run_with_resume_of_a_new_directory_creates_nothing(tmp_path):
    target = tmp_path / "requeued"
    result = run_cli("run", BREAST, "--dry-run", "--resume", str(target))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"would write a new run directory in {target}" in result.stdout
    assert not target.exists()


@pytest.mark.slow
@pytest.mark.parametrize("sets, fragment", [
    (["model.layers=[{Conv2D: {filters: 4, kernel_size: 3}}, Flatten, {Dense: {units: 1, activation: sigmoid}}]"],
     "model.layers: the layers do not fit inputs of shape (30,)"),
    (["model.layers=[{Dense: {units: 2, activation: softmax}}]", "model.loss=categorical_crossentropy"],
     "model.loss: 'categorical_crossentropy' does not fit the labels"),
])
def test_dry_run_catches_a_model_that_does_not_fit_the_data(sets, fragment, tmp_path):
    args = [a for s in sets for a in ("--set", s)]
    assert run_cli("plan", BREAST, *args).returncode == 0  # names and files are fine: plan cannot know
    out = tmp_path / "runs"
    result = run_cli("run", BREAST, "--dry-run", *args, "--output-dir", str(out))
    assert result.returncode == 3, result.stdout + result.stderr[-3000:]
    assert fragment in result.stderr
    assert not out.exists()


def test_dry_run_refuses_workers_with_a_pointer_to_plan(tmp_path):
    result = run_cli("run", BREAST, "--dry-run", "--workers", "2", "--output-dir", str(tmp_path / "runs"))
    assert result.returncode == 2
    assert "tfgpu plan RECIPE --workers 2" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_dry_run_stops_at_a_config_error_before_tensorflow(tmp_path):
    result = run_cli("run", MNIST, "--dry-run", "--set", "model.optimizer=adamm")
    assert result.returncode == 3 and "Did you mean 'adam'?" in result.stderr
    assert "cuInit" not in result.stderr and "tensorflow" not in result.stderr.lower()


def test_images_recipe_plans_once_its_examples_exist(tmp_path):
    """The same recipe passes `plan` once its folders are there (a few real grey PNGs, written with Pillow)."""
    from PIL import Image  # noqa: PLC0415

    for split in ("train", "test"):
        for digit in ("0", "1"):
            folder = tmp_path / "examples" / "mnist_png" / split / digit
            folder.mkdir(parents=True)
            for n in range(10):
                Image.new("L", (28, 28), color=n * 20).save(folder / f"{n:05d}.png")
    result = run_cli("plan", str(ROOT / "recipes" / "mnist_images.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "  data: image_folder examples/mnist_png/train" in result.stdout
    assert "  validation: 10% of the training samples (data.validation_split); test: examples/mnist_png/test" \
        in result.stdout


@pytest.mark.slow  # it trains one epoch first (about 10 s, more on a busy machine)
def test_dry_run_resume_checks_the_run_as_run_does_and_writes_nothing(tmp_path, breast_run):
    """A finished run: `--resume --dry-run` refuses it (8), and a changed setting (3), with `run`'s own
    messages, leaving every file of the run as it was. Reads a copy of the shared breast-cancer run (5 epochs)."""
    run_dir = copy_run(breast_run, tmp_path)

    def files():
        return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(run_dir.rglob("*"))}

    before = files()
    for extra, code, fragment in (([], 8, "the run already completed (5 epochs)"),
                                  (["--set", "train.batch_size_per_replica=16"], 3,
                                   "train.batch_size_per_replica: 32 in the run, 16 now")):
        dry = run_cli("run", "--resume", str(run_dir), "--dry-run", *extra)
        assert dry.returncode == code and fragment in dry.stderr, dry.stderr[-3000:]
        real = run_cli("run", "--resume", str(run_dir), *extra)
        assert real.returncode == code and real.stderr == dry.stderr
    assert files() == before
