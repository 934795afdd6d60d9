"""Remediation of one GPU: evict only the pods that use it, instead of draining the node.

When an agent publishes one GPU ``unhealthy`` or ``lost`` (``nodeagent.io/gpu-state``) on a
node that is otherwise fine (not unstable, not draining, not cordoned), the pods holding that
GPU or its MIG devices (the annotation's ``ps``, from the kubelet's pod-resources API) are
evicted through the Eviction API, so PodDisruptionBudgets hold; the rest of the node keeps
serving. It is off by default (``gpu_remediation.enabled``) and shares the node drains' limits:
nothing starts while the circuit breaker is open, and GPU remediations in progress count
against ``budget.max_draining`` together with the drains.

The progress of each GPU is kept in the node annotation ``nodeagent.io/gpu-remediation`` (read
back by a new leader): ``{"<gpu index>": {"started_s", "evicted", "blocked", "remaining",
"done"}}``. The entry goes when the GPU is published healthy again, so a new fault starts anew.
Returning the GPU to service is the agent's: it advertises the GPU again only once healthy.
Which nodes qualify, and how they then count, is the floor's (``Node.remediable``,
``Node.as_planned``, ``node_state``): the metrics and the pool review read the same rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from nodeagent import labels as lbl
from nodeagent_tiering.cluster.nodes import Node


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """The remediation of one GPU, as recorded on its node."""

    started_s: float
    evicted: int = 0
    blocked: int = 0
    remaining: int = 0
    done: bool = False

    def with_(self, **changes: Any) -> GpuRecord:
        """A copy with ``changes``."""
        return replace(self, **changes)


def read_records(node: Node) -> dict[int, GpuRecord]:
    """The node's GPU remediation records by GPU index (an unreadable annotation is none)."""
    raw = node.annotations.get(lbl.GPU_REMEDIATION_ANNOTATION)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
        return {int(k): GpuRecord(**v) for k, v in data.items()}
    except (ValueError, TypeError):
        return {}


def encode_records(records: Mapping[int, GpuRecord]) -> str | None:
    """The annotation value (``None`` removes it)."""
    if not records:
        return None
    return json.dumps({str(k): asdict(v) for k, v in sorted(records.items())}, sort_keys=True)


def in_progress(nodes: list[Node]) -> int:
    """Nodes with a GPU remediation still evicting (they count against the drain budget)."""
    return sum(1 for n in nodes if any(not r.done for r in read_records(n).values()))
