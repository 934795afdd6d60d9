"""Reload: only changed resources are re-served; vanished ones go to zero before stopping."""

from __future__ import annotations

from tests.device_plugin.conftest import make_config


def _shared(replicas):
    return {"mode": "time-slicing", "replicas": replicas, "rename_shared": True}


def _config(gpu_sharing):
    return make_config({"pools": {"default": {"gpu_sharing": gpu_sharing}}})


def test_only_the_changed_resource_is_served_again(run_plugin) -> None:
    plugin = run_plugin(
        "pcie-l40s", config={"pools": {"default": {"gpu_sharing": {"3": _shared(4)}}}}
    )
    kubelet = plugin.kubelet
    kubelet.wait_devices("nvidia.com/gpu.shared", lambda d: len(d) == 4)
    kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 7)
    whole = plugin.manager.servers["nvidia.com/gpu"].service
    registered = [r.resource_name for r in kubelet.registrations]
    config = _config({"3": _shared(2)})
    plugin.manager.apply(plugin.snapshot, config.pool, config.device_plugin)
    kubelet.wait_devices("nvidia.com/gpu.shared", lambda d: len(d) == 2)
    new = [r.resource_name for r in kubelet.registrations][len(registered) :]
    assert new == ["nvidia.com/gpu.shared"]
    assert plugin.manager.servers["nvidia.com/gpu"].service is whole
    assert whole.streams_opened == 1  # the kubelet's stream was never interrupted
    # Re-registered on the same socket only once the kubelet saw the old stream end: kubelet
    # 1.37 refuses it before that, and then never lets that socket register again.
    assert kubelet.refused == []


def test_vanished_resource_is_advertised_empty_before_it_stops(run_plugin) -> None:
    plugin = run_plugin(
        "pcie-l40s", config={"pools": {"default": {"gpu_sharing": {"3": _shared(4)}}}}
    )
    kubelet = plugin.kubelet
    kubelet.wait_devices("nvidia.com/gpu.shared", lambda d: len(d) == 4)
    socket = plugin.directory / "nodeagent-gpu.shared.sock"
    assert socket.exists()
    config = _config({})
    plugin.manager.apply(plugin.snapshot, config.pool, config.device_plugin)
    assert not socket.exists()
    # Zero before the stop: the server is gone, yet the empty list it sent last still reaches
    # the kubelet (its stream thread may read it a moment after apply returns).
    view = kubelet.plugins["nvidia.com/gpu.shared"]
    assert kubelet.wait(lambda: view.devices == {}), view.lists[-1]
    kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    assert "nvidia.com/gpu.shared" not in plugin.manager.servers


def test_mig_layout_change_swaps_resources(run_plugin) -> None:
    from nodeagent.testing.nodes import enable_mig

    plugin = run_plugin("a30x4", config={"device_plugin": {"mig_strategy": "mixed"}})
    kubelet = plugin.kubelet
    kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 4)
    enable_mig(plugin.node, {2: ["1g.6gb"] * 4})
    config = make_config({"device_plugin": {"mig_strategy": "mixed"}})
    plugin.manager.apply(plugin.node.snapshot(), config.pool, config.device_plugin)
    kubelet.wait_devices("nvidia.com/mig-1g.6gb", lambda d: len(d) == 4)
    kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 3)
    assert kubelet.refused == [], "re-registered while the kubelet held the old stream"
