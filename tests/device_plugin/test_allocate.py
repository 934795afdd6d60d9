"""Allocate through the socket: every device list strategy, bad requests, concurrency."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from nodeagent.runtime.health_source import HealthState
from nodeagent.testing.waiting import wait_until

TS2 = {"mode": "time-slicing", "replicas": 2}


@pytest.mark.parametrize(
    ("strategy", "envs", "mounts", "cdi", "annotated"),
    [
        pytest.param("envvar", {"NVIDIA_VISIBLE_DEVICES": "{a},{b}"}, [], [], False, id="envvar"),
        pytest.param(
            "volume-mounts",
            {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
            ["/var/run/nvidia-container-devices/{a}", "/var/run/nvidia-container-devices/{b}"],
            [],
            False,
            id="volume-mounts",
        ),
        pytest.param(
            "cdi-cri",
            {},
            [],
            ["k8s.device-plugin.nvidia.com/gpu={a}", "k8s.device-plugin.nvidia.com/gpu={b}"],
            False,
            id="cdi-cri",
        ),
        pytest.param("cdi-annotations", {}, [], [], True, id="cdi-annotations"),
    ],
)
def test_device_list_strategies(run_plugin, strategy, envs, mounts, cdi, annotated) -> None:
    plugin = run_plugin("dgx-h100", config={"device_plugin": {"device_list_strategy": strategy}})
    a, b = plugin.uuid(0), plugin.uuid(1)
    [resp] = plugin.kubelet.allocate("nvidia.com/gpu", [a, b]).container_responses
    fill = {"a": a, "b": b}
    assert dict(resp.envs) == {k: v.format(**fill) for k, v in envs.items()}
    assert [m.container_path for m in resp.mounts] == [m.format(**fill) for m in mounts]
    assert all(m.host_path == "/dev/null" and m.read_only for m in resp.mounts)
    assert [d.name for d in resp.cdi_devices] == [c.format(**fill) for c in cdi]
    if annotated:
        [(key, value)] = resp.annotations.items()
        assert key.startswith("cdi.k8s.io/nodeagent-device-plugin_")
        assert value == f"k8s.device-plugin.nvidia.com/gpu={a},k8s.device-plugin.nvidia.com/gpu={b}"
    else:
        assert not resp.annotations


def test_replicas_name_their_gpu_once_and_device_specs_are_passed(run_plugin, short_dir) -> None:
    dev = short_dir / "dev"
    dev.mkdir()
    (dev / "nvidia-uvm").touch()
    plugin = run_plugin(
        "t4",
        config={
            "pools": {"default": {"sharing": {"mode": "time-slicing", "replicas": 4}}},
            "device_plugin": {"pass_device_specs": True, "dev_root": str(dev)},
        },
    )
    u = plugin.uuid(0)
    [resp] = plugin.kubelet.allocate("nvidia.com/gpu", [f"{u}::0", f"{u}::3"]).container_responses
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == u
    assert [(d.container_path, d.permissions) for d in resp.devices] == [
        ("/dev/nvidia0", "rw"),
        ("/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "rw"),
    ]


@pytest.mark.parametrize(
    ("ids", "code", "words"),
    [
        pytest.param(
            ["GPU-nope"], grpc.StatusCode.INVALID_ARGUMENT, ["unknown", "GPU-nope"], id="unknown"
        ),
        pytest.param(
            ["{u0}", "{u0}"],
            grpc.StatusCode.INVALID_ARGUMENT,
            ["duplicate", "{u0}"],
            id="duplicate",
        ),
        pytest.param(
            ["{u1}"],
            grpc.StatusCode.FAILED_PRECONDITION,
            ["unhealthy", "{u1}", "xid 79"],
            id="unhealthy",
        ),
        pytest.param(
            ["{u2}::0", "{u2}::1"],
            grpc.StatusCode.INVALID_ARGUMENT,
            ["too large", "maximum request size for shared resources is 1", "{u2}::0"],
            id="oversize-shared",
        ),
    ],
)
def test_bad_requests_are_refused_naming_ids_and_reason(run_plugin, ids, code, words) -> None:
    strict = {**TS2, "fail_requests_greater_than_one": True}
    plugin = run_plugin("dgx-h100", config={"pools": {"default": {"gpu_sharing": {"2": strict}}}})
    fill = {f"u{i}": plugin.uuid(i) for i in range(3)}
    plugin.health.set(plugin.uuid(1), HealthState.LOST, "xid 79")
    with pytest.raises(grpc.RpcError) as info:
        plugin.kubelet.allocate("nvidia.com/gpu", [i.format(**fill) for i in ids])
    assert info.value.code() is code
    for word in words:
        assert word.format(**fill) in info.value.details()


def test_one_replica_of_a_strict_gpu_is_fine(run_plugin) -> None:
    strict = {**TS2, "fail_requests_greater_than_one": True}
    plugin = run_plugin("t4", config={"pools": {"default": {"sharing": strict}}})
    [resp] = plugin.kubelet.allocate("nvidia.com/gpu", [f"{plugin.uuid(0)}::1"]).container_responses
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == plugin.uuid(0)


def test_several_containers_in_one_request(run_plugin) -> None:
    plugin = run_plugin("dgx-h100")
    resp = plugin.kubelet.allocate("nvidia.com/gpu", [plugin.uuid(0)], [plugin.uuid(5)])
    assert [r.envs["NVIDIA_VISIBLE_DEVICES"] for r in resp.container_responses] == [
        plugin.uuid(0),
        plugin.uuid(5),
    ]


def test_concurrent_allocate_calls_all_answer_correctly(run_plugin) -> None:
    plugin = run_plugin(
        "dgx-h100",
        config={"pools": {"default": {"sharing": {"mode": "time-slicing", "replicas": 8}}}},
    )
    plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 64)
    ids = [f"{plugin.uuid(i % 8)}::{i // 8}" for i in range(64)]

    def call(device_id: str) -> str:
        [resp] = plugin.kubelet.allocate("nvidia.com/gpu", [device_id]).container_responses
        return resp.envs["NVIDIA_VISIBLE_DEVICES"]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, ids))
    assert results == [i.split("::")[0] for i in ids]


def test_one_exclusive_gpu_in_two_containers_is_refused(run_plugin) -> None:
    plugin = run_plugin("dgx-h100")
    gpu = plugin.uuid(3)
    with pytest.raises(grpc.RpcError) as info:
        plugin.kubelet.allocate("nvidia.com/gpu", [gpu], [plugin.uuid(4), gpu])
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert gpu in info.value.details()
    assert "more than one container" in info.value.details()


def test_two_replicas_of_one_gpu_in_two_containers_are_fine(run_plugin) -> None:
    plugin = run_plugin("t4", config={"pools": {"default": {"sharing": TS2}}})
    gpu = plugin.uuid(0)
    resp = plugin.kubelet.allocate("nvidia.com/gpu", [f"{gpu}::0"], [f"{gpu}::1"])
    assert len(resp.container_responses) == 2
    with pytest.raises(grpc.RpcError) as info:
        plugin.kubelet.allocate("nvidia.com/gpu", [f"{gpu}::0"], [f"{gpu}::0"])
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("call", ["allocate", "preferred"])
def test_a_flood_of_unknown_ids_gets_a_short_answer_and_a_short_log_line(
    run_plugin, caplog, call: str
) -> None:
    plugin = run_plugin("t4")
    ids = [f"x{i}" for i in range(100_000)]
    calls = {
        "allocate": lambda: plugin.kubelet.allocate("nvidia.com/gpu", ids),
        "preferred": lambda: plugin.kubelet.preferred("nvidia.com/gpu", ids, 1),
    }
    with (
        caplog.at_level("WARNING", logger="nodeagent_device_plugin"),
        pytest.raises(grpc.RpcError) as info,
    ):
        calls[call]()
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # not RESOURCE_EXHAUSTED
    details = info.value.details()
    assert len(details) < 1000
    assert "100000 unknown" in details
    assert "x0, x1" in details
    assert "(and 99990 more)" in details
    # The front's refusals reach the agent's log through a thread that reads its stderr.
    assert wait_until(lambda: bool(caplog.records))
    assert max(len(r.getMessage()) for r in caplog.records) < 1000
