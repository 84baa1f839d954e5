"""``train.lr_schedule``: learning-rate warmup and decay, planned in pure Python, built as a Keras schedule.

The peak rate is ``model.optimizer``'s ``learning_rate`` x the ``train.lr_scaling``
factor (:attr:`tfgpu.devices.plan_base.Plan.lr_scale`). A schedule warms up linearly from
``warmup_from`` (default: the unscaled rate when ``lr_scaling`` raises it, as in
Goyal et al. 2017, "Accurate, Large Minibatch SGD", https://arxiv.org/abs/1706.02677;
else 0) to the peak over ``warmup_epochs`` x steps per epoch optimizer steps, then
decays over the remaining steps (``constant``: stays at the peak).

This module imports neither TensorFlow nor Keras: :func:`normalize` (the schema's
check), :func:`resolve` and :meth:`Schedule.rate` (the values ``tfgpu plan`` prints)
are plain Python. :func:`keras_schedule` imports Keras when the trainer builds the
optimizer. The one class of tfgpu's own, :class:`Warmup` (a warmup before a schedule
without one built in), is defined on first use and registered with
``keras.saving.register_keras_serializable(package="tfgpu")``, so ``model.keras``
and checkpoints hold it: importing this module defines it when Keras is already
imported, and ``from tfgpu.model.schedules import Warmup`` always does, so a plain Keras
user loads a tfgpu model with ``import keras; import tfgpu.model.schedules`` before
``keras.saving.load_model``.
"""

from __future__ import annotations

import ast
import functools
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from ..config.keras_specs import GOYAL_WARMUP_EPOCHS, OWN_KEYS, WARMUP_FRACTION, class_of, is_number
from ..utils.keras_names import class_names, exported, keras_root, name_table


#: ExponentialDecay's ``decay_rate`` when not given: the rate falls to a tenth of the peak by the end of the run.
DEFAULT_DECAY_RATE = 0.1


def default_warmup_epochs(lr_scale: float, epochs: int) -> float:
    """The warmup when ``warmup_epochs`` is not given: none at scale 1, else ``min(5, epochs / 10)``.

    Goyal et al. warm up for 5 of 90 epochs (5.6% of the run); a short run
    cannot spend 5 epochs, so at most a tenth of it.
    """
    return 0.0 if lr_scale <= 1.0 else min(GOYAL_WARMUP_EPOCHS, WARMUP_FRACTION * epochs)


