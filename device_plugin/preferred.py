"""GetPreferredAllocation: which devices a container should get.

Whole GPUs use the link scores of NVIDIA's best-effort policy (go-gpuallocator): a pair scores
by its PCIe path (cross-CPU 10, same CPU 20, host bridge 30, several switches 40, one switch 50,
same board 60) plus 100 per NVLink. The chosen set S maximises

    score(S) + best_partition(available - S)

where ``best_partition`` splits the GPUs left over into groups of the same size (the last group
smaller when they do not divide) with the highest total score. That is the choice NVIDIA's policy
makes (best partition of all available GPUs whose winning group holds ``must_include``), so a
choice never strands the remaining GPUs badly connected. Here it is computed exactly by dynamic
programming over bitmasks, for nodes of up to ``EXACT_LIMIT`` GPUs; larger sets fall back to a
greedy choice. Ties go to the higher score(S), then to the lowest GPU indices.

Replicas (time-slicing, MPS) and MIG devices are placed by physical GPU: ``spread`` prefers the
GPU with the fewest devices already in use, ``pack`` the GPU with the most.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from functools import lru_cache

from nodeagent.config.pool_policy import ReplicaPlacement
from nodeagent.gpu.types import Link, LinkKind
from nodeagent_device_plugin.resources import PluginDevice

EXACT_LIMIT = 16  # whole-GPU choices are exact up to this many available GPUs

# NVIDIA's best-effort link scores for the PCIe part of a pair.
PCIE_SCORES: dict[LinkKind, int] = {
    LinkKind.SYSTEM: 10,  # CrossCPU
    LinkKind.NODE: 20,  # SameCPU
    LinkKind.PCIE_HOSTBRIDGE: 30,  # HostBridge
    LinkKind.PCIE_MULTIPLE: 40,  # MultiSwitch
    LinkKind.PCIE_SINGLE: 50,  # SingleSwitch
    LinkKind.SELF: 60,  # SameBoard
}
NVLINK_SCORE = 100  # per NVLink between the pair


def pair_score(link: Link | None, numa_a: int | None, numa_b: int | None) -> int:
    """NVIDIA's score of one GPU pair.

    The snapshot reports one link per pair: for an NVLink pair the PCIe path is not reported, so
    it is taken from the NUMA nodes (same CPU 20, cross CPU 10) to keep NVSwitch nodes, where
    every pair has the same NVLinks, from being topology-blind.
    """
    if link is None:
        return PCIE_SCORES[LinkKind.SYSTEM]
    if link.kind is LinkKind.NVLINK:
        same_cpu = numa_a is not None and numa_a == numa_b
        pcie = PCIE_SCORES[LinkKind.NODE] if same_cpu else PCIE_SCORES[LinkKind.SYSTEM]
        return NVLINK_SCORE * link.nvlink_count + pcie
    return PCIE_SCORES[link.kind]


class ScoreTable:
    """Pair scores between GPU indices, with set scores and the exact partition search."""

    def __init__(self, scores: Mapping[tuple[int, int], int]) -> None:
        self._scores = dict(scores)

    @classmethod
    def from_topology(
        cls, topology: Mapping[tuple[int, int], Link], numa: Mapping[int, int | None]
    ) -> ScoreTable:
        """Scores for every pair of the GPUs in ``numa`` (index -> NUMA node)."""
        scores: dict[tuple[int, int], int] = {}
        for a, b in itertools.combinations(sorted(numa), 2):
            link = topology.get((a, b)) or topology.get((b, a))
            scores[(a, b)] = scores[(b, a)] = pair_score(link, numa[a], numa[b])
        return cls(scores)

    def pair(self, a: int, b: int) -> int:
        """The score of GPUs a and b (unknown pairs count as cross-CPU)."""
        return self._scores.get((a, b), PCIE_SCORES[LinkKind.SYSTEM])

    def set_score(self, gpus: Sequence[int]) -> int:
        """The sum of pair scores within a set."""
        return sum(self.pair(a, b) for a, b in itertools.combinations(gpus, 2))

    def best_partition(self, gpus: Sequence[int], size: int) -> int:
        """The highest total score of splitting ``gpus`` into groups of ``size`` (exact)."""
        order = tuple(sorted(gpus))
        return self._partition(order, size)

    @lru_cache(maxsize=65536)  # noqa: B019 - the table lives as long as its resource
    def _partition(self, gpus: tuple[int, ...], size: int) -> int:
        """Exact DP: the lowest GPU goes into a full group or, when needed, the short group."""
        if len(gpus) <= size:
            return self.set_score(gpus)
        first, rest = gpus[0], gpus[1:]
        short = len(gpus) % size
        best = -1
        sizes = (size, short) if short else (size,)
        for group_size in sizes:
            for mates in itertools.combinations(rest, group_size - 1):
                remaining = tuple(g for g in rest if g not in mates)
                # After the short group is placed the rest divides evenly into full groups.
                value = self.set_score((first, *mates)) + self._partition(remaining, size)
                best = max(best, value)
        return best


def preferred_gpus(
    table: ScoreTable, available: Sequence[int], must_include: Sequence[int], size: int
) -> list[int]:
    """The GPU indices to allocate (exact up to EXACT_LIMIT available GPUs).

    Raises ValueError when the request cannot be met (size too large, must_include not
    available or larger than size).
    """
    avail = sorted(set(available))
    must = sorted(set(must_include))
    if size <= 0 or size > len(avail):
        raise ValueError(f"allocation_size {size} with {len(avail)} devices available")
    if not set(must) <= set(avail) or len(must) > size:
        raise ValueError(f"must_include {must} is not a subset of available within size {size}")
    if size == len(avail):
        return avail
    free = [g for g in avail if g not in must]
    if len(avail) > EXACT_LIMIT:
        return _greedy(table, free, must, size)
    best_key: tuple[int, int, tuple[int, ...]] | None = None
    best: list[int] = []
    for extra in itertools.combinations(free, size - len(must)):
        chosen = tuple(sorted((*must, *extra)))
        remaining = [g for g in avail if g not in chosen]
        own = table.set_score(chosen)
        total = own + table.best_partition(remaining, size)
        # Higher total, then higher own score, then lowest indices (negated for max()).
        key = (total, own, tuple(-g for g in chosen))
        if best_key is None or key > best_key:
            best_key, best = key, list(chosen)
    return best


def _greedy(table: ScoreTable, free: list[int], must: list[int], size: int) -> list[int]:
    """Grow the set one GPU at a time by best added score (large nodes only)."""
    chosen = list(must)
    pool = list(free)
    while len(chosen) < size:
        pick = max(pool, key=lambda g: (sum(table.pair(g, c) for c in chosen), -g))
        chosen.append(pick)
        pool.remove(pick)
    return sorted(chosen)


def preferred_replicas(
    devices: Mapping[str, PluginDevice],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    placement: ReplicaPlacement,
) -> list[str]:
    """Replica or MIG device IDs, chosen per physical GPU by ``placement``.

    "In use" on a GPU is the number of its devices that are not available (held by pods);
    ``spread`` takes from the least used GPU first (ties: fewest taken in this request), ``pack``
    from the most used (ties: most taken in this request). IDs are deterministic for a given
    input: remaining ties go to the lowest GPU index, then the lowest ID.
    """
    avail = [a for a in dict.fromkeys(available) if a in devices]
    chosen = [m for m in dict.fromkeys(must_include) if m in devices]
    if size > len(avail) or len(chosen) > size:
        raise ValueError(f"allocation_size {size} with {len(avail)} devices available")
    total: dict[str, int] = {}
    for device in devices.values():
        total[device.gpu_uuid] = total.get(device.gpu_uuid, 0) + 1
    free: dict[str, list[str]] = {}
    for device_id in avail:
        if device_id not in chosen:
            free.setdefault(devices[device_id].gpu_uuid, []).append(device_id)
    in_use = {gpu: total[gpu] - len(ids) for gpu, ids in free.items()}
    taken: dict[str, int] = {}
    for device_id in chosen:
        gpu = devices[device_id].gpu_uuid
        taken[gpu] = taken.get(gpu, 0) + 1
    sign = 1 if placement is ReplicaPlacement.SPREAD else -1
    while len(chosen) < size:
        candidates = [g for g, ids in free.items() if ids]
        gpu = min(
            candidates,
            key=lambda g: (
                sign * (in_use[g] + taken.get(g, 0)),
                sign * taken.get(g, 0),
                devices[free[g][0]].gpu_index,
            ),
        )
        pick = min(free[gpu])
        free[gpu].remove(pick)
        chosen.append(pick)
        taken[gpu] = taken.get(gpu, 0) + 1
    return chosen
