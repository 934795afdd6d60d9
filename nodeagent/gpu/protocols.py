"""The parts of the GPU layer a consumer may ask for: each takes only what it uses.

:class:`~nodeagent.gpu.node.GpuNode` provides all of them; a test can hand in anything of the
same shape.
"""

from __future__ import annotations

from typing import Protocol

from nodeagent.gpu.events import EventWatcher
from nodeagent.gpu.mig import MigModeChange
from nodeagent.gpu.types import (
    GpuInfo,
    GpuInstance,
    MigGeometry,
    NodeSnapshot,
    Placement,
    Telemetry,
)


class GpuInventory(Protocol):
    """What the GPUs are (MIG planning and validation read this)."""

    def count(self) -> int:
        """Number of physical GPUs."""
        ...

    def info(self, index: int) -> GpuInfo:
        """Static facts of one GPU, with its MIG mode now."""
        ...

    def mig_geometry(self, index: int) -> MigGeometry | None:
        """The GPU's MIG profiles and legal placements, or ``None`` when it is not MIG-capable."""
        ...


class MigDevices(GpuInventory, Protocol):
    """What the MIG applier reads and changes."""

    def mig_instances(self, index: int) -> tuple[GpuInstance, ...]:
        """Current GPU instances with compute instances and processes, sorted by placement."""
        ...

    def telemetry(self, index: int) -> Telemetry:
        """One sample (the applier reads the processes before a reset)."""
        ...

    def set_mig_mode(self, index: int, enabled: bool) -> MigModeChange:
        """Request MIG on or off."""
        ...

    def reset_gpu(self, index: int) -> None:
        """Reset the GPU so a pending MIG mode takes effect."""
        ...

    def create_gpu_instance(self, index: int, profile: str, placement: Placement) -> GpuInstance:
        """Create a GPU instance at an explicit placement plus one compute instance spanning it."""
        ...

    def destroy_gpu_instance(self, index: int, instance_id: int) -> None:
        """Destroy a GPU instance (its compute instances first)."""
        ...

    def destroy_compute_instance(self, index: int, gpu_instance_id: int, ci_id: int) -> None:
        """Destroy one compute instance."""
        ...


class SnapshotSource(Protocol):
    """What the sampler reads: one snapshot of every GPU per call."""

    nvlink_counters_interval_s: float  # NVLink error counters are read at most this often
    profiling_enabled: bool  # GPM profiling figures in the snapshot (where the GPU has GPM)
    profiling_interval_s: float  # GPM figures are sampled at most this often

    def snapshot(self) -> NodeSnapshot:
        """Sample every GPU."""
        ...


class EventSource(Protocol):
    """Where XID and ECC events come from (the health component)."""

    def watch_events(self) -> EventWatcher:
        """Open an event set on every GPU that supports it."""
        ...
