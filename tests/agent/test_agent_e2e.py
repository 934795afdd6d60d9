"""The whole agent on a simulated node: every component, a kubelet stand-in, the API server.

What an operator sees after `nodeagent run`: the node carries capability labels, capacity
annotations and the GPUHealthy condition; the kubelet gets a registration; /metrics and /readyz
answer; an injected XID flips the condition.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.daemon import Agent
from nodeagent.config.schema import load_agent_config
from nodeagent.sim.control import SimControl
from nodeagent.testing.kubelet import TestKubelet
from tests.support.kubeapi import KubeAPIServer

NODE = "gpu-node-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    server = KubeAPIServer().start()
    server.put("nodes", {"metadata": {"name": NODE, "labels": {"team": "ml"}}})
    yield server
    server.stop()


def test_agent_publishes_labels_condition_metrics_and_devices(
    make_node, sim_state_dir: Path, tmp_path: Path, api: KubeAPIServer
) -> None:
    kubelet_dir = tmp_path / "device-plugins"
    kubelet_dir.mkdir()
    port = free_port()
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"version: v1\nstate_dir: {tmp_path / 'state'}\nnode: {{name: {NODE}, pool: infer}}\n"
        "sampler: {interval_s: 0.1}\n"
        "mig: {allow_reset: true}\n"
        f"device_plugin: {{mig_strategy: mixed, kubelet_dir: '{kubelet_dir}'}}\n"
        f"metrics: {{pod_attribution: false, address: '127.0.0.1:{port}'}}\n"
        f"kubernetes: {{enabled: true, api_server: '{api.url}'}}\n"
        "health: {report_interval_s: 1}\n"
        "pools:\n  infer: {mig_layout: all-balanced, request_sizes: ['1g.10gb']}\n"
    )
    node = make_node("dgx-h100")
    agent = Agent(
        load_agent_config(config, environ={}),
        node,
        config_path=config,
    )
    kubelet = TestKubelet(kubelet_dir)
    kubelet.start()
    agent.start()
    try:
        assert agent.wait_ready(20)
        # The MIG layout was applied and the device plugin advertises its profiles.
        # The layout is applied GPU by GPU while the plugin follows the snapshots, so the
        # profiles register as they appear.
        wanted = {"nvidia.com/mig-3g.40gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-1g.10gb"}
        wait_for(lambda: wanted <= {r.resource_name for r in kubelet.registrations})

        def labels() -> dict[str, str]:
            return (api.get("nodes", NODE) or {}).get("metadata", {}).get("labels", {})

        wait_for(lambda: labels().get("nodeagent.io/mig-layout") == "all-balanced")
        node_labels = labels()
        assert node_labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert node_labels["nvidia.com/gpu.count"] == "8"
        assert node_labels["nvidia.com/mig.strategy"] == "mixed"
        assert node_labels["nodeagent.io/pool"] == "infer"
        assert node_labels["nodeagent.io/gpu-health"] == "healthy"
        assert node_labels["team"] == "ml"  # other owners' labels stay
        annotations = api.get("nodes", NODE)["metadata"]["annotations"]
        assert annotations["nodeagent.io/stranded-gpus"] == "0"
        assert "nodeagent.io/fragmentation" in annotations

        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        assert 'nodeagent_mig_creatable_instances{gpu="0"' in body
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz").status == 200

        def condition() -> dict[str, Any]:
            status = (api.get("nodes", NODE) or {}).get("status", {})
            return next((c for c in status.get("conditions", []) if c["type"] == "GPUHealthy"), {})

        assert wait_for(lambda: condition().get("status") == "True")
        SimControl(sim_state_dir).inject("xid", 2, code=79)
        wait_for(lambda: condition().get("status") == "False")
        assert "xid 79" in condition()["message"].lower()
        wait_for(lambda: labels().get("nodeagent.io/gpu-health") == "lost")
    finally:
        assert agent.shutdown() == 0
        kubelet.stop()
