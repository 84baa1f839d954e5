"""A finished run's model for inference: what it takes, what it returns, and the model that does both.

``tfgpu predict`` and ``tfgpu export`` share this seam, so what a file gives
through ``predict`` is what the exported artifact gives for the same input.

The *serving model* (:func:`serving_model`) takes the inputs as the run's data
source stores them, the **raw** inputs:

- images: uint8 pixels ``(batch, height, width)`` for sources stored without
  a channel axis (MNIST), ``(batch, height, width, channels)`` otherwise, at
  the run's image size (``data.image_size``; resizing happens before, as in
  the run's pipeline);
- tables (CSV) and float arrays: float32 ``(batch, *sample_shape)``, columns
  in the run's order (``data.features``); the run's ``data.normalize`` layer
  is already inside ``model.keras``.

It casts them to float32, multiplies by the run's ``data.rescale`` (``1/255``
for 8-bit images by default), adds the channel axis the pipeline added, runs
the trained model, and returns float32 ``(batch, units)``: class
probabilities for a classifier (softmax over ``units`` classes, or one
sigmoid probability of class 1 for a binary classifier with one unit; the
activation is added only when the loss says ``from_logits: true``), the
predicted values for regression.

Nothing here imports TensorFlow or Keras until :func:`load_serving_model`.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..config import load_config
from ..data.base import DATA_DIR_ENV
from ..errors import ConfigError, DataError, Preempted, UsageError
from ..training.checkpoint import StopSignals

#: The serving model's input and output names (SavedModel signature keys, ONNX/LiteRT tensor names).
INPUT_NAME = "inputs"
OUTPUT_NAME = "outputs"


@dataclass(frozen=True)
class RunModel:
    """What a finished run gives for inference, read from its directory without TensorFlow.

    Attributes:
        run_dir: the run directory.
        cfg: the run's config (``config.yaml`` with ``--set`` overrides; relative
            data paths made relative to the directory the run started in).
        summary: ``summary.json``.
        data: ``summary.json``'s ``data`` (the run's :class:`tfgpu.data.base.DataSpec`).
    """

    run_dir: Path
    cfg: Any
    summary: dict[str, Any]
    data: dict[str, Any]

    @property
    def model_path(self) -> Path:
        """``RUN_DIR/model.keras``."""
        return self.run_dir / "model.keras"

    @property
    def kind(self) -> str:
        """``data.kind`` of the run (``mnist``, ``image_folder``, ``csv``, ...)."""
        return str(self.data.get("kind") or self.cfg.data.kind)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """One raw input's shape, without the batch axis, e.g. ``(28, 28)`` or ``(64, 64, 3)`` or ``(30,)``."""
        return tuple(int(d) for d in self.data.get("stored_shape") or self.data["input_shape"])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One input's shape as the trained model takes it, e.g. ``(28, 28, 1)``."""
        return tuple(int(d) for d in self.data["input_shape"])

    @property
    def stored_dtype(self) -> str:
        """The raw inputs' dtype: ``uint8`` for images, ``float32`` for features."""
        return str(self.data.get("stored_dtype") or "float32")

    @property
    def rescale(self) -> Optional[float]:
        """The factor raw inputs are multiplied by (``1/255``), or ``None``."""
        value = self.data.get("rescale")
        return float(value) if value is not None else None

    @property
    def add_channel(self) -> bool:
        """The pipeline adds a channel axis to the raw inputs (grey images stored as ``(H, W)``)."""
        return len(self.input_shape) == len(self.stored_shape) + 1

    @property
    def is_image(self) -> bool:
        """Raw inputs are 8-bit images: ``(H, W)`` or ``(H, W, C)`` with C in 1, 3, 4."""
        shape = self.stored_shape
        return self.stored_dtype == "uint8" and (len(shape) == 2 or (len(shape) == 3 and shape[-1] in (1, 3, 4)))

    @property
    def task(self) -> str:
        """``classification`` or ``regression``."""
        return str(self.data.get("task") or "classification")

    @property
    def num_classes(self) -> Optional[int]:
        """Classes of a classifier, else ``None``."""
        value = self.data.get("num_classes")
        return int(value) if value is not None else None

    @property
    def class_names(self) -> Optional[list[str]]:
        """Each class's name (image folders: the sub-folder names; otherwise ``"0"``, ``"1"``, ...), else ``None``."""
        if self.task != "classification" or self.num_classes is None:
            return None
        names = [str(n) for n in self.data.get("class_names") or []][:self.num_classes]
        # a source may name fewer classes than the model has (TFDS with a larger data.num_classes): numbers for the rest
        return names + [str(i) for i in range(len(names), self.num_classes)]

    @property
    def features(self) -> Optional[list[str]]:
        """The CSV feature columns in the model's order, else ``None``."""
        value = self.data.get("features")
        return [str(n) for n in value] if value else None

    @property
    def label(self) -> Optional[str]:
        """The CSV label column, else ``None``."""
        value = self.data.get("label")
        return str(value) if value else None

    @property
    def backend(self) -> str:
        """The Keras backend the run trained with (``tensorflow`` or ``jax``)."""
        return str(self.summary.get("backend") or self.cfg.backend or "tensorflow")

    @property
    def output_activation(self) -> Optional[str]:
        """``softmax``/``sigmoid`` when the loss takes logits (``from_logits: true``), else ``None``."""
        from ..model.keras_model import _split_spec, loss_family  # noqa: PLC0415

        name, args = _split_spec(self.cfg.model.loss)
        if not args.get("from_logits"):
            return None
        family = loss_family(self.cfg.model.loss)
        return "sigmoid" if family == "binary" else "softmax" if family == "classes" else None


