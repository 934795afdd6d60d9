"""Every MIG strategy and sharing mode, as the test kubelet sees it."""

from __future__ import annotations

import pytest

from nodeagent.testing.nodes import enable_mig
from nodeagent_device_plugin.resources import ResourceError, build_resources
from tests.device_plugin.conftest import make_config

TS4 = {"mode": "time-slicing", "replicas": 4}


def _ids(uuid: str, n: int) -> set[str]:
    return {f"{uuid}::{i}" for i in range(n)}


def test_strategy_none_advertises_mig_gpus_whole(run_plugin) -> None:
    plugin = run_plugin("dgx-h100", mig={0: ["3g.40gb"]})
    devices = plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    assert set(devices) == {g.info.uuid for g in plugin.snapshot.gpus}
    assert list(plugin.kubelet.plugins) == ["nvidia.com/gpu"]


def test_strategy_single_advertises_56_mig_devices_as_gpu(run_plugin) -> None:
    layout = {i: ["1g.10gb"] * 7 for i in range(8)}
    plugin = run_plugin(
        "dgx-h100", mig=layout, config={"device_plugin": {"mig_strategy": "single"}}
    )
    devices = plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 56)
    expected = {i.uuid for g in plugin.snapshot.gpus for i in g.mig_instances}
    assert set(devices) == expected
    assert all(d.startswith("MIG-") for d in devices)
    numa = {i.uuid: g.info.numa_node for g in plugin.snapshot.gpus for i in g.mig_instances}
    assert all(devices[u] == ("Healthy", [numa[u]]) for u in devices)


def test_strategy_mixed_names_resources_per_profile(run_plugin) -> None:
    plugin = run_plugin(
        "dgx-a100",
        mig={0: ["3g.20gb", "3g.20gb"], 1: ["1g.5gb"] * 7},
        config={"device_plugin": {"mig_strategy": "mixed"}},
    )
    kubelet = plugin.kubelet
    assert kubelet.wait(lambda: len(kubelet.plugins) == 3)
    got = {name: len(kubelet.wait_devices(name)) for name in kubelet.plugins}
    assert got == {"nvidia.com/gpu": 6, "nvidia.com/mig-3g.20gb": 2, "nvidia.com/mig-1g.5gb": 7}


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        pytest.param({0: ["1g.10gb"]}, "same MIG mode", id="some-gpus-without-mig"),
        pytest.param(
            {i: ["1g.10gb", "2g.20gb"] for i in range(8)}, "one MIG profile", id="two-profiles"
        ),
    ],
)
def test_strategy_single_rejects_what_nvidia_rejects(make_node, layout, message) -> None:
    node = make_node("dgx-h100")
    enable_mig(node, layout)
    config = make_config({"device_plugin": {"mig_strategy": "single"}})
    with pytest.raises(ResourceError, match=message):
        build_resources(node.snapshot(), config.pool, config.device_plugin)


def test_per_gpu_modes_and_replica_counts_on_one_node(run_plugin, mps_binary) -> None:
    plugin = run_plugin(
        "dgx-h100",
        config={
            "pools": {"default": {"gpu_sharing": {"0": TS4, "1": {"mode": "mps", "replicas": 2}}}},
            "device_plugin": {"mps": {"control_binary": str(mps_binary)}},
        },
    )
    devices = plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 12)
    u = plugin.uuid
    assert set(devices) == _ids(u(0), 4) | _ids(u(1), 2) | {u(i) for i in range(2, 8)}
    assert all(h == "Healthy" for h, _ in devices.values())  # the MPS daemon answers


def test_rename_shared_splits_shared_gpus_into_their_own_resource(run_plugin) -> None:
    sharing = {**TS4, "rename_shared": True}
    plugin = run_plugin("pcie-l40s", config={"pools": {"default": {"gpu_sharing": {"3": sharing}}}})
    kubelet = plugin.kubelet
    shared = kubelet.wait_devices("nvidia.com/gpu.shared", lambda d: len(d) == 4)
    whole = kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 7)
    assert set(shared) == _ids(plugin.uuid(3), 4)
    assert plugin.uuid(3) not in whole
    numa = plugin.snapshot.gpus[3].info.numa_node
    assert all(nodes == [numa] for _, nodes in shared.values())  # replicas keep the topology


def test_nvidia_time_slicing_shape_with_devices_honoured(run_plugin) -> None:
    nvidia = {
        "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3, "devices": [1]}]}
    }
    plugin = run_plugin("a30x4", config={"device_plugin": {"sharing": nvidia}})
    devices = plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 6)
    u = plugin.uuid
    assert set(devices) == _ids(u(1), 3) | {u(0), u(2), u(3)}


def test_time_slicing_applies_to_mixed_mig_devices(run_plugin) -> None:
    plugin = run_plugin(
        "a30x4",
        mig={0: ["2g.12gb", "2g.12gb"]},
        config={
            "device_plugin": {"mig_strategy": "mixed"},
            "pools": {"default": {"gpu_sharing": {"0": {"mode": "time-slicing", "replicas": 2}}}},
        },
    )
    devices = plugin.kubelet.wait_devices("nvidia.com/mig-2g.12gb", lambda d: len(d) == 4)
    migs = [i.uuid for i in plugin.snapshot.gpus[0].mig_instances]
    assert set(devices) == _ids(migs[0], 2) | _ids(migs[1], 2)


def test_mps_is_not_applied_to_mig_devices(make_node) -> None:
    node = make_node("a30x4")
    enable_mig(node, {0: ["4g.24gb"]})
    config = make_config(
        {
            "device_plugin": {"mig_strategy": "mixed"},
            "pools": {"default": {"sharing": {"mode": "mps", "replicas": 2}}},
        }
    )
    resources = build_resources(node.snapshot(), config.pool, config.device_plugin)
    [mig] = resources["nvidia.com/mig-4g.24gb"].devices
    assert mig.replica is None
    assert mig.id.startswith("MIG-")
    assert len(resources["nvidia.com/gpu"].devices) == 6  # the 3 non-MIG GPUs, 2 MPS replicas each
