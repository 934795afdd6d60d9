"""Node flagging against a loopback stand-in API server, through the real kubernetes client."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.health.report import read_status
from nodeagent.health.reporter import Reporter
from nodeagent.kube.node import NodePatcher, make_api
from tests.health.apiserver import FakeApiServer
from tests.health.conftest import MakeRig, Rig

NODE = "gpu-node-1"


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer(NODE).start()
    yield server
    server.stop()


def make_reporter(rig: Rig, server: FakeApiServer, state_dir: Path) -> Reporter:
    section = KubernetesSection(enabled=True, api_server=server.url, request_timeout_s=2.0)
    patcher = NodePatcher(NODE, make_api(section), request_timeout_s=2.0)
    # Tiny retry delays keep the outage test fast; the doubling is what is checked.
    return Reporter(rig.model, state_dir, NODE, patcher=patcher, retry_initial_s=0.01,
                    retry_max_s=0.04)  # fmt: skip


def test_healthy_node_gets_condition_labels_and_annotations(
    make_rig: MakeRig, api_server: FakeApiServer, tmp_path: Path
) -> None:
    rig = make_rig("dgx-h100")
    make_reporter(rig, api_server, tmp_path).report_once()
    assert api_server.condition() is not None
    cond = api_server.condition()
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "GPUsHealthy")
    labels = api_server.node["metadata"]["labels"]
    assert labels["nodeagent.io/gpu-health"] == "healthy"
    assert labels["nodeagent.io/stability"] == "stable"
    assert labels["nodeagent.io/driver-version"] == rig.node.driver_version()
    assert labels["kubernetes.io/hostname"] == NODE  # others' labels untouched
    assert api_server.node["metadata"]["annotations"]["nodeagent.io/stability-score"] == "0.0"
    paths = [(r.method, r.path.split("?")[0]) for r in api_server.requests]
    assert paths == [
        ("GET", f"/api/v1/nodes/{NODE}"),
        ("PATCH", f"/api/v1/nodes/{NODE}/status"),
        ("PATCH", f"/api/v1/nodes/{NODE}"),
    ]
    assert {r.content_type for r in api_server.patches()} == {
        "application/strategic-merge-patch+json"
    }


def test_fault_flips_condition_and_patches_only_on_change(
    make_rig: MakeRig, api_server: FakeApiServer, tmp_path: Path
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
    cond = api_server.condition()
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", "GPULost")
    assert "gpu3: GPU lost" in cond["message"]
    assert "reboot the node" in cond["message"]
    status_patch = [
        r for r in api_server.patches() if r.path.startswith(f"/api/v1/nodes/{NODE}/status")
    ]
    assert status_patch[-1].body["status"]["conditions"][0]["type"] == "GPUHealthy"
    node_patch = api_server.patches()[-1].body
    assert node_patch["metadata"]["labels"] == {
        "nodeagent.io/gpu-health": "lost",
        "nodeagent.io/stability": "degraded",  # one lost GPU: score 10
    }
    reasons = json.loads(api_server.node["metadata"]["annotations"]["nodeagent.io/health-reasons"])
    assert any("GPU lost" in r for r in reasons)
    # The state file says the same.
    status = read_status(tmp_path)
    assert status is not None
    assert status["health"] == "lost"


def test_taint_when_unstable_keeps_other_taints(
    make_rig: MakeRig, api_server: FakeApiServer, tmp_path: Path
) -> None:
    rig = make_rig("dgx-h100", taint_unstable=True)
    reporter = make_reporter(rig, api_server, tmp_path)
    reporter.report_once()
    assert [t["key"] for t in api_server.node["spec"]["taints"]] == ["other.io/maintenance"]
    for gpu in (0, 1):
        rig.control.inject("lost", gpu)
    rig.pump()
    reporter.report_once()
    taints = {t["key"]: t for t in api_server.node["spec"]["taints"]}
    assert set(taints) == {"other.io/maintenance", "nodeagent.io/unstable"}
    assert taints["nodeagent.io/unstable"]["effect"] == "NoSchedule"
    assert api_server.node["metadata"]["labels"]["nodeagent.io/stability"] == "unstable"


def test_retries_while_api_server_is_down_and_catches_up(
    make_rig: MakeRig, api_server: FakeApiServer, tmp_path: Path
) -> None:
    rig = make_rig("dgx-h100")
    reporter = make_reporter(rig, api_server, tmp_path)
    reporter.report_once()
    api_server.stop()
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
    # Meanwhile the fault clears on another GPU... and a second one appears: the latest wins.
    rig.control.inject("thermal", 4)
    rig.pump()
    api_server.start()
    time.sleep(0.05)
    reporter.report_once()
    assert reporter.failures == 0
    cond = api_server.condition()
    assert cond is not None
    assert cond["status"] == "False"
    assert "gpu2: row remap pending" in cond["message"]
    assert "gpu4:" in cond["message"]
