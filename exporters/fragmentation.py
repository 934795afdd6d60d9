"""Node-level capacity measures: free whole GPUs, NVLink-connected free sets, stranded capacity.

Per-GPU MIG measures (creatable counts, fragmentation ratio) come from
:mod:`nodeagent_mig.planner`; this module adds what needs the whole node (topology) or the pool
policy (request sizes).

Request sizes (``pool.request_sizes``) name what the pool's jobs ask for: MIG profile names
(``1g.10gb``) and whole-GPU sizes (``gpu`` = one GPU, ``<N>gpu`` = N NVLink-connected GPUs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from nodeagent.gpu.types import GpuInstance, Link, LinkKind, MigGeometry
from nodeagent_mig import planner

_WHOLE_GPU = re.compile(r"^(?:(\d+)\s*)?gpus?$")


def whole_gpu_sizes(request_sizes: Iterable[str]) -> list[int]:
    """The whole-GPU request sizes (``gpu`` -> 1, ``4gpu`` -> 4), ascending."""
    sizes = set()
    for size in request_sizes:
        match = _WHOLE_GPU.match(size.strip().lower())
        if match:
            sizes.add(int(match.group(1) or 1))
    return sorted(n for n in sizes if n > 0)


def nvlink_components(free: Sequence[int], topology: Mapping[tuple[int, int], Link]) -> list[int]:
    """Sizes of the groups of ``free`` GPUs connected to each other by NVLink, largest first.

    Connectivity is transitive here: on NVSwitch systems every pair is NVLinked, on bridged
    pairs (H100 NVL) each pair forms its own group.
    """
    remaining = set(free)
    sizes = []
    while remaining:
        seed = remaining.pop()
        group = {seed}
        frontier = [seed]
        while frontier:
            a = frontier.pop()
            for b in list(remaining):
                link = topology.get((a, b)) or topology.get((b, a))
                if link is not None and link.kind is LinkKind.NVLINK:
                    remaining.discard(b)
                    group.add(b)
                    frontier.append(b)
        sizes.append(len(group))
    return sorted(sizes, reverse=True)


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
    geometry: MigGeometry, instances: Sequence[GpuInstance], request_sizes: Iterable[str]
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
    counts = planner.creatable(geometry, instances)
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
