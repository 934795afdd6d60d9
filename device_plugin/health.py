"""Device health as the plugin advertises it, fed only by a :class:`HealthSource`.

The plugin has no NVML code: it subscribes to the health model's transitions. A device that
becomes unschedulable is Unhealthy at once; one that recovers stays Unhealthy until it has been
clear for a quiet period, so a flapping GPU does not bounce in and out of node capacity (and,
unlike NVIDIA's plugin, it does come back without a plugin restart).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from nodeagent.runtime.health import HealthSource, HealthState, HealthTransition

Clock = Callable[[], float]


class HealthTracker:
    """Which UUIDs (GPU or MIG) are unhealthy, with recovery after a quiet period.

    ``on_change`` is called (from the health thread or :meth:`poll`) whenever the answer of
    :meth:`reason` may have changed for some UUID.
    """

    def __init__(
        self,
        quiet_s: float,
        on_change: Callable[[], None],
        clock: Clock = time.monotonic,
    ) -> None:
        self.quiet_s = quiet_s
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()
        self._bad: dict[str, str] = {}  # uuid -> reason, while unschedulable or quiet
        self._clear_since: dict[str, float] = {}  # uuid -> when its fault cleared
        self._unsubscribe: Callable[[], None] | None = None

    def attach(self, source: HealthSource | None) -> None:
        """Take the source's current health, then follow its transitions."""
        self.detach()
        if source is None:
            return
        self._unsubscribe = source.subscribe(self._on_transition)
        for uuid, health in source.device_health().items():
            if not health.state.schedulable:
                self.set_state(uuid, health.state, health.reasons, initial=True)
        self._on_change()

    def detach(self) -> None:
        """Stop following the source."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _on_transition(self, transition: HealthTransition) -> None:
        current = transition.current
        if self.set_state(current.uuid, current.state, current.reasons):
            self._on_change()

    def set_state(
        self,
        uuid: str,
        state: HealthState,
        reasons: tuple[str, ...] = (),
        *,
        initial: bool = False,
    ) -> bool:
        """Record a device's state; returns whether the advertised answer changed.

        A device that is schedulable when first seen (``initial``) needs no quiet period.
        """
        now = self._clock()
        with self._lock:
            was_bad = uuid in self._bad
            if not state.schedulable:
                self._bad[uuid] = f"{state.value}: {'; '.join(reasons)}" if reasons else state.value
                self._clear_since.pop(uuid, None)
                return True  # newly bad, or the reason text changed
            if not was_bad or uuid in self._clear_since:
                return False
            if initial or self.quiet_s == 0:
                del self._bad[uuid]
                return True
            self._clear_since[uuid] = now
            self._bad[uuid] = f"recovering: clear for less than {self.quiet_s:g}s"
            return True

    def poll(self) -> bool:
        """Let devices whose quiet period has passed recover; returns whether any did."""
        now = self._clock()
        recovered = False
        with self._lock:
            for uuid, since in list(self._clear_since.items()):
                if now - since >= self.quiet_s:
                    del self._clear_since[uuid]
                    self._bad.pop(uuid, None)
                    recovered = True
        if recovered:
            self._on_change()
        return recovered

    def reason(self, *uuids: str) -> str | None:
        """Why the first unhealthy of ``uuids`` is unhealthy, or None when all are healthy."""
        with self._lock:
            for uuid in uuids:
                reason = self._bad.get(uuid)
                if reason is not None:
                    return reason
        return None
