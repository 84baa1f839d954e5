"""Recipe entries that name Keras classes, checked without importing Keras: ``train.lr_schedule``, ``data.augment``.

The schema's validators (:mod:`tfgpu.config.schema`) call these, so a misspelt schedule or
preprocessing layer is a config error (exit 3) with the file:line, before TensorFlow starts. Keras's
class names are read from its package files (:mod:`tfgpu.utils.keras_names`), so this module imports
neither Keras nor TensorFlow. Building the objects they name is the model's and the data's job
(:mod:`tfgpu.model.schedules`, :mod:`tfgpu.data.augment`).
"""

from __future__ import annotations

import difflib
import functools
import math
from typing import Any, Optional

from ..utils.keras_names import class_names, name_table


#: tfgpu's short names -> the Keras class (``None``: a constant rate after the warmup).
SHORT_NAMES: dict[str, Optional[str]] = {"constant": None, "cosine": "CosineDecay",
                                         "exponential": "ExponentialDecay", "piecewise": "PiecewiseConstantDecay"}


#: Keys tfgpu reads itself; every other key is an argument of the Keras class.
OWN_KEYS = ("name", "warmup_epochs", "warmup_from", "decay_epochs", "boundaries_epochs", "factors")


#: Keras 3.15's schedule classes, used when Keras's files cannot be read (:func:`tfgpu.utils.keras_names.class_names`).
_FALLBACK = ["CosineDecay", "CosineDecayRestarts", "ExponentialDecay", "InverseTimeDecay", "PiecewiseConstantDecay",
             "PolynomialDecay"]


#: Goyal et al.'s warmup: 5 epochs (of 90, for ImageNet at 8k images per batch) ...
GOYAL_WARMUP_EPOCHS = 5.0


#: ... at most this fraction of a shorter run, so 90% or more of the steps train at (or decay from) the peak.
WARMUP_FRACTION = 0.1


@functools.lru_cache(maxsize=None)
def _table() -> dict[str, Optional[str]]:
    """Every spelling ``name`` may take -> the Keras class (``None``: constant): the short names, then
    :func:`tfgpu.utils.keras_names.name_table`'s spellings of the classes."""
    table: dict[str, Optional[str]] = dict(SHORT_NAMES)
    for spelling, cls in name_table("schedule", class_names("schedule") or _FALLBACK).items():
        table.setdefault(spelling, cls)
    return table


def valid_names() -> list[str]:
    """The names ``train.lr_schedule.name`` accepts, short names first, then the Keras classes."""
    return [*SHORT_NAMES, *sorted(set(c for c in _table().values() if c))]


def class_of(name: str) -> Optional[str]:
    """``cosine``/``CosineDecay``/``cosine_decay`` -> ``"CosineDecay"``; ``constant`` -> ``None``.

    Raises:
        ValueError: no such schedule, with the closest name and the valid ones.
    """
    table = _table()
    if name in table or name.lower() in table:
        return table.get(name, table.get(name.lower()))
    close = difflib.get_close_matches(name, list(table), n=1, cutoff=0.6)
    guess = f" Did you mean '{close[0]}'?" if close else ""
    raise ScheduleError(f"'{name}' is not a learning-rate schedule.{guess} Valid names: {', '.join(valid_names())} "
                        "(or their snake_case forms; see https://keras.io/api/optimizers/learning_rate_schedules/)",
                        "name")


