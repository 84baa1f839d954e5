"""Validation errors -> one-paragraph messages naming the key, its file:line, the value and what is allowed.

Pydantic's structured error is read (``type``, ``loc``, ``input``'s place in
the data, ``ctx``: ``ctx['ge']``, ``ctx['expected']``, ``ctx['error']``, ...),
never its English ``msg``: :func:`requirement` writes what is allowed from
``type`` and ``ctx`` (in pydantic 2's words, so messages read as before), so a
pydantic release that rewords its messages changes none of tfgpu's. ``msg`` is
shown only for tfgpu's own errors (``PydanticCustomError``, whose text is
tfgpu's) and, as a last resort, for a type :data:`REQUIREMENTS` does not know.
Imports nothing from the rest of the config package.
"""

from __future__ import annotations

import datetime
import difflib
import reprlib
import typing
from typing import Any, Callable, Optional

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxtuple, _REPR.maxset = 3, 8, 6, 8, 8
_REPR.maxstring, _REPR.maxother = 80, 80


def short_repr(value: Any) -> str:
    """``repr`` bounded in depth and length (a value may be a huge or alias-shared structure)."""
    text = _REPR.repr(value)
    return text[:77] + "..." if len(text) > 80 else text


def describe(value: Any) -> str:
    return f"{short_repr(value)} ({type(value).__name__})"


def _number(value: Any) -> str:
    """A bound as a user wrote it: ``1`` for a float field's ``1.0`` (pydantic stores ``le=1`` as ``1.0``)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


def _items(n: Any) -> str:
    return f"{n} item" + ("" if n == 1 else "s")


def _chars(n: Any) -> str:
    return f"{n} character" + ("" if n == 1 else "s")


#: What is allowed, per pydantic error ``type``, written from the error's ``ctx`` alone.
REQUIREMENTS: dict[str, Callable[[dict[str, Any]], str]] = {
    "bool_type": lambda c: "Input should be a valid boolean",
    "int_type": lambda c: "Input should be a valid integer",
    "int_from_float": lambda c: "Input should be a valid integer, got a number with a fractional part",
    "float_type": lambda c: "Input should be a valid number",
    "finite_number": lambda c: "Input should be a finite number",
    "string_type": lambda c: "Input should be a valid string",
    "list_type": lambda c: "Input should be a valid list",
    "dict_type": lambda c: "Input should be a valid dictionary",
    "none_required": lambda c: "Input should be None",
    "missing": lambda c: "Field required",
    "model_type": lambda c: f"Input should be a valid dictionary or instance of {c['class_name']}",
    "greater_than": lambda c: f"Input should be greater than {_number(c['gt'])}",
    "greater_than_equal": lambda c: f"Input should be greater than or equal to {_number(c['ge'])}",
    "less_than": lambda c: f"Input should be less than {_number(c['lt'])}",
    "less_than_equal": lambda c: f"Input should be less than or equal to {_number(c['le'])}",
    "multiple_of": lambda c: f"Input should be a multiple of {_number(c['multiple_of'])}",
    "literal_error": lambda c: f"Input should be {c['expected']}",
    "enum": lambda c: f"Input should be {c['expected']}",
    "string_pattern_mismatch": lambda c: f"String should match pattern '{c['pattern']}'",
    "string_too_short": lambda c: f"String should have at least {_chars(c['min_length'])}",
    "string_too_long": lambda c: f"String should have at most {_chars(c['max_length'])}",
    "too_short": lambda c: (f"{c.get('field_type', 'Value')} should have at least {_items(c['min_length'])} "
                            f"after validation, not {c['actual_length']}"),
    "too_long": lambda c: (f"{c.get('field_type', 'Value')} should have at most {_items(c['max_length'])} "
                           f"after validation, not {c['actual_length']}"),
    # A ValueError/AssertionError raised by a check of tfgpu's (schema.py): its own text.
    "value_error": lambda c: str(c["error"]),
    "assertion_error": lambda c: str(c["error"]),
}


def requirement(err: Any) -> str:
    """What one pydantic error (an item of ``ValidationError.errors()``) says is allowed, from its ``type`` and
    ``ctx``: ``{"type": "greater_than_equal", "ctx": {"ge": 1}, ...}`` -> ``"Input should be greater than or equal
    to 1"``. ``msg`` is returned only for a type not in :data:`REQUIREMENTS` (tfgpu's own ``PydanticCustomError``
    types, such as ``key_error``, whose text is tfgpu's)."""
    render = REQUIREMENTS.get(err["type"])
    if render is not None:
        try:
            return render(err.get("ctx") or {})
        except KeyError:  # a ctx without the key this type has always carried
            pass
    return err["msg"]


def _lookup(data: Any, loc: tuple) -> tuple[bool, Any]:
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return False, None
    return True, node


