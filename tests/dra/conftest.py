"""Simulated nodes shaped for the DRA tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import MigGeometry, MigProfile
from nodeagent.testing import mps_control
from nodeagent.testing.nodes import enable_mig

VARIANTS = ("off", "static", "dynamic")


def by_size(geometry: MigGeometry) -> list[MigProfile]:
    """Profiles smallest first (memory slices, then memory)."""
    return sorted(geometry.profiles, key=lambda p: (p.placements[0].size, p.memory_bytes))


def shape(node: GpuNode, variant: str) -> None:
    """``off``: as the preset comes; ``static``: MIG on, GPU 0 holds a half-size and a smallest
    instance, the other MIG GPUs none; ``dynamic``: MIG on everywhere, one pre-existing smallest
    instance at the last placement of the last GPU."""
    if variant == "off":
        return
    capable = [i for i in range(node.count()) if node.info(i).mig_capable]
    if not capable:
        return
    enable_mig(node, {i: [] for i in capable})
    geometry = node.mig_geometry(capable[0])
    assert geometry is not None
    sizes = by_size(geometry)
    if variant == "static":
        half = next(p for p in sizes if p.placements[0].size * 2 == geometry.memory_slices)
        node.create_gpu_instance(capable[0], half.name, half.placements[0])
        node.create_gpu_instance(capable[0], sizes[0].name, sizes[0].placements[-1])
        return
    node.create_gpu_instance(capable[-1], sizes[0].name, sizes[0].placements[-1])


@pytest.fixture
def shaped(make_node: Callable[..., GpuNode]) -> Callable[[str, str], GpuNode]:
    """``shaped(preset, variant)``: a simulated node, shaped by :func:`shape`."""

    def make(preset: str, variant: str) -> GpuNode:
        node = make_node(preset)
        shape(node, variant)
        return node

    return make


@pytest.fixture
def mps_dir() -> Iterator[Path]:
    """A short directory for MPS pipe sockets (unix socket paths are limited to 107 bytes)
    holding the stand-in ``nvidia-cuda-mps-control``."""
    path = Path(tempfile.mkdtemp(prefix="dra-mps-"))
    mps_control.install(path)
    yield path
    for pid_file in path.rglob("nvidia-cuda-mps-control.pid"):  # a daemon a failed test left
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)
