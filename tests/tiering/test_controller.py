"""The reconcile loop against the API stand-in: tiers, drains, PDBs, recovery, dry-run."""

from __future__ import annotations

import json

import pytest

from nodeagent import labels as lbl
from nodeagent_tiering.nodes import DRAIN_ANNOTATION
from tests.support.kubeapi import make_pdb, make_pod
from tests.tiering.conftest import add_nodes, gpu_labels

H100 = gpu_labels()
L40S = gpu_labels("NVIDIA-L40S", nvlink=1)
T4 = gpu_labels("Tesla-T4", count=1, nvlink=1)


def tier_of(api, name):
    return api.get("nodes", name)["metadata"]["labels"].get(lbl.TIER)


def refresh(ctl):
    ctl.cache.relist()
    return ctl.reconcile_once()


@pytest.mark.parametrize(
    ("labels", "tier"),
    [
        pytest.param(H100, "training", id="8 NVLink H100 stable -> training"),
        pytest.param({**H100, lbl.STABILITY: "degraded"}, "general", id="degraded leaves training"),
        pytest.param(L40S, "general", id="8 PCIe L40S -> general"),
        pytest.param(T4, "shared", id="single T4 -> shared catch-all"),
    ],
)
def test_tier_assignment_by_precedence(api, make_controller, labels, tier):
    add_nodes(api, {"n1": labels})
    refresh(make_controller())
    assert tier_of(api, "n1") == tier


def test_unmanaged_node_is_left_alone(api, make_controller):
    add_nodes(api, {"cpu": {"kubernetes.io/os": "linux"}})
    refresh(make_controller())
    assert lbl.TIER not in api.get("nodes", "cpu")["metadata"]["labels"]


def test_labels_written_only_on_change(api, make_controller):
    add_nodes(api, {"a": H100, "b": L40S})
    ctl = make_controller()
    refresh(ctl)
    before = len(api.requests_matching("PATCH", "/nodes/"))
    refresh(ctl)
    assert len(api.requests_matching("PATCH", "/nodes/")) == before


