"""Reading a configuration: YAML with line positions, ``--set`` and keyword overrides, then validation.

YAML is read with ``yaml.safe_load`` semantics only: tags that construct Python
objects are refused, duplicate keys are errors, and every key path's line is
kept so that an error can say ``recipe.yaml:12``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import yaml
from pydantic import ValidationError

from ..errors import ConfigError, UsageError
from .messages import describe, validation_error
from .schema import Config

CONFIG_ENV = "TFGPU_CONFIG"


# --------------------------------------------------------------------------- loading


class _Source:
    """Where a value came from: a file with line positions, a dict, or overrides."""

    def __init__(self, label: str, positions: Optional[dict[tuple, int]] = None,
                 raw: Optional[dict[tuple, str]] = None) -> None:
        self.label = label
        self.positions = positions or {}
        self.raw = raw or {}  # key path -> the scalar as written (``off``, not ``False``)
        self.override_keys: dict[tuple, str] = {}

    def where(self, loc: tuple) -> str:
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.override_keys:
                return self.override_keys[loc[:n]]
        if loc and loc not in self.positions:  # e.g. --set foo.bar=1 created the unknown section 'foo'
            for key, label in self.override_keys.items():
                if key[: len(loc)] == loc:
                    return label
        for n in range(len(loc), 0, -1):
            line = self.positions.get(loc[:n])
            if line is not None:
                return f"{self.label}:{line}"
        return self.label


def _yaml_error(label: str, exc: yaml.YAMLError, text: str = "") -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    where = f"{label}:{mark.line + 1}:{mark.column + 1}" if mark else label
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "\0")
        return ConfigError(
            f"{label}:{line}: this is not valid YAML: the character {chr(code)!r} (#x{code:04x}) "
            "is not allowed in a YAML file.",
            "delete the character (or save the file as plain UTF-8 text).",
        )
    problem = " ".join((getattr(exc, "problem", None) or str(exc)).split())
    context = getattr(exc, "context", None)
    detail = f"{' '.join(context.split())} {problem}" if context else problem
    begun = getattr(exc, "context_mark", None)
    if begun is not None and mark is not None and begun.line != mark.line:
        what = re.sub(r"^while \w+ ", "", " ".join((context or "the value").split()))
        detail += f" ({what} that began at line {begun.line + 1})"
    if isinstance(exc, yaml.constructor.ConstructorError) and "unhashable" in problem:
        return ConfigError(
            f"{where}: this is not a usable YAML key ({problem}): a key must be plain text, not a list or mapping.",
            "write 'key: value' with a text key; quote the key if it contains [ ] { } or ?.",
        )
    if isinstance(exc, yaml.constructor.ConstructorError):
        return ConfigError(
            f"{where}: the YAML tag is not allowed ({problem.strip()}). tfgpu reads YAML with "
            "safe_load only: tags that construct Python objects are refused.",
            "remove the tag (e.g. '!!python/object') and write plain values.",
        )
    return ConfigError(
        f"{where}: this is not valid YAML: {detail.strip()}.",
        "fix the syntax at that line (indentation, a missing ':' or an unclosed quote or bracket).",
    )


def _positions(node: yaml.Node, path: tuple, out: dict[tuple, int], label: str,
               seen_nodes: Optional[set] = None, raw: Optional[dict[tuple, str]] = None) -> None:
    """Record the 1-based line of every key path; refuse duplicate keys.

    A node reached again through an alias (``*name``) is not walked again, so
    nested aliases cannot make this exponential.
    """
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if id(node) in seen_nodes:
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.ScalarNode) and raw is not None:
        raw[path] = node.value
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                dotted = ".".join(str(p) for p in path + (key,))
                raise ConfigError(
                    f"{label}:{line}: key '{dotted}' appears twice (first at line {seen[key]}); "
                    "YAML would silently keep only the last value.",
                    "delete one of the two entries.",
                )
            seen[key] = line
            out[path + (key,)] = line
            _positions(value_node, path + (key,), out, label, seen_nodes, raw)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[path + (i,)] = item.start_mark.line + 1
            _positions(item, path + (i,), out, label, seen_nodes, raw)


def _too_deep(label: str) -> ConfigError:
    return ConfigError(
        f"{label}: the YAML is nested too deeply (hundreds of levels of lists or mappings); a tfgpu "
        "config is at most a few levels deep.",
        "check for unclosed or repeated brackets, or an alias that refers to itself.",
    )


def _read_yaml(text: str, label: str) -> tuple[Any, dict[tuple, int], dict[tuple, str]]:
    try:  # one parse: the node (for line numbers) and the data built from it, as yaml.safe_load does
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise _yaml_error(label, exc, text) from None
    except RecursionError:
        raise _too_deep(label) from None
    positions: dict[tuple, int] = {}
    raw: dict[tuple, str] = {}
    if node is not None:
        _positions(node, (), positions, label, raw=raw)
    return data, positions, raw


def parse_override(item: str) -> tuple[tuple[str, ...], Any]:
    """``"train.epochs=3"`` -> ``(("train", "epochs"), 3)``; the value is read as YAML.

    Raises:
        UsageError: (exit code 2) the item is not ``key.path=value``, or its value is not YAML: how the
            command line was written, not what the configuration says. A well-formed item whose key or
            value the schema refuses is a :class:`ConfigError` later, in :func:`load_config`.
    """
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or not re.match(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", key):
        example = f"--set {key}=VALUE" if key and not sep and re.match(r"^[A-Za-z_][\w.]*$", key) \
            else "--set train.epochs=3"
        raise UsageError(
            f"--set {item!r}: expected 'section.key=value' (a dotted key, '=', then a value), e.g. {example}.",
            "write the dotted key, '=', then the value (read as YAML: 3, true, [0, 1], 'text').",
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise UsageError(
            f"--set {item!r}: the value {raw!r} is not valid YAML ({problem}).",
            "quote text values and use [a, b] for lists.",
        ) from None
    except RecursionError:
        deep = _too_deep(f"--set {item!r}")
        raise UsageError(deep.message, deep.hint) from None
    return tuple(key.split(".")), value


def _override_label(item: str) -> str:
    """``--set ITEM`` as messages print it (quoted when it holds newlines or other control characters)."""
    return f"--set {item}" if item.isprintable() else f"--set {item!r}"


def _set_path(data: dict, path: tuple[str, ...], value: Any, label: str) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            dotted = ".".join(path[: i + 1])
            raise ConfigError(
                f"{label}: '{dotted}' is a value, not a section, so '{'.'.join(path)}' cannot be set.",
                f"set '{dotted}' itself, or check the key path.",
            )
        node = child
    node[path[-1]] = value


def _deep_merge(base: dict, extra: Mapping, path: tuple, source: _Source, label: str) -> None:
    for key, value in extra.items():
        here = path + (key,)
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value, here, source, label)
        else:
            base[key] = value.copy() if isinstance(value, dict) else value
            source.override_keys[here] = label



_MAX_VALUES = 100_000


def _walk(data: Any) -> tuple[Optional[tuple], int]:
    """``(path of a value that contains itself, or None; number of values once aliases are expanded)``.

    A value that contains itself comes from ``&a [*a]`` in YAML; a huge expanded size from
    nested aliases (``&b [*a, *a, ...]``). Each list or mapping is explored once, so shared
    parts cost nothing extra here.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[Any, tuple, Any]] = [(data, (), None)]
    while stack:
        node, path, children = stack.pop()
        if children is None:
            if not isinstance(node, (dict, list)) or id(node) in sizes:
                continue
            if id(node) in active:
                return path, 0
            active.add(id(node))
            items = node.items() if isinstance(node, dict) else enumerate(node)
            children = iter([(v, path + (k,)) for k, v in items])
        child = next(children, None)
        if child is None:
            active.discard(id(node))
            values = node.values() if isinstance(node, dict) else node
            sizes[id(node)] = 1 + sum(sizes.get(id(v), 1) if isinstance(v, (dict, list)) else 1 for v in values)
            continue
        stack.append((node, path, children))
        stack.append((child[0], child[1], None))
    return None, sizes.get(id(data), 1)


