"""Render the config reference (every field, type, default, env name, meaning) from the schema.

The schema's dataclasses are the single source: each field's meaning is the trailing comment on
its line (or the docstring of a nested section). ``docs/config.md`` embeds the output between
markers, and a test fails when the two differ, so the reference can't drift from the code.

    python -m nodeagent.config.reference --write docs/config.md
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import inspect
import io
import sys
import tokenize
import types
import typing
from pathlib import Path
from typing import Any

from nodeagent.config.loader import is_scalar_type, unwrap_optional
from nodeagent.config.schema import AgentConfig

BEGIN = "<!-- BEGIN GENERATED REFERENCE: python -m nodeagent.config.reference -->"
END = "<!-- END GENERATED REFERENCE -->"


def _comments(cls: type) -> dict[str, str]:
    """Trailing comments of a dataclass's field lines, by field name."""
    source = inspect.getsource(cls)
    found: dict[str, str] = {}
    pending: str | None = None  # a field whose definition spans lines (field(...) calls)
    depth = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type == tokenize.NAME and depth == 0 and tok.start[1] == 4 and pending is None:
            pending = tok.string
        elif tok.type == tokenize.COMMENT and pending is not None:
            found.setdefault(pending, tok.string.lstrip("# ").strip())
        if tok.type in (tokenize.NEWLINE,) and depth == 0:
            pending = None
    return found


def _unwrap(hint: Any) -> tuple[Any, bool]:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True  # noqa: UP007
    return hint, False


def _type_name(hint: Any) -> str:
    inner, optional = _unwrap(hint)
    origin = typing.get_origin(inner)
    if origin in (typing.Union, types.UnionType):
        name = " or ".join(_type_name(a) for a in typing.get_args(inner))
    elif origin is tuple:
        name = f"list of {_type_name(typing.get_args(inner)[0])}"
    elif origin is dict:
        name = f"map of {_type_name(typing.get_args(inner)[1])}"
    elif isinstance(inner, type) and issubclass(inner, enum.Enum):
        name = " \\| ".join(str(m.value) for m in inner)
    elif dataclasses.is_dataclass(inner):
        name = "section"
    elif inner is Path:
        name = "path"
    else:
        name = getattr(inner, "__name__", str(inner))
    return f"{name} (optional)" if optional else name


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return "see below"
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | dict) and not value:
        return "empty"
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, dict):
        return "`" + ", ".join(str(k) for k in value) + "`"
    if isinstance(value, tuple):
        return "`" + ", ".join(str(v) for v in value) + "`"
    return f"`{value}`"


Row = tuple[str, str, str, str, str]


def _rows(cls: type, path: str, env: str | None, out: list[Row]) -> None:
    hints = typing.get_type_hints(cls)
    comments = _comments(cls)
    for field in dataclasses.fields(cls):
        key = str(field.metadata.get("key", field.name))
        full = f"{path}{key}"
        hint = hints[field.name]
        inner, _ = _unwrap(hint)
        env_name = f"{env}_{field.name.upper()}" if env is not None else None
        doc = comments.get(field.name, "")
        if dataclasses.is_dataclass(inner) and isinstance(inner, type):
            summary = (inspect.getdoc(inner) or "").splitlines()[0]
            out.append((f"`{full}`", "section", _default(field), "", doc or summary))
            _rows(inner, f"{full}.", env_name, out)
            continue
        item = None
        if typing.get_origin(inner) is dict:
            item = typing.get_args(inner)[1]
            suffix = f".<{field.metadata.get('placeholder', 'key')}>."
        elif typing.get_origin(inner) is tuple:
            item, suffix = typing.get_args(inner)[0], "[]."
        if item is not None and dataclasses.is_dataclass(item) and isinstance(item, type):
            summary = (inspect.getdoc(item) or "").splitlines()[0]
            out.append((f"`{full}`", _type_name(hint), _default(field), "", doc or summary))
            _rows(item, f"{full}{suffix}", None, out)
            continue
        scalar = is_scalar_type(unwrap_optional(hint))
        shown_env = f"`{env_name}`" if env_name and scalar else ""
        out.append((f"`{full}`", _type_name(hint), _default(field), shown_env, doc))


def render_reference() -> str:
    """The generated part of docs/config.md."""
    rows: list[Row] = []
    _rows(AgentConfig, "", "NODEAGENT", rows)
    lines = [
        BEGIN,
        "",
        "| field | type | default | environment | meaning |",
        "|---|---|---|---|---|",
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
