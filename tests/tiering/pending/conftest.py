"""Fixtures of the pending-workload tests (independent of the other tiering tests' fixtures)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.nodes import create_node, pod_manifest
from nodeagent.testing.waiting import wait_until


@pytest.fixture
def fragmented(control_plane: ControlPlane, kube_ns: str, kubelets: Any) -> Iterator[str]:
    """Two 4-GPU nodes with 2 GPUs used on each, and pod ``wide`` asking for 4, which
    kube-scheduler has reported Unschedulable; yields the pod's name."""
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    pool = kube_ns[-5:]
    nodes = [f"frag-{pool}-{i}" for i in range(2)]
    for node in nodes:
        create_node(api, node, {"pool": pool}, gpus=4)
    try:
        for i, node in enumerate(nodes):
            core.create_namespaced_pod(kube_ns, pod_manifest(f"run-{i}", gpus=2, node_name=node))
        core.create_namespaced_pod(
            kube_ns, pod_manifest("wide", gpus=4, node_selector={"pool": pool})
        )

        def waiting() -> bool:
            pod = core.read_namespaced_pod("wide", kube_ns)
            return any(c.reason == "Unschedulable" for c in pod.status.conditions or [])

        assert wait_until(waiting, 60, 0.2)
        yield "wide"
    finally:
        for node in nodes:
            core.delete_node(node)
