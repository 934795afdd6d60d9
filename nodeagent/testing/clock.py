"""A fake wall clock: time moves only when the test says so."""

from __future__ import annotations

import threading


class FakeClock:
    """Callable like ``time.time``; ``advance`` (or setting ``now``) moves it.

    ``wait`` gives other threads a moment without letting fake time pass, so a loop paced by
    this clock (the tiering controller's) runs only as fast as the test advances it.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        with self._lock:
            self.now += seconds

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Yield briefly (threads still need to run); returns whether ``event`` was set."""
        return event.wait(min(max(0.0, timeout_s), 0.01))