def test_unstable_node_is_cordoned_drained_quarantined_and_returns(api, make_controller, clock):
    add_nodes(api, {"a": H100, "b": H100, "c": H100})
    api.put("pods", make_pod("job", "a", labels={"app": "job"}, grace_s=900))
    api.put("pods", make_pod("ds", "a", owner_kind="DaemonSet"))
    api.put("pods", make_pod("static", "a", mirror=True, owner_kind=None, namespace="kube-system"))
    ctl = make_controller()
    refresh(ctl)
    api.patch_direct(
        "nodes",
        "a",
        {
            "metadata": {"labels": {lbl.STABILITY: "unstable"}},
            "status": {
                "conditions": [
                    {
                        "type": "GPUHealthy",
                        "status": "False",
                        "reason": "Xid79",
                        "message": "xid 79: GPU has fallen off the bus",
                    }
                ]
            },
        },
    )
    refresh(ctl)  # cordon + taint + quarantine
    node = api.get("nodes", "a")
    assert node["spec"]["unschedulable"] is True
    assert {"key": "nodeagent.io/quarantine", "value": "unstable", "effect": "NoSchedule"} in node[
        "spec"
    ]["taints"]
    assert tier_of(api, "a") == "quarantine"
    refresh(ctl)  # first eviction round
    assert api.get("pods", "job", "default") is None
    assert api.get("pods", "ds", "default") is not None, "DaemonSet pods are skipped"
    assert api.get("pods", "static", "kube-system") is not None, "mirror pods are skipped"
    evictions = api.requests_matching("POST", "/eviction$")
    assert [r.body["deleteOptions"]["gracePeriodSeconds"] for r in evictions] == [480]
    record = json.loads(api.get("nodes", "a")["metadata"]["annotations"][DRAIN_ANNOTATION])
    assert record["phase"] == "drained"
    assert record["evicted"] == 1
    reasons = [e["reason"] for e in api.list("events")]
    assert reasons[:2] == ["DrainStarted", "DrainSucceeded"]

    # The fault clears; the node must stay stable for the recovery period (hysteresis).
    api.patch_direct(
        "nodes",
        "a",
        {
            "metadata": {"labels": {lbl.STABILITY: "stable"}},
            "status": {"conditions": [{"type": "GPUHealthy", "status": "True", "reason": "Ok"}]},
        },
    )
    refresh(ctl)
    clock.advance(300)
    api.patch_direct("nodes", "a", {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
    refresh(ctl)  # flapped: recovery clock restarts
    api.patch_direct("nodes", "a", {"metadata": {"labels": {lbl.STABILITY: "stable"}}})
    refresh(ctl)
    clock.advance(599)
    refresh(ctl)
    assert api.get("nodes", "a")["spec"].get("unschedulable") is True
    clock.advance(2)
    refresh(ctl)
    node = api.get("nodes", "a")
    assert not node["spec"].get("unschedulable")
    assert not node["spec"].get("taints")
    assert DRAIN_ANNOTATION not in (node["metadata"].get("annotations") or {})
    assert tier_of(api, "a") == "training"


def test_pdb_refusal_is_retried_with_backoff(api, make_controller, clock):
    add_nodes(api, {"a": T4, "b": T4})
    api.put("pods", make_pod("web-1", "a", labels={"app": "web"}))
    api.put("pods", make_pod("web-2", "b", labels={"app": "web"}))
    api.put("poddisruptionbudgets", make_pdb("web", {"app": "web"}, min_available=2))
    ctl = make_controller()
    refresh(ctl)
    api.patch_direct("nodes", "a", {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
    refresh(ctl)
    refresh(ctl)
    assert len(api.requests_matching("POST", "/eviction$")) == 1
    clock.advance(1)
    refresh(ctl)
    assert len(api.requests_matching("POST", "/eviction$")) == 1, "backing off (5 s)"
    clock.advance(5)
    refresh(ctl)
    assert len(api.requests_matching("POST", "/eviction$")) == 2
    clock.advance(5)
    refresh(ctl)
    assert len(api.requests_matching("POST", "/eviction$")) == 2, "backoff doubled to 10 s"
    api.put("pods", make_pod("web-3", "b", labels={"app": "web"}))  # replacement is ready
    clock.advance(6)
    refresh(ctl)
    assert api.get("pods", "web-1", "default") is None
    record = json.loads(api.get("nodes", "a")["metadata"]["annotations"][DRAIN_ANNOTATION])
    assert record == {**record, "phase": "drained", "blocked": 2, "evicted": 1}
    assert ctl.metrics.registry.get_sample_value("nodeagent_tiering_evictions_blocked_total") == 2


def test_drain_times_out_and_stays_quarantined(api, make_controller, clock, policy):
    add_nodes(api, {"a": T4, "b": T4})
    api.put("pods", make_pod("db", "a", labels={"app": "db"}))
    api.put("poddisruptionbudgets", make_pdb("db", {"app": "db"}, max_unavailable=0))
    ctl = make_controller()
    refresh(ctl)
    api.patch_direct("nodes", "a", {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
    refresh(ctl)
    clock.advance(policy.drain.timeout_s + 1)
    refresh(ctl)
    record = json.loads(api.get("nodes", "a")["metadata"]["annotations"][DRAIN_ANNOTATION])
    assert record["phase"] == "failed"
    assert "DrainFailed" in [e["reason"] for e in api.list("events")]
    assert tier_of(api, "a") == "quarantine"


def test_dry_run_changes_nothing(api, make_controller):
    add_nodes(api, {"a": H100, "b": {**H100, lbl.STABILITY: "unstable"}, "c": T4})
    api.put("pods", make_pod("job", "b"))
    before = {n["metadata"]["name"]: n for n in api.list("nodes")}
    rv = api.resource_version
    ctl = make_controller(dry_run=True)
    refresh(ctl)
    refresh(ctl)
    assert api.resource_version == rv
    assert [r for r in api.requests if r.method != "GET"] == []
    assert {n["metadata"]["name"]: n for n in api.list("nodes")} == before
    assert any("start draining" in line and "node b" in line for line in ctl.dry_log.lines)
    assert any("set tier training on node a" in line for line in ctl.dry_log.lines)
