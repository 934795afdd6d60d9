"""GPM profiling in the snapshot: per GPU and per MIG instance, None where GPM is absent."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.nvml import Nvml
from nodeagent.gpu.profiling import ProfilingReader
from nodeagent.gpu.types import GpuState, Placement, Profiling
from nodeagent.sim.control import SimControl
from nodeagent.sim.nvml import SimNvml
from nodeagent.testing.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _node(tmp_path: Path, preset: str, clock: FakeClock) -> tuple[GpuNode, SimControl, SimNvml]:
    sim = SimNvml(tmp_path / preset, preset, clock=clock)
    node = GpuNode(sim)
    return node, SimControl(tmp_path / preset, clock=clock), sim


def _profiling(state: GpuState) -> Profiling:
    assert state.profiling is not None
    return state.profiling


def test_two_samples_make_an_interval(tmp_path: Path, clock: FakeClock) -> None:
    node, control, _ = _node(tmp_path, "dgx-h100", clock)
    with node:
        control.add_process(2, load=0.5)
        first = node.snapshot()
        # One sample only: no interval yet, so no figures (not zeros).
        assert all(g.profiling is None for g in first.gpus)
        clock.advance(1.0)
        second = node.snapshot()
        busy, idle = _profiling(second.gpus[2]), _profiling(second.gpus[0])
        assert busy.interval_s > 0.0
        coarse = second.gpus[2].telemetry
        assert coarse is not None
        assert coarse.utilization_gpu_ratio is not None
        # Consistent with the coarse utilisation: the engines are busy as often as it says,
        # the SMs for part of that time, the tensor pipes for part of the SM time.
        assert busy.graphics_active_ratio == pytest.approx(coarse.utilization_gpu_ratio, abs=0.01)
        assert busy.sm_active_ratio is not None
        assert busy.tensor_active_ratio is not None
        assert 0.0 < busy.tensor_active_ratio < busy.sm_active_ratio < coarse.utilization_gpu_ratio
        assert busy.dram_active_ratio is not None
        assert 0.0 < busy.dram_active_ratio < 1.0
        assert busy.pcie_rx_bytes_per_second is not None
        assert busy.pcie_rx_bytes_per_second > 1e6
        assert idle.sm_active_ratio == 0.0
        assert idle.nvlink_tx_bytes_per_second == 0.0


@pytest.mark.parametrize("preset", ["dgx-a100", "a30x4", "t4", "pcie-l40s"])
def test_gpus_without_gpm_have_none_and_say_so_once(
    tmp_path: Path, clock: FakeClock, preset: str, caplog: pytest.LogCaptureFixture
) -> None:
    node, _, sim = _node(tmp_path, preset, clock)
    with node, caplog.at_level(logging.INFO, logger="nodeagent.gpu.profiling"):
        for _ in range(3):
            snapshot = node.snapshot()
            clock.advance(1.0)
        assert all(g.profiling is None for g in snapshot.gpus)
        said = [r for r in caplog.records if "not supported" in r.getMessage()]
        assert len(said) == len(snapshot.gpus)  # one line per GPU, not one per pass
        assert not sim._gpm_samples  # never sampled


def test_mig_instances_carry_their_own_figures(tmp_path: Path, clock: FakeClock) -> None:
    node, control, _ = _node(tmp_path, "dgx-h100", clock)
    with node:
        control.set_mig_mode(0, True)
        busy = node.create_gpu_instance(0, "3g.40gb", Placement(0, 4))
        node.create_gpu_instance(0, "2g.20gb", Placement(4, 2))
        assert busy.uuid is not None
        control.add_process(0, mig_uuid=busy.uuid, load=0.3)
        node.snapshot()
        clock.advance(1.0)
        instances = {gi.profile: gi for gi in node.snapshot().gpus[0].mig_instances}
        loaded = instances["3g.40gb"].profiling
        quiet = instances["2g.20gb"].profiling
        assert loaded is not None
        assert quiet is not None
        # 0.3 of the GPU is 0.7 of a 3-slice instance (of 7), swinging 0.8..1.0 of it.
        assert loaded.graphics_active_ratio is not None
        assert 0.8 * 0.7 - 0.01 <= loaded.graphics_active_ratio <= 0.7 + 0.01
        assert quiet.sm_active_ratio == 0.0
        # Host links are the GPU's: NVML does not split them per instance.
        assert loaded.pcie_rx_bytes_per_second is None
        assert loaded.nvlink_tx_bytes_per_second is None


def test_destroyed_instances_release_their_samples(tmp_path: Path, clock: FakeClock) -> None:
    node, control, sim = _node(tmp_path, "dgx-h100", clock)
    with node:
        control.set_mig_mode(0, True)
        gi = node.create_gpu_instance(0, "1g.10gb", Placement(0, 1))
        node.snapshot()
        held = len(sim._gpm_samples)
        node.destroy_gpu_instance(0, gi.instance_id)
        node.snapshot()
        assert len(sim._gpm_samples) == held - 2
    assert not sim._gpm_samples  # closing the node frees the rest


def test_switched_off_takes_no_samples(tmp_path: Path, clock: FakeClock) -> None:
    node, control, sim = _node(tmp_path, "hgx-h200", clock)
    with node:
        node.profiling_enabled = False
        control.add_process(1, load=0.5)
        node.snapshot()
        clock.advance(1.0)
        assert all(g.profiling is None for g in node.snapshot().gpus)
        assert not sim._gpm_samples


def test_profiling_is_not_part_of_an_instance_identity(tmp_path: Path, clock: FakeClock) -> None:
    node, control, _ = _node(tmp_path, "dgx-h100", clock)
    with node:
        control.set_mig_mode(0, True)
        node.create_gpu_instance(0, "1g.10gb", Placement(0, 1))
        node.snapshot()
        clock.advance(1.0)
        sampled = node.snapshot().gpus[0].mig_instances
        assert sampled[0].profiling is not None
        assert sampled == node.mig_instances(0)


def test_interval_samples_at_its_pace_and_carries_between(tmp_path: Path, clock: FakeClock) -> None:
    sim = SimNvml(tmp_path / "h", "dgx-h100", clock=clock)
    nvml = Nvml(sim)  # seeds the node
    SimControl(tmp_path / "h", clock=clock).add_process(0, load=0.5)
    reader = ProfilingReader(nvml, clock=clock)
    reader.interval_s = 5.0
    calls = []
    real_get = sim.nvmlGpmSampleGet

    def counting(*args: object) -> object:
        calls.append(clock())
        return real_get(*args)

    sim.nvmlGpmSampleGet = counting  # type: ignore[method-assign]
    try:
        seen = []
        for _ in range(11):  # t = 0..10 s, one pass a second
            seen.append(reader.read(0, ())[0])
            clock.advance(1.0)
    finally:
        reader.close()
        nvml.close()
    start = calls[0]
    # Sampled at 0, 5 and 10 s only: two samples bound each 5 s interval.
    assert [t - start for t in calls] == [0.0, 5.0, 10.0]
    assert seen[:5] == [None] * 5  # one sample so far: no interval yet
    assert seen[5] is not None
    assert seen[5].interval_s == pytest.approx(5.0)
    assert all(s is seen[5] for s in seen[6:10])  # carried, not re-read
    assert seen[10] is not None
    assert seen[10] is not seen[5]


@pytest.mark.parametrize("function", ["nvmlGpmSampleGet", "nvmlGpmQueryDeviceSupport"])
def test_a_failing_gpm_call_spoils_only_the_figures(
    tmp_path: Path, clock: FakeClock, function: str, caplog: pytest.LogCaptureFixture
) -> None:
    node, control, _ = _node(tmp_path, "dgx-h100", clock)
    with node, caplog.at_level(logging.INFO, logger="nodeagent.gpu.profiling"):
        control.inject("nvml-error", 2, function=function, code=10)  # TIMEOUT
        node.snapshot()
        clock.advance(1.0)
        broken = node.snapshot()
        assert broken.gpus[2].profiling is None
        assert broken.gpus[2].telemetry is not None  # the rest of the GPU is read
        assert broken.gpus[2].error is None
        assert broken.gpus[3].profiling is not None  # the other GPUs are not affected
        # A failed question is not a "no": nothing is said, and it is asked again.
        assert not [r for r in caplog.records if "not supported" in r.getMessage()]
        control.clear(2)
        node.snapshot()
        clock.advance(1.0)
        assert node.snapshot().gpus[2].profiling is not None