class ScheduleError(ValueError):
    """A bad ``train.lr_schedule``; ``key``: the sub-key at fault (``warmup_epochs``), or ``None``."""

    def __init__(self, text: str, key: Optional[str] = None) -> None:
        super().__init__(text)
        self.key = key


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def normalize(value: Any) -> Optional[dict[str, Any]]:
    """Check ``train.lr_schedule`` (the schema's validator; no Keras import) and return it as a mapping.

    Args:
        value: ``None``, a name (``cosine``) or a mapping ``{name, warmup_epochs, ...Keras arguments}``.

    Returns:
        ``None`` or ``{"name": ..., ...}`` (a bare name becomes ``{"name": name}``).

    Raises:
        ScheduleError: (a ``ValueError``) not a name or mapping, an unknown name (listing the valid ones), a bad
            ``warmup_epochs``/``warmup_from``/``decay_epochs``/``boundaries_epochs``/``factors``,
            ``initial_learning_rate`` given (tfgpu sets it), or ``piecewise`` without boundaries or values.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ValueError("expected a schedule name (e.g. cosine) or a mapping with a name, e.g. "
                         "{name: cosine, warmup_epochs: 2}")
    spec = dict(value)
    cls = class_of(spec["name"])
    for key in ("warmup_epochs", "warmup_from"):
        if key in spec and not (is_number(spec[key]) and spec[key] >= 0):
            raise ScheduleError(f"{key} must be a number >= 0 (warmup_epochs: epochs, may be fractional; "
                                "warmup_from: a learning rate)", key)
    if "decay_epochs" in spec and not (is_number(spec["decay_epochs"]) and spec["decay_epochs"] > 0):
        raise ScheduleError("decay_epochs must be a number > 0 (epochs to decay over)", "decay_epochs")
    for key in ("initial_learning_rate", "warmup_target", "warmup_steps"):
        if key in spec:
            raise ScheduleError(f"{key} is set by tfgpu: the peak rate is model.optimizer's learning_rate x the "
                                "train.lr_scaling factor, the warmup is warmup_epochs from warmup_from; remove "
                                f"{key} and set those instead", key)
    if "boundaries_epochs" in spec:
        b = spec["boundaries_epochs"]
        if not (isinstance(b, list) and b and all(is_number(x) and x > 0 for x in b)
                and all(x < y for x, y in zip(b, b[1:]))):
            raise ScheduleError("boundaries_epochs must be a list of increasing epochs > 0, e.g. [30, 60]",
                                "boundaries_epochs")
        if "boundaries" in spec:
            raise ValueError("boundaries (steps) and boundaries_epochs are both set; set one of them")
    if "factors" in spec:
        f = spec["factors"]
        if not (isinstance(f, list) and all(is_number(x) and x >= 0 for x in f)):
            raise ScheduleError("factors must be a list of numbers >= 0 (multiples of the peak rate), e.g. "
                                "[1, 0.1, 0.01]", "factors")
        if "values" in spec:
            raise ValueError("values (rates) and factors (multiples of the peak rate) are both set; set one of them")
    if cls == "PiecewiseConstantDecay":
        bounds = spec.get("boundaries_epochs", spec.get("boundaries"))
        values = spec.get("factors", spec.get("values"))
        if bounds is None or values is None:
            raise ValueError("piecewise needs boundaries_epochs (or boundaries, in steps) and factors (multiples of "
                             "the peak rate; or values, rates), e.g. {name: piecewise, boundaries_epochs: [3, 6], "
                             "factors: [1, 0.1, 0.01]}")
        if not isinstance(values, list) or not isinstance(bounds, list) or len(values) != len(bounds) + 1:
            raise ScheduleError(f"piecewise needs one more factor (or value) than boundaries: {len(bounds)} "
                                f"boundaries, so {len(bounds) + 1} factors")
    elif "boundaries_epochs" in spec or "factors" in spec:
        raise ValueError("boundaries_epochs and factors are piecewise's keys; remove them or set name: piecewise")
    return spec


def check_length(spec: Optional[dict[str, Any]], epochs: int) -> None:
    """Raise ``ValueError`` when the warmup is as long as the run or longer (the schema's check across keys)."""
    if spec is not None and spec.get("warmup_epochs", 0) >= epochs:
        raise ValueError(f"the warmup ({spec['warmup_epochs']:g} epochs) is as long as the run or longer "
                         f"(train.epochs: {epochs}); set warmup_epochs below {epochs}, e.g. "
                         f"{min(GOYAL_WARMUP_EPOCHS, WARMUP_FRACTION * epochs):g}, or more epochs")


#: Image layers of keras.layers that are no augmentation of (image, label) batches here: MixUp and CutMix mix
#: the labels too (they need one-hot labels passed with the images), MaxNumBoundingBoxes pads bounding boxes.
EXCLUDED = frozenset({"MixUp", "CutMix", "MaxNumBoundingBoxes"})


#: Layers whose output has another height and width than their input: only ``augment_on: model`` (the model
#: then resizes validation and test images the same way, in inference mode).
RESHAPING = frozenset({"RandomCrop", "CenterCrop", "Resizing"})


EXAMPLES = "RandomFlip, RandomRotation, RandomZoom, RandomTranslation, RandomContrast, RandomBrightness"


def spec_of(item: Any) -> tuple[str, dict[str, Any]]:
    """A ``data.augment`` item (``Name``, ``{Name: {args}}`` or ``{Name: null}``) -> ``(name, args)``.

    Raises:
        ValueError: the item is neither.
    """
    if isinstance(item, str) and item:
        return item, {}
    if isinstance(item, dict) and len(item) == 1:
        (name, args), = item.items()
        if isinstance(name, str) and (args is None or isinstance(args, dict)):
            return name, dict(args or {})
        if isinstance(name, str) and isinstance(args, (int, float, list)) and not isinstance(args, bool):
            return name, {"factor": args}  # RandomRotation: 0.05 -> factor=0.05
    raise ValueError("each item is a layer class name or {ClassName: {argument: value}}, e.g. "
                     "[RandomFlip, {RandomRotation: {factor: 0.05}}]")


def allowed_names() -> Optional[list[str]]:
    """The image preprocessing layers ``data.augment`` accepts, read from Keras's files (no import), or ``None``."""
    from ..utils.keras_names import exported  # noqa: PLC0415

    names = exported("keras.layers")
    if names is None:
        return None
    return sorted(n for n, module in names.items()
                  if ".image_preprocessing." in module and n[:1].isupper() and n not in EXCLUDED)


def check_names(items: list[Any]) -> None:
    """Check ``data.augment``'s items and names without importing Keras (a schema validator calls it).

    Raises:
        ValueError: a malformed item, or a name that is no image preprocessing layer (with the closest one
            and the list); pydantic turns it into a configuration error at the item's file:line.
    """
    allowed = allowed_names()
    for i, item in enumerate(items):
        name, _ = spec_of(item)
        if allowed is None or name in allowed:
            continue
        close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
        guess = f" Did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"item {i}: '{name}' is not a Keras image preprocessing layer.{guess} The layers are: "
                         f"{', '.join(allowed)} (class names as Keras spells them)")
