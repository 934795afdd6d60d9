"""Serving, registration and kubelet restarts, through real unix sockets."""

from __future__ import annotations

import itertools
import stat
import time

import grpc
import pytest

from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2


def test_registers_every_resource_and_advertises_gpus_with_numa(run_plugin) -> None:
    plugin = run_plugin("dgx-h100")
    devices = plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    assert devices == {g.info.uuid: ("Healthy", [g.info.numa_node]) for g in plugin.snapshot.gpus}
    [request] = plugin.kubelet.registrations
    assert request.version == "v1beta1"
    assert request.endpoint == "nodeagent-gpu.sock"
    assert request.options.get_preferred_allocation_available
    assert not request.options.pre_start_required
    mode = (plugin.directory / request.endpoint).stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def test_sockets_are_removed_on_shutdown(run_plugin) -> None:
    plugin = run_plugin(
        "pcie-h100nvl", mig={0: ["3g.47gb"]}, config={"device_plugin": {"mig_strategy": "mixed"}}
    )
    assert plugin.kubelet.wait(lambda: len(plugin.kubelet.plugins) == 2), plugin.kubelet.plugins
    assert sorted(p.name for p in plugin.directory.glob("nodeagent-*.sock")) == [
        "nodeagent-gpu.sock",
        "nodeagent-mig-3g.47gb.sock",
    ]
    plugin.manager.shutdown()
    assert list(plugin.directory.glob("nodeagent-*.sock")) == []


def test_kubelet_restart_twenty_times_in_a_row(run_plugin) -> None:
    plugin = run_plugin("dgx-h100")
    kubelet = plugin.kubelet
    kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    for round_ in range(20):
        before = len(kubelet.registrations)
        started = time.monotonic()
        kubelet.restart()
        assert kubelet.wait(lambda n=before: len(kubelet.registrations) > n, 1.0), round_
        devices = kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8, 1.0)
        assert time.monotonic() - started < 1.0, round_
        assert all(h == "Healthy" for h, _ in devices.values())
    assert plugin.manager.registered


def test_registration_is_retried_with_backoff_until_the_kubelet_accepts(run_plugin) -> None:
    plugin = run_plugin("t4", start_kubelet=False)
    kubelet = plugin.kubelet
    refusals = []

    def reject(request: api_pb2.RegisterRequest) -> str | None:
        refusals.append(time.monotonic())
        return "not yet" if len(refusals) < 3 else None

    kubelet.reject = reject
    kubelet.start()
    kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 1, 5.0)
    state = plugin.manager.registrations["nvidia.com/gpu"]
    assert state.registered
    assert state.failures >= 2
    gaps = [b - a for a, b in itertools.pairwise(refusals)]
    assert gaps[1] > gaps[0] * 1.5  # the delay doubles between attempts


def test_lost_socket_is_served_again_without_a_kubelet_restart(run_plugin) -> None:
    plugin = run_plugin("t4")
    plugin.kubelet.wait_devices("nvidia.com/gpu")
    (plugin.directory / "nodeagent-gpu.sock").unlink()
    assert plugin.kubelet.wait(lambda: len(plugin.kubelet.registrations) == 2, 1.0)
    plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 1)
    assert (plugin.directory / "nodeagent-gpu.sock").exists()


def test_unknown_rpc_target_is_refused_cleanly(run_plugin) -> None:
    plugin = run_plugin("t4")
    with pytest.raises(grpc.RpcError) as info:
        plugin.kubelet.allocate("nvidia.com/gpu", [])
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
