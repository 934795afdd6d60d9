"""Atomic JSON files: a reader (or a crash) sees the old file or the new one, never half.

Every state file of the project goes through here: the simulator's node, the MIG intent, the
health history and status, the MIG reconciler's status.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


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
