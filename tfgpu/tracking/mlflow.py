"""``output.mlflow``: each run (and each sweep) tracked in MLflow, through ``mlflow.MlflowClient``.

What a run logs (the chief only, with several workers):

- when its run directory begins (:func:`tracked`): an MLflow run in the
  experiment (created when missing), or the same MLflow run again on
  ``--resume`` (its id is in ``summary.json`` ``mlflow``); its parameters are
  the resolved configuration with dotted keys (``train.epochs``,
  ``model.optimizer.learning_rate``), its tags the devices, replicas, global
  batch, strategy, backend, versions and run directory (:func:`run_tags`);
- after each finished epoch (:func:`callbacks`, both loops): that epoch's row
  of ``metrics.csv`` (loss, metrics, ``val_*``, ``learning_rate``,
  ``epoch_seconds``, ``train_seconds``, ``samples_per_second``) at step = the
  epoch, counted from 0;
- when the run ends, however it ends: ``test_*`` metrics, the files
  :data:`ARTIFACTS` (and ``model.keras`` with ``log_model``), then the MLflow
  status: ``FINISHED``, ``FAILED`` or ``KILLED`` (:data:`STATUS`).

Before TensorFlow starts, :func:`check` (:func:`tfgpu.training.preflight.check`, so
``tfgpu plan`` too) refuses a missing ``mlflow`` package (a
:class:`~tfgpu.errors.ConfigError`, exit 3, as for other extras) and contacts a
tracking server once, with a short timeout: unreachable is a
:class:`~tfgpu.errors.TrackingError` (exit 11), or with ``required: false`` a
warning and a run without tracking. A local store (``sqlite:``, ``file:``, a
path) needs no server. Once training has begun, tracking never stops it: a
failed log call is a warning, and the run trains on without tracking (its
figures stay in ``metrics.csv``).

A sweep (``tfgpu sweep``) tracks itself with :func:`start_parent_run`,
:func:`log_parent_metrics` and :func:`end_parent_run`; a ``tfgpu run`` whose
environment has :data:`PARENT_RUN_ENV` becomes a child run of that run
(:func:`child_environment`).

Credentials: a ``USER:PASSWORD@`` in ``output.mlflow.tracking_uri`` (taken out as
the config is read) or in ``MLFLOW_TRACKING_URI`` never reaches a file, a log, a
message or MLflow: :func:`export_credentials` puts them in MLflow's own
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (this process's
environment, inherited by its workers and a sweep's trials), and the URI kept,
shown, logged and written to ``summary.json`` is the one without userinfo
(``http://127.0.0.1:5000``). https://mlflow.org/docs/latest/auth/index.html

Environment: ``MLFLOW_TRACKING_URI`` (where, when ``output.mlflow.tracking_uri``
is unset), ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD`` (HTTP
basic authentication), ``MLFLOW_EXPERIMENT_NAME`` (the experiment, when
``output.mlflow.experiment`` is unset), :data:`PARENT_RUN_ENV`, and MLflow's own
``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT`` and
``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` (honoured for logging; tfgpu's
:data:`LOG_LIMITS` otherwise, never MLflow's minutes of retries; the check
before training always uses :data:`CHECK_LIMITS`). They are set only around
tfgpu's own MLflow calls and restored after each.

Importing this module imports neither mlflow nor TensorFlow.
"""

from __future__ import annotations

import contextlib
import getpass
import importlib.util
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from ..errors import ConfigError, TfgpuError, TrackingError
from ..utils.console import say, warn
from ..utils.urls import credentials, masked
from ..version import __version__

#: Set by ``tfgpu sweep`` in a trial's environment: the id of the sweep's MLflow run, whose child the run becomes.
PARENT_RUN_ENV = "TFGPU_MLFLOW_PARENT_RUN_ID"
#: The tracking server's check before training: no retry, this many seconds to answer.
CHECK_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
#: Logging while the run goes on, unless the environment says otherwise: 2 retries 1 s and 2 s apart, 20 s per
#: request (MLflow's own defaults, 7 retries with a backoff factor of 2 and 120 s, wait minutes for a dead server).
LOG_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
              "MLFLOW_HTTP_REQUEST_TIMEOUT": "20", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
