"""``tfgpu export savedmodel|onnx|litert RUN_DIR``: a run's model as a serving artifact, verified in its own runtime.

The artifact is written by ``keras.Model.export`` from the run's *serving
model* (:func:`tfgpu.serving.inference.load_serving_model`), so the run's preprocessing
is inside it: it takes the raw inputs ``tfgpu predict`` takes (uint8 pixels
for images, float32 feature rows for tables) under the name ``inputs`` and
returns float32 probabilities (or values) under the name ``outputs``.

Formats (``keras.Model.export(format=...)``):

- ``savedmodel``: ``tf_saved_model``, in TensorFlow Serving's ``NAME/VERSION/``
  layout (default ``RUN_DIR/export/savedmodel/<recipe name>/<next free version>/``)
  with a ``serving_default`` signature ``inputs -> outputs``;
- ``onnx``: ``onnx`` (tf2onnx on TensorFlow, jax2onnx on JAX), default ``RUN_DIR/export/model.onnx``;
- ``litert``: ``litert`` (``tf.lite.TFLiteConverter``), default ``RUN_DIR/export/model.tflite``.

Every export is written into a hidden temporary folder beside the target,
loaded there by its own runtime (``tf.saved_model.load``,
``onnxruntime.InferenceSession``, ``ai_edge_litert.interpreter.Interpreter``),
compared with the Keras serving model on up to :data:`SAMPLES` samples of the
run's validation data (raw, as the source stores them), and only then renamed
into place with its ``export.json`` (:func:`describe`); on any failure the
temporary folder is removed and nothing is left. ``docs/export.md`` documents
the commands, the layouts and ``export.json``.

Importing this module imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import ConfigError, DataError, OutputError, TfgpuError
from ..utils.files import missing_folders, remove_empty_folders, write_json
from ..utils.imports import importable
from .inference import (INPUT_NAME, OUTPUT_NAME, OutputStop, RunModel, open_run, refuse_data_files,
                        refuse_run_files)

#: The formats, as the command line names them -> ``keras.Model.export``'s ``format``.
FORMATS = {"savedmodel": "tf_saved_model", "onnx": "onnx", "litert": "litert"}

#: Largest max abs difference allowed between the artifact's outputs and the Keras model's (float32).
TOLERANCE = 1e-4

#: Samples of the validation split each export is checked on (all of them when fewer).
SAMPLES = 256

#: The file name of an export's record: in a SavedModel's version folder, else ``<artifact>.export.json``.
RECORD_NAME = "export.json"

#: Modules each format needs on the TensorFlow backend, and the extra that installs them.
_NEEDS = {"savedmodel": (("tensorflow",), None),
          "onnx": (("tf2onnx", "onnx", "onnxruntime"), "onnx"),
          "litert": (("ai_edge_litert",), "litert")}
#: On the JAX backend (Keras 3.15: ONNX through jax2onnx, SavedModel through jax.experimental.jax2tf).
_NEEDS_JAX = {"savedmodel": (("tensorflow", "jax.experimental.jax2tf"), None),
              "onnx": (("jax2onnx", "onnx", "onnxruntime"), None)}


def default_output(run: RunModel, fmt: str) -> Path:
    """Where ``tfgpu export FMT RUN_DIR`` writes without ``-o``.

    Returns:
        ``RUN_DIR/export/savedmodel/<model name>`` (the SavedModel's base
        folder; the version folder goes inside), ``RUN_DIR/export/model.onnx``
        or ``RUN_DIR/export/model.tflite``.
    """
    if fmt == "savedmodel":
        return run.run_dir / "export" / "savedmodel" / model_name(run)
    return run.run_dir / "export" / ("model.onnx" if fmt == "onnx" else "model.tflite")


def model_name(run: RunModel) -> str:
    """The name a SavedModel is served under (TF Serving's ``model_name``): the recipe's file name without
    ``.yaml`` (``mnist``), in letters, digits, ``_ . -``; ``model`` when the run has no recipe file."""
    recipe = str(run.summary.get("recipe") or "")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(recipe).stem if recipe else "").strip("._-")
    return name or "model"


def next_version(base: Path) -> int:
    """The next free SavedModel version in ``base``: one more than the largest whole-number folder, else 1."""
    numbers = [int(p.name) for p in base.iterdir() if p.name.isdigit()] if base.is_dir() else []
    return max(numbers, default=0) + 1


def export_artifact(run_dir: str | Path, fmt: str, output: Optional[str] = None, overrides: Sequence[str] = (),
                    version: Optional[int] = None) -> dict[str, Any]:
    """Export a run's serving model in ``fmt``, verify it in its runtime, and write it with its ``export.json``.

    Args:
        run_dir: a directory written by ``tfgpu run`` (with ``model.keras``).
        fmt: ``savedmodel``, ``onnx`` or ``litert``.
        output: ``savedmodel``: the model's base folder (the version folder is made
            inside it); otherwise the artifact's file. ``None``: :func:`default_output`.
        overrides: ``--set`` strings over the run's config (e.g. ``data.path`` when the data moved).
        version: ``savedmodel`` only: the version folder's number; default :func:`next_version`.

    Returns:
        The ``export.json`` record (:func:`describe`), with ``path`` the artifact written.

    Raises:
        DataError: the run directory has no model (or config, summary), or its data cannot be read.
        ConfigError: the run's backend cannot export ``fmt`` (JAX: no LiteRT), or the converter or
            runtime is not installed (the message names the extra), or ``--version`` is taken.
        OutputError: the target cannot be written (checked before any work), the converter fails, or the
            artifact disagrees with the Keras model (max abs difference over :data:`TOLERANCE`, or a
            different predicted class); nothing is left behind.

    Wraps: https://keras.io/api/models/model_saving_apis/export/ (``keras.Model.export``).
    """
    if fmt not in FORMATS:
        raise ConfigError(f"tfgpu export: unknown format {fmt!r}.", f"use one of {', '.join(FORMATS)}.")
    command = f"export {fmt}"
    run = open_run(run_dir, command, overrides)
    if any(item.split("=", 1)[0].strip() == "backend" for item in overrides):
        # model.keras loads on either backend: --set backend=tensorflow exports a JAX run through TensorFlow
        run = replace(run, summary={**run.summary, "backend": run.cfg.backend,
                                    "trained_backend": run.summary.get("backend")})
    _check_backend(run, fmt)
    _check_installed(run, fmt)
    if version is not None and fmt != "savedmodel":
        raise ConfigError(f"tfgpu {command}: --version {version} is given, but versions number SavedModels only.",
                          "leave --version out, or export savedmodel.")
    base = Path(output) if output is not None else default_output(run, fmt)
    if fmt == "savedmodel":
        _check_base(base, command)
        if version is None:
            version = next_version(base)
        target = base / str(version)
        if target.exists():
            raise ConfigError(f"tfgpu {command}: --version {version}: {target} already exists.",
                              f"give another --version, or leave it out for the next free one "
                              f"({next_version(base)}).")
        record_path = target / RECORD_NAME
    else:
        target = base
        if target.is_dir():
            raise OutputError(f"tfgpu {command}: -o {target} is a folder; {fmt} writes one file.",
                              f"give a file path such as {target / default_output(run, fmt).name}.")
        record_path = target.with_name(target.name + "." + RECORD_NAME)
    # an earlier export of this name may be replaced: its record beside it (NAME.export.json) says it is one
    refuse_run_files(command, "-o", str(base), (target, record_path), earlier_output=record_path.is_file())
    refuse_data_files(command, "-o", str(base), (target, record_path), run.cfg)
    stop = OutputStop(command)
    with stop.installed():
        return _export_staged(run, fmt, target, record_path, version, command, stop)


def _export_staged(run: RunModel, fmt: str, target: Path, record_path: Path, version: Optional[int], command: str,
                   stop: OutputStop) -> dict[str, Any]:
    """:func:`export_artifact` once its target is checked: export into a staging folder beside ``target``, then
    move the verified artifact and its record into place; on any failure or stop signal nothing is left."""
    created = missing_folders(target.parent)  # removed again on failure
    staging: Optional[Path] = None
    done = False
    try:
        # a signal waits for a safe point (stop.check() between the steps): raised into TensorFlow's or a
        # converter's C++ code, its exception can end the process with 1 and a SystemError traceback instead of
        # 75 (seen in CI with predict); the staging folder is made inside too, so a signal while mkdtemp runs
        # cannot leave it unnamed and behind (seen in a clean-clone run)
        with stop.held():
            staging = _staging_dir(target, command)
            record = _export_into(run, fmt, staging, target, version, command, stop)
        if fmt == "savedmodel":
            write_json(staging / "artifact" / RECORD_NAME, record)
            _rename(staging / "artifact", target, command)
        else:
            write_json(staging / RECORD_NAME, record)
            _replace_pair(staging, [(staging / "artifact", target), (staging / RECORD_NAME, record_path)], command)
        done = True
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if not done:
            remove_empty_folders(created)
    record["record"] = str(record_path)
    return record


# --------------------------------------------------------------------------- checks before any work


def _check_backend(run: RunModel, fmt: str) -> None:
    if run.backend == "jax" and fmt == "litert":
        keras_version = _dist_version("keras") or "3"
        raise ConfigError(f"tfgpu export litert: the run trained on backend: jax, and Keras {keras_version} exports "
                          "LiteRT from the TensorFlow and PyTorch backends only (keras.Model.export("
                          "format='litert') converts a TensorFlow graph with tf.lite.TFLiteConverter).",
                          "export savedmodel or onnx from this run, or train it with backend: tensorflow "
                          "(model.keras loads on either backend: --set backend=tensorflow).")


def _install_hint(run: RunModel, fmt: str, missing: Sequence[str]) -> str:
    if run.backend == "jax":
        packages = {"jax.experimental.jax2tf": "jax"}
        return ("install them: pip install " + " ".join(sorted({packages.get(m, m) for m in missing}))
                + ", or export through TensorFlow: --set backend=tensorflow (model.keras loads on either backend)")
    extra = _NEEDS[fmt][1]
    if extra is None:
        return "install TensorFlow: pip install tensorflow"
    return f"install the extra: pip install 'tfgpu[{extra}]'"


def _check_installed(run: RunModel, fmt: str) -> None:
    needs = (_NEEDS_JAX if run.backend == "jax" else _NEEDS)[fmt][0]
    missing = [name for name in needs if not importable(name)]
    if missing:
        what = "converter and runtime are" if fmt != "savedmodel" else "loader is"
        raise ConfigError(f"tfgpu export {fmt}: the {fmt} {what} not installed: no module "
                          f"{', '.join(missing)} (backend: {run.backend}).",
                          _install_hint(run, fmt, missing) + ".")


def _check_base(base: Path, command: str) -> None:
    if base.exists() and not base.is_dir():
        raise OutputError(f"tfgpu {command}: -o {base} is a file; a SavedModel goes in a folder "
                          "(TensorFlow Serving's model base path, holding one folder per version).",
                          "give a folder path, e.g. models/mnist.")


def _staging_dir(target: Path, command: str) -> Path:
    """A new hidden folder beside ``target`` (same file system, so the final rename is atomic)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    except OSError as exc:
        raise OutputError(f"tfgpu {command}: cannot write {target}: {exc.strerror or exc} "
                          f"({exc.filename or target.parent}).",
                          "give a writable path with -o, or check the folder's permissions.") from None


