"""How the GPU pods of the period ended: the service's drains from its node Events, and each
failed pod's category and cause."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from nodeagent_tiering.cluster import units
from nodeagent_tiering.cluster.view import PodInfo
from nodeagent_tiering.review.tiers import TIER_IN_MESSAGE, cause_key

# How long before a node's drain a pod's failure still counts as the GPU fault's (the health
# model turns a node unstable within seconds of a fatal XID; the drain then waits for the
# disruption budget and the cool-down, 10 minutes by default).
GPU_FAULT_WINDOW_S = 3600.0


def drain_starts(
    events: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, list[tuple[float, str]]], dict[str, int]]:
    """Per node, the service's drain starts ``(time, cause)``; per tier (the one the node
    left, from the drain's start), pods the drains evicted (from ``DrainSucceeded``)."""
    starts: dict[str, list[tuple[float, str, str]]] = defaultdict(list)
    done: list[tuple[str, float, int]] = []
    for ev in events:
        reason = ev.get("reason")
        obj = ev.get("involvedObject") or {}
        if obj.get("kind") != "Node" or reason not in ("DrainStarted", "DrainSucceeded"):
            continue
        node = str(obj.get("name"))
        when = units.parse_time(
            ev.get("lastTimestamp") or ev.get("firstTimestamp") or ev.get("eventTime")
        )
        if when is None:
            continue
        message = str(ev.get("message") or "")
        if reason == "DrainStarted":
            match = TIER_IN_MESSAGE.search(message)
            starts[node].append((when, cause_key(message), match.group(1) if match else "(none)"))
        else:
            evictions = message.split("drained: ", 1)[-1].split(" ", 1)[0]
            if evictions.isdigit():
                done.append((node, when, int(evictions)))
    for items in starts.values():
        items.sort()
    evicted: dict[str, int] = defaultdict(int)
    for node, when, count in done:
        before = [tier for t, _, tier in starts.get(node, []) if t <= when]
        evicted[before[-1] if before else "(none)"] += count
    return {n: [(t, c) for t, c, _ in items] for n, items in starts.items()}, dict(evicted)


def classify(
    pod: PodInfo, end: float, drains: Mapping[str, list[tuple[float, str]]]
) -> tuple[str, str]:
    """``(category, cause)`` of a Failed pod: infra | preempted | application | other."""
    node_drains = drains.get(pod.node_name or "", [])
    if pod.disruption is not None:
        reason = pod.disruption
        if reason == "EvictionByEvictionAPI":
            started = [cause for t, cause in node_drains if t <= end]
            if started:
                return "infra", f"{started[-1]} (drain)"
            return "other", "evicted"
        if reason == "DeletionByTaintManager":
            return "infra", "NoExecute taint"
        if reason in ("PreemptionByScheduler", "PreemptionByKubeScheduler"):
            return "preempted", "scheduler"
        return "other", reason or "disrupted"
    if pod.reason == "Evicted":
        return "other", "node pressure"
    after = [cause for t, cause in node_drains if end <= t <= end + GPU_FAULT_WINDOW_S]
    if after:
        return "infra", f"{after[0]} (GPU fault)"
    return "application", "exit"