@dataclass(frozen=True)
class Schedule:
    """A resolved learning-rate schedule: every number the Keras schedule is built with.

    Attributes:
        name: the user's name (``cosine``); ``keras_class``: the Keras class (``None``: constant).
        base_rate: ``model.optimizer``'s learning rate; ``lr_scale``: the scaling factor;
            ``peak``: their product.
        warmup_from: the rate at step 0; ``warmup_epochs``/``warmup_steps``: the warmup's length
            (``warmup_default``: not given, :func:`default_warmup_epochs`).
        total_steps: ``epochs`` x ``steps_per_epoch``.
        args: the Keras class's arguments (``initial_learning_rate``, ``decay_steps``, ...).
        offset: the steps the decay is shifted by (the warmup's; 0 for piecewise, whose
            boundaries count from the run's start).
    """

    name: str
    keras_class: Optional[str]
    base_rate: float
    lr_scale: float
    peak: float
    warmup_from: float
    warmup_epochs: float
    warmup_steps: int
    warmup_default: bool
    total_steps: int
    steps_per_epoch: int
    args: dict[str, Any] = field(default_factory=dict)
    offset: int = 0

    def decay_rate_at(self, step: float) -> Optional[float]:
        """The Keras class's value at ``step`` (after the shift), in plain Python; ``None`` where unknown."""
        a, c = self.args, self.keras_class
        if c is None:
            return self.peak
        if c == "CosineDecay":
            s = min(step, a["decay_steps"])
            return a["initial_learning_rate"] * ((1 - a.get("alpha", 0.0)) * 0.5 * (
                1 + math.cos(math.pi * s / a["decay_steps"])) + a.get("alpha", 0.0))
        if c == "ExponentialDecay":
            p = step / a["decay_steps"]
            return a["initial_learning_rate"] * a["decay_rate"] ** (math.floor(p) if a.get("staircase") else p)
        if c == "InverseTimeDecay":
            p = step / a["decay_steps"]
            return a["initial_learning_rate"] / (1 + a["decay_rate"] * (math.floor(p) if a.get("staircase") else p))
        if c == "PolynomialDecay":
            end, power, steps = a.get("end_learning_rate", 0.0001), a.get("power", 1.0), a["decay_steps"]
            if a.get("cycle"):
                steps = steps * (1.0 if step == 0 else math.ceil(step / steps))
            else:
                step = min(step, steps)
            return (a["initial_learning_rate"] - end) * (1 - step / steps) ** power + end
        if c == "PiecewiseConstantDecay":
            bounds, values = a["boundaries"], a["values"]
            if step <= bounds[0]:
                return values[0]
            for low, high, value in zip(bounds, bounds[1:], values[1:-1]):
                if low < step <= high:
                    return value
            return values[-1]
        return None

    def rate(self, step: int) -> Optional[float]:
        """The learning rate the optimizer uses at ``step`` (its ``iterations``, from 0), as
        :func:`keras_schedule`'s schedule computes it; ``None`` for a Keras class tfgpu has no formula for."""
        if step < self.warmup_steps:
            return self.warmup_from + (self.peak - self.warmup_from) * step / self.warmup_steps
        return self.decay_rate_at(max(step - self.offset, 0))

    def points(self) -> dict[str, Optional[float]]:
        """The rate at the start, after the warmup and at the end of the run (``tfgpu plan``)."""
        return {"start": self.rate(0), "after_warmup": self.rate(self.warmup_steps), "end": self.rate(self.total_steps)}

    def describe(self, steps_known: bool = True) -> str:
        """One line: ``cosine (CosineDecay): warmup 0.3 epochs (6 steps) from 0.001 to 0.002, 0 at the end (step 60)``.

        ``steps_known=False`` (``tfgpu plan``, before the data is loaded): no step counts.
        """
        pts = self.points()
        shown = {k: ("? (computed at run time)" if v is None else f"{v:.4g}") for k, v in pts.items()}
        what = self.name if self.keras_class is None or self.name == self.keras_class else \
            f"{self.name} ({self.keras_class})"
        steps = f" ({self.warmup_steps} steps" if steps_known else " ("
        plural = "s" if self.warmup_epochs != 1 else ""
        warm = (f"warmup {self.warmup_epochs:g} epoch{plural}{steps}" + (", " if steps_known else "")
                + ("the default for a scaled rate" if self.warmup_default else "given").rstrip()
                + f") from {shown['start']} to {shown['after_warmup']}"
                if self.warmup_epochs and self.warmup_steps else f"no warmup, {shown['start']} at the start")
        end = f" (step {self.total_steps})" if steps_known else ""
        return f"{what}: {warm}, then {shown['end']} at the end{end}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the names, rates, steps and Keras arguments (``summary.json``, ``tfgpu plan --json``)."""
        return {"name": self.name, "keras_class": self.keras_class, "base_rate": self.base_rate,
                "lr_scale": self.lr_scale, "peak": self.peak, "warmup_from": self.warmup_from,
                "warmup_epochs": self.warmup_epochs, "warmup_steps": self.warmup_steps,
                "warmup_default": self.warmup_default, "total_steps": self.total_steps,
                "steps_per_epoch": self.steps_per_epoch, "args": dict(self.args), "offset": self.offset,
                "rates": self.points(), "description": self.describe()}