def _replace_pair(staging: Path, moves: list[tuple[Path, Path]], command: str) -> None:
    """Move each new file of ``moves`` onto its target, all or none: an artifact and its record that are
    already there (an earlier export) are first set aside in ``staging``, and put back if a move fails,
    so a failure leaves the earlier export as it was (or nothing, where there was none)."""
    aside = []
    for i, (_, target) in enumerate(moves):
        if target.exists():
            _rename(target, staging / f"previous-{i}", command)
            aside.append((staging / f"previous-{i}", target))
    done = []
    try:
        for source, target in moves:
            _rename(source, target, command)
            done.append(target)
    except BaseException:
        for target in done:
            target.unlink(missing_ok=True)
        for previous, target in aside:
            os.replace(previous, target)
        raise


def _rename(source: Path, target: Path, command: str) -> None:
    try:
        os.replace(source, target)
    except OSError as exc:
        raise OutputError(f"tfgpu {command}: cannot move the verified artifact to {target}: "
                          f"{exc.strerror or exc}.", "check the folder's permissions and free space.") from None


# --------------------------------------------------------------------------- the work


def _export_into(run: RunModel, fmt: str, staging: Path, target: Path, version: Optional[int],
                 command: str, stop: OutputStop) -> dict[str, Any]:
    """Load, sample, export into ``staging/artifact``, verify; return the record. Runs inside ``stop.held()``
    (the caller's): a signal stops it at the next ``stop.check()``, the end of a step."""
    started = time.perf_counter()
    from ..devices.setup import setup  # noqa: PLC0415
    from ..data import source_for  # noqa: PLC0415

    stop.doing = "reading the run's data"
    source = source_for(run.cfg.data, run.cfg.model.loss, run.cfg.tensorflow.seed)
    source.check()  # the data's files, before TensorFlow starts
    stop.doing = "starting TensorFlow"
    setup(_export_config(run))
    import keras  # noqa: PLC0415
    stop.check()
    stop.doing = f"exporting {fmt}"

    keras.mixed_precision.set_global_policy("float32")
    from .inference import load_trained_model, serving_model  # noqa: PLC0415

    trained = load_trained_model(run, command)
    stop.check()
    precision = _policy_of(trained)
    if precision != "float32":
        trained = _float32_copy(trained, keras)
    _constants_inside(trained, keras)
    serving = serving_model(trained, run)
    model = keras.Model(serving.inputs[0], {OUTPUT_NAME: serving.outputs[0]}, name=serving.name)
    x, split, value_range = _sample(run, source)
    # calling the model also builds what keras.Model.export traces (its ONNX export refuses a model never called)
    expected = keras.ops.convert_to_numpy(model(x, training=False)[OUTPUT_NAME]).astype(np.float32)
    load_seconds = time.perf_counter() - started
    stop.check()

    artifact = staging / ("artifact.tflite" if fmt == "litert" else "artifact")
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():  # tf2onnx's numpy 2 patch warns about np.object
            warnings.simplefilter("ignore", FutureWarning)
            model.export(str(artifact), format=FORMATS[fmt], verbose=False)
    except TfgpuError:
        raise
    except Exception as exc:  # the converter's own error
        raise OutputError(f"tfgpu {command}: keras.Model.export(format={FORMATS[fmt]!r}) failed for "
                          f"{run.model_path}: {type(exc).__name__}: {_first_line(exc)}",
                          "export another format (savedmodel converts every Keras layer), or run with --debug "
                          "for the converter's traceback; nothing was written.") from None
    export_seconds = time.perf_counter() - started
    stop.check()
    if artifact.suffix:
        artifact.rename(staging / "artifact")
        artifact = staging / "artifact"

    started = time.perf_counter()
    try:
        got, runtime = _run_artifact(fmt, artifact, x)
    except Exception as exc:  # the runtime refuses the artifact
        raise OutputError(f"tfgpu {command}: the {fmt} artifact was written but its runtime cannot run it on "
                          f"{len(x)} {split[0]} samples: {type(exc).__name__}: {_first_line(exc)}; nothing was kept.",
                          "export savedmodel (no conversion), or run with --debug for the traceback and report "
                          "it with the versions (tfgpu doctor).") from None
    verify_seconds = time.perf_counter() - started
    stop.check()
    check = compare(expected, got, run)
    check.update({"samples": int(len(x)), "split": split[0], "origin": split[1], "runtime": runtime,
                  "tolerance": TOLERANCE,
                  "tolerance_rule": "absolute" if run.task == "classification" else "absolute, relative above 1"})
    if not check["passed"]:
        raise OutputError(f"tfgpu {command}: the exported artifact disagrees with the Keras model on "
                          f"{len(x)} {split[0]} samples: max abs difference {check['max_abs_diff']:.3g} "
                          f"(allowed {TOLERANCE:g}, {check['tolerance_rule']}), predicted classes identical for "
                          f"{check.get('classes_identical', 'n/a')} of {len(x)}; nothing was written.",
                          "export savedmodel (no conversion), or report the model and the versions "
                          f"({runtime}, Keras {keras.__version__}).")
    return describe(run, fmt, target, version, model, value_range, check, runtime, precision,
                    {"load": round(load_seconds, 3), "export": round(export_seconds, 3),
                     "verify": round(verify_seconds, 3)})


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:400]


