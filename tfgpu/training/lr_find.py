"""``tfgpu lr-find RECIPE``: Smith's learning-rate range test on the recipe's own data, model and devices.

The recipe's model trains for ``steps`` optimizer steps (``fit`` with tfgpu's
step: its replicas, gradient accumulation and clipping) while the learning rate
grows exponentially from ``low`` to ``high``, one value a step; each step's own
loss is recorded (the metrics are reset before each step), smoothed with an
exponential moving average (0.9, bias-corrected), and the test stops early once
the smoothed loss exceeds 4 x its lowest (it diverged). The suggestion is the rate
of the steepest descent of the smoothed loss against ``log10(rate)`` before its
lowest point (Lightning's and fastai's "steepest" rule); the loss curve is drawn
into a PNG with the suggestion marked, and the rates and losses written to a CSV.

The suggested rate is the one the optimizer applies: with ``train.lr_scaling``
the recipe's ``learning_rate`` is that over the scale, and the ``--set`` line
printed is the recipe's value. Nothing of the recipe's run directory is written.

Leslie N. Smith, "Cyclical Learning Rates for Training Neural Networks", WACV 2017, section 3.3,
https://arxiv.org/abs/1506.01186.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import OutputError, UsageError
from ..model.keras_model import inner_optimizer
from ..utils.files import replace_atomic
from ..utils.imports import importable

#: The smoothing of the recorded losses (an exponential moving average, bias-corrected): about a 10-step window.
#: fastai's and Lightning's 0.98 (a 50-step window) lagged the seed CNN's fall by a decade of rate over 100 steps.
SMOOTHING = 0.9
#: The test stops once the smoothed loss exceeds this many times its lowest.
DIVERGED = 4.0


@dataclass(frozen=True)
class RangeTest:
    """A finished range test.

    Attributes:
        rates: the learning rate of each step (as the optimizer applied it).
        losses: each step's training loss; smoothed: their moving average.
        suggestion: the suggested rate (as applied), or ``None`` when the loss never fell.
        lr_scale: ``train.lr_scaling``'s factor: the recipe's ``learning_rate`` is ``suggestion / lr_scale``.
        set_line: the ``--set`` argument that gives the recipe the suggestion.
        stopped: why the test ended early (``"diverged"``, ``"nan"``), or ``None``.
        files: the CSV and (with matplotlib) the PNG written.
    """

    rates: list[float]
    losses: list[float]
    smoothed: list[float]
    suggestion: Optional[float]
    lr_scale: float
    set_line: Optional[str]
    stopped: Optional[str]
    files: list[str]


def rates_between(low: float, high: float, steps: int) -> list[float]:
    """``steps`` rates growing exponentially from ``low`` to ``high`` (both included)."""
    if steps == 1:
        return [low]
    return [low * (high / low) ** (i / (steps - 1)) for i in range(steps)]


def smooth(losses: Sequence[float], beta: float = SMOOTHING) -> list[float]:
    """The bias-corrected exponential moving average of ``losses`` (the first is itself)."""
    out, average = [], 0.0
    for i, loss in enumerate(losses, 1):
        average = beta * average + (1 - beta) * loss
        out.append(average / (1 - beta ** i))
    return out


def steepest(rates: Sequence[float], smoothed: Sequence[float]) -> Optional[float]:
    """The rate where the smoothed loss falls fastest against ``log10(rate)``, before its lowest point; ``None``
    when it never falls (central differences; the first and last tenth of the range are left out, where the
    average is still settling or already diverging)."""
    if len(rates) < 5:
        return None
    lowest = min(range(len(smoothed)), key=smoothed.__getitem__)
    first = max(1, len(rates) // 10)
    best, slope = None, 0.0
    for i in range(first, min(lowest + 1, len(rates) - 1)):
        change = (smoothed[i + 1] - smoothed[i - 1]) / (math.log10(rates[i + 1]) - math.log10(rates[i - 1]))
        if change < slope:
            best, slope = i, change
    return rates[best] if best is not None else None


def set_line(optimizer: Any, rate: float) -> str:
    """The ``--set`` argument that gives ``model.optimizer`` (a name or a mapping) the learning rate ``rate``,
    its other arguments kept."""
    from ..model.keras_model import _split_spec  # noqa: PLC0415

    name, args = _split_spec(optimizer)
    items = ", ".join(f"{k}: {v}" for k, v in {"name": name, **args, "learning_rate": float(f"{rate:.3g}")}.items())
    return f"--set 'model.optimizer={{{items}}}'"


def lr_find(recipe: Optional[str], overrides: Sequence[str] = (), out: str = "lr_find.png", steps: int = 100,
            low: float = 1e-7, high: float = 10.0) -> RangeTest:
    """Run the range test (see the module's docstring).

    Args:
        recipe: the YAML recipe; overrides: ``--set`` strings.
        out: the picture (``.png``); the CSV is written beside it (``.csv``).
        steps: optimizer steps the rate grows over; low, high: its first and last value.

    Raises:
        UsageError: ``low``/``high``/``steps`` out of range, a picture that is not a ``.png``.
        OutputError: ``out``'s folder does not exist or is not writable.
        ConfigError, DeviceError, DataError: as ``tfgpu run`` would for this recipe.
    """
    from ..config import load_config  # noqa: PLC0415
    from ..data import load, source_for  # noqa: PLC0415
    from ..devices.setup import _setup  # noqa: PLC0415
    from . import batch_finder, preflight  # noqa: PLC0415
    from .loops.fit import train_fit  # noqa: PLC0415
    from .runner import run_seed  # noqa: PLC0415
    from .trainer import Trainer  # noqa: PLC0415

    picture = _check(out, steps, low, high)
    cfg = load_config(recipe, overrides=[*overrides, "train.lr_schedule=null", "train.steps_per_execution=1",
                                         "train.early_stopping=null", "train.callbacks=[]", "train.unfreeze=null",
                                         "train.steps_per_epoch=null", "output.mlflow=null"])
    preflight.check(cfg, files=False)  # (no run directory is written)
    cfg, _ = batch_finder.resolved(cfg)  # train.batch_size_per_replica: auto (the cache, or trials)
    source = source_for(cfg.data, cfg.model.loss, cfg.tensorflow.seed)
    source.check()
    info = _setup(cfg, keep_log=False)
    data, pipes = load(cfg, info, source, seed=run_seed(cfg, info, None))
    trainer = Trainer(cfg, info, data, pipes)
    rates = rates_between(low, high, steps)
    passes = math.ceil(steps / pipes.steps_per_epoch) + 1
    job = dataclasses.replace(trainer.job(), epochs=1, steps_per_epoch=steps, validation=None, validation_steps=0,
                              terminate_on_nan=False,
                              train_epochs=lambda epochs, skip=0, **kw: pipes.train_epochs(passes, skip, **kw))
    record = _Record(trainer.model, trainer.optimizer, rates)
    train_fit(job, [record.callback()], "none")
    losses = record.losses
    smoothed = smooth(losses)
    stopped = record.stopped
    suggestion = steepest(rates[:len(losses)], smoothed)
    scale = info.plan.lr_scale
    line = set_line(cfg.model.optimizer, suggestion / scale) if suggestion else None
    files = [_write_csv(picture.with_suffix(".csv"), rates, losses, smoothed)]
    if importable("matplotlib"):
        files.append(_draw(picture, rates[:len(losses)], losses, smoothed, suggestion))
    return RangeTest(rates[:len(losses)], losses, smoothed, suggestion, scale, line, stopped, files)


class _Record:
    """The range test's per-step rate setting and loss reading, as a Keras callback (:meth:`callback`)."""

    def __init__(self, model: Any, optimizer: Any, rates: list[float]) -> None:
        self.model, self.rates = model, rates
        self.optimizer = inner_optimizer(optimizer)
        self.losses: list[float] = []
        self.stopped: Optional[str] = None

    def callback(self) -> Any:
        import keras  # noqa: PLC0415

        record = self

        class RangeTestCallback(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
                model = self.model  # (on JAX, reading it writes the trainer's state back into the variables)
                record.optimizer.learning_rate.assign(record.rates[min(batch, len(record.rates) - 1)])
                model.reset_metrics()  # the step's own loss, not the epoch's running mean

            def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
                loss = float((logs or {}).get("loss", float("nan")))
                record.losses.append(loss)
                if not math.isfinite(loss):
                    record.stopped = "nan"
                else:
                    averaged = smooth([x for x in record.losses if math.isfinite(x)])
                    if len(averaged) > 1 and averaged[-1] > DIVERGED * min(averaged):
                        record.stopped = "diverged"
                if record.stopped:
                    record.model.stop_training = True

        return RangeTestCallback()


def _check(out: str, steps: int, low: float, high: float) -> Path:
    path = Path(out)
    if not 0 < low < high:
        raise UsageError(f"tfgpu lr-find: the range {low:g} to {high:g} is not a range of rates: the lowest must be "
                         "above 0 and below the highest.", "e.g. --low 1e-7 --high 10 (the defaults).")
    if steps < 10:
        raise UsageError(f"tfgpu lr-find: --steps {steps} is too few to find a slope.", "use --steps 100 (the default) "
                         "or more; at least 10.")
    if path.suffix.lower() != ".png":
        raise UsageError(f"tfgpu lr-find: -o '{out}' is not a .png file; the curve is drawn as a PNG and the figures "
                         "written beside it as a CSV.", f"name a PNG, e.g. -o {path.with_suffix('.png').name}.")
    if not path.parent.is_dir() or not path.parent.exists():
        raise OutputError(f"tfgpu lr-find: -o '{out}': its folder '{path.parent}' does not exist.",
                          f"create it first (mkdir -p {path.parent}), or name a file in an existing folder.")
    return path


def _write_csv(path: Path, rates: list[float], losses: list[float], smoothed: list[float]) -> str:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "learning_rate", "loss", "smoothed_loss"])
        for i, (rate, loss, avg) in enumerate(zip(rates, losses, smoothed), 1):
            writer.writerow([i, f"{rate:.6g}", f"{loss:.6g}", f"{avg:.6g}"])
    return str(path)