def resolve(spec: Optional[dict[str, Any]], base_rate: float, lr_scale: float, epochs: int,
            steps_per_epoch: int) -> Optional[Schedule]:
    """``train.lr_schedule`` (as :func:`normalize` returns it) -> a :class:`Schedule`; ``None`` for none.

    Args:
        spec: the checked mapping, or ``None``.
        base_rate: ``model.optimizer``'s learning rate (unscaled).
        lr_scale: ``train.lr_scaling``'s factor (:attr:`tfgpu.devices.plan_base.Plan.lr_scale`).
        epochs, steps_per_epoch: the run's length (optimizer steps = their product).
    """
    if spec is None:
        return None
    cls = class_of(spec["name"])
    peak = base_rate * lr_scale
    given = "warmup_epochs" in spec
    warmup_epochs = float(spec["warmup_epochs"]) if given else default_warmup_epochs(lr_scale, epochs)
    total = epochs * steps_per_epoch
    warmup_steps = min(int(round(warmup_epochs * steps_per_epoch)), max(total - 1, 0))
    warmup_from = float(spec.get("warmup_from", base_rate if lr_scale > 1.0 else 0.0))
    remaining = max(total - warmup_steps, 1)
    args = {k: v for k, v in spec.items() if k not in OWN_KEYS}
    offset = warmup_steps
    if "decay_epochs" in spec:
        args["decay_steps"] = max(int(round(spec["decay_epochs"] * steps_per_epoch)), 1)
    if cls == "PiecewiseConstantDecay":
        offset = 0
        if "boundaries_epochs" in spec:
            args["boundaries"] = [int(round(b * steps_per_epoch)) for b in spec["boundaries_epochs"]]
        if "factors" in spec:
            args["values"] = [float(f) * peak for f in spec["factors"]]
    elif cls is not None:
        args["initial_learning_rate"] = peak
        if cls == "CosineDecayRestarts":
            args.setdefault("first_decay_steps", remaining)
        else:
            args.setdefault("decay_steps", remaining)
        if cls == "ExponentialDecay":
            args.setdefault("decay_rate", DEFAULT_DECAY_RATE)
    return Schedule(name=spec["name"], keras_class=cls, base_rate=float(base_rate), lr_scale=float(lr_scale),
                    peak=peak, warmup_from=warmup_from, warmup_epochs=warmup_epochs, warmup_steps=warmup_steps,
                    warmup_default=not given, total_steps=total, steps_per_epoch=steps_per_epoch, args=args,
                    offset=offset)


@functools.lru_cache(maxsize=None)
def default_rate(optimizer: str) -> Optional[float]:
    """The default ``learning_rate`` of a Keras optimizer class, read from Keras's source (no import), or ``None``."""
    module = (exported("keras.optimizers") or {}).get(optimizer)
    root = keras_root()
    if not module or root is None:
        return None
    path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == optimizer:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = item.args.args[-len(item.args.defaults):] if item.args.defaults else []
                    for arg, default in zip(args, item.args.defaults):
                        if arg.arg == "learning_rate" and isinstance(default, ast.Constant):
                            return float(default.value)
    return None


def base_rate_of(optimizer_spec: Any) -> Optional[float]:
    """``model.optimizer`` -> its unscaled learning rate without Keras: the given number or the class's default."""
    name, args = (optimizer_spec, {}) if isinstance(optimizer_spec, str) else (
        optimizer_spec.get("name"), optimizer_spec)
    rate = args.get("learning_rate")
    if is_number(rate):
        return float(rate)
    if rate is not None:
        return None
    # The spellings tfgpu.utils.keras_names.name_table accepts (Adam, adam); an unknown name is the model check's to report.
    classes = name_table("optimizer", class_names("optimizer") or [])
    cls = classes.get(str(name)) or classes.get(str(name).lower())
    return default_rate(cls) if cls else None


#: Steps per epoch ``tfgpu plan`` assumes (it does not load the data); the rates it prints do not depend on it
#: unless the schedule's own arguments count steps (``decay_steps``, ``boundaries``).
PLAN_STEPS_PER_EPOCH = 1000


