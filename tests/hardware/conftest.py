"""Fixtures for the read-only hardware checks (``-m nvml``): the real GPUs of this host."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nodeagent.agent.backend import open_node
from nodeagent.gpu.errors import DriverNotLoaded
from nodeagent.gpu.node import GpuNode


@pytest.fixture(scope="session")
def hw_node() -> Iterator[GpuNode]:
    """The real NVML node; the test is skipped where NVML cannot be initialised."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("NODEAGENT_SIMULATE", raising=False)
        try:
            node = open_node(simulate=None)
        except DriverNotLoaded as exc:
            pytest.skip(f"NVML is not available on this host: {exc}")
    if node.count() == 0:
        node.close()
        pytest.skip("NVML found no GPU on this host")
    yield node
    node.close()
