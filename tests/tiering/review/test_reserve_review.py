"""The review's account of the capacity reserved for large jobs, from Kueue's Workloads."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from nodeagent_tiering.quota.policy import flavors_of
from nodeagent_tiering.review.inputs import ReviewInputs
from nodeagent_tiering.review.reserve import reserve_section
from tests.tiering.quota.conftest import quota_policy
from tests.tiering.quota.test_reserve import policy

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp()
HOUR = 3600.0
GPU = "nvidia.com/gpu"


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def workload(
    name: str,
    queue: str,
    *,
    queued: float,
    reserved: float | None = None,
    finished: float | None = None,
    cluster_queue: str = "",
    flavor: str = "",
    message: str = "",
) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = []
    status: dict[str, Any] = {"conditions": conditions}
    if reserved is None:
        conditions.append(
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message,
             "lastTransitionTime": stamp(queued)}
        )  # fmt: skip
    else:
        conditions.append(
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
             "lastTransitionTime": stamp(reserved)}
        )  # fmt: skip
        status["admission"] = {
            "clusterQueue": cluster_queue,
            "podSetAssignments": [
                {"name": "main", "count": 1, "flavors": {GPU: flavor}, "resourceUsage": {GPU: "8"}}
            ],
        }
    if finished is not None:
        conditions.append(
            {"type": "Finished", "status": "True", "lastTransitionTime": stamp(finished)}
        )
    namespace = "research" if queue == "training-large" else "vision"
    return {
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": stamp(queued)},
        "spec": {"queueName": queue},
        "status": status,
    }


def test_reserved_large_lent_and_idle_hours_the_large_jobs_waits_and_who_still_waits() -> None:
    quota = quota_policy(policy(nodes=1))
    large, team = "training-reserved", "vision-training"
    workloads = [
        workload("l1", "training-large", queued=NOW - 5 * HOUR, reserved=NOW - 5 * HOUR + 60,
                 finished=NOW - 3 * HOUR, cluster_queue=large, flavor="training-reserved"),
        workload("l2", "training-large", queued=NOW - 4 * HOUR, reserved=NOW - 4 * HOUR + 300,
                 cluster_queue=large, flavor="training-reserved"),
        workload("l3", "training-large", queued=NOW - HOUR,
                 message="couldn't assign flavors to pod set main: insufficient unused quota"),
        # A borrower on the reserved nodes for two hours, and one on the team's own flavor.
        workload("b1", "training", queued=NOW - 8 * HOUR, reserved=NOW - 8 * HOUR,
                 finished=NOW - 6 * HOUR, cluster_queue=team, flavor="training-reserved"),
        workload("own", "training", queued=NOW - 8 * HOUR, reserved=NOW - 8 * HOUR,
                 cluster_queue=team, flavor="training"),
    ]  # fmt: skip
    created = {"metadata": {"name": large, "creationTimestamp": stamp(NOW - 30 * HOUR)}}
    local_queues = [
        {"metadata": {"name": "training-large", "namespace": "research"},
         "spec": {"clusterQueue": large}},
        {"metadata": {"name": "training", "namespace": "vision"}, "spec": {"clusterQueue": team}},
    ]  # fmt: skip
    inputs = ReviewInputs(
        now_s=NOW,
        period_s=10 * HOUR,
        nodes=[],
        workloads=workloads,
        cluster_queues=[created],
        local_queues=local_queues,
    )
    section = reserve_section(inputs, quota, flavors_of(quota))
    assert section is not None
    entry = section.to_json()["training"]
    assert entry == {
        "reserved_gpu_hours": 80.0,  # one 8-GPU node over the 10-hour period
        "large_gpu_hours": round(8 * (2 * HOUR - 60 + 4 * HOUR - 300) / HOUR, 2),
        "lent_gpu_hours": 16.0,
        "idle_gpu_hours": round(80 - 8 * (6 * HOUR - 360) / HOUR - 16, 2),
        "large_jobs_admitted": 2,
        "wait_p50_s": 60.0,
        "wait_p99_s": 300.0,
        "waiting": [
            {
                "workload": "research/l3",
                "waiting_s": HOUR,
                "message": "couldn't assign flavors to pod set main: insufficient unused quota",
            }
        ],
    }
    summary, waiting = section.tables()
    assert summary.rows == [["training", "80", "47.2", "16", "16.8", "2", "60 / 300 s", "1"]]
    assert waiting.rows[0][:3] == ["training", "research/l3", "3600 s"]


def test_no_reserve_no_section() -> None:
    quota = quota_policy({**policy(), "tiers": {}})
    inputs = ReviewInputs(now_s=NOW, period_s=HOUR, nodes=[])
    assert reserve_section(inputs, quota, flavors_of(quota)) is None
    assert reserve_section(inputs, None, []) is None
