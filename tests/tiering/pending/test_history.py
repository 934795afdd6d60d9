"""The rolling history the leader keeps of pending GPU workloads."""

from __future__ import annotations

from datetime import UTC, datetime

from nodeagent_tiering.cluster.view import NO_QUEUE, view_from_objects
from nodeagent_tiering.pending.history import (
    KEEP_DAYS,
    MAX_STEP_S,
    Day,
    History,
    day_of,
)
from tests.tiering.pending.builders import NOON, diagnose, fragmented

GPU = "nvidia.com/gpu"


def test_a_pass_counts_for_the_time_since_the_last_one_capped() -> None:
    view = fragmented().view()
    result = diagnose(view)
    history = History()
    history.observe(view, result, NOON)
    history.observe(view, result, NOON + 60)
    history.observe(view, result, NOON + 60 + 3600)  # the service was down for an hour
    (day,) = history.days.values()
    assert day.observed_s == 60 + MAX_STEP_S
    assert day.pending == {"contiguity-gpus": 60 + MAX_STEP_S}
    assert day.peak == {"contiguity-gpus": 1}
    assert day.blocked == {
        "ns": {"research": 8 * (60 + MAX_STEP_S)},
        "size": {f"8 {GPU}": 8 * (60 + MAX_STEP_S)},
    }
    # 5 free GPUs per node, smallest blocked request 8: all 10 stranded, beside the 3-GPU pods.
    assert day.stranded_gpus["ns"] == {"busy": 10 * (60 + MAX_STEP_S)}
    assert day.stranded_gpus["size"] == {f"3 {GPU}": 10 * (60 + MAX_STEP_S)}
    assert day.free_blocks == {"training": {"5": 10 * (60 + MAX_STEP_S)}}
    # The 3-GPU pods belong to no queue: what they strand and block is said as such.
    assert day.queues == {
        "stranded": {NO_QUEUE: 10 * (60 + MAX_STEP_S)},
        "blocking": {NO_QUEUE: 8 * (60 + MAX_STEP_S)},
    }


def test_days_roll_over_and_only_the_last_ones_are_kept() -> None:
    view = fragmented().view()
    result = diagnose(view)
    history = History()
    for day in range(KEEP_DAYS + 5):
        history.observe(view, result, NOON + day * 86400)
    assert len(history.days) == KEEP_DAYS
    assert min(history.days) == datetime.fromtimestamp(NOON + 5 * 86400, UTC).strftime("%Y-%m-%d")
    again = History.from_text(history.to_text())
    assert sorted(again.days) == sorted(history.days)
    assert len(history.to_text()) < 256 * 1024


def test_stranding_and_blocking_are_traced_to_the_queues_of_the_pods_that_make_them() -> None:
    # Node a's 3-GPU pod came through LocalQueue busy/small (ClusterQueue "small-jobs"), node
    # b's is the pod of a Job whose Workload was admitted to "odd-sizes". The pending 8-GPU pod
    # is unblocked by moving node a's pod: that queue is in its way.
    cluster = fragmented()
    run_a, run_b = (p for p in cluster.pods if p["metadata"]["namespace"] == "busy")
    run_a["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "small"}
    run_b["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "odd", "uid": "job-odd"}
    ]
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "job-odd-1a2b3",
            "namespace": "busy",
            "uid": "wl-odd",
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "odd", "uid": "job-odd"}
            ],
        },
        "spec": {"queueName": "elsewhere", "podSets": []},
        "status": {"admission": {"clusterQueue": "odd-sizes", "podSetAssignments": []}},
    }
    local_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "small", "namespace": "busy"},
        "spec": {"clusterQueue": "small-jobs"},
    }
    view = view_from_objects(cluster.nodes, cluster.pods, [workload], local_queues=[local_queue])
    result = diagnose(view)
    (blocked,) = result.diagnoses
    assert blocked.unblock is not None
    assert blocked.unblock.pods == (f"busy/{run_a['metadata']['name']}",)
    history = History()
    history.observe(view, result, NOON)
    history.observe(view, result, NOON + 60)
    (day,) = history.days.values()
    assert day.queues == {
        "stranded": {"small-jobs": 5 * 60, "odd-sizes": 5 * 60},
        "blocking": {"small-jobs": 8 * 60},
    }
    assert day.queue_sizes == {
        "small-jobs": {f"3 {GPU}": 13 * 60},
        "odd-sizes": {f"3 {GPU}": 5 * 60},
    }
    again = History.from_text(history.to_text()).days[day_of(NOON)]
    assert again.queues == day.queues
    assert again.queue_sizes == day.queue_sizes


def test_a_day_written_before_queues_were_traced_reads_as_none() -> None:
    day = Day.from_data({"observed_s": 60, "pending": {"contiguity-gpus": 60}})
    assert day.queues == {"stranded": {}, "blocking": {}}
    assert day.queue_sizes == {}