#: How a tfgpu run's status becomes the MLflow run's (``mlflow.entities.RunStatus``).
STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED", "preempted": "KILLED"}
#: The run directory's files logged as artifacts when the run ends (``model.keras`` too with ``log_model``).
ARTIFACTS = ("config.yaml", "config.resolved.yaml", "summary.json", "metrics.csv")
#: MLflow's limits (``mlflow.utils.validation``): parameters per ``log_batch`` call, a parameter value's length.
PARAMS_PER_BATCH = 100
PARAM_VALUE_CHARS = 6000
#: MLflow's variables for HTTP basic authentication (``mlflow.environment_variables``), set by
#: :func:`export_credentials`.
USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"
PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"
#: The URIs :func:`check` found unreachable in this process with ``required: false`` (warned about once).
_UNREACHABLE: set[str] = set()


# Where: the URI, the experiment, the package ------------------------------------------------------------------


def tracking_uri(settings: Any) -> Optional[str]:
    """``output.mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else ``None`` (MLflow's default: a local
    ``sqlite:///mlflow.db`` in the current directory, ``./mlruns`` where one holds runs); always without a
    ``USER:PASSWORD@`` (:func:`export_credentials` hands those to MLflow)."""
    return credentials(settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None)[0]


def export_credentials(settings: Any) -> None:
    """Put the credentials of the tracking URI where MLflow reads them, and nowhere else.

    A ``USER:PASSWORD@`` taken out of ``output.mlflow.tracking_uri`` as the config was read, else one in
    ``MLFLOW_TRACKING_URI`` (which is then set to the URI without it), becomes :data:`USERNAME_ENV` and
    :data:`PASSWORD_ENV` in this process's environment (over values already there: the URI names the server
    they are for), which MLflow's HTTP client sends as basic authentication, and which this process's children
    (workers, a sweep's trials) inherit; never a file or a command line. Without credentials in the URI the
    environment is left as it is (set the two variables yourself).

    Wraps MLflow's ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``:
    https://mlflow.org/docs/latest/auth/index.html#authenticating-to-mlflow
    """
    found = getattr(settings, "_credentials", None)
    if found is None and settings.tracking_uri:
        found = credentials(settings.tracking_uri)[1:]  # (a settings object made without validation)
    if found is None and not settings.tracking_uri:
        clean, user, password = credentials(os.environ.get("MLFLOW_TRACKING_URI") or None)
        if user is not None or password is not None:
            os.environ["MLFLOW_TRACKING_URI"] = clean
            found = (user, password)
    if not found:
        return
    for key, value in zip((USERNAME_ENV, PASSWORD_ENV), found):
        if value is not None:
            os.environ[key] = value


def _auth_note() -> str:
    """How the tracking server's credentials are given, for messages (never the credentials themselves)."""
    if os.environ.get(USERNAME_ENV) or os.environ.get(PASSWORD_ENV):
        return f", with the credentials in {USERNAME_ENV} / {PASSWORD_ENV}"
    return ""


def _uri_source(settings: Any) -> str:
    return "output.mlflow.tracking_uri" if settings.tracking_uri else "MLFLOW_TRACKING_URI"


def is_local(uri: Optional[str]) -> bool:
    """A store this process writes itself (``None``: MLflow's default, ``sqlite:``, ``file:``, a path): no server."""
    if not uri:
        return True
    scheme = re.match(r"^([A-Za-z][\w+.-]*):", uri)
    return scheme is None or scheme.group(1).lower() in ("file", "sqlite")


def experiment_name(settings: Any, default: str) -> str:
    """``output.mlflow.experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else ``default`` (the run's name prefix)."""
    return settings.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or default


def require_mlflow() -> None:
    """Raise :class:`ConfigError` when the ``mlflow`` package is not installed (found without importing it)."""
    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError(
            "output.mlflow is on and needs the mlflow package, which is not installed.",
            "pip install 'tfgpu[mlflow]' (or pip install mlflow), or set output.mlflow: false.",
        )


