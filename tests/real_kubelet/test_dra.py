"""nodeagent's DRA plugin driven by a real kubelet: registration through the plugins registry,
a claim allocated by kube-scheduler from the published ResourceSlices, NodePrepareResources,
and the CDI device IDs in the container request."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.realnode import RealNode

pytestmark = pytest.mark.kubelet

DRA_OVERLAY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "overlays" / "dra"
DRIVER = "gpu.nodeagent.io"


@pytest.fixture
def dra_node(real_node: RealNode, control_plane: ControlPlane) -> Iterator[RealNode]:
    """The session's node with the DRA plugin instead of the device plugin."""
    control_plane.apply(DRA_OVERLAY / "rbac.yaml")
    control_plane.apply(DRA_OVERLAY / "deviceclasses.yaml")
    real_node.reconfigure_agent({"dra": {"enabled": True}, "device_plugin": {"enabled": False}})
    yield real_node
    real_node.reconfigure_agent({"dra": {"enabled": False}, "device_plugin": {"enabled": True}})
    real_node.wait_devices("nvidia.com/gpu", 8)


def _instances(node: RealNode) -> list[dict[str, object]]:
    shown = json.loads(node.sim("mig", "show", "--json"))
    return [i for gpu in shown["gpus"] for i in gpu["instances"]]


def test_a_dynamic_mig_claim_creates_the_instance_on_prepare_and_destroys_it_after(
    real_node: RealNode, control_plane: ControlPlane, kube_ns: str
) -> None:
    control_plane.apply(DRA_OVERLAY / "rbac.yaml")
    control_plane.apply(DRA_OVERLAY / "deviceclasses.yaml")
    real_node.sim("mig", "apply", "-c", "all-enabled", "--yes", "--allow-reset")
    real_node.reconfigure_agent(
        {
            "dra": {"enabled": True},
            "device_plugin": {"enabled": False},
            "pools": {"default": {"dra": {"dynamic_mig": True}}},
        }
    )
    try:
        assert _instances(real_node) == [], "MIG instances before the claim"
        control_plane.request(
            "POST",
            f"/apis/resource.k8s.io/v1/namespaces/{kube_ns}/resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "one-mig"},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "mig",
                                "exactly": {
                                    "deviceClassName": "mig.nodeagent.io",
                                    "selectors": [
                                        {
                                            "cel": {
                                                "expression": "device.attributes"
                                                "['gpu.nodeagent.io'].profile == '3g.40gb'"
                                            }
                                        }
                                    ],
                                },
                            }
                        ]
                    }
                },
            },
        )
        pod = real_node.pod("mig-claim-pod")
        pod["spec"]["resourceClaims"] = [{"name": "mig", "resourceClaimName": "one-mig"}]
        pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "mig"}]}
        real_node.core.create_namespaced_pod(kube_ns, pod)  # type: ignore[arg-type]
        real_node.wait_pod(kube_ns, "mig-claim-pod", "Running", timeout_s=90)
        made = _instances(real_node)
        assert len(made) == 1, f"DRA prepare of claim one-mig made MIG instances {made}"
        request = real_node.container_request(kube_ns, "mig-claim-pod")
        assert request is not None, f"fakecri: no CreateContainer for {kube_ns}/mig-claim-pod"
        assert request["config"].get("CDI_devices"), f"no CDI devices for mig-claim-pod: {request}"
        real_node.delete_pod(kube_ns, "mig-claim-pod")
        control_plane.request(
            "DELETE", f"/apis/resource.k8s.io/v1/namespaces/{kube_ns}/resourceclaims/one-mig"
        )
        deadline = time.monotonic() + 30
        while _instances(real_node) and time.monotonic() < deadline:
            time.sleep(0.2)  # unprepare happens in the agent; nothing to watch in the API
        assert _instances(real_node) == [], "the claim's MIG instance outlived its pod"
    finally:
        real_node.reconfigure_agent(
            {
                "dra": {"enabled": False},
                "device_plugin": {"enabled": True},
                "pools": {"default": {"dra": {"dynamic_mig": False}}},
            }
        )
        real_node.sim("mig", "apply", "-c", "all-disabled", "--yes", "--allow-reset")
    real_node.wait_devices("nvidia.com/gpu", 8)


def test_a_claim_for_a_gpu_is_prepared_and_its_cdi_device_reaches_the_container(
    dra_node: RealNode, control_plane: ControlPlane, kube_ns: str
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
    pod = dra_node.pod("dra-pod")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "one-gpu"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    dra_node.core.create_namespaced_pod(kube_ns, pod)  # type: ignore[arg-type]
    dra_node.wait_pod(kube_ns, "dra-pod", "Running")
    claim = control_plane.request(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{kube_ns}/resourceclaims/one-gpu"
    )
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1, f"kube-scheduler: allocation of claim one-gpu: {results}"
    assert results[0]["driver"] == DRIVER
    assert results[0]["pool"] == dra_node.name, f"claim one-gpu allocated off the node: {results}"
    request = dra_node.container_request(kube_ns, "dra-pod")
    assert request is not None, f"fakecri: no CreateContainer for pod {kube_ns}/dra-pod"
    cdi = [d["name"] for d in request["config"].get("CDI_devices", [])]
    assert cdi, f"pod {kube_ns}/dra-pod: no CDI devices in the container request: {request}"
    assert all(DRIVER in name for name in cdi), f"pod {kube_ns}/dra-pod: CDI devices {cdi}"
    dra_node.delete_pod(kube_ns, "dra-pod")
    control_plane.request(
        "DELETE", f"/apis/resource.k8s.io/v1/namespaces/{kube_ns}/resourceclaims/one-gpu"
    )
