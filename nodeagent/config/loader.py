"""One schema mechanism for every file nodeagent reads: frozen pydantic models, strictly loaded.

A file format is a tree of :class:`Schema` models (frozen, unknown fields forbidden, NaN and
infinity refused, bounds declared on the fields). :func:`load_file` reads a file
(:mod:`nodeagent.config.yamlfile`), checks ``version: v1``, validates it and turns every
problem pydantic reports into a :class:`~nodeagent.config.errors.Problem` that names the file,
the line and the field, so one run lists them all. Environment overrides
(``NODEAGENT_<SECTION>_<FIELD>``) are derived from the same tree, so each field has exactly one
environment name.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from nodeagent.config.errors import ConfigError, FieldError, FieldPath, Problem, dotted
from nodeagent.config.yamlfile import Document, read_document

__all__ = [
    "ConfigError",
    "Problem",
    "Schema",
    "deep_merge",
    "env_names",
    "env_overrides",
    "load_file",
    "validate_document",
]

SUPPORTED_VERSION = "v1"

M = TypeVar("M", bound="Schema")


class Schema(BaseModel):
    """Base of every file model: frozen, strict about fields, finite numbers only.

    Numbers given as text (environment variables are text) are parsed; numbers given where
    text is expected become text (``expected_driver_version: 570`` is ``"570"``). An empty
    section (``health:`` with nothing under it) takes every default.
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        allow_inf_nan=False,
        coerce_numbers_to_str=True,
        # Schemas are built at first use, not at import: commands that never read a file
        # do not pay for them.
        defer_build=True,
    )

    # Pairs of fields (low, high) whose values must not cross: retry delays, score thresholds.
    ordered: ClassVar[tuple[tuple[str, str], ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        unknown = sorted({name for pair in cls.ordered for name in pair} - set(cls.model_fields))
        if unknown:  # a typo here would otherwise surface as a KeyError while validating
            raise TypeError(f"{cls.__name__}.ordered names no field {unknown}")

    @model_validator(mode="before")
    @classmethod
    def _empty_section_takes_defaults(cls, data: Any) -> Any:
        return {} if data is None else data

    @model_validator(mode="after")
    def _ordered_pairs(self) -> Self:
        found = FieldError()
        fields = type(self).model_fields
        for low, high in self.ordered:
            if getattr(self, low) > getattr(self, high):
                found.add(key_of(low, fields[low]), f"must not exceed {key_of(high, fields[high])}")
        found.raise_any()
        return self


def load_file(model: type[M], path: Path, *, kind: str) -> M:
    """Read ``path`` and validate it as ``model`` (``kind`` names the format in messages).

    Raises:
        ConfigError: every problem at once, each with file, line and field.
    """
    return validate_document(model, read_document(path), kind=kind)


def validate_document(
    model: type[M],
    doc: Document,
    *,
    kind: str,
    extra: Mapping[str, Any] | None = None,
    origins: Mapping[FieldPath, str] | None = None,
) -> M:
    """Validate a parsed document as ``model``.

    ``extra`` is merged over the file's data (environment and command-line overrides), with
    ``origins`` naming where those values came from, for messages.

    Raises:
        ConfigError: every problem at once, each with file, line and field (or origin).
    """
    data = doc.data
    if data is None:
        raise ConfigError.single(doc.name, f"the file is empty; {kind} starts with `version: v1`")
    if not isinstance(data, dict):
        found = "a list" if isinstance(data, list) else f"the single value {_shown(data)}"
        raise ConfigError.single(
            doc.name,
            f"holds {found}; {kind} is a mapping that starts with `version: v1`",
            line=doc.line(()),
        )
    version = data.get("version")
    if "version" not in data:
        raise ConfigError(
            [Problem(doc.name, doc.line(()), "version", "missing; add `version: v1` at the top")]
        )
    if version != SUPPORTED_VERSION:
        raise ConfigError(
            [
                Problem(
                    doc.name,
                    doc.line(("version",)),
                    "version",
                    f"unsupported version {version!r}; this nodeagent reads {SUPPORTED_VERSION}",
                )
            ]
        )
    body = {k: v for k, v in data.items() if k != "version"}
    if extra:
        body = deep_merge(body, extra)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = _without_echoes(exc.errors(), body)
        problems = [
            problem
            for error in errors
            for problem in _problems(error, body, doc, model, origins or {})
        ]
        raise ConfigError(in_file_order(problems)) from None


def _without_echoes(errors: list[Any], data: Any) -> list[Any]:
    """Drop "too short" for a list whose entries failed: pydantic counts only the good ones."""
    paths = [_data_path(tuple(e["loc"]), data) for e in errors]
    return [
        e
        for e, path in zip(errors, paths, strict=True)
        if e["type"] != "too_short"
        or not any(len(other) > len(path) and other[: len(path)] == path for other in paths)
    ]


def in_file_order(problems: list[Problem]) -> list[Problem]:
    """Problems without repeats, by line (those without a line, from the environment, last)."""
    unique = list(dict.fromkeys(problems))
    return sorted(unique, key=lambda p: (p.line is None, p.line or 0))


# --- from pydantic's errors to problems ------------------------------------------------------


def _data_path(loc: tuple[int | str, ...], data: Any) -> FieldPath:
    """The part of pydantic's ``loc`` that exists in the data (union tags etc. are dropped)."""
    path: list[str | int] = []
    for part in loc:
        in_map = isinstance(data, dict) and part in data
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if in_map or in_list:
            data = data[part]
            path.append(part)
    return tuple(path)


def _problems(
    error: Any,
    data: Any,
    doc: Document,
    model: type[Schema],
    origins: Mapping[FieldPath, str],
) -> list[Problem]:
    loc = tuple(error["loc"])
    path = _data_path(loc, data)
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return [_located((*path, loc[-1]), path, "required field is missing", doc, origins)]
    if kind == "extra_forbidden":
        known = ", ".join(sorted(_keys(_model_at(model, path[:-1])))) or "none"
        return [_located(path, path, f"unknown field (known: {known})", doc, origins)]
    cause = ctx.get("error")
    if isinstance(cause, FieldError):
        return [
            _located((*path, *sub), (*path, *sub), message, doc, origins)
            for sub, message in cause.found
        ]
    return [_located(path, path, _message(kind, error, ctx), doc, origins)]


def _located(
    field: FieldPath,
    line_path: FieldPath,
    message: str,
    doc: Document,
    origins: Mapping[FieldPath, str],
) -> Problem:
    origin = next(
        (origins[line_path[:n]] for n in range(len(line_path), 0, -1) if line_path[:n] in origins),
        None,
    )
    if origin is not None:
        return Problem(origin, None, dotted(field), message)
    return Problem(doc.name, doc.line(line_path), dotted(field), message)


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def plain_number(value: Any) -> str:
    """A number as operators write it: ``1`` rather than ``1.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _choices(expected: str) -> str:
    """pydantic's "'a', 'b' or 'c'" as "a, b, c"."""
    return expected.replace(" or ", ", ").replace("'", "")


# What each of pydantic's error types means, in the words the rest of nodeagent uses.
_EXPECTED = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "path_type": "expected a path",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "finite_number": "must be a finite number",
}
_BOUNDS = {
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("more than", "gt"),
    "less_than_equal": ("at most", "le"),
    "less_than": ("less than", "lt"),
}


def _message(kind: str, error: Any, ctx: Mapping[str, Any]) -> str:
    got = _shown(error.get("input"))
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"]))
    if kind in ("enum", "literal_error"):
        return f"{got} is not one of {_choices(str(ctx.get('expected', '')))}"
    if kind in _EXPECTED:
        return f"{_EXPECTED[kind]}, got {got}"
    if kind in _BOUNDS:
        words, key = _BOUNDS[kind]
        return f"must be {words} {plain_number(ctx.get(key))}, got {got}"
    if kind == "too_short":
        least = ctx.get("min_length")
        return f"needs at least {least} {'entry' if least == 1 else 'entries'}"
    if kind == "too_long":
        return f"takes at most {ctx.get('max_length')} entries, got {ctx.get('actual_length')}"
    if kind == "string_too_short":
        return "must not be empty" if ctx.get("min_length") == 1 else str(error["msg"])
    return f"{error['msg']}, got {got}"


# --- walking the schema ----------------------------------------------------------------------


def unwrap(hint: Any) -> tuple[Any, bool]:
    """``(inner, optional)`` for ``X | None`` and ``Annotated[X, ...]``; else ``(hint, False)``."""
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        inner = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
        return unwrap(inner)[0], True
    return hint, False


def is_model(hint: Any) -> bool:
    """Whether ``hint`` is a schema model class."""
    return isinstance(hint, type) and issubclass(hint, BaseModel)


def is_scalar(hint: Any) -> bool:
    """Whether a value of this type can come from one environment variable."""
    inner, _ = unwrap(hint)
    if inner in (str, int, float, bool, Path):
        return True
    if typing.get_origin(inner) is typing.Literal:
        return True
    return isinstance(inner, type) and issubclass(inner, enum.Enum)


def key_of(name: str, info: pydantic.fields.FieldInfo) -> str:
    """The YAML key of a field: its alias when it has one."""
    return info.alias or name


def _keys(model: type[BaseModel] | None) -> list[str]:
    if model is None:
        return []
    return [key_of(name, info) for name, info in model.model_fields.items()]


def _model_at(model: type[BaseModel], path: FieldPath) -> type[BaseModel] | None:
    """The model class that holds the values at ``path`` (through sections, maps and lists)."""
    hint: Any = model
    for part in path:
        hint, _ = unwrap(hint)
        if is_model(hint):
            fields = {key_of(n, i): i for n, i in hint.model_fields.items()}
            if not isinstance(part, str) or part not in fields:
                return None
            hint = fields[part].annotation
            continue
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin is dict and args:
            hint = args[1]
        elif origin in (tuple, list) and args:
            hint = args[0]
        else:
            return None
    hint, _ = unwrap(hint)
    return hint if is_model(hint) else None


# --- environment overrides ---------------------------------------------------------------------


def env_overrides(
    model: type[BaseModel], environ: Mapping[str, str], prefix: str = "NODEAGENT"
) -> tuple[dict[str, Any], dict[FieldPath, str]]:
    """``NODEAGENT_<SECTION>_<FIELD>`` values for the scalar fields of a model tree.

    Returns the values as a nested dict shaped like the file, to be merged over its data, and
    where each came from (the variable's name), for messages.
    """
    values: dict[str, Any] = {}
    origins: dict[FieldPath, str] = {}
    for name, info in model.model_fields.items():
        env = f"{prefix}_{name.upper()}"
        key = key_of(name, info)
        inner, _ = unwrap(info.annotation)
        if is_model(inner):
            nested, nested_origins = env_overrides(inner, environ, env)
            if nested:
                values[key] = nested
                origins.update({(key, *p): o for p, o in nested_origins.items()})
        elif is_scalar(inner) and env in environ:
            values[key] = environ[env]
            origins[(key,)] = f"env {env}"
    return values, origins


def env_names(model: type[BaseModel], prefix: str = "NODEAGENT") -> list[str]:
    """Every environment variable name that :func:`env_overrides` reads, for the docs."""
    names: list[str] = []
    for name, info in model.model_fields.items():
        env = f"{prefix}_{name.upper()}"
        inner, _ = unwrap(info.annotation)
        if is_model(inner):
            names.extend(env_names(inner, env))
        elif is_scalar(inner):
            names.append(env)
    return names


def deep_merge(base: Any, override: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``override`` into a copy of ``base`` (nested mappings merge, values replace)."""
    merged: dict[str, Any] = dict(base) if isinstance(base, dict) else {}
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
