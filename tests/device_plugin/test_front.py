"""The Allocate front (device_plugin/front): the agent's answers, from Go, on the kubelet's socket.

Behind the front, the agent's own server still listens on a private socket; every answer the
front gives is compared with that server's answer to the same request, on the same devices in
the same state: the front must be a faster way to say exactly what the agent says.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from pathlib import Path
from typing import Any

import grpc
import pytest

from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from nodeagent.runtime.health_source import HealthState
from nodeagent.testing.waiting import wait_until

# These tests choose the front themselves: the agent-only run of each would be the same test.
pytestmark = pytest.mark.parametrize("run_plugin", ["front"], indirect=True)

TS4_STRICT = {"mode": "time-slicing", "replicas": 4, "fail_requests_greater_than_one": True}
# GPU 1 strict (a request of more than one replica is refused), GPU 2 not.
TIME_SLICING = {"1": TS4_STRICT, "2": {"mode": "time-slicing", "replicas": 3}}
ALL_STRATEGIES = ["envvar", "volume-mounts", "cdi-annotations", "cdi-cri", "cdi"]


def answer(stub: api_pb2_grpc.DevicePluginStub, containers: list[list[str]]) -> Any:
    """The response, or (status code, details) of the refusal."""
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )
    try:
        return stub.Allocate(request, timeout=5)
    except grpc.RpcError as exc:
        return (exc.code(), exc.details())


def requests(ids: list[str], rng: random.Random, count: int) -> list[list[list[str]]]:
    """Valid and invalid requests: subsets, unknown and duplicate IDs, IDs in two containers."""
    unknown = [f"GPU-unknown-{n}" for n in range(12)]
    made: list[list[list[str]]] = [[[]], [unknown], [ids[:1], ids[:1]], [ids[:2] + ids[:1]]]
    while len(made) < count:
        containers = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            picked = rng.sample(ids, rng.randint(1, min(4, len(ids))))
            if rng.random() < 0.1:
                picked.append(rng.choice(unknown))
            if rng.random() < 0.05:
                picked.append(picked[0])
            containers.append(picked)
        made.append(containers)
    return made


def stubs(plugin: Any, resource: str) -> tuple[Any, Any]:
    """The kubelet's stub (the front) and one to the agent's own server behind it."""
    link = plugin.manager.front
    assert link is not None, "the front is not serving"
    server = plugin.manager.servers[resource]
    upstream = link.upstream_dir / server.socket_path.name
    assert upstream.is_socket()
    channel = grpc.insecure_channel(f"unix://{upstream}")
    return plugin.kubelet.stub(resource), api_pb2_grpc.DevicePluginStub(channel)


def assert_same_answers(plugin: Any, resource: str, seed: int, count: int = 150) -> int:
    """Every request answered alike by the front and the agent; returns how many were refused."""
    front, agent = stubs(plugin, resource)
    ids = sorted(plugin.manager.servers[resource].service.advertised())
    refused = 0
    for containers in requests(ids, random.Random(seed), count):
        theirs, ours = answer(front, containers), answer(agent, containers)
        assert theirs == ours, f"{resource} {containers}:\nfront: {theirs}\nagent: {ours}"
        refused += isinstance(ours, tuple)
    return refused


@pytest.mark.parametrize(
    ("preset", "config", "mig"),
    [
        pytest.param("dgx-h100", {}, None, id="envvar"),
        pytest.param(
            "dgx-h100",
            {"device_plugin": {"device_list_strategy": ALL_STRATEGIES}},
            None,
            id="every-strategy",
        ),
        pytest.param(
            "dgx-h100", {"device_plugin": {"device_list_strategy": "cdi"}}, None, id="cdi"
        ),
        pytest.param(
            "t4", {"pools": {"default": {"gpu_sharing": TIME_SLICING}}}, None, id="time-slicing"
        ),
        pytest.param(
            "dgx-a100-80",
            {"device_plugin": {"mig_strategy": "mixed"}},
            {0: ["3g.40gb", "2g.20gb", "1g.10gb"], 1: ["7g.80gb"], 2: ["1g.10gb"] * 7},
            id="mig-mixed",
        ),
    ],
)
def test_the_front_answers_allocate_as_the_agent_does(
    run_plugin, front_program: Path, short_dir: Path, preset, config, mig
) -> None:
    dev = short_dir / "dev"
    dev.mkdir()
    (dev / "nvidia-uvm").touch()
    plugin_config = {**config}
    plugin_config["device_plugin"] = {
        **config.get("device_plugin", {}),
        "allocate_front": str(front_program),
        "pass_device_specs": True,
        "dev_root": str(dev),
    }
    plugin = run_plugin(preset, config=plugin_config, mig=mig)
    resources = sorted(plugin.manager.servers)
    assert resources
    for n, resource in enumerate(resources):
        assert assert_same_answers(plugin, resource, seed=n) > 0  # refusals are compared too
    # A GPU goes bad: the front takes the new table before the kubelet is told, and refuses
    # that GPU's devices with the agent's reason.
    resource = resources[0]
    sick = plugin.manager.servers[resource].service.resource.devices[0]
    plugin.health.set(sick.gpu_uuid, HealthState.LOST, "xid 79")
    plugin.kubelet.wait_devices(resource, lambda d: d.get(sick.id, ("",))[0] == "Unhealthy")
    front, _agent = stubs(plugin, resource)
    code, details = answer(front, [[sick.id]])
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert f"unhealthy devices: {sick.id} (" in details
    assert_same_answers(plugin, resource, seed=99, count=60)


def test_mps_devices_are_answered_as_the_agent_does(run_plugin, front_program, mps_binary) -> None:
    mps = {"mode": "mps", "replicas": 4}
    config = {
        "pools": {"default": {"gpu_sharing": {"1": mps, "2": mps}}},
        "device_plugin": {
            "allocate_front": str(front_program),
            "mps": {"control_binary": str(mps_binary), "check_interval_s": 0.1},
        },
    }
    plugin = run_plugin("a30x4", config=config)
    u = plugin.uuid(1)
    plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: d.get(f"{u}::0", ("",))[0] == "Healthy")
    # The MPS pipe and shared memory mounts come in the front's answer, and a container that
    # would reach two MPS daemons is refused, as by the agent.
    front, _agent = stubs(plugin, "nvidia.com/gpu")
    [resp] = answer(front, [[f"{u}::0"]]).container_responses
    assert "CUDA_MPS_PIPE_DIRECTORY" in resp.envs
    assert "/dev/shm" in [m.container_path for m in resp.mounts]
    code, details = answer(front, [[f"{u}::0", f"{plugin.uuid(2)}::0"]])
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "a container can reach only one MPS daemon" in details
    assert assert_same_answers(plugin, "nvidia.com/gpu", seed=7) > 0


def test_long_requests_are_answered_as_the_agent_does(run_plugin, front_program) -> None:
    # The front keeps short sets as slices and long ones as maps (allocate.go): requests of
    # replicas past that length, with and without a duplicate, across two containers.
    sharing = {"mode": "time-slicing", "replicas": 48}
    config = {
        "pools": {"default": {"gpu_sharing": {"0": sharing, "1": sharing}}},
        "device_plugin": {"allocate_front": str(front_program)},
    }
    plugin = run_plugin("dgx-h100", config=config)
    resource = "nvidia.com/gpu"
    plugin.kubelet.wait_devices(resource, lambda d: f"{plugin.uuid(1)}::47" in d)
    front, agent = stubs(plugin, resource)
    replicas = [f"{plugin.uuid(g)}::{r}" for g in (0, 1) for r in range(48)]
    for containers in (
        [replicas[:40]],
        [replicas],
        [[*replicas[:40], replicas[7]]],
        [replicas[:50], replicas[50:]],
        [replicas[:50], replicas[45:]],
        [[*replicas[:40], "GPU-unknown"]],
    ):
        theirs, ours = answer(front, containers), answer(agent, containers)
        assert theirs == ours, f"{[len(c) for c in containers]}:\nfront: {theirs}\nagent: {ours}"
    [resp] = answer(front, [replicas]).container_responses
    visible = resp.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert visible == [plugin.uuid(0), plugin.uuid(1)]  # each GPU once, in request order


def test_bytes_that_are_not_a_request_are_refused_and_the_front_keeps_answering(
    run_plugin, front_program: Path
) -> None:
    plugin = run_plugin(
        "dgx-h100", config={"device_plugin": {"allocate_front": str(front_program)}}
    )
    plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    socket = plugin.manager.servers["nvidia.com/gpu"].socket_path
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        allocate = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")
        for garbage in (b"\x0a\xff\xff\xff", b"\x0a\x03\x0a\x01", b"\x0a\x04\x0a\x02\xff\xfe"):
            with pytest.raises(grpc.RpcError) as info:
                allocate(garbage, timeout=5)
            assert info.value.code() is grpc.StatusCode.INTERNAL, garbage
            assert "error unmarshalling request" in info.value.details()
    front, agent = stubs(plugin, "nvidia.com/gpu")
    assert answer(front, [[plugin.uuid(0)]]) == answer(agent, [[plugin.uuid(0)]])


def test_every_other_call_reaches_the_agent_through_the_front(run_plugin, front_program) -> None:
    plugin = run_plugin(
        "dgx-h100", config={"device_plugin": {"allocate_front": str(front_program)}}
    )
    # The test kubelet registered and reads ListAndWatch through the front.
    devices = plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    assert {health for health, _numa in devices.values()} == {"Healthy"}
    front, agent = stubs(plugin, "nvidia.com/gpu")
    ids = sorted(devices)
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=n)
            for n in (2, 4)
        ]
    )
    assert front.GetPreferredAllocation(request, timeout=5) == agent.GetPreferredAllocation(
        request, timeout=5
    )
    options = front.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
    assert options.get_preferred_allocation_available
    assert not options.pre_start_required
    # The agent's refusals pass through with their status.
    bad = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=["GPU-nope"], allocation_size=1
            )
        ]
    )
    with pytest.raises(grpc.RpcError) as info:
        front.GetPreferredAllocation(bad, timeout=5)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown device ID(s): GPU-nope" in info.value.details()
    # Only the kubelet may talk to the socket, as without the front.
    socket = plugin.manager.servers["nvidia.com/gpu"].socket_path
    assert socket.stat().st_mode & 0o777 == 0o600


def test_a_front_that_dies_leaves_the_agent_serving(run_plugin, front_program, caplog) -> None:
    caplog.set_level(logging.INFO)
    plugin = run_plugin(
        "dgx-h100", config={"device_plugin": {"allocate_front": str(front_program)}}
    )
    plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    link = plugin.manager.front
    assert link is not None
    assert link.front.pid is not None
    registrations = plugin.manager.registration_count
    os.kill(link.front.pid, signal.SIGKILL)
    assert wait_until(lambda: plugin.manager.front is None, timeout_s=5)
    # The agent serves the socket itself and registers again; Allocate answers.
    assert wait_until(lambda: plugin.manager.registration_count > registrations, timeout_s=5)
    assert not link.upstream_dir.exists()
    uuid = plugin.uuid(0)

    def allocated() -> bool:
        got = answer(plugin.kubelet.stub("nvidia.com/gpu"), [[uuid]])
        return (
            not isinstance(got, tuple)
            and got.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuid
        )

    assert wait_until(allocated, timeout_s=5)
    assert "Allocate front out of service (it exited with status -9)" in caplog.text


def test_a_missing_front_program_is_one_error_and_the_agent_serves(
    run_plugin, short_dir: Path, caplog
) -> None:
    missing = short_dir / "no-such-front"
    plugin = run_plugin("t4", config={"device_plugin": {"allocate_front": str(missing)}})
    assert plugin.manager.front is None
    [resp] = plugin.kubelet.allocate("nvidia.com/gpu", [plugin.uuid(0)]).container_responses
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == plugin.uuid(0)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"Allocate front: {missing} is not an executable file; the agent answers Allocate itself"
    ]