def _draw(path: Path, rates: list[float], losses: list[float], smoothed: list[float],
          suggestion: Optional[float]) -> str:
    """The loss against the rate (log axis): each step's loss faint, the smoothed curve, the suggestion marked."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # noqa: PLC0415

    figure = Figure(figsize=(8, 4.5), dpi=100)
    axes = figure.add_subplot()
    axes.plot(rates, losses, color="0.75", linewidth=0.8, label="loss of each step")
    axes.plot(rates, smoothed, color="C0", linewidth=2, label=f"smoothed (EMA {SMOOTHING})")
    if suggestion is not None:
        axes.axvline(suggestion, color="C3", linestyle="--", label=f"suggested {suggestion:.3g} (steepest descent)")
    axes.set_xscale("log")
    finite = [x for x in smoothed if math.isfinite(x)]
    lowest = min([x for x in losses if math.isfinite(x)] + finite, default=None)
    if finite and lowest is not None:
        axes.set_ylim(lowest * 0.9, min(max(finite), DIVERGED * min(finite)) * 1.1)
    axes.set_xlabel("learning rate (as applied)")
    axes.set_ylabel("training loss")
    axes.set_title(f"learning-rate range test, {len(rates)} steps")
    axes.legend(loc="upper left")
    axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    replace_atomic(path, lambda tmp: figure.savefig(tmp, format="png"), path.with_name(f".{path.name}.tmp.png"))
    return str(path)