def _export_config(run: RunModel) -> Any:
    """The run's config for :func:`tfgpu.setup`, on one device: an export runs the model on a sample."""
    data = run.cfg.distribute.model_copy(update={"strategy": "default"})
    return run.cfg.model_copy(update={"distribute": data})


def _constants_inside(model: Any, keras: Any) -> None:
    """Make an adapted ``keras.layers.Normalization``'s mean and variance NumPy arrays, so a traced graph holds
    them as constants: Keras keeps them as eager tensors, which a ``tf.function`` captures as extra inputs
    and tf2onnx then leaves as inputs of the ONNX graph (``.../normalize/Sub/y:0``) that a client must feed."""
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.Normalization):
            for name in ("mean", "variance"):
                value = getattr(layer, name, None)
                if value is not None and not isinstance(value, (np.ndarray, keras.Variable)):
                    setattr(layer, name, np.asarray(keras.ops.convert_to_numpy(value)))


def _policy_of(model: Any) -> str:
    names = {getattr(layer.dtype_policy, "name", "float32") for layer in model._flatten_layers()}
    return "float32" if names <= {"float32"} else sorted(names - {"float32"})[0]


def _float32_copy(model: Any, keras: Any) -> Any:
    """The model rebuilt with every layer's dtype policy float32 and the trained weights (ONNX and LiteRT
    converters and TF Serving clients expect float32 graphs; Keras's ONNX export requires it)."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            if value.get("class_name") == "DTypePolicy" or value.get("class_name") == "FloatDTypePolicy":
                return "float32"
            return {k: ("float32" if k == "dtype" and isinstance(v, str) and "mixed" in v else plain(v))
                    for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    copy = model.__class__.from_config(plain(model.get_config()))
    copy.set_weights(model.get_weights())
    return copy


def _sample(run: RunModel, source: Any) -> tuple[np.ndarray, tuple[str, str], Any]:
    """Up to :data:`SAMPLES` raw inputs of the run's validation split (else test, else train), as stored; and the
    inputs' value range (images: 0-255; tables: each feature's min/max over the training rows)."""
    from ..data.base import LoadContext  # noqa: PLC0415

    cfg = run.cfg
    data = source.load(LoadContext(global_batch_size=SAMPLES, num_replicas=1, seed=cfg.tensorflow.seed))
    split = data.validation or data.test or data.train
    if split.in_memory:
        x = np.asarray(split.x[:SAMPLES])
    else:
        # streamed files are listed class by class: shuffled (the file list, with the run's seed), so the
        # sample holds every class, not the first 256 files of one
        batches = (split.reader.dataset(shuffle=True, seed=cfg.tensorflow.seed).batch(SAMPLES).take(1)
                   if split.reader is not None else split.batches())  # a builder's global batches
        batch = next(iter(batches), None)
        if batch is None:
            raise DataError(f"tfgpu export: the run's {split.name} split holds no samples to check the export on.",
                            "export with the data the run trained on (--set data.path=... if it moved).")
        x = np.asarray(batch[0])[:SAMPLES]
    if x.shape[1:] != run.stored_shape:
        raise DataError(f"tfgpu export: the {split.name} split's samples have shape {x.shape[1:]}, but the run "
                        f"stores {run.stored_shape} (summary.json).",
                        "export with the data the run trained on (--set data.path=... if it moved).")
    x = x.astype(run.stored_dtype, copy=False)
    if run.is_image:
        value_range: Any = {"min": 0, "max": 255}
    elif data.train.in_memory and data.train.x.ndim == 2 and run.features:
        train_x = data.train.x
        value_range = {name: {"min": float(lo), "max": float(hi)}
                       for name, lo, hi in zip(run.features, train_x.min(axis=0), train_x.max(axis=0))}
    elif data.train.in_memory:
        value_range = {"min": float(data.train.x.min()), "max": float(data.train.x.max())}
    else:
        value_range = "unbounded (not recorded: the training split is streamed)"
    return x, (split.name, split.origin), value_range


def _run_artifact(fmt: str, path: Path, x: np.ndarray) -> tuple[np.ndarray, str]:
    """The artifact's outputs for ``x`` in its own runtime, and the runtime's name and version."""
    if fmt == "savedmodel":
        import tensorflow as tf  # noqa: PLC0415

        fn = tf.saved_model.load(str(path)).signatures["serving_default"]
        return np.asarray(fn(**{INPUT_NAME: tf.constant(x)})[OUTPUT_NAME]), f"tensorflow {tf.__version__}"
    if fmt == "onnx":
        import onnxruntime  # noqa: PLC0415

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        out = session.run([OUTPUT_NAME], {INPUT_NAME: x})[0]
        return np.asarray(out), f"onnxruntime {onnxruntime.__version__}"
    from ai_edge_litert.interpreter import Interpreter  # noqa: PLC0415

    interpreter = Interpreter(model_path=str(path))
    runner = interpreter.get_signature_runner("serving_default")
    out = runner(**{INPUT_NAME: x})[OUTPUT_NAME]
    return np.asarray(out), f"ai-edge-litert {_dist_version('ai-edge-litert')}"


def _dist_version(name: str) -> Optional[str]:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version(name)
    except Exception:  # noqa: BLE001 - not installed
        return None


def compare(expected: np.ndarray, got: np.ndarray, run: RunModel) -> dict[str, Any]:
    """How far an artifact's outputs are from the Keras model's.

    Args:
        expected: the Keras serving model's float32 outputs ``(N, units)``.
        got: the artifact's outputs for the same inputs.
        run: the run (its task: classes are compared for a classifier).

    Returns:
        ``{"max_abs_diff", "classes_identical" and "near_ties" (classifiers), "passed"}``. Passed when the
        shapes match and every output is within :data:`TOLERANCE` of Keras's: absolutely for probabilities
        (at most 1), relatively for regression values above 1 in size (float32 holds a value of 2,048 only
        to 2.4e-4); and a classifier's predicted class is the same for every sample whose two most
        probable classes (or a sigmoid's distance from 0.5) Keras separates by more than twice the
        tolerance; a different class at a closer margin is counted in ``near_ties``, not failed.
    """
    got = np.asarray(got, dtype=np.float32)
    if got.shape != expected.shape:
        return {"max_abs_diff": float("inf"), "passed": False,
                "shape_mismatch": [list(expected.shape), list(got.shape)]}
    diff = np.abs(got.astype(np.float64) - expected)
    result: dict[str, Any] = {"max_abs_diff": float(diff.max()) if expected.size else 0.0}
    if run.task == "classification":
        passed = bool((diff <= TOLERANCE).all())

        def classes(p: np.ndarray) -> np.ndarray:
            return (p[:, 0] > 0.5).astype(int) if p.shape[-1] == 1 else np.argmax(p, axis=-1)

        if expected.shape[-1] == 1:
            margin = np.abs(expected[:, 0] - 0.5)
        else:
            top2 = np.sort(expected, axis=-1)[:, -2:] if expected.shape[-1] > 1 else expected
            margin = top2[:, -1] - top2[:, 0]
        same = classes(got) == classes(expected)
        result["classes_identical"] = int(same.sum())
        result["near_ties"] = int((~same & (margin <= 2 * TOLERANCE)).sum())
        passed = passed and bool((same | (margin <= 2 * TOLERANCE)).all())
    else:
        passed = bool((diff <= TOLERANCE * np.maximum(1.0, np.abs(expected))).all())
    result["passed"] = passed
    return result


def describe(run: RunModel, fmt: str, target: Path, version: Optional[int], model: Any, value_range: Any,
             check: dict[str, Any], runtime: str, precision: str, seconds: dict[str, float]) -> dict[str, Any]:
    """The ``export.json`` record: everything a client needs to call the artifact (docs/export.md lists it)."""
    from ..devices.probe import versions as summary_versions  # noqa: PLC0415

    units = int(model.outputs[0].shape[-1]) if isinstance(model.outputs, list) else \
        int(next(iter(model.outputs.values())).shape[-1])
    activation = run.output_activation
    if run.task == "classification":
        meaning = ("the probability of class 1 (of 2)" if units == 1 else f"the probability of each of {units} "
                   "classes (they sum to 1)")
    else:
        meaning = "the predicted value(s)"
    versions: dict[str, Any] = {**summary_versions(run.backend), "backend": run.backend}  # as summary.json's
    if fmt == "onnx":
        versions.update({"onnx": _dist_version("onnx"), "onnxruntime": _dist_version("onnxruntime"),
                         ("jax2onnx" if run.backend == "jax" else "tf2onnx"):
                             _dist_version("jax2onnx" if run.backend == "jax" else "tf2onnx")})
    if fmt == "litert":
        versions["ai-edge-litert"] = _dist_version("ai-edge-litert")
    record: dict[str, Any] = {
        "format": fmt,
        "keras_format": FORMATS[fmt],
        "path": str(target),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "input": {"name": INPUT_NAME, "shape": [-1, *run.stored_shape], "dtype": run.stored_dtype,
                  "range": value_range,
                  "layout": ("pixels (batch, height, width)" if run.is_image and len(run.stored_shape) == 2
                             else "pixels (batch, height, width, channels)" if run.is_image
                             else "feature rows (batch, features) in the order of 'features'"
                             if run.features else "samples (batch, ...)"),
                  "features": run.features,
                  "image_size": list(run.stored_shape[:2]) if run.is_image else None},
        "output": {"name": OUTPUT_NAME, "shape": [-1, units], "dtype": "float32", "meaning": meaning,
                   "activation_added": activation},
        "task": run.task,
        "class_names": run.class_names,
        "preprocessing_inside": {"cast": f"{run.stored_dtype} -> float32", "rescale": run.rescale,
                                 "add_channel": run.add_channel,
                                 "normalize": bool(run.data.get("normalize"))},
        "precision": {"trained": precision, "exported": "float32"},
        "source_run": {"run_dir": str(run.run_dir.resolve()), "recipe": run.summary.get("recipe"),
                       "backend": run.summary.get("trained_backend") or run.backend,
                       "status": run.summary.get("status"), "final_metrics": run.summary.get("final_metrics", {}),
                       "test_metrics": run.summary.get("test_metrics")},
        "versions": versions,
        "verification": {k: check[k] for k in ("runtime", "split", "origin", "samples", "max_abs_diff",
                                                "tolerance", "tolerance_rule", "classes_identical", "near_ties", "passed")
                         if k in check},
        "seconds": seconds,
    }
    if fmt == "savedmodel":
        record["savedmodel"] = {"model_name": target.parent.name, "base_path": str(target.parent.resolve()),
                                "version": version, "signature": "serving_default",
                                "signature_inputs": {INPUT_NAME: record["input"]["shape"]},
                                "signature_outputs": {OUTPUT_NAME: record["output"]["shape"]}}
    return record
