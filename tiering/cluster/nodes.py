"""The one parsed Node of the pool half: labels, cordon, taints, conditions, GPU resources,
what the agent published, the stability verdict and the service's drain record.

Every area (drain, pending, quota, review) reads nodes through :class:`Node`; no other module
looks into a Node object. The drain record lives in a node annotation so that a new leader picks
up where the old one stopped; nothing about a drain is kept only in memory except PDB backoff
timers.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from nodeagent import labels as lbl
from nodeagent.published import PublishedError, PublishedGpu, PublishedNode, decode
from nodeagent_tiering.cluster import units
from nodeagent_tiering.cluster.tier_policy import GpuRemediationPolicy, Stability, TierPolicy

DRAIN_ANNOTATION = lbl.DRAIN_ANNOTATION
CONDITION = lbl.GPU_HEALTHY_CONDITION
FAULTY = frozenset({"unhealthy", "lost"})  # published GPU health that takes a GPU out
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_SUFFIX = ".shared"
MIG_PREFIX = "nvidia.com/mig-"
_MIG_NAME = re.compile(r"^(\d+g\.\d+gb)(?:\.(.+))?$")


# The GPU resources Kueue quota counts: nvidia.com/gpu, its time-slicing ".shared" rename, and
# the device plugin's MIG resources in the mixed strategy: nvidia.com/mig-<slices>g.<memory>gb,
# with +me (media extensions) or a compute-instance prefix (1c.3g.40gb), as NVIDIA's plugin
# names them.
QUOTA_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-(\d+c\.)?\d+g\.\d+gb(\+me)?)(\.shared)?$")


class Kind(enum.StrEnum):
    """What a GPU resource name counts."""

    GPU = "gpu"  # whole GPUs (nvidia.com/gpu)
    MIG = "mig"  # MIG instances of one profile (nvidia.com/mig-<profile>)
    SHARED = "shared"  # replicas of a shared GPU or MIG device (<name>.shared)


def resource_kind(name: str) -> tuple[Kind, str | None] | None:
    """The kind of a GPU resource and its MIG profile; ``None`` for anything else.

    ``nvidia.com/mig-1g.10gb.me`` is profile ``1g.10gb+me`` (the device plugin writes ``+`` as
    ``.``, as NVIDIA's plugin does).
    """
    if name.endswith(SHARED_SUFFIX):
        base = name.removesuffix(SHARED_SUFFIX)
        return (Kind.SHARED, None) if resource_kind(base) is not None else None
    if name == GPU_RESOURCE:
        return Kind.GPU, None
    if name.startswith(MIG_PREFIX):
        match = _MIG_NAME.match(name.removeprefix(MIG_PREFIX))
        if match is None:
            return None
        profile = match.group(1) + (f"+{match.group(2)}" if match.group(2) else "")
        return Kind.MIG, profile
    return None


class Phase(enum.StrEnum):
    """Where a node is in its trip out of service and back."""

    DRAINING = "draining"  # cordoned and tainted, evictions in progress
    DRAINED = "drained"  # nothing evictable left
    FAILED = "failed"  # the drain timed out with pods left; stays quarantined


@dataclass(frozen=True, slots=True)
class DrainRecord:
    """Progress of one drain, stored as JSON in the ``nodeagent.io/drain`` annotation."""

    phase: Phase
    tier: str  # the tier the node was in when the drain started (budget accounting)
    cause: str
    started_s: float
    updated_s: float
    evicted: int = 0
    blocked: int = 0  # eviction refusals (PDB 429) so far
    remaining: int = 0  # evictable pods still on the node at the last step
    stable_since_s: float | None = None  # when the agents last turned the node non-unstable

    def to_json(self) -> str:
        """The annotation value."""
        data = {
            "phase": self.phase.value,
            "tier": self.tier,
            "cause": self.cause,
            "started": self.started_s,
            "updated": self.updated_s,
            "evicted": self.evicted,
            "blocked": self.blocked,
            "remaining": self.remaining,
            "stableSince": self.stable_since_s,
        }
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DrainRecord | None:
        """Parse the annotation; ``None`` when it is not ours or not readable."""
        try:
            data = json.loads(text)
            return cls(
                phase=Phase(data["phase"]),
                tier=str(data["tier"]),
                cause=str(data.get("cause", "")),
                started_s=float(data["started"]),
                updated_s=float(data.get("updated", data["started"])),
                evicted=int(data.get("evicted", 0)),
                blocked=int(data.get("blocked", 0)),
                remaining=int(data.get("remaining", 0)),
                stable_since_s=(
                    float(data["stableSince"]) if data.get("stableSince") is not None else None
                ),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def with_(self, **changes: Any) -> DrainRecord:
        """A copy with fields changed."""
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"
    # Kept only to write the taint back unchanged (the node lifecycle controller sets it on
    # NoExecute taints); no decision reads it, so it takes no part in equality.
    time_added: str | None = field(default=None, compare=False)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Taint:
        """Parse one entry of a Node's ``spec.taints``."""
        added = obj.get("timeAdded")
        return cls(
            str(obj.get("key", "")),
            str(obj.get("value") or ""),
            str(obj.get("effect", "")),
            str(added) if added else None,
        )

    def to_object(self) -> dict[str, Any]:
        """The entry as the API server takes it (for a patch that rewrites the list)."""
        out: dict[str, Any] = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        if self.time_added is not None:
            out["timeAdded"] = self.time_added
        return out


@dataclass(frozen=True, slots=True)
class Node:
    """One node as every area of the service needs it, parsed once from the API object."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    condition_status: str | None = None  # GPUHealthy: "True" | "False" | "Unknown" | None
    condition_reason: str = ""
    condition_message: str = ""
    resource_version: str = ""
    drain: DrainRecord | None = None
    allocatable: Mapping[str, int] = field(default_factory=dict)  # GPU resources only, counts
    published: PublishedNode | None = None  # the agent's nodeagent.io/gpu-state annotation
    published_error: str | None = None  # why that annotation could not be read
    not_ready: bool = False  # the kubelet's Ready condition is there and not True
    # The object's status as the API server returned it (not copied: the reconcile pass parses
    # every node, so what only the quota readers need is read from it on demand).
    status: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Node:
        """Parse a Node object (a dict as the API server returns it)."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        gpu_status: str | None = None
        reason = message = ""
        not_ready = False
        for cond in status.get("conditions") or ():
            kind = cond.get("type")
            if kind == CONDITION:
                gpu_status = cond.get("status")
                reason = cond.get("reason") or ""
                message = cond.get("message") or ""
            elif kind == "Ready" and cond.get("status") != "True":
                not_ready = True
        annotations = dict(meta.get("annotations") or {})
        record = None
        if DRAIN_ANNOTATION in annotations:
            record = DrainRecord.from_json(annotations[DRAIN_ANNOTATION])
        published = error = None
        text = annotations.get(lbl.GPU_STATE_ANNOTATION)
        if text is not None:
            try:
                published = decode(text)
            except PublishedError as exc:
                error = str(exc)
        return cls(
            name=str(meta.get("name", "")),
            labels=dict(meta.get("labels") or {}),
            annotations=annotations,
            unschedulable=bool(spec.get("unschedulable")),
            taints=tuple(Taint.from_object(t) for t in spec.get("taints") or ()),
            condition_status=gpu_status,
            condition_reason=reason,
            condition_message=message,
            resource_version=str(meta.get("resourceVersion", "")),
            drain=record,
            allocatable={
                k: units.count(v)
                for k, v in (status.get("allocatable") or {}).items()
                if resource_kind(k) is not None
            },
            published=published,
            published_error=error,
            not_ready=not_ready,
            status=status,
        )

    @property
    def draining(self) -> bool:
        """The tiering service's drain record is on it (readable or not)."""
        return self.drain is not None or DRAIN_ANNOTATION in self.annotations

    @property
    def tier(self) -> str:
        """The tier label the service wrote, ``none`` without one."""
        return self.labels.get(lbl.TIER) or "none"

    def amounts(
        self, names: re.Pattern[str], *, field: Literal["allocatable", "capacity"] = "allocatable"
    ) -> dict[str, float]:
        """The allocatable (or capacity) resources whose names match, as numbers (a value the
        API server would refuse is left out)."""
        out: dict[str, float] = {}
        for name, value in (self.status.get(field) or {}).items():
            if names.match(name):
                try:
                    out[name] = units.amount(value)
                except ValueError:
                    continue
        return out

    @property
    def stability(self) -> Stability:
        """The agents' verdict: ``GPUHealthy=False`` or the stability label ``unstable`` wins.

        The one definition: the drain planner, the ``nodeagent_tiering_nodes`` metric and the
        pool review all read it (through :attr:`state`).
        """
        if self.condition_status == "False":
            return Stability.UNSTABLE
        label = self.labels.get(lbl.STABILITY)
        if label == Stability.UNSTABLE.value:
            return Stability.UNSTABLE
        if label == Stability.DEGRADED.value:
            return Stability.DEGRADED
        return Stability.STABLE

    @property
    def state(self) -> str:
        """The node's state as the metric and the review count it: the drain phase while the
        service holds it out of service, else :attr:`stability`."""
        if self.drain is not None:
            return self.drain.phase.value
        return self.stability.value

    @property
    def faulty_gpus(self) -> list[PublishedGpu]:
        """The GPUs its agent published unhealthy or lost (none without a readable annotation)."""
        if self.published is None:
            return []
        return [g for g in self.published.gpus if g.health in FAULTY]

    def remediable(self, max_gpus: int) -> bool:
        """An otherwise healthy node whose faults single-GPU remediation handles: between 1 and
        ``max_gpus`` faulty GPUs, its stability label not unstable (the agent's GPUHealthy=False
        condition alone is the faulty GPU speaking), not draining or quarantined, not cordoned."""
        if self.drain is not None or self.unschedulable:
            return False
        if self.labels.get(lbl.STABILITY) == Stability.UNSTABLE.value:
            return False
        return 1 <= len(self.faulty_gpus) <= max_gpus

    def as_planned(self, remediation: GpuRemediationPolicy) -> Node:
        """The node as the service judges it: with single-GPU remediation on, a node whose only
        faults are GPUs remediated on their own is not unstable (it is not drained as well)."""
        if (
            remediation.enabled
            and self.condition_status == "False"
            and self.remediable(remediation.max_gpus)
        ):
            return replace(self, condition_status="True")
        return self

    @property
    def unstable_cause(self) -> str:
        """Why the node counts as unstable, for events and the drain record."""
        if self.condition_status == "False":
            text = f"{CONDITION}=False ({self.condition_reason})"
            return f"{text}: {self.condition_message}" if self.condition_message else text
        return f"label {lbl.STABILITY}=unstable"

    @property
    def gpus(self) -> int:
        """Physical GPUs: the capability label, or the published GPUs where it counts MIG devices.

        GFD's ``gpu.count`` counts MIG devices under the single strategy (the product label then
        ends in ``-MIG-<profile>``); the agent's published GPU state lists the GPUs themselves.
        0 when neither says.
        """
        if "-MIG-" in self.labels.get(lbl.GPU_PRODUCT, ""):
            return len(self.published.gpus) if self.published is not None else 0
        try:
            return int(self.labels.get(lbl.GPU_COUNT, "0"))
        except ValueError:
            return 0


def node_identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    """A Node object's name and ``resourceVersion``, read without parsing the rest: what a
    cache of parsed nodes keys on."""
    meta = obj.get("metadata") or {}
    return str(meta.get("name", "")), str(meta.get("resourceVersion", ""))


def node_state(node: Node, policy: TierPolicy | None) -> str:
    """The one state of a node that the ``nodeagent_tiering_nodes`` metric and the pool review
    count: ``draining``/``drained``/``failed`` while the service holds it, else its stability
    as the drain planner judges it under ``policy`` (single-GPU remediation included; without a
    policy, the agents' verdict as published)."""
    planned = node.as_planned(policy.gpu_remediation) if policy is not None else node
    return planned.state
