"""A list of callbacks that a producer calls on every new value, errors logged and not raised."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Subscribers(Generic[T]):
    """Callbacks taking a ``T``; safe to add, remove and call from any thread.

    A failing callback is logged and skipped: one broken consumer must not stop the producer
    (the sampler, the health model) nor starve the others.
    """

    def __init__(self, what: str) -> None:
        self._what = what  # for the log line: "snapshot subscriber", "health listener"...
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[T], None]] = []

    def add(self, callback: Callable[[T], None]) -> Callable[[], None]:
        """Call ``callback`` on every :meth:`notify`; returns the function that removes it."""
        with self._lock:
            self._callbacks.append(callback)

        def remove() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return remove

    def current(self) -> tuple[Callable[[T], None], ...]:
        """The callbacks now, for a caller that delivers several values under its own lock."""
        with self._lock:
            return tuple(self._callbacks)

    def notify(self, value: T, callbacks: tuple[Callable[[T], None], ...] | None = None) -> None:
        """Call every callback (or the ``callbacks`` taken earlier) with ``value``."""
        for callback in self.current() if callbacks is None else callbacks:
            try:
                callback(value)
            except Exception:
                log.exception("%s %r failed", self._what, callback)