@contextlib.contextmanager
def _http_limits(limits: Mapping[str, str], force: bool = False) -> Iterator[None]:
    """MLflow's HTTP settings for the calls inside (``force``: also over the user's own), then as they were."""
    saved = {k: os.environ.get(k) for k in limits}
    for key, value in limits.items():
        if force or saved[key] is None:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _client(uri: Optional[str]) -> Any:
    from mlflow import MlflowClient  # noqa: PLC0415  (about 1 s; only with output.mlflow on)

    return MlflowClient(tracking_uri=uri)


def _absolute(uri: str, base: Optional[str] = None) -> str:
    """A local store's URI with its path made absolute, relative to ``base`` (default: the current directory)."""
    where = Path(base or os.getcwd())
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + os.path.normpath(where / uri[len("sqlite:///"):])
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return Path(os.path.normpath(where / uri[len("file:"):])).as_uri()
    if not re.match(r"^[A-Za-z][\w+.-]*:", uri):
        return Path(os.path.normpath(where / uri)).as_uri()
    return uri


def resolved_uri(settings: Any, previous: Optional[Mapping[str, Any]] = None) -> str:
    """The URI a run records: :func:`tracking_uri` (a local store's relative path from the directory the run
    started in: ``previous["cwd"]`` on resume), else the URI a resumed run recorded, else MLflow's default
    (``mlflow.get_tracking_uri()``: ``sqlite:///mlflow.db`` in the current directory).

    Args:
        previous: a resumed run's ``summary.json`` (``cwd``, ``mlflow.tracking_uri``), or ``None``.
    """
    previous = previous or {}
    uri = tracking_uri(settings)
    if uri is None and (previous.get("mlflow") or {}).get("tracking_uri"):
        return credentials(previous["mlflow"]["tracking_uri"])[0]  # (one written before credentials were taken out)
    if uri is None:
        import mlflow  # noqa: PLC0415

        uri = mlflow.get_tracking_uri()
    return _absolute(uri, previous.get("cwd"))


def _reason(exc: BaseException) -> str:
    """What an MLflow client error says, in a few words (``Connection refused``, ``HTTP 404``, ...)."""
    text = str(exc)
    errno = re.search(r"\[Errno -?\d+\] ([^'\"()\]]+)", text)
    if errno:
        return errno.group(1).strip().rstrip(".")
    if re.search(r"timed? ?out", text, re.I):
        return "no answer in time"
    code = re.search(r"error code (\d+)", text)
    if code:
        return f"HTTP {code.group(1)} (is this an MLflow tracking server's address?)"
    ssl = re.search(r"SSLError\((.*?)\)\)", text)
    if ssl:
        return f"SSL error: {ssl.group(1)[:200]}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first if len(first) <= 300 else first[:297] + "..."


# Before TensorFlow starts ------------------------------------------------------------------------------------


def check(cfg: Any, contact: bool = True) -> None:
    """``output.mlflow``'s checks before TensorFlow starts (:func:`tfgpu.training.preflight.check`).

    The ``mlflow`` package must be installed; with ``contact``, a tracking
    server (any URI but a local store) must answer one request
    (``MlflowClient.search_experiments``, :data:`CHECK_LIMITS`: no retry, 5 s).

    Raises:
        ConfigError: mlflow is not installed (exit 3).
        TrackingError: the server cannot be reached and ``output.mlflow.required`` is true (exit 11); with
            ``required: false`` a warning is printed instead, and the run trains without tracking.
    """
    settings = cfg.output.mlflow
    if settings is None:
        return
    require_mlflow()
    export_credentials(settings)
    uri = tracking_uri(settings)
    if not contact or is_local(uri):
        return
    problem = _reach(uri)
    if problem is None:
        return
    if settings.required:
        raise _unreachable(settings, uri, problem)
    _UNREACHABLE.add(uri)
    warn(f"output.mlflow: the MLflow tracking server at {uri!r} ({_uri_source(settings)}) cannot be reached "
         f"({problem}); the run trains without tracking (output.mlflow.required: false).")


