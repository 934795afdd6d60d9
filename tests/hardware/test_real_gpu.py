"""Read-only checks of the real GPUs against the simulator's model of the same product.

Run with ``pytest -m nvml tests/hardware`` on a host with an NVIDIA driver. These tests only
read: they never create or destroy a MIG instance, never change MIG mode, clocks, power limits,
compute or persistence mode, and never reset a GPU. Each check names the simulator fact it
holds to the driver; a failure is a fact to correct in nodeagent/sim or nodeagent/migcatalog.py
(or a semantics default in nodeagent/sim/ops.py).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nodeagent import migcatalog
from nodeagent.agent.backend import open_node
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import LinkKind, Placement
from nodeagent.sim.control import SimControl
from nodeagent.sim.models import MODELS, GpuModel, gi_id_range
from nodeagent.sim.presets import PRESETS

pytestmark = pytest.mark.nvml

MIB = 1 << 20
# Profile sizes move by a slice's rounding between driver branches (docs/simulator.md).
PROFILE_MEMORY_SLACK_MIB = 256
# nvmlDeviceGetMemoryInfo_v2 exists from this driver branch on (the simulator's assumption).
MEMORY_V2_BRANCH = 510
NVML_ERROR_NO_PERMISSION = 4

# Models the simulator wires through NVSwitch (SXM boards): every GPU pair is NVLink there.
_SXM_MODELS = {p.model for p in PRESETS.values() if p.fabric == "nvswitch"}
_PCIE_ONLY_MODELS = {p.model for p in PRESETS.values() if p.fabric == "pcie"}

Gpu = dict[str, Any]
_T = TypeVar("_T")


def _model(gpu: Gpu) -> GpuModel | None:
    name = gpu["info"]["name"]
    return next((m for m in MODELS.values() if m.name == name), None)


def _modelled(record: dict[str, Any]) -> list[tuple[Gpu, GpuModel]]:
    pairs = [(gpu, model) for gpu in record["gpus"] if (model := _model(gpu)) is not None]
    if not pairs:
        pytest.skip("no GPU on this host has a simulator model")
    return pairs


def _where(gpu: Gpu) -> str:
    return f"GPU {gpu['info']['index']} {gpu['info']['name']}"


def _mig_on(record: dict[str, Any]) -> list[tuple[Gpu, GpuModel]]:
    found = [
        (g, m) for g, m in _modelled(record) if g["info"]["mig_enabled"] and g["mig"] is not None
    ]
    if not found:
        pytest.skip("no modelled GPU has MIG enabled")
    return found


def _each(items: Iterable[_T], none_here: str) -> Iterator[_T]:
    """``items``, then the test is skipped with ``none_here`` if there were none to check."""
    checked = 0
    for item in items:
        checked += 1
        yield item
    if not checked:
        pytest.skip(none_here)


# --- identity --------------------------------------------------------------------------------


def test_every_gpu_has_a_simulator_model(hw_record: dict[str, Any]) -> None:
    unknown = [_where(g) for g in hw_record["gpus"] if _model(g) is None]
    assert not unknown, f"no simulator model for {unknown}; add them to nodeagent/sim/models.py"


def test_memory_total_matches_model_within_one_percent(hw_record: dict[str, Any]) -> None:
    for gpu, model in _modelled(hw_record):
        total = gpu["info"]["memory_total_bytes"]
        expected = model.memory_mib * MIB
        assert abs(total - expected) <= expected / 100, (
            f"{_where(gpu)}: NVML reports {total} bytes, the model says {expected}"
        )


def test_compute_capability_and_pci_id_match_model(hw_record: dict[str, Any]) -> None:
    for gpu, model in _modelled(hw_record):
        info = gpu["info"]
        assert tuple(info["compute_capability"]) == model.compute_capability, _where(gpu)
        assert info["pci_device_id"] == model.pci_device_id, (
            f"{_where(gpu)}: PCI id {info['pci_device_id']:#010x}, "
            f"model {model.pci_device_id:#010x}"
        )


def test_mig_capability_matches_model(hw_record: dict[str, Any]) -> None:
    for gpu, model in _modelled(hw_record):
        assert gpu["info"]["mig_capable"] == model.mig_capable, _where(gpu)


def test_the_catalog_finds_every_mig_gpu_by_pci_id_and_memory(hw_record: dict[str, Any]) -> None:
    """What the GPU layer falls back on while MIG is off must be this product's table."""
    for gpu, model in _modelled(hw_record):
        if not model.mig_capable:
            continue
        info = gpu["info"]
        found = migcatalog.lookup(info["pci_device_id"], info["memory_total_bytes"] // MIB)
        assert found is model.mig, f"{_where(gpu)}: the catalog finds {found and found.key}"


# --- thresholds and memory ---------------------------------------------------------------------


def test_temperature_thresholds_match_model(hw_record: dict[str, Any]) -> None:
    for gpu, model in _modelled(hw_record):
        modelled = {"slowdown": model.slowdown_c, "shutdown": model.shutdown_c,
                    "gpu_max": model.gpu_max_c}  # fmt: skip
        real = {k: v for k, v in gpu["thresholds_celsius"].items() if v is not None}
        assert real == {k: modelled[k] for k in real}, f"{_where(gpu)} (celsius)"


def test_reserved_memory_is_apart_and_near_the_model(hw_record: dict[str, Any]) -> None:
    if migcatalog.driver_branch(hw_record["driver_version"]) < MEMORY_V2_BRANCH:
        pytest.skip(f"driver {hw_record['driver_version']} predates memory info v2")
    for gpu, model in _modelled(hw_record):
        memory = gpu["memory_mib"]
        assert memory is not None, _where(gpu)
        reserved = memory["reserved"]
        assert reserved is not None, f"{_where(gpu)}: no memory info v2 on this driver"
        # used + reserved + free is the total, each rounded down to whole MiB
        assert 0 <= memory["total"] - memory["used"] - reserved - memory["free"] <= 2, memory
        # The reading moves between drivers (328-551 MiB on H100): the model holds one of them.
        assert model.reserved_mib / 2 <= reserved <= model.reserved_mib * 2, (
            f"{_where(gpu)}: reserved {reserved} MiB, the model says {model.reserved_mib}"
        )


# --- MIG ---------------------------------------------------------------------------------------


def test_profile_info_is_refused_while_mig_is_off(hw_record: dict[str, Any]) -> None:
    """The simulator's ``profile_info_needs_mig`` default, from nvml.h."""
    off = [
        (g, m) for g, m in _modelled(hw_record) if m.mig_capable and not g["info"]["mig_enabled"]
    ]
    if not off:
        pytest.skip("no MIG-capable GPU has MIG disabled")
    for gpu, _ in off:
        assert gpu["mig"]["source"] == "catalog", (
            f"{_where(gpu)}: driver {hw_record['driver_version']} lists MIG profiles with MIG "
            "off; the simulator's profile_info_needs_mig default says it does not"
        )


def test_placements_are_listed_whatever_the_mode(hw_record: dict[str, Any]) -> None:
    profiles = (
        (gpu, profile)
        for gpu, _ in _modelled(hw_record)
        for profile in (gpu["mig"]["profiles"] if gpu["mig"] else ())
        # The query needs privilege on some drivers.
        if profile["placements_as_listed"] != NVML_ERROR_NO_PERMISSION
    )
    for gpu, profile in _each(profiles, "NVML reported no MIG placements (no privilege)"):
        listed = profile["placements_as_listed"]
        assert not isinstance(listed, int), (
            f"{_where(gpu)} {profile['name']}: NVML error {listed} with MIG "
            f"{'on' if gpu['info']['mig_enabled'] else 'off'}"
        )


def _reported(model: GpuModel, name: str, driver: str) -> tuple[migcatalog.GiProfile, int] | None:
    assert model.mig is not None
    for p in model.mig.profiles:
        reported_name, memory = model.mig.reported(p, driver)
        if reported_name == name:
            return p, memory
    return None


def test_mig_profile_table_matches_model(hw_record: dict[str, Any]) -> None:
    # GPUs whose table the driver gave (not MIG-capable ones, nor those the catalog stood in for).
    from_driver = (
        (gpu, model)
        for gpu, model in _modelled(hw_record)
        if gpu["mig"] is not None and gpu["mig"]["source"] == "driver"
    )
    none_here = "no GPU reported a MIG profile table (MIG is off everywhere)"
    for gpu, model in _each(from_driver, none_here):
        mig = gpu["mig"]
        assert mig["memory_slices"] == model.memory_slices, _where(gpu)
        assert len(mig["profiles"]) == len(model.gi_profiles), _where(gpu)
        for real in mig["profiles"]:
            found = _reported(model, real["name"], hw_record["driver_version"])
            assert found is not None, f"{_where(gpu)}: no modelled profile {real['name']}"
            p, memory_mib = found
            where = f"{_where(gpu)} {real['name']}"
            got = (real["profile_id"], real["nvml_index"], real["slices"], real["compute_slices"],
                   real["multiprocessors"], real["max_count"])  # fmt: skip
            want = (p.profile_id, p.nvml_index, p.slices, p.compute_slices, p.multiprocessors,
                    p.max_count)  # fmt: skip
            assert got == want, f"{where}: (id, index, slices, compute slices, SMs, max count)"
            engines = (real["copy_engines"], real["decoders"], real["jpeg_decoders"], real["ofa"])
            assert engines == (p.copy_engines, p.decoders, p.jpeg, p.ofa), f"{where}: engines"
            assert abs(real["memory_mib"] - memory_mib) <= PROFILE_MEMORY_SLACK_MIB, (
                f"{where}: {real['memory_mib']} MiB, the model says {memory_mib} "
                f"for driver {hw_record['driver_version']}"
            )


def test_placements_in_nvml_order_match_model(hw_record: dict[str, Any]) -> None:
    pairs = (
        (gpu, real, modelled)
        for gpu, model in _mig_on(hw_record)
        for real in gpu["mig"]["profiles"]
        if not isinstance(real["placements_as_listed"], int)
        and (modelled := model.profile_by_id(real["profile_id"])) is not None
    )
    for gpu, real, modelled in _each(pairs, "NVML reported no MIG placements"):
        listed = real["placements_as_listed"]
        assert [tuple(p) for p in listed] == list(modelled.placements), (
            f"{_where(gpu)} {real['name']}"
        )


def test_gpu_instance_ids_stay_in_their_ranges(hw_record: dict[str, Any]) -> None:
    """IDs follow creation within a range per instance size (models.gi_id_range)."""
    instances = (
        (gpu, model, gi) for gpu, model in _mig_on(hw_record) for gi in gpu["mig"]["instances"]
    )
    for gpu, model, gi in _each(instances, "no GPU instance exists"):
        ids = gi_id_range(model.memory_slices, gi["size"])
        assert gi["instance_id"] in ids, f"{_where(gpu)}: {gi} outside {ids}"


@pytest.fixture
def sim_state() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def _simulated_remaining(
    model: GpuModel, instances: list[dict[str, Any]], driver: str, state: Path
) -> Any:
    """The simulator's remaining capacity per profile ID beside the same instances.

    ``state`` must be this GPU's own directory: the layout is rebuilt on a fresh simulated node,
    and a second GPU of the same model in the same directory would meet the first one's
    instances (MIG already on, slices taken).
    """
    preset = next((p.name for p in PRESETS.values() if p.model == model.key), None)
    if preset is None:
        return None
    # The same driver, so that profiles carry the names the real one gives them.
    SimControl(state, preset).inject("driver", 0, version=driver)
    node: GpuNode = open_node(simulate=preset, state_dir=state)
    try:
        node.set_mig_mode(0, True)
        for gi in instances:
            node.create_gpu_instance(0, gi["profile"], Placement(gi["start"], gi["size"]))
        sim = node.nvml
        handle = sim.nvmlDeviceGetHandleByIndex(0)
        return {
            p.profile_id: sim.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, p.profile_id)
            for p in model.gi_profiles
        }
    finally:
        node.close()


