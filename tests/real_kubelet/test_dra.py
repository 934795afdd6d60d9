"""nodeagent's DRA plugin driven by a real kubelet: registration through the plugins registry,
a claim allocated by kube-scheduler from the published ResourceSlices, NodePrepareResources,
the CDI device IDs in the container request, and the device's health in the pod's status.
(A dynamic MIG claim, and a kubelet restart between prepare and container start, are in
test_dra_lifecycle.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.realnode import RealNode, eventually

pytestmark = pytest.mark.kubelet

DRA_OVERLAY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "overlays" / "dra"
DRIVER = "gpu.nodeagent.io"
# Where the kubelet's plugin watcher finds the plugin, inside the kubelet's mount namespace.
REGISTRY_SOCKET = f"/var/lib/kubelet/plugins_registry/{DRIVER}-reg.sock"
# The agent logs this only on NotifyRegistrationStatus(plugin_registered=true), which the
# kubelet's plugin manager sends after GetInfo on the registry socket and its DRA handler's
# validation: no other path reaches it.
AGENT_REGISTERED = f"DRA driver {DRIVER} registered with the kubelet"
KUBELET_REGISTERS = "OperationExecutor.RegisterPlugin started"


@dataclass
class DraNode:
    """The package's node with the DRA plugin instead of the device plugin, and where the
    kubelet's log stood before the agent came up with it."""

    node: RealNode
    kubelet_log_from: int


@pytest.fixture(scope="module")
def dra_node(_real_node_session: RealNode, control_plane: ControlPlane) -> Iterator[DraNode]:
    """One agent restart into DRA for the module's tests (each restart costs seconds)."""
    node = _real_node_session
    control_plane.apply(DRA_OVERLAY / "rbac.yaml")
    control_plane.apply(DRA_OVERLAY / "deviceclasses.yaml")
    mark = len(node.kubelet_log())
    node.reconfigure_agent({"dra": {"enabled": True}, "device_plugin": {"enabled": False}})
    yield DraNode(node, mark)
    node.reconfigure_agent({"dra": {"enabled": False}, "device_plugin": {"enabled": True}})
    node.wait_devices("nvidia.com/gpu", 8)


def _agent_run_log(node: RealNode) -> str:
    """The agent's log since its latest start."""
    path = node.workdir / "agent" / "agent.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    return text.rsplit("--- start ", 1)[-1]


def test_the_dra_plugin_registers_through_the_kubelets_plugins_registry(
    real_node: RealNode, dra_node: DraNode
) -> None:
    eventually(
        lambda: AGENT_REGISTERED in _agent_run_log(real_node),
        lambda: (
            f"agent on {real_node.name}: DRA driver {DRIVER} never told registered by the "
            f"kubelet's plugin manager\n{real_node.log_tail()}"
        ),
        timeout_s=30,
    )
    started = [
        line
        for line in real_node.kubelet_log()[dra_node.kubelet_log_from :].splitlines()
        if KUBELET_REGISTERS in line
    ]
    assert any(REGISTRY_SOCKET in line for line in started), (
        f"kubelet on {real_node.name}: no plugin registration from {REGISTRY_SOCKET} in its "
        f"log since the DRA plugin started; registrations it started: {started}"
    )
    # The socket the kubelet dialled is where the kubelet sees it, in its own namespace.
    real_node.in_kubelet_namespace("test", "-S", REGISTRY_SOCKET)


def test_a_claim_for_a_gpu_is_prepared_and_its_cdi_device_reaches_the_container(
    real_node: RealNode, dra_node: DraNode, control_plane: ControlPlane, kube_ns: str
) -> None:
    control_plane.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{kube_ns}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "one-gpu"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
            },
        },
    )
    pod = real_node.pod("dra-pod")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "one-gpu"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    real_node.core.create_namespaced_pod(kube_ns, pod)  # type: ignore[arg-type]
    real_node.wait_pod(kube_ns, "dra-pod", "Running")
    claim = control_plane.request(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{kube_ns}/resourceclaims/one-gpu"
    )
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1, f"kube-scheduler: allocation of claim one-gpu: {results}"
    assert results[0]["driver"] == DRIVER
    assert results[0]["pool"] == real_node.name, f"claim one-gpu allocated off the node: {results}"
    request = real_node.container_request(kube_ns, "dra-pod")
    assert request is not None, f"fakecri: no CreateContainer for pod {kube_ns}/dra-pod"
    cdi = [d["name"] for d in request["config"].get("CDI_devices", [])]
    assert cdi, f"pod {kube_ns}/dra-pod: no CDI devices in the container request: {request}"
    assert all(DRIVER in name for name in cdi), f"pod {kube_ns}/dra-pod: CDI devices {cdi}"
    real_node.delete_pod(kube_ns, "dra-pod")
    control_plane.request(
        "DELETE", f"/apis/resource.k8s.io/v1/namespaces/{kube_ns}/resourceclaims/one-gpu"
    )


def _pod_health(pod: dict[str, Any] | None, resource: str) -> dict[str, str]:
    """Device ID -> health that the pod's first container reports for ``resource``."""
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    return {
        device["resourceID"]: device.get("health", "")
        for entry in statuses[0].get("allocatedResourcesStatus") or []
        if entry.get("name") == resource
        for device in entry.get("resources") or []
    }


def test_an_xid_79_on_a_claims_gpu_shows_unhealthy_in_the_pod_status(
    real_node: RealNode, dra_node: DraNode, control_plane: ControlPlane, kube_ns: str
) -> None:
    """KEP-4680 through DRA: the kubelet reads the plugin's health stream and names the claim's
    device in the pod status as ``claim:<pod claim name>``, by its first CDI device ID."""
    assert real_node.agent is not None
    claims = f"/apis/resource.k8s.io/v1/namespaces/{kube_ns}/resourceclaims"
    control_plane.request(
        "POST",
        claims,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "sick-claim"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
            },
        },
    )
    pod_name = "sick-claim-pod"
    pod = real_node.pod(pod_name)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "sick-claim"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    real_node.core.create_namespaced_pod(kube_ns, pod)  # type: ignore[arg-type]
    real_node.wait_pod(kube_ns, pod_name, "Running")
    [prepared] = [c for c in real_node.dra_checkpoint() if c.get("ClaimName") == "sick-claim"]
    [device] = prepared["DriverState"][DRIVER]["Devices"]
    resource_id = device["CDIDeviceIDs"][0]
    slices = control_plane.request(
        "GET",
        "/apis/resource.k8s.io/v1/resourceslices"
        f"?fieldSelector=spec.nodeName={real_node.name},spec.driver={DRIVER}",
    )["items"]
    [index] = [
        int(d["attributes"]["index"]["int"])
        for s in slices
        for d in s["spec"].get("devices") or []
        if d["name"] == device["DeviceName"]
    ]

    def pod_shows(health: str) -> None:
        waiting.pods(
            real_node.plane.api_client(),
            kube_ns,
            lambda pods: (
                _pod_health(pods.get(pod_name), "claim:gpu").get(resource_id) == health or None
            ),
            what=lambda: (
                f"kubelet on {real_node.name}: pod {kube_ns}/{pod_name} allocatedResourcesStatus "
                f"claim:gpu {resource_id} = {health}\n{real_node.log_tail()}"
            ),
            timeout_s=30,
        )

    pod_shows("Healthy")
    real_node.agent.inject("xid", index, code=79)
    try:
        pod_shows("Unhealthy")
    finally:
        real_node.sim("sim", "clear", "--gpu", str(index))
    real_node.delete_pod(kube_ns, pod_name)
    control_plane.request("DELETE", f"{claims}/sick-claim")
