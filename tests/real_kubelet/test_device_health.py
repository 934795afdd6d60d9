"""Device health in the pod's own status (KEP-4680, ``ResourceHealthStatus``: beta and on by
default since Kubernetes 1.36): the kubelet copies the health the device plugin streams for a
pod's devices into ``status.containerStatuses[].allocatedResourcesStatus``, so a pod's owner
sees that its GPU failed without reading node objects. The DRA path is in test_dra.py."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.realnode import RealNode

pytestmark = pytest.mark.kubelet

GPU = "nvidia.com/gpu"


def wait_health(
    node: RealNode, namespace: str, pod: str, resource: str, device: str, health: str
) -> None:
    """Watch the pod until its first container reports ``device`` of ``resource`` as
    ``health``; the timeout names the kubelet, the pod and the device."""
    waiting.pods(
        node.plane.api_client(),
        namespace,
        lambda pods: _health(pods.get(pod), resource).get(device) == health or None,
        what=lambda: (
            f"kubelet on {node.name}: pod {namespace}/{pod} allocatedResourcesStatus for "
            f"{resource} {device} = {health}\n{node.log_tail()}"
        ),
        timeout_s=30,
    )


def _health(pod: dict[str, Any] | None, resource: str) -> dict[str, str]:
    """Device ID -> health that the pod's first container reports for ``resource``."""
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    found: dict[str, str] = {}
    for entry in statuses[0].get("allocatedResourcesStatus") or []:
        if entry.get("name") == resource:
            for device in entry.get("resources") or []:
                found[device["resourceID"]] = device.get("health", "")
    return found


def test_an_xid_79_on_a_pods_gpu_shows_unhealthy_in_the_pod_status(
    real_node: RealNode, kube_ns: str
) -> None:
    assert real_node.agent is not None
    real_node.wait_devices(GPU, 8)
    real_node.run_pod(kube_ns, "sick-gpu", {GPU: "1"})
    [uuid] = real_node.pod_devices()[(kube_ns, "sick-gpu")][GPU]

    def pod_shows(health: str) -> None:
        wait_health(real_node, kube_ns, "sick-gpu", GPU, uuid, health)

    pod_shows("Healthy")
    index = real_node.gpu_index(uuid)  # before the XID: a GPU off the bus is listed without one
    real_node.agent.inject("xid", index, code=79)
    try:
        pod_shows("Unhealthy")
    finally:
        real_node.sim("sim", "clear", "--gpu", str(index))
    pod_shows("Healthy")
    real_node.delete_pod(kube_ns, "sick-gpu")
    real_node.wait_allocatable(GPU, 8, timeout_s=60)
