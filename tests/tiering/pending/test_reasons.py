"""Every reason, the traps of the issue, and the unblocking change each case names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nodeagent_tiering.cluster.view import KUEUE_GATE
from nodeagent_tiering.pending.results import Reason, Settings
from tests.tiering.pending.builders import A30, Cluster, diagnose

GPU = "nvidia.com/gpu"
MIG_3G = "nvidia.com/mig-3g.40gb"
MIG_4G = "nvidia.com/mig-4g.40gb"
TRAINING = {"key": "pool", "value": "training", "effect": "NoSchedule"}
SHARED = {"key": "pool", "value": "shared", "effect": "NoSchedule"}


def capacity_all_used() -> Cluster:
    return Cluster().whole("a", used=[8]).whole("b", used=[6]).pending("job", {GPU: 8})


def capacity_too_big() -> Cluster:
    return Cluster().whole("a").whole("b").pending("job", {GPU: 16})


def four_plus_four() -> Cluster:
    # The trap: 8 GPUs free, 4 + 4 on two nodes, for an 8-GPU pod.
    return Cluster().whole("a", used=[4]).whole("b", used=[2, 2]).pending("job", {GPU: 8})


def fewest_pods() -> Cluster:
    return Cluster().whole("a", used=[1, 1, 2]).whole("b", used=[4]).pending("job", {GPU: 7})


def nvlink_pairs() -> Cluster:
    # Two NVLink pairs (0,1) and (2,3); GPUs 0 and 2 are taken: 2 free, but not linked.
    c = Cluster().whole("a", gpus=4, used=[1, 1], islands=[0, 0, 2, 2], at=[[0], [2]])
    return c.pending("job", {GPU: 2}, labels={"nodeagent.io/gpu-topology": "nvlink"})


def three_free_slices() -> Cluster:
    # The trap: 3 free slices on an H100, and a 3g.40gb takes 4 of them.
    busy = [f"1g.10gb@{s}*" for s in range(5)]
    return Cluster().mig("m", [busy]).pending("job", {MIG_3G: 1})


def busy_1g_at_slot_6() -> Cluster:
    # The trap: a busy 1g at slot 6 does not block a 4g.40gb at slot 0.
    return Cluster().mig("m", [["1g.10gb@6*"]]).pending("job", {MIG_4G: 1})


def free_4g_beside_busy_1g() -> Cluster:
    # A free 4g exists beside the busy 1g: the pod fits, so the GPUs are not why it waits.
    return (
        Cluster()
        .mig("m", [["4g.40gb@0", "1g.10gb@6*"]])
        .pending("job", {MIG_4G: 1}, unschedulable="0/1 nodes are available: 1 Insufficient cpu.")
    )


def idle_instances_in_the_way() -> Cluster:
    idle = ["1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3"]
    busy = ["1g.10gb@4*", "1g.10gb@5*", "1g.10gb@6*"]
    return Cluster().mig("m", [idle + busy]).pending("job", {MIG_3G: 1})


def misaligned_busy() -> Cluster:
    # 6 slices nobody holds, but a 3g.40gb starts only at 0 or 4, and 1 and 5 are busy.
    return Cluster().mig("m", [["1g.10gb@1*", "1g.10gb@5*"]]).pending("job", {MIG_3G: 1})


def a30_two_gpus() -> Cluster:
    # A30: 4 slices; 2g.12gb starts at 0 or 2. GPU 0 busy at 0 and 2, GPU 1 idle 1g at 2.
    return (
        Cluster()
        .mig("m", [["1g.6gb@0*", "1g.6gb@2*"], ["1g.6gb@2"]], preset=A30)
        .pending("job", {"nvidia.com/mig-2g.12gb": 1})
    )


def a100_one_busy_1g_per_gpu(asked: int) -> Callable[[], Cluster]:
    # The trap (issue 27 item 5): an A100 has 8 memory slices but only 7 placements of a 1g.5gb
    # (slices 0-6), so 8 GPUs each with a busy 1g have room for 48 more, not 56.
    def build() -> Cluster:
        layouts = [["1g.5gb@0*"] for _ in range(8)]
        c = Cluster().mig("m", layouts, preset="dgx-a100")
        return c.pending("job", {"nvidia.com/mig-1g.5gb": asked})

    return build


def toleration_admits_only_shared() -> Cluster:
    # The trap: the only node with room is in the training tier, which the pod does not tolerate.
    return (
        Cluster()
        .whole("train", used=[], taints=[TRAINING], tier="training")
        .whole("shared", used=[6], taints=[SHARED], tier="shared")
        .pending("job", {GPU: 4}, tolerations=[{**SHARED, "operator": "Equal"}])
    )


def cordoned_node_would_hold_it() -> Cluster:
    return (
        Cluster()
        .whole("a", used=[6])
        .whole("b", used=[], unschedulable=True)
        .pending("job", {GPU: 4})
    )


def quarantined_node() -> Cluster:
    taint = {"key": "nodeagent.io/quarantine", "value": "unstable", "effect": "NoSchedule"}
    return Cluster().whole("a", used=[8]).whole("b", taints=[taint]).pending("job", {GPU: 2})


def kueue_gate() -> Cluster:
    # Fragmented as well, but Kueue holds it: quota, never fragmentation.
    c = Cluster().whole("a", used=[4]).whole("b", used=[4])
    return c.pending("job", {GPU: 8}, gates=[KUEUE_GATE], labels={"kueue.x-k8s.io/queue-name": "q"})


def workload_without_quota() -> Cluster:
    c = Cluster().whole("a", used=[4]).whole("b", used=[4]).pending("job", {GPU: 8})
    c.workloads = [workload("job", "False", "Pending", "insufficient unused quota")]
    return c


def admitted_but_fragmented() -> Cluster:
    # kueue#4329: quota reserved, then fragmentation makes it unschedulable.
    c = Cluster().whole("a", used=[4]).whole("b", used=[4]).pending("job", {GPU: 8})
    c.workloads = [workload("job", "True", "QuotaReserved", "")]
    return c


def other_gate() -> Cluster:
    return Cluster().whole("a").pending("job", {GPU: 1}, gates=["example.com/approval"])


def fits_but_cpu() -> Cluster:
    msg = "0/1 nodes are available: 1 Insufficient cpu."
    return Cluster().whole("a", used=[2]).pending("job", {GPU: 2}, unschedulable=msg)


def shared_replicas() -> Cluster:
    c = Cluster()
    for name in ("a", "b"):
        c.nodes.append(
            {
                "metadata": {"name": name, "labels": {"nodeagent.io/tier": "shared"}},
                "spec": {},
                "status": {"allocatable": {"nvidia.com/gpu.shared": "4"}},
            }
        )
        c.pods.append(
            {
                "metadata": {"name": f"r-{name}", "namespace": "busy", "uid": name},
                "spec": {
                    "nodeName": name,
                    "containers": [
                        {"name": "m", "resources": {"limits": {"nvidia.com/gpu.shared": "2"}}}
                    ],
                },
                "status": {"phase": "Running"},
            }
        )
    return c.pending("job", {"nvidia.com/gpu.shared": 3})


def unpublished_mig() -> Cluster:
    c = Cluster()
    c.nodes.append(
        {
            "metadata": {"name": "m", "labels": {}},
            "spec": {},
            "status": {"allocatable": {"nvidia.com/mig-1g.10gb": "7"}},
        }
    )
    return c.pending("job", {MIG_3G: 1})


def workload(pod: str, reserved: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"pod-{pod}",
            "namespace": "team",
            "ownerReferences": [{"kind": "Pod", "name": pod, "uid": f"uid-team-{pod}"}],
        },
        "spec": {"queueName": "q"},
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": reserved, "reason": reason, "message": message}
            ]
        },
    }


R = Reason
# id: (build, reason, unblock kind, what the unblock or the evidence must say)
TABLE: dict[str, tuple[Callable[[], Cluster], Reason, str | None, str]] = {
    "capacity": (capacity_all_used, R.CAPACITY, None, "only 2 free"),
    "capacity-larger-than-a-node": (capacity_too_big, R.CAPACITY, None, "has 16"),
    "4+4-for-8": (four_plus_four, R.CONTIGUITY_GPUS, "move-pods", "busy/run-1"),
    "fewest-pods": (fewest_pods, R.CONTIGUITY_GPUS, "move-pods", "node b"),
    "nvlink-set": (nvlink_pairs, R.CONTIGUITY_GPUS, "move-pods", "NVLink"),
    "3-slices-no-3g": (three_free_slices, R.CAPACITY, None, "takes 4 memory slices"),
    "busy-1g-at-6": (busy_1g_at_slot_6, R.CONTIGUITY_MIG, "mig-layout", "create 4g.40gb@0:4"),
    "free-4g-fits": (free_4g_beside_busy_1g, R.OTHER, None, "Insufficient cpu"),
    "idle-in-the-way": (idle_instances_in_the_way, R.CONTIGUITY_MIG, "mig-layout", "1g.10gb@3"),
    "misaligned-busy": (misaligned_busy, R.CONTIGUITY_MIG, None, "overlaps a busy"),
    "a30-other-gpu": (a30_two_gpus, R.CONTIGUITY_MIG, "mig-layout", "GPU 1"),
    "a100-48-1g": (a100_one_busy_1g_per_gpu(48), R.CONTIGUITY_MIG, "mig-layout", "GPU 7"),
    "a100-49-1g": (a100_one_busy_1g_per_gpu(49), R.CAPACITY, None, "room for at most 48"),
    "toleration-only-shared": (toleration_admits_only_shared, R.TIER, "admit-tier", "training"),
    "cordoned": (cordoned_node_would_hold_it, R.TIER, "heal-node", "cordoned"),
    "quarantined": (quarantined_node, R.TIER, "heal-node", "nodeagent.io/quarantine"),
    "kueue-gate": (kueue_gate, R.QUOTA, None, "Kueue has not admitted it"),
    "workload-no-quota": (workload_without_quota, R.QUOTA, None, "insufficient unused quota"),
    "admitted-fragmented": (admitted_but_fragmented, R.CONTIGUITY_GPUS, "move-pods", "one node"),
    "other-gate": (other_gate, R.OTHER, None, "example.com/approval"),
    "fits-but-cpu": (fits_but_cpu, R.OTHER, None, "Insufficient cpu"),
    "shared-replicas": (shared_replicas, R.CONTIGUITY_GPUS, "move-pods", "gpu.shared"),
    "no-gpu-state": (unpublished_mig, R.OTHER, None, "publishes its GPU state"),
}
CASES = [pytest.param(*case, id=name) for name, case in TABLE.items()]


@pytest.mark.parametrize(("build", "reason", "kind", "says"), CASES)
def test_reason_and_unblock(
    build: Callable[[], Cluster], reason: Reason, kind: str | None, says: str
) -> None:
    result = diagnose(build().view())
    (d,) = result.diagnoses
    assert d.pod == "team/job"
    assert d.reason is reason, d.evidence
    if kind is None:
        assert d.unblock is None or reason in (Reason.TIER,), d.unblock
        assert says in d.evidence
    else:
        assert d.unblock is not None, d.evidence
        assert d.unblock.kind == kind
        assert says in d.unblock.text + " " + d.evidence
    assert d.to_json()["unblock"] == (d.unblock.to_json() if d.unblock else {})


def test_four_plus_four_moves_the_single_pod_and_it_is_enough() -> None:
    (d,) = diagnose(four_plus_four().view()).diagnoses
    assert d.unblock is not None
    assert (d.unblock.node, d.unblock.pods) == ("a", ("busy/run-1",))
    assert "largest free block per tier: training 4" in d.evidence


def test_busy_1g_at_slot_6_is_kept_and_nothing_is_destroyed() -> None:
    (d,) = diagnose(busy_1g_at_slot_6().view()).diagnoses
    assert d.unblock is not None
    (change,) = d.unblock.changes
    assert change.destroy == ()
    assert [s.label for s in change.layout] == ["4g.40gb@0:4", "1g.10gb@6:1"]


def test_idle_instances_destroyed_are_exactly_the_four_in_the_way() -> None:
    (d,) = diagnose(idle_instances_in_the_way().view()).diagnoses
    assert d.unblock is not None
    (change,) = d.unblock.changes
    assert [s.label for s in change.destroy] == [f"1g.10gb@{i}:1" for i in range(4)]
    assert [s.label for s in change.create] == ["3g.40gb@0:4"]


def test_a_mig_pod_without_an_unblock_has_an_empty_object() -> None:
    (d,) = diagnose(misaligned_busy().view()).diagnoses
    assert d.to_json()["unblock"] == {}


def test_a_topology_request_without_the_policy_key_counts_gpus_only() -> None:
    # Same cluster, but the policy names another key: the pod's label is not a request.
    (d,) = diagnose(nvlink_pairs().view(), Settings(topology_key="example.com/topo")).diagnoses
    assert d.reason is Reason.OTHER


def test_pods_the_scheduler_has_not_judged_are_left_alone() -> None:
    c = Cluster().whole("a", used=[8]).pending("job", {GPU: 1}, unschedulable=None)
    assert diagnose(c.view()).diagnoses == ()
    assert len(diagnose(c.view(), Settings(assume_unschedulable=True)).diagnoses) == 1


def test_running_and_cpu_only_pods_are_not_diagnosed() -> None:
    c = Cluster().whole("a", used=[8]).pending("cpu", {})
    assert diagnose(c.view()).diagnoses == ()


def test_pool_stats_count_free_but_unusable_capacity() -> None:
    stats = diagnose(four_plus_four().view()).stats
    assert stats.free_gpus == {"training": 8}
    assert stats.unusable_gpus == {"training": 8}  # 4 + 4 free, smallest blocked request 8
    assert stats.largest_nvlink_block == {"training": 4}
    mig = diagnose(three_free_slices().view()).stats
    # Slices 5..7 are free: a 1g.10gb fits at 5 and 6 only (7 has no 1g.10gb placement).
    assert mig.unusable_mig_slices[("shared", "1g.10gb")] == 1
    assert mig.unusable_mig_slices[("shared", "3g.40gb")] == 3
