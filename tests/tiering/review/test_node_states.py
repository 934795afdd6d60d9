"""The pool review and the ``nodeagent_tiering_nodes`` metric count node states alike.

Both call the floor's ``node_state``: a node labelled ``stability=degraded`` whose agent also
set ``GPUHealthy=False`` for one faulty GPU is degraded in both while single-GPU remediation
handles that GPU, and unstable in both when remediation is off. Pure: the planner, the metric
family and the review builder are the service's own, fed the same parsed nodes.
"""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent import labels as lbl
from nodeagent.published import PublishedGpu, PublishedNode, encode
from nodeagent_tiering.cluster.nodes import DRAIN_ANNOTATION, DrainRecord, Node, Phase
from nodeagent_tiering.cluster.tier_policy import parse_policy
from nodeagent_tiering.drain.metrics import DrainMetrics
from nodeagent_tiering.drain.planner import BreakerState, plan
from nodeagent_tiering.review.tiers import build_review
from tests.tiering.conftest import POLICY, gpu_labels

H100 = "NVIDIA H100 80GB HBM3"


def node(
    name: str,
    stability: str,
    *,
    gpu_healthy: bool = True,
    faulty: int = 0,
    drain: DrainRecord | None = None,
) -> Node:
    gpus = tuple(
        PublishedGpu(i, H100, health="unhealthy" if i < faulty else "healthy") for i in range(8)
    )
    annotations = {lbl.GPU_STATE_ANNOTATION: encode(PublishedNode(gpus, allocations_known=True))}
    if drain is not None:
        annotations[DRAIN_ANNOTATION] = drain.to_json()
    condition = {
        "type": lbl.GPU_HEALTHY_CONDITION,
        "status": "True" if gpu_healthy else "False",
        "reason": "GpusHealthy" if gpu_healthy else "XidCritical",
    }
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "labels": {**gpu_labels(stability=stability), lbl.TIER: "training"},
            "annotations": annotations,
            "resourceVersion": "1",
        },
        "spec": {},
        "status": {"conditions": [condition]},
    }
    return Node.from_object(obj)


def cluster() -> list[Node]:
    record = DrainRecord(Phase.DRAINING, "training", "label", 0.0, 0.0)
    return [
        # The report of issue 27: one XID 48 GPU marks each node degraded and GPUHealthy=False.
        node("xid-1", "degraded", gpu_healthy=False, faulty=1),
        node("xid-2", "degraded", gpu_healthy=False, faulty=1),
        node("slow", "degraded"),
        node("fine-1", "stable"),
        node("fine-2", "stable"),
        node("bad", "unstable", gpu_healthy=False, faulty=8),
        node("held", "unstable", drain=record),
    ]


def metric_states(nodes: list[Node], policy_data: dict[str, Any]) -> dict[str, float]:
    policy = parse_policy(policy_data)
    metrics = DrainMetrics()
    metrics.observe_plan(plan(nodes, policy, 1000.0, BreakerState(), {}, None))
    out: dict[str, float] = {}
    for family in metrics.registry.collect():
        if family.name != "nodeagent_tiering_nodes":
            continue
        for sample in family.samples:
            state = sample.labels["state"]
            out[state] = out.get(state, 0.0) + sample.value
    return out


@pytest.mark.parametrize(
    ("remediation", "degraded", "unstable"),
    [(True, 3, 1), (False, 1, 3)],
    ids=["single-gpu-remediation", "no-remediation"],
)
def test_review_counts_equal_the_metric(remediation: bool, degraded: int, unstable: int) -> None:
    data = {**POLICY, "gpu_remediation": {"enabled": remediation, "max_gpus": 1}}
    nodes = cluster()
    metric = metric_states(nodes, data)
    review = build_review(nodes, [], policy=parse_policy(data), now_s=1000.0, period_s=3600.0)

    assert sum(t.degraded for t in review.tiers) == metric["degraded"] == degraded
    assert sum(t.unstable for t in review.tiers) == metric["unstable"] == unstable
    assert sum(t.healthy for t in review.tiers) == metric["stable"] == 2
    held = metric["draining"] + metric["drained"] + metric["failed"]
    assert sum(t.quarantined for t in review.tiers) == held == 1