def _validate(data: Any, source: _Source) -> Config:
    if data is None:
        data = {}
    loop, size = _walk(data)
    if loop is not None:
        dotted = ".".join(str(p) for p in loop) or "(top level)"
        raise ConfigError(
            f"{source.where(loop)}: '{dotted}' contains itself (a YAML alias used inside its own anchor), "
            "so it has no end.",
            "replace the alias (*name) with a plain value.",
        )
    if size > _MAX_VALUES:
        raise ConfigError(
            f"{source.label}: the configuration expands to {size:,} values (aliases nested in aliases); "
            f"a tfgpu config has a few dozen, and at most {_MAX_VALUES:,} are accepted.",
            "write the values out instead of nesting aliases (*name).",
        )
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source.label}: the top level must be a mapping of sections (devices, tensorflow, "
            f"distribute, data, model, train, output). Received: {describe(data)}.",
            "write 'section:' keys at the top level, not a list or a single value.",
        )
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError(
            f"{source.label}: keys must be text. Received the key {describe(bad[0])}.",
            "quote the key or fix the indentation.",
        )
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, data, source, Config) from None


def load_config(
    source: Union[str, os.PathLike, Mapping, Config, None] = None,
    overrides: Sequence[str] = (),
    **sections: Any,
) -> Config:
    """Load, merge and validate a configuration.

    Args:
        source: a YAML file path, a mapping with the same layout, a
            :class:`Config`, or ``None`` (the file named by ``TFGPU_CONFIG``
            if set, else the defaults).
        overrides: ``"section.key=value"`` strings (values read as YAML), as
            given to ``--set``; applied after the file.
        **sections: keyword overrides by section, deep-merged over the file
            and ``overrides``, e.g. ``devices={"memory_growth": False}``.

    Returns:
        The validated :class:`Config`.

    Raises:
        ConfigError: the file is missing or not valid YAML, a key is unknown or
            duplicated, or a value has the wrong type or is out of range. The
            message names each key path, the received value and its file:line.
    """
    try:
        return _load(source, overrides, sections)
    except RecursionError:
        raise _too_deep(str(source) if isinstance(source, (str, os.PathLike)) else "config dict") from None


