"""Shaping simulated nodes for tests and benchmarks, through the same calls an operator's
tools make (the simulator's control API for mode and reset, the GPU layer for instances)."""

from __future__ import annotations

from collections.abc import Iterable

from nodeagent.gpu.node import GpuNode
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
