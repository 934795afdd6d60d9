"""Node flagging on the real kube-apiserver, under the agent's own ServiceAccount.

The reporter runs with a token of the deploy manifests' ``nodeagent`` ServiceAccount, so a verb
missing from its ClusterRole fails here. What the node carries afterwards is what the API server
made of the patches: the strategic merge of ``status.conditions`` by ``type`` (the kubelet's
Ready condition stays), ``spec.taints`` replaced whole (others' taints must be sent back), the
status subresource. Requests are counted in the API server's audit log.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.health.reporter import Reporter
from nodeagent.health.statefile import read_status
from nodeagent.kube.node_patcher import NodePatcher, make_api
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.deploy import Identities
from nodeagent.testing.kube.nodes import NodeSet
from nodeagent.testing.kube.waiting import condition
from tests.health.conftest import MakeRig, Rig

OTHER_TAINT = {"key": "other.io/maintenance", "value": "x", "effect": "PreferNoSchedule"}
# The nodeagent.io/gpu-health label that goes with each GPUHealthy condition reason.
LABEL_OF_REASON = {
    "GPUsHealthy": "healthy",
    "GPUDegraded": "degraded",
    "GPUUnhealthy": "unhealthy",
    "GPULost": "lost",
}


@dataclass
class Flagged:
    """The node under test, the agent's requests about it, and a reporter for it."""

    plane: ControlPlane
    nodes: NodeSet
    identities: Identities
    tmp_path: Path
    name: str = field(init=False)
    mark: int = field(init=False)

    def __post_init__(self) -> None:
        # The node as the kubelet and other controllers left it: Ready, a foreign taint.
        self.name = self.nodes.create("gpu-1", gpus=8, taints=[OTHER_TAINT])
        self.mark = self.plane.audit_mark()

    def node(self) -> dict[str, Any]:
        return self.nodes.get("gpu-1")

    def condition(self) -> dict[str, Any]:
        """The node's GPUHealthy condition, which every test expects the reporter to have set."""
        found = condition(self.node(), "GPUHealthy")
        assert found is not None
        return found

    def requests(self) -> list[tuple[str, str, int]]:
        """(verb, resource, code) of the agent's requests about this node, in order."""
        return [
            (r.verb, r.resource, r.code)
            for r in self.plane.audited(self.mark, user=self.identities.agent.user)
            if r.name == self.name
        ]

    def reported(self, rig: Rig) -> dict[str, Any]:
        """The condition once a new reporter (a new agent process) has reported."""
        self.reporter(rig).report_once()
        return self.condition()

    def reporter(self, rig: Rig) -> Reporter:
        section = KubernetesSection(
            enabled=True, kubeconfig=self.identities.agent.kubeconfig.path, request_timeout_s=2.0
        )
        patcher = NodePatcher(self.name, make_api(section), request_timeout_s=2.0)
        # Tiny retry delays keep the outage test fast; the doubling is what is checked.
        return Reporter(rig.model, self.tmp_path, self.name, patcher=patcher,
                        retry_initial_s=0.01, retry_max_s=0.04)  # fmt: skip


@pytest.fixture
def flagged(control_plane, kube_nodes, kube_identities, tmp_path) -> Flagged:
    return Flagged(control_plane, kube_nodes, kube_identities, tmp_path)


def test_healthy_node_gets_condition_labels_and_annotations(
    make_rig: MakeRig, flagged: Flagged
) -> None:
    rig = make_rig("dgx-h100")
    cond = flagged.reported(rig)
    assert (cond["status"], cond["reason"]) == ("True", "GPUsHealthy")
    node = flagged.node()
    # A strategic merge by type: the kubelet's Ready condition is still there beside ours (the
    # API server puts a new item first; order carries no meaning).
    assert sorted(c["type"] for c in node["status"]["conditions"]) == ["GPUHealthy", "Ready"]
    labels = node["metadata"]["labels"]
    assert labels["nodeagent.io/gpu-health"] == "healthy"
    assert labels["nodeagent.io/stability"] == "stable"
    assert labels["nodeagent.io/driver-version"] == rig.node.driver_version()
    assert labels["kubernetes.io/hostname"] == flagged.name  # others' labels untouched
    assert node["metadata"]["annotations"]["nodeagent.io/stability-score"] == "0.0"
    assert node["spec"]["taints"] == [OTHER_TAINT]  # stable: no taint of ours
    # One read on first contact, then the condition through the status subresource and the
    # labels through the node: all accepted under the agent's ClusterRole.
    assert flagged.requests() == [
        ("get", "nodes", 200),
        ("patch", "nodes/status", 200),
        ("patch", "nodes", 200),
    ]


