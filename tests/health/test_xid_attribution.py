"""Application XIDs attributed to the pods on the device: counts, Events, the real API server."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from kubernetes import client

from nodeagent.gpu.types import EventKind, GpuEvent, ProcessInfo
from nodeagent.health.attribution import EVENT_REASON, XidAttributor
from nodeagent.kube.events import EventRecorder
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.nodes import pod_manifest
from nodeagent.workloads import AttributedProcess, Device, Workload

GPU0 = Device(0, "GPU-0")
MIG_A = Device(1, "GPU-1", "MIG-1a", "3g.40gb", 1)
MIG_B = Device(1, "GPU-1", "MIG-1b", "3g.40gb", 2)


def _proc(pid: int, device: Device, pod: str | None) -> AttributedProcess:
    workload = Workload("team", pod, "main", pod_uid=f"uid-{pod}") if pod else None
    return AttributedProcess(device, ProcessInfo(pid, 1 << 30, None, None), workload, "cgroup")


PROCESSES = (
    _proc(1, GPU0, "a"),
    _proc(2, GPU0, "b"),
    _proc(3, GPU0, "b"),  # two processes of one pod: one hit
    _proc(4, GPU0, None),  # the MPS server: not a pod
    _proc(5, MIG_A, "c"),
    _proc(6, MIG_B, "d"),
)


def _xid(code: int, gpu: int, gi: int | None = None) -> GpuEvent:
    return GpuEvent(EventKind.XID, gpu, f"GPU-{gpu}", code, gi, 0 if gi is not None else None, 0.0)


@dataclass(frozen=True)
class Case:
    event: GpuEvent
    pods: set[str]  # pods the XID is attributed to


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case(_xid(13, 0), {"a", "b"}), id="time-sliced-gpu-both-pods"),
        pytest.param(Case(_xid(31, 1, gi=2), {"d"}), id="mig-device-its-pod-only"),
        pytest.param(Case(_xid(43, 1), {"c", "d"}), id="mig-gpu-event-without-instance"),
        pytest.param(Case(_xid(48, 0), set()), id="hardware-xid-not-the-pods"),
        pytest.param(Case(_xid(13, 2), set()), id="nobody-there"),
        pytest.param(
            Case(GpuEvent(EventKind.ECC_DOUBLE_BIT, 0, "GPU-0", 0, None, None, 0.0), set()),
            id="not-an-xid",
        ),
    ],
)
def test_attribution(case: Case) -> None:
    xids = XidAttributor(lambda: PROCESSES)
    hits = xids.on_event(case.event)
    assert {h.workload.pod for h in hits} == case.pods
    counted = {w.pod for (_, w, code), n in xids.counts().items() if code == case.event.data}
    assert counted == case.pods


def test_counts_accumulate_and_events_are_rate_limited() -> None:
    clock = FakeClock()
    sent: list[tuple[str, str]] = []

    class Recorder:
        def pod_event(self, pod, reason, message, *, warning=True):
            sent.append((pod.name, message))

    xids = XidAttributor(lambda: PROCESSES, Recorder(), clock=clock)  # type: ignore[arg-type]
    for _ in range(3):
        xids.on_event(_xid(13, 0))
    assert xids.send_pending() == 2  # one Event per pod and code, not three
    assert xids.counts()[(GPU0, Workload("team", "a", "main"), 13)] == 3
    clock.advance(61)
    xids.on_event(_xid(13, 0))
    assert xids.send_pending() == 2
    _name, message = sent[0]
    assert "XID 13 (GR_EXCEPTION" in message
    assert "1 other workload(s) shared the device" in message
    assert "restart the application" in message


def test_event_on_the_pod_in_the_real_api_server(control_plane: ControlPlane, kube_ns: str) -> None:
    core = client.CoreV1Api(control_plane.api_client())
    pod = core.create_namespaced_pod(kube_ns, pod_manifest("victim"))
    workload = Workload(kube_ns, "victim", "main", pod_uid=pod.metadata.uid)
    processes = [AttributedProcess(MIG_A, ProcessInfo(7, 1 << 30, 1, 0), workload, "cgroup")]
    xids = XidAttributor(lambda: processes, EventRecorder(core, "gpu-node-1"))
    (hit,) = xids.on_event(_xid(31, 1, gi=1))
    assert hit.workload.pod == "victim"
    assert xids.send_pending() == 1
    events = core.list_namespaced_event(kube_ns).items
    (event,) = [e for e in events if e.reason == EVENT_REASON]
    assert event.type == "Warning"
    assert event.involved_object.kind == "Pod"
    assert event.involved_object.name == "victim"
    assert event.involved_object.uid == pod.metadata.uid
    assert event.source.component == "nodeagent"
    assert event.source.host == "gpu-node-1"
    assert "XID 31" in event.message
    assert "MIG 3g.40gb instance 1" in event.message
