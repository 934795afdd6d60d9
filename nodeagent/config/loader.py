"""Strict loading of YAML files into frozen dataclasses.

One mechanism serves every file format of the project: the schema is a tree of dataclasses, and
this module checks the ``version``, rejects unknown fields, converts scalars, and names the file,
line and field of every problem. Environment overrides (``NODEAGENT_<SECTION>_<FIELD>``) are
applied through the same tree, so each field has exactly one env name.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

SUPPORTED_VERSION = "v1"


class ConfigError(ValueError):
    """A configuration problem, already phrased for the operator (file:line: field: what)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Source:
    """Where values come from, for error messages."""

    name: str  # file path or "<env>"
    lines: Mapping[tuple[str, ...], int]  # path of keys -> 1-based line

    def where(self, path: tuple[str, ...]) -> str:
        line = None
        probe = path
        while probe and line is None:
            line = self.lines.get(probe)
            probe = probe[:-1]
        location = f"{self.name}:{line}" if line is not None else self.name
        field = ".".join(path) if path else "(top level)"
        return f"{location}: {field}"


def _line_map(node: yaml.Node, path: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            out[(*path, key)] = key_node.start_mark.line + 1
            _line_map(value_node, (*path, key), out)
            out[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, (*path, str(i)), out)


def read_yaml(path: Path) -> tuple[Any, dict[tuple[str, ...], int]]:
    """Parse a YAML file and return its data plus a map from key paths to line numbers."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{line}: not valid YAML: {problem}") from exc
    lines: dict[tuple[str, ...], int] = {}
    if node is not None:
        _line_map(node, (), lines)
    return data, lines


def _field_key(field: dataclasses.Field[Any]) -> str:
    """The YAML key of a field: ``metadata["key"]`` when set, else the Python name."""
    key = field.metadata.get("key")
    return str(key) if key is not None else field.name


def _convert(value: Any, hint: Any, path: tuple[str, ...], src: _Source, errors: list[str]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _convert(value, non_none[0], path, src, errors)
        for candidate in non_none:
            trial: list[str] = []
            converted = _convert(value, candidate, path, src, trial)
            if not trial:
                return converted
        errors.append(f"{src.where(path)}: {value!r} is not any of the accepted forms")
        return None
    if origin is typing.Literal:
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            errors.append(f"{src.where(path)}: {value!r} is not one of {allowed}")
        return value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _build(hint, value, path, src, errors)
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, list):
            errors.append(f"{src.where(path)}: expected a list, got {type(value).__name__}")
            return ()
        item_hint = args[0] if args else Any
        items = [_convert(v, item_hint, (*path, str(i)), src, errors) for i, v in enumerate(value)]
        return tuple(items)
    if origin is dict or hint is dict or origin is Mapping:
        if not isinstance(value, dict):
            errors.append(f"{src.where(path)}: expected a mapping, got {type(value).__name__}")
            return {}
        key_hint, value_hint = args if args else (Any, Any)
        return {
            _convert(k, key_hint, (*path, str(k)), src, errors): _convert(
                v, value_hint, (*path, str(k)), src, errors
            )
            for k, v in value.items()
        }
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            allowed = ", ".join(str(m.value) for m in hint)
            errors.append(f"{src.where(path)}: {value!r} is not one of {allowed}")
            return None
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        errors.append(f"{src.where(path)}: expected true or false, got {value!r}")
        return False
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            errors.append(f"{src.where(path)}: expected an integer, got {value!r}")
            return 0
        try:
            return int(value)
        except ValueError:
            errors.append(f"{src.where(path)}: expected an integer, got {value!r}")
            return 0
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            errors.append(f"{src.where(path)}: expected a number, got {value!r}")
            return 0.0
        try:
            return float(value)
        except ValueError:
            errors.append(f"{src.where(path)}: expected a number, got {value!r}")
            return 0.0
    if hint is str:
        if isinstance(value, bool) or value is None or isinstance(value, list | dict):
            errors.append(f"{src.where(path)}: expected a string, got {value!r}")
            return ""
        return str(value)
    if hint is Path:
        if not isinstance(value, str):
            errors.append(f"{src.where(path)}: expected a path, got {value!r}")
            return Path()
        return Path(value)
    raise TypeError(f"unsupported schema type {hint!r} at {'.'.join(path)}")


def _build(cls: type[T], data: Any, path: tuple[str, ...], src: _Source, errors: list[str]) -> T:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        errors.append(f"{src.where(path)}: expected a mapping, got {type(data).__name__}")
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {_field_key(f): f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    for key in data:
        if str(key) not in fields and not (path == () and key == "version"):
            known = ", ".join(sorted(fields))
            errors.append(f"{src.where((*path, str(key)))}: unknown field (known: {known})")
    kwargs: dict[str, Any] = {}
    for key, field in fields.items():
        if key in data:
            kwargs[field.name] = _convert(data[key], hints[field.name], (*path, key), src, errors)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            errors.append(f"{src.where((*path, key))}: required field is missing")
    if errors:
        # Construction could fail on placeholder values; the caller raises with all errors.
        try:
            return cls(**kwargs)
        except (TypeError, ValueError):
            return typing.cast(T, None)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        errors.append(f"{src.where(path)}: {exc}")
        return typing.cast(T, None)


def parse_dataclass(
    cls: type[T],
    data: Any,
    *,
    source: str = "<config>",
    lines: Mapping[tuple[str, ...], int] | None = None,
    require_version: bool = True,
) -> T:
    """Build ``cls`` from parsed YAML data, raising one ConfigError that lists every problem."""
    src = _Source(source, lines or {})
    errors: list[str] = []
    if require_version:
        if not isinstance(data, dict) or "version" not in data:
            raise ConfigError(f"{src.where(('version',))}: missing; add `version: v1` at the top")
        if data["version"] != SUPPORTED_VERSION:
            raise ConfigError(
                f"{src.where(('version',))}: unsupported version {data['version']!r}; "
                f"this nodeagent reads {SUPPORTED_VERSION}"
            )
    result = _build(cls, data, (), src, errors)
    if errors:
        raise ConfigError("\n".join(errors))
    return result


def load_dataclass(cls: type[T], path: Path, *, require_version: bool = True) -> T:
    """Load a YAML file into ``cls`` (strict: version, unknown fields, types, with lines)."""
    data, lines = read_yaml(path)
    return parse_dataclass(
        cls, data, source=str(path), lines=lines, require_version=require_version
    )


def env_overrides(
    cls: type[Any], environ: Mapping[str, str], prefix: str = "NODEAGENT"
) -> dict[str, Any]:
    """Collect ``NODEAGENT_<SECTION>_<FIELD>`` values for scalar fields of a dataclass tree.

    Returns a nested dict shaped like the YAML file, to be merged over the file's data. Only
    scalar leaves (str, int, float, bool, Path, enums, optionals of those) get an env name.
    """
    result: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        name = f"{prefix}_{field.name.upper()}"
        inner = unwrap_optional(hint)
        if dataclasses.is_dataclass(inner) and isinstance(inner, type):
            nested = env_overrides(inner, environ, name)
            if nested:
                result[_field_key(field)] = nested
        elif is_scalar_type(inner) and name in environ:
            result[_field_key(field)] = environ[name]
    return result


def env_names(cls: type[Any], prefix: str = "NODEAGENT") -> list[str]:
    """Every environment variable name that :func:`env_overrides` reads, for the docs."""
    names: list[str] = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        inner = unwrap_optional(hints[field.name])
        name = f"{prefix}_{field.name.upper()}"
        if dataclasses.is_dataclass(inner) and isinstance(inner, type):
            names.extend(env_names(inner, name))
        elif is_scalar_type(inner):
            names.append(name)
    return names


def unwrap_optional(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        non_none = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(non_none) == 1:
            return non_none[0]
    return hint


def is_scalar_type(hint: Any) -> bool:
    if hint in (str, int, float, bool, Path):
        return True
    if typing.get_origin(hint) is typing.Literal:
        return True
    return isinstance(hint, type) and issubclass(hint, enum.Enum)


def deep_merge(base: Any, override: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``override`` into a copy of ``base`` (nested mappings merge, values replace)."""
    merged: dict[str, Any] = dict(base) if isinstance(base, dict) else {}
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def environ() -> Mapping[str, str]:
    """The process environment (a seam for tests)."""
    return os.environ
