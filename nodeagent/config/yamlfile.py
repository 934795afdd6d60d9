"""Reading one YAML file strictly: bytes, text, YAML, and the line of every key and item.

Whatever a file holds, reading it either returns a :class:`Document` or raises
:class:`~nodeagent.config.errors.ConfigError` with one line that names the file (and the line
where known) and what to do. What is refused, and why:

- more bytes than the reader's :class:`Limits` allow (a config is a few KiB, so
  :data:`CONFIG` stops at :data:`MAX_BYTES`; a larger file is the wrong file, and a device like
  ``/dev/zero`` never ends);
- a directory, a missing or unreadable file;
- bytes that are not UTF-8 (YAML is text; the line of the first bad byte is named);
- YAML syntax errors, several documents in one file;
- tags other than YAML's plain types (``!!python/object``, ``!foo``): a config has no use for
  them, and a tag must never construct anything;
- duplicate keys (YAML forbids them; PyYAML would silently keep the last one);
- documents nested deeper than the depth limit (:data:`MAX_DEPTH`), holding more values than
  the value limit (:data:`MAX_VALUES`), or expanding, through aliases, to more values than the
  alias limit (:data:`MAX_ALIAS_VALUES`): an alias bomb (``*h`` nine levels of nine) would
  otherwise take the memory of the host, and nesting the stack. Each limit is checked while
  the data is built, so a bomb stops after at most that many values, and the error names the
  limit that was broken.

Every reader of nodeagent (agent config, pool policy, mig-parted layouts and hooks, tier
policy, quota policy, the tiering simulator's cluster file) goes through this module; the
readers of larger data files pass their own :class:`Limits`.

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
# Values built by following aliases: a config shares a few snippets (`<<: *defaults`), never
# thousands of values; far below what an alias bomb needs to hurt.
MAX_ALIAS_VALUES = 10_000


@dataclass(frozen=True, slots=True)
class Limits:
    """What one kind of file may hold; the error names the limit a file broke."""

    max_bytes: int = MAX_BYTES
    max_depth: int = MAX_DEPTH
    max_values: int = MAX_VALUES  # every mapping, list and scalar, aliases expanded
    max_alias_values: int = MAX_ALIAS_VALUES  # those of them built by following an alias
    size_hint: str = "a nodeagent file is a few KiB, so this is probably not the file you meant"


CONFIG = Limits()

# libyaml when it is there (much faster, and it bounds nesting itself); the same SafeLoader
# semantics either way.
_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_CORE = "tag:yaml.org,2002:"
_STR = f"{_CORE}str"
_MAP = f"{_CORE}map"
_SEQ = f"{_CORE}seq"


class _Loader(_BaseLoader):  # type: ignore[misc]
    """The safe loader, resolving each distinct plain scalar's tag once per file.

    Even libyaml's composer asks the Python resolver for the tag of every node (a list of
    regular expressions per first character for a scalar); a cluster file repeats the same few
    hundred values (``v1``, ``Pod``, ``nvidia.com/gpu``) across 10,000 pods, so the answer is
    kept, and a list or mapping without a tag is what it is (the safe loader has no path
    resolvers that could say otherwise).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._tags: dict[tuple[str, Any], str] = {}

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode:
            key = (value, implicit)
            tag = self._tags.get(key)
            if tag is None:
                tag = self._tags[key] = super().resolve(kind, value, implicit)
            return tag
        return _MAP if kind is yaml.MappingNode else _SEQ


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


def read_document(path: Path, limits: Limits = CONFIG) -> Document:
    """Read and parse one YAML file.

    Raises:
        ConfigError: the file cannot be read, is too large, is not UTF-8, not valid YAML, or
            uses tags, duplicate keys or nesting that nodeagent refuses (see the module doc).
    """
    name = str(path)
    try:
        with path.open("rb") as stream:
            raw = stream.read(limits.max_bytes + 1)
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
    if len(raw) > limits.max_bytes:
        raise ConfigError.single(
            name, f"larger than {limits.max_bytes // 1024} KiB (the size limit); {limits.size_hint}"
        )
    return parse_document(raw, name, limits)


