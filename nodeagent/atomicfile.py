"""Atomic JSON files: a reader (or a crash) sees the old file or the new one, never half.

Every state file of the project goes through here: the simulator's node, the MIG intent, the
health history and status, the MIG reconciler's status. Files with a schema are read back
through :func:`read_json_as`, so a damaged one is named with its first bad field.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # pydantic is imported by the readers that validate, not by every command
    from pydantic import TypeAdapter, ValidationError

_T = TypeVar("_T")


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or ``None`` when it does not exist.

    Raises:
        ValueError: the file exists but is not valid JSON (named in the message).
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc


def first_problem(exc: ValidationError, root: str = "") -> str:
    """pydantic's first error as one line, ``where: what`` (for a log line or a CLI error)."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in (root, *first["loc"]) if part != "") or "(top)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def read_json_as(path: Path, schema: TypeAdapter[_T]) -> _T | None:
    """The state file ``path`` validated by ``schema``, or ``None`` when there is no file.

    Validated from the JSON text itself, so strict schemas keep JSON's types (an enum from its
    value, a float from a number, never a string or a bool for a number).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not valid JSON, or not what ``schema`` says (path, field, reason).
    """
    from pydantic import ValidationError

    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return schema.validate_json(text)
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "json_invalid":
            raise ValueError(f"{path}: not valid JSON ({exc.errors()[0]['msg']})") from None
        raise ValueError(f"{path}: {first_problem(exc)}") from None


def write_json_atomic(
    path: Path, data: Any, *, durable: bool = True, compact: bool = False
) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename.

    Args:
        path: the target; its directory is created when missing.
        data: anything ``json.dumps`` takes (``default=str`` covers paths and enums).
        durable: fsync the file and the directory, so the write survives a power loss or a
            kill -9 right after it (the MIG intent and the health history need this; the
            simulator's state, rewritten on every change, does not).
        compact: no indentation (large files written often).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if compact:
                json.dump(data, handle, separators=(",", ":"), default=str)
            else:
                json.dump(data, handle, indent=1, sort_keys=True, default=str)
                handle.write("\n")
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)


def write_text_atomic(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it and a rename.

    A reader (or a crash, a full disk) sees the old file or the new one, never half of the new
    one. The directory must exist: a file named in a directory that is not there is more often
    a typo than a wish to create it.

    Args:
        path: the target, replaced when it exists (it must not be a directory).
        text: the whole content (UTF-8).
        mode: permission bits for the new file (default 0644).

    Raises:
        OSError: the directory is missing or not writable, ``path`` is a directory, the disk
            is full; nothing is left behind (the temporary file is removed).
    """
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644 if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
