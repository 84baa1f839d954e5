"""Validation errors -> one-paragraph messages naming the key, its file:line, the value and what is allowed.

Pydantic's structured error (type, location, ``ctx``) is read, not its English
text, wherever the message depends on it. Imports nothing from the rest of the
config package.
"""

from __future__ import annotations

import datetime
import difflib
import reprlib
import typing
from typing import Any, Optional

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
        return f"{source.where(loc)}: '{'.'.join(str(p) for p in loc)}': {err['msg']}.{received}"
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
        close = difflib.get_close_matches(unknown, allowed, n=1, cutoff=0.6)
        guess = f" Did you mean '{'.'.join(str(p) for p in loc[:-1] + (close[0],))}'?" if close else ""
        return (
            f"{where}: unknown key '{dotted}'.{guess} Allowed keys here: {', '.join(allowed)}."
        )
    found, value = _lookup(data, loc)
    section = isinstance(value, dict) and bool(_allowed_keys(loc, root))  # a whole section: its keys say enough
    received = f" Received: {describe(value)}." if found and not section else ""
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    text = f"{where}: '{dotted}': {msg}.{received}"
    if found and isinstance(value, bool) and err["type"] in ("literal_error", "string_type", "value_error"):
        text += (
            " Note: YAML reads a bare yes/no/on/off/true/false as a boolean; "
            f"quote it ('{source.raw.get(loc, str(value).lower())}') if you meant text."
        )
    elif found and isinstance(value, (int, float, datetime.date)) and err["type"] in ("literal_error", "string_type"):
        text += f" Note: YAML read this as a {type(value).__name__}; quote it if you meant text."
    return text



def validation_error(exc: ValidationError, data: Any, source: Any, root: type[BaseModel]) -> ConfigError:
    """Every problem pydantic found, once each, as one :class:`ConfigError`.

    Args:
        exc: the validation error of ``root.model_validate(data)``.
        data: the plain data validated.
        source: where it came from (``label``, ``where(loc)``, ``raw``): file:line or ``--set``.
        root: the schema's top model, for the keys allowed at each level.
    """
    seen: list[str] = []
    for err in exc.errors():
        problem = _problem(err, data, source, root)
        if problem not in seen:
            seen.append(problem)
    head = f"{len(seen)} problems in the configuration:" if len(seen) > 1 else "invalid configuration:"
    body = "\n".join(f"  - {p}" for p in seen)
    return ConfigError(
        f"{head}\n{body}",
        "correct the keys above; 'tfgpu plan RECIPE' checks a recipe without running it, "
        "and docs/config.md lists every key, its type and default.",
    )
