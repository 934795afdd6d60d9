"""Read-only checks of the real GPUs against the simulator's model of the same product.

Run with ``pytest -m nvml tests/hardware`` on a host with an NVIDIA driver. These tests only
read: they never change MIG mode, clocks, power limits, compute or persistence mode, and never
reset a GPU.
"""

from __future__ import annotations

import pytest

from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import GpuInfo, LinkKind, MigProfile
from nodeagent.sim.models import MODELS, GpuModel
from nodeagent.sim.presets import PRESETS

pytestmark = pytest.mark.nvml

# Models the simulator wires through NVSwitch (SXM boards): every GPU pair is NVLink there.
_SXM_MODELS = {p.model for p in PRESETS.values() if p.fabric == "nvswitch"}
_PCIE_ONLY_MODELS = {p.model for p in PRESETS.values() if p.fabric == "pcie"}


def _model(info: GpuInfo) -> GpuModel | None:
    for model in MODELS.values():
        if model.name == info.name:
            return model
    return None


def _modelled(node: GpuNode) -> list[tuple[GpuInfo, GpuModel]]:
    pairs = [(info, model) for info in node.inventory() if (model := _model(info)) is not None]
    if not pairs:
        pytest.skip("no GPU on this host has a simulator model")
    return pairs


def test_every_gpu_has_a_simulator_model(hw_node: GpuNode) -> None:
    unknown = [f"GPU {i.index}: {i.name!r}" for i in hw_node.inventory() if _model(i) is None]
    assert not unknown, f"no simulator model for {unknown}; add them to nodeagent/sim/models.py"


def test_memory_total_matches_model_within_one_percent(hw_node: GpuNode) -> None:
    for info, model in _modelled(hw_node):
        expected = model.memory_mib * 1024 * 1024
        assert abs(info.memory_total_bytes - expected) <= expected / 100, (
            f"GPU {info.index} {info.name}: NVML reports {info.memory_total_bytes} bytes, "
            f"the model says {expected}"
        )


def test_compute_capability_and_pci_id_match_model(hw_node: GpuNode) -> None:
    for info, model in _modelled(hw_node):
        assert info.compute_capability == model.compute_capability, info.name
        assert info.pci_device_id == model.pci_device_id, (
            f"GPU {info.index} {info.name}: PCI id {info.pci_device_id:#010x}, "
            f"model {model.pci_device_id:#010x}"
        )


def test_mig_capability_matches_model(hw_node: GpuNode) -> None:
    for info, model in _modelled(hw_node):
        assert info.mig_capable == model.mig_capable, info.name


def _profile_facts(p: MigProfile) -> tuple[int, int, int, int]:
    return (p.profile_id, p.slices, p.multiprocessors, p.max_count)


def test_mig_profile_table_matches_model(hw_node: GpuNode) -> None:
    checked = 0
    for info, model in _modelled(hw_node):
        geometry = hw_node.mig_geometry(info.index)
        if geometry is None or not geometry.profiles:
            continue  # not MIG-capable, or this driver lists profiles only with MIG on
        checked += 1
        real = {p.name: _profile_facts(p) for p in geometry.profiles}
        modelled = {
            p.name: (p.profile_id, p.slices, p.multiprocessors, p.max_count)
            for p in model.gi_profiles
        }
        assert real == modelled, f"GPU {info.index} {info.name}: (id, slices, SMs, max count)"
        assert geometry.memory_slices in (0, model.memory_slices)
    if not checked:
        pytest.skip("no GPU reported a MIG profile table")


def test_mig_placements_match_model_where_reported(hw_node: GpuNode) -> None:
    checked = 0
    for info, model in _modelled(hw_node):
        geometry = hw_node.mig_geometry(info.index)
        if geometry is None:
            continue
        for profile in geometry.profiles:
            if not profile.placements:
                continue  # NVML did not report them (needs privilege on some drivers)
            modelled = model.profile_by_name(profile.name)
            assert modelled is not None, profile.name
            checked += 1
            real = sorted((p.start, p.size) for p in profile.placements)
            assert real == sorted(modelled.placements), f"{info.name} {profile.name}"
    if not checked:
        pytest.skip("NVML reported no MIG placements")


def test_topology_shape_matches_model(hw_node: GpuNode) -> None:
    pairs = _modelled(hw_node)
    if hw_node.count() < 2:
        pytest.skip("one GPU: no pair to check")
    topology = hw_node.topology()
    keys = {model.key for _, model in pairs}
    for (i, j), link in topology.items():
        assert link.kind is not LinkKind.SELF, (i, j)
        if keys <= _SXM_MODELS:
            assert link.kind is LinkKind.NVLINK, f"SXM GPUs {i},{j} not NVLink: {link.label}"
        if keys <= _PCIE_ONLY_MODELS:
            assert link.kind is not LinkKind.NVLINK, f"PCIe GPUs {i},{j} show {link.label}"


def test_snapshot_reads_every_gpu(hw_node: GpuNode) -> None:
    snapshot = hw_node.snapshot()
    assert len(snapshot.gpus) == hw_node.count()
    for state in snapshot.gpus:
        assert not state.lost, state.error
        assert state.telemetry is not None, state.error
        telemetry = state.telemetry
        total = telemetry.memory_used_bytes + telemetry.memory_free_bytes
        assert 0 < total <= state.info.memory_total_bytes
        if telemetry.utilization_gpu_ratio is not None:
            assert 0 <= telemetry.utilization_gpu_ratio <= 1
        if telemetry.temperature_celsius is not None:
            assert 0 < telemetry.temperature_celsius < 120
    assert snapshot.driver_version
