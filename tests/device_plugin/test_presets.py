"""Every MIG strategy x sharing mode on every preset, as the test kubelet sees it.

The expected resources are derived here from the simulator's snapshot (GPU and MIG UUIDs, NUMA
nodes) by NVIDIA's rules, written out independently of ``nodeagent_device_plugin.resources``:

- ``none``: every GPU is ``nvidia.com/gpu``, MIG-enabled GPUs as whole GPUs;
- ``mixed``: MIG devices are ``nvidia.com/mig-<profile>``, GPUs without MIG stay ``nvidia.com/gpu``;
- ``single``: every GPU is in MIG mode with one profile, and the MIG devices are ``nvidia.com/gpu``;
- on presets without MIG (pcie-l40s, t4) ``single`` and ``mixed`` degrade to whole GPUs;
- time-slicing gives ``<id>::<n>`` replicas of GPUs and MIG devices alike; MPS gives replicas of
  whole GPUs and leaves MIG devices exclusive.

Then a fault on GPU 0 must mark exactly the devices that live on GPU 0 Unhealthy.
"""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.gpu.types import NodeSnapshot
from nodeagent.runtime.health_source import HealthState

# (small profile, whole-GPU profile) of each MIG preset.
MIG_PRESETS = {
    "dgx-a100": ("1g.5gb", "7g.40gb"),
    "dgx-h100": ("1g.10gb", "7g.80gb"),
    "hgx-h200": ("1g.18gb", "7g.141gb"),
    "a30x4": ("1g.6gb", "4g.24gb"),
    "pcie-h100nvl": ("1g.12gb", "7g.94gb"),
}
NON_MIG_PRESETS = ("pcie-l40s", "t4")
GPUS = {"a30x4": 4, "pcie-h100nvl": 4, "t4": 1}  # the others have 8 (checked below)
SHARING: dict[str, dict[str, Any]] = {
    "exclusive": {"mode": "exclusive"},
    "time-slicing": {"mode": "time-slicing", "replicas": 3},
    "mps": {"mode": "mps", "replicas": 2},
}
STRATEGIES = ("none", "single", "mixed")

Expected = dict[str, dict[str, tuple[int, int | None]]]  # resource -> ID -> (GPU index, NUMA)


def _layout(preset: str, strategy: str, gpus: int) -> dict[int, list[str]]:
    """MIG layout: single puts two small instances on every GPU; the others on GPU 0 (and a
    whole-GPU instance on GPU 1, so mixed serves two MIG resources next to nvidia.com/gpu)."""
    if preset not in MIG_PRESETS:
        return {}
    small, whole = MIG_PRESETS[preset]
    if strategy == "single":
        return {i: [small, small] for i in range(gpus)}
    return {0: [small, small], 1: [whole]}


def _ids(device: str, sharing: str, mig: bool) -> list[str]:
    replicas = SHARING[sharing].get("replicas", 0)
    if sharing == "exclusive" or (sharing == "mps" and mig):
        return [device]
    return [f"{device}::{n}" for n in range(replicas)]


def _mps_gpus(gpus: int) -> set[int]:
    """GPUs put in MPS mode: GPU 1 (MIG under mixed and single) and the last one. Each runs a
    control daemon (a Python stand-in here), so two per node keep the file fast."""
    return {min(1, gpus - 1), gpus - 1}


def _pool(sharing: str, gpus: int) -> dict[str, Any]:
    if sharing != "mps":
        return {"sharing": SHARING[sharing]}
    return {"gpu_sharing": {str(i): SHARING["mps"] for i in _mps_gpus(gpus)}}


def _expected(snapshot: NodeSnapshot, strategy: str, sharing: str) -> Expected:
    out: Expected = {}
    mps = _mps_gpus(len(snapshot.gpus))
    for gpu in snapshot.gpus:
        info = gpu.info
        where = (info.index, info.numa_node)
        mode = "exclusive" if sharing == "mps" and info.index not in mps else sharing
        if strategy == "none" or not info.mig_enabled:
            for i in _ids(info.uuid, mode, mig=False):
                out.setdefault("nvidia.com/gpu", {})[i] = where
            continue
        for instance in gpu.mig_instances:
            name = (
                "nvidia.com/gpu" if strategy == "single" else f"nvidia.com/mig-{instance.profile}"
            )
            [ci] = instance.compute_instances
            for i in _ids(ci.uuid, mode, mig=True):
                out.setdefault(name, {})[i] = where
    return out


CASES = [
    pytest.param(preset, strategy, sharing, id=f"{preset}-{strategy}-{sharing}")
    for preset in (*MIG_PRESETS, *NON_MIG_PRESETS)
    for strategy in STRATEGIES
    for sharing in SHARING
]


@pytest.mark.parametrize(("preset", "strategy", "sharing"), CASES)
def test_strategy_and_sharing_on_every_preset(
    run_plugin, mps_binary, preset: str, strategy: str, sharing: str
) -> None:
    gpus = GPUS.get(preset, 8)
    plugin = run_plugin(
        preset,
        mig=_layout(preset, strategy, gpus),
        config={
            "device_plugin": {
                "mig_strategy": strategy,
                "mps": {"control_binary": str(mps_binary)},
                "health_recovery_quiet_s": 0,
            },
            "pools": {"default": _pool(sharing, gpus)},
        },
    )
    assert len(plugin.snapshot.gpus) == gpus
    expected = _expected(plugin.snapshot, strategy, sharing)
    # The layout really exercises the strategy (a guard on the expectation itself).
    if preset in MIG_PRESETS and strategy == "mixed":
        small, whole = MIG_PRESETS[preset]
        assert {f"nvidia.com/mig-{small}", f"nvidia.com/mig-{whole}"} < set(expected)
    if preset in MIG_PRESETS and strategy == "single":
        assert all(i.startswith("MIG-") for i in expected["nvidia.com/gpu"])
    kubelet = plugin.kubelet
    assert kubelet.wait(lambda: set(kubelet.plugins) == set(expected)), set(kubelet.plugins)
    for name, want in expected.items():
        got = kubelet.wait_devices(
            name, lambda d, w=want: set(d) == set(w) and all(h == "Healthy" for h, _ in d.values())
        )
        for device_id, (_, numa) in want.items():
            assert got[device_id][1] == ([numa] if numa is not None else []), device_id

    # A fault on GPU 0 reaches every device on it (its replicas and MIG devices), nothing else.
    plugin.health.set(plugin.uuid(0), HealthState.UNHEALTHY, "xid 79", index=0)
    for name, want in expected.items():
        on_gpu0 = {i for i, (gpu, _) in want.items() if gpu == 0}
        kubelet.wait_devices(
            name,
            lambda d, bad=on_gpu0: {i for i, (h, _) in d.items() if h == "Unhealthy"} == bad,
        )