def _load(source: Any, overrides: Sequence[str], sections: dict[str, Any]) -> Config:
    if isinstance(source, Config) and not overrides and not sections:
        return source
    if isinstance(overrides, str):
        overrides = [overrides]
    if source is None:
        env_path = os.environ.get(CONFIG_ENV)
        source = env_path if env_path else {}
    if isinstance(source, Config):
        data: Any = source.explicit_dict()
        src = _Source("config")
    elif isinstance(source, Mapping):
        data = _plain_copy(source)
        src = _Source("config dict")
    elif not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"the configuration must be a YAML file path, a dict or a tfgpu.Config. Received: {describe(source)}.",
            "pass a path such as 'gpu.yaml', or a dict such as {'devices': {'memory_growth': True}}.",
        )
    else:
        path = Path(source)
        label = str(source)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(
                f"the config file '{label}' does not exist (looked in {Path.cwd()}).",
                "check the path; recipes shipped with tfgpu are in its recipes/ directory.",
            ) from None
        except IsADirectoryError:
            raise ConfigError(f"'{label}' is a directory, not a YAML config file.", "name a .yaml file.") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"the config file '{label}' cannot be read: {exc}.", "check its permissions and encoding.") from None
        data, positions, raw = _read_yaml(text, label)
        if data is None:
            raise ConfigError(
                f"{label}: the file is empty (or holds only comments), so it configures nothing; a config "
                "file is a mapping of sections (devices, tensorflow, distribute, data, model, train, output).",
                "write the sections you need, e.g. 'devices: {memory_growth: true}', or give no config file "
                "to use the defaults.",
            )
        src = _Source(label, positions, raw)
    if isinstance(data, dict) and (overrides or sections):
        data = _plain_copy(data)
        for item in overrides:
            key, value = parse_override(item)
            _set_path(data, key, value, _override_label(item))
            src.override_keys[key] = _override_label(item)
            src.raw[key] = item.partition("=")[2].strip()
        if sections:
            _deep_merge(data, _plain_copy(sections), (), src, "setup() keyword argument")
    return _validate(data, src)


def _plain_copy(value: Any, memo: Optional[dict[int, Any]] = None) -> Any:
    """Dicts and lists copied (tuples become lists); a shared (aliased) part is copied once."""
    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, Mapping):
        mapping: dict = {}
        memo[id(value)] = mapping
        mapping.update((k, _plain_copy(v, memo)) for k, v in value.items())
        return mapping
    if isinstance(value, (list, tuple)):
        items: list = []
        memo[id(value)] = items
        items.extend(_plain_copy(v, memo) for v in value)
        return items
    return value