def _section_type(annotation: Any) -> tuple[Optional[type[BaseModel]], bool]:
    """The section model an annotation holds, and whether as the values of a mapping.

    ``DevicesConfig`` -> (DevicesConfig, False); ``Optional[dict[str, FeatureSpec]]`` (also
    inside ``Annotated`` and unions) -> (FeatureSpec, True); anything else -> (None, False).
    """
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is dict and len(args) == 2:
        inner, _ = _section_type(args[1])
        return inner, inner is not None
    for arg in args:
        found = _section_type(arg)
        if found[0] is not None:
            return found
    return None, False


def _section_model(loc: tuple, root: type[BaseModel]) -> Optional[type[BaseModel]]:
    """The section model at ``loc`` (``("data", "features", "image")`` -> FeatureSpec), else None."""
    model: Any = root
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        field = model.model_fields.get(part) if isinstance(part, str) else None
        inner, by_name = _section_type(field.annotation) if field is not None else (None, False)
        if inner is None or (by_name and not parts):
            return None
        if by_name:
            parts.pop(0)  # the mapping's own key (a feature's name)
        model = inner
    return model


def _allowed_keys(loc: tuple, root: type[BaseModel]) -> list[str]:
    model = _section_model(loc, root)
    return list(model.model_fields) if model is not None else []


#: Where docs/config.md maps the old tutorials' names to tfgpu's keys (an unknown old name points there).
OLD_NAMES_DOC = "docs/config.md, 'From the old tutorials to the current API'"

#: TF1 ``ConfigProto``/``GPUOptions`` names and other tutorial spellings -> the tfgpu key(s) that do that job.
OLD_NAMES: dict[str, str] = {
    "gpu_options": "devices.memory_growth, devices.memory_fraction, devices.memory_limit_mib or devices.visible_gpus "
                   "(TF1's GPUOptions fields are keys of the devices section)",
    "allow_growth": "devices.memory_growth",
    "per_process_gpu_memory_fraction": "devices.memory_fraction (or devices.memory_limit_mib)",
    "visible_device_list": "devices.visible_gpus",
    "cuda_visible_devices": "devices.visible_gpus",
    "log_device_placement": "devices.log_device_placement",
    "allow_soft_placement": "devices.soft_placement",
    "inter_op_parallelism_threads": "tensorflow.inter_op_threads",
    "intra_op_parallelism_threads": "tensorflow.intra_op_threads",
    "virtual_devices": "devices.gpu_logical_devices (with devices.memory_limit_mib)",
    "device_count": "devices.visible_gpus (GPUs) or devices.cpu_logical_devices (CPUs)",
    "set_memory_growth": "devices.memory_growth",
}


def _all_keys(model: type[BaseModel], path: tuple = ()) -> list[tuple]:
    """Every key path of the schema under ``model``, sections first (``("train", "epochs")``, ...); the keys of
    a mapping of sections (``data.features``'s specs) are left out."""
    out = []
    for name, field in model.model_fields.items():
        out.append(path + (name,))
        inner, by_name = _section_type(field.annotation)
        if inner is not None and not by_name:
            out += _all_keys(inner, path + (name,))
    return out


def _elsewhere(unknown: str, loc: tuple, root: type[BaseModel]) -> Optional[str]:
    """The key path, in another section, of a key misplaced at ``loc`` (``epochs`` at the top -> ``train.epochs``):
    the same name first, else a close spelling of one."""
    paths = [p for p in _all_keys(root) if p != loc]
    same = [p for p in paths if p[-1] == unknown]
    if same:
        return ".".join(same[0])
    close = difflib.get_close_matches(unknown, sorted({p[-1] for p in paths}), n=1, cutoff=0.8)
    if close:
        return ".".join(next(p for p in paths if p[-1] == close[0]))
    return None


def _data_loc(loc: tuple, data: Any) -> tuple:
    """Pydantic's error location without its own tags (``literal['auto']``, ``[key]``, ...).

    A part is kept when it is a key or index of the data at that point, so a user's key
    that merely looks like a tag (``'['``) is kept too.
    """
    out = []
    node = data
    for part in loc:
        if isinstance(node, dict) and not isinstance(part, (dict, list)) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and ("[" in part or part.startswith("function-") or part in _TAG_PARTS):
            continue
        else:
            node = None
        out.append(part)
    return tuple(out)


_TAG_PARTS = {"bool", "int", "float", "str", "list", "dict", "none"}


