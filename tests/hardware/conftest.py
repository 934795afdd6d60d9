"""Fixtures for the read-only hardware checks (``-m nvml``): the real GPUs of this host.

With ``NODEAGENT_HARDWARE_REHEARSAL`` naming a simulator state directory, the same checks run
against that simulated node instead (tests/hardware/test_rehearsal.py does, so that the checks
themselves are exercised where no GPU exists).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.backend import open_node
from nodeagent.gpu.errors import DriverNotLoaded
from nodeagent.gpu.node import GpuNode
from tests.hardware.record import collect

REHEARSAL = "NODEAGENT_HARDWARE_REHEARSAL"


def _open() -> GpuNode:
    rehearsal = os.environ.get(REHEARSAL)
    if rehearsal:
        from nodeagent.sim.control import SimControl

        preset = str(SimControl(rehearsal).state()["preset"])
        return open_node(simulate=preset, state_dir=Path(rehearsal))
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("NODEAGENT_SIMULATE", raising=False)
        return open_node(simulate=None)


@pytest.fixture(scope="session")
def hw_node() -> Iterator[GpuNode]:
    """The real NVML node; the test is skipped where NVML cannot be initialised."""
    try:
        node = _open()
    except DriverNotLoaded as exc:
        pytest.skip(f"NVML is not available on this host: {exc}")
    if node.count() == 0:
        node.close()
        pytest.skip("NVML found no GPU on this host")
    yield node
    node.close()


@pytest.fixture(scope="session")
def hw_record(hw_node: GpuNode) -> dict[str, Any]:
    """What ``record.py`` prints for this host, read once."""
    return collect(hw_node)
