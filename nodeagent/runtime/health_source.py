"""The interface through which other features read GPU health.

CONTRACT FILE: the device plugin, the exporter and the reporter depend on these names only, never
on the health model's internals (``nodeagent.health`` implements them).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class HealthState(enum.StrEnum):
    """Health of one GPU or MIG device, worst last."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"  # works, but an operator should look (SBE storm, throttling)
    UNHEALTHY = "unhealthy"  # must not take new work
    LOST = "lost"  # fell off the bus or stopped answering

    @property
    def schedulable(self) -> bool:
        """Whether the device plugin may advertise the device as Healthy."""
        return self in (HealthState.HEALTHY, HealthState.DEGRADED)


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """The health of one device (a GPU by its UUID, or a MIG device by its MIG UUID)."""

    uuid: str
    gpu_index: int
    state: HealthState
    reasons: tuple[str, ...]  # e.g. ("xid 79: GPU has fallen off the bus",)
    action: str  # recommended action, e.g. "reset the GPU"
    since_s: float  # wall-clock time of the last state change


@dataclass(frozen=True, slots=True)
class HealthTransition:
    """A device moved from one state to another."""

    previous: HealthState
    current: DeviceHealth


class HealthSource(Protocol):
    """What subscribers see of the health model."""

    def device_health(self) -> Mapping[str, DeviceHealth]:
        """Current health of every known device, keyed by GPU UUID and MIG device UUID."""
        ...

    def subscribe(self, callback: Callable[[HealthTransition], None]) -> Callable[[], None]:
        """Call ``callback`` on every transition (from the health thread); returns unsubscribe."""
        ...


@runtime_checkable
class NodeHealthView(Protocol):
    """The node-level part of the health model's report, read by shape."""

    @property
    def level(self) -> str:
        """Stability level: stable, degraded or unstable; unknown before the first sample."""
        ...

    @property
    def score(self) -> float:
        """The decayed sum of fault weights (0 = no recent faults)."""
        ...

    @property
    def xids_total(self) -> Mapping[tuple[str, int], int]:
        """XIDs seen, by (GPU UUID, code)."""
        ...

    @property
    def xid_last_s(self) -> Mapping[tuple[str, int], float]:
        """Unix time each (GPU UUID, code) was last seen."""
        ...

    @property
    def history_errors(self) -> int:
        """Unusable health-history files set aside since the agent started."""
        ...


@runtime_checkable
class NodeHealthSource(Protocol):
    """A health source that also reports node stability and XID counts (the health model)."""

    def node_health(self) -> NodeHealthView:
        """A consistent view of the node's health."""
        ...
