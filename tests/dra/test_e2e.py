"""End to end on the real control plane: the agent publishes, kube-scheduler allocates from the
published slices (CEL selectors, counters), the test kubelet prepares through the plugin's
sockets, and the simulated NVML, the checkpoint and the slices agree through random churn."""

from __future__ import annotations

import itertools
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodeagent.gpu.node import GpuNode
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sim.control import SimControl
from nodeagent.testing.drakubelet import DraConnection, TestDraKubelet
from nodeagent.testing.kube.nodes import create_node
from nodeagent.testing.mps_control import daemon_pid, running
from nodeagent.testing.nodes import enable_mig
from nodeagent.testing.waiting import wait_until
from nodeagent_dra.component import DraComponent
from nodeagent_mig.planner import Instance, place_on_node
from tests.dra.test_publisher import agent_config

REPO = Path(__file__).resolve().parents[2]
CLASSES = REPO / "deploy" / "kubernetes" / "overlays" / "dra" / "deviceclasses.yaml"
MIG_GPUS = (0, 1)


@dataclass
class Rig:
    node: GpuNode
    name: str
    component: DraComponent
    kubelet: DraConnection
    api: Any
    core: Any
    ns: str

    def refresh(self) -> None:
        self.component.refresh(self.node.snapshot())

    def claim(self, name: str, expression: str, config: list[dict[str, Any]] | None = None) -> None:
        """A claim of one MIG device matching ``expression``; ``config``: its device configs."""
        devices: dict[str, Any] = {
            "requests": [
                {
                    "name": "mig",
                    "exactly": {
                        "deviceClassName": "mig.nodeagent.io",
                        "selectors": [{"cel": {"expression": expression}}],
                    },
                }
            ]
        }
        if config is not None:
            devices["config"] = config
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": devices},
        }
        self.api.create_namespaced_resource_claim(self.ns, body)

    def pod(self, name: str, claim: str, containers: tuple[str, ...] = ("main",)) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": self.name},
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                "containers": [
                    {
                        "name": c,
                        "image": "registry.invalid/workload:1",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                    for c in containers
                ],
                "terminationGracePeriodSeconds": 0,
            },
        }
        self.core.create_namespaced_pod(self.ns, body)

    def allocation(self, claim: str) -> tuple[str, str] | None:
        got = self.api.read_namespaced_resource_claim(claim, self.ns)
        if got.status is None or got.status.allocation is None:
            return None
        (result,) = got.status.allocation.devices.results
        return got.metadata.uid, result.device

    def release(self, pod: str, claim: str) -> None:
        self.core.delete_namespaced_pod(pod, self.ns, grace_period_seconds=0)
        self.api.delete_namespaced_resource_claim(claim, self.ns)

        def gone() -> bool:
            try:
                self.api.read_namespaced_resource_claim(claim, self.ns)
            except ApiException as exc:
                return exc.status == 404
            return False

        assert wait_until(gone, timeout_s=30), f"claim {claim} was not deallocated"


@pytest.fixture
def rig(
    control_plane: Any,
    kube_ns: str,
    kubelets: Any,
    make_node: Callable[..., GpuNode],
    tmp_path: Path,
    mps_dir: Path,
) -> Iterator[Rig]:
    control_plane.apply(CLASSES)
    name = f"dra-e2e-{uuid.uuid4().hex[:6]}"
    api_client = control_plane.api_client()
    create_node(api_client, name)
    node = make_node("dgx-h100")
    enable_mig(node, {i: [] for i in MIG_GPUS})
    config = agent_config(tmp_path, name, mps_dir=mps_dir)
    component = DraComponent(
        config,
        node,
        SnapshotStore(),
        None,
        mig_lock_file=tmp_path / "mig.lock",
        api_client=api_client,
    )
    component.server.start()
    kubelet = TestDraKubelet(tmp_path / "registry")
    connection = kubelet.register()
    rig = Rig(
        node,
        name,
        component,
        connection,
        client.ResourceV1Api(api_client),
        client.CoreV1Api(api_client),
        kube_ns,
    )
    rig.refresh()
    yield rig
    kubelet.close()
    component.server.stop()
    assert component.publisher is not None
    component.publisher.withdraw()
    client.CoreV1Api(api_client).delete_node(name)


