"""Time as the reconcile loop sees it: real, or a fake that tests advance by hand."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall-clock seconds (epoch) and a wait that a fake clock can short-circuit."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for ``event``; returns whether it was set."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Block on the event for at most ``timeout_s``."""
        return event.wait(max(0.0, timeout_s))


class FakeClock:
    """A clock that moves only when told to (``advance``); ``wait`` never blocks long."""

    def __init__(self, start_s: float = 1_800_000_000.0) -> None:
        self._now = start_s
        self._lock = threading.Lock()

    def now(self) -> float:
        """The fake time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        with self._lock:
            self._now += seconds

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Yield briefly (threads still need to run) without letting fake time pass."""
        return event.wait(min(max(0.0, timeout_s), 0.01))
