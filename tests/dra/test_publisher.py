"""The agent publishes its node's ResourceSlices on layout and health change only, pool
generation bumped, health as device taints that go after the health model's quiet period."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from nodeagent.agent import wiring
from nodeagent.config.schema import AgentConfig, load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import EventKind, GpuEvent, Placement
from nodeagent.health.model import HealthModel
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.nodes import enable_mig
from nodeagent.testing.waiting import wait_until
from nodeagent_dra.component import DraComponent

QUIET_S = 120.0


def agent_config(
    tmp_path: Path, node_name: str, mps_dir: Path | None = None, **dra: Any
) -> AgentConfig:
    """The agent config of the DRA tests; ``mps_dir``: the MPS root and stand-in binary."""
    if mps_dir is not None:
        dra["mps_root"] = str(mps_dir / "mps")
    mps = {"control_binary": str(mps_dir / "nvidia-cuda-mps-control")} if mps_dir else {}
    return load_agent_config(
        None,
        environ={},
        overrides={
            "device_plugin": {"mps": {**mps, "check_interval_s": 0.1}},
            "node": {"name": node_name},
            "state_dir": str(tmp_path / "state"),
            "dra": {
                "enabled": True,
                "registry_dir": str(tmp_path / "registry"),
                "plugin_dir": str(tmp_path / "plugins"),
                "cdi_spec_dir": str(tmp_path / "cdi"),
                **dra,
            },
            "health": {"recovery_quiet_s": QUIET_S, "fatal_hold_s": QUIET_S},
            "pools": {"default": {"dra": {"dynamic_mig": True}}},
        },
    )


def stored(api: Any, node_name: str) -> list[Any]:
    return api.list_resource_slice(field_selector=f"spec.nodeName={node_name}").items


def generations(api: Any, node_name: str) -> set[int]:
    return {s.spec.pool.generation for s in stored(api, node_name)}


@pytest.fixture
def node(make_node: Callable[..., GpuNode]) -> GpuNode:
    n = make_node("dgx-h100")
    enable_mig(n, {0: [], 1: []})
    return n


def test_slices_change_only_with_layout_or_health(
    control_plane: Any, node: GpuNode, tmp_path: Path
) -> None:
    name = f"dra-pub-{uuid.uuid4().hex[:6]}"
    config = agent_config(tmp_path, name)
    clock = FakeClock()
    model = HealthModel(config.health, clock=clock)
    store = SnapshotStore()
    api_client = control_plane.api_client()
    component = DraComponent(
        config, node, store, model, mig_lock_file=tmp_path / "mig.lock", api_client=api_client
    )
    api = client.ResourceV1Api(api_client)
    publisher = component.publisher
    assert publisher is not None
    snapshot = node.snapshot()
    model.on_snapshot(snapshot)
    assert component.refresh(snapshot)
    first = stored(api, name)
    assert generations(api, name) == {1}
    assert {s.spec.pool.resource_slice_count for s in first} == {len(first)}
    writes = publisher.writes
    # A new sample of the same layout (telemetry moved): nothing is sent.
    later = node.snapshot()
    model.on_snapshot(later)
    assert not component.refresh(later)
    assert publisher.writes == writes
    # A layout change: a new generation on every slice.
    node.create_gpu_instance(1, "1g.10gb", Placement(0, 1))
    assert component.refresh(node.snapshot())
    assert generations(api, name) == {2}
    static = [d.name for s in stored(api, name) for d in (s.spec.devices or [])]
    assert "gpu-1-mig-1g10gb-19-0" in static
    # Health: an XID on GPU 0 taints its devices, the taint stays through the quiet period.
    uuid0 = snapshot.gpus[0].info.uuid
    model.on_event(GpuEvent(EventKind.XID, 0, uuid0, 79, None, None, clock()))
    assert component.refresh(node.snapshot())
    assert generations(api, name) == {3}

    def taints() -> dict[str, list[str]]:
        return {
            d.name: [t.key for t in (d.taints or [])]
            for s in stored(api, name)
            for d in (s.spec.devices or [])
            if d.name.startswith("gpu-0")
        }

    assert taints()
    assert all(keys == ["gpu.nodeagent.io/unhealthy"] for keys in taints().values())
    clock.advance(QUIET_S - 5)
    model.on_snapshot(node.snapshot())
    assert not component.refresh(node.snapshot()), "still within the quiet period"
    clock.advance(10)
    model.on_snapshot(node.snapshot())
    assert component.refresh(node.snapshot())
    assert all(keys == [] for keys in taints().values()), "recovered after the quiet period"
    assert generations(api, name) == {4}
    # The kubelet wipes the node's slices at its start: the resync publishes them again.
    assert not component.resync()
    api.delete_collection_resource_slice(field_selector=f"spec.nodeName={name}")
    assert component.resync()
    assert generations(api, name) == {5}
    # A restarted agent continues from the stored generation.
    again = DraComponent(
        config, node, store, model, mig_lock_file=tmp_path / "mig.lock", api_client=api_client
    )
    node.create_gpu_instance(1, "1g.10gb", Placement(1, 1))
    assert again.refresh(node.snapshot())
    assert generations(api, name) == {6}
    assert again.publisher is not None
    again.publisher.withdraw()
    assert stored(api, name) == []


def test_the_agent_wires_the_dra_component_and_it_serves_and_publishes(
    control_plane: Any, node: GpuNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"dra-wire-{uuid.uuid4().hex[:6]}"
    config = agent_config(tmp_path, name)
    store = SnapshotStore()
    wired = wiring.build(
        config,
        node,
        store,
        restarts={},
        ready=lambda: True,
        alive=lambda: True,
        mig_lock_file=tmp_path / "mig.lock",
    )
    (component,) = [c for c in wired.components if c.name == "dra"]
    assert isinstance(component, DraComponent)
    assert component.driver.mig_lock.path == tmp_path / "mig.lock"
    # One node-wide MIG lock: the reconciler (on by default) takes the same file.
    (reconciler,) = [c for c in wired.components if c.name == "mig-reconciler"]
    assert reconciler._lock.path == tmp_path / "mig.lock"
    # Point it at the test API server and run it.
    component.publisher = component.publisher or _publisher(control_plane, name)
    stop = threading.Event()
    thread = threading.Thread(target=component.run, args=(stop,), daemon=True)
    thread.start()
    try:
        store.publish(node.snapshot())
        assert wait_until(lambda: component.ready, timeout_s=10)
        api = client.ResourceV1Api(control_plane.api_client())
        assert wait_until(lambda: bool(stored(api, name)), timeout_s=10)
        assert (tmp_path / "registry" / "gpu.nodeagent.io-reg.sock").exists()
    finally:
        stop.set()
        component.wake.set()
        thread.join(10)
    assert not (tmp_path / "registry" / "gpu.nodeagent.io-reg.sock").exists()
    client.ResourceV1Api(control_plane.api_client()).delete_collection_resource_slice(
        field_selector=f"spec.nodeName={name}"
    )


def _publisher(control_plane: Any, name: str) -> Any:
    from nodeagent_dra.resource_api import SlicePublisher

    return SlicePublisher(control_plane.api_client(), name, "gpu.nodeagent.io")