def test_remaining_capacity_matches_the_simulator(
    hw_record: dict[str, Any], sim_state: Path
) -> None:
    """Beside the instances that exist, NVML and the simulator count the same room per profile:
    placements, maximum counts, SM slices and the media engines ("+me" profiles)."""

    def beside_the_simulator() -> Iterator[tuple[Gpu, dict[str, Any], Any]]:
        for gpu, model in _mig_on(hw_record):
            scratch = sim_state / f"gpu{gpu['info']['index']}"  # one node per GPU: see above
            simulated = _simulated_remaining(
                model, gpu["mig"]["instances"], hw_record["driver_version"], scratch
            )
            if simulated is None:
                continue  # no preset of this model to rebuild the layout on
            for real in gpu["mig"]["profiles"]:
                if real["remaining"] is not None:
                    yield gpu, real, simulated[real["profile_id"]]

    pairs = beside_the_simulator()
    for gpu, real, simulated in _each(pairs, "NVML reported no remaining capacity"):
        assert real["remaining"] == simulated, (
            f"{_where(gpu)} {real['name']} beside {gpu['mig']['instances']}"
        )


def test_mig_device_count(hw_record: dict[str, Any]) -> None:
    """nvml.h: 0 where MIG is off or not supported; the model's most with MIG on."""
    for gpu, model in _modelled(hw_record):
        count = gpu["max_mig_devices"]
        if count is None:
            continue
        want = model.max_mig_devices if gpu["info"]["mig_enabled"] else 0
        assert count == want, _where(gpu)


def test_gpu_utilization_is_not_available_with_mig(hw_record: dict[str, Any]) -> None:
    for gpu, _ in _mig_on(hw_record):
        assert gpu["utilization_gpu_ratio"] is None, f"{_where(gpu)}: nvidia-smi shows N/A"


# --- topology and the agent's sample -----------------------------------------------------------


def test_topology_shape_matches_model(hw_node: GpuNode, hw_record: dict[str, Any]) -> None:
    pairs = _modelled(hw_record)
    if hw_node.count() < 2:
        pytest.skip("one GPU: no pair to check")
    keys = {model.key for _, model in pairs}
    for (i, j), link in hw_node.topology().items():
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
        total = (
            telemetry.memory_used_bytes
            + (telemetry.memory_reserved_bytes or 0)
            + telemetry.memory_free_bytes
        )
        assert 0 < total <= state.info.memory_total_bytes
        if telemetry.utilization_gpu_ratio is not None:
            assert 0 <= telemetry.utilization_gpu_ratio <= 1
        if telemetry.temperature_celsius is not None:
            assert 0 < telemetry.temperature_celsius < 120
    assert snapshot.driver_version
