"""Time as the reconcile loop sees it: the real clock, or a fake one the tests advance.

A clock is called for the wall-clock time in seconds (like ``time.time``) and has a ``wait``
that a fake clock can cut short; :class:`nodeagent.testing.clock.FakeClock` is the fake.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall-clock seconds (epoch) and a wait that a fake clock can short-circuit."""

    def __call__(self) -> float:
        """Seconds since the epoch."""
        ...

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for ``event``; returns whether it was set."""
        ...


class SystemClock:
    """The real clock."""

    def __call__(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Block on the event for at most ``timeout_s``."""
        return event.wait(max(0.0, timeout_s))
