"""``output.mlflow``: runs tracked in a real MLflow tracking server (``mlflow server``, SQLite backend, 127.0.0.1),
checked through ``MlflowClient``: parameters, per-epoch metrics, tags, artifacts, status; ``--resume`` continues
the same MLflow run; sweep trials are child runs; an unreachable server is exit 11 before training, or a warning
with ``required: false``. The fast tests at the top need neither TensorFlow nor a server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tfgpu.config import load_config
from tfgpu.errors import ConfigError, TrackingError
from tfgpu.tracking import mlflow as tracking

from ..conftest import RECIPES, child_env, one_paragraph, only_run_dir, run_cli, run_python
from ..training.test_faults import start, summary_of, wait_for

RECIPE = str(RECIPES / "breast_cancer.yaml")
EPOCHS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- fast: no TensorFlow, no server ------------------------------------------------------------------------------


def test_output_mlflow_is_off_by_default_and_true_or_a_mapping_turns_it_on():
    assert load_config(RECIPE).output.mlflow is None
    assert load_config(RECIPE, overrides=["output.mlflow=false"]).output.mlflow is None
    on = load_config(RECIPE, overrides=["output.mlflow=true"]).output.mlflow
    assert (on.tracking_uri, on.experiment, on.run_name, on.required, on.log_model) == (None, None, None, True, False)
    given = load_config(RECIPE, overrides=["output.mlflow={tracking_uri: 'http://h:5000', required: false}"])
    assert given.output.mlflow.tracking_uri == "http://h:5000" and given.output.mlflow.required is False
    assert load_config(RECIPE, overrides=["output.mlflow.experiment=tumours"]).output.mlflow.experiment == "tumours"


@pytest.mark.parametrize("item, says", [
    ("output.mlflow.tracking_url=http://h:5000", "Did you mean 'output.mlflow.tracking_uri'?"),
    ("output.mlflow=3", "expected true, false or a mapping of tracking_uri, experiment"),
    ("output.mlflow.log_model=1", "output.mlflow.log_model"),
    ("output.mlflow.experiment=''", "output.mlflow.experiment"),
])
def test_a_wrong_output_mlflow_is_a_configuration_error_naming_the_key(item, says):
    with pytest.raises(ConfigError) as caught:
        load_config(RECIPE, overrides=[item])
    assert says in str(caught.value)
    one_paragraph(str(caught.value))


def test_the_settings_become_dotted_parameters_within_mlflows_limits():
    params = tracking.params_of(load_config(RECIPE, overrides=["train.epochs=3"]))
    assert params["train.epochs"] == "3" and params["model.optimizer.learning_rate"] == "0.01"
    assert params["model.metrics"] == '["accuracy"]' and params["output.save_model"] == "true"
    assert params["model.application"] == "null" and params["data.kind"] == "csv"
    long = tracking._flat({"a": {"b": "x" * 7000}})
    assert len(long["a.b"]) == tracking.PARAM_VALUE_CHARS


def test_where_tracking_goes_and_which_stores_need_a_server(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    settings = load_config(RECIPE, overrides=["output.mlflow=true"]).output.mlflow
    assert tracking.tracking_uri(settings) is None
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://from-env:5000")
    assert tracking.tracking_uri(settings) == "http://from-env:5000"
    assert tracking.tracking_uri(settings.model_copy(update={"tracking_uri": "http://key:1"})) == "http://key:1"
    assert [tracking.is_local(u) for u in (None, "sqlite:///m.db", "file:///tmp/x", "mlruns", "http://h:1",
                                           "https://h", "databricks")] == [True, True, True, True, False, False, True]
    assert tracking._absolute("sqlite:///m.db", "/runs/here") == "sqlite:////runs/here/m.db"
    assert tracking._absolute("file:./mlruns", "/w") == "file:///w/mlruns"
    assert tracking._absolute("http://h:1") == "http://h:1"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    recorded = {"cwd": "/first", "mlflow": {"tracking_uri": "sqlite:////first/mlflow.db"}}
    assert tracking.resolved_uri(settings, recorded) == "sqlite:////first/mlflow.db"  # a resume keeps its store
    relative = settings.model_copy(update={"tracking_uri": "sqlite:///t.db"})
    assert tracking.resolved_uri(relative, recorded) == "sqlite:////first/t.db"  # from where the run started


def test_importing_tfgpu_imports_neither_mlflow_nor_tensorflow():
    result = run_python("""
        import sys
        import tfgpu, tfgpu.tracking.mlflow, tfgpu.training.runner, tfgpu.training.trainer, tfgpu.training.preflight
        print(sorted(m for m in ("mlflow", "tensorflow", "keras") if m in sys.modules))
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


