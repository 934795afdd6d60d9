"""Reading one YAML file strictly: bytes, text, YAML, and the line of every key and item.

Whatever a file holds, reading it either returns a :class:`Document` or raises
:class:`~nodeagent.config.errors.ConfigError` with one line that names the file (and the line
where known) and what to do. What is refused, and why:

- more than :data:`MAX_BYTES` (a config is a few KiB; a larger file is the wrong file, and a
  device like ``/dev/zero`` never ends);
- a directory, a missing or unreadable file;
- bytes that are not UTF-8 (YAML is text; the line of the first bad byte is named);
- YAML syntax errors, several documents in one file;
- tags other than YAML's plain types (``!!python/object``, ``!foo``): a config has no use for
  them, and a tag must never construct anything;
- duplicate keys (YAML forbids them; PyYAML would silently keep the last one);
- documents nested deeper than :data:`MAX_DEPTH` or expanding, through aliases, to more than
  :data:`MAX_VALUES` values (an alias bomb would otherwise take the memory of the host).

Mapping keys are read as text, as written (``3:`` is the key ``"3"``), because every mapping in
nodeagent's formats is keyed by names or GPU indices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nodeagent.config.errors import ConfigError, FieldPath, Problem, dotted

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64
MAX_VALUES = 100_000

# libyaml when it is there (much faster, and it bounds nesting itself); the same SafeLoader
# semantics either way.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_CORE}{t}" for t in ("str", "int", "float", "bool", "null")}
_TIMESTAMP = f"{_CORE}timestamp"


@dataclass(frozen=True, slots=True)
class Document:
    """A parsed file: its data, and the line of every mapping key and list item in it."""

    name: str  # the file as named to the operator
    data: Any
    lines: Mapping[FieldPath, int] = field(default_factory=dict)

    def line(self, path: FieldPath) -> int | None:
        """The line of ``path``, else of the nearest enclosing key or item that has one."""
        probe = path
        while True:
            line = self.lines.get(probe)
            if line is not None or not probe:
                return line
            probe = probe[:-1]


def read_document(path: Path) -> Document:
    """Read and parse one YAML file.

    Raises:
        ConfigError: the file cannot be read, is too large, is not UTF-8, not valid YAML, or
            uses tags, duplicate keys or nesting that nodeagent refuses (see the module doc).
    """
    name = str(path)
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_BYTES + 1)
    except IsADirectoryError:
        raise ConfigError.single(name, "is a directory; name the file itself") from None
    except FileNotFoundError:
        raise ConfigError.single(name, "no such file; check the path") from None
    except PermissionError:
        raise ConfigError.single(
            name, "permission denied; run as a user that can read it, or fix its mode"
        ) from None
    except OSError as exc:
        raise ConfigError.single(name, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError.single(
            name,
            f"larger than {MAX_BYTES // 1024} KiB; a nodeagent file is a few KiB, "
            "so this is probably not the file you meant",
        )
    return parse_document(raw, name)


def parse_document(content: str | bytes, name: str) -> Document:
    """Parse YAML text (or UTF-8 bytes) that came from ``name``.

    Raises:
        ConfigError: as :func:`read_document`, for everything but reading.
    """
    if isinstance(content, bytes):
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = content.count(b"\n", 0, exc.start) + 1
            byte = content[exc.start]
            raise ConfigError.single(
                name,
                f"byte 0x{byte:02x} is not UTF-8 text; save the file as UTF-8",
                line=line,
            ) from None
    else:
        text = content
    return _Reader(name, text).document()


class _TooLargeError(Exception):
    """The document nests too deeply or expands to too many values (aliases)."""


class _Reader:
    """Composes the YAML node graph once, then builds the data and the line map from it."""

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text
        self.lines: dict[FieldPath, int] = {}
        self.problems: list[Problem] = []
        self.values = 0
        self.loader = _Loader(text)

    def document(self) -> Document:
        try:
            try:
                root = self.loader.get_single_node()
                data = None if root is None else self._value(root, (), 0)
            finally:
                self.loader.dispose()
        except yaml.YAMLError as exc:
            raise ConfigError([self._syntax_problem(exc)]) from None
        except (_TooLargeError, RecursionError):
            raise ConfigError.single(
                self.name,
                f"nested deeper than {MAX_DEPTH} levels or expanding to more than "
                f"{MAX_VALUES} values (YAML aliases?); write the values out plainly",
            ) from None
        if self.problems:
            raise ConfigError(self.problems)
        return Document(self.name, data, self.lines)

    def _syntax_problem(self, exc: yaml.YAMLError) -> Problem:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        if isinstance(exc, yaml.reader.ReaderError):
            # Control characters and the like; the position is a character offset.
            line = self.text.count("\n", 0, exc.position) + 1
            return Problem(
                self.name,
                line,
                "",
                f"character #x{exc.character:04x} is not allowed in YAML; remove it",
            )
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if isinstance(exc, yaml.composer.ComposerError) and "another document" in problem:
            return Problem(self.name, line, "", "holds more than one YAML document; keep one")
        context = getattr(exc, "context", None)
        detail = f"{problem} ({context})" if context else problem
        return Problem(self.name, line, "", f"not valid YAML: {detail}")

    def _tag_problem(self, node: yaml.Node) -> None:
        shown = node.tag.replace(_CORE, "!!")
        self.problems.append(
            Problem(
                self.name,
                node.start_mark.line + 1,
                "",
                f"YAML tag {shown} is not supported; nodeagent reads plain YAML "
                "(mappings, lists, strings, numbers, true/false): remove the tag",
            )
        )

    def _value(self, node: yaml.Node, path: FieldPath, depth: int) -> Any:
        self.values += 1
        if depth > MAX_DEPTH or self.values > MAX_VALUES:
            raise _TooLargeError
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != f"{_CORE}seq":
                self._tag_problem(node)
                return None
            return [self._value(item, (*path, i), depth + 1) for i, item in enumerate(node.value)]
        if node.tag == _TIMESTAMP:
            return node.value  # a date-like value (a version, a name) is meant as text
        if node.tag not in _SCALAR_TAGS:
            self._tag_problem(node)
            return None
        try:
            return self.loader.construct_object(node, deep=True)
        except (ValueError, KeyError):  # an explicit tag on text that does not fit: !!int abc
            self.problems.append(
                Problem(
                    self.name,
                    node.start_mark.line + 1,
                    dotted(path),
                    f"{node.value!r} is not a valid {node.tag.replace(_CORE, '!!')}",
                )
            )
            return None

    def _mapping(self, node: yaml.MappingNode, path: FieldPath, depth: int) -> Any:
        if node.tag != f"{_CORE}map":
            self._tag_problem(node)
            return None
        self.loader.flatten_mapping(node)  # resolves `<<: *anchor` merge keys
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.append(
                    Problem(self.name, line, "", "a mapping key must be plain text, not a list")
                )
                continue
            if key_node.tag not in _SCALAR_TAGS and key_node.tag != _TIMESTAMP:
                self._tag_problem(key_node)
                continue
            key = str(key_node.value)
            sub = (*path, key)
            if key in out:
                self.problems.append(Problem(self.name, line, dotted(sub), "given twice; keep one"))
                continue
            self.lines[sub] = line
            out[key] = self._value(value_node, sub, depth + 1)
            self.lines[sub] = line  # the key's line, even where the value starts below it
        return out
