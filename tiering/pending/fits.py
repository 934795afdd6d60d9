"""Whether a request fits a node as it is, and how requests are named."""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent_tiering.cluster.nodes import GPU_RESOURCE, Kind, resource_kind
from nodeagent_tiering.pending.capacity import NodeState
from nodeagent_tiering.pending.results import Topology


def fits(node: NodeState, request: Mapping[str, int], topology: Topology) -> bool:
    """Whether the request fits the node now (the scheduler's arithmetic, plus topology)."""
    for resource, units in request.items():
        if node.free.get(resource, 0) < units:
            return False
        if resource == GPU_RESOURCE and topology is not Topology.ANY:
            groups = node.groups.get(topology)
            if groups is None or (groups[0] if groups else 0) < units:
                return False
    return True


def size_text(n: int, resource: str) -> str:
    return f"{n} {resource}"


def request_text(request: Mapping[str, int]) -> str:
    return ", ".join(size_text(n, r) for r, n in sorted(request.items()))


def primary_request(request: Mapping[str, int]) -> tuple[str, int]:
    """The resource the diagnosis is about: MIG before whole GPUs before shared replicas."""
    order = {Kind.MIG: 0, Kind.GPU: 1, Kind.SHARED: 2}

    def rank(item: tuple[str, int]) -> tuple[int, str]:
        kind = resource_kind(item[0])
        return (order[kind[0]] if kind else 3, item[0])

    return min(request.items(), key=rank)
