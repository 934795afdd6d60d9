"""The exporter next to the real device plugin: advertised capacity without pod-resources.

A live agent on a host whose kubelet has no pod-resources socket (or no kubelet at all) still
knows what its own device plugin advertises; the metrics must say so, and must say that
allocations are unknown rather than zero.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.agent.sampler import Sampler
from nodeagent.config.schema import SamplerSection
from nodeagent.gpu.node import GpuNode
from nodeagent.runtime.health_source import HealthState
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.testing.health import ScriptedHealth
from nodeagent.testing.kubelet import TestKubelet
from nodeagent.testing.waiting import wait_until
from nodeagent_device_plugin import component as device_plugin_component
from nodeagent_exporters import component as exporters_component
from nodeagent_exporters.component import MetricsExporter
from tests.device_plugin.conftest import make_config
from tests.exporters.exporter_factories import Samples, parse_samples, value
from tests.exporters.test_server import get

GPU = "nvidia.com/gpu"


@pytest.mark.parametrize("with_kubelet", [True, False], ids=["test kubelet", "no kubelet"])
def test_advertised_comes_from_the_plugin_without_pod_resources(
    make_node: Callable[..., GpuNode], short_dir: Path, with_kubelet: bool
) -> None:
    node = make_node("dgx-h100")
    config = make_config(
        {
            "device_plugin": {"kubelet_dir": str(short_dir / "kubelet")},
            "metrics": {
                "address": "127.0.0.1:0",
                # Pod attribution on, but the kubelet serves no pod-resources socket.
                "pod_resources_socket": str(short_dir / "pod-resources" / "kubelet.sock"),
            },
            "pools": {"default": {"gpu_sharing": {"3": {"mode": "time-slicing", "replicas": 4}}}},
        }
    )
    snapshots = SnapshotStore()
    health = ScriptedHealth()
    # The wiring's order: the device plugin first, then the exporter reading what it advertises.
    plugin = device_plugin_component.build(config, snapshots, health)
    assert plugin is not None
    exporter = exporters_component.build(config, snapshots, health=health, devices=plugin)
    assert isinstance(exporter, MetricsExporter)
    kubelet = TestKubelet(short_dir / "kubelet")
    if with_kubelet:
        kubelet.start()
    sampler = Sampler(node, snapshots, SamplerSection(interval_s=1.0))
    stop = threading.Event()
    threads = [
        threading.Thread(target=c.run, args=(stop,), daemon=True) for c in (plugin, exporter)
    ]
    for thread in threads:
        thread.start()

    def scrape() -> Samples:
        assert exporter.server is not None
        return parse_samples(get(exporter.server.port, "/metrics")[2].decode())

    def rendered(name: str, want: float) -> Samples:
        """Sample until a render shows ``name`` at ``want`` (health moves between samples)."""
        seen: list[Samples] = []

        def check() -> bool:
            sampler.sample_once()
            wait_until(lambda: exporter.latest is not None, 1.0)
            seen.append(scrape())
            return value(seen[-1], name, resource=GPU) == want

        assert wait_until(check), seen[-1] if seen else "no scrape"
        return seen[-1]

    try:
        uuid3 = node.snapshot().gpus[3].info.uuid
        replicas = {f"{uuid3}::{n}" for n in range(4)}
        # 7 whole GPUs and 4 replicas of GPU 3.
        samples = rendered("nodeagent_device_plugin_devices_advertised", 11.0)
        assert value(samples, "nodeagent_device_plugin_devices_unhealthy", resource=GPU) == 0.0
        # Allocations are unknown: no allocated series, and the failed poll says why.
        assert value(samples, "nodeagent_device_plugin_devices_allocated", resource=GPU) is None
        assert value(samples, "nodeagent_pod_resources_up") == 0.0
        assert value(samples, "nodeagent_pod_resources_age_seconds") is None
        if with_kubelet:
            listed = kubelet.wait_devices(GPU, lambda d: len(d) == 11)
            assert replicas <= set(listed)  # the metric counts what the kubelet is sent

        health.set(uuid3, HealthState.UNHEALTHY, "xid 79", index=3)
        samples = rendered("nodeagent_device_plugin_devices_unhealthy", 4.0)
        assert value(samples, "nodeagent_device_plugin_devices_advertised", resource=GPU) == 11.0
        if with_kubelet:
            listed = kubelet.wait_devices(
                GPU, lambda d: all(d.get(r, ("?",))[0] == "Unhealthy" for r in replicas)
            )
            assert sum(h == "Unhealthy" for h, _ in listed.values()) == 4
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        kubelet.stop()
    assert plugin.advertised() == {}  # stopped: nothing advertised any more
