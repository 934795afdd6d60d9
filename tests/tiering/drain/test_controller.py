"""The reconcile loop on the real API server: tiers, drains through the Eviction API with real
PodDisruptionBudgets, recovery, dry-run. A fake clock paces the controller; the kubelet stand-in
finishes the deletions the evictions start."""

from __future__ import annotations

import json

import pytest

from nodeagent import labels as lbl
from nodeagent_tiering.cluster.nodes import DRAIN_ANNOTATION
from tests.tiering.conftest import gpu_labels

H100 = gpu_labels()
L40S = gpu_labels("NVIDIA-L40S", nvlink=1)
T4 = gpu_labels("Tesla-T4", count=1, nvlink=1)


def refresh(ctl):
    ctl.cache.relist()
    return ctl.reconcile_once()


def drain_record(cluster, node):
    return json.loads(cluster.node(node)["metadata"]["annotations"][DRAIN_ANNOTATION])


@pytest.mark.parametrize(
    ("labels", "tier"),
    [
        pytest.param(H100, "training", id="8 NVLink H100 stable -> training"),
        pytest.param({**H100, lbl.STABILITY: "degraded"}, "general", id="degraded leaves training"),
        pytest.param(L40S, "general", id="8 PCIe L40S -> general"),
        pytest.param(T4, "shared", id="single T4 -> shared catch-all"),
    ],
)
def test_tier_assignment_by_precedence(cluster, make_controller, labels, tier):
    cluster.add_nodes({"n1": labels})
    refresh(make_controller())
    assert cluster.tier_of("n1") == tier
    assert cluster.calls("patch", "nodes") == [(cluster.nodes.name("n1"), 200)]


def test_unmanaged_node_is_left_alone(cluster, make_controller):
    cluster.add_nodes({"cpu": {"kubernetes.io/os": "linux"}})
    refresh(make_controller())
    assert lbl.TIER not in cluster.node("cpu")["metadata"]["labels"]
    assert cluster.calls("patch", "nodes") == []


def test_labels_written_only_on_change(cluster, make_controller):
    cluster.add_nodes({"a": H100, "b": L40S})
    ctl = make_controller()
    refresh(ctl)
    assert len(cluster.calls("patch", "nodes")) == 2
    refresh(ctl)
    assert len(cluster.calls("patch", "nodes")) == 2


def test_unstable_node_is_cordoned_drained_quarantined_and_returns(
    cluster, make_controller, clock, kubelets
):
    cluster.add_nodes({"a": H100, "b": H100, "c": H100})
    cluster.add_pod("job", "a", labels={"app": "job"}, grace_s=900)
    daemon = cluster.add_daemonset("ds", "a")
    static = f"{cluster.namespace}-static"
    cluster.add_mirror_pod(static, "a")
    cluster.wait_running("job")
    ctl = make_controller()
    refresh(ctl)
    cluster.set_stability("a", "unstable")
    cluster.set_gpu_condition("a", "False", "Xid79", "xid 79: GPU has fallen off the bus")
    refresh(ctl)  # cordon + taint + quarantine
    node = cluster.node("a")
    assert node["spec"]["unschedulable"] is True
    assert {"key": "nodeagent.io/quarantine", "value": "unstable", "effect": "NoSchedule"} in node[
        "spec"
    ]["taints"]
    assert cluster.tier_of("a") == "quarantine"
    refresh(ctl)  # first eviction round
    record = drain_record(cluster, "a")
    assert (record["phase"], record["evicted"], record["remaining"]) == ("draining", 1, 1), (
        "an evicted pod is still on the node until its kubelet has stopped it"
    )
    cluster.wait_gone("job")
    # The eviction gave the pod the drain's grace period cap, not its own 900 s.
    assert kubelets.grace_periods[f"{cluster.namespace}/job"] == 480
    assert daemon in cluster.pods(), "DaemonSet pods are skipped"
    assert static in cluster.pods("kube-system"), "mirror pods are skipped"
    assert cluster.calls("create", "pods/eviction") == [("job", 201)]
    clock.advance(2)
    refresh(ctl)  # the next step finds the node empty
    record = drain_record(cluster, "a")
    assert (record["phase"], record["evicted"], record["remaining"]) == ("drained", 1, 0)
    assert cluster.reasons("a")[:2] == ["DrainStarted", "DrainSucceeded"]
    # The Events are about the node itself: `kubectl describe node` finds them by its UID.
    started = cluster.events("a")[0]
    assert started["involvedObject"]["uid"] == node["metadata"]["uid"]
    assert started["source"]["component"] == "nodeagent-tiering"

    # The fault clears; the node must stay stable for the recovery period (hysteresis).
    cluster.set_stability("a", "stable")
    cluster.set_gpu_condition("a", "True", "Ok")
    refresh(ctl)
    clock.advance(300)
    cluster.set_stability("a", "unstable")
    refresh(ctl)  # flapped: recovery clock restarts
    cluster.set_stability("a", "stable")
    refresh(ctl)
    clock.advance(599)
    refresh(ctl)
    assert cluster.node("a")["spec"].get("unschedulable") is True
    clock.advance(2)
    refresh(ctl)
    node = cluster.node("a")
    assert not node["spec"].get("unschedulable")
    assert not node["spec"].get("taints")
    assert DRAIN_ANNOTATION not in (node["metadata"].get("annotations") or {})
    assert cluster.tier_of("a") == "training"
    assert cluster.reasons("a")[-1] == "NodeReturned"


