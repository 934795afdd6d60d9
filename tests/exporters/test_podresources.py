"""Pod attribution against a test pod-resources gRPC server on a unix socket."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from nodeagent.kubelet.podresources.v1 import api_pb2_grpc
from nodeagent.testing.podresources import FakeKubelet
from nodeagent_exporters.podresources import MIN_INTERVAL_S, PodResourcesPoller, strip_replica


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[FakeKubelet, Path]]:
    socket = tmp_path / "kubelet.sock"
    servicer = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    yield servicer, socket
    server.stop(None)


@pytest.mark.parametrize(
    ("device_id", "stripped"),
    [
        pytest.param("GPU-abc", "GPU-abc", id="plain"),
        pytest.param("GPU-abc::3", "GPU-abc", id="replica"),
        pytest.param("MIG-abc::12", "MIG-abc", id="mig replica"),
        pytest.param("weird::x", "weird::x", id="non-numeric suffix kept"),
    ],
)
def test_strip_replica(device_id: str, stripped: str) -> None:
    assert strip_replica(device_id) == stripped


def test_poll_counts_and_attributes_with_replicas(kubelet: tuple[FakeKubelet, Path]) -> None:
    servicer, socket = kubelet
    servicer.allocatable = {
        "nvidia.com/gpu": ["GPU-a::0", "GPU-a::1", "GPU-b::0", "GPU-b::1"],
        "cpu": ["0", "1"],
    }
    servicer.pods = [
        ("train", "ml", "main", "nvidia.com/gpu", ["GPU-a::0", "GPU-a::1"]),
        ("infer", "web", "srv", "nvidia.com/gpu", ["GPU-b::1"]),
        ("infer", "web", "srv", "example.com/fpga", ["F-1"]),
    ]
    alloc = PodResourcesPoller(socket, 5.0, clock=lambda: 123.0).poll()
    assert alloc is not None
    assert alloc.ok
    assert alloc.advertised == {"nvidia.com/gpu": 4}
    assert alloc.allocated == {"nvidia.com/gpu": 3}
    held = {(d.pod, d.uuid): d.count for d in alloc.pod_devices}
    assert held == {("train", "GPU-a"): 2, ("infer", "GPU-b"): 1}


def test_old_kubelet_without_allocatable(kubelet: tuple[FakeKubelet, Path]) -> None:
    servicer, socket = kubelet
    servicer.allocatable_unimplemented = True
    servicer.pods = [("p", "n", "c", "nvidia.com/mig-1g.10gb", ["MIG-x"])]
    alloc = PodResourcesPoller(socket, 5.0).poll()
    assert alloc is not None
    assert alloc.ok
    assert alloc.advertised == {}
    assert alloc.allocated == {"nvidia.com/mig-1g.10gb": 1}


def test_failure_keeps_last_attribution_then_recovers(kubelet: tuple[FakeKubelet, Path]) -> None:
    servicer, socket = kubelet
    servicer.pods = [("p", "n", "c", "nvidia.com/gpu", ["GPU-a"])]
    poller = PodResourcesPoller(socket, 5.0)
    first = poller.poll()
    assert first is not None
    assert first.ok
    assert [(d.pod, d.uuid) for d in first.pod_devices] == [("p", "GPU-a")]
    servicer.fail = True
    failed = poller.poll()
    assert failed is not None
    assert not failed.ok
    assert failed.known  # stale, but from a real answer
    assert failed.pod_devices == first.pod_devices
    servicer.fail = False
    servicer.pods = []
    recovered = poller.poll()
    assert recovered is not None
    assert recovered.ok
    assert recovered.pod_devices == ()


def test_missing_socket_is_reported_not_raised(tmp_path: Path) -> None:
    alloc = PodResourcesPoller(tmp_path / "absent.sock", 5.0).poll()
    assert alloc is not None
    assert not alloc.ok
    assert not alloc.known  # never answered: allocations are unknown, not zero


def test_interval_has_a_floor(tmp_path: Path) -> None:
    assert PodResourcesPoller(tmp_path / "s", 0.01).interval_s == MIN_INTERVAL_S
