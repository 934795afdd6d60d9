"""Waking up when the simulated node's state file changes, without busy polling.

``nvmlEventSetWait`` on real hardware sleeps in the driver until an event arrives; the simulator
imitates that with Linux inotify on the state directory (state writes are atomic renames, which
inotify reports as ``IN_MOVED_TO``), so an idle event thread costs no CPU. Where inotify is not
available the waiter falls back to sleeping in short steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import time
from pathlib import Path

_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
FALLBACK_POLL_S = 0.004  # without inotify: events then arrive within a few milliseconds


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    return lib if hasattr(lib, "inotify_init1") else None


class ChangeWaiter:
    """Blocks until the directory's files change, or a timeout passes.

    Use: ``waiter.drain()``, then check the state, then ``waiter.wait(timeout)`` if nothing was
    found. A change made between the check and the wait is not lost: the watch is armed for
    the waiter's whole life, so the wait returns at once.
    """

    def __init__(self, directory: Path) -> None:
        self._fd: int | None = None
        lib = _libc()
        if lib is None:
            return
        fd = int(lib.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))
        if fd < 0:
            return
        mask = _IN_MOVED_TO | _IN_CLOSE_WRITE
        if lib.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
            os.close(fd)
            return
        self._fd = fd

    @property
    def uses_inotify(self) -> bool:
        """Whether changes wake the waiter (False: it sleeps in short steps)."""
        return self._fd is not None

    def drain(self) -> None:
        """Forget the changes seen so far."""
        if self._fd is None:
            return
        try:
            while os.read(self._fd, 65536):
                pass
        except BlockingIOError:
            pass

    def wait(self, timeout_s: float) -> None:
        """Return when something in the directory changed or ``timeout_s`` passed."""
        if timeout_s <= 0:
            return
        if self._fd is None:
            time.sleep(min(FALLBACK_POLL_S, timeout_s))
            return
        select.select([self._fd], [], [], timeout_s)

    def close(self) -> None:
        """Release the inotify descriptor."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
