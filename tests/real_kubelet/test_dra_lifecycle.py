"""A dynamic MIG claim through the real kubelet's DRA manager, with a kubelet restart after the
claim was prepared (the instance made, the claim in the kubelet's DRA checkpoint) and before the
pod's container exists; nothing may leak."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.realnode import RealNode, eventually

pytestmark = pytest.mark.kubelet

DRA_OVERLAY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "overlays" / "dra"
DRIVER = "gpu.nodeagent.io"


def _instances(node: RealNode) -> list[dict[str, Any]]:
    shown = json.loads(node.sim("mig", "show", "--json"))
    return [i for gpu in shown["gpus"] for i in gpu["instances"]]


def _claim(name: str) -> dict[str, Any]:
    profile = "device.attributes['gpu.nodeagent.io'].profile == '3g.40gb'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {
                            "deviceClassName": "mig.nodeagent.io",
                            "selectors": [{"cel": {"expression": profile}}],
                        },
                    }
                ]
            }
        },
    }


def test_a_kubelet_restart_between_prepare_and_container_start_leaks_nothing(
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
    claims = f"/apis/resource.k8s.io/v1/namespaces/{kube_ns}/resourceclaims"
    pod_name = "held-mig-pod"
    try:
        assert _instances(real_node) == [], "MIG instances before the claim"
        control_plane.request("POST", claims, _claim("held-mig"))
        pod = real_node.pod(pod_name)
        pod["spec"]["resourceClaims"] = [{"name": "mig", "resourceClaimName": "held-mig"}]
        pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "mig"}]}
        real_node.hold_containers(kube_ns, pod_name)
        real_node.core.create_namespaced_pod(kube_ns, pod)  # type: ignore[arg-type]

        def prepared() -> list[dict[str, Any]] | None:
            for claim in real_node.dra_checkpoint():
                state = (claim.get("DriverState") or {}).get(DRIVER) or {}
                if claim.get("ClaimName") == "held-mig" and state.get("Devices"):
                    return list(state["Devices"])
            return None

        devices = eventually(
            prepared,
            lambda: (
                f"kubelet on {real_node.name}: claim held-mig of pod {kube_ns}/{pod_name} not "
                f"prepared in its DRA checkpoint {real_node.dra_checkpoint()}\n"
                f"{real_node.log_tail()}"
            ),
            timeout_s=90,
        )
        made = _instances(real_node)
        assert len(made) == 1, f"agent: prepare of claim held-mig made MIG instances {made}"
        assert real_node.container_request(kube_ns, pod_name) is None, (
            f"fakecri created pod {kube_ns}/{pod_name}'s container while it was held"
        )

        real_node.stop_kubelet()
        real_node.release_containers(kube_ns, pod_name)
        real_node.start_kubelet()
        real_node.wait_pod(kube_ns, pod_name, "Running", timeout_s=90)
        request = real_node.container_request(kube_ns, pod_name)
        assert request is not None, f"fakecri: no CreateContainer for {kube_ns}/{pod_name}"
        cdi = sorted(d["name"] for d in request["config"].get("CDI_devices", []))
        wanted = sorted(i for d in devices for i in d.get("CDIDeviceIDs") or [])
        assert cdi, f"pod {kube_ns}/{pod_name}: no CDI devices in the container request"
        assert cdi == wanted, (
            f"pod {kube_ns}/{pod_name} after the kubelet restart: CDI devices {cdi} in the "
            f"container request, {wanted} prepared before it"
        )
        assert _instances(real_node) == made, (
            f"agent: claim held-mig's MIG instance changed over the kubelet restart: "
            f"{made} -> {_instances(real_node)}"
        )

        real_node.delete_pod(kube_ns, pod_name)
        control_plane.request("DELETE", f"{claims}/held-mig")
        eventually(
            lambda: real_node.dra_checkpoint() == [],
            lambda: (
                f"kubelet on {real_node.name}: DRA checkpoint after pod {kube_ns}/{pod_name} "
                f"was deleted: {real_node.dra_checkpoint()}"
            ),
            timeout_s=30,
        )
        eventually(
            lambda: _instances(real_node) == [],
            lambda: (
                f"agent: claim held-mig's MIG instance {_instances(real_node)} outlived "
                f"pod {kube_ns}/{pod_name}"
            ),
            timeout_s=30,
        )
    finally:
        real_node.release_containers(kube_ns, pod_name)
        real_node.reconfigure_agent(
            {
                "dra": {"enabled": False},
                "device_plugin": {"enabled": True},
                "pools": {"default": {"dra": {"dynamic_mig": False}}},
            }
        )
        real_node.sim("mig", "apply", "-c", "all-disabled", "--yes", "--allow-reset")
    real_node.wait_devices("nvidia.com/gpu", 8)
