"""The one error type of every file nodeagent reads, and the problems it carries.

Every reader (agent config, MIG layouts and hooks, tier policy) raises :class:`ConfigError`,
whose ``problems`` each name the file, the line where known, the field and what is wrong; the
CLI prints one line per problem and exits 2, and the agent logs them and keeps going.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# A place inside a document: mapping keys and list indices from the top, e.g.
# ("mig-configs", "all-balanced", 0, "mig-devices").
FieldPath = tuple[str | int, ...]


def dotted(path: Iterable[str | int]) -> str:
    """A field path as operators read it: ``mig-configs.balanced[0].devices``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong: where it is and what is wrong."""

    file: str  # the file, or where else the value came from ("env NODEAGENT_...")
    line: int | None  # 1-based; None when unknown (a missing file, an environment variable)
    field: str  # dotted path, e.g. mig-configs.all-balanced[0].mig-devices.1g.10gb
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


class ConfigError(ValueError):
    """A file (or a value from the environment) is unusable; ``problems`` lists every problem."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def single(cls, file: str, message: str, *, line: int | None = None) -> ConfigError:
        """An error with one problem that concerns the whole file (or one line of it)."""
        return cls([Problem(file, line, "", message)])


class FieldError(ValueError):
    """Raised by a model's cross-field check: one or more (field, message) pairs.

    Plain ``ValueError`` from a validator points at the whole section; this one names the
    fields (by their YAML keys, relative to the section), so the loader can give each its own
    line, and it carries every problem the check found, not only the first.
    """

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[FieldPath, str]] = []

    def add(self, field: str | FieldPath, message: str) -> None:
        """Record a problem at ``field`` (a key, or a path below the section)."""
        self.found.append(((field,) if isinstance(field, str) else field, message))

    def raise_any(self) -> None:
        """Raise this exception when anything was recorded."""
        if self.found:
            raise self

    def __str__(self) -> str:
        return "; ".join(f"{dotted(path)}: {message}" for path, message in self.found)
