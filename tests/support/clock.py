"""A fake wall clock for tests: time moves only when the test says so."""

from __future__ import annotations


class FakeClock:
    """Callable like ``time.time``; ``advance`` (or setting ``now``) moves it."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
