"""Test helpers for the device plugin: a scripted health source and node builders."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import Placement
from nodeagent.runtime.health import DeviceHealth, HealthState, HealthTransition


class ScriptedHealth:
    """A real HealthSource whose states the test sets (the protocol, not a mock of the model)."""

    def __init__(self) -> None:
        self._health: dict[str, DeviceHealth] = {}
        self._subscribers: list[Callable[[HealthTransition], None]] = []
        self._lock = threading.Lock()

    def device_health(self) -> Mapping[str, DeviceHealth]:
        with self._lock:
            return dict(self._health)

    def subscribe(self, callback: Callable[[HealthTransition], None]) -> Callable[[], None]:
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def set(self, uuid: str, state: HealthState, reason: str = "test", index: int = 0) -> None:
        current = DeviceHealth(uuid, index, state, (reason,), "none", time.time())
        with self._lock:
            previous = self._health.get(uuid)
            self._health[uuid] = current
            subscribers = list(self._subscribers)
        transition = HealthTransition(previous.state if previous else HealthState.HEALTHY, current)
        for callback in subscribers:
            callback(transition)


def enable_mig(node: GpuNode, layout: Mapping[int, list[str]]) -> None:
    """Put GPUs into MIG mode and create instances: {gpu index: [profile, ...]}, packed left."""
    for index, profiles in layout.items():
        change = node.set_mig_mode(index, True)
        if change.reset_required:
            node.reset_gpu(index)
        geometry = node.mig_geometry(index)
        assert geometry is not None
        used: list[Placement] = []
        for name in profiles:
            profile = geometry.profile(name)
            assert profile is not None, name
            placement = next(p for p in profile.placements if not any(p.overlaps(u) for u in used))
            used.append(placement)
            node.create_gpu_instance(index, name, placement)
