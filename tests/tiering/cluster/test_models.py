"""The floor's parsed models: the one Node, the Pod and Workload facts, the ClusterQueues."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent import labels as lbl
from nodeagent.published import PublishedGpu, PublishedNode, encode
from nodeagent_tiering.cluster import units
from nodeagent_tiering.cluster.nodes import Node, Taint, node_identity
from nodeagent_tiering.cluster.view import (
    cluster_queue_from_object,
    pod_from_object,
    workload_from_object,
)

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T01:00:00Z"
T2 = "2026-01-01T02:00:00Z"
EPOCH0 = 1767225600.0


def test_one_node_parse_gives_what_every_area_reads() -> None:
    gpus = (PublishedGpu(0, "NVIDIA H100 80GB HBM3", health="lost"), PublishedGpu(1, "x"))
    node = Node.from_object(
        {
            "metadata": {
                "name": "gpu-1",
                "resourceVersion": "7",
                "labels": {lbl.TIER: "training"},
                "annotations": {lbl.GPU_STATE_ANNOTATION: encode(PublishedNode(gpus))},
            },
            "spec": {
                "unschedulable": True,
                "taints": [
                    {"key": "a", "effect": "NoExecute", "timeAdded": T0},
                    {"key": "b", "value": "v", "effect": "NoSchedule"},
                ],
            },
            "status": {
                "allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "nvidia.com/mig-1g.10gb": "2k"},
                "conditions": [
                    {"type": lbl.GPU_HEALTHY_CONDITION, "status": "False", "reason": "Xid"},
                    {"type": "Ready", "status": "Unknown"},
                ],
            },
        }
    )
    assert node.taints == (Taint("a", "", "NoExecute"), Taint("b", "v", "NoSchedule"))
    # A taint written back keeps what the node lifecycle controller set on it.
    assert node.taints[0].to_object() == {"key": "a", "effect": "NoExecute", "timeAdded": T0}
    assert node.taints[1].to_object() == {"key": "b", "value": "v", "effect": "NoSchedule"}
    assert node.allocatable == {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 2000}
    assert node.unschedulable
    assert node.not_ready
    assert node.tier == "training"
    assert node.condition_status == "False"
    assert node.condition_reason == "Xid"
    assert [g.index for g in node.faulty_gpus] == [0]
    assert node.published_error is None
    assert not node.draining
    assert node_identity({"metadata": {"name": "gpu-1", "resourceVersion": "7"}}) == ("gpu-1", "7")


def test_an_unreadable_gpu_state_is_an_error_not_a_traceback() -> None:
    node = Node.from_object(
        {"metadata": {"name": "n", "annotations": {lbl.GPU_STATE_ANNOTATION: "{not json"}}}
    )
    assert node.published is None
    assert node.published_error
    assert node.faulty_gpus == []
    assert node.gpus == 0


def _workload(conditions: list[dict[str, Any]], admission: dict[str, Any] | None) -> Any:
    return workload_from_object(
        {
            "metadata": {"namespace": "team-a", "name": "w", "creationTimestamp": T0},
            "spec": {"queueName": "lq"},
            "status": {"conditions": conditions, **({"admission": admission} if admission else {})},
        }
    )


def test_a_workload_holds_its_admission_from_reservation_to_finish() -> None:
    wl = _workload(
        [
            {"type": "Requeued", "status": "True", "lastTransitionTime": T1},
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": T2},
            {"type": "Finished", "status": "True", "lastTransitionTime": T2},
            {"type": "Preempted", "status": "True", "reason": ""},
        ],
        {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {
                    "count": 4,
                    "flavors": {"nvidia.com/gpu": "h100", "cpu": "default"},
                    "resourceUsage": {"nvidia.com/gpu": "16", "cpu": "64"},
                }
            ],
        },
    )
    assert wl.created_s == EPOCH0
    assert wl.queued_s == EPOCH0 + 3600  # requeued: the wait starts again there
    assert wl.reserved_s == wl.finished_s == EPOCH0 + 7200
    assert wl.finished == "True"
    assert wl.preempted == "Preempted"
    assert wl.cluster_queue == "cq"
    assert wl.queue == "lq"
    (ps,) = wl.pod_sets
    # Quota resources only: the CPU of 100,000 workloads is not parsed.
    assert ps.count == 4
    assert ps.flavors == (("nvidia.com/gpu", "h100"),)
    assert ps.usage == {"nvidia.com/gpu": 16.0}


def test_a_pending_workload_waits_from_its_creation() -> None:
    wl = _workload([{"type": "QuotaReserved", "status": "False", "reason": "Pending"}], None)
    assert wl.queued_s == EPOCH0
    assert wl.reserved_s is None
    assert wl.pod_sets == ()
    assert wl.finished == ""
    assert wl.preempted is None


def test_a_cluster_queue_parses_quota_lending_and_usage() -> None:
    cq = cluster_queue_from_object(
        {
            "metadata": {"name": "cq", "labels": {lbl.TEAM: "a"}},
            "spec": {
                "cohortName": "pool",
                "resourceGroups": [
                    {
                        "flavors": [
                            {
                                "name": "h100",
                                "resources": [
                                    {"name": "nvidia.com/gpu", "nominalQuota": "16"},
                                    {"name": "cpu", "nominalQuota": "500m", "lendingLimit": 0},
                                ],
                            }
                        ]
                    }
                ],
            },
            "status": {
                "flavorsUsage": [
                    {
                        "name": "h100",
                        "resources": [{"name": "nvidia.com/gpu", "total": "20", "borrowed": 4}],
                    }
                ]
            },
        }
    )
    assert cq.cohort == "pool"
    assert cq.labels == {lbl.TEAM: "a"}
    assert cq.nominal == {("h100", "nvidia.com/gpu"): 16.0, ("h100", "cpu"): 0.5}
    assert cq.lending == {("h100", "cpu"): 0.0}
    assert cq.usage == (("h100", "nvidia.com/gpu", 20.0, 4.0),)


@pytest.mark.parametrize(
    ("phase", "ended"),
    [("Failed", EPOCH0 + 7200), ("Succeeded", EPOCH0 + 7200), ("Running", None)],
)
def test_a_finished_pod_ends_at_its_last_container(phase: str, ended: float | None) -> None:
    pod = pod_from_object(
        {
            "metadata": {"namespace": "a", "name": "p", "creationTimestamp": T0},
            "spec": {
                "nodeName": "gpu-1",
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}}],
            },
            "status": {
                "phase": phase,
                "reason": "Evicted",
                "startTime": T1,
                "containerStatuses": [
                    {"state": {"terminated": {"finishedAt": T1}}},
                    {"state": {"terminated": {"finishedAt": T2}}},
                ],
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                    }
                ],
            },
        }
    )
    assert pod.quota_requests == {"nvidia.com/gpu": 2.0}
    assert pod.created_s == EPOCH0
    assert pod.started_s == EPOCH0 + 3600
    assert pod.ended_s == ended
    assert pod.disruption == "EvictionByEvictionAPI"
    assert pod.reason == "Evicted"


def test_a_quantity_cache_keeps_true_apart_from_one() -> None:
    assert units.amount(1) == 1.0
    with pytest.raises(ValueError, match="not a quantity"):
        units.amount(True)
    assert units.count([1]) == 0  # not hashable, not a quantity: no traceback