def for_plan(spec: Optional[dict[str, Any]], optimizer_spec: Any, lr_scale: float,
             epochs: int) -> Optional[dict[str, Any]]:
    """``train.lr_schedule`` as ``tfgpu plan`` shows it (no Keras, no data): :meth:`Schedule.to_dict` with
    :data:`PLAN_STEPS_PER_EPOCH`, plus ``"line"``; ``None`` without a schedule.

    The rates are the unscaled optimizer rate's (:func:`base_rate_of`); where it is not a number,
    ``{"description": ...}`` says so.
    """
    if spec is None:
        return None
    base = base_rate_of(optimizer_spec)
    if base is None:
        return {"name": spec["name"], "line": "learning-rate schedule: model.optimizer's learning_rate is not a "
                "number; the schedule is checked when the optimizer is built"}
    sched = resolve(spec, base, lr_scale, epochs, PLAN_STEPS_PER_EPOCH)
    counted = [k for k in ("decay_steps", "boundaries", "first_decay_steps") if k in spec]
    note = (f" (its {', '.join(counted)} count steps: the rates assume {PLAN_STEPS_PER_EPOCH} steps per epoch)"
            if counted else "")
    data = sched.to_dict()
    data.update(steps_per_epoch=None, warmup_steps=None, total_steps=None,
                description=sched.describe(steps_known=False) + note)
    data["line"] = f"learning-rate schedule: {data['description']}"
    return data


def check_optimizer_rate(optimizer_spec: Any, lr_schedule: Optional[dict[str, Any]] = None) -> None:
    """Check, before TensorFlow starts, a ``model.optimizer`` ``learning_rate: {CosineDecay: {...}}``.

    Raises:
        ConfigError: the mapping names no ``keras.optimizers.schedules`` class (with the closest name),
            or ``train.lr_schedule`` is set too.
    """
    from ..errors import ConfigError  # noqa: PLC0415

    rate = optimizer_spec.get("learning_rate") if isinstance(optimizer_spec, dict) else None
    if isinstance(rate, dict) and len(rate) == 1:
        name = str(next(iter(rate)))
        try:
            found = class_of(name)
        except ValueError as exc:
            found, text = None, str(exc)
        else:
            text = f"'{name}' is not a Keras schedule class"
        if found is None:
            raise ConfigError(f"model.optimizer: learning_rate: {text}.",
                              "name a keras.optimizers.schedules class, e.g. {CosineDecay: "
                              "{initial_learning_rate: 0.001, decay_steps: 1000}}, or use train.lr_schedule.")
        if lr_schedule is not None:
            raise ConfigError("model.optimizer: the learning rate is a schedule, which tfgpu cannot combine with "
                              "train.lr_schedule.", "give model.optimizer a number as learning_rate (train.lr_schedule "
                              "then scales and warms it up), or remove train.lr_schedule.")


def keras_schedule(sched: Schedule) -> Any:
    """The Keras ``LearningRateSchedule`` (or a float, for ``constant`` without warmup) to give the optimizer.

    ``cosine`` with a warmup is one ``keras.optimizers.schedules.CosineDecay`` (its
    built-in ``warmup_target``/``warmup_steps``); other schedules with a warmup
    are wrapped in :class:`Warmup`. Wraps
    https://keras.io/api/optimizers/learning_rate_schedules/

    Raises:
        ConfigError: the Keras class refuses the arguments.
    """
    import keras  # noqa: PLC0415

    from ..errors import ConfigError  # noqa: PLC0415

    if sched.keras_class is None:
        if not sched.warmup_steps:
            return sched.peak
        return warmup_class()(sched.warmup_from, sched.peak, sched.warmup_steps)
    cls = getattr(keras.optimizers.schedules, sched.keras_class)
    args = dict(sched.args)
    if sched.keras_class == "CosineDecay" and sched.warmup_steps:
        args.update(initial_learning_rate=sched.warmup_from, warmup_target=sched.peak,
                    warmup_steps=sched.warmup_steps)
    try:
        decay = cls(**args)
    except Exception as exc:  # Keras raises TypeError/ValueError for arguments that do not fit
        raise ConfigError(f"train.lr_schedule: {sched.keras_class}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
                          f" failed: {exc}.",
                          f"check the arguments against https://keras.io/api/optimizers/learning_rate_schedules/ "
                          f"for {sched.keras_class}.") from None
    if not sched.warmup_steps or sched.keras_class == "CosineDecay":
        return decay
    return warmup_class()(sched.warmup_from, sched.peak, sched.warmup_steps, decay, sched.offset)