def nvml_layout(node: GpuNode) -> set[tuple[int, str, int]]:
    return {
        (gi.gpu_index, gi.profile, gi.placement.start)
        for i in range(node.count())
        for gi in node.mig_instances(i)
    }


def published_instances(component: DraComponent) -> set[tuple[int, str, int]]:
    """MIG devices the slices show as existing (with a UUID)."""
    assert component.published is not None
    out = set()
    for s in component.published.slices:
        for d in s["spec"].get("devices", []):
            a = d["attributes"]
            if a["type"]["string"] == "mig" and "uuid" in a:
                out.add(
                    (a["parentIndex"]["int"], a["profile"]["string"], a["placementStart"]["int"])
                )
    return out


H100_3G_40GB = (
    "device.attributes['gpu.nodeagent.io'].profile == '3g.40gb' && "
    "device.attributes['gpu.nodeagent.io'].productName.startsWith('NVIDIA H100') && "
    "device.capacity['gpu.nodeagent.io'].memory.compareTo(quantity('39Gi')) >= 0"
)


def test_the_scheduler_allocates_a_cel_selected_placement_that_prepare_creates(rig: Rig) -> None:
    rig.claim("any-3g", H100_3G_40GB)
    rig.pod("trainer", "any-3g")
    assert wait_until(lambda: rig.allocation("any-3g") is not None, timeout_s=30)
    allocated = rig.allocation("any-3g")
    assert allocated is not None
    uid, device = allocated
    assert "-mig-3g40gb-9-" in device
    answer = rig.kubelet.prepare([(rig.ns, uid, "any-3g")])[uid]
    assert answer.error == ""
    assert [d["device"] for d in answer.devices] == [device]
    gpu = int(device.split("-")[1])
    start = int(device.rsplit("-", 1)[1])
    assert nvml_layout(rig.node) == {(gpu, "3g.40gb", start)}
    # The scheduler took the planner's first choice on that GPU (the published order): 3g at
    # slice 4 keeps the 4g at slice 0 possible.
    geometry = rig.node.mig_geometry(gpu)
    assert geometry is not None
    planned = place_on_node(geometry, [[]], "3g.40gb")
    assert planned is not None
    assert start == planned[1].start == 4
    pod = rig.core.read_namespaced_pod("trainer", rig.ns)
    assert pod.spec.node_name == rig.name
    rig.refresh()
    assert published_instances(rig.component) == nvml_layout(rig.node)
    assert rig.kubelet.unprepare([(rig.ns, uid, "any-3g")]) == {uid: ""}
    rig.release("trainer", "any-3g")
    assert nvml_layout(rig.node) == set()


PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb")


