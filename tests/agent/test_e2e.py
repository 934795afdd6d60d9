"""The whole agent on a simulated node: every component, a test kubelet, the real API server.

What an operator sees after `nodeagent run`: the node carries capability labels, capacity
annotations and the GPUHealthy condition; the kubelet gets a registration; /metrics and /readyz
answer; an injected XID flips the condition. The agent reaches kube-apiserver with a token of
the deploy manifests' ServiceAccount, so everything it publishes passes the shipped RBAC.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

from nodeagent.agent.daemon import Agent
from nodeagent.config.schema import load_agent_config
from nodeagent.sim.control import SimControl
from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.controlplane import free_port
from nodeagent.testing.kubelet import TestKubelet
from nodeagent.testing.waiting import wait_until


def test_agent_publishes_labels_condition_metrics_and_devices(
    make_node, sim_state_dir: Path, tmp_path: Path, control_plane, kube_nodes, kube_identities
) -> None:
    node_name = kube_nodes.create("gpu-1", {"team": "ml"})
    api = control_plane.api_client()
    kubeconfig = kube_identities.agent.kubeconfig.path
    kubelet_dir = tmp_path / "device-plugins"
    kubelet_dir.mkdir()
    port = free_port()
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"version: v1\nstate_dir: {tmp_path / 'state'}\nnode: {{name: {node_name}, pool: infer}}\n"
        "sampler: {interval_s: 0.1}\n"
        "mig: {allow_reset: true}\n"
        f"device_plugin: {{mig_strategy: mixed, kubelet_dir: '{kubelet_dir}'}}\n"
        f"metrics: {{pod_attribution: false, address: '127.0.0.1:{port}'}}\n"
        f"kubernetes: {{enabled: true, kubeconfig: '{kubeconfig}'}}\n"
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
        assert wait_until(
            lambda: wanted <= {r.resource_name for r in kubelet.registrations}, timeout_s=10
        ), "device plugin: MIG resources never registered with the test kubelet"

        def labelled(key: str, value: str) -> Any:
            return lambda node: node["metadata"].get("labels", {}).get(key) == value

        published = waiting.node(
            api,
            node_name,
            labelled("nodeagent.io/mig-layout", "all-balanced"),
            what=f"agent: node {node_name} labelled with the applied MIG layout",
        )
        node_labels = published["metadata"]["labels"]
        assert node_labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert node_labels["nvidia.com/gpu.count"] == "8"
        assert node_labels["nvidia.com/mig.strategy"] == "mixed"
        assert node_labels["nodeagent.io/pool"] == "infer"
        assert node_labels["nodeagent.io/gpu-health"] == "healthy"
        assert node_labels["team"] == "ml"  # other owners' labels stay
        annotations = published["metadata"]["annotations"]
        assert annotations["nodeagent.io/stranded-gpus"] == "0"
        assert "nodeagent.io/fragmentation" in annotations

        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        assert 'nodeagent_mig_creatable_instances{gpu="0"' in body
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz").status == 200

        def gpu_healthy(status: str) -> Any:
            def check(node: dict[str, Any]) -> bool:
                cond = waiting.condition(node, "GPUHealthy")
                return cond is not None and cond["status"] == status

            return check

        waiting.node(
            api, node_name, gpu_healthy("True"), what=f"agent: node {node_name} GPUHealthy=True"
        )
        SimControl(sim_state_dir).inject("xid", 2, code=79)
        flagged = waiting.node(
            api, node_name, gpu_healthy("False"), what=f"agent: node {node_name} GPUHealthy=False"
        )
        cond = waiting.condition(flagged, "GPUHealthy")
        assert cond is not None
        assert "xid 79" in cond["message"].lower()
        waiting.node(
            api,
            node_name,
            labelled("nodeagent.io/gpu-health", "lost"),
            what=f"agent: node {node_name} labelled gpu-health=lost",
        )
    finally:
        assert agent.shutdown() == 0
        kubelet.stop()
