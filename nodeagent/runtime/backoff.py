"""Exponential backoff: the delay before the next attempt after consecutive failures.

One rule for every retry in the project (the supervisor's restarts, the device plugin's
registration, the health reporter's node patches, the tiering service's watch and its PDB
evictions): ``initial_s`` after the first failure, doubled after each further one, never more
than ``max_s``, and back to ``initial_s`` after a success. It only computes delays: each caller
keeps its own schedule (a tick loop, a per-pod timer, a fake clock), which is why this is not a
retrying decorator such as tenacity's or backoff's, whose loop would own the waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Backoff:
    """The delays of one retried thing."""

    initial_s: float
    max_s: float
    failures: int = field(default=0, init=False)  # consecutive failures so far

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"backoff needs 0 < initial ({self.initial_s}) <= max ({self.max_s})")

    @property
    def delay_s(self) -> float:
        """The delay after the failures so far (0 before the first one)."""
        if self.failures == 0:
            return 0.0
        # The exponent is capped so a thing failing for days cannot overflow the float.
        return min(self.initial_s * 2.0 ** min(self.failures - 1, 64), self.max_s)

    def fail(self) -> float:
        """Count a failure; returns the delay before the next attempt."""
        self.failures += 1
        return self.delay_s

    def succeed(self) -> None:
        """Start again from ``initial_s`` at the next failure."""
        self.failures = 0
