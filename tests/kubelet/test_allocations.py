"""What the kubelet says containers hold: the pod-resources API, else its device-manager
checkpoint, in each format kubelets write (nodeagent.kubelet.allocations)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeagent.kubelet.allocations import (
    KUBELET_CHECKPOINT,
    AllocationsUnavailableError,
    DeviceAllocation,
    device_allocations,
    read_kubelet_checkpoint,
)
from nodeagent.testing.podresources import serving


def write(plugins: Path, data: object) -> Path:
    path = plugins / KUBELET_CHECKPOINT
    path.write_text(json.dumps(data))
    return path


def test_pod_resources_names_pods_and_strips_replicas(short_dir: Path) -> None:
    socket = short_dir / "pr.sock"
    with serving(socket) as kubelet:
        kubelet.pods = [("p", "ns", "c", "nvidia.com/gpu", ["GPU-a::0", "GPU-a::1", "MIG-b"])]
        found, source = device_allocations(socket, short_dir)
    assert source == "pod-resources"
    assert found == (
        DeviceAllocation("nvidia.com/gpu", "GPU-a", "c", "p", "ns"),
        DeviceAllocation("nvidia.com/gpu", "GPU-a", "c", "p", "ns"),
        DeviceAllocation("nvidia.com/gpu", "MIG-b", "c", "p", "ns"),
    )
    assert found[0].pod_label == "ns/p"


@pytest.mark.parametrize(
    "ids",
    [
        pytest.param({"0": ["MIG-a::2"], "1": ["MIG-b"]}, id="numa-map"),  # 1.20 and later
        pytest.param(["MIG-a::2", "MIG-b"], id="plain-list"),  # before 1.20
    ],
)
def test_the_checkpoint_is_read_where_the_socket_does_not_answer(
    tmp_path: Path, ids: object
) -> None:
    entry = {"PodUID": "u1", "ContainerName": "c", "ResourceName": "r", "DeviceIDs": ids}
    write(tmp_path, {"Data": {"PodDeviceEntries": [entry]}, "Checksum": 7})
    found, source = device_allocations(tmp_path / "missing.sock", tmp_path)
    assert source == "kubelet-checkpoint"
    assert [(a.device_id, a.pod_label, a.container) for a in found] == [
        ("MIG-a", "uid u1", "c"),
        ("MIG-b", "uid u1", "c"),
    ]


def test_no_kubelet_at_all_means_nothing_is_held(tmp_path: Path) -> None:
    assert device_allocations(tmp_path / "missing.sock", tmp_path) == ((), "none")
    write(tmp_path, {"Data": {"PodDeviceEntries": None, "RegisteredDevices": {}}, "Checksum": 1})
    assert device_allocations(None, tmp_path) == ((), "kubelet-checkpoint")


@pytest.mark.parametrize(
    ("data", "named"),
    [
        pytest.param('{"Data": {', "is damaged: Expecting", id="torn"),
        pytest.param('{"Checksum": 1}', "is damaged: 'Data'", id="no-data"),
        pytest.param(
            '{"Data": {"PodDeviceEntries": [{"DeviceIDs": 3}]}}', "DeviceIDs is int", id="ids"
        ),
    ],
)
def test_a_damaged_checkpoint_is_named(tmp_path: Path, data: str, named: str) -> None:
    path = tmp_path / KUBELET_CHECKPOINT
    path.write_text(data)
    with pytest.raises(AllocationsUnavailableError, match=named):
        read_kubelet_checkpoint(path)


def test_a_kubelet_that_answers_neither_way_is_unknown_not_empty(tmp_path: Path) -> None:
    socket = tmp_path / "pr.sock"
    socket.write_text("")  # there, but nobody answers on it
    with pytest.raises(AllocationsUnavailableError) as caught:
        device_allocations(socket, tmp_path)
    assert str(caught.value).startswith(f"pod-resources API at {socket}: UNAVAILABLE")
    assert f"no kubelet checkpoint {tmp_path / KUBELET_CHECKPOINT}" in str(caught.value)
