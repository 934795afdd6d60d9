"""MIG capacity and fragmentation: pure functions of a GPU model's geometry and its instances.

CONTRACT FILE: the MIG planner searches with these measures and the exporter publishes them, so
"how much still fits" means the same in a plan, in ``nodeagent mig show`` and on ``/metrics``.
Nothing here touches NVML.

Fragmentation measure: for a layout, ``creatable[p]`` is how many more instances of profile
``p`` alone could still be created in the free slices (bounded by the profile's max count).
The *usable free capacity* is the number of free memory slices that at least one still-creatable
placement covers (slice 7 behind a 1g instance at slice 6 is not usable by anything). The
*fragmentation ratio* is the share of usable free capacity that the largest still-creatable
profile cannot use::

    ratio = 1 - slices(L) * creatable[L] / usable_free      (0 when nothing is free)

where ``L`` is the largest profile with ``creatable[L] > 0``. An empty GPU scores 0 (one 7g
takes everything), and so does a full one; a GPU whose free slices only fit small profiles
scores close to 1.

Node-level measures need the whole node (topology) or the pool policy (request sizes). Request
sizes (``pool.request_sizes``) name what the pool's jobs ask for: MIG profile names
(``1g.10gb``) and whole-GPU sizes (``gpu`` = one GPU, ``<N>gpu`` = N NVLink-connected GPUs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from nodeagent.gpu.types import Link, LinkKind, MigGeometry, MigProfile, Placement


class Placed(Protocol):
    """Anything with a profile name and a placement (a GpuInstance, a planned instance)."""

    @property
    def profile(self) -> str: ...

    @property
    def placement(self) -> Placement: ...


# --- the geometry in bitmask form ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SliceModel:
    """A geometry prepared for search: profiles in rank order, placements as slice bitmasks."""

    names: tuple[str, ...]  # rank order: most memory slices first, then most compute
    slices: tuple[int, ...]
    max_count: tuple[int, ...]
    placements: tuple[tuple[Placement, ...], ...]  # by start slice
    masks: tuple[tuple[int, ...], ...]
    index: Mapping[str, int]
    memory_slices: int


def slice_mask(p: Placement) -> int:
    """The memory slices a placement occupies, as a bit mask (bit i = slice i)."""
    return ((1 << p.size) - 1) << p.start


def memory_slices_of(profile: MigProfile) -> int:
    """Memory slices one instance occupies: its placement size (NVML's ``sliceCount`` counts
    SM slices, which differ for 3g and 7g, so the placements are the authority)."""
    return profile.placements[0].size if profile.placements else profile.slices


@lru_cache(maxsize=64)
def slice_model(geometry: MigGeometry) -> SliceModel:
    """The geometry prepared for counting and search (cached: geometries are few and fixed)."""
    profiles = sorted(
        geometry.profiles, key=lambda p: (-memory_slices_of(p), -p.compute_slices, p.name)
    )
    placements = tuple(tuple(sorted(p.placements, key=lambda q: q.start)) for p in profiles)
    return SliceModel(
        names=tuple(p.name for p in profiles),
        slices=tuple(memory_slices_of(p) for p in profiles),
        max_count=tuple(p.max_count for p in profiles),
        placements=placements,
        masks=tuple(tuple(slice_mask(q) for q in group) for group in placements),
        index={p.name: i for i, p in enumerate(profiles)},
        memory_slices=geometry.memory_slices,
    )


def rank_order(geometry: MigGeometry) -> tuple[str, ...]:
    """Profile names largest first: the order in which capacity is compared and shown."""
    return slice_model(geometry).names


def occupancy(m: SliceModel, instances: Iterable[Placed]) -> tuple[int, list[int]]:
    """(occupied slice mask, instances per profile in rank order) of a layout."""
    occ = 0
    counts = [0] * len(m.names)
    for inst in instances:
        occ |= slice_mask(inst.placement)
        i = m.index.get(inst.profile)
        if i is not None:
            counts[i] += 1
    return occ, counts


def creatable_vector(m: SliceModel, occ: int, counts: Sequence[int]) -> tuple[int, ...]:
    """How many more of each profile (rank order) fit beside ``occ`` and ``counts``."""
    out = []
    for p, masks in enumerate(m.masks):
        room = m.max_count[p] - counts[p]
        n = 0
        taken = occ
        # Placements of one profile all have the same size, so taking them greedily by start
        # (= by end) is the optimal interval packing.
        for mk in masks:
            if n >= room:
                break
            if mk & taken == 0:
                taken |= mk
                n += 1
        out.append(n)
    return tuple(out)


def fragmentation_of(m: SliceModel, occ: int, vec: Sequence[int]) -> float:
    """The fragmentation ratio of a layout from its mask and creatable vector."""
    cover = 0
    for p, masks in enumerate(m.masks):
        if vec[p] > 0:
            for mk in masks:
                if mk & occ == 0:
                    cover |= mk
    usable = cover.bit_count()
    if usable == 0:
        return 0.0
    largest = next(p for p in range(len(vec)) if vec[p] > 0)
    return 1.0 - m.slices[largest] / usable


def fits_beside(m: SliceModel, occ: int, need: Sequence[int]) -> bool:
    """Whether instances of the profiles ``need`` (rank indices, equal ones adjacent) have legal
    placements beside the occupied slices ``occ``; the first arrangement found ends the search."""

    def dfs(k: int, occ: int, lowest: int) -> bool:
        if k == len(need):
            return True
        p = need[k]
        masks = m.masks[p]
        for j in range(lowest, len(masks)):
            if masks[j] & occ == 0:
                nxt = k + 1
                if dfs(nxt, occ | masks[j], j + 1 if nxt < len(need) and need[nxt] == p else 0):
                    return True
        return False

    return dfs(0, occ, 0)


@lru_cache(maxsize=4096)
def room_beside(geometry: MigGeometry, held: tuple[str, ...], profile: str) -> int:
    """How many instances of ``profile`` one GPU can hold together with instances of the
    profiles ``held`` (sorted names), wherever those sit: the most the GPU could offer if its
    layout were remade around what workloads hold. Beyond the slices, placements bound it (an
    A100 has 8 memory slices but room for 7 ``1g.5gb``), and so do the profiles' maximum
    counts. 0 when the held instances alone have no legal layout."""
    m = slice_model(geometry)
    if profile not in m.index:
        return 0
    base = sorted(m.index[name] for name in held if name in m.index)
    if not fits_beside(m, 0, base):
        return 0
    p = m.index[profile]
    k = 0
    while base.count(p) + k < m.max_count[p] and fits_beside(m, 0, sorted([*base, *[p] * (k + 1)])):
        k += 1
    return k


def creatable(geometry: MigGeometry, instances: Iterable[Placed]) -> dict[str, int]:
    """How many more instances of each profile (alone) could be created beside ``instances``."""
    m = slice_model(geometry)
    occ, counts = occupancy(m, instances)
    return dict(zip(m.names, creatable_vector(m, occ, counts), strict=True))


def fragmentation_ratio(geometry: MigGeometry, instances: Iterable[Placed]) -> float:
    """The share of usable free capacity the largest still-creatable profile cannot use (0..1)."""
    m = slice_model(geometry)
    occ, counts = occupancy(m, instances)
    return fragmentation_of(m, occ, creatable_vector(m, occ, counts))


def capacity_key(geometry: MigGeometry, instances: Iterable[Placed]) -> tuple[int, ...]:
    """The creatable counts largest profile first; a bigger tuple means more future capacity."""
    m = slice_model(geometry)
    occ, counts = occupancy(m, instances)
    return creatable_vector(m, occ, counts)


def placement_losses(
    m: SliceModel, occ: int, counts: Sequence[int], p: int
) -> list[tuple[tuple[int, ...], Placement]]:
    """Each free legal placement of profile ``p`` (rank index) beside ``occ`` and ``counts``,
    with the future capacity it costs: the drop in the creatable counts, largest profile first.

    In start order; empty when the profile's max count is reached. The planner's online
    placement and the DRA driver's published placement order both rank by this loss.
    """
    if counts[p] >= m.max_count[p]:
        return []
    before = creatable_vector(m, occ, counts)
    after_counts = list(counts)
    after_counts[p] += 1
    out = []
    for j, mk in enumerate(m.masks[p]):
        if mk & occ:
            continue
        after = creatable_vector(m, occ | mk, after_counts)
        out.append((tuple(b - a for b, a in zip(before, after, strict=True)), m.placements[p][j]))
    return out


def preferred_placements(
    geometry: MigGeometry, instances: Iterable[Placed], profile: str
) -> list[Placement]:
    """The free legal placements of one more ``profile`` instance, the planner's choice first:
    least future capacity lost (see :func:`placement_losses`), then the lowest start slice.

    Empty when nothing fits or the profile is at its max count; ValueError for a profile the
    model does not offer.
    """
    m = slice_model(geometry)
    p = m.index.get(profile)
    if p is None:
        raise ValueError(f"{geometry.model} offers no profile {profile!r}")
    occ, counts = occupancy(m, instances)
    ranked = sorted(placement_losses(m, occ, counts, p), key=lambda lp: (lp[0], lp[1].start))
    return [placement for _, placement in ranked]


# --- the node ----------------------------------------------------------------------------------

_WHOLE_GPU = re.compile(r"^(?:(\d+)\s*)?gpus?$")


def whole_gpu_sizes(request_sizes: Iterable[str]) -> list[int]:
    """The whole-GPU request sizes (``gpu`` -> 1, ``4gpu`` -> 4), ascending."""
    sizes = set()
    for size in request_sizes:
        match = _WHOLE_GPU.match(size.strip().lower())
        if match:
            sizes.add(int(match.group(1) or 1))
    return sorted(n for n in sizes if n > 0)


def nvlink_islands(
    gpus: Sequence[int], topology: Mapping[tuple[int, int], Link]
) -> list[tuple[int, ...]]:
    """The groups of ``gpus`` connected to each other by NVLink, each sorted, by lowest member.

    Connectivity is transitive here: on NVSwitch systems every pair is NVLinked, on bridged
    pairs (H100 NVL) each pair forms its own group.
    """
    remaining = set(gpus)
    groups = []
    while remaining:
        seed = min(remaining)
        remaining.discard(seed)
        group = {seed}
        frontier = [seed]
        while frontier:
            a = frontier.pop()
            for b in sorted(remaining):
                link = topology.get((a, b)) or topology.get((b, a))
                if link is not None and link.kind is LinkKind.NVLINK:
                    remaining.discard(b)
                    group.add(b)
                    frontier.append(b)
        groups.append(tuple(sorted(group)))
    return groups


def nvlink_components(free: Sequence[int], topology: Mapping[tuple[int, int], Link]) -> list[int]:
    """Sizes of the groups of ``free`` GPUs connected to each other by NVLink, largest first."""
    return sorted((len(g) for g in nvlink_islands(free, topology)), reverse=True)


def stranded_gpus(components: Sequence[int], request_sizes: Iterable[str]) -> int:
    """Free whole GPUs that no whole-GPU request size of the pool can use.

    With no request sizes at all, any free GPU counts as usable. With sizes but no whole-GPU
    size (a MIG-only pool), every free whole GPU is stranded. Otherwise a connected group of
    ``k`` free GPUs serves ``floor(k / n) * n`` of them for the smallest size ``n``; the rest
    are stranded (a 3-GPU group in a pool that asks for 2-GPU jobs strands one).
    """
    sizes = list(request_sizes)
    if not sizes:
        return 0
    whole = whole_gpu_sizes(sizes)
    if not whole:
        return sum(components)
    smallest = whole[0]
    return sum(k - (k // smallest) * smallest for k in components)


def stranded_slices(
    geometry: MigGeometry, instances: Sequence[Placed], request_sizes: Iterable[str]
) -> int:
    """Free memory slices that no still-creatable placement of a requested profile covers.

    The requested profiles are the pool's MIG request sizes this model offers; when the pool
    lists none, every profile of the model counts (slices nothing can use at all are stranded).
    """
    wanted = {s.strip() for s in request_sizes}
    profiles = [p for p in geometry.profiles if not wanted or p.name in wanted]
    occupied = 0
    for inst in instances:
        occupied |= ((1 << inst.placement.size) - 1) << inst.placement.start
    counts = creatable(geometry, instances)
    covered = 0
    for profile in profiles:
        if counts.get(profile.name, 0) <= 0:
            continue
        for placement in profile.placements:
            mask = ((1 << placement.size) - 1) << placement.start
            if mask & occupied == 0:
                covered |= mask
    free = geometry.memory_slices - occupied.bit_count()
    return free - covered.bit_count()
