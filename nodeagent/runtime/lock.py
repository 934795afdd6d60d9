"""Exclusive locks that name their holder: one agent per node, one MIG apply at a time.

A lock is ``flock(2)`` on a lock file whose content is the holder's PID. The kernel drops the
lock when the holder's file descriptor closes, so a process killed with SIGKILL never leaves a
stale lock behind; the PID in the file is only there so a refused process can say who holds it.

Not the ``filelock`` package: its Unix lock truncates the file when it *tries* to lock, so a
waiting process would erase the holder's PID, and it cannot tell who holds a lock. ``flock``
locks belong to an open file description, so a second lock object in the same process is
refused exactly as another process would be (the in-process tests rely on that).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

POLL_S = 0.05  # how often a waiting acquire tries again
# The lock a running agent holds in its state directory (`nodeagent status` probes it).
AGENT_LOCK_FILE = "agent.lock"


class LockHeldError(Exception):
    """Another process holds the lock; ``pid`` is its PID when the lock file names one."""

    def __init__(self, path: Path, pid: int | None, what: str) -> None:
        self.path = path
        self.pid = pid
        self.what = what
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(f"{what} is in use by {holder} (lock {path})")


def read_holder(path: Path) -> int | None:
    """The PID written in the lock file ``path``, or None when it names none."""
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdecimal() else None


class ProcessLock:
    """An exclusive lock on ``path`` (created with its directory), released on :meth:`release`.

    ``what`` names the guarded thing in the refusal message ("the agent state directory
    /var/lib/nodeagent", "the node's MIG layout").
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(
        self,
        timeout_s: float = 0.0,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Take the lock, waiting up to ``timeout_s`` for the holder to let go.

        Raises:
            LockHeldError: still held by another process (or lock object) after ``timeout_s``.
            OSError: the lock file cannot be created (its directory is read-only, say).
        """
        if self._fd is not None:
            return
        deadline = clock() + timeout_s
        while True:
            if self._try():
                return
            if clock() >= deadline:
                raise LockHeldError(self.path, read_holder(self.path), self.what)
            sleep(min(POLL_S, max(0.0, deadline - clock())))

    def _try(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # No O_TRUNC: the file holds the current holder's PID until we own the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                return False
            raise
        st = os.fstat(fd)
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            current = None
        if current is None or (current.st_dev, current.st_ino) != (st.st_dev, st.st_ino):
            # The file was removed or replaced between open and flock: the lock we took is on
            # an orphan that nobody else can see. Try again on the file that is there now.
            os.close(fd)
            return self._try()
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        self._identity = (st.st_dev, st.st_ino)
        return True

    def intact(self) -> bool:
        """Whether the lock file on disk is still the one locked (nobody deleted it)."""
        if self._identity is None:
            return False
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def renew(self) -> None:
        """Lock the path again after someone deleted the file (a kubelet cleaning its directory).

        Our lock on the deleted file still holds, but nobody can see it: a second process would
        create a fresh file and lock that. Re-locking the fresh file closes the gap.

        Raises:
            LockHeldError: someone else locked the new file first.
        """
        if self._fd is None or self.intact():
            return
        old = self._fd
        self._fd = self._identity = None
        try:
            if not self._try():
                raise LockHeldError(self.path, read_holder(self.path), self.what)
        finally:
            os.close(old)

    def release(self) -> None:
        """Let go of the lock (closing the descriptor drops it); the file stays for the next."""
        if self._fd is None:
            return
        fd, self._fd, self._identity = self._fd, None, None
        os.close(fd)

    def __enter__(self) -> ProcessLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def is_held(path: Path) -> bool:
    """Whether some process holds the lock on ``path`` now (a probe that takes it for a moment).

    A process starting at that very moment may find the lock taken by the probe; every
    ``acquire`` that must not fail on a probe passes a small timeout.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: nobody ever held it here
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def holding(lock: ProcessLock, timeout_s: float = 0.0) -> Iterator[ProcessLock]:
    """``with holding(lock, 30):`` takes ``lock`` (waiting up to 30 s) and releases it after."""
    lock.acquire(timeout_s)
    try:
        yield lock
    finally:
        lock.release()
