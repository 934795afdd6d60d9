"""nodeagent's device plugin driven by a real kubelet (k8s.io/kubernetes/cmd/kubelet).

One node (kubelet + fake CRI runtime + ``nodeagent run --simulate dgx-h100``) serves the whole
module; each test leaves it as it found it (its pods deleted, faults cleared). The runtime keeps
every CreateContainer request, so a test sees what a container would have been given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nodeagent.testing.kube.realnode import RealNode, container_env

pytestmark = pytest.mark.kubelet

GPU = "nvidia.com/gpu"
GPU_SOCKET = "nodeagent-gpu.sock"
REGISTERED = (
    'Got registration request from device plugin with resource" resourceName="nvidia.com/gpu"'
)


def _visible(request: dict[str, Any]) -> list[str]:
    value = container_env(request).get("NVIDIA_VISIBLE_DEVICES", "")
    return [v for v in value.split(",") if v]


def test_every_gpu_registers_and_is_allocatable(real_node: RealNode) -> None:
    real_node.wait_allocatable(GPU, 8)
    node = real_node.core.read_node(real_node.name).to_dict()
    assert node["status"]["capacity"][GPU] == "8", "kubelet: capacity of nvidia.com/gpu"
    ids = real_node.allocatable_devices()[GPU]
    assert len(ids) == 8, f"kubelet pod-resources GetAllocatableResources: {ids}"
    assert all(i.startswith("GPU-") for i in ids), f"not GPU UUIDs: {ids}"


def test_two_gpu_pod_gets_the_preferred_gpus_and_frees_them(
    real_node: RealNode, kube_ns: str
) -> None:
    real_node.wait_allocatable(GPU, 8)
    free = real_node.allocatable_devices()[GPU]
    expected = real_node.preferred(GPU_SOCKET, free, 2)
    real_node.run_pod(kube_ns, "two-gpus", {GPU: "2"})
    request = real_node.container_request(kube_ns, "two-gpus")
    assert request is not None, f"fakecri: no CreateContainer for pod {kube_ns}/two-gpus"
    assert sorted(_visible(request)) == sorted(expected), (
        f"pod {kube_ns}/two-gpus: container got {_visible(request)}, "
        f"GetPreferredAllocation chose {expected}"
    )
    held = real_node.pod_devices()[(kube_ns, "two-gpus")][GPU]
    assert sorted(held) == sorted(expected), f"kubelet pod-resources List for two-gpus: {held}"

    real_node.delete_pod(kube_ns, "two-gpus")
    assert (kube_ns, "two-gpus") not in real_node.pod_devices()
    # Freed for real: a pod asking for all eight is admitted and gets every GPU.
    real_node.run_pod(kube_ns, "all-gpus", {GPU: "8"})
    every = real_node.container_request(kube_ns, "all-gpus")
    assert every is not None, f"fakecri: no CreateContainer for pod {kube_ns}/all-gpus"
    assert sorted(_visible(every)) == sorted(free), f"pod {kube_ns}/all-gpus after two-gpus"
    real_node.delete_pod(kube_ns, "all-gpus")


def test_the_allocate_front_answers_the_real_kubelet(
    real_node: RealNode, kube_ns: str, front_program: Path
) -> None:
    """As the container image runs the agent: the front on the kubelet's socket, the agent's
    own server behind it for ListAndWatch and GetPreferredAllocation."""
    assert real_node.agent is not None
    log = real_node.agent.component.log_path
    real_node.reconfigure_agent({"device_plugin": {"allocate_front": str(front_program)}})
    try:
        real_node.wait_allocatable(GPU, 8)
        free = real_node.allocatable_devices()[GPU]
        expected = real_node.preferred(GPU_SOCKET, free, 2)
        real_node.run_pod(kube_ns, "through-the-front", {GPU: "2"})
        request = real_node.container_request(kube_ns, "through-the-front")
        assert request is not None, f"fakecri: no CreateContainer for {kube_ns}/through-the-front"
        assert sorted(_visible(request)) == sorted(expected)
        text = log.read_text(errors="replace")
        assert f"Allocate front {front_program} started" in text, real_node.agent.log()
        assert "out of service" not in text, real_node.agent.log()
        real_node.delete_pod(kube_ns, "through-the-front")
    finally:
        real_node.reconfigure_agent({"device_plugin": {"allocate_front": None}})
    real_node.wait_allocatable(GPU, 8)


def test_kubelet_restart_ends_in_registration_and_same_allocatable(
    real_node: RealNode, kube_ns: str
) -> None:
    real_node.wait_allocatable(GPU, 8)
    before = real_node.registrations(GPU)
    real_node.stop_kubelet()
    real_node.start_kubelet()
    real_node.wait_registered(GPU, before)
    real_node.wait_devices(GPU, 8)
    real_node.wait_allocatable(GPU, 8)
    # The new kubelet allocates from the plugin it got back.
    real_node.run_pod(kube_ns, "after-kubelet-restart", {GPU: "1"})
    request = real_node.container_request(kube_ns, "after-kubelet-restart")
    assert request is not None, f"fakecri: no CreateContainer for {kube_ns}/after-kubelet-restart"
    assert len(_visible(request)) == 1, f"pod after-kubelet-restart got {_visible(request)}"
    real_node.delete_pod(kube_ns, "after-kubelet-restart")


def test_agent_restart_ends_in_registration_and_same_allocatable(real_node: RealNode) -> None:
    assert real_node.agent is not None
    real_node.wait_allocatable(GPU, 8)
    before = real_node.registrations(GPU)
    real_node.agent.stop()
    # The kubelet marks a plugin's devices unhealthy when its stream ends.
    real_node.wait_allocatable(GPU, 0)
    real_node.agent.start()
    real_node.wait_registered(GPU, before)
    real_node.wait_allocatable(GPU, 8)


def test_xid_79_lowers_allocatable_by_one_and_recovery_raises_it(real_node: RealNode) -> None:
    assert real_node.agent is not None
    agent = real_node.agent
    real_node.wait_allocatable(GPU, 8)
    agent.inject("xid", 3, code=79)
    try:
        real_node.wait_allocatable(GPU, 7)
        node = real_node.core.read_node(real_node.name).to_dict()
        assert node["status"]["capacity"][GPU] == "8", "kubelet: capacity keeps the lost GPU"
    finally:
        real_node.sim("sim", "clear", "--gpu", "3")
    real_node.wait_allocatable(GPU, 8, timeout_s=60)


def test_mig_apply_changes_the_node_and_a_pod_gets_the_planned_instance(
    real_node: RealNode, kube_ns: str
) -> None:
    mig = "nvidia.com/mig-3g.40gb"
    real_node.wait_devices(GPU, 8)  # registered, so that its allocatable can drop to 0
    real_node.reconfigure_agent({"device_plugin": {"mig_strategy": "mixed"}})
    try:
        real_node.sim("mig", "apply", "-c", "all-3g", "--yes", "--allow-reset")
        # H100 80GB: two 3g.40gb instances per GPU, and no whole GPU left.
        real_node.wait_allocatable(mig, 16)
        real_node.wait_allocatable(GPU, 0)
        real_node.wait_devices(mig, 16)
        planned = real_node.allocatable_devices()[mig]
        expected = real_node.preferred("nodeagent-mig-3g.40gb.sock", planned, 1)
        real_node.run_pod(kube_ns, "mig-pod", {mig: "1"})
        request = real_node.container_request(kube_ns, "mig-pod")
        assert request is not None, f"fakecri: no CreateContainer for pod {kube_ns}/mig-pod"
        assert _visible(request) == expected, (
            f"pod {kube_ns}/mig-pod got {_visible(request)}; the plugin chose {expected} "
            f"of the planner's instances {planned}"
        )
        real_node.delete_pod(kube_ns, "mig-pod")
    finally:
        real_node.sim("mig", "apply", "-c", "all-disabled", "--yes", "--allow-reset")
        real_node.reconfigure_agent({"device_plugin": {"mig_strategy": "none"}})
    real_node.wait_allocatable(GPU, 8)
    real_node.wait_devices(GPU, 8)


def test_processes_are_attributed_to_the_pod_through_pod_resources(
    real_node: RealNode, kube_ns: str
) -> None:
    real_node.wait_devices(GPU, 8)
    real_node.run_pod(kube_ns, "busy", {GPU: "2"})
    held = set(real_node.pod_devices()[(kube_ns, "busy")][GPU])
    pids = [real_node.sim("sim", "process", "add", "--gpu", str(i)).strip() for i in range(8)]
    try:
        rows = json.loads(
            real_node.sim(
                "processes", "--json", "--pod-resources-socket", str(real_node.pod_resources_socket)
            )
        )
        rows = rows if isinstance(rows, list) else rows.get("processes", [])
        owner = {row["gpu_uuid"]: (row["namespace"], row["pod"]) for row in rows}
        assert len(owner) == 8, f"nodeagent processes: {rows}"
        for uuid, pod in owner.items():
            wanted = (kube_ns, "busy") if uuid in held else (None, None)
            assert pod == wanted, f"nodeagent processes: the process on {uuid} is {pod}"
    finally:
        for pid in pids:
            real_node.sim("sim", "process", "remove", pid)
        real_node.delete_pod(kube_ns, "busy")
