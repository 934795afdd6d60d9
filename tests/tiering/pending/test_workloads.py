"""Workloads waiting in Kueue before any pod exists: named by their job, with the queue arithmetic.

The objects are the API's shapes as Kueue writes them; the control-plane test runs the same
path against the real Kueue.
"""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.agent.mig_planning import plan_for_diagnosis
from nodeagent_tiering.cluster.view import ClusterView, view_from_objects
from nodeagent_tiering.pending.diagnosis import Diagnoser, diagnose_some
from nodeagent_tiering.pending.results import Reason, Settings

GPU = "nvidia.com/gpu"


def workload(
    name: str,
    *,
    pods: int = 1,
    gpus_each: int = 8,
    queue: str = "q",
    reserved: str = "False",
    message: str = "couldn't assign flavors to pod set main: insufficient unused quota",
    active: bool = True,
    job_uid: str = "",
) -> dict[str, Any]:
    container = {"name": "c", "resources": {"requests": {GPU: str(gpus_each)}}}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": f"job-{name}-0a1b2",
            "namespace": "team-a",
            "uid": f"wl-{name}",
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": name,
                 "uid": job_uid or f"job-{name}"}
            ],
        },
        "spec": {
            "active": active,
            "queueName": queue,
            "podSets": [
                {"name": "main", "count": pods, "template": {"spec": {"containers": [container]}}}
            ],
        },
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": reserved, "reason": "Pending",
                 "message": message, "lastTransitionTime": "2026-12-05T10:00:00Z"}
            ]
        },
    }  # fmt: skip


def cluster_queue(
    name: str, gpus: int, used: int, *, cohort: str = "pool", **limits: int
) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {"cohortName": cohort, "resourceGroups": [{
            "coveredResources": [GPU],
            "flavors": [{"name": "h100", "resources": [
                {"name": GPU, "nominalQuota": gpus, **limits}]}]}]},
        "status": {"flavorsUsage": [
            {"name": "h100", "resources": [{"name": GPU, "total": str(used), "borrowed": 0}]}]},
    }  # fmt: skip


def local_queue(name: str = "q", cq: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"clusterQueue": cq},
    }


def view(
    workloads: list[dict[str, Any]],
    queues: list[dict[str, Any]] | None = None,
    pods: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> ClusterView:
    queues = (
        [cluster_queue("team-a", 16, 12), cluster_queue("team-b", 16, 4, lendingLimit=3)]
        if queues is None
        else queues
    )
    return view_from_objects(
        [], list(pods), workloads, local_queues=[local_queue()], cluster_queues=queues
    )


def run(v: ClusterView) -> list[Any]:
    return list(Diagnoser(v, Settings(), plan_for_diagnosis).run().diagnoses)


def test_a_job_over_quota_is_named_with_its_queue_and_cohort_shortfall() -> None:
    # 16 guaranteed, 12 used: 4 of its own; team-b has 12 unused but lends at most 3: 7 in all.
    (d,) = run(view([workload("train", pods=2, gpus_each=8)]))
    assert (d.kind, d.api_version, d.pod, d.uid) == ("Job", "batch/v1", "team-a/train", "job-train")
    assert d.workload == "job-train-0a1b2"
    assert d.reason is Reason.QUOTA
    assert d.request == {GPU: 16}
    assert d.evidence.startswith("Job team-a/train waits in Kueue for quota (16 nvidia.com/gpu")
    assert "QuotaReserved=False (Pending: couldn't assign flavors" in d.evidence
    assert (
        "ClusterQueue team-a (cohort pool): nvidia.com/gpu in flavor h100: 16 guaranteed, "
        "12 in use, the cohort could lend 3: short 9 of the 16 asked"
    ) in d.evidence


def test_the_borrowing_limit_caps_what_the_cohort_could_lend() -> None:
    queues = [
        cluster_queue("team-a", 16, 12, borrowingLimit=1),
        cluster_queue("team-b", 16, 0),
    ]
    (d,) = run(view([workload("train", gpus_each=8)], queues))
    assert "the cohort could lend 16, it may borrow 1 more: short 3 of the 8 asked" in d.evidence


def test_a_job_larger_than_the_queue_can_ever_hold_is_told_so() -> None:
    # 16 of its own, 3 the cohort ever lends (team-b's lendingLimit): 19, whatever runs.
    (d,) = run(view([workload("train", pods=4, gpus_each=8)]))
    assert "the 32 asked are more than it can ever admit (19 with the whole cohort idle)" in (
        d.evidence
    )


def test_numbers_with_room_say_so_rather_than_invent_a_shortfall() -> None:
    # Kueue has not got to it yet, or waits for something else (an admission check...).
    (d,) = run(view([workload("train", gpus_each=2, message="")]))
    assert d.reason is Reason.QUOTA
    assert "room for the 2 asked by these numbers" in d.evidence


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"active": False}, "is deactivated (Workload team-a/job-train-0a1b2 spec.active=false)"),
        ({"queue": ""}, "names no LocalQueue, so no ClusterQueue admits it"),
        ({"queue": "absent"}, "LocalQueue team-a/absent does not exist"),
    ],
)
def test_a_workload_kueue_will_never_admit_says_why(changes: dict[str, Any], says: str) -> None:
    (d,) = run(view([workload("train", **changes)]))
    assert says in d.evidence, d.evidence
    assert d.reason is Reason.OTHER  # no quota freed anywhere would admit it


def test_a_missing_cluster_queue_is_named() -> None:
    (d,) = run(view([workload("train")], queues=[cluster_queue("other", 8, 0)]))
    assert "ClusterQueue team-a (of LocalQueue q) does not exist" in d.evidence
    assert d.reason is Reason.OTHER


def test_admitted_finished_and_pod_backed_workloads_are_not_diagnosed_as_jobs() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-abcde",
            "namespace": "team-a",
            "uid": "pod-1",
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "withpods",
                                 "uid": "job-withpods"}],
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": {GPU: "8"}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    found = run(
        view(
            [
                workload("admitted", reserved="True"),
                workload("withpods"),
                workload("waiting"),
            ],
            pods=[pod],
        )
    )
    assert [d.pod for d in found] == ["team-a/waiting"]


def test_one_job_is_found_by_its_name_or_its_workloads() -> None:
    v = view([workload("a"), workload("b")])
    for name in ("b", "job-b-0a1b2"):
        chosen = diagnose_some(v, plan_for_diagnosis, Settings(), namespace="team-a", pod=name)
        assert [d.pod for d in chosen.diagnoses] == ["team-a/b"]
    elsewhere = diagnose_some(v, plan_for_diagnosis, Settings(), namespace="team-b")
    assert elsewhere.diagnoses == ()


def test_without_kueue_nothing_is_diagnosed_as_a_job() -> None:
    assert run(view_from_objects([], [], None)) == []
