"""Atomic JSON files: a reader (or a crash) sees the old file or the new one, never half.

Every state file of the project goes through here: the simulator's node, the MIG intent, the
health history and status, the MIG reconciler's status. Files with a schema are read back
through :func:`read_json_as`, so a damaged one is named with its first bad field.

A file that cannot be read or written (a full disk, a directory where the file should be, no
permission) raises :class:`StateFileError`: an ``OSError`` whose message is one line naming the
path, the cause and what to fix, so that a caller logs or prints it as it is. A failed write
leaves the previous file as it was and no temporary file behind.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # pydantic is imported by the readers that validate, not by every command
    from pydantic import TypeAdapter, ValidationError

_T = TypeVar("_T")

# What an operator does about a failed write or read, by errno: the cause in words, the fix.
_CAUSES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("the file system is full", "free space on it"),
    errno.EDQUOT: ("the disk quota is exhausted", "free space or raise the quota"),
    errno.EISDIR: ("it is a directory", "remove that directory"),
    errno.ENOTDIR: ("a part of the path is a file, not a directory", "remove that file"),
    errno.EACCES: ("permission denied", "make the directory writable by the agent's user"),
    errno.EPERM: ("operation not permitted", "make the directory writable by the agent's user"),
    errno.EROFS: ("the file system is read-only", "mount it read-write"),
}


class StateFileError(OSError):
    """A state file cannot be read or written; ``str()`` is one line: path, cause, fix.

    An ``OSError`` (same ``errno``, ``strerror`` and ``filename``), so callers that handled any
    ``OSError`` keep working; :attr:`cause` is the short cause, the same for the same fault, so
    a caller can log a fault once and again only when it changes.
    """

    def __init__(self, path: Path, verb: str, exc: OSError) -> None:
        code = exc.errno or 0
        super().__init__(code, exc.strerror or str(exc), str(path))
        self.path = path
        cause, fix = _CAUSES.get(code, (exc.strerror or str(exc), ""))
        other = Path(exc.filename) if exc.filename is not None else path
        if other != path and other.parent != path.parent:
            # A directory above that failed (mkdir); the temporary file beside ``path`` is not
            # named: its name is random, and the same fault must read the same every time.
            cause = f"{cause} ({other})"
        self.cause = cause
        self.fix = fix
        self.verb = verb

    def __str__(self) -> str:
        fix = f"; {self.fix}" if self.fix else ""
        return f"cannot {self.verb} {self.path}: {self.cause}{fix}"


class WriteFaults:
    """The state files a component cannot write, logged once per change of state.

    A write retried at every report on a full disk logs its first failure, a different cause,
    and the recovery, never one line per attempt; files failing for the same cause (a full file
    system under both) share one line. Thread-safe: writers on several threads report here.

    Args:
        logger: where the lines go.
        what: what is not being written, for the log line (``"health state"``).
        meanwhile: what the component does while it cannot write (it keeps the last good file
            and retries, as every caller should).
    """

    def __init__(self, logger: logging.Logger, what: str, meanwhile: str) -> None:
        self._log = logger
        self._what = what
        self._meanwhile = meanwhile
        self._lock = threading.Lock()
        self._faults: dict[Path, str] = {}  # path -> cause of its last failed write

    def failed(self, exc: StateFileError) -> None:
        """A write of ``exc.path`` failed: log it unless the same cause is already logged."""
        with self._lock:
            if self._faults.get(exc.path) == exc.cause:
                return
            logged = exc.cause in self._faults.values()
            self._faults[exc.path] = exc.cause
        if not logged:
            self._log.error("%s not written: %s; %s", self._what, exc, self._meanwhile)

    def succeeded(self, path: Path) -> None:
        """A write of ``path`` succeeded: say so once the last failing file is written again."""
        with self._lock:
            if self._faults.pop(path, None) is None or self._faults:
                return
        self._log.info("%s written again (%s)", self._what, path)


def _is_dir_error(path: Path, verb: str) -> StateFileError:
    return StateFileError(
        path, verb, IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    )


def _replaceable(path: Path) -> None:
    """Raise unless a rename may replace ``path``: missing, or a regular file.

    The rename replaces whatever the path names: a directory fails late, and a device node, a
    socket or a pipe (``-o /dev/null`` run as root) would be replaced by a plain file.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateFileError(path, "write", exc) from exc
    if stat.S_ISDIR(st.st_mode):
        raise _is_dir_error(path, "write")
    if not stat.S_ISREG(st.st_mode):
        error = OSError(errno.EINVAL, "it is not a regular file (a device, socket or pipe)")
        raise StateFileError(path, "write", error)


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or ``None`` when it does not exist.

    Raises:
        StateFileError: the file cannot be read (a directory, no permission).
        ValueError: the file exists but is not valid JSON (named in the message).
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateFileError(path, "read", exc) from exc
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
        StateFileError: the file cannot be read (a directory, no permission).
        ValueError: it is not valid JSON, or not what ``schema`` says (path, field, reason).
    """
    from pydantic import ValidationError

    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateFileError(path, "read", exc) from exc
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

    Raises:
        StateFileError: it cannot be written (full disk, ``path`` a directory, no permission);
            the previous file is left as it was and no temporary file is left behind.
    """
    _replaceable(path)  # os.replace would refuse a directory only after the whole write
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise StateFileError(path, "write", exc) from exc
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
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise StateFileError(path, "write", exc) from exc
        raise
    if durable:
        try:
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # make the rename itself durable
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise StateFileError(path, "write", exc) from exc


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
        StateFileError: the directory is missing or not writable, ``path`` is a directory, the
            disk is full; nothing is left behind (the temporary file is removed).
    """
    _replaceable(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise StateFileError(path, "write", exc) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644 if mode is None else mode)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise StateFileError(path, "write", exc) from exc
        raise