def test_without_the_mlflow_package_it_is_a_configuration_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # find_spec then says: not installed
    cfg = load_config(RECIPE, overrides=["output.mlflow=true"])
    with pytest.raises(ConfigError) as caught:
        tracking.check(cfg)
    assert "pip install 'tfgpu[mlflow]'" in str(caught.value) and caught.value.exit_code == 3
    one_paragraph(caught.value.report())
    tracking.check(load_config(RECIPE))  # off: nothing is needed


def test_an_unreachable_server_is_exit_11_or_a_warning_and_the_environment_is_left_as_it_was(capsys):
    uri = f"http://127.0.0.1:{free_port()}"
    cfg = load_config(RECIPE, overrides=[f"output.mlflow.tracking_uri={uri}"])
    started = time.perf_counter()
    with pytest.raises(TrackingError) as caught:
        tracking.check(cfg)
    assert time.perf_counter() - started < 10  # one try, no retry loop
    error = caught.value
    assert error.exit_code == 11 and "output.mlflow.tracking_uri" in error.message and uri in error.message
    assert "Connection refused" in error.message and "required: false" in error.hint
    one_paragraph(error.report())
    loose = load_config(RECIPE, overrides=[f"output.mlflow={{tracking_uri: '{uri}', required: false}}"])
    try:
        tracking.check(loose)  # a warning; the run would train without tracking
        assert uri in tracking._UNREACHABLE
    finally:
        tracking._UNREACHABLE.discard(uri)
    assert "warning: output.mlflow" in capsys.readouterr().out
    # the autouse fixture _no_env_leak checks that MLFLOW_HTTP_REQUEST_* were restored


