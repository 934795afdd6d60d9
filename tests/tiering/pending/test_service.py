"""The diagnosis in the service: Events rate-limited from their own state, metrics, history."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from nodeagent.agent.mig_planning import plan_for_diagnosis
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.nodes import pod_manifest
from nodeagent_tiering.cluster.cluster_api import Kube
from nodeagent_tiering.cluster.informer import NodeCache
from nodeagent_tiering.pending.events import COMPONENT, REPEAT_S, PodEvents
from nodeagent_tiering.pending.history import (
    CONFIG_MAP,
    DATA_KEY,
    MANAGED_BY,
    MAX_STEP_S,
    History,
    HistoryStore,
)
from nodeagent_tiering.pending.loop import PendingLoop
from nodeagent_tiering.pending.metrics import PendingMetrics
from nodeagent_tiering.pending.results import Diagnosis, Reason, Settings


def events_on(core: client.CoreV1Api, namespace: str, pod: str) -> list[Any]:
    listed = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod},source={COMPONENT}"
    )
    return sorted(listed.items, key=lambda e: e.first_timestamp)


def loop_for(plane: ControlPlane, namespace: str, clock: FakeClock) -> tuple[PendingLoop, Any]:
    kube = Kube(plane.api_client())
    registry = CollectorRegistry()
    loop = PendingLoop(
        kube,
        NodeCache(kube),
        Settings(),
        PendingMetrics(registry),
        plan_for_diagnosis,
        clock=clock,
        namespace=namespace,
        identity="replica-1",
        may_act=lambda: True,
    )
    loop.nodes.relist()
    loop.pods.relist()
    loop.workloads.relist()
    return loop, registry


def test_events_metrics_and_history_survive_a_restart(
    control_plane: ControlPlane, kube_ns: str, fragmented: str
) -> None:
    core = client.CoreV1Api(control_plane.api_client())
    clock = FakeClock()
    start = clock()
    loop, registry = loop_for(control_plane, kube_ns, clock)
    result = loop.pass_once()
    (mine,) = [d for d in result.diagnoses if d.namespace == kube_ns]
    assert mine.reason is Reason.CONTIGUITY_GPUS
    (event,) = events_on(core, kube_ns, fragmented)
    assert (event.reason, event.type, event.count) == ("GPUFragmentation", "Warning", 1)
    assert event.message.startswith("contiguity-gpus: needs 4 nvidia.com/gpu on one node")
    assert "Smallest change that unblocks it: move" in event.message
    assert event.involved_object.uid == core.read_namespaced_pod(fragmented, kube_ns).metadata.uid
    tier = mine.tier
    sample = registry.get_sample_value
    labels = {"reason": "contiguity-gpus", "tier": tier}
    assert sample("nodeagent_tiering_pending_gpu_workloads", labels) >= 1
    assert sample("nodeagent_tiering_pending_events_total", {"reason": "GPUFragmentation"}) >= 1

    clock.advance(60)
    loop.pass_once()
    assert [e.count for e in events_on(core, kube_ns, fragmented)] == [1]  # within 10 minutes

    # A restart: the new replica reads its Events back; nothing is repeated, the age goes on.
    clock.advance(100)
    again, registry = loop_for(control_plane, kube_ns, clock)
    again.pass_once()
    assert [e.count for e in events_on(core, kube_ns, fragmented)] == [1]
    longest = registry.get_sample_value("nodeagent_tiering_pending_longest_seconds", labels)
    assert longest is not None
    assert longest >= 160 - 1  # since the first Event (second resolution)

    clock.advance(REPEAT_S)
    again.pass_once()
    assert [e.count for e in events_on(core, kube_ns, fragmented)] == [2]  # the series, once more

    # The history lives in a ConfigMap the service owns.
    stored = core.read_namespaced_config_map(CONFIG_MAP, kube_ns)
    assert stored.metadata.labels == MANAGED_BY
    history = History.from_text(stored.data[DATA_KEY])
    (day,) = history.days.values()
    assert day.peak["contiguity-gpus"] >= 1
    # The first replica saved at its first pass only (then every 5 minutes); the new one counts
    # its passes, each for at most MAX_STEP_S, so 10 quiet minutes are not invented.
    assert day.observed_s == MAX_STEP_S
    assert clock() - start > MAX_STEP_S


def test_a_reason_change_is_a_new_event_and_a_dry_run_writes_none(
    control_plane: ControlPlane, kube_ns: str
) -> None:
    core = client.CoreV1Api(control_plane.api_client())
    kube = Kube(control_plane.api_client())
    pod = core.create_namespaced_pod(kube_ns, pod_manifest("p", gpus=1))
    uid = pod.metadata.uid

    def diag(reason: Reason) -> Diagnosis:
        return Diagnosis(kube_ns, "p", uid, {"nvidia.com/gpu": 1}, reason, "evidence")

    events = PodEvents(kube)
    t = 1_800_000_000.0
    assert [w for w, _ in events.observe([diag(Reason.CONTIGUITY_GPUS)], t)] == ["created"]
    assert events.observe([diag(Reason.CONTIGUITY_GPUS)], t + 5) == []
    assert [w for w, _ in events.observe([diag(Reason.CAPACITY)], t + 10)] == ["created"]
    assert [e.reason for e in events_on(core, kube_ns, "p")] == ["GPUFragmentation", "GPUCapacity"]
    restarted = PodEvents(kube)
    restarted.seed()
    assert restarted.observe([diag(Reason.CAPACITY)], t + 20) == []
    assert restarted.since(diag(Reason.CAPACITY)) == t + 10
    dry = PodEvents(None)
    assert [w for w, _ in dry.observe([diag(Reason.QUOTA)], t + 30)] == ["created"]
    assert len(events_on(core, kube_ns, "p")) == 2


def test_history_store_round_trip(control_plane: ControlPlane, kube_ns: str) -> None:
    kube = Kube(control_plane.api_client())
    store = HistoryStore(kube, kube_ns)
    assert store.load().days == {}
    history = History()
    history.days["2026-12-01"] = History.from_text(
        '{"version": 1, "days": {"2026-12-01": {"observed_s": 60, "pending": {"tier": 120}}}}'
    ).days["2026-12-01"]
    store.save(history, 0.0)
    store.save(history, 1.0)  # a replace of what it wrote
    assert HistoryStore(kube, kube_ns).load().days["2026-12-01"].pending == {"tier": 120.0}