def open_run(run_dir: str | Path, command: str, overrides: Sequence[str] = ()) -> RunModel:
    """Read a run directory for inference, without TensorFlow.

    Args:
        run_dir: a directory written by ``tfgpu run``.
        command: the command asking (``predict``, ``export onnx``), for messages.
        overrides: ``--set`` strings applied over the run's ``config.yaml``.

    Returns:
        The :class:`RunModel`.

    Raises:
        DataError: not a directory; no ``config.yaml``, ``model.keras`` (a failed or
            interrupted run, or ``output.save_model: false``) or readable ``summary.json``.
        ConfigError: the config with the overrides is not valid.
    """
    from .evaluate import _paths_from  # noqa: PLC0415

    folder = Path(run_dir)
    if not folder.is_dir():
        raise DataError(f"tfgpu {command}: '{folder}' is not a run directory (it does not exist or is a file).",
                        "give the folder tfgpu run printed (runs/<recipe>-<time>).")
    missing = [n for n in ("config.yaml", "model.keras", "summary.json") if not (folder / n).is_file()]
    if missing:
        why = (" (the run did not save a model: output.save_model was false, or it failed or was interrupted "
               "before the end)") if "model.keras" in missing else ""
        raise DataError(f"tfgpu {command}: {folder} has no {' and no '.join(missing)}{why}.",
                        f"{command} a run that completed with output.save_model: true.")
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        data = summary["data"]
        data["input_shape"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"tfgpu {command}: {folder / 'summary.json'} cannot be read or has no data section "
                        f"({type(exc).__name__}: {exc}).",
                        "the run did not finish writing it; train the run again.") from None
    cfg = load_config(folder / "config.yaml", overrides=overrides)
    cfg = _paths_from(cfg, summary.get("cwd"), overrides)
    return RunModel(folder, cfg, summary, data)


def load_trained_model(run: RunModel, command: str) -> Any:
    """``keras.models.load_model(RUN_DIR/model.keras)``; call inside the strategy's scope if any.

    Raises:
        DataError: the file cannot be loaded (damaged, or not written by ``tfgpu run``).

    Wraps: https://keras.io/api/models/model_saving_apis/model_saving_and_loading/#loadmodel-function
    """
    import keras  # noqa: PLC0415

    from ..model.schedules import warmup_class  # noqa: PLC0415

    warmup_class()  # registers tfgpu>Warmup, which a model trained with train.lr_schedule holds
    try:
        return keras.models.load_model(run.model_path, compile=False)
    except Exception as exc:  # a damaged or foreign file
        raise DataError(f"tfgpu {command}: cannot load {run.model_path}: {type(exc).__name__}: {exc}.",
                        "the file is damaged or was not written by tfgpu run; train the run again.") from None