@functools.lru_cache(maxsize=None)
def warmup_class() -> type:
    """Define (once) and register tfgpu's ``Warmup`` schedule; imports Keras.

    ``Warmup(initial_learning_rate, warmup_target, warmup_steps, after=None, offset=0)``:
    linear from ``initial_learning_rate`` at step 0 to ``warmup_target`` at
    ``warmup_steps``, then ``after(step - offset)`` (a ``LearningRateSchedule``),
    or ``warmup_target`` when ``after`` is ``None``. Serialized as ``tfgpu>Warmup``.
    """
    import keras  # noqa: PLC0415
    from keras import ops  # noqa: PLC0415

    @keras.saving.register_keras_serializable(package="tfgpu")
    class Warmup(keras.optimizers.schedules.LearningRateSchedule):
        """A linear warmup before another schedule (Goyal et al. 2017)."""

        def __init__(self, initial_learning_rate: float, warmup_target: float, warmup_steps: int,
                     after: Any = None, offset: int = 0, name: str = "Warmup") -> None:
            super().__init__()
            if isinstance(after, dict):
                after = keras.optimizers.schedules.deserialize(after)
            self.initial_learning_rate, self.warmup_target = float(initial_learning_rate), float(warmup_target)
            self.warmup_steps, self.after, self.offset, self.name = int(warmup_steps), after, int(offset), name

        def __call__(self, step: Any) -> Any:
            step = ops.cast(step, "float32")
            ramp = self.initial_learning_rate + (self.warmup_target - self.initial_learning_rate) * (
                step / max(self.warmup_steps, 1))
            later = (ops.cast(self.after(ops.maximum(step - self.offset, 0.0)), "float32")
                     if self.after is not None else ops.cast(self.warmup_target, "float32"))
            return ops.where(step < self.warmup_steps, ramp, later)

        def get_config(self) -> dict[str, Any]:
            return {"initial_learning_rate": self.initial_learning_rate, "warmup_target": self.warmup_target,
                    "warmup_steps": self.warmup_steps, "offset": self.offset, "name": self.name,
                    "after": None if self.after is None else keras.optimizers.schedules.serialize(self.after)}

    Warmup.__module__ = __name__
    return Warmup


def __getattr__(name: str) -> Any:
    if name == "Warmup":
        return warmup_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def learning_rate_callback(optimizer: Any) -> Any:
    """A Keras callback that puts the optimizer's current rate into each epoch's logs as ``learning_rate``.

    Placed before ``CSVLogger``, it gives ``metrics.csv`` a ``learning_rate``
    column: the rate the next step uses (the schedule at ``optimizer.iterations``
    at the end of the epoch). Both loops pass the same logs dict on down the
    callback list. Wraps https://keras.io/api/callbacks/base_callback/
    """
    import keras  # noqa: PLC0415

    class LearningRate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            if logs is not None:
                # the model's optimizer where it has one: train.unfreeze recompiles with a new one (tfgpu.model.transfer)
                current = getattr(self.model, "optimizer", None) or optimizer
                logs["learning_rate"] = float(keras.ops.convert_to_numpy(current.learning_rate))

    return LearningRate()


if "keras" in sys.modules:  # a Keras user's `import keras; import tfgpu.model.schedules` registers tfgpu>Warmup
    warmup_class()