def test_random_churn_never_overlaps_never_destroys_busy_and_agrees(
    rig: Rig, sim_state_dir: Path
) -> None:
    rng = random.Random(17)
    control = SimControl(sim_state_dir)
    held: dict[str, tuple[str, str, str | None]] = {}  # claim -> (pod, uid, busy pid)
    geometry = rig.node.mig_geometry(0)
    assert geometry is not None
    allocations = 0
    busy_refusals = 0
    for step in range(14):
        if held and (rng.random() < 0.4 or len(held) >= 6):
            claim = rng.choice(sorted(held))
            pod, uid, pid = held.pop(claim)
            if pid is not None:
                error = rig.kubelet.unprepare([(rig.ns, uid, claim)])[uid]
                assert "still runs processes" in error
                busy_refusals += 1
                before = nvml_layout(rig.node)
                rig.refresh()
                assert nvml_layout(rig.node) == before, "a busy instance was destroyed"
                control.remove_process(int(pid))
            assert rig.kubelet.unprepare([(rig.ns, uid, claim)]) == {uid: ""}
            rig.release(pod, claim)
        else:
            profile = rng.choice(PROFILES)
            claim, pod = f"c{step}", f"p{step}"
            rig.claim(claim, f"device.attributes['gpu.nodeagent.io'].profile == '{profile}'")
            rig.pod(pod, claim)
            if not wait_until(lambda c=claim: rig.allocation(c) is not None, timeout_s=12):
                # Pending: the node must really have no room (the planner agrees).
                instances = [[Instance.of(g) for g in rig.node.mig_instances(i)] for i in MIG_GPUS]
                assert place_on_node(geometry, instances, profile) is None, profile
                rig.core.delete_namespaced_pod(pod, rig.ns, grace_period_seconds=0)
                rig.api.delete_namespaced_resource_claim(claim, rig.ns)
                continue
            allocations += 1
            allocated = rig.allocation(claim)
            assert allocated is not None
            uid, device = allocated
            answer = rig.kubelet.prepare([(rig.ns, uid, claim)])[uid]
            assert answer.error == "", answer.error
            gpu = int(device.split("-")[1])
            start = int(device.rsplit("-", 1)[1])
            made = next(
                gi
                for gi in rig.node.mig_instances(gpu)
                if gi.profile == profile and gi.placement.start == start
            )
            pid = None
            if rng.random() < 0.4:
                assert made.uuid is not None
                pid = str(control.add_process(gpu, mig_uuid=made.uuid))
            held[claim] = (pod, uid, pid)
        rig.refresh()
        layout = nvml_layout(rig.node)
        # NVML, the checkpoint and the slices agree; nothing overlaps.
        assert layout == set(rig.component.driver.managed())
        assert published_instances(rig.component) == layout
        for gpu in MIG_GPUS:
            placed = sorted(
                (gi.placement.start, gi.placement.end) for gi in rig.node.mig_instances(gpu)
            )
            for (_, end), (start, _) in itertools.pairwise(placed):
                assert end <= start, f"overlap on GPU {gpu}: {placed}"
        time.sleep(0.05)
    assert allocations >= 5
    assert busy_refusals >= 1
    for claim, (_pod, uid, pid) in held.items():
        if pid is not None:
            control.remove_process(int(pid))
        assert rig.kubelet.unprepare([(rig.ns, uid, claim)]) == {uid: ""}
    assert nvml_layout(rig.node) == set()


def test_a_claim_shared_by_two_containers_through_mps_on_a_dynamic_mig_device(rig: Rig) -> None:
    mps = {
        "requests": ["mig"],
        "opaque": {
            "driver": "gpu.nodeagent.io",
            "parameters": {
                "apiVersion": "resource.nodeagent.io/v1beta1",
                "kind": "MigDeviceConfig",
                "sharing": {
                    "strategy": "MPS",
                    "mpsConfig": {"defaultActiveThreadPercentage": 50},
                },
            },
        },
    }
    rig.claim("shared-1g", "device.attributes['gpu.nodeagent.io'].profile == '1g.10gb'", [mps])
    rig.pod("two", "shared-1g", containers=("server", "sidecar"))
    assert wait_until(lambda: rig.allocation("shared-1g") is not None, timeout_s=30)
    allocated = rig.allocation("shared-1g")
    assert allocated is not None
    uid, _device = allocated
    answer = rig.kubelet.prepare([(rig.ns, uid, "shared-1g")])[uid]
    assert answer.error == ""
    spec = rig.component.driver.cdi.spec_path(uid).read_text()
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in spec
    assert len(nvml_layout(rig.node)) == 1
    # The instance's MPS control daemon runs, with the claim's limit as its default...
    (gi,) = [gi for i in MIG_GPUS for gi in rig.node.mig_instances(i)]
    assert gi.uuid is not None
    pipe = rig.component.config.dra.mps_root / gi.uuid / "pipe"
    assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in spec
    pid = daemon_pid(pipe)
    assert running(pid)
    control_log = (pipe.parent / "log" / "control.log").read_text().splitlines()
    assert "set_default_active_thread_percentage 50" in control_log
    # ...and stops once the claim is unprepared.
    assert rig.kubelet.unprepare([(rig.ns, uid, "shared-1g")]) == {uid: ""}
    assert wait_until(lambda: not running(pid), timeout_s=5)
    rig.release("two", "shared-1g")
