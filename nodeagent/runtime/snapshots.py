"""The latest NodeSnapshot, shared read-only between threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from nodeagent.gpu.types import NodeSnapshot
from nodeagent.runtime.subscribers import Subscribers

SnapshotCallback = Callable[[NodeSnapshot], None]


class SnapshotFeed(Protocol):
    """What a feature sees of the snapshot store: read the latest, wait for or follow new ones."""

    @property
    def latest(self) -> NodeSnapshot | None:
        """The newest snapshot, or None before the first sample."""
        ...

    @property
    def generation(self) -> int:
        """How many snapshots have been published."""
        ...

    def subscribe(self, callback: SnapshotCallback) -> Callable[[], None]:
        """Call ``callback`` on every new snapshot (sampler thread); returns unsubscribe."""
        ...

    def wait_newer(self, generation: int, timeout_s: float) -> NodeSnapshot | None:
        """Wait until a snapshot newer than ``generation`` exists; None on timeout."""
        ...


class SnapshotStore:
    """Holds the newest snapshot and tells subscribers about each new one.

    Snapshots are immutable, so readers take a reference and never lock while using it.
    """

    def __init__(self) -> None:
        self._latest: NodeSnapshot | None = None
        self._cond = threading.Condition()
        self._subscribers: Subscribers[NodeSnapshot] = Subscribers("snapshot subscriber")
        self._generation = 0

    @property
    def latest(self) -> NodeSnapshot | None:
        """The newest snapshot, or None before the first sample."""
        return self._latest

    @property
    def generation(self) -> int:
        """How many snapshots have been published."""
        return self._generation

    def publish(self, snapshot: NodeSnapshot) -> None:
        """Make ``snapshot`` the latest and call every subscriber (errors are logged, not raised).

        A failing subscriber must not stop the sampler: the others still get the snapshot.
        """
        with self._cond:
            self._latest = snapshot
            self._generation += 1
            self._cond.notify_all()
        self._subscribers.notify(snapshot)

    def subscribe(self, callback: SnapshotCallback) -> Callable[[], None]:
        """Call ``callback`` on every new snapshot (sampler thread); returns unsubscribe."""
        return self._subscribers.add(callback)

    def wait_newer(self, generation: int, timeout_s: float) -> NodeSnapshot | None:
        """Wait until a snapshot newer than ``generation`` exists; None on timeout."""
        with self._cond:
            self._cond.wait_for(lambda: self._generation > generation, timeout=timeout_s)
            return self._latest if self._generation > generation else None
