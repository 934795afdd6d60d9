"""Fixtures for the simulator's own tests: initialised SimNvml instances on private state dirs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from nodeagent.sim.control import SimControl
from nodeagent.sim.nvml import SimNvml
from nodeagent.testing.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_sim(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., SimNvml]]:
    """``make_sim(preset)`` -> an initialised SimNvml on its own state dir (shut down after)."""
    opened: list[SimNvml] = []

    def factory(preset: str = "dgx-a100", state_dir: Path | None = None) -> SimNvml:
        sim = SimNvml(state_dir or tmp_path / f"state-{preset}-{len(opened)}", preset, clock=clock)
        sim.nvmlInit()
        opened.append(sim)
        return sim

    yield factory
    for sim in opened:
        while sim._init_count > 0:
            sim.nvmlShutdown()


@pytest.fixture
def control_for(clock: FakeClock) -> Callable[[SimNvml], SimControl]:
    """The control API on the same state dir as a SimNvml."""

    def factory(sim: SimNvml) -> SimControl:
        return SimControl(sim.store.state_dir, clock=clock)

    return factory


def enable_mig(sim: SimNvml, index: int = 0) -> object:
    """Turn MIG on for GPU ``index`` (set pending, reset) and return its handle."""
    handle = sim.nvmlDeviceGetHandleByIndex(index)
    sim.nvmlDeviceSetMigMode(handle, sim.NVML_DEVICE_MIG_ENABLE)
    sim.sim_reset_gpu(index)
    return handle


def two_slice_mig_device(sim: SimNvml) -> tuple[object, object, object]:
    """GPU 0 with MIG on and one 2g GPU instance (profile 14) under one whole compute instance.

    Returns the GPU's handle, the GPU instance and the MIG device's handle.
    """
    handle = enable_mig(sim)
    gi = sim.nvmlDeviceCreateGpuInstance(handle, 14)
    sim.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE)
    return handle, gi, sim.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
