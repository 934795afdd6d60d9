"""A scripted health source: a real ``HealthSource`` whose states the test sets."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from nodeagent.runtime.health_source import DeviceHealth, HealthState, HealthTransition
from nodeagent.runtime.subscribers import Subscribers


class ScriptedHealth:
    """A real HealthSource whose states the test sets (the protocol, not a mock of the model)."""

    def __init__(self) -> None:
        self._health: dict[str, DeviceHealth] = {}
        self._subscribers: Subscribers[HealthTransition] = Subscribers("health subscriber")
        self._lock = threading.Lock()

    def device_health(self) -> Mapping[str, DeviceHealth]:
        """The states set so far."""
        with self._lock:
            return dict(self._health)

    def subscribe(self, callback: Callable[[HealthTransition], None]) -> Callable[[], None]:
        """Call ``callback`` on every :meth:`set`; returns unsubscribe."""
        return self._subscribers.add(callback)

    def set(self, uuid: str, state: HealthState, reason: str = "test", index: int = 0) -> None:
        """Put device ``uuid`` in ``state`` and tell the subscribers."""
        current = DeviceHealth(uuid, index, state, (reason,), "none", time.time())
        with self._lock:
            previous = self._health.get(uuid)
            self._health[uuid] = current
        transition = HealthTransition(previous.state if previous else HealthState.HEALTHY, current)
        self._subscribers.notify(transition)
