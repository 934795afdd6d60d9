"""The device plugin's other resources through a real kubelet: MIG devices under the single
strategy (``nvidia.com/gpu`` counts the instances) and time-sliced replicas (``replicas`` IDs a
GPU, under ``nvidia.com/gpu`` or, renamed, ``nvidia.com/gpu.shared``). Each is asserted where a
scheduler sees it, the Node's allocatable in the API server, and where a container gets it."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from nodeagent.testing.kube.realnode import RealNode, container_env

pytestmark = pytest.mark.kubelet

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"


def _visible(request: dict[str, Any] | None) -> list[str]:
    value = container_env(request or {}).get("NVIDIA_VISIBLE_DEVICES", "")
    return [v for v in value.split(",") if v]


def test_mig_single_strategy_counts_the_instances_as_gpus(
    real_node: RealNode, kube_ns: str
) -> None:
    real_node.wait_devices(GPU, 8)
    real_node.reconfigure_agent({"device_plugin": {"mig_strategy": "single"}})
    try:
        real_node.sim("mig", "apply", "-c", "all-3g", "--yes", "--allow-reset")
        # H100 80GB: two 3g.40gb instances per GPU, all advertised as nvidia.com/gpu.
        real_node.wait_allocatable(GPU, 16)
        real_node.wait_devices(GPU, 16)
        ids = real_node.allocatable_devices()[GPU]
        assert all(i.startswith("MIG-") for i in ids), (
            f"kubelet pod-resources GetAllocatableResources for {GPU} under the single "
            f"strategy: {ids} (wanted the MIG instances' UUIDs)"
        )
        real_node.run_pod(kube_ns, "single-mig", {GPU: "1"})
        got = _visible(real_node.container_request(kube_ns, "single-mig"))
        assert len(got) == 1, f"fakecri: pod {kube_ns}/single-mig asking {GPU}: 1 got {got}"
        assert got[0] in ids, (
            f"fakecri: pod {kube_ns}/single-mig asking {GPU}: 1 got {got}, not one of {ids}"
        )
        real_node.delete_pod(kube_ns, "single-mig")
    finally:
        real_node.sim("mig", "apply", "-c", "all-disabled", "--yes", "--allow-reset")
        real_node.reconfigure_agent({"device_plugin": {"mig_strategy": "none"}})
    real_node.wait_allocatable(GPU, 8)
    real_node.wait_devices(GPU, 8)


def test_time_sliced_replicas_multiply_allocatable_and_rename_moves_them(
    real_node: RealNode, kube_ns: str
) -> None:
    real_node.wait_devices(GPU, 8)
    gpus = set(real_node.allocatable_devices()[GPU])
    try:
        real_node.reconfigure_agent(
            {"pools": {"default": {"sharing": {"mode": "time-slicing", "replicas": 3}}}}
        )
        real_node.wait_allocatable(GPU, 24)
        real_node.wait_devices(GPU, 24)
        replicas = real_node.allocatable_devices()[GPU]
        per_gpu = Counter(r.split("::")[0] for r in replicas)
        assert per_gpu == dict.fromkeys(gpus, 3), (
            f"kubelet: {GPU} replicas {replicas} are not three of each GPU {sorted(gpus)}"
        )
        real_node.run_pod(kube_ns, "replica", {GPU: "1"})
        got = _visible(real_node.container_request(kube_ns, "replica"))
        # A container is given the GPU behind its replica: the runtime knows no replicas.
        assert len(got) == 1, f"fakecri: pod {kube_ns}/replica asking {GPU}: 1 got {got}"
        assert got[0] in gpus, (
            f"fakecri: pod {kube_ns}/replica got {got}, wanted the GPU of one replica"
        )
        real_node.delete_pod(kube_ns, "replica")

        real_node.reconfigure_agent(
            {
                "pools": {
                    "default": {
                        "sharing": {"mode": "time-slicing", "replicas": 3, "rename_shared": True}
                    }
                }
            }
        )
        real_node.wait_allocatable(SHARED, 24)
        # nvidia.com/gpu is no longer served: the kubelet zeroes it and keeps its capacity.
        real_node.wait_allocatable(GPU, 0)
        real_node.wait_devices(SHARED, 24)
    finally:
        real_node.reconfigure_agent({"pools": {"default": {"sharing": {"mode": "exclusive"}}}})
    real_node.wait_allocatable(GPU, 8)
    real_node.wait_devices(GPU, 8)
