"""Shared fixtures for the MIG tests: GPU geometries and simulated nodes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.gpu.types import MigGeometry, MigProfile, Placement

GIB = 1 << 30


def _profile(
    name: str, pid: int, idx: int, slices: int, g: int, maxc: int, starts: list[int]
) -> MigProfile:
    return MigProfile(
        name=name,
        profile_id=pid,
        nvml_index=idx,
        slices=slices,
        compute_slices=g,
        multiprocessors=14 * g,
        memory_bytes=slices * 5 * GIB,
        max_count=maxc,
        copy_engines=g,
        decoders=0,
        jpeg_decoders=0,
        ofa=0,
        placements=tuple(Placement(s, slices) for s in starts),
    )


def seven_slice(
    model: str, one: str, one_me: str, one2x: str, two: str, three: str, four: str, seven: str
) -> MigGeometry:
    """An A100/H100/H200-shaped geometry (reference notes section 3, real -lgipp output)."""
    return MigGeometry(
        model=model,
        memory_slices=8,
        profiles=(
            _profile(one, 19, 0x0, 1, 1, 7, [0, 1, 2, 3, 4, 5, 6]),
            _profile(one_me, 20, 0x7, 1, 1, 1, [0, 1, 2, 3, 4, 5, 6]),
            _profile(one2x, 15, 0x9, 2, 1, 4, [0, 2, 4, 6]),
            _profile(two, 14, 0x1, 2, 2, 3, [0, 2, 4]),
            _profile(three, 9, 0x2, 4, 3, 2, [0, 4]),
            _profile(four, 5, 0x3, 4, 4, 1, [0]),
            _profile(seven, 0, 0x4, 8, 7, 1, [0]),
        ),
    )


TABLE_GEOMETRIES: dict[str, MigGeometry] = {
    "a100-40": seven_slice(
        "NVIDIA A100-SXM4-40GB",
        "1g.5gb",
        "1g.5gb+me",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    ),
    "h100-80": seven_slice(
        "NVIDIA H100 80GB HBM3",
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ),
    "h200": seven_slice(
        "NVIDIA H200",
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ),
    "a30": MigGeometry(
        model="NVIDIA A30",
        memory_slices=4,
        profiles=(
            _profile("1g.6gb", 14, 0x0, 1, 1, 4, [0, 1, 2, 3]),
            _profile("1g.6gb+me", 21, 0x7, 1, 1, 1, [0, 1, 2, 3]),
            _profile("2g.12gb", 5, 0x1, 2, 2, 2, [0, 2]),
            _profile("2g.12gb+me", 6, 0x8, 2, 2, 1, [0, 2]),
            _profile("4g.24gb", 0, 0x3, 4, 4, 1, [0]),
        ),
    ),
}

# Simulator preset and GPU index whose geometry stands for each table model.
SIM_SOURCES = {"a100-40": "dgx-a100", "h100-80": "dgx-h100", "h200": "hgx-h200", "a30": "a30x4"}


def sim_geometry(key: str, tmp: Path) -> MigGeometry | None:
    """The geometry the simulator reports for this model, or None when the sim is not there."""
    try:
        from nodeagent.gpu.node import open_node

        node = open_node(simulate=SIM_SOURCES[key], state_dir=tmp)
        try:
            return node.mig_geometry(0)
        finally:
            node.close()
    except (NotImplementedError, ImportError):  # the simulator has not landed yet
        return None


@pytest.fixture(params=sorted(TABLE_GEOMETRIES), scope="session")
def geometry(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> MigGeometry:
    """Each MIG model's geometry: from the simulator (the real path) when it is available."""
    key: str = request.param
    return sim_geometry(key, tmp_path_factory.mktemp(key)) or TABLE_GEOMETRIES[key]


@pytest.fixture
def a100() -> MigGeometry:
    return TABLE_GEOMETRIES["a100-40"]


@pytest.fixture
def h100() -> MigGeometry:
    return TABLE_GEOMETRIES["h100-80"]


@pytest.fixture
def sim_state(tmp_path: Path) -> Callable[[], Path]:
    """A fresh simulator state directory per test."""
    return lambda: tmp_path / "sim"