def _reach(uri: str) -> Optional[str]:
    """``None`` when the server at ``uri`` answers, else why not."""
    try:
        with _http_limits({**CHECK_LIMITS, "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}, force=True):
            _client(uri).search_experiments(max_results=1)
    except TfgpuError:
        raise
    except Exception as exc:  # noqa: BLE001  (requests' and MLflow's errors: each is a reason to report)
        return _reason(exc)
    return None


def _unreachable(settings: Any, uri: str, problem: str) -> TrackingError:
    seconds = CHECK_LIMITS["MLFLOW_HTTP_REQUEST_TIMEOUT"]
    return TrackingError(
        f"output.mlflow.tracking_uri: the MLflow tracking server at {uri!r} (from {_uri_source(settings)}"
        f"{_auth_note()}) cannot "
        f"be reached: {problem} (one try, {seconds} s to answer, before TensorFlow starts). Nothing was trained "
        "or written.",
        "start the server (e.g. mlflow server --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///mlflow.db) "
        "or correct output.mlflow.tracking_uri (or MLFLOW_TRACKING_URI); to train without tracking while it is "
        "down, set output.mlflow.required: false.")


# The run's MLflow run ------------------------------------------------------------------------------------------


def params_of(cfg: Any) -> dict[str, str]:
    """The resolved configuration as MLflow parameters: dotted keys, values as YAML/JSON text
    (``{"train.epochs": "3", "model.optimizer.learning_rate": "0.01", "model.metrics": '["accuracy"]'}``), each at
    most :data:`PARAM_VALUE_CHARS` characters."""
    return _flat(cfg.to_dict())


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[f"{prefix}{key}"] = text if len(text) <= PARAM_VALUE_CHARS else text[:PARAM_VALUE_CHARS - 3] + "..."
    return out


def _versions(backend: str) -> dict[str, Optional[str]]:
    """The run's package versions as tags: ``summary.json``'s ``versions`` (:func:`tfgpu.devices.probe.versions`), each
    ``NAME.version``."""
    from ..devices.probe import versions  # noqa: PLC0415

    return {f"{name}.version": version for name, version in versions(backend).items()}


def run_tags(info: Any, run_path: Path, recipe: Optional[str]) -> dict[str, str]:
    """The tags of a run's MLflow run: what it trained on (``info``: :class:`tfgpu.Setup`) and where it is."""
    plan = info.plan
    strategy = info.strategy
    tags: dict[str, Any] = {
        "tfgpu.devices": ", ".join(info.logical_devices),
        "tfgpu.replicas": info.num_replicas,
        "tfgpu.global_batch_size": info.global_batch_size,
        "tfgpu.batch_size_per_replica": plan.batch_size_per_replica,
        "tfgpu.strategy": type(strategy).__name__ if strategy is not None else "none",
        "tfgpu.workers": plan.num_workers,
        "tfgpu.backend": plan.backend,
        "tfgpu.run_dir": str(Path(run_path).resolve()),
        "mlflow.source.name": str(Path(recipe).resolve()) if recipe else "tfgpu run",
        "mlflow.source.type": "LOCAL",
        **_versions(plan.backend),
    }
    with contextlib.suppress(Exception):
        tags["mlflow.user"] = getpass.getuser()
    return {k: str(v) for k, v in tags.items() if v is not None}


def _experiment_id(client: Any, name: str) -> str:
    """The id of the experiment ``name``, created when missing (also when another process creates it meanwhile).

    Raises:
        TrackingError: it is deleted.
    """
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name)
        except Exception:  # noqa: BLE001  (created by another run at the same moment: read it)
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if found.lifecycle_stage != "active":
        raise TrackingError(
            f"output.mlflow.experiment: the MLflow experiment {name!r} (id {found.experiment_id}) is deleted.",
            f"restore it (mlflow experiments restore --experiment-id {found.experiment_id}) or name another one "
            "in output.mlflow.experiment.")
    return found.experiment_id


def _log_params(client: Any, run_id: str, params: Mapping[str, str]) -> None:
    from mlflow.entities import Param  # noqa: PLC0415

    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[i:i + PARAMS_PER_BATCH], synchronous=True)