def serving_model(model: Any, run: RunModel) -> Any:
    """Wrap a trained model so it takes raw inputs and returns float32 probabilities or values.

    Args:
        model: the run's trained ``keras.Model`` (float32 ``(batch, *run.input_shape)`` in).
        run: the run (its data spec and loss).

    Returns:
        A functional ``keras.Model`` named ``<model>_serving`` with one input
        ``inputs`` of dtype ``run.stored_dtype`` and shape ``(batch, *run.stored_shape)``,
        and one float32 output ``outputs`` of shape ``(batch, units)``.

    Raises:
        ConfigError: the trained model's input shape differs from the run's data spec.

    Wraps: https://keras.io/api/models/model/ (a functional model around the trained one)
    """
    import keras  # noqa: PLC0415

    expected = tuple(model.input_shape[1:]) if not isinstance(model.input_shape, list) else None
    if expected is not None and tuple(d for d in expected) != run.input_shape:
        raise ConfigError(f"{run.model_path}: the model takes inputs of shape {expected}, but the run's data "
                          f"spec (summary.json) says {run.input_shape}.",
                          "the run directory was changed after training; train the run again.")
    inputs = keras.Input(shape=run.stored_shape, dtype=run.stored_dtype, name=INPUT_NAME)
    # keras.ops, not keras.layers.Rescaling: Rescaling picks a tf.data backend whenever "tensorflow" is in
    # sys.modules, which breaks a JAX run where TensorFlow is blocked (sys.modules["tensorflow"] = None).
    x = keras.ops.cast(inputs, "float32")
    if run.rescale is not None:
        x = x * run.rescale
    if run.add_channel:
        x = keras.layers.Reshape(run.input_shape, name="add_channel")(x)
    y = model(x, training=False)
    y = keras.layers.Activation(run.output_activation or "linear", dtype="float32", name=OUTPUT_NAME)(y)
    return keras.Model(inputs, y, name=f"{model.name}_serving")


def load_serving_model(run: RunModel, command: str) -> Any:
    """:func:`load_trained_model` then :func:`serving_model`; call inside the strategy's scope if any."""
    return serving_model(load_trained_model(run, command), run)


# ----------------------------------------------------------------------------- what predict and export may write

#: The names ``tfgpu run`` and ``tfgpu evaluate`` write in a run directory (:mod:`tfgpu.training.layout`), top
#: level only: a predict or export output may never take one of them, even where the run has none (yet).
RUN_FILES = ("config.yaml", "config.resolved.yaml", "plan.json", "metrics.csv", "summary.json", "model.keras",
             "startup.log", "evaluation.json", "checkpoint", "tensorboard")
#: The folder of a run directory that holds the exports (:func:`tfgpu.serving.export.default_output`).
EXPORT_FOLDER = "export"


def run_dir_holding(path: Path) -> Optional[Path]:
    """The run directory ``path`` lies in (its nearest folder with ``summary.json`` and ``config.yaml``), if any."""
    for folder in Path(os.path.realpath(path)).parents:
        if (folder / "summary.json").is_file() and (folder / "config.yaml").is_file():
            return folder
    return None


def refuse_run_files(command: str, option: str, given: str, paths: Sequence[Path],
                     earlier_output: bool = False) -> None:
    """Refuse to write ``paths`` (an output and its records) where one would replace a run directory's own file.

    A path inside a run directory (this run's or another's) may be written only under its ``export/`` folder, or
    where nothing is yet and the name is not one of :data:`RUN_FILES`: ``model.keras``, ``summary.json``,
    ``metrics.csv``, the configs, the checkpoint and the logs are never replaced (an ONNX file written over
    ``model.keras`` was the trained model lost). ``earlier_output``: the existing files are an earlier output of
    the same command with the same name (its record says so), which may be replaced.

    Raises:
        UsageError: a path would replace a file of a run directory (exit 2: nothing was read or written).
    """
    for path in paths:
        run = run_dir_holding(path)
        if run is None:
            continue
        inside = Path(os.path.realpath(path)).relative_to(run)
        if inside.parts[0] == EXPORT_FOLDER and len(inside.parts) > 1:
            continue
        taken = inside.parts[0] in RUN_FILES or (os.path.lexists(path) and not earlier_output)
        if taken:
            raise UsageError(f"tfgpu {command}: {option} {given} would write over {run / inside.parts[0]}, a file of "
                             f"the run directory {run}; a run's own files (model.keras, summary.json, metrics.csv, "
                             "the configs, the checkpoint) are never replaced.",
                             f"write it elsewhere, e.g. {run / EXPORT_FOLDER / Path(given).name} or a folder of "
                             "your own.")


