"""Shaping simulated nodes for tests and benchmarks, through the same calls an operator's
tools make (the simulator's control API or the GPU layer for mode and reset, the GPU layer for
instances)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import Placement
from nodeagent.sim.control import SimControl


def split_into(node: GpuNode, control: SimControl, gpus: Iterable[int], profile: str) -> None:
    """Turn MIG on for ``gpus`` and fill each with as many ``profile`` instances as fit."""
    for gpu in gpus:
        control.set_mig_mode(gpu, True)
        control.reset_gpu(gpu)
        geometry = node.mig_geometry(gpu)
        assert geometry is not None, f"GPU {gpu} is not MIG-capable"
        found = geometry.profile(profile)
        assert found is not None, f"GPU {gpu} offers no {profile}"
        for placement in found.placements[: found.max_count]:
            node.create_gpu_instance(gpu, profile, placement)


def enable_mig(node: GpuNode, layout: Mapping[int, list[str]]) -> None:
    """Put GPUs into MIG mode and create instances: {gpu index: [profile, ...]}, packed left."""
    for index, profiles in layout.items():
        change = node.set_mig_mode(index, True)
        if change.reset_required:
            node.reset_gpu(index)
        geometry = node.mig_geometry(index)
        assert geometry is not None
        used: list[Placement] = []
        for name in profiles:
            profile = geometry.profile(name)
            assert profile is not None, name
            placement = next(p for p in profile.placements if not any(p.overlaps(u) for u in used))
            used.append(placement)
            node.create_gpu_instance(index, name, placement)