def first_eviction_refused(cluster, make_controller, pod):
    """A controller that saw node a turn unstable, started its drain, and had the eviction of
    ``pod`` refused by its PodDisruptionBudget (429)."""
    ctl = make_controller()
    refresh(ctl)
    cluster.set_stability("a", "unstable")
    refresh(ctl)
    refresh(ctl)
    assert cluster.calls("create", "pods/eviction") == [(pod, 429)]
    return ctl


def test_pdb_refusal_is_retried_with_backoff(cluster, make_controller, clock):
    cluster.add_nodes({"a": T4, "b": T4}, gpus=1)
    cluster.add_pod("web-1", "a", labels={"app": "web"})
    cluster.add_pod("web-2", "b", labels={"app": "web"})
    cluster.wait_running("web-1", "web-2")
    cluster.add_pdb("web", {"app": "web"}, min_available=2, healthy=2)
    ctl = first_eviction_refused(cluster, make_controller, "web-1")
    clock.advance(1)
    refresh(ctl)
    assert len(cluster.calls("create", "pods/eviction")) == 1, "backing off (5 s)"
    clock.advance(5)
    refresh(ctl)
    assert len(cluster.calls("create", "pods/eviction")) == 2
    clock.advance(5)
    refresh(ctl)
    assert len(cluster.calls("create", "pods/eviction")) == 2, "backoff doubled to 10 s"
    cluster.add_pod("web-3", "b", labels={"app": "web"})  # the replacement becomes ready
    cluster.wait_running("web-3")
    cluster.wait_pdb("web", healthy=3)
    clock.advance(6)
    refresh(ctl)
    assert cluster.calls("create", "pods/eviction") == [
        ("web-1", 429),
        ("web-1", 429),
        ("web-1", 201),
    ]
    cluster.wait_gone("web-1")
    clock.advance(2)
    refresh(ctl)
    record = drain_record(cluster, "a")
    assert record == {**record, "phase": "drained", "blocked": 2, "evicted": 1}
    assert ctl.metrics.registry.get_sample_value("nodeagent_tiering_evictions_blocked_total") == 2


def held_by_a_budget(cluster):
    """Two T4 nodes; on node a a pod whose PodDisruptionBudget allows no eviction."""
    cluster.add_nodes({"a": T4, "b": T4}, gpus=1)
    cluster.add_pod("db", "a", labels={"app": "db"})
    cluster.wait_running("db")
    cluster.add_pdb("db", {"app": "db"}, max_unavailable=0, healthy=1)


def test_drain_times_out_and_stays_quarantined(cluster, make_controller, clock, policy):
    held_by_a_budget(cluster)
    ctl = first_eviction_refused(cluster, make_controller, "db")
    clock.advance(policy.drain.timeout_s + 1)
    refresh(ctl)
    assert drain_record(cluster, "a")["phase"] == "failed"
    assert "DrainFailed" in cluster.reasons("a")
    assert cluster.tier_of("a") == "quarantine"
    assert "db" in cluster.pods()


def test_dry_run_changes_nothing(cluster, make_controller):
    cluster.add_nodes({"a": H100, "b": {**H100, lbl.STABILITY: "unstable"}, "c": T4})
    cluster.add_pod("job", "b")
    before = {s: cluster.node(s)["metadata"]["resourceVersion"] for s in "abc"}
    ctl = make_controller(dry_run=True)
    refresh(ctl)
    refresh(ctl)
    assert {r.verb for r in cluster.requests()} <= {"list", "watch"}, "reads only"
    assert {s: cluster.node(s)["metadata"]["resourceVersion"] for s in "abc"} == before
    assert cluster.reasons("b") == []
    b, a = cluster.nodes.name("b"), cluster.nodes.name("a")
    assert any("start draining" in line and f"node {b}" in line for line in ctl.dry_log.lines)
    assert any(f"set tier training on node {a}" in line for line in ctl.dry_log.lines)


def test_writes_of_one_pass_build_on_each_other(cluster, make_controller, clock, policy):
    """A drain start writes the quarantine tier itself (no second write for the label), and a
    drain step in the same pass as the recovery clock's start keeps that clock: a node that is
    stable again returns after the recovery period even while a budget still holds its drain."""
    held_by_a_budget(cluster)
    ctl = make_controller()
    refresh(ctl)
    a = cluster.nodes.name("a")
    before = cluster.calls("patch", "nodes")
    cluster.set_stability("a", "unstable")
    refresh(ctl)
    assert cluster.calls("patch", "nodes")[len(before) :] == [(a, 200)], "one write starts a drain"
    assert cluster.tier_of("a") == "quarantine"
    cluster.set_stability("a", "stable")
    clock.advance(10)
    refresh(ctl)  # the recovery clock starts, and a drain step runs (refused by the budget)
    record = drain_record(cluster, "a")
    assert (record["phase"], record["blocked"]) == ("draining", 1)
    assert record["stableSince"] == clock(), "the drain step undid the recovery clock"
    clock.advance(policy.recovery_period_s)
    refresh(ctl)
    assert not cluster.node("a")["spec"].get("unschedulable"), "returned after the period"
    assert cluster.tier_of("a") == "shared"
