"""The test kubelet reports a Node's capacity and allocatable as the real kubelet 1.37 does
(tests/real_kubelet shows the real one): allocatable counts Healthy devices, and when the
plugin's ListAndWatch stream ends allocatable drops to 0 while capacity keeps its count."""

from __future__ import annotations

from nodeagent.runtime.health_source import HealthState

GPU = "nvidia.com/gpu"


def test_an_unhealthy_device_lowers_allocatable_and_keeps_capacity(run_plugin) -> None:
    plugin = run_plugin("dgx-h100")
    kubelet = plugin.kubelet
    kubelet.wait_devices(GPU, lambda d: len(d) == 8)
    assert (kubelet.capacity(GPU), kubelet.allocatable(GPU)) == (8, 8)
    plugin.health.set(plugin.uuid(3), HealthState.UNHEALTHY, "xid 79", index=3)
    kubelet.wait_devices(GPU, lambda d: d[plugin.uuid(3)][0] == "Unhealthy")
    assert (kubelet.capacity(GPU), kubelet.allocatable(GPU)) == (8, 7)


def test_when_the_plugins_stream_ends_allocatable_is_zero_and_capacity_stays(run_plugin) -> None:
    plugin = run_plugin("dgx-h100")
    kubelet = plugin.kubelet
    kubelet.wait_devices(GPU, lambda d: len(d) == 8)
    plugin.manager.shutdown()
    assert kubelet.wait(lambda: kubelet.allocatable(GPU) == 0), "allocatable after the stream"
    assert kubelet.capacity(GPU) == 8
    assert kubelet.plugins[GPU].ended