def test_fault_flips_condition_and_patches_only_on_change(
    make_rig: MakeRig, flagged: Flagged, tmp_path: Path
) -> None:
    rig = make_rig("dgx-h100")
    reporter = flagged.reporter(rig)
    reporter.report_once()
    before = len(flagged.requests())
    reporter.report_once()
    assert len(flagged.requests()) == before  # nothing changed, nothing sent
    rig.control.inject("xid", 3, code=79)
    rig.control.inject("lost", 3)
    rig.pump()
    reporter.report_once()
    cond = flagged.condition()
    assert (cond["status"], cond["reason"]) == ("False", "GPULost")
    assert "gpu3: GPU lost" in cond["message"]
    assert "reboot the node" in cond["message"]
    # A change is two patches (status, then node) and no re-read of the node.
    assert flagged.requests()[before:] == [("patch", "nodes/status", 200), ("patch", "nodes", 200)]
    node = flagged.node()
    assert sorted(c["type"] for c in node["status"]["conditions"]) == ["GPUHealthy", "Ready"]
    labels = node["metadata"]["labels"]
    assert labels["nodeagent.io/gpu-health"] == "lost"
    assert labels["nodeagent.io/stability"] == "degraded"  # one lost GPU: score 10
    reasons = json.loads(node["metadata"]["annotations"]["nodeagent.io/health-reasons"])
    assert any("GPU lost" in r for r in reasons)
    # The state file says the same.
    status = read_status(tmp_path)
    assert status is not None
    assert status["health"] == "lost"


def test_unchanged_condition_keeps_its_transition_time_across_a_restart(
    make_rig: MakeRig, flagged: Flagged
) -> None:
    rig = make_rig("dgx-h100")
    first = flagged.reported(rig)
    time.sleep(1.1)  # Kubernetes times have one-second resolution
    again = flagged.reported(rig)  # a new agent process: it reads the node first
    assert again["lastTransitionTime"] == first["lastTransitionTime"]


def test_taint_when_unstable_keeps_other_taints(make_rig: MakeRig, flagged: Flagged) -> None:
    rig = make_rig("dgx-h100", taint_unstable=True)
    reporter = flagged.reporter(rig)
    reporter.report_once()
    assert flagged.node()["spec"]["taints"] == [OTHER_TAINT]
    for gpu in (0, 1):
        rig.control.inject("lost", gpu)
    rig.pump()
    reporter.report_once()
    # Taints are replaced whole by the API server, so the patch must carry the foreign one too.
    taints = {t["key"]: t for t in flagged.node()["spec"]["taints"]}
    assert set(taints) == {"other.io/maintenance", "nodeagent.io/unstable"}
    assert taints["other.io/maintenance"] == OTHER_TAINT
    assert taints["nodeagent.io/unstable"]["effect"] == "NoSchedule"
    assert flagged.node()["metadata"]["labels"]["nodeagent.io/stability"] == "unstable"


