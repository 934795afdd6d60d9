"""The service's view of a node: labels, cordon, taints, the agents' health, our drain record.

The drain record lives in a node annotation so that a new leader picks up where the old one
stopped; nothing about a drain is kept only in memory except PDB backoff timers.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from nodeagent import labels as lbl
from nodeagent.published import PublishedError, decode
from nodeagent_tiering.cluster import units
from nodeagent_tiering.cluster.tier_policy import Stability

DRAIN_ANNOTATION = lbl.DRAIN_ANNOTATION
CONDITION = lbl.GPU_HEALTHY_CONDITION


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
class NodeView:
    """One node as the service needs it, parsed once from the API object."""

    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    unschedulable: bool
    taints: tuple[dict[str, Any], ...]
    condition_status: str | None  # GPUHealthy status: "True" | "False" | "Unknown" | None
    condition_reason: str
    condition_message: str
    resource_version: str
    drain: DrainRecord | None = field(default=None)
    # The object's status as the API server returned it (not copied: the reconcile pass parses
    # every node, so what only the quota readers need is read from it on demand).
    status: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> NodeView:
        """Parse a Node object (a dict as the API server returns it)."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status: str | None = None
        reason = message = ""
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") == CONDITION:
                status = cond.get("status")
                reason = cond.get("reason") or ""
                message = cond.get("message") or ""
        annotations = dict(meta.get("annotations") or {})
        record = None
        if DRAIN_ANNOTATION in annotations:
            record = DrainRecord.from_json(annotations[DRAIN_ANNOTATION])
        return cls(
            name=meta["name"],
            labels=dict(meta.get("labels") or {}),
            annotations=annotations,
            unschedulable=bool(spec.get("unschedulable")),
            taints=tuple(spec.get("taints") or ()),
            condition_status=status,
            condition_reason=reason,
            condition_message=message,
            resource_version=str(meta.get("resourceVersion", "")),
            drain=record,
            status=obj.get("status") or {},
        )

    @property
    def not_ready(self) -> bool:
        """The kubelet's Ready condition is there and not True."""
        return any(
            c.get("type") == "Ready" and c.get("status") != "True"
            for c in self.status.get("conditions") or ()
        )

    def amounts(self, names: re.Pattern[str]) -> dict[str, float]:
        """The allocatable resources whose names match, as numbers (a value the API server
        would refuse is left out)."""
        out: dict[str, float] = {}
        for name, value in (self.status.get("allocatable") or {}).items():
            if names.match(name):
                try:
                    out[name] = units.amount(value)
                except ValueError:
                    continue
        return out

    @property
    def stability(self) -> Stability:
        """The agents' verdict: ``GPUHealthy=False`` or the stability label ``unstable`` wins."""
        if self.condition_status == "False":
            return Stability.UNSTABLE
        label = self.labels.get(lbl.STABILITY)
        if label == Stability.UNSTABLE.value:
            return Stability.UNSTABLE
        if label == Stability.DEGRADED.value:
            return Stability.DEGRADED
        return Stability.STABLE

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
            try:
                return len(decode(self.annotations.get(lbl.GPU_STATE_ANNOTATION, "")).gpus)
            except PublishedError:
                return 0
        try:
            return int(self.labels.get(lbl.GPU_COUNT, "0"))
        except ValueError:
            return 0
