"""Remediation of one GPU on the real API server: only its pods are evicted, through the
Eviction API with real PodDisruptionBudgets, within the drain budget; the node stays in service."""

from __future__ import annotations

import json

from nodeagent import labels as lbl
from nodeagent.published import PublishedGpu, PublishedNode, encode
from nodeagent_tiering.cluster.nodes import DRAIN_ANNOTATION
from nodeagent_tiering.drain.planner import BreakerState
from tests.tiering.conftest import gpu_labels

H100 = gpu_labels()


def gpu_state(cluster, faulty: dict[int, str], pods: dict[int, list[str]]) -> str:
    """The agent's annotation: 8 GPUs, ``faulty`` index -> state, ``pods`` index -> pod names."""
    gpus = tuple(
        PublishedGpu(
            i,
            "NVIDIA H100 80GB HBM3",
            health=faulty.get(i, "healthy"),
            pods=tuple(f"{cluster.namespace}/{p}" for p in pods.get(i, [])),
        )
        for i in range(8)
    )
    return encode(PublishedNode(gpus, allocations_known=True))


def publish(cluster, node: str, faulty: dict[int, str], pods: dict[int, list[str]]) -> None:
    """What the agent of ``node`` publishes: the annotation, and the condition it implies."""
    annotation = gpu_state(cluster, faulty, pods)
    cluster.nodes.patch(node, {"metadata": {"annotations": {lbl.GPU_STATE_ANNOTATION: annotation}}})
    if faulty:
        cluster.set_gpu_condition(node, "False", "GpuUnhealthy", "GPU 3: xid 79")
    else:
        cluster.set_gpu_condition(node, "True", "AllGpusHealthy")


def refresh(ctl):
    ctl.cache.relist()
    return ctl.reconcile_once()


def records(cluster, node: str) -> dict:
    raw = cluster.node(node)["metadata"].get("annotations", {}).get(lbl.GPU_REMEDIATION_ANNOTATION)
    return json.loads(raw) if raw else {}


def test_only_the_faulty_gpus_pods_are_evicted_pdbs_hold(cluster, make_controller, clock):
    cluster.add_nodes({"a": H100})
    for pod, app in (("on-3-free", "free"), ("on-3-held", "held"), ("on-0", "other")):
        cluster.add_pod(pod, "a", labels={"app": app})
    cluster.wait_running("on-3-free", "on-3-held", "on-0")
    cluster.add_pdb("held", {"app": "held"}, min_available=1, healthy=1)
    pol = cluster.policy(gpu_remediation={"enabled": True})
    ctl = make_controller(pol=pol)
    refresh(ctl)
    publish(cluster, "a", {3: "unhealthy"}, {3: ["on-3-free", "on-3-held"], 0: ["on-0"]})
    refresh(ctl)

    evictions = cluster.calls("create", "pods/eviction")
    assert sorted(evictions) == [("on-3-free", 201), ("on-3-held", 429)]
    node = cluster.node("a")
    assert not node["spec"].get("unschedulable"), "the node stays in service"
    assert DRAIN_ANNOTATION not in node["metadata"].get("annotations", {})
    rec = records(cluster, "a")["3"]
    assert (rec["evicted"], rec["blocked"], rec["remaining"], rec["done"]) == (1, 1, 1, False)
    assert "GPURemediationStarted" in cluster.reasons("a")
    cluster.wait_gone("on-3-free")

    # The budget lets the held pod go once a replacement is ready: the next pass evicts it.
    cluster.add_pod("replacement", "a", labels={"app": "held"})
    cluster.wait_running("replacement")
    cluster.wait_pdb("held", healthy=2)
    clock.advance(5)
    refresh(ctl)
    assert ("on-3-held", 201) in cluster.calls("create", "pods/eviction")
    rec = records(cluster, "a")["3"]
    assert (rec["evicted"], rec["remaining"], rec["done"]) == (2, 0, True)
    assert "GPURemediationSucceeded" in cluster.reasons("a")
    assert "on-0" in cluster.pods()
    started = ctl.metrics.registry.get_sample_value(
        "nodeagent_tiering_gpu_remediations_total", {"result": "started"}
    )
    assert started == 1
    refresh(ctl)  # done: nothing more is evicted
    assert len(cluster.calls("create", "pods/eviction")) == 3

    # The GPU is healthy again: the record goes, so a new fault starts anew.
    publish(cluster, "a", {}, {0: ["on-0"]})
    refresh(ctl)
    assert records(cluster, "a") == {}


def test_remediations_share_the_drain_budget(cluster, make_controller):
    cluster.add_nodes({"a": H100, "b": H100})
    cluster.add_pod("pa", "a")
    cluster.add_pod("pb", "b")
    cluster.wait_running("pa", "pb")
    cluster.add_pdb("all", {}, max_unavailable=0, healthy=2)  # nothing may go: both stay busy
    pol = cluster.policy(gpu_remediation={"enabled": True}, budget={"max_draining": 1})
    ctl = make_controller(pol=pol)
    refresh(ctl)
    publish(cluster, "a", {3: "unhealthy"}, {3: ["pa"]})
    publish(cluster, "b", {5: "lost"}, {5: ["pb"]})
    refresh(ctl)
    started = {n for n in ("a", "b") if records(cluster, n)}
    assert len(started) == 1, "one disruption at a time"
    waiting = ({"a", "b"} - started).pop()
    assert "DrainDeferred" in cluster.reasons(waiting)
    assert not cluster.node(waiting)["spec"].get("unschedulable"), "deferred, not drained"


def test_off_by_default_the_node_is_drained_as_before(cluster, make_controller):
    cluster.add_nodes({"a": H100, "b": H100})
    cluster.add_pod("pa", "a")
    cluster.wait_running("pa")
    ctl = make_controller()
    refresh(ctl)
    publish(cluster, "a", {3: "unhealthy"}, {3: ["pa"]})
    refresh(ctl)
    assert cluster.node("a")["spec"].get("unschedulable") is True
    assert records(cluster, "a") == {}


def test_dry_run_reports_the_pods_it_would_evict(cluster, make_controller):
    cluster.add_nodes({"a": H100})
    cluster.add_pod("pa", "a")
    cluster.wait_running("pa")
    pol = cluster.policy(gpu_remediation={"enabled": True})
    ctl = make_controller(pol=pol, dry_run=True)
    refresh(ctl)
    publish(cluster, "a", {3: "unhealthy"}, {3: ["pa"]})
    refresh(ctl)
    assert cluster.calls("create", "pods/eviction") == []
    assert any("evict the pods of GPU 3" in line and "pa" in line for line in ctl.dry_log.lines)


def test_nothing_starts_while_the_breaker_is_open(cluster, make_controller):
    cluster.add_nodes({"a": H100})
    cluster.add_pod("pa", "a")
    cluster.wait_running("pa")
    ctl = make_controller(pol=cluster.policy(gpu_remediation={"enabled": True}))
    refresh(ctl)
    ctl.breaker = BreakerState(open=True, reason="3 of 4 nodes turned unstable", since_s=0.0)
    publish(cluster, "a", {3: "unhealthy"}, {3: ["pa"]})
    refresh(ctl)
    assert cluster.calls("create", "pods/eviction") == []
    assert records(cluster, "a") == {}
    deferred = ctl.metrics.registry.get_sample_value(
        "nodeagent_tiering_gpu_remediations_total", {"result": "deferred"}
    )
    assert deferred == 1
