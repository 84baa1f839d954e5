"""``train.early_stopping`` and ``train.callbacks``: Keras callbacks from the recipe, for both loops.

:func:`check` runs before TensorFlow starts (``tfgpu plan`` and ``tfgpu run``):
each callback name is a ``keras.callbacks`` class (read from Keras's package
files, :mod:`tfgpu.utils.keras_names`) or a ``module:Class`` whose module can be found,
and no callback fights a tfgpu key. :func:`logged_names` and :func:`check_monitors`
run once the model is compiled, before anything is written: every ``monitor``
names a figure the run logs; :func:`check_built` then builds the callbacks once
against a stand-in run, so arguments a class refuses in its constructor are
refused before anything is written too. :func:`build` makes the callbacks; tfgpu places
them after its epoch statistics, ``metrics.csv`` and TensorBoard and before its
checkpoint (:meth:`tfgpu.training.trainer.Trainer.callbacks`), so they see the epoch's
validation figures and the checkpoint of the epoch they stop at is still saved.

Early stopping is ``keras.callbacks.EarlyStopping`` (Keras 3.15.1), subclassed
only to last a whole tfgpu run rather than one ``fit`` call
(:func:`early_stopping`): it restores the best weights once, when the run ends
(Keras restores them at every ``on_train_end`` when ``restore_best_weights`` is
set, stopped early or not: tfgpu does the same, once), and a resumed run
continues its count from the rows of ``metrics.csv``.

File paths in callback arguments (``filepath``, ``filename``, ``log_dir``,
``path``, ``directory`` and keys ending in ``_path``, ``_dir``, ``_file``): a
relative one is inside the run directory; on a worker other than the chief every
path is inside its scratch directory (removed when the run ends), so only the
chief's files are kept. Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import difflib
import inspect
import os
from pathlib import Path
from typing import Any, Optional

from ..config import Config
from ..config.schema import OWNED_CALLBACKS
from ..errors import ConfigError
from ..model.keras_model import inner_optimizer
from .loops import EPOCH_STATS

#: Argument names taken as file paths (also any ending in one of :data:`PATH_SUFFIXES`).
PATH_ARGS = frozenset({"filepath", "filename", "log_dir", "path", "directory", "dir"})
PATH_SUFFIXES = ("_path", "_dir", "_file", "_filepath")

#: Callbacks that set the optimizer's learning rate, which a ``LearningRateSchedule`` owns.
SETS_LEARNING_RATE = ("ReduceLROnPlateau", "LearningRateScheduler")

#: Where the best epoch's weights wait for a resumed run (``restore_best_weights`` with checkpoints on).
BEST_WEIGHTS_FILE = "early_stopping_best.npz"

_KERAS_DOCS = "https://keras.io/api/callbacks/"


def _spec(item: Any) -> tuple[str, dict[str, Any]]:
    """A ``train.callbacks`` item -> (name, arguments)."""
    if isinstance(item, str):
        return item, {}
    (name, args), = item.items()
    return name, dict(args or {})


def keras_callback_names() -> Optional[list[str]]:
    """The ``keras.callbacks`` classes a recipe may name (Keras's package files, no import), or ``None``."""
    from ..utils.keras_names import class_names  # noqa: PLC0415

    names = class_names("callback")
    return None if names is None else [n for n in names if n not in OWNED_CALLBACKS]


def _unknown(key: str, name: str, valid: list[str]) -> ConfigError:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    return ConfigError(
        f"{key}: '{name}' is not a keras.callbacks class tfgpu runs."
        + (f" Did you mean '{close[0]}'?" if close else ""),
        f"use one of {', '.join(valid)} (as Keras spells it), or 'module:Class' for your own "
        "keras.callbacks.Callback subclass.",
    )


def _schedule_set(cfg: Config) -> bool:
    """Whether the learning rate is a ``LearningRateSchedule`` (``train.lr_schedule`` other than ``constant``)."""
    schedule = getattr(cfg.train, "lr_schedule", None)
    if schedule is None:
        return False
    if not isinstance(schedule, dict):
        return True
    return schedule.get("name") != "constant" or bool(schedule.get("warmup_epochs"))


def check(cfg: Config) -> None:
    """The checks of ``train.early_stopping`` and ``train.callbacks`` that need no TensorFlow.

    Raises:
        ConfigError: an unknown callback name (listing the valid ones), a
            ``module:Class`` whose module cannot be found, a callback that sets
            the learning rate while ``train.lr_schedule`` owns it, or a timing
            figure as ``monitor`` (exit 3).
    """
    from ..utils.imports import find_module  # noqa: PLC0415

    valid = None
    for i, item in enumerate(cfg.train.callbacks):
        name, args = _spec(item)
        key = f"train.callbacks[{i}]"
        if ":" in name:
            find_module(name, key, ConfigError)
        else:
            valid = valid if valid is not None else keras_callback_names()
            if valid is not None and name not in valid:
                raise _unknown(key, name, valid)
            if name in SETS_LEARNING_RATE and _schedule_set(cfg):
                raise ConfigError(
                    f"{key}: {name} sets the optimizer's learning rate, which train.lr_schedule makes a "
                    "LearningRateSchedule (Keras cannot set a schedule's rate).",
                    f"remove {name}, or remove train.lr_schedule (a constant rate) to let {name} change it.",
                )
        if args.get("monitor") in EPOCH_STATS:
            raise _timing(f"{key}.monitor", args["monitor"])
    es = cfg.train.early_stopping
    if es is not None and es.monitor in EPOCH_STATS:
        raise _timing("train.early_stopping.monitor", es.monitor)


def _timing(key: str, value: str) -> ConfigError:
    return ConfigError(
        f"{key}: '{value}' is a timing figure of tfgpu's (different on every worker, and not a result of training).",
        "monitor the loss or a metric, e.g. val_loss or val_accuracy.",
    )


def logged_names(cfg: Config, metrics: list[Any], validation: bool) -> dict[str, str]:
    """What a run logs each epoch (what ``monitor`` may name) -> ``"min"`` or ``"max"`` (its better direction).

    Args:
        cfg: the run's configuration.
        metrics: the compiled metric objects (:func:`tfgpu.model.keras_model.make_metrics`; their ``name`` and
            ``_direction``, as Keras's ``MonitorCallback`` reads them).
        validation: whether the run has validation data (``val_`` names).

    Returns:
        ``loss`` and each metric, their ``val_`` forms with validation data,
        and ``learning_rate`` (the optimizer's rate at the epoch's end). A metric of unknown
        direction maps to ``""`` (``mode: auto`` cannot watch it).
    """
    names = {"loss": "min"}
    for m in metrics:
        direction = getattr(m, "_direction", None)
        names[m.name] = "max" if direction == "up" else "min" if direction == "down" else ""
    if validation:
        names.update({f"val_{k}": v for k, v in list(names.items())})
    names["learning_rate"] = ""  # tfgpu.model.schedules.learning_rate_callback logs it every epoch
    return names


def _mode(key: str, monitor: str, mode: str, logged: dict[str, str]) -> str:
    """``mode: auto`` -> ``min``/``max`` from the metric (the custom loop's model has no built compiled metrics for
    Keras to read it from); ``min``/``max`` as given."""
    if monitor not in logged:
        raise ConfigError(
            f"{key}: '{monitor}' is not a figure this run logs.",
            f"monitor one of {', '.join(logged)} (loss and model.metrics, val_ ones with validation data).",
        )
    if mode != "auto":
        return mode
    if not logged[monitor]:
        raise ConfigError(f"{key}: mode: auto cannot tell whether '{monitor}' should rise or fall.",
                          "set mode: min or mode: max.")
    return logged[monitor]


def check_monitors(cfg: Config, logged: dict[str, str]) -> None:
    """Every ``monitor`` (``train.early_stopping`` and the callbacks' arguments) names a figure in ``logged``.

    Raises:
        ConfigError: one does not, listing those the run logs (exit 3, before anything is written).
    """
    es = cfg.train.early_stopping
    if es is not None:
        _mode("train.early_stopping.monitor", es.monitor, es.mode, logged)
    for i, item in enumerate(cfg.train.callbacks):
        name, args = _spec(item)
        if ":" not in name and "monitor" in args:
            _mode(f"train.callbacks[{i}].monitor", str(args["monitor"]), str(args.get("mode", "auto")), logged)


def _in_run(key: str, value: Any, path: Path, chief: bool) -> Any:
    """A path argument -> inside ``path`` when relative (on a non-chief worker: always)."""
    if not isinstance(value, str) or not (key in PATH_ARGS or key.endswith(PATH_SUFFIXES)):
        return value
    given = Path(os.path.expanduser(value))
    if given.is_absolute():
        if chief:
            return value
        given = Path(given.name)
    return str(path / given)


def build(cfg: Config, run: Any, logged: dict[str, str], chief: bool, resumable: bool,
          optimizer: Any = None) -> list:
    """``train.early_stopping`` then ``train.callbacks``, as Keras callback objects.

    Args:
        cfg: the run's configuration.
        run: the :class:`~tfgpu.training.rundir.RunDir` (``path``: where this process
            writes; ``home``: the chief's; ``epochs.rows``: the epochs done).
        logged: :func:`logged_names`.
        chief: whether this process is the chief (only its files are kept).
        resumable: checkpoints are saved (the best weights are kept for ``--resume``).
        optimizer: the run's optimizer (a callback that sets the learning rate refuses a schedule).

    Raises:
        ConfigError: a ``module:Class`` that is not a callback, arguments its class refuses, or a
            callback that sets the learning rate of a ``LearningRateSchedule``.
    """
    import keras  # noqa: PLC0415

    from ..utils.imports import import_function  # noqa: PLC0415

    out: list = []
    es = cfg.train.early_stopping
    if es is not None:
        out.append(early_stopping(es, _mode("train.early_stopping.monitor", es.monitor, es.mode, logged),
                                  run, chief, resumable))
    for i, item in enumerate(cfg.train.callbacks):
        name, args = _spec(item)
        key = f"train.callbacks[{i}]"
        if ":" in name:
            cls = import_function(name, key, ConfigError, "a keras.callbacks.Callback subclass")
            if not (inspect.isclass(cls) and issubclass(cls, keras.callbacks.Callback)):
                raise ConfigError(f"{key}: '{name}' is not a keras.callbacks.Callback subclass.",
                                  f"point it at a class deriving from keras.callbacks.Callback ({_KERAS_DOCS}).")
        else:
            cls = getattr(keras.callbacks, name)
            rate = getattr(inner_optimizer(optimizer), "_learning_rate", None)
            if name in SETS_LEARNING_RATE and isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
                raise ConfigError(
                    f"{key}: {name} sets the optimizer's learning rate, which is a {type(rate).__name__} "
                    "(a LearningRateSchedule: Keras cannot set its rate).",
                    f"remove {name}, or give the optimizer a constant learning_rate.")
            params = inspect.signature(cls.__init__).parameters
            if "monitor" in params and "mode" in params and args.get("mode", "auto") == "auto":
                monitor = args.get("monitor", params["monitor"].default)
                if isinstance(monitor, str) and logged.get(monitor):
                    args["mode"] = logged[monitor]
        given = _spec(item)[1]  # the arguments as the recipe gives them (no mode filled in, no path moved)
        args = {k: _in_run(k, v, run.path, chief) for k, v in args.items()}
        try:
            out.append(cls(**args))
        except Exception as exc:  # Keras raises TypeError, ValueError and others for bad arguments
            raise _refused_arguments(key, name, cls, given, exc) from None
    return out


def _refused_arguments(key: str, name: str, cls: Any, given: dict[str, Any], exc: Exception) -> ConfigError:
    """The error of a callback whose constructor refused the recipe's arguments: the key, the arguments as given,
    the class's own reason, and the arguments the class takes."""
    from ..errors import gist  # noqa: PLC0415

    try:
        takes = [p.name for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
                 if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):  # a signature Python cannot read
        takes = []
    received = "{" + ", ".join(f"{k}: {v!r}" for k, v in given.items()) + "}"
    return ConfigError(
        f"{key}: {cls.__name__} refused its arguments (received {{{name}: {received}}}): {gist(exc)}.",
        f"correct the argument the message names, or leave it out for its default: {cls.__name__} takes "
        f"{', '.join(takes) or 'no arguments'}" + (f" ({_KERAS_DOCS})." if ":" not in name else "."),
    )


def check_built(cfg: Config, logged: dict[str, str], chief: bool, optimizer: Any = None) -> None:
    """Build ``train.early_stopping`` and ``train.callbacks`` once, and drop them: arguments a class refuses
    only in its constructor (``ReduceLROnPlateau(factor=2.0)``) are refused before the run directory is written,
    by ``tfgpu run`` and ``tfgpu run --dry-run`` alike.

    The callbacks see a stand-in run: an empty temporary directory (relative paths land there and are removed
    with it; nothing under ``output.dir`` is written) and no epochs done. The run builds them again in its run
    directory (:meth:`tfgpu.training.trainer.Trainer.callbacks`), so a class of your own is constructed twice.

    Raises:
        ConfigError: as :func:`build`.
    """
    import tempfile  # noqa: PLC0415
    from types import SimpleNamespace  # noqa: PLC0415

    if cfg.train.early_stopping is None and not cfg.train.callbacks:
        return
    with tempfile.TemporaryDirectory(prefix="tfgpu-callbacks-") as scratch:
        stand_in = SimpleNamespace(path=Path(scratch), home=Path(scratch), epochs=SimpleNamespace(rows=[]))
        build(cfg, stand_in, logged, chief, resumable=False, optimizer=optimizer)


def early_stopping(es: Any, mode: str, run: Any, chief: bool, resumable: bool) -> Any:
    """``keras.callbacks.EarlyStopping`` for a whole tfgpu run (``train.early_stopping``).

    The subclass changes three things, and nothing of how Keras decides:

    - ``on_train_begin`` resets only once: a resumed ``fit`` run calls ``fit``
      twice (the rest of an epoch, then the later epochs), and a resumed run
      first replays the rows of the epochs done (``run.epochs.rows``, as
      ``metrics.csv`` keeps them) through Keras's own comparison
      (``_is_improvement``), so ``wait``, ``best`` and ``best_epoch`` continue.
    - ``on_train_end`` restores nothing; :meth:`finish` (called once when
      training ends, stopped early or not) sets the best weights, as Keras
      3.15.1 does at each ``on_train_end`` when ``restore_best_weights`` is set.
    - With ``restore_best_weights`` and checkpoints on, the chief keeps the
      best epoch's weights in ``RUN_DIR/early_stopping_best.npz`` (written at
      each improvement, removed by :meth:`finish`), so a resumed run restores
      the best epoch even when it came before the resume; without that file
      the best is looked for among the epochs trained after the resume.

    Wraps: https://keras.io/api/callbacks/early_stopping/
    """
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    rows = list(run.epochs.rows)
    kept = Path(run.path) / BEST_WEIGHTS_FILE
    found = Path(run.home) / BEST_WEIGHTS_FILE

    class RunEarlyStopping(keras.callbacks.EarlyStopping):
        def __init__(self) -> None:
            super().__init__(monitor=es.monitor, min_delta=es.min_delta, patience=es.patience, mode=mode,
                             baseline=es.baseline, restore_best_weights=es.restore_best_weights,
                             start_from_epoch=es.start_from_epoch)
            self.begun = False
            self.restored = False
            self.note: Optional[str] = None

        def on_train_begin(self, logs: Optional[dict] = None) -> None:
            if self.begun:
                return
            self.begun = True
            super().on_train_begin(logs)
            self._set_monitor_op()
            self._replay()

        def _replay(self) -> None:
            for row in rows:
                epoch, current = int(row["epoch"]), row.get(self.monitor)
                if current is None or epoch < self.start_from_epoch:
                    continue
                self.wait += 1
                if self._is_improvement(current, self.best):
                    self.best, self.best_epoch = float(current), epoch
                    if self.baseline is None or self._is_improvement(current, self.baseline):
                        self.wait = 0
            if not self.restore_best_weights or self.best is None:
                return
            try:
                with np.load(found) as saved:
                    if int(saved["epoch"]) == self.best_epoch:
                        self.best_weights = [saved[f"w{i}"] for i in range(int(saved["count"]))]
            except (OSError, KeyError, ValueError):
                pass
            if self.best_weights is None:  # the best epoch's weights are gone: look again from here
                self.note = (f"the weights of the best epoch before the resume ({self.best_epoch + 1}) were not "
                             f"kept ({found} is missing); the best is of the epochs trained after the resume")
                self.best, self.best_epoch, self.wait = None, 0, 0

        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            before = (self.best, self.best_epoch)
            super().on_epoch_end(epoch, logs)
            if (self.restore_best_weights and resumable and chief and self.best_epoch == epoch
                    and (self.best, self.best_epoch) != before and self.best_weights is not None):
                tmp = kept.with_name(".tmp." + kept.name)
                with open(tmp, "wb") as f:
                    np.savez(f, epoch=epoch, count=len(self.best_weights),
                             **{f"w{i}": w for i, w in enumerate(self.best_weights)})
                os.replace(tmp, kept)

        def on_train_end(self, logs: Optional[dict] = None) -> None:
            pass  # finish() restores, once the whole run has trained

        def finish(self) -> None:
            """Set the best epoch's weights (``restore_best_weights``), as Keras's ``on_train_end`` does."""
            if self.restore_best_weights and self.best_weights is not None:
                self.model.set_weights(self.best_weights)
                self.restored = True
            if chief:
                kept.unlink(missing_ok=True)

        def describe(self) -> str:
            """The console's line: where it stopped (or not), the best epoch and whether its weights were restored."""
            if self.best is None:
                return f"early stopping: {self.monitor} was never compared (no epoch past start_from_epoch)"
            stopped = (f"stopped after epoch {self.stopped_epoch + 1} ({self.monitor} did not improve in "
                       f"{self.wait} epoch{'s' if self.wait != 1 else ''})" if self.stopped_epoch > 0
                       else "did not stop early")
            return (f"early stopping: {stopped}; best epoch {self.best_epoch + 1} ({self.monitor} {self.best:.4f})"
                    + ("; its weights restored" if self.restored else ""))

        def record(self) -> dict[str, Any]:
            """``summary.json``'s ``early_stopping``: epochs counted from 1, as the console's lines."""
            fields = {"monitor": self.monitor, "mode": mode, "patience": self.patience,
                      "stopped_epoch": self.stopped_epoch + 1 if self.stopped_epoch > 0 else None,
                      "best_epoch": self.best_epoch + 1 if self.best is not None else None,
                      "best_value": float(self.best) if self.best is not None else None,
                      "restored_best_weights": self.restored}
            if self.note:
                fields["note"] = self.note
            return fields

    return RunEarlyStopping()
