"""An independent exhaustive reference for whole-GPU GetPreferredAllocation (tests and benchmarks).

It shares no code with ``nodeagent_device_plugin.preferred``, so a mistake there cannot hide by
being repeated here. Everything is recomputed from the node snapshot with the facts of NVIDIA's
best-effort policy (go-gpuallocator):

- a pair scores by its PCIe path: cross-CPU 10, same CPU 20, host bridge 30, several switches
  40, one switch 50, same board 60, plus 100 per NVLink. The snapshot reports an NVLink pair
  without its PCIe path, so (as the plugin documents) that part comes from the NUMA nodes:
  same node 20, otherwise 10. A pair the snapshot does not report counts as cross-CPU.
- a set scores the sum of its pair scores.
- the optimum is the set S of ``size`` GPUs, holding ``must_include``, that maximises
  score(S) + the best split of the other available GPUs into groups of ``size`` (the last group
  shorter when they do not divide); ties go to the higher score(S).

The search is brute force: every set of the requested size is tried, and for each, every
partition of the remainder (generated as set partitions, one GPU at a time, not by the
plugin's recursion). Fine for the presets (at most 8 GPUs); refused above 10.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

from nodeagent.gpu.types import Link, NodeSnapshot

# The PCIe part of a pair score, by the ``nvidia-smi topo -m`` cell the snapshot reports.
PCIE_BY_LABEL = {"SYS": 10, "NODE": 20, "PHB": 30, "PXB": 40, "PIX": 50, "X": 60}
SAME_CPU, CROSS_CPU = 20, 10
PER_NVLINK = 100
MAX_GPUS = 10  # brute force beyond this is too slow to be useful in a test


class Objective(NamedTuple):
    """How good a choice is: total = own + rest."""

    total: int
    own: int  # the chosen set's score
    rest: int  # the best split of the GPUs left over


def _pair_from_link(link: Link | None, numa_a: int | None, numa_b: int | None) -> int:
    """One pair's score, read from the link's ``nvidia-smi`` label (``NV18``, ``PIX``...)."""
    if link is None:
        return CROSS_CPU
    nvlinks = re.fullmatch(r"NV(\d+)", link.label)
    if nvlinks is None:
        return PCIE_BY_LABEL[link.label]
    pcie = SAME_CPU if numa_a is not None and numa_a == numa_b else CROSS_CPU
    return PER_NVLINK * int(nvlinks.group(1)) + pcie


class Reference:
    """Pair scores of one node, with brute-force scoring and the optimum."""

    def __init__(self, pairs: Mapping[frozenset[int], int]) -> None:
        self.pairs = dict(pairs)

    @classmethod
    def from_snapshot(cls, snapshot: NodeSnapshot) -> Reference:
        """Scores for every pair of the snapshot's GPUs."""
        numa = {g.info.index: g.info.numa_node for g in snapshot.gpus}
        return cls.from_topology(snapshot.topology, numa)

    @classmethod
    def from_topology(
        cls, topology: Mapping[tuple[int, int], Link], numa: Mapping[int, int | None]
    ) -> Reference:
        """Scores for every pair of the GPUs in ``numa`` (GPU index -> NUMA node)."""
        pairs: dict[frozenset[int], int] = {}
        for a in numa:
            for b in numa:
                if a < b:
                    link = topology.get((a, b), topology.get((b, a)))
                    pairs[frozenset((a, b))] = _pair_from_link(link, numa[a], numa[b])
        return cls(pairs)

    def set_score(self, gpus: Sequence[int]) -> int:
        """The sum of the scores of every pair in ``gpus``."""
        return sum(
            self.pairs.get(frozenset((a, b)), CROSS_CPU)
            for i, a in enumerate(gpus)
            for b in gpus[i + 1 :]
        )

    def best_split(self, gpus: Sequence[int], size: int) -> int:
        """The best total score over every partition of ``gpus`` into groups of ``size``."""
        if not gpus:
            return 0
        return max(sum(self.set_score(g) for g in groups) for groups in _splits(gpus, size))

    def score(self, available: Sequence[int], chosen: Sequence[int], size: int) -> Objective:
        """The objective of taking ``chosen`` out of ``available``."""
        rest = [g for g in available if g not in chosen]
        own = self.set_score(list(chosen))
        split = self.best_split(rest, size)
        return Objective(own + split, own, split)

    def optimum(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> Objective:
        """The best objective over every allowed set (ties: the higher own score)."""
        pool = sorted(set(available))
        if len(pool) > MAX_GPUS:
            raise ValueError(f"the reference is brute force: at most {MAX_GPUS} GPUs")
        best: Objective | None = None
        for chosen in itertools.combinations(pool, size):
            if not set(must_include) <= set(chosen):
                continue
            candidate = self.score(pool, chosen, size)
            if best is None or (candidate.total, candidate.own) > (best.total, best.own):
                best = candidate
        if best is None:
            raise ValueError(f"no set of {size} from {pool} holds {sorted(must_include)}")
        return best


def _splits(gpus: Sequence[int], size: int) -> Iterator[list[list[int]]]:
    """Every partition of ``gpus`` into groups of ``size`` and at most one shorter group.

    Set partitions are built one GPU at a time (each joins an open group or starts a new one),
    and only those with exactly the wanted group sizes are kept.
    """
    full, short = divmod(len(gpus), size)
    wanted = sorted([size] * full + ([short] if short else []))

    def grow(i: int, groups: list[list[int]]) -> Iterator[list[list[int]]]:
        if i == len(gpus):
            if sorted(len(g) for g in groups) == wanted:
                yield [list(g) for g in groups]
            return
        for group in groups:
            if len(group) < size:
                group.append(gpus[i])
                yield from grow(i + 1, groups)
                group.pop()
        if len(groups) < len(wanted):
            groups.append([gpus[i]])
            yield from grow(i + 1, groups)
            groups.pop()

    yield from grow(0, [])
