"""Render the config reference (every field, type, default, range, env name, meaning).

The schema models are the single source: each field's meaning is its ``description`` (or the
docstring of a nested section), its range the bounds declared on it. ``docs/config.md`` embeds
the output between markers, and a test fails when the two differ, so the reference can't drift
from the code.

    python -m nodeagent.config.reference --write docs/config.md
"""

from __future__ import annotations

import argparse
import enum
import inspect
import sys
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from nodeagent.config.loader import is_model, is_scalar, key_of, plain_number, unwrap
from nodeagent.config.schema import AgentConfig

BEGIN = "<!-- BEGIN GENERATED REFERENCE: python -m nodeagent.config.reference -->"
END = "<!-- END GENERATED REFERENCE -->"

Row = tuple[str, str, str, str, str, str]


def _extra(info: FieldInfo, key: str) -> Any:
    extra = info.json_schema_extra
    return extra.get(key) if isinstance(extra, dict) else None


def _type_name(hint: Any) -> str:
    inner, optional = unwrap(hint)
    origin = typing.get_origin(inner)
    if origin in (typing.Union, types.UnionType):
        name = " or ".join(_type_name(a) for a in typing.get_args(inner))
    elif origin is typing.Literal:
        name = " \\| ".join(str(a) for a in typing.get_args(inner))
    elif origin is tuple:
        name = f"list of {_type_name(typing.get_args(inner)[0])}"
    elif origin is dict:
        name = f"map of {_type_name(typing.get_args(inner)[1])}"
    elif isinstance(inner, type) and issubclass(inner, enum.Enum):
        name = " \\| ".join(str(m.value) for m in inner)
    elif is_model(inner):
        name = "section"
    elif inner is Path:
        name = "path"
    else:
        name = getattr(inner, "__name__", str(inner))
    return f"{name} (optional)" if optional else name


def _bounds(metadata: list[Any]) -> str:
    low: tuple[str, str] | None = None  # (operator, value)
    high: tuple[str, str] | None = None
    parts = []
    for item in metadata:
        if isinstance(item, at.Ge):
            low = (">=", plain_number(item.ge))
        elif isinstance(item, at.Gt):
            low = (">", plain_number(item.gt))
        elif isinstance(item, at.Le):
            high = ("<=", plain_number(item.le))
        elif isinstance(item, at.Lt):
            high = ("<", plain_number(item.lt))
        elif isinstance(item, at.MinLen) and item.min_length:
            parts.append("not empty")
    if low is not None and high is not None and low[0] == ">=" and high[0] == "<=":
        parts.insert(0, f"{low[1]}..{high[1]}")
    else:
        parts[:0] = [f"{b[0]} {b[1]}" for b in (low, high) if b is not None]
    return ", ".join(parts)


def _item_bounds(hint: Any) -> str:
    """Bounds declared on the items of a list (``tuple[Annotated[int, Field(ge=1)], ...]``)."""
    inner, _ = unwrap(hint)
    if typing.get_origin(inner) is not tuple:
        return ""
    item = typing.get_args(inner)[0]
    if typing.get_origin(item) is not typing.Annotated:
        return ""
    metadata = [m for arg in typing.get_args(item)[1:] for m in getattr(arg, "metadata", [arg])]
    text = _bounds(metadata)
    return f"each {text}" if text else ""


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return "see below"
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | dict) and not value:
        return "empty"
    if isinstance(value, dict):
        return "`" + ", ".join(str(k) for k in value) + "`"
    if isinstance(value, tuple):
        return "`" + ", ".join(str(getattr(v, "value", v)) for v in value) + "`"
    return f"`{plain_number(value)}`"


def _summary(model: type[BaseModel]) -> str:
    return (inspect.getdoc(model) or "").splitlines()[0]


def _rows(model: type[BaseModel], path: str, env: str | None, out: list[Row]) -> None:
    for name, info in model.model_fields.items():
        full = f"{path}{key_of(name, info)}"
        env_name = f"{env}_{name.upper()}" if env is not None else None
        doc = info.description or ""
        inner, _ = unwrap(info.annotation)
        if is_model(inner):
            out.append((f"`{full}`", "section", _default(info), "", "", doc or _summary(inner)))
            _rows(inner, f"{full}.", env_name, out)
            continue
        item = None
        origin = typing.get_origin(inner)
        if origin is dict:
            item = unwrap(typing.get_args(inner)[1])[0]
            suffix = f".<{_extra(info, 'placeholder') or 'key'}>."
        elif origin is tuple:
            item, suffix = unwrap(typing.get_args(inner)[0])[0], "[]."
        type_name = _extra(info, "type") or _type_name(info.annotation)
        if item is not None and is_model(item):
            out.append((f"`{full}`", type_name, _default(info), "", "", doc or _summary(item)))
            _rows(item, f"{full}{suffix}", None, out)
            continue
        bounds = ", ".join(t for t in (_bounds(info.metadata), _item_bounds(inner)) if t)
        shown_env = f"`{env_name}`" if env_name and is_scalar(info.annotation) else ""
        out.append((f"`{full}`", type_name, _default(info), bounds, shown_env, doc))


def render_reference(model: type[BaseModel] = AgentConfig, env: str | None = "NODEAGENT") -> str:
    """The generated part of a document: one table row per field of ``model``."""
    rows: list[Row] = []
    _rows(model, "", env, rows)
    lines = [
        BEGIN,
        "",
        "| field | type | default | range | environment | meaning |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        "| "
        + " | ".join(cell.replace("|", "\\|") if i != 1 else cell for i, cell in enumerate(row))
        + " |"
        for row in rows
    ]
    lines += ["", END]
    return "\n".join(lines)


def embed(document: str) -> str:
    """``document`` with the generated reference replaced by a fresh rendering."""
    start = document.index(BEGIN)
    end = document.index(END) + len(END)
    return document[:start] + render_reference() + document[end:]


def main() -> None:
    """Print the reference, or rewrite it inside a document with ``--write FILE``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--write", type=Path, help="replace the generated part of this file")
    args = parser.parse_args()
    if args.write:
        args.write.write_text(embed(args.write.read_text()))
    else:
        sys.stdout.write(render_reference() + "\n")


if __name__ == "__main__":
    main()