def _problem(err: dict, data: Any, source: Any, root: type[BaseModel]) -> str:
    loc = _data_loc(tuple(err["loc"]), data)
    if err["type"] == "key_error":  # a check across keys (schema.py), located at the key it names
        loc += tuple(err["ctx"]["loc"])
        found, value = _lookup(data, loc)
        received = f" Received: {describe(value)}." if found and not isinstance(value, dict) else ""
        return f"{source.where(loc)}: '{'.'.join(str(p) for p in loc)}': {requirement(err)}.{received}"
    dotted = ".".join(str(p) for p in loc) or "(top level)"
    where = source.where(loc)
    if err["type"] == "invalid_key" or "[key]" in err["loc"]:
        parent = ".".join(str(p) for p in loc[:-1]) or "(top level)"
        return f"{where}: '{parent}': keys must be text. Received the key {describe(loc[-1])}; quote it."
    if err["type"] == "model_type" and _allowed_keys(loc, root):
        found, value = _lookup(data, loc)
        empty = " (an empty section: remove the line, or put keys under it)" if found and value is None else ""
        return (
            f"{where}: '{dotted}' must be a mapping of its keys ({', '.join(_allowed_keys(loc, root))}). "
            f"Received: {describe(value)}{empty}."
        )
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1], root)
        section_model = _section_model(loc[:-1], root)
        if hasattr(section_model, "keys_for"):  # a section whose keys depend on another key (data.kind)
            allowed = section_model.keys_for(_lookup(data, loc[:-1])[1])
        unknown = str(loc[-1]) if loc else ""
        old_name = OLD_NAMES.get(unknown.lower())
        close = difflib.get_close_matches(unknown, allowed, n=1, cutoff=0.6)
        if old_name is not None:
            guess = (f" '{unknown}' is TensorFlow 1's or an old tutorial's name: tfgpu's is {old_name}; "
                     f"{OLD_NAMES_DOC} maps each old name to its key.")
        elif close:
            guess = f" Did you mean '{'.'.join(str(p) for p in loc[:-1] + (close[0],))}'?"
        else:
            moved = _elsewhere(unknown, loc, root)
            guess = (f" Did you mean '{moved}'? That key belongs in the '{moved.rpartition('.')[0]}' section."
                     if moved and "." in moved else f" Did you mean '{moved}' (a top-level key)?" if moved else "")
        return (
            f"{where}: unknown key '{dotted}'.{guess} Allowed keys here: {', '.join(allowed)}."
        )
    found, value = _lookup(data, loc)
    section = isinstance(value, dict) and bool(_allowed_keys(loc, root))  # a whole section: its keys say enough
    received = f" Received: {describe(value)}." if found and not section else ""
    text = f"{where}: '{dotted}': {requirement(err)}.{received}"
    if found and isinstance(value, bool) and err["type"] in ("literal_error", "string_type", "value_error"):
        text += (
            " Note: YAML reads a bare yes/no/on/off/true/false as a boolean; "
            f"quote it ('{source.raw.get(loc, str(value).lower())}') if you meant text."
        )
    elif found and isinstance(value, (int, float, datetime.date)) and err["type"] in ("literal_error", "string_type"):
        text += f" Note: YAML read this as a {type(value).__name__}; quote it if you meant text."
    return text



def _order(problem: str, source: Any) -> tuple:
    """Where a problem sorts: by its line in the file (``recipe.yaml:7: ...``), then the rest (``--set``, a dict)."""
    label = getattr(source, "label", None)
    if label and problem.startswith(f"{label}:"):
        line = problem[len(label) + 1:].partition(":")[0]
        if line.isdigit():
            return (0, int(line))
    given = list(dict.fromkeys(getattr(source, "override_keys", {}).values()))  # --set items in the order given
    return (1, next((i for i, label in enumerate(given) if problem.startswith(f"{label}:")), len(given)))


def validation_error(exc: ValidationError, data: Any, source: Any, root: type[BaseModel]) -> ConfigError:
    """Every problem pydantic found, once each, as one :class:`ConfigError`: one line per problem, in the order
    of their lines in the file (problems from ``--set`` or a dict after them), no blank line between.

    Args:
        exc: the validation error of ``root.model_validate(data)``.
        data: the plain data validated.
        source: where it came from (``label``, ``where(loc)``, ``raw``): file:line or ``--set``.
        root: the schema's top model, for the keys allowed at each level.
    """
    found: list[tuple[tuple, str]] = []
    for err in exc.errors():
        problem = _problem(err, data, source, root)
        if problem not in (p for _, p in found):
            found.append((_order(problem, source), problem))
    seen = [p for _, p in sorted(found, key=lambda item: item[0])]  # stable: --set items keep pydantic's order
    head = f"{len(seen)} problems in the configuration:" if len(seen) > 1 else "invalid configuration:"
    body = "\n".join(f"  - {p}" for p in seen)
    return ConfigError(
        f"{head}\n{body}",
        "correct the keys above; 'tfgpu plan RECIPE' checks a recipe without running it, "
        "and docs/config.md lists every key, its type and default.",
    )