def parse_document(content: str | bytes, name: str, limits: Limits = CONFIG) -> Document:
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
    return _Reader(name, text, limits).document()


class _LimitError(Exception):
    """The document broke one of its :class:`Limits`; the message says which and what to do."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class _Reader:
    """Composes the YAML node graph once, then builds the data and the line map from it.

    The graph is a DAG where the file uses aliases (an alias is the anchored node again), so
    building the data walks every alias expansion: that walk is where the limits are counted.
    """

    def __init__(self, name: str, text: str, limits: Limits) -> None:
        self.name = name
        self.text = text
        self.limits = limits
        self.lines: dict[FieldPath, int] = {}
        self.problems: list[Problem] = []
        self.values = 0
        self.alias_values = 0
        self.max_depth, self.max_values = limits.max_depth, limits.max_values
        self.built: set[int] = set()  # ids of the nodes built once: meeting one again is an alias
        self.loader = _Loader(text)

    def document(self) -> Document:
        try:
            try:
                root = self.loader.get_single_node()
                data = None if root is None else self._value(root, (), 0)
            finally:
                self.loader.dispose()
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            if "maximum nesting depth" in str(getattr(exc, "problem", "")):
                # libyaml's own bound (1,000 levels), met while parsing, before ours.
                raise ConfigError.single(
                    self.name, self._depth_message(), line=mark.line + 1 if mark else None
                ) from None
            raise ConfigError([self._syntax_problem(exc)]) from None
        except RecursionError:  # the pure-Python composer (no libyaml) recurses per level
            raise ConfigError.single(self.name, self._depth_message()) from None
        except _LimitError as exc:
            raise ConfigError.single(self.name, exc.message, line=exc.line) from None
        if self.problems:
            raise ConfigError(self.problems)
        return Document(self.name, data, self.lines)

    def _depth_message(self) -> str:
        return (
            f"nested deeper than {self.limits.max_depth} levels (the depth limit); "
            "flatten the lists and mappings"
        )

    def _limit(self, node: yaml.Node, depth: int, aliased: bool) -> None:
        """Count an aliased value; raise :class:`_LimitError` past a limit. Called only where
        one may be near: the common value (no alias, within bounds) costs two comparisons."""
        line = None if aliased else node.start_mark.line + 1
        if depth > self.limits.max_depth:
            raise _LimitError(self._depth_message(), line)
        if aliased:
            self.alias_values += 1
            if self.alias_values > self.limits.max_alias_values:
                raise _LimitError(
                    f"YAML aliases expand to more than {self.limits.max_alias_values} values "
                    "(the alias limit; an alias bomb?); write the values out, or alias less"
                )
        if self.values > self.limits.max_values:
            raise _LimitError(
                f"holds more than {self.limits.max_values} values (the value limit); "
                "split it into smaller files"
            )

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

    def _value(self, node: yaml.Node, path: FieldPath, depth: int, aliased: bool = False) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            # Scalars are shared by the composer only through aliases too, but counting them
            # is enough through their collection: an aliased list counts every item.
            aliased = aliased or id(node) in self.built
            self.built.add(id(node))
        self.values += 1
        if aliased or depth > self.max_depth or self.values > self.max_values:
            self._limit(node, depth, aliased)
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth, aliased)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ:
                self._tag_problem(node)
                return None
            return [
                self._value(item, (*path, i), depth + 1, aliased)
                for i, item in enumerate(node.value)
            ]
        if node.tag == _TIMESTAMP or node.tag == _STR:
            # Text as written (a date-like value, a version or a name, is meant as text too);
            # the constructor would only copy it, at a call per value.
            return node.value
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

    def _mapping(self, node: yaml.MappingNode, path: FieldPath, depth: int, aliased: bool) -> Any:
        if node.tag != _MAP:
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
            out[key] = self._value(value_node, sub, depth + 1, aliased)
            self.lines[sub] = line  # the key's line, even where the value starts below it
        return out