#: The keys of ``data:`` that name files or folders a run reads.
DATA_KEYS = ("path", "validation_path", "test_path", "data_dir")


def refuse_data_files(command: str, option: str, given: str, paths: Sequence[Path], cfg: Any,
                      inputs: Optional[dict[str, str]] = None) -> None:
    """Refuse to write ``paths`` over what a run reads: a file its ``data:`` section names (``path``,
    ``validation_path``, ``test_path``; a TFRecord pattern's files, or a new name the pattern would match), a file
    inside a folder it names (an image folder, a TFDS ``data_dir``), or one of ``inputs`` (``{"the recipe": path}``).

    Raises:
        UsageError: a path would replace or join the run's data (exit 2: nothing was read or written).
    """
    named = [(f"data.{key}", getattr(cfg.data, key, None)) for key in DATA_KEYS]
    name, root = getattr(cfg.data, "name", None), os.environ.get(DATA_DIR_ENV)
    if name and not cfg.data.path and root:  # a Keras dataset read from $TFGPU_DATA_DIR/<name>/
        named.append((f"data.name ({DATA_DIR_ENV}/{name})", os.path.join(root, name)))
    for path in paths:
        real = os.path.realpath(path)
        hit = next(((f"{what} {value}", value) for what, value in (inputs or {}).items()
                    if value and os.path.realpath(value) == real), None)
        for key, value in named:
            if hit is not None:
                break
            if not value:
                continue
            value = os.path.expanduser(os.path.expandvars(value))  # as data.base.resolve_path reads it
            source = os.path.realpath(value)
            if glob.has_magic(value):
                found = fnmatch.fnmatch(real, source) or real in {os.path.realpath(m) for m in glob.glob(value)}
            else:
                found = real == source or (os.path.isdir(source) and real.startswith(source.rstrip(os.sep) + os.sep))
            if found:
                where = "over" if real == source or os.path.lexists(path) else "into"
                hit = (f"{where} the training data ({key}: {value})", value)
        if hit is not None:
            what = hit[0] if hit[0].startswith(("over ", "into ")) else f"over {hit[0]}"
            raise UsageError(f"tfgpu {command}: {option} {given} would write {what}; tfgpu never writes into the "
                             "data a run reads or over a file a command was given.",
                             "give another file name, outside the data's files and folders.")


class OutputStop(StopSignals):
    """SIGTERM and SIGHUP during ``tfgpu predict`` or ``tfgpu export``: the command stops with
    :class:`~tfgpu.errors.Preempted` (exit 75, "try again", as ``tfgpu run`` does), and its own cleanup removes
    what it had half written (predict's temporary file, export's staging folder), instead of the signal's default
    action killing the process with 143 and leaving them. Ctrl-C (SIGINT) is Python's KeyboardInterrupt, cleaned
    up the same way (exit 130). Both commands do their work inside :meth:`held`: a signal waits for a safe point
    (the end of predict's batch, of an export's step: :meth:`check`) instead of being raised into TensorFlow's
    C++ code, which can end the process with 1 and a ``SystemError`` (:class:`tfgpu.training.checkpoint.StopSignals`).

    Args:
        command: the command, for the message (``predict``, ``export onnx``).
    """

    def __init__(self, command: str) -> None:
        super().__init__("SIGHUP")
        self.command = command

    def stopped(self, name: Optional[str] = None) -> Preempted:
        return Preempted(f"tfgpu {self.command}: {name or self.received} arrived while {self.doing}; it stopped "
                         "there and removed what it had half written (an earlier output of the same name is kept).",
                         f"run tfgpu {self.command} again.")