def _set_tags(client: Any, run_id: str, tags: Mapping[str, str]) -> None:
    from mlflow.entities import RunTag  # noqa: PLC0415

    items = [RunTag(k, v) for k, v in tags.items()]
    for i in range(0, len(items), PARAMS_PER_BATCH):
        client.log_batch(run_id, tags=items[i:i + PARAMS_PER_BATCH], synchronous=True)


def _log_metrics(client: Any, run_id: str, metrics: Mapping[str, float], step: int) -> None:
    from mlflow.entities import Metric  # noqa: PLC0415

    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


def _failed(settings: Any, uri: str, what: str, exc: BaseException) -> Optional[TrackingError]:
    """A failed start of the MLflow run: the error to raise (``required``), or ``None`` after a warning."""
    if isinstance(exc, TrackingError):
        if settings.required:
            return exc
        problem = exc.message
    else:
        problem = f"MLflow at {uri!r} {what}: {_reason(exc)}."
    if settings.required:
        return TrackingError(problem + " Nothing was trained.",
                             "check the tracking server and output.mlflow (docs/mlflow.md), then run again; to "
                             "train without tracking when it fails, set output.mlflow.required: false.")
    warn(f"output.mlflow: {problem} The run trains without tracking (output.mlflow.required: false).")
    return None


@contextlib.contextmanager
def tracked(cfg: Any, info: Any, run_dir: Any, resumed: Any) -> Iterator[dict[str, Any]]:
    """The run's MLflow run, from its run directory's beginning to its end (the chief, with ``output.mlflow``).

    On entering: an MLflow run is created in the experiment (a child of
    :data:`PARENT_RUN_ENV`'s run, in that run's experiment, when it is set), or
    a resumed run's own MLflow run (``resumed.summary["mlflow"]["run_id"]``,
    at the URI it recorded) is set running again; the parameters and tags are
    logged (a resumed run's changed settings keep their first values). Yields
    the facts for ``summary.json``: ``{"mlflow": {"run_id", "experiment_id",
    "tracking_uri", "experiment"}}``, or ``{}`` (no tracking; a resumed run
    whose server :func:`check` found unreachable keeps its reference, marked
    ``"skipped"``, so that a later resume continues its MLflow run). On leaving,
    however the block ends: ``test_*`` metrics, :data:`ARTIFACTS`, the status
    ``summary.json`` ended with (:data:`STATUS`). A failure there is a warning.

    Args:
        cfg: the run's config; info: :class:`tfgpu.Setup`; run_dir: the
            :class:`~tfgpu.training.rundir.RunDir` (``chief``, ``path``, ``recipe``,
            ``summary``); resumed: :class:`tfgpu.training.resume.Resumed` or ``None``.

    Raises:
        TrackingError: the MLflow run cannot be created or continued and ``output.mlflow.required`` is true
            (a new, still empty run directory is removed).
    """
    settings = cfg.output.mlflow
    if settings is None or not run_dir.chief:
        yield {}
        return
    export_credentials(settings)
    previous = (resumed.summary.get("mlflow") or {}) if resumed is not None else {}
    if (tracking_uri(settings) or "") in _UNREACHABLE:  # (warned by check): a later resume may continue the run
        kept = {k: previous[k] for k in ("run_id", "experiment_id", "tracking_uri", "experiment") if k in previous}
        if kept.get("tracking_uri"):
            kept["tracking_uri"] = credentials(kept["tracking_uri"])[0]
        yield {"mlflow": {**kept, "skipped": "the tracking server could not be reached"}} if kept else {}
        return
    from ..config import run_name  # noqa: PLC0415

    uri, ref, error = None, None, None
    try:
        with _http_limits(LOG_LIMITS):
            uri = resolved_uri(settings, resumed.summary if resumed is not None else None)
            ref = _begin(cfg, info, run_dir, resumed, settings, uri, run_name(cfg, run_dir.recipe))
    except Exception as exc:  # noqa: BLE001  (MLflow's and requests' errors)
        if isinstance(exc, TfgpuError) and not isinstance(exc, TrackingError):
            raise  # a stop signal (Preempted)
        error = _failed(settings, uri or str(tracking_uri(settings)), "refused the run", exc)
    if error is not None:
        if resumed is None:
            with contextlib.suppress(OSError):
                run_dir.path.rmdir()  # only when still empty
        raise error
    if ref is None:
        yield {}
        return
    say(f"MLflow run {ref['run_id']} in experiment {ref['experiment']!r} at {uri}" + _url(uri, ref))
    try:
        yield {"mlflow": ref}
    except BaseException as exc:
        _end(run_dir, settings, ref, exc)
        raise
    _end(run_dir, settings, ref, None)


