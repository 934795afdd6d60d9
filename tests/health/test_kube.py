"""Node flagging against the loopback stand-in API server, through the real kubernetes client.

The stand-in applies patches as the API server does (strategic merge of ``status.conditions`` by
``type``, ``spec.taints`` replaced whole, ``/status`` writing only status), so these tests check
what the node ends up carrying, not only what was sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.health.reporter import Reporter
from nodeagent.health.statefile import read_status
from nodeagent.kube.node import NodePatcher, make_api
from tests.health.conftest import MakeRig, Rig
from tests.support.kubeapi import KubeAPIServer, make_node

NODE = "gpu-node-1"
OTHER_TAINT = {"key": "other.io/maintenance", "value": "x", "effect": "PreferNoSchedule"}


@pytest.fixture
def api_server() -> Iterator[KubeAPIServer]:
    server = KubeAPIServer().start()
    # The node as the kubelet and other controllers left it: Ready, a label, a foreign taint.
    node = make_node(NODE, {"kubernetes.io/hostname": NODE}, gpu_healthy=None)
    node["spec"]["taints"] = [dict(OTHER_TAINT)]
    server.put("nodes", node)
    yield server
    server.stop()


def stored(server: KubeAPIServer) -> dict[str, Any]:
    node = server.get("nodes", NODE)
    assert node is not None
    return node


def condition(server: KubeAPIServer) -> dict[str, Any] | None:
    return server.node_condition(NODE, "GPUHealthy")


def node_patches(server: KubeAPIServer) -> list[Any]:
    """PATCHes of the node and of its status, in order."""
    return server.requests_matching("PATCH", rf"^/api/v1/nodes/{NODE}(/status)?$")


def make_reporter(rig: Rig, server: KubeAPIServer, state_dir: Path) -> Reporter:
    section = KubernetesSection(enabled=True, api_server=server.url, request_timeout_s=2.0)
    patcher = NodePatcher(NODE, make_api(section), request_timeout_s=2.0)
    # Tiny retry delays keep the outage test fast; the doubling is what is checked.
    return Reporter(rig.model, state_dir, NODE, patcher=patcher, retry_initial_s=0.01,
                    retry_max_s=0.04)  # fmt: skip


def test_healthy_node_gets_condition_labels_and_annotations(
    make_rig: MakeRig, api_server: KubeAPIServer, tmp_path: Path
) -> None:
    rig = make_rig("dgx-h100")
    make_reporter(rig, api_server, tmp_path).report_once()
    cond = condition(api_server)
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "GPUsHealthy")
    node = stored(api_server)
    # A strategic merge by type: the kubelet's Ready condition is still there beside ours.
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "GPUHealthy"]
    labels = node["metadata"]["labels"]
    assert labels["nodeagent.io/gpu-health"] == "healthy"
    assert labels["nodeagent.io/stability"] == "stable"
    assert labels["nodeagent.io/driver-version"] == rig.node.driver_version()
    assert labels["kubernetes.io/hostname"] == NODE  # others' labels untouched
    assert node["metadata"]["annotations"]["nodeagent.io/stability-score"] == "0.0"
    assert node["spec"]["taints"] == [OTHER_TAINT]  # stable: no taint of ours
    paths = [(r.method, r.path) for r in api_server.requests]
    assert paths == [
        ("GET", f"/api/v1/nodes/{NODE}"),
        ("PATCH", f"/api/v1/nodes/{NODE}/status"),
        ("PATCH", f"/api/v1/nodes/{NODE}"),
    ]
    assert all(r.status == 200 for r in api_server.requests)
    assert {r.content_type for r in node_patches(api_server)} == {
        "application/strategic-merge-patch+json"
    }
    status_body, node_body = (r.body for r in node_patches(api_server))
    assert set(status_body) == {"status"}  # only the condition goes to /status
    assert [c["type"] for c in status_body["status"]["conditions"]] == ["GPUHealthy"]
    assert set(node_body) == {"metadata"}  # nothing to change in taints: spec not sent


def test_fault_flips_condition_and_patches_only_on_change(
    make_rig: MakeRig, api_server: KubeAPIServer, tmp_path: Path
) -> None:
    rig = make_rig("dgx-h100")
    reporter = make_reporter(rig, api_server, tmp_path)
    reporter.report_once()
    before = len(api_server.requests)
    reporter.report_once()
    assert len(api_server.requests) == before  # nothing changed, nothing sent
    rig.control.inject("xid", 3, code=79)
    rig.control.inject("lost", 3)
    rig.pump()
    reporter.report_once()
    cond = condition(api_server)
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", "GPULost")
    assert "gpu3: GPU lost" in cond["message"]
    assert "reboot the node" in cond["message"]
    # A change is two patches (status, then node) and no re-read of the node.
    sent = api_server.requests[before:]
    assert [(r.method, r.path) for r in sent] == [
        ("PATCH", f"/api/v1/nodes/{NODE}/status"),
        ("PATCH", f"/api/v1/nodes/{NODE}"),
    ]
    status_patch, node_patch = (r.body for r in sent)
    assert [c["type"] for c in status_patch["status"]["conditions"]] == ["GPUHealthy"]
    assert node_patch["metadata"]["labels"] == {
        "nodeagent.io/gpu-health": "lost",
        "nodeagent.io/stability": "degraded",  # one lost GPU: score 10
    }
    node = stored(api_server)
    assert node["metadata"]["labels"]["nodeagent.io/gpu-health"] == "lost"
    reasons = json.loads(node["metadata"]["annotations"]["nodeagent.io/health-reasons"])
    assert any("GPU lost" in r for r in reasons)
    # The state file says the same.
    status = read_status(tmp_path)
    assert status is not None
    assert status["health"] == "lost"


def test_taint_when_unstable_keeps_other_taints(
    make_rig: MakeRig, api_server: KubeAPIServer, tmp_path: Path
) -> None:
    rig = make_rig("dgx-h100", taint_unstable=True)
    reporter = make_reporter(rig, api_server, tmp_path)
    reporter.report_once()
    assert stored(api_server)["spec"]["taints"] == [OTHER_TAINT]
    for gpu in (0, 1):
        rig.control.inject("lost", gpu)
    rig.pump()
    reporter.report_once()
    # Taints are replaced whole by the API server, so the patch must carry the foreign one too.
    taints = {t["key"]: t for t in stored(api_server)["spec"]["taints"]}
    assert set(taints) == {"other.io/maintenance", "nodeagent.io/unstable"}
    assert taints["other.io/maintenance"] == OTHER_TAINT
    assert taints["nodeagent.io/unstable"]["effect"] == "NoSchedule"
    assert stored(api_server)["metadata"]["labels"]["nodeagent.io/stability"] == "unstable"


def test_retries_while_api_server_is_down_and_catches_up(
    make_rig: MakeRig, api_server: KubeAPIServer, tmp_path: Path
) -> None:
    rig = make_rig("dgx-h100")
    reporter = make_reporter(rig, api_server, tmp_path)
    reporter.report_once()
    url = api_server.url
    api_server.stop()  # also cuts the client's pooled keep-alive connection
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
    served = len(api_server.requests)
    api_server.start()
    assert api_server.url == url  # same port: the reporter's configured URL works again
    time.sleep(delays[2])  # the reporter holds off until its backoff has passed
    reporter.report_once()
    assert reporter.failures == 0
    cond = condition(api_server)
    assert cond is not None
    assert cond["status"] == "False"
    assert "gpu2: row remap pending" in cond["message"]
    assert "gpu4:" in cond["message"]
    # Caught up in one round: one status patch and one node patch, nothing re-sent twice.
    assert [(r.method, r.path) for r in api_server.requests[served:]] == [
        ("PATCH", f"/api/v1/nodes/{NODE}/status"),
        ("PATCH", f"/api/v1/nodes/{NODE}"),
    ]
    assert stored(api_server)["metadata"]["labels"]["nodeagent.io/gpu-health"] != "healthy"


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
    api_server: KubeAPIServer,
    tmp_path: Path,
    kind: str,
    kwargs: dict[str, Any],
    status: str,
    reason: str,
    message: str,
) -> None:
    rig = make_rig("dgx-h100")
    reporter = make_reporter(rig, api_server, tmp_path)
    reporter.report_once()
    rig.control.inject(kind, 5, **kwargs)
    rig.pump()
    reporter.report_once()
    cond = condition(api_server)
    assert cond is not None
    assert (cond["status"], cond["reason"]) == (status, reason)
    assert message in cond["message"]
    action = rig.gpu(5).action
    if action != "none":
        assert f"(action: {action})" in cond["message"]
    assert "stability" in cond["message"]
    assert "gpu4" not in cond["message"]  # only the faulty GPU is named
    # The label carries the worst device state, the same fact as the condition.
    labels = stored(api_server)["metadata"]["labels"]
    assert labels["nodeagent.io/gpu-health"] == rig.gpu(5).state.value
