"""KEP-4680: the kubelet's DRAResourceHealth stream reports the devices the health model marks
unhealthy, as the slices taint them, and reports them healthy again after recovery."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nodeagent.gpu.node import GpuNode
from nodeagent.runtime.health_source import HealthState
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.testing.drakubelet import TestDraKubelet
from nodeagent.testing.health import ScriptedHealth
from nodeagent.testing.nodes import enable_mig
from nodeagent.testing.waiting import wait_until
from nodeagent_dra.component import DraComponent
from tests.dra.test_publisher import agent_config


def test_the_health_stream_follows_the_health_source(
    make_node: Callable[..., GpuNode], tmp_path: Path
) -> None:
    node = make_node("dgx-h100")
    enable_mig(node, {0: []})
    health = ScriptedHealth()
    component = DraComponent(
        agent_config(tmp_path, "node-h"), node, SnapshotStore(), health,
        mig_lock_file=tmp_path / "mig.lock",
    )  # fmt: skip
    component.refresh(node.snapshot())
    component.server.start()
    kubelet = TestDraKubelet(tmp_path / "registry")
    try:
        connection = kubelet.register()
        assert "v1alpha1.DRAResourceHealth" in connection.info.supported_versions
        connection.watch_health()
        assert wait_until(lambda: bool(connection.health), timeout_s=5)
        first = connection.health[-1]
        assert first[("node-h", "gpu-1")] == "HEALTHY"
        assert first[("node-h", "gpu-0-mig-1g10gb-19-0")] == "HEALTHY"
        health.set(node.info(1).uuid, HealthState.UNHEALTHY, "xid 79", index=1)
        component.refresh(node.snapshot())
        assert wait_until(
            lambda: connection.health[-1].get(("node-h", "gpu-1")) == "UNHEALTHY", timeout_s=5
        )
        assert connection.health[-1][("node-h", "gpu-0-mig-1g10gb-19-0")] == "HEALTHY"
        health.set(node.info(1).uuid, HealthState.HEALTHY, "recovered", index=1)
        component.refresh(node.snapshot())
        assert wait_until(
            lambda: connection.health[-1].get(("node-h", "gpu-1")) == "HEALTHY", timeout_s=5
        )
    finally:
        kubelet.close()
        component.server.stop()
