"""Telemetry, health counters, events and snapshots through GpuNode, with injected faults."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.gpu.errors import GpuLost
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import EventKind, Placement, Telemetry
from nodeagent.sim.control import SimControl
from nodeagent.sim.models import MIB, model

MakeNode = Callable[..., GpuNode]

# nvmlClocksEventReason* bits (nvml.h)
HW_SLOWDOWN = 0x8
HW_THERMAL_SLOWDOWN = 0x40
EVENT_WAIT_S = 2.0  # upper bound only: an event already queued returns at once


@pytest.fixture
def h100(make_node: MakeNode) -> GpuNode:
    return make_node("dgx-h100")


@pytest.fixture
def control(sim_state_dir: Path) -> SimControl:
    return SimControl(sim_state_dir)


@pytest.mark.parametrize(
    ("driver", "reserved_mib"),
    [
        pytest.param("570.124.06", 336, id="v2: reserved apart, as nvidia-smi shows it"),
        pytest.param("470.256.02", None, id="R470 has v1 only: reserved counted as used"),
    ],
)
def test_memory_reads_v2_and_falls_back_to_v1(
    h100: GpuNode, control: SimControl, driver: str, reserved_mib: int | None
) -> None:
    control.inject("driver", 0, version=driver)
    control.add_process(0, used_memory_mib=1000)
    sample = h100.telemetry(0)
    assert sample.memory_reserved_bytes == (None if reserved_mib is None else reserved_mib * MIB)
    h100_reserved = model("h100-80").reserved_mib * MIB
    allocated = sample.memory_used_bytes - (h100_reserved if reserved_mib is None else 0)
    assert allocated >= 1000 * MIB  # the process's memory, plus the idle driver context
    assert sample.memory_free_bytes == h100.info(0).memory_total_bytes - allocated - h100_reserved


def test_idle_telemetry_is_in_base_units(h100: GpuNode) -> None:
    sample = h100.telemetry(0)
    assert sample.gpu_index == 0
    assert sample.memory_reserved_bytes is not None
    total = sample.memory_used_bytes + sample.memory_reserved_bytes + sample.memory_free_bytes
    assert total == h100.info(0).memory_total_bytes
    assert sample.power_watts is not None
    assert sample.power_limit_watts == 700.0  # H100 SXM: NVML's 700000 mW
    assert 0 < sample.power_watts < sample.power_limit_watts
    assert sample.sm_clock_hz is not None
    assert sample.sm_clock_hz >= 1e8  # MHz became Hz
    assert sample.memory_clock_hz is not None
    assert sample.memory_clock_hz >= 1e9
    assert sample.temperature_slowdown_celsius is not None
    assert sample.temperature_celsius is not None
    assert sample.temperature_celsius < sample.temperature_slowdown_celsius
    assert sample.utilization_gpu_ratio == 0.0
    assert sample.processes == ()
    assert sample.ecc is not None
    assert sample.ecc.volatile_uncorrected == 0
    assert sample.remapped_rows is not None
    assert not sample.remapped_rows.pending
    # H100 remaps rows instead of retiring pages: those readings are absent, not zero.
    assert sample.retired_pages_sbe is None
    assert sample.retired_pages_pending is None
    assert [link.link for link in sample.nvlinks] == list(range(18))
    assert all(link.active for link in sample.nvlinks)


def test_pcie_gpu_reports_no_nvlinks(make_node: MakeNode) -> None:
    sample = make_node("pcie-l40s").telemetry(3)
    assert sample.nvlinks == ()


def test_energy_is_joules_and_grows(h100: GpuNode) -> None:
    first = h100.telemetry(1).energy_joules
    time.sleep(0.05)
    second = h100.telemetry(1).energy_joules
    assert first is not None
    assert second is not None
    assert second > first


def test_processes_show_in_telemetry(h100: GpuNode, control: SimControl) -> None:
    pid = control.add_process(4, used_memory_mib=4096, load=0.9)
    sample = h100.telemetry(4)
    [process] = sample.processes
    assert process.pid == pid
    assert process.used_memory_bytes == 4096 * 1024 * 1024
    assert process.gpu_instance_id is None  # no MIG: NVML's "not available" became None
    assert sample.utilization_gpu_ratio is not None
    assert sample.utilization_gpu_ratio > 0
    assert h100.telemetry(5).processes == ()


def test_lost_gpu_is_isolated_in_the_snapshot(h100: GpuNode, control: SimControl) -> None:
    before = h100.snapshot()
    control.inject("lost", 2)
    snapshot = h100.snapshot()
    lost = [state.info.index for state in snapshot.gpus if state.lost]
    assert lost == [2]
    gone = snapshot.gpus[2]
    assert gone.info == before.gpus[2].info  # its last known facts
    assert gone.telemetry is None
    assert gone.error is not None
    assert "GPU 2" in gone.error
    for state in snapshot.gpus:
        if state.info.index != 2:
            assert state.telemetry is not None
            assert state.error is None
    assert sum(snapshot.nvml_errors.values()) >= 1
    assert all("nvml" in function for function in snapshot.nvml_errors)
    with pytest.raises(GpuLost) as caught:
        h100.telemetry(2)
    assert caught.value.gpu_index == 2
    with pytest.raises(GpuLost):
        h100.info(2)
    assert [info.index for info in h100.inventory()] == [0, 1, 3, 4, 5, 6, 7]
    control.clear(2)
    assert not any(state.lost for state in h100.snapshot().gpus)


def test_gpu_lost_before_first_read_gets_a_minimal_info(
    make_node: MakeNode, control: SimControl
) -> None:
    node = make_node("dgx-h100")  # opened, nothing read yet
    control.inject("lost", 6)
    snapshot = node.snapshot()
    state = snapshot.gpus[6]
    assert state.lost
    assert state.info.index == 6
    # Pairs with the lost GPU cannot be measured; the others are, and all are measured again
    # once the GPU is back (a partial topology is not cached).
    assert len(snapshot.topology) == 7 * 6
    assert all(6 not in pair for pair in snapshot.topology)
    control.clear(6)
    assert len(node.snapshot().topology) == 8 * 7


def test_clean_snapshot_has_no_errors_and_is_cheap(h100: GpuNode) -> None:
    h100.snapshot()  # first pass reads and caches static facts and topology
    snapshot = h100.snapshot()
    assert len(snapshot.gpus) == 8
    assert snapshot.nvml_errors == {}
    assert snapshot.driver_version == "570.124.06"
    assert snapshot.cuda_driver_version == "12.8"
    assert {link.label for link in snapshot.topology.values()} == {"NV18"}
    assert 0 < snapshot.sample_duration_s < 0.5  # a few ms in practice; generous bound


def test_snapshot_includes_mig_instances_with_processes(h100: GpuNode, control: SimControl) -> None:
    h100.set_mig_mode(0, True)
    h100.reset_gpu(0)
    gi = h100.create_gpu_instance(0, "3g.40gb", Placement(0, 4))
    pid = control.add_process(0, mig_uuid=gi.uuid)
    state = h100.snapshot().gpus[0]
    [instance] = state.mig_instances
    assert instance.pids == (pid,)
    assert state.telemetry is not None
    [process] = state.telemetry.processes
    assert process.gpu_instance_id == gi.instance_id
    assert process.compute_instance_id == gi.compute_instances[0].instance_id
    assert h100.snapshot().gpus[1].mig_instances == ()


def _sample_after(
    node: GpuNode, control: SimControl, kind: str, gpu: int, **kw: object
) -> Telemetry:
    control.inject(kind, gpu, **kw)  # type: ignore[arg-type]
    return node.telemetry(gpu)


def test_ecc_errors_count(h100: GpuNode, control: SimControl) -> None:
    sample = _sample_after(h100, control, "ecc-sbe", 1)
    assert sample.ecc is not None
    assert (sample.ecc.volatile_corrected, sample.ecc.aggregate_corrected) == (1, 1)
    sample = _sample_after(h100, control, "ecc-dbe", 1)
    assert sample.ecc is not None
    assert (sample.ecc.volatile_uncorrected, sample.ecc.aggregate_uncorrected) == (1, 1)
    assert sample.remapped_rows is not None
    assert sample.remapped_rows.uncorrectable == 1
    assert sample.remapped_rows.pending


@pytest.mark.parametrize(
    ("kind", "pending", "failure"),
    [
        pytest.param("remap-pending", True, False, id="pending"),
        pytest.param("remap-failure", False, True, id="failure"),
    ],
)
def test_row_remapping_state(
    h100: GpuNode, control: SimControl, kind: str, pending: bool, failure: bool
) -> None:
    sample = _sample_after(h100, control, kind, 3)
    assert sample.remapped_rows is not None
    assert (sample.remapped_rows.pending, sample.remapped_rows.failure) == (pending, failure)


def test_t4_retires_pages_instead_of_remapping(make_node: MakeNode, control: SimControl) -> None:
    node = make_node("t4")
    sample = _sample_after(node, control, "ecc-dbe", 0)
    assert sample.remapped_rows is None
    assert (sample.retired_pages_dbe, sample.retired_pages_sbe) == (1, 0)
    assert sample.retired_pages_pending is True


def test_thermal_fault_shows_reason_and_temperature(h100: GpuNode, control: SimControl) -> None:
    sample = _sample_after(h100, control, "thermal", 5)
    assert sample.clock_event_reasons is not None
    assert sample.clock_event_reasons & HW_THERMAL_SLOWDOWN
    assert sample.clock_event_reasons & HW_SLOWDOWN
    assert sample.temperature_celsius is not None
    assert sample.temperature_slowdown_celsius is not None
    assert sample.temperature_celsius >= sample.temperature_slowdown_celsius
    assert not (h100.telemetry(4).clock_event_reasons or 0) & HW_THERMAL_SLOWDOWN


def test_nvlink_down_shows_on_that_link_only(h100: GpuNode, control: SimControl) -> None:
    sample = _sample_after(h100, control, "nvlink-down", 7, code=3)
    down = [link.link for link in sample.nvlinks if not link.active]
    assert down == [3]
    errors = [
        (link.replay_errors or 0) + (link.recovery_errors or 0) + (link.crc_flit_errors or 0)
        for link in sample.nvlinks
    ]
    assert sum(errors) > 0


def test_driver_version_change_is_seen(h100: GpuNode, control: SimControl) -> None:
    control.inject("driver", 0, version="570.172.08")
    assert h100.driver_version() == "570.172.08"
    assert h100.snapshot().driver_version == "570.172.08"
    assert h100.info(0).driver_version == "570.172.08"


@pytest.mark.parametrize(
    ("kind", "extra", "expected_kind", "expected_data"),
    [
        pytest.param("xid", {"code": 31}, EventKind.XID, 31, id="xid-31"),
        pytest.param("ecc-sbe", {}, EventKind.ECC_SINGLE_BIT, 0, id="ecc-sbe"),
        pytest.param("ecc-dbe", {}, EventKind.ECC_DOUBLE_BIT, 0, id="ecc-dbe"),
        pytest.param("lost", {}, EventKind.XID, 79, id="fallen-off-the-bus"),
        pytest.param("nvlink-down", {}, EventKind.XID, 74, id="nvlink-xid"),
    ],
)
def test_fault_arrives_as_event(
    h100: GpuNode,
    control: SimControl,
    kind: str,
    extra: dict[str, object],
    expected_kind: EventKind,
    expected_data: int,
) -> None:
    uuid = h100.info(6).uuid
    with h100.watch_events() as watcher:
        assert watcher.registered == tuple(range(8))
        control.inject(kind, 6, **extra)  # type: ignore[arg-type]
        event = watcher.wait(EVENT_WAIT_S)
    assert event is not None
    assert (event.kind, event.gpu_index, event.data) == (expected_kind, 6, expected_data)
    assert event.gpu_uuid == uuid
    assert event.gpu_instance_id is None


def test_event_wait_times_out_with_none(h100: GpuNode) -> None:
    with h100.watch_events() as watcher:
        started = time.monotonic()
        assert watcher.wait(0.05) is None
        assert time.monotonic() - started < 1.0
    assert h100.nvml_error_counts() == {}  # a timeout is an answer, not an error


def test_xid_on_mig_device_is_attributed(h100: GpuNode, control: SimControl) -> None:
    h100.set_mig_mode(2, True)
    h100.reset_gpu(2)
    gi = h100.create_gpu_instance(2, "1g.10gb", Placement(6, 1))
    with h100.watch_events() as watcher:
        control.inject("xid", 2, mig_uuid=gi.uuid, code=43)
        event = watcher.wait(EVENT_WAIT_S)
    assert event is not None
    assert (event.kind, event.data) == (EventKind.XID, 43)
    assert event.gpu_instance_id == gi.instance_id
    assert event.compute_instance_id == gi.compute_instances[0].instance_id


def test_one_failing_reading_leaves_the_others_and_says_which(make_node, sim_state_dir) -> None:
    from nodeagent.sim.control import SimControl

    node = make_node("dgx-h100")
    SimControl(sim_state_dir).inject("nvml-error", 2, code=10, function="nvmlDeviceGetPowerUsage")
    snapshot = node.snapshot()
    gpu = snapshot.gpus[2]
    assert not gpu.lost
    assert gpu.telemetry is not None
    assert gpu.telemetry.power_watts is None  # the broken reading
    assert gpu.telemetry.temperature_celsius is not None  # the rest still read
    assert gpu.telemetry.memory_reserved_bytes is not None
    memory = (
        gpu.telemetry.memory_used_bytes
        + gpu.telemetry.memory_reserved_bytes
        + gpu.telemetry.memory_free_bytes
    )
    assert memory == gpu.info.memory_total_bytes  # a real memory reading, not a placeholder
    assert gpu.error is not None
    assert "nvmlDeviceGetPowerUsage" in gpu.error
    assert snapshot.nvml_errors.get("nvmlDeviceGetPowerUsage") == 1
    assert snapshot.gpus[1].error is None  # other GPUs unaffected
    assert snapshot.gpus[1].telemetry is not None
    assert snapshot.gpus[1].telemetry.power_watts is not None


def test_a_lost_gpu_keeps_its_last_known_mig_layout(make_node, sim_state_dir) -> None:
    from nodeagent.gpu.types import Placement
    from nodeagent.sim.control import SimControl

    node = make_node("dgx-h100")
    control = SimControl(sim_state_dir)
    control.set_mig_mode(4, True)
    control.reset_gpu(4)
    node.create_gpu_instance(4, "3g.40gb", Placement(4, 4))
    before = node.snapshot().gpus[4]
    assert [gi.profile for gi in before.mig_instances] == ["3g.40gb"]
    control.inject("xid", 4, code=79)  # fallen off the bus
    after = node.snapshot().gpus[4]
    assert after.lost
    assert after.info.uuid == before.info.uuid
    assert after.mig_instances == before.mig_instances  # still known, now on a lost GPU
