"""Inventory and topology through GpuNode on simulated presets."""

from __future__ import annotations

from collections.abc import Callable
from itertools import permutations
from pathlib import Path

import pytest

from nodeagent.gpu.errors import InvalidArgument
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import LinkKind
from nodeagent.sim.control import SimControl

MakeNode = Callable[..., GpuNode]
MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("preset", "count", "name", "memory_mib", "mig_capable", "cc"),
    [
        pytest.param("dgx-h100", 8, "NVIDIA H100 80GB HBM3", 81559, True, (9, 0), id="dgx-h100"),
        pytest.param("hgx-h200", 8, "NVIDIA H200", 143771, True, (9, 0), id="hgx-h200"),
        pytest.param("dgx-a100", 8, "NVIDIA A100-SXM4-40GB", 40960, True, (8, 0), id="dgx-a100"),
        pytest.param("pcie-l40s", 8, "NVIDIA L40S", 46068, False, (8, 9), id="pcie-l40s"),
        pytest.param("a30x4", 4, "NVIDIA A30", 24576, True, (8, 0), id="a30x4"),
        pytest.param("t4", 1, "Tesla T4", 15360, False, (7, 5), id="t4"),
    ],
)
def test_inventory_reports_the_product(
    make_node: MakeNode,
    preset: str,
    count: int,
    name: str,
    memory_mib: int,
    mig_capable: bool,
    cc: tuple[int, int],
) -> None:
    node = make_node(preset)
    inventory = node.inventory()
    assert node.count() == count == len(inventory)
    assert [i.index for i in inventory] == list(range(count))
    for info in inventory:
        assert info.name == name
        assert info.memory_total_bytes == memory_mib * MIB
        assert info.mig_capable is mig_capable
        assert info.compute_capability == cc
        assert info.uuid.startswith("GPU-")
        assert info.driver_version == node.driver_version()
        assert info.cuda_driver_version == "12.8"
    assert len({i.uuid for i in inventory}) == count
    assert len({i.pci_bus_id for i in inventory}) == count


def test_dgx_h100_facts(make_node: MakeNode) -> None:
    node = make_node("dgx-h100")
    info = node.info(5)
    assert info.pci_device_id == 0x233010DE
    assert info.pci_bus_id == "00000000:ab:00.0"  # canonical lower-case 8-digit domain form
    assert [node.info(i).numa_node for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert info.serial
    assert info.vbios_version
    assert info.minor_number == 5
    assert not info.mig_enabled
    assert not info.mig_pending


def test_mig_mode_is_reread_while_static_facts_are_cached(
    make_node: MakeNode, sim_state_dir: Path
) -> None:
    node = make_node("dgx-h100")
    # A driver that leaves the mode pending until a reset (the simulator's semantics switch).
    SimControl(sim_state_dir).set_semantics(mig_mode_applies_at_once=False)
    before = node.info(0)
    node.set_mig_mode(0, True)
    after = node.info(0)
    assert (after.mig_enabled, after.mig_pending) == (False, True)
    assert after.mig_change_pending
    assert after.uuid == before.uuid


def test_unknown_gpu_index_is_rejected(make_node: MakeNode) -> None:
    node = make_node("t4")
    with pytest.raises(InvalidArgument, match=r"GPUs 0\.\.0"):
        node.info(3)


@pytest.mark.parametrize(
    ("preset", "label"),
    [
        pytest.param("dgx-h100", "NV18", id="dgx-h100-nvswitch"),
        pytest.param("hgx-h200", "NV18", id="hgx-h200-nvswitch"),
        pytest.param("dgx-a100", "NV12", id="dgx-a100-nvswitch"),
    ],
)
def test_nvswitch_nodes_link_every_pair(make_node: MakeNode, preset: str, label: str) -> None:
    node = make_node(preset)
    topology = node.topology()
    assert set(topology) == set(permutations(range(8), 2))
    assert {link.label for link in topology.values()} == {label}


def test_pcie_l40s_has_no_nvlink(make_node: MakeNode) -> None:
    topology = make_node("pcie-l40s").topology()
    assert set(topology) == set(permutations(range(8), 2))
    assert all(link.kind is not LinkKind.NVLINK for link in topology.values())
    # Pairs share a PCIe switch; halves share a NUMA node; the rest cross the interconnect.
    assert topology[(0, 1)].kind is LinkKind.PCIE_SINGLE
    assert topology[(0, 2)].kind is LinkKind.NODE
    assert topology[(0, 4)].kind is LinkKind.SYSTEM
    assert topology[(4, 0)] == topology[(0, 4)]


def test_pcie_h100nvl_links_bridged_pairs_only(make_node: MakeNode) -> None:
    topology = make_node("pcie-h100nvl").topology()
    nvlink_pairs = {pair for pair, link in topology.items() if link.kind is LinkKind.NVLINK}
    assert nvlink_pairs == {(0, 1), (1, 0), (2, 3), (3, 2)}
    assert topology[(0, 1)].label == "NV12"
    assert topology[(1, 2)].kind is not LinkKind.NVLINK


def test_single_gpu_has_empty_topology(make_node: MakeNode) -> None:
    assert make_node("t4").topology() == {}