def test_retries_while_api_server_is_down_and_catches_up(
    make_rig: MakeRig, flagged: Flagged, control_plane: ControlPlane, tmp_path: Path
) -> None:
    rig = make_rig("dgx-h100")
    reporter = flagged.reporter(rig)
    reporter.report_once()
    control_plane.stop_apiserver()  # connections drop, nothing answers on the port
    try:
        rig.control.inject("remap-pending", 2)
        rig.pump()
        delays = [reporter.report_once()]
        time.sleep(delays[0])
        delays.append(reporter.report_once())
        time.sleep(delays[1])
        delays.append(reporter.report_once())
        assert reporter.failures == 3
        assert delays == pytest.approx([0.01, 0.02, 0.04])  # doubling
        assert read_status(tmp_path) is not None  # the state file is written regardless
        # Meanwhile a second fault appears: the latest flags win when the server is back.
        rig.control.inject("thermal", 4)
        rig.pump()
    finally:
        control_plane.start_apiserver()  # same port: the reporter's kubeconfig works again
    served = len(flagged.requests())
    time.sleep(delays[2])  # the reporter holds off until its backoff has passed
    reporter.report_once()
    assert reporter.failures == 0
    cond = flagged.condition()
    assert cond["status"] == "False"
    assert "gpu2: row remap pending" in cond["message"]
    assert "gpu4:" in cond["message"]
    # Caught up in one round: one status patch and one node patch, nothing re-sent twice.
    assert flagged.requests()[served:] == [("patch", "nodes/status", 200), ("patch", "nodes", 200)]
    assert flagged.node()["metadata"]["labels"]["nodeagent.io/gpu-health"] != "healthy"


@pytest.mark.parametrize(
    ("kind", "kwargs", "status", "reason", "message"),
    [
        pytest.param("xid", {"code": 62}, "False", "GPUUnhealthy",
                     "gpu5: xid 62: internal micro-controller halt", id="xid-62"),
        pytest.param("xid", {"code": 13}, "True", "GPUsHealthy",
                     "gpu5: xid 13: graphics engine exception", id="xid-13-application"),
        pytest.param("ecc-dbe", {}, "False", "GPUUnhealthy",
                     "gpu5: uncorrectable ECC errors: +1", id="ecc-dbe"),
        pytest.param("remap-failure", {}, "False", "GPUUnhealthy",
                     "gpu5: row remapping failed", id="remap-failure"),
        pytest.param("thermal", {}, "True", "GPUDegraded",
                     "gpu5: hardware slowdown, hardware thermal slowdown", id="thermal"),
        pytest.param("power-brake", {}, "True", "GPUDegraded",
                     "gpu5: hardware slowdown, hardware power brake slowdown", id="power-brake"),
        pytest.param("pcie-replay", {}, "True", "GPUDegraded",
                     "gpu5: 100 PCIe replays in the last minute", id="pcie-replay"),
        pytest.param("nvlink-errors", {"code": 1}, "True", "GPUDegraded",
                     "gpu5: 201 NVLink errors in the last minute", id="nvlink-errors"),
        pytest.param("nvlink-down", {"code": 1}, "False", "GPUUnhealthy",
                     "gpu5: NVLink down: link 1", id="nvlink-down"),
        pytest.param("nvml-error", {}, "True", "GPUDegraded",
                     "gpu5: NVML error: nvmlDeviceGetPowerUsage on GPU 5 failed", id="nvml-error"),
        pytest.param("lost", {}, "False", "GPULost", "gpu5: GPU lost", id="lost"),
    ],
)  # fmt: skip
def test_node_condition_per_fault_kind(
    make_rig: MakeRig,
    flagged: Flagged,
    kind: str,
    kwargs: dict[str, Any],
    status: str,
    reason: str,
    message: str,
) -> None:
    rig = make_rig("dgx-h100")
    reporter = flagged.reporter(rig)
    reporter.report_once()
    rig.control.inject(kind, 5, **kwargs)
    rig.pump()
    reporter.report_once()
    cond = flagged.condition()
    assert (cond["status"], cond["reason"]) == (status, reason)
    assert message in cond["message"]
    action = rig.gpu(5).action
    if action != "none":
        assert f"(action: {action})" in cond["message"]
    assert "stability" in cond["message"]
    assert "gpu4" not in cond["message"]  # only the faulty GPU is named
    # The label carries the worst device state, the same fact as the condition.
    labels = flagged.node()["metadata"]["labels"]
    assert labels["nodeagent.io/gpu-health"] == LABEL_OF_REASON[reason]
    assert rig.gpu(5).state.value == LABEL_OF_REASON[reason]