def _url(uri: str, ref: dict[str, Any]) -> str:
    if uri.startswith(("http://", "https://")):
        return f" ({uri.rstrip('/')}/#/experiments/{ref['experiment_id']}/runs/{ref['run_id']})"
    return ""


def _begin(cfg: Any, info: Any, run_dir: Any, resumed: Any, settings: Any, uri: str, prefix: str) -> dict[str, Any]:
    """Create (or reopen) the MLflow run, log its parameters and tags; its reference for ``summary.json``."""
    client = _client(uri)
    previous = (resumed.summary.get("mlflow") or {}) if resumed is not None else {}
    tags = run_tags(info, run_dir.path, run_dir.recipe)
    run = None
    if previous.get("run_id"):
        run = _reopen(client, previous, uri)
    if run is not None:
        client.update_run(run.info.run_id, status="RUNNING")
        tags["tfgpu.restarts"] = str(len(resumed.summary.get("restarts", [])) + 1)
        logged = run.data.params
        params = {k: v for k, v in params_of(cfg).items() if k not in logged}  # MLflow refuses changed values
        name = previous.get("experiment") or client.get_experiment(run.info.experiment_id).name
    else:
        parent = os.environ.get(PARENT_RUN_ENV)
        if parent:
            experiment_id = client.get_run(parent).info.experiment_id
            tags["mlflow.parentRunId"] = parent
            name = client.get_experiment(experiment_id).name
        else:
            name = experiment_name(settings, prefix)
            experiment_id = _experiment_id(client, name)
        run = client.create_run(experiment_id, run_name=settings.run_name or run_dir.path.name)
        params = params_of(cfg)
    run_id = run.info.run_id
    _set_tags(client, run_id, tags)
    _log_params(client, run_id, params)
    return {"run_id": run_id, "experiment_id": run.info.experiment_id, "tracking_uri": uri, "experiment": name}


def _reopen(client: Any, previous: dict[str, Any], uri: str) -> Any:
    """The resumed run's MLflow run, or ``None`` (a warning: it is elsewhere now, or gone; a new one is made)."""
    if credentials(previous.get("tracking_uri"))[0] != uri:
        warn(f"output.mlflow: the run was tracked at {masked(previous.get('tracking_uri'))!r}, and now goes to "
             f"{uri!r}: it gets a new MLflow run there.")
        return None
    try:
        run = client.get_run(previous["run_id"])
    except Exception as exc:  # noqa: BLE001  (RESOURCE_DOES_NOT_EXIST, among others)
        warn(f"output.mlflow: the run's MLflow run {previous['run_id']} cannot be read at {uri!r} ({_reason(exc)}); "
             "the resumed run gets a new MLflow run.")
        return None
    if run.info.lifecycle_stage != "active":
        warn(f"output.mlflow: the run's MLflow run {previous['run_id']} is deleted; the resumed run gets a new one.")
        return None
    return run


def _status(run_dir: Any, exc: Optional[BaseException]) -> str:
    """The MLflow status of how the run ended: ``summary.json``'s status, else the exception that ended it."""
    status = run_dir.summary.get("status")
    if status in STATUS:
        return STATUS[status]
    if exc is None:
        return "FINISHED"
    from ..errors import Interrupted, Preempted  # noqa: PLC0415

    return "KILLED" if isinstance(exc, (KeyboardInterrupt, Interrupted, Preempted)) else "FAILED"