# --- a real MLflow tracking server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``mlflow server`` with its SQLite backend on a free port of 127.0.0.1: its URI (about 6 s to start)."""
    where = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    log = open(where / "server.log", "w")
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
         f"sqlite:///{where / 'mlflow.db'}", "--artifacts-destination", str(where / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=where, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        # no job runner: 2 processes, not 9; the server is MLflow's own, with every package of the full install
        env=child_env(needs=("mlflow",), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start:\n{(where / 'server.log').read_text()[-3000:]}")
            time.sleep(0.25)
        yield uri
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # the server and its uvicorn worker
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def client(server):
    from mlflow import MlflowClient  # noqa: PLC0415

    return MlflowClient(tracking_uri=server)


def tracked_run(tmp_path: Path, server: str, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    result = run_cli("run", RECIPE, "--set", f"train.epochs={EPOCHS}", "--set", f"output.mlflow.tracking_uri={server}",
                     *args, "--output-dir", str(tmp_path / "runs"), **env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result, only_run_dir(tmp_path / "runs")


def assert_metrics_match(client, run_id: str, rows: list[dict]) -> None:
    """Each figure of each epoch row is in the MLflow run's history once, at step = the epoch, to 1e-6."""
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate", "epoch_seconds",
                "samples_per_second"):
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == [int(r["epoch"]) for r in rows], key
        assert all(abs(m.value - r[key]) <= 1e-6 * max(1.0, abs(r[key])) for m, r in zip(history, rows)), key


@pytest.mark.slow
def test_a_run_logs_its_settings_epochs_tags_and_files(tmp_path, server, client):
    """A run tracked in the MLflow server logs its settings, each epoch's figures, its tags and its files (the model
    too, with log_model). Trains its own run: MLflow logs while a run trains, and no shared run is tracked."""
    result, run_dir = tracked_run(tmp_path, server, "--set", "output.mlflow.experiment=tfgpu-tests",
                                  "--set", "output.mlflow.log_model=true")
    summary = summary_of(run_dir)
    ref = summary["mlflow"]
    assert ref["tracking_uri"] == server and ref["experiment"] == "tfgpu-tests" and ref["epochs_logged"] == EPOCHS
    assert 0 < ref["log_seconds_median"] <= ref["log_seconds_max"] < 5
    assert f"MLflow run {ref['run_id']} in experiment 'tfgpu-tests'" in result.stdout
    run = client.get_run(ref["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert client.get_experiment(run.info.experiment_id).name == "tfgpu-tests" == ref["experiment"]
    params = run.data.params
    assert params["train.epochs"] == str(EPOCHS) and params["model.optimizer.learning_rate"] == "0.01"
    assert params["output.mlflow.log_model"] == "true" and params["data.kind"] == "csv"
    tags = run.data.tags
    assert tags["tfgpu.devices"] == "/device:CPU:0" and tags["tfgpu.replicas"] == "1"
    assert tags["tfgpu.global_batch_size"] == "32" and tags["tfgpu.strategy"] == "OneDeviceStrategy"
    assert tags["tfgpu.backend"] == "tensorflow" and tags["tfgpu.run_dir"] == str(run_dir.resolve())
    assert tags["tensorflow.version"] == summary["versions"]["tensorflow"]
    assert tags["keras.version"] == summary["versions"]["keras"]
    assert tags["tfgpu.version"] == summary["versions"]["tfgpu"]
    assert_metrics_match(client, ref["run_id"], summary["epochs"])
    files = {f.path for f in client.list_artifacts(ref["run_id"])}
    assert {"config.yaml", "config.resolved.yaml", "summary.json", "metrics.csv", "model.keras"} <= files


@pytest.mark.slow
def test_a_preempted_run_resumes_into_the_same_mlflow_run(tmp_path, server, client):
    """SIGTERM mid-training, then ``--resume``: the same MLflow run goes from KILLED to FINISHED, each epoch logged
    once. Trains its own run: it preempts a tracked run and resumes it, which a shared run must not suffer."""
    out = tmp_path / "runs"
    process = start(RECIPE, "--set", "train.epochs=12", "--set", f"output.mlflow.tracking_uri={server}",
                    "--set", "output.mlflow.experiment=tfgpu-resume", "--output-dir", str(out))

    def an_epoch_logged():  # metrics.csv has a header and at least one row
        dirs = list(out.iterdir()) if out.exists() else []
        csv = dirs[0] / "metrics.csv" if dirs else None
        return csv is not None and csv.is_file() and len(csv.read_text().splitlines()) >= 2 and dirs[0]

    run_dir = wait_for(an_epoch_logged, process, pause=0.01)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    first = summary_of(run_dir)
    if process.returncode == 0:
        pytest.skip("the run finished before the signal came")  # (12 epochs take about 2 s)
    assert process.returncode == 75, err[-3000:]
    run_id = first["mlflow"]["run_id"]
    assert first["status"] == "preempted" and client.get_run(run_id).info.status == "KILLED"
    assert 0 < first["epochs_completed"] < 12
    result = run_cli("run", "--resume", str(run_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["mlflow"]["run_id"] == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["tfgpu.restarts"] == "1"
    assert len(summary["epochs"]) == 12
    assert_metrics_match(client, run_id, summary["epochs"])  # steps 0-11, each once, across both processes
    assert len(client.search_runs([run.info.experiment_id])) == 1


@pytest.mark.slow
def test_a_run_with_the_parent_run_id_is_a_child_of_the_sweeps_run(tmp_path, server, client):
    """A run started with a sweep's parent-run environment is that parent's child, and the custom loop logs its
    epochs as fit does. Trains its own run: it must train under the parent run's environment, which no shared run
    has."""
    cfg = load_config(RECIPE, overrides=[f"output.mlflow.tracking_uri={server}",
                                         "output.mlflow.experiment=tfgpu-sweep"])
    parent = tracking.start_parent_run(cfg, "sweep-1", {"space": {"lr": [0.001, 0.1]}, "trials": 1},
                                       {"tfgpu.sweep.study": "s1"})
    assert parent is not None and parent["tracking_uri"] == server
    env = tracking.child_environment(parent)
    assert env == {tracking.PARENT_RUN_ENV: parent["run_id"], "MLFLOW_TRACKING_URI": server}
    result = run_cli("run", RECIPE, "--set", f"train.epochs={EPOCHS}", "--set", "output.mlflow=true",
                     "--set", "train.loop=custom", "--output-dir", str(tmp_path / "runs"), **env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = summary_of(only_run_dir(tmp_path / "runs"))
    child = client.get_run(summary["mlflow"]["run_id"])
    assert child.data.tags["mlflow.parentRunId"] == parent["run_id"]
    assert child.info.experiment_id == parent["experiment_id"] and child.info.status == "FINISHED"
    assert_metrics_match(client, child.info.run_id, summary["epochs"])  # the custom loop logs as fit does
    tracking.log_parent_metrics(parent, {"best_val_loss": summary["final_metrics"]["val_loss"]}, step=0)
    tracking.end_parent_run(parent, "completed")
    run = client.get_run(parent["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["space.lr"] == "[0.001, 0.1]"
    assert run.data.tags["tfgpu.sweep.study"] == "s1" and run.data.tags["tfgpu.sweep"] == "parent"
    assert run.data.metrics["best_val_loss"] == pytest.approx(summary["final_metrics"]["val_loss"])


def test_an_unreachable_server_stops_the_run_before_training_with_exit_11(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    for command in ("plan", "run"):
        result = run_cli(command, RECIPE, "--set", f"output.mlflow.tracking_uri={uri}",
                         "--set", f"output.dir={tmp_path / 'runs'}")
        assert result.returncode == 11, result.stdout[-2000:] + result.stderr[-3000:]
        assert result.stderr.startswith("tfgpu: tracking error: output.mlflow.tracking_uri"), result.stderr
        assert uri in result.stderr and "Connection refused" in result.stderr
        one_paragraph(result.stderr)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_an_unreachable_server_with_required_false_trains_without_tracking(tmp_path):
    """An unreachable server with ``required: false``: a warning, then the run trains to the end untracked.
    Trains its own run: the training after the warning is the subject, and no shared run sets output.mlflow."""
    uri = f"http://127.0.0.1:{free_port()}"
    result = run_cli("run", RECIPE, "--set", "train.epochs=2",
                     "--set", f"output.mlflow={{tracking_uri: '{uri}', required: false}}",
                     "--output-dir", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"tfgpu: warning: output.mlflow: the MLflow tracking server at '{uri}'" in result.stdout
    assert "trains without tracking" in result.stdout and "MLflow run" not in result.stdout
    summary = summary_of(only_run_dir(tmp_path / "runs"))
    assert summary["status"] == "completed" and "mlflow" not in summary and len(summary["epochs"]) == 2


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy 2 on MLflow's store
def test_a_local_sqlite_store_from_mlflow_tracking_uri_needs_no_server(tmp_path):
    """``MLFLOW_TRACKING_URI`` naming a local SQLite file tracks the run there, with no server. Trains its own run:
    MLflow logs while a run trains, and no shared run is tracked."""
    uri = f"sqlite:///{tmp_path / 'local.db'}"
    result = run_cli("run", RECIPE, "--set", "train.epochs=2", "--set", "output.mlflow=true",
                     "--output-dir", str(tmp_path / "runs"), cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = summary_of(only_run_dir(tmp_path / "runs"))
    assert summary["mlflow"]["tracking_uri"] == uri and summary["mlflow"]["experiment"] == "breast_cancer"
    from mlflow import MlflowClient  # noqa: PLC0415

    local = MlflowClient(uri)
    run = local.get_run(summary["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["train.epochs"] == "2"
    assert_metrics_match(local, run.info.run_id, summary["epochs"])
    assert {f.path for f in local.list_artifacts(run.info.run_id)} == {"config.resolved.yaml", "config.yaml",
                                                                      "metrics.csv", "summary.json"}


@pytest.mark.slow
def test_a_sweep_is_a_run_whose_trials_are_its_child_runs(tmp_path, server, client):
    """A sweep is a parent MLflow run holding its best value and files, and its two trials are its child runs.
    Trains its own runs: the sweep's trials are the subject."""
    import csv  # noqa: PLC0415

    pytest.importorskip("optuna", reason="the test extra installs optuna (tfgpu[sweep])")
    result = run_cli("sweep", str(Path(RECIPE).with_name("breast_cancer_sweep.yaml")), "--trials", "2", "--parallel",
                     "2", "--set", "train.epochs=2", "--set", f"output.mlflow.tracking_uri={server}", "--set",
                     "output.mlflow.experiment=tfgpu-sweep-e2e", "--output-dir", str(tmp_path / "runs"), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    directory = next((tmp_path / "runs").glob("*-sweep-*"))
    parent_id = json.loads((directory / "sweep.json").read_text())["mlflow"]["run_id"]
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["tfgpu.sweep"] == "parent"
    assert parent.data.params["sweep.metric"] == "val_loss" and parent.data.params["sweep.trials"] == "2"
    assert {a.path for a in client.list_artifacts(parent_id)} == {"results.csv", "best.yaml"}  # (no sweep.json: a URL)
    rows = list(csv.DictReader((directory / "results.csv").open()))
    assert parent.data.metrics["best_val_loss"] == pytest.approx(min(float(r["val_loss"]) for r in rows))
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert len(children) == 2 and {c.info.status for c in children} == {"FINISHED"}
    trial_dirs = {str((tmp_path / r["run_dir"]).resolve()) for r in rows}
    assert {c.data.tags["tfgpu.run_dir"] for c in children} == trial_dirs
    for row in rows:  # each trial's run is the child run its summary names, with the trial's learning rate
        summary = summary_of(tmp_path / row["run_dir"])
        child = client.get_run(summary["mlflow"]["run_id"])
        assert child.data.tags["mlflow.parentRunId"] == parent_id
        assert float(child.data.params["model.optimizer.learning_rate"]) == pytest.approx(
            float(row["model.optimizer.learning_rate"]))


# --- credentials in URLs: never in a file, a log, a message or MLflow (issue 34, item 16) ------------------------


def secret() -> tuple[str, str]:
    """``(token, password)``: a password unique to the test, with '/', '@' and ':' in it; ``token`` is its start
    (searched for, so that a percent-encoded copy is found too)."""
    import uuid  # noqa: PLC0415

    token = f"pw{uuid.uuid4().hex}"
    return token, f"{token}/a@b:c"


def hits(token: str, *texts: str, folders: tuple[Path, ...] = ()) -> list[str]:
    """Where ``token`` occurs: in each text, and (as bytes) in every file under each folder, recursively."""
    found = [f"text {i}" for i, text in enumerate(texts) if token in text]
    for folder in folders:
        found += [str(p) for p in Path(folder).rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    return found


@pytest.mark.parametrize("item", [
    "output.mlflow.tracking_uri=http://alice:pa/ss@127.0.0.1:5000",
    "output.mlflow={tracking_uri: 'http://alice:pa/ss@127.0.0.1:5000', experiment: e}",
    "output={mlflow: {tracking_uri: 'http://alice:pa/ss@127.0.0.1:5000'}}",
])
def test_a_sweeps_set_items_lose_the_tracking_uris_credentials_before_sweep_json(item):
    """What a sweep saves of its --set items (sweep.json, the trials' command lines) holds no userinfo, whichever
    shape of --set names the tracking URI; the URI itself, and the other settings, stay (issue 34, item 16)."""
    from tfgpu.config.source import parse_override
    from tfgpu.experiments.sweep import without_credentials

    clean = without_credentials(item)
    assert "alice" not in clean and "pa/ss" not in clean, clean
    assert "127.0.0.1:5000" in clean and parse_override(clean)[0] == parse_override(item)[0]
    if "experiment" in item:
        assert parse_override(clean)[1]["experiment"] == "e"
    assert without_credentials("train.epochs=3") == "train.epochs=3"


@pytest.mark.parametrize("url, shown", [
    ("http://alice:s3cret@127.0.0.1:5000", "http://***@127.0.0.1:5000"),
    ("postgresql://alice:pa/ss@127.0.0.1:1/db", "postgresql://***@127.0.0.1:1/db"),  # '/': urlsplit ends at it
    ("mysql+pymysql://u:p@ss:w/rd@db.example:3306/x?charset=utf8",
     "mysql+pymysql://***@db.example:3306/x?charset=utf8"),
    ("http://alice@h:5000/", "http://***@h:5000/"),
    ("http://h:5000", "http://h:5000"), ("sqlite:////tmp/a@b.db", "sqlite:////tmp/a@b.db"),
    ("/tmp/study.journal", "/tmp/study.journal"),
])
def test_masked_hides_the_user_and_a_password_holding_slash_at_and_colon(url, shown):
    from tfgpu.utils.urls import masked  # noqa: PLC0415
    from tfgpu.utils.urls import credentials, redact  # noqa: PLC0415

    assert masked(url) == shown
    clean, user, password = credentials(url)
    assert clean == shown.replace("***@", "")
    if "***" in shown:
        assert password is None or (password not in masked(url) and password not in redact(f"x {url} {password}", url))


def test_a_password_in_the_tracking_uri_is_taken_out_as_the_config_is_read(monkeypatch):
    """The config keeps, dumps and logs the URI without userinfo; the credentials go to MLflow's variables."""
    for key in (tracking.USERNAME_ENV, tracking.PASSWORD_ENV, "MLFLOW_TRACKING_URI"):
        monkeypatch.setenv(key, "")  # (recorded: restored, or removed, after the test)
        monkeypatch.delenv(key)
    token, password = secret()
    cfg = load_config(RECIPE, overrides=[f"output.mlflow.tracking_uri=http://alice:{password}@127.0.0.1:5000"])
    assert cfg.output.mlflow.tracking_uri == "http://127.0.0.1:5000"
    assert not hits(token, cfg.to_yaml(), json.dumps(cfg.explicit_dict()), json.dumps(tracking.params_of(cfg)))
    tracking.export_credentials(cfg.output.mlflow)
    assert (os.environ[tracking.USERNAME_ENV], os.environ[tracking.PASSWORD_ENV]) == ("alice", password)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://bob:other%2Fpw@h:1")  # from the environment: same
    env_settings = load_config(RECIPE, overrides=["output.mlflow=true"]).output.mlflow
    assert tracking.tracking_uri(env_settings) == "http://h:1"
    tracking.export_credentials(env_settings)
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://h:1"
    assert (os.environ[tracking.USERNAME_ENV], os.environ[tracking.PASSWORD_ENV]) == ("bob", "other/pw")


def test_an_unreachable_server_with_a_password_never_shows_it(tmp_path, monkeypatch, capsys):
    for key in (tracking.USERNAME_ENV, tracking.PASSWORD_ENV):
        monkeypatch.setenv(key, "")  # (recorded: restored, or removed, after the test)
        monkeypatch.delenv(key)
    token, password = secret()
    port = free_port()
    uri = f"http://alice:{password}@127.0.0.1:{port}"
    with pytest.raises(TrackingError) as caught:
        tracking.check(load_config(RECIPE, overrides=[f"output.mlflow.tracking_uri={uri}"]))
    error = caught.value
    assert f"'http://127.0.0.1:{port}'" in error.message and tracking.PASSWORD_ENV in error.message
    assert not hits(token, error.report(), *capsys.readouterr())
    one_paragraph(error.report())
    result = run_cli("run", RECIPE, "--set", f"output.mlflow.tracking_uri={uri}", "--output-dir", str(tmp_path))
    assert result.returncode == 11, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"'http://127.0.0.1:{port}'" in result.stderr and "Connection refused" in result.stderr
    assert not hits(token, result.stdout, result.stderr, folders=(tmp_path,))


def test_a_sweeps_storage_password_is_in_no_message_and_not_in_sweep_json(tmp_path):
    """An unreachable (or driverless) ``postgresql://`` storage: the error and ``sweep.json`` show it masked, and
    ``--resume`` asks for the whole URL in TFGPU_SWEEP_STORAGE (it is written nowhere)."""
    pytest.importorskip("optuna", reason="the test extra installs optuna (tfgpu[sweep])")
    token, password = secret()
    storage = f"postgresql://alice:{password}@127.0.0.1:1/db"
    recipe = str(Path(RECIPE).with_name("breast_cancer_sweep.yaml"))
    result = run_cli("sweep", recipe, "--trials", "1", "--storage", storage, "--output-dir", str(tmp_path))
    assert result.returncode == 12, result.stdout[-2000:] + result.stderr[-3000:]
    assert "--storage: the study's storage 'postgresql://***@127.0.0.1:1/db' cannot be opened" in result.stderr
    one_paragraph(result.stderr)
    directory = next(tmp_path.glob("*-sweep-*"))
    assert json.loads((directory / "sweep.json").read_text())["storage"] == "postgresql://***@127.0.0.1:1/db"
    again = run_cli("sweep", "--resume", str(directory))
    assert again.returncode == 12 and "TFGPU_SWEEP_STORAGE" in again.stderr, again.stderr[-3000:]
    assert "export TFGPU_SWEEP_STORAGE='postgresql://USER:PASSWORD@127.0.0.1:1/db'" in again.stderr
    one_paragraph(again.stderr)
    given = run_cli("sweep", "--resume", str(directory), TFGPU_SWEEP_STORAGE=storage)
    assert given.returncode == 12 and "cannot be opened" in given.stderr, given.stderr[-3000:]  # (reopened: no driver)
    assert not hits(token, result.stdout, result.stderr, again.stdout, again.stderr, given.stdout, given.stderr,
                    folders=(tmp_path,))


def server_folder(tmp_path_factory) -> Path:
    """The module's ``mlflow server`` folder: its SQLite backend store, artifacts and log."""
    return next(Path(tmp_path_factory.getbasetemp()).glob("mlflow_server*"))


@pytest.mark.slow
def test_a_password_in_the_tracking_uri_reaches_no_file_log_message_or_mlflow(tmp_path, server, client,
                                                                              tmp_path_factory):
    """A run whose tracking URI holds ``alice:PASSWORD@`` logs to the server (which, without auth, ignores the
    credentials), and the password is in no file of the run directory, of the server's store and artifacts, in
    no output, and in no parameter or tag. Trains its own run (1 epoch): the credentials are the subject."""
    token, password = secret()
    uri = server.replace("http://", f"http://alice:{password}@")
    result = run_cli("run", RECIPE, "--set", "train.epochs=1", "--set", f"output.mlflow.tracking_uri={uri}",
                     "--set", "output.mlflow.experiment=tfgpu-credentials", "--output-dir", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    ref = summary_of(run_dir)["mlflow"]
    assert ref["tracking_uri"] == server and ref["epochs_logged"] == 1
    run = client.get_run(ref["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["output.mlflow.tracking_uri"] == server
    assert {"config.yaml", "config.resolved.yaml", "summary.json"} <= {f.path for f in client.list_artifacts(
        ref["run_id"])}
    assert not hits(token, result.stdout, result.stderr, json.dumps(run.data.params), json.dumps(run.data.tags),
                    folders=(tmp_path, server_folder(tmp_path_factory)))


@pytest.mark.slow
def test_a_sweep_with_a_password_in_mlflow_tracking_uri_writes_it_nowhere(tmp_path, server, client, tmp_path_factory):
    """``MLFLOW_TRACKING_URI`` with ``alice:PASSWORD@``: the sweep's run and its 2 trials (1 epoch each) are
    tracked, and the password is in no file of the sweep directory (sweep.json, trials' logs and summaries), of
    the server, and in no output."""
    pytest.importorskip("optuna", reason="the test extra installs optuna (tfgpu[sweep])")
    token, password = secret()
    result = run_cli("sweep", str(Path(RECIPE).with_name("breast_cancer_sweep.yaml")), "--trials", "2", "--parallel",
                     "2", "--set", "train.epochs=1", "--set", "output.mlflow.experiment=tfgpu-sweep-credentials",
                     "--set", "output.mlflow=true", "--output-dir", str(tmp_path / "runs"), timeout=300,
                     MLFLOW_TRACKING_URI=server.replace("http://", f"http://alice:{password}@"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    directory = next((tmp_path / "runs").glob("*-sweep-*"))
    parent_id = json.loads((directory / "sweep.json").read_text())["mlflow"]["run_id"]
    children = client.search_runs([client.get_run(parent_id).info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent_id}'")
    assert len(children) == 2 and {c.info.status for c in children} == {"FINISHED"}
    assert len(list(directory.glob("trials/trial-*.log"))) == 2
    assert not hits(token, result.stdout, result.stderr,
                    *(json.dumps([c.data.params, c.data.tags]) for c in children),
                    folders=(tmp_path, server_folder(tmp_path_factory)))
