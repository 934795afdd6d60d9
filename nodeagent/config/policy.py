"""Pool policy: what a pool of nodes wants from its GPUs.

A node belongs to one pool (``node.pool`` in the agent config, or the node label named by
``node.pool_label``). The pool names a MIG layout, the sharing mode of each GPU, health
thresholds and the driver version the pool expects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class SharingMode(enum.StrEnum):
    """How one GPU (or each MIG device on it) is shared between containers."""

    EXCLUSIVE = "exclusive"  # one container per device
    TIME_SLICING = "time-slicing"  # N replicas of the device, interleaved by the driver
    MPS = "mps"  # N replicas sharing the device through an MPS control daemon


class ReplicaPlacement(enum.StrEnum):
    """Where the device plugin prefers replicas when a pod asks for several."""

    SPREAD = "spread"  # across physical GPUs (fewest co-tenants)
    PACK = "pack"  # on as few physical GPUs as possible


@dataclass(frozen=True, slots=True)
class Sharing:
    """Sharing settings for one GPU or a default for all."""

    mode: SharingMode = SharingMode.EXCLUSIVE  # exclusive, time-slicing or mps
    replicas: int = 1  # devices advertised per physical device (time-slicing and MPS)
    rename_shared: bool = False  # advertise `<resource>.shared` for shared devices
    fail_requests_greater_than_one: bool = False  # reject a pod asking for >1 replica
    mps_active_thread_percentage: int | None = None  # per replica; default 100 / replicas
    mps_pinned_memory_limit_mib: int | None = None  # per replica; default memory / replicas
    replica_placement: ReplicaPlacement = ReplicaPlacement.SPREAD  # for multi-replica requests

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {self.replicas}")
        if self.mode is SharingMode.EXCLUSIVE and self.replicas != 1:
            raise ValueError("replicas > 1 needs mode time-slicing or mps")
        pct = self.mps_active_thread_percentage
        if pct is not None and not 1 <= pct <= 100:
            raise ValueError(f"mps_active_thread_percentage must be 1..100, got {pct}")


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """What one pool wants."""

    mig_layout: str | None = None  # a config name in the MIG layout file; None leaves MIG alone
    sharing: Sharing = field(default_factory=Sharing)  # default for every GPU
    gpu_sharing: dict[str, Sharing] = field(
        default_factory=dict, metadata={"placeholder": "gpu"}
    )  # per-GPU overrides, keyed by GPU index ("3") or UUID
    expected_driver_version: str | None = None  # drift is flagged when the node differs
    request_sizes: tuple[str, ...] = ()  # MIG profiles / "gpu" sizes the pool's jobs ask for
    mig_partial_apply: bool = False  # apply the layout to the other GPUs while a busy one waits

    def sharing_for(self, index: int, uuid: str) -> Sharing:
        """The sharing settings of one GPU: per-GPU override by UUID or index, else default."""
        return self.gpu_sharing.get(uuid) or self.gpu_sharing.get(str(index)) or self.sharing