def _end(run_dir: Any, settings: Any, ref: dict[str, Any], exc: Optional[BaseException]) -> None:
    """The end of the run's MLflow run: ``test_*`` metrics, the files, the status. Never raises an ``Exception``."""
    status = _status(run_dir, exc)
    try:
        with _http_limits(LOG_LIMITS):
            client = _client(ref["tracking_uri"])
            run_id = ref["run_id"]
            summary = run_dir.summary
            test = {k: v for k, v in (summary.get("test_metrics") or {}).items() if isinstance(v, (int, float))}
            if test:
                _log_metrics(client, run_id, test, max(len(run_dir.epochs.rows) - 1, 0))
            files = [*ARTIFACTS, *(("model.keras",) if settings.log_model else ())]
            for name in files:
                if (run_dir.path / name).is_file():
                    client.log_artifact(run_id, str(run_dir.path / name))
            client.set_terminated(run_id, status)
    except Exception as error:  # noqa: BLE001  (the run has ended: its outcome stands, tracking only warns)
        warn(f"output.mlflow: the MLflow run {ref['run_id']} could not be ended ({_reason(error)}): its status "
             f"({status}) or files may be missing there; the run directory {run_dir.path} has them.")


# While training: one row per finished epoch --------------------------------------------------------------------


def callbacks(run: Any) -> list:
    """The Keras callback that logs each finished epoch's row to the run's MLflow run, or ``[]`` (no tracking).

    ``run`` is the :class:`~tfgpu.training.rundir.RunDir`: its ``summary["mlflow"]``
    (set by :func:`tracked`, the chief's only) names the MLflow run, and its
    ``epochs.rows[-1]`` is the row the epoch-statistics callback, earlier in
    the list, has just added. The milliseconds each epoch's logging took are
    recorded in ``summary.json`` ``mlflow`` (``epochs_logged``,
    ``log_seconds_median``, ``log_seconds_max``). A failed call is a warning,
    and later epochs are not logged (training goes on).

    Wraps ``MlflowClient.log_batch``: https://mlflow.org/docs/latest/python_api/mlflow.client.html
    """
    ref = run.summary.get("mlflow") if run.chief else None
    if not ref or ref.get("skipped"):
        return []
    import keras  # noqa: PLC0415

    class MlflowEpochs(keras.callbacks.Callback):
        """Logs ``run.epochs.rows[-1]`` (step = its epoch) to the MLflow run ``ref``."""

        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []
            self.failed = False
            with _http_limits(LOG_LIMITS):
                self.client = _client(ref["tracking_uri"])

        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            if self.failed or not run.epochs.rows:
                return
            row = run.epochs.rows[-1]
            started = time.perf_counter()
            try:
                with _http_limits(LOG_LIMITS):
                    _log_metrics(self.client, ref["run_id"], {k: v for k, v in row.items() if k != "epoch"},
                                 int(row["epoch"]))
            except TfgpuError:
                raise  # a stop signal (Preempted)
            except Exception as exc:  # noqa: BLE001  (tracking never stops training)
                self.failed = True
                run.record({"mlflow": {"error": f"epoch {int(row['epoch']) + 1}: {_reason(exc)}"}})
                warn(f"output.mlflow: epoch {int(row['epoch']) + 1} could not be logged to MLflow ({_reason(exc)}); "
                     "training goes on without tracking (metrics.csv has every epoch).")
                return
            self.seconds.append(time.perf_counter() - started)
            run.record({"mlflow": {"epochs_logged": len(self.seconds),
                                   "log_seconds_median": statistics.median(self.seconds),
                                   "log_seconds_max": max(self.seconds)}})

    return [MlflowEpochs()]


# Sweeps: the parent run ----------------------------------------------------------------------------------------


