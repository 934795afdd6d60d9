"""What the pending diagnosis says: the reasons, the settings it runs with, and its results."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent import labels as lbl
from nodeagent.gpu.types import MigSlot
from nodeagent_tiering.cluster.tier_policy import TierPolicy
from nodeagent_tiering.cluster.view import (
    UNSCHEDULABLE_TAINT,
)

# Taints that take a node out of service rather than out of a tier: the tiering service's
# quarantine, the agent's unstable taint, and what the node lifecycle controller sets.
SERVICE_TAINTS = frozenset(
    {
        lbl.QUARANTINE_TAINT,
        lbl.UNSTABLE_TAINT,
        UNSCHEDULABLE_TAINT,
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/out-of-service",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/network-unavailable",
    }
)
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


class Reason(enum.StrEnum):
    """The primary reason a GPU workload is pending."""

    CAPACITY = "capacity"
    CONTIGUITY_GPUS = "contiguity-gpus"
    CONTIGUITY_MIG = "contiguity-mig"
    TIER = "tier"
    QUOTA = "quota"
    OTHER = "other"


# The Event reason recorded on a diagnosed pod, per diagnosis reason.
EVENT_REASONS: Mapping[Reason, str] = {
    Reason.CAPACITY: "GPUCapacity",
    Reason.CONTIGUITY_GPUS: "GPUFragmentation",
    Reason.CONTIGUITY_MIG: "GPUFragmentation",
    Reason.TIER: "GPUTier",
    Reason.QUOTA: "GPUQuota",
    Reason.OTHER: "GPUPendingOther",
}
CONTIGUITY = frozenset({Reason.CONTIGUITY_GPUS, Reason.CONTIGUITY_MIG})


class Topology(enum.StrEnum):
    """What a workload asks of the GPUs it gets besides their number."""

    ANY = "any"
    NVLINK = "nvlink"  # one NVLink-connected set
    NUMA = "numa"  # one NUMA node


@dataclass(frozen=True, slots=True)
class Settings:
    """How the pass reads the cluster (from the tier policy, see :func:`settings_for`)."""

    topology_key: str = lbl.GPU_TOPOLOGY  # pod label or annotation: nvlink | numa
    service_taints: frozenset[str] = SERVICE_TAINTS
    # Count pending pods the scheduler has not judged yet (``simulate``: there is none).
    assume_unschedulable: bool = False


def settings_for(policy: TierPolicy | None, *, assume_unschedulable: bool = False) -> Settings:
    """The settings a tier policy implies (its drain taint and ``pending.topology_key``)."""
    if policy is None:
        return Settings(assume_unschedulable=assume_unschedulable)
    return Settings(
        topology_key=policy.pending.topology_key,
        service_taints=SERVICE_TAINTS | {policy.drain.taint_key},
        assume_unschedulable=assume_unschedulable,
    )


# --- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuChange:
    """One GPU's MIG layout change: idle instances destroyed, instances created."""

    gpu: int
    destroy: tuple[MigSlot, ...]
    create: tuple[MigSlot, ...]
    layout: tuple[MigSlot, ...]  # the GPU's instances afterwards

    def to_json(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "gpu": self.gpu,
            "destroy": [s.to_json() for s in self.destroy],
            "create": [s.to_json() for s in self.create],
            "layout": [s.to_json() for s in self.layout],
        }


@dataclass(frozen=True, slots=True)
class Unblock:
    """The smallest change that would let the pod be scheduled (a suggestion, never applied).

    ``kind``: ``move-pods`` (the pods named would have to move off ``node``), ``mig-layout``
    (``changes`` on ``node``'s GPUs), ``heal-node`` (``node`` is out of service) or
    ``admit-tier`` (``node`` would hold it, but the pod's constraints exclude it).
    """

    kind: str
    node: str
    text: str
    pods: tuple[str, ...] = ()
    changes: tuple[GpuChange, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Plain data."""
        out: dict[str, Any] = {"kind": self.kind, "node": self.node, "text": self.text}
        if self.kind == "move-pods":
            out["pods"] = list(self.pods)
        if self.kind == "mig-layout":
            out["changes"] = [c.to_json() for c in self.changes]
        return out


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why one pod is pending."""

    namespace: str
    name: str
    uid: str
    request: Mapping[str, int]
    reason: Reason
    evidence: str
    unblock: Unblock | None = None
    tier: str = "any"  # the tier the pod asks for (metrics), "any" when not one
    message: str = ""  # the scheduler's own message (PodScheduled condition)
    # What is diagnosed: a pod, or (waiting in Kueue with no pod yet) the job that owns a
    # Workload, which Events then name; ``workload`` is that Workload's name.
    kind: str = "Pod"
    api_version: str = "v1"
    workload: str = ""

    @property
    def pod(self) -> str:
        """``namespace/name`` (of the pod, or of the job for a Workload without pods)."""
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        """One entry of the ``pending`` list (``unblock`` is ``{}`` when there is none)."""
        return {
            "pod": self.pod,
            "request": dict(self.request),
            "reason": self.reason.value,
            "evidence": self.evidence,
            "unblock": self.unblock.to_json() if self.unblock is not None else {},
            "tier": self.tier,
            "scheduler": self.message,
            "kind": self.kind,
            "workload": self.workload,
        }


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Free-but-unusable capacity of the last pass, per tier (in-service nodes only)."""

    free_gpus: Mapping[str, int] = field(default_factory=dict)
    largest_nvlink_block: Mapping[str, int] = field(default_factory=dict)
    # Free whole GPUs the smallest blocked request that may use the tier cannot use.
    unusable_gpus: Mapping[str, int] = field(default_factory=dict)
    # (tier, profile) -> free memory slices no free legal placement of the profile covers.
    unusable_mig_slices: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # tier -> {k: free GPUs on nodes with exactly k free}: the shape of the free capacity.
    free_blocks: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    # (tier, profile) -> free memory slices that new instances of the profile could take.
    mig_fit_slices: Mapping[tuple[str, str], int] = field(default_factory=dict)
    mig_free_slices: Mapping[str, int] = field(default_factory=dict)  # tier -> slices no one has
    # node -> (free GPUs, free MIG slices) that no blocked request can use (for attribution).
    stranded_by_node: Mapping[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PassResult:
    """One pass: a diagnosis per pending GPU pod, and the pool's unusable capacity."""

    diagnoses: tuple[Diagnosis, ...]
    stats: PoolStats

    def to_json(self) -> dict[str, Any]:
        """``{"pending": [...]}``, sorted by pod."""
        return {"pending": [d.to_json() for d in self.diagnoses]}
