"""Shared fixtures for the MIG tests: GPU geometries and simulated nodes."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.agent.backend import open_node
from nodeagent.gpu.types import MigGeometry

# Simulator preset standing for each MIG model. The simulator's tables are checked against the
# reference tables in tests/sim/test_catalog.py; here they are read through the GPU layer,
# the path the planner gets its geometry from in production.
SIM_SOURCES = {"a100-40": "dgx-a100", "h100-80": "dgx-h100", "h200": "hgx-h200", "a30": "a30x4"}


@functools.cache
def sim_geometry(key: str) -> MigGeometry:
    """The geometry the simulator reports for this model (GPU 0 of its preset)."""
    with tempfile.TemporaryDirectory() as tmp:
        node = open_node(simulate=SIM_SOURCES[key], state_dir=Path(tmp))
        try:
            geometry = node.mig_geometry(0)
        finally:
            node.close()
    assert geometry is not None, key
    return geometry


@pytest.fixture(params=sorted(SIM_SOURCES), scope="session")
def geometry(request: pytest.FixtureRequest) -> MigGeometry:
    """Each MIG model's geometry."""
    return sim_geometry(request.param)


@pytest.fixture
def a100() -> MigGeometry:
    return sim_geometry("a100-40")


@pytest.fixture
def h100() -> MigGeometry:
    return sim_geometry("h100-80")


@pytest.fixture
def sim_state(tmp_path: Path) -> Callable[[], Path]:
    """A fresh simulator state directory per test."""
    return lambda: tmp_path / "sim"
