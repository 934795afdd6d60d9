"""GetPreferredAllocation: exact topology-aware choices and replica placement."""

from __future__ import annotations

import random

import grpc
import pytest

from nodeagent.gpu.types import Link, LinkKind
from nodeagent.sim.presets import PRESETS, preset_names
from nodeagent.testing.optimum import Reference
from nodeagent_device_plugin.preferred import ScoreTable, pair_score, preferred_gpus


@pytest.mark.parametrize(
    ("link", "numa", "score"),
    [
        pytest.param(Link(LinkKind.NVLINK, 18), (0, 0), 1820, id="nv18-same-cpu"),
        pytest.param(Link(LinkKind.NVLINK, 12), (0, 1), 1210, id="nv12-cross-cpu"),
        pytest.param(Link(LinkKind.PCIE_SINGLE), (0, 0), 50, id="pix"),
        pytest.param(Link(LinkKind.NODE), (0, 0), 20, id="node"),
        pytest.param(Link(LinkKind.SYSTEM), (0, 1), 10, id="sys"),
        pytest.param(None, (0, 1), 10, id="unknown"),
    ],
)
def test_pair_scores_follow_nvidias_best_effort_policy(link, numa, score) -> None:
    assert pair_score(link, *numa) == score


def test_reference_scores_a_hand_worked_node() -> None:
    # Two PIX pairs (0+1, 2+3) across one NUMA node, and GPU 3 NVLinked to 2 (NV4).
    pix, node = Link(LinkKind.PCIE_SINGLE), Link(LinkKind.NODE)
    topology = {(0, 1): pix, (2, 3): Link(LinkKind.NVLINK, 4), (0, 2): node, (0, 3): node}
    topology |= {(1, 2): node, (1, 3): node}
    reference = Reference.from_topology(topology, {0: 0, 1: 0, 2: 0, 3: 0})
    # 2+3 score 4 * 100 + 20 (same CPU); leaving 0+1 (50) behind.
    assert reference.optimum([0, 1, 2, 3], [], 2) == (470, 420, 50)
    # must_include 1 can only pair with 0 and still leave 2+3 together.
    assert reference.optimum([0, 1, 2, 3], [1], 2) == (470, 50, 420)
    # Size 3: {0, 2, 3} = 20 + 20 + 420; the lone GPU left scores nothing.
    assert reference.optimum([0, 1, 2, 3], [], 3) == (460, 460, 0)
    # Taking 1+2 strands 0 and 3 across the NODE path: 20 + 20.
    assert reference.score([0, 1, 2, 3], [1, 2], 2) == (40, 20, 20)


@pytest.mark.parametrize("preset", [p for p in preset_names() if PRESETS[p].gpus > 1])
def test_choice_equals_the_exhaustive_optimum_on_every_preset(make_node, preset) -> None:
    snapshot = make_node(preset).snapshot()
    numa = {g.info.index: g.info.numa_node for g in snapshot.gpus}
    table = ScoreTable.from_topology(snapshot.topology, numa)
    reference = Reference.from_snapshot(snapshot)  # shares nothing with the plugin's scoring
    rng = random.Random(preset)
    gpus = sorted(numa)
    for _ in range(12):
        available = sorted(rng.sample(gpus, rng.randint(2, len(gpus))))
        size = rng.randint(1, len(available))
        must = rng.sample(available, rng.randint(0, min(size, 2)))
        chosen = preferred_gpus(table, available, must, size)
        assert set(must) <= set(chosen) <= set(available)
        assert len(chosen) == size
        best = reference.optimum(available, must, size)
        assert reference.score(available, chosen, size)[:2] == best[:2], (available, must, size)


def test_pcie_pairs_are_kept_together(run_plugin) -> None:
    plugin = run_plugin("pcie-l40s")
    u = plugin.uuid
    # 0+1 share a switch, so do 2+3; taking 1 and 2 would strand 0 and 3 badly connected.
    chosen = plugin.kubelet.preferred("nvidia.com/gpu", [u(0), u(1), u(2), u(3)], 2)
    assert sorted(chosen) in (sorted([u(0), u(1)]), sorted([u(2), u(3)]))
    chosen = plugin.kubelet.preferred("nvidia.com/gpu", [u(0), u(1), u(2), u(3)], 2, must=[u(3)])
    assert sorted(chosen) == sorted([u(2), u(3)])


def test_nvlink_bridged_pairs_beat_pcie(run_plugin) -> None:
    plugin = run_plugin("pcie-h100nvl")
    u = plugin.uuid
    chosen = plugin.kubelet.preferred("nvidia.com/gpu", [u(1), u(2), u(3)], 2)
    assert sorted(chosen) == sorted([u(2), u(3)])


def test_nvswitch_node_prefers_one_numa_node(run_plugin) -> None:
    plugin = run_plugin("dgx-h100")
    u = plugin.uuid
    chosen = plugin.kubelet.preferred("nvidia.com/gpu", [u(i) for i in range(8)], 4)
    numa = {
        plugin.snapshot.gpus[i].info.uuid: plugin.snapshot.gpus[i].info.numa_node for i in range(8)
    }
    assert len({numa[c] for c in chosen}) == 1


@pytest.mark.parametrize(
    ("placement", "expected_gpus"),
    [
        pytest.param("spread", 3, id="spread"),
        pytest.param("pack", 1, id="pack"),
    ],
)
def test_replicas_spread_or_pack(run_plugin, placement, expected_gpus) -> None:
    sharing = {"mode": "time-slicing", "replicas": 4, "replica_placement": placement}
    plugin = run_plugin("a30x4", config={"pools": {"default": {"sharing": sharing}}})
    devices = plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 16)
    u = plugin.uuid
    # GPU 0 has one replica in use; the rest are free.
    available = sorted(d for d in devices if d != f"{u(0)}::0")
    chosen = plugin.kubelet.preferred("nvidia.com/gpu", available, 3)
    assert len({c.split("::")[0] for c in chosen}) == expected_gpus
    if placement == "spread":
        assert u(0) not in {c.split("::")[0] for c in chosen}  # the busy GPU is avoided
    else:
        assert {c.split("::")[0] for c in chosen} == {u(0)}  # the busy GPU is filled


def test_must_include_replica_is_kept(run_plugin) -> None:
    plugin = run_plugin(
        "a30x4", config={"pools": {"default": {"sharing": {"mode": "time-slicing", "replicas": 2}}}}
    )
    devices = plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    must = f"{plugin.uuid(2)}::1"
    chosen = plugin.kubelet.preferred("nvidia.com/gpu", sorted(devices), 2, must=[must])
    assert must in chosen
    assert len(chosen) == 2


def test_impossible_size_is_refused(run_plugin) -> None:
    plugin = run_plugin("a30x4")
    with pytest.raises(grpc.RpcError) as info:
        plugin.kubelet.preferred("nvidia.com/gpu", [plugin.uuid(0)], 2)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "allocation_size 2" in info.value.details()


def test_sixteen_gpus_are_chosen_exactly() -> None:
    # Two 8-GPU NVSwitch islands joined over PCIe: a 4-GPU choice must stay on one island.
    scores = {}
    for a in range(16):
        for b in range(16):
            if a != b:
                scores[(a, b)] = 1820 if a // 8 == b // 8 else 10
    table = ScoreTable(scores)
    chosen = preferred_gpus(table, list(range(16)), [9], 4)
    assert len(set(chosen)) == 4
    assert 9 in chosen
    assert all(g // 8 == 1 for g in chosen)