def start_parent_run(cfg: Any, run_name: str, params: Mapping[str, Any], tags: Mapping[str, Any],
                     experiment: Optional[str] = None) -> Optional[dict[str, str]]:
    """Start a sweep's own MLflow run, whose trials become its child runs (:func:`child_environment`).

    Checks as a run does (:func:`check`): the mlflow package, the server
    (one try, 5 s). The experiment is ``output.mlflow.experiment``, else
    ``MLFLOW_EXPERIMENT_NAME``, else ``experiment``, else ``output.name``,
    else ``tfgpu``; created when missing.

    Args:
        cfg: the sweep's base config (its ``output.mlflow``).
        run_name: the MLflow run's name (``output.mlflow.run_name`` is the trials').
        params: logged as parameters (nested mappings get dotted keys; values as JSON text unless strings).
        tags: set as tags (besides ``tfgpu.version``, ``mlflow.user``, ``tfgpu.sweep: "parent"``).
        experiment: the experiment's default name (e.g. the recipe's stem, as its runs use).

    Returns:
        ``{"run_id", "experiment_id", "tracking_uri"}``, or ``None``: ``output.mlflow`` is off, or the start
        failed with ``required: false`` (a warning was printed).

    Raises:
        ConfigError: mlflow is not installed (exit 3).
        TrackingError: the server cannot be reached or refuses the run, with ``required: true`` (exit 11).
    """
    settings = cfg.output.mlflow
    if settings is None:
        return None
    check(cfg)
    if (tracking_uri(settings) or "") in _UNREACHABLE:
        return None
    uri = None
    try:
        with _http_limits(LOG_LIMITS):
            uri = resolved_uri(settings)
            client = _client(uri)
            experiment_id = _experiment_id(client, experiment_name(
                settings, experiment or cfg.output.name or "tfgpu"))
            base = {"tfgpu.version": __version__, "tfgpu.sweep": "parent", "mlflow.source.type": "LOCAL"}
            with contextlib.suppress(Exception):
                base["mlflow.user"] = getpass.getuser()
            run = client.create_run(experiment_id, run_name=run_name)
            _set_tags(client, run.info.run_id, {**base, **{k: str(v) for k, v in tags.items()}})
            _log_params(client, run.info.run_id, _flat(params))
    except Exception as exc:  # noqa: BLE001
        if isinstance(exc, TfgpuError) and not isinstance(exc, TrackingError):
            raise
        error = _failed(settings, uri or str(tracking_uri(settings)), "refused the sweep's run", exc)
        if error is not None:
            raise error from None
        return None
    return {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id, "tracking_uri": uri}


def child_environment(ref: Optional[Mapping[str, str]]) -> dict[str, str]:
    """What a trial's ``tfgpu run`` needs in its environment to be a child of the sweep's run ``ref``:
    :data:`PARENT_RUN_ENV` and ``MLFLOW_TRACKING_URI`` (used where ``output.mlflow.tracking_uri`` is unset);
    ``{}`` for ``None``."""
    if not ref:
        return {}
    return {PARENT_RUN_ENV: ref["run_id"], "MLFLOW_TRACKING_URI": ref["tracking_uri"]}


def log_parent_metrics(ref: Optional[Mapping[str, str]], metrics: Mapping[str, float], step: int) -> None:
    """Log ``metrics`` (e.g. ``{"best_val_loss": 0.12, "trials_completed": 3}``) at ``step`` to the sweep's run;
    nothing for ``ref=None``. A failure is a warning."""
    if not ref:
        return
    try:
        with _http_limits(LOG_LIMITS):
            _log_metrics(_client(ref["tracking_uri"]), ref["run_id"], metrics, step)
    except Exception as exc:  # noqa: BLE001
        warn(f"output.mlflow: the sweep's metrics at step {step} could not be logged to MLflow ({_reason(exc)}).")


def end_parent_run(ref: Optional[Mapping[str, str]], status: str, artifacts: Sequence[Any] = ()) -> None:
    """End the sweep's run: log ``artifacts`` (file paths), then set its status.

    Args:
        ref: :func:`start_parent_run`'s reference, or ``None`` (nothing is done).
        status: MLflow's ``FINISHED``, ``FAILED`` or ``KILLED``, or tfgpu's ``completed``, ``failed``,
            ``interrupted``, ``preempted`` (:data:`STATUS`).

    A failure is a warning.
    """
    if not ref:
        return
    final = STATUS.get(status, status)
    try:
        with _http_limits(LOG_LIMITS):
            client = _client(ref["tracking_uri"])
            for path in artifacts:
                if Path(path).is_file():
                    client.log_artifact(ref["run_id"], str(path))
            client.set_terminated(ref["run_id"], final)
    except Exception as exc:  # noqa: BLE001
        warn(f"output.mlflow: the sweep's MLflow run {ref['run_id']} could not be ended ({_reason(exc)}).")
