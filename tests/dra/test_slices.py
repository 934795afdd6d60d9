"""ResourceSlices: the shape the API requires, counters that forbid exactly the illegal layouts,
placements in the planner's order, health as taints; every preset accepted by kube-apiserver."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import MigGeometry, Placement
from nodeagent.runtime.health_source import DeviceHealth, HealthState
from nodeagent.sim.presets import preset_names
from nodeagent.testing.nodes import enable_mig
from nodeagent_dra.slices import Publication, SliceSpec, build_slices, mig_device_name
from nodeagent_mig.planner import Instance, place_on_node
from tests.dra.conftest import VARIANTS, shape

PRESETS = preset_names()


def devices_of(pub: Publication) -> list[dict[str, Any]]:
    return [d for s in pub.slices for d in s["spec"].get("devices", [])]


def counter_sets(pub: Publication) -> dict[str, dict[str, int]]:
    out = {}
    for s in pub.slices:
        for cs in s["spec"].get("sharedCounters", []):
            out[cs["name"]] = {k: int(v["value"]) for k, v in cs["counters"].items()}
    return out


def consumption(device: dict[str, Any]) -> tuple[str, dict[str, int]] | None:
    entries = device.get("consumesCounters", [])
    if not entries:
        return None
    assert len(entries) == 1
    return entries[0]["counterSet"], {k: int(v["value"]) for k, v in entries[0]["counters"].items()}


def fits(sets: dict[str, dict[str, int]], devices: list[dict[str, Any]]) -> bool:
    """Whether the scheduler could allocate all ``devices`` together (counter arithmetic)."""
    used: dict[str, Counter[str]] = {}
    for d in devices:
        c = consumption(d)
        if c is None:
            continue
        used.setdefault(c[0], Counter()).update(c[1])
    return all(n <= sets[cs][k] for cs, counts in used.items() for k, n in counts.items())


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_slices_keep_the_apis_limits(
    shaped: Callable[[str, str], GpuNode], preset: str, variant: str
) -> None:
    node = shaped(preset, variant)
    pub = build_slices(node.snapshot(), SliceSpec("node-a", dynamic_mig=variant == "dynamic"))
    pools = {json.dumps(s["spec"]["pool"], sort_keys=True) for s in pub.slices}
    assert len(pools) == 1
    assert json.loads(pools.pop())["resourceSliceCount"] == len(pub.slices)
    names = [d["name"] for d in devices_of(pub)]
    assert len(names) == len(set(names)), "device names are unique in the pool"
    assert set(names) <= set(pub.devices)
    sets = counter_sets(pub)
    for s in pub.slices:
        spec = s["spec"]
        assert not ("devices" in spec and "sharedCounters" in spec), "1.35+: one or the other"
        assert len(spec.get("sharedCounters", [])) <= 8
        devices = spec.get("devices", [])
        partitionable = any("consumesCounters" in d or "taints" in d for d in devices)
        assert len(devices) <= (64 if partitionable else 128)
        for d in devices:
            assert len(d["attributes"]) + len(d.get("capacity", {})) <= 32
            c = consumption(d)
            if c is not None:
                assert set(c[1]) <= set(sets[c[0]])
    for cs in sets.values():
        assert len(cs) <= 32
    gpus = [d for d in devices_of(pub) if d["attributes"]["type"]["string"] == "gpu"]
    expected_gpus = sum(
        1
        for g in node.snapshot().gpus
        if not g.info.mig_enabled or (variant == "dynamic" and not g.mig_instances)
    )
    assert len(gpus) == expected_gpus


def _legal_sets(geometry: MigGeometry) -> Iterator[list[tuple[str, Placement]]]:
    """Every set of pairwise disjoint placements (any profiles), each once."""
    options = sorted(
        ((p.name, q) for p in geometry.profiles for q in p.placements),
        key=lambda o: (o[1].start, o[1].size, o[0]),
    )

    def walk(i: int, chosen: list[tuple[str, Placement]]) -> Iterator[list[tuple[str, Placement]]]:
        yield chosen
        for j in range(i, len(options)):
            name, q = options[j]
            if all(not q.overlaps(c) for _, c in chosen):
                yield from walk(j + 1, [*chosen, (name, q)])

    yield from walk(0, [])


def _device_allows(geometry: MigGeometry, names: list[str]) -> bool:
    """The GPU's own rules beyond overlap (the simulator's, from the MIG user guide): each
    profile's max count, at most the whole GPU's compute slices, and every instance owns its
    engines, so together they hold no more than the whole-GPU profile has."""
    counts = Counter(names)
    if any(counts[p.name] > p.max_count for p in geometry.profiles):
        return False
    whole = max(geometry.profiles, key=lambda p: (p.compute_slices, p.memory_bytes))
    chosen = [geometry.profile(n) for n in names]
    total = [sum(getattr(p, f) for p in chosen if p) for f in ENGINES]
    return sum(p.compute_slices for p in chosen if p) <= whole.compute_slices and all(
        t <= getattr(whole, f) for t, f in zip(total, ENGINES, strict=True)
    )


ENGINES = ("copy_engines", "decoders", "jpeg_decoders", "ofa")


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-a100-80", "dgx-h100", "hgx-h200",
                                    "pcie-h100nvl", "a30x4", "dgx-b200", "gh200"])  # fmt: skip
def test_counters_forbid_exactly_the_layouts_the_gpu_forbids(
    make_node: Callable[..., GpuNode], preset: str
) -> None:
    node = make_node(preset)
    enable_mig(node, {0: []})
    pub = build_slices(node.snapshot(), SliceSpec("node-a", dynamic_mig=True))
    geometry = node.mig_geometry(0)
    assert geometry is not None
    sets = counter_sets(pub)
    by_name = {d["name"]: d for d in devices_of(pub)}
    checked = 0
    for layout in _legal_sets(geometry):
        devices = []
        for name, q in layout:
            profile = geometry.profile(name)
            assert profile is not None
            devices.append(by_name[mig_device_name(0, profile, q)])
        legal = _device_allows(geometry, [name for name, _ in layout])
        assert fits(sets, devices) == legal, [f"{n}@{q.start}" for n, q in layout]
        checked += 1
    assert checked > 100
    whole = by_name["gpu-0"]
    assert fits(sets, [whole])
    for d in devices_of(pub):
        if d["name"].startswith("gpu-0-mig-"):
            assert not fits(sets, [whole, d]), "the whole GPU consumes every slice"
            assert not fits(sets, [d, d]), "a placement is allocated once"


def test_placements_are_listed_in_the_planners_order(
    shaped: Callable[[str, str], GpuNode],
) -> None:
    node = shaped("dgx-h100", "dynamic")
    node.create_gpu_instance(0, "1g.10gb", Placement(0, 1))
    node.create_gpu_instance(0, "2g.20gb", Placement(4, 2))
    snapshot = node.snapshot()
    made = {(0, g.profile, g.placement.start) for g in snapshot.gpus[0].mig_instances}
    spec = SliceSpec("node-a", dynamic_mig=True, managed=frozenset(made))
    pub = build_slices(snapshot, spec)
    geometry = snapshot.gpus[0].mig_geometry
    assert geometry is not None
    instances = [Instance.of(g) for g in snapshot.gpus[0].mig_instances]
    gpu0 = [d for d in devices_of(pub) if d["attributes"].get("parentIndex", {}).get("int") == 0]
    # The driver's own instances are allocated devices: the scheduler's counter bookkeeping
    # keeps the whole GPU from being allocated beside them, so it stays listed.
    assert [d for d in devices_of(pub) if d["name"] == "gpu-0"]
    for profile in ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb"):
        planned = place_on_node(geometry, [instances], profile)
        first = next(d for d in gpu0 if d["attributes"]["profile"]["string"] == profile)
        if planned is None:
            continue
        assert first["attributes"]["placementStart"]["int"] == planned[1].start, profile
    # The instances the driver made stay listed, with their UUIDs (they are allocated).
    held = [d for d in gpu0 if "uuid" in d["attributes"]]
    assert sorted(d["attributes"]["profile"]["string"] for d in held) == ["1g.10gb", "2g.20gb"]


def test_withdrawing_keeps_only_the_best_free_placement_per_profile(
    shaped: Callable[[str, str], GpuNode],
) -> None:
    node = shaped("dgx-h100", "dynamic")
    spec = SliceSpec("node-a", dynamic_mig=True, withdraw_stranding=True)
    pub = build_slices(node.snapshot(), spec)
    geometry = node.mig_geometry(0)
    assert geometry is not None
    listed = [d for d in devices_of(pub) if d["name"].startswith("gpu-0-mig-")]
    kept = {
        d["attributes"]["profile"]["string"]: d["attributes"]["placementStart"]["int"]
        for d in listed
    }
    assert len(kept) == len(listed), "one placement per profile"
    # The one kept is where the planner would put that profile on the empty GPU.
    best = {}
    for profile in geometry.profiles:
        chosen = place_on_node(geometry, [[]], profile.name)
        assert chosen is not None
        best[profile.name] = chosen[1].start
    assert kept == best
    assert kept["1g.10gb"] == 6
    assert "gpu-0-mig-1g10gb-19-3" in pub.devices, "withdrawn but still preparable"


def test_unhealthy_and_degraded_devices_are_tainted(
    shaped: Callable[[str, str], GpuNode],
) -> None:
    node = shaped("dgx-h100", "dynamic")
    snapshot = node.snapshot()
    bad, meh = snapshot.gpus[0].info.uuid, snapshot.gpus[1].info.uuid
    health = {
        bad: DeviceHealth(bad, 0, HealthState.UNHEALTHY, ("xid 48",), "reset", 1700000000.0),
        meh: DeviceHealth(meh, 1, HealthState.DEGRADED, ("sbe storm",), "watch", 1700000000.0),
    }
    pub = build_slices(snapshot, SliceSpec("node-a", dynamic_mig=True, health=health))
    for d in devices_of(pub):
        parent = d["attributes"].get("parentIndex", d["attributes"].get("index"))["int"]
        taints = d.get("taints", [])
        if parent == 0:
            assert taints == [
                {
                    "key": "gpu.nodeagent.io/unhealthy",
                    "value": "unhealthy",
                    "effect": "NoSchedule",
                    "timeAdded": "2023-11-14T22:13:20Z",
                }
            ]
        elif parent == 1:
            assert [t["effect"] for t in taints] == ["None"]
        else:
            assert taints == []


def test_content_key_ignores_only_the_generation(shaped: Callable[[str, str], GpuNode]) -> None:
    node = shaped("dgx-h100", "dynamic")
    snapshot = node.snapshot()
    a = build_slices(snapshot, SliceSpec("node-a", dynamic_mig=True, generation=1))
    b = build_slices(snapshot, SliceSpec("node-a", dynamic_mig=True, generation=7))
    assert a.content_key() == b.content_key()
    node.create_gpu_instance(0, "1g.10gb", Placement(0, 1))
    c = build_slices(node.snapshot(), SliceSpec("node-a", dynamic_mig=True, generation=7))
    assert c.content_key() != b.content_key()


# --- the real API server ---------------------------------------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
def test_every_presets_slices_are_accepted_by_kube_apiserver(
    control_plane: Any, make_node: Callable[..., GpuNode], tmp_path: Path, preset: str
) -> None:
    api = client.ResourceV1Api(control_plane.api_client())
    for variant in VARIANTS:
        node = make_node(preset, state_dir=tmp_path / variant)
        shape(node, variant)
        node_name = f"dra-{preset}-{variant}-{uuid.uuid4().hex[:6]}"
        first = node.snapshot().gpus[0].info.uuid
        health = {first: DeviceHealth(first, 0, HealthState.UNHEALTHY, ("x",), "reset", 1.7e9)}
        spec = SliceSpec(node_name, dynamic_mig=variant == "dynamic", health=health)
        pub = build_slices(node.snapshot(), spec)
        created = []
        try:
            for body in pub.slices:
                created.append(api.create_resource_slice(body))
            stored = api.list_resource_slice(field_selector=f"spec.nodeName={node_name}")
            names = sorted(d.name for s in stored.items for d in (s.spec.devices or []))
            assert names == sorted(d["name"] for d in devices_of(pub))
            counters = sorted(c.name for s in stored.items for c in (s.spec.shared_counters or []))
            assert counters == sorted(counter_sets(pub))
        finally:
            for s in created:
                api.delete_resource_slice(s.metadata.name)
