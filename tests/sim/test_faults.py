"""Processes, telemetry, events and fault injection."""

from __future__ import annotations

import time
from itertools import pairwise

import pynvml
import pytest

from nodeagent.sim.control import SimError
from tests.sim.conftest import enable_mig, two_slice_mig_device

MIB = 1024 * 1024


def test_process_on_full_gpu_shows_up_and_loads_it(make_sim, control_for, clock):
    sim = make_sim("dgx-h100")
    handle = sim.nvmlDeviceGetHandleByIndex(3)
    idle_power = sim.nvmlDeviceGetPowerUsage(handle)
    assert sim.nvmlDeviceGetUtilizationRates(handle).gpu == 0
    pid = control_for(sim).add_process(3, used_memory_mib=2048)
    procs = sim.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(pid, 2048 * MIB)]
    assert procs[0].gpuInstanceId == 0xFFFFFFFF
    assert sim.nvmlDeviceGetUtilizationRates(handle).gpu > 50
    assert sim.nvmlDeviceGetPowerUsage(handle) > idle_power * 3
    assert sim.nvmlDeviceGetMemoryInfo(handle).used >= 2048 * MIB
    assert sim.nvmlDeviceGetComputeRunningProcesses(sim.nvmlDeviceGetHandleByIndex(2)) == []


def test_process_on_mig_device_carries_instance_ids(make_sim, control_for):
    sim = make_sim("dgx-a100")
    handle, gi, mig = two_slice_mig_device(sim)
    pid = control_for(sim).add_process(0, mig_uuid=sim.nvmlDeviceGetUUID(mig))
    (proc,) = sim.nvmlDeviceGetComputeRunningProcesses(mig)
    gi_id = sim.nvmlGpuInstanceGetInfo(gi).id
    assert (proc.pid, proc.gpuInstanceId, proc.computeInstanceId) == (pid, gi_id, 0)
    assert [p.pid for p in sim.nvmlDeviceGetComputeRunningProcesses(handle)] == [pid]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"gpu": 8}, "GPU index 8 is out of range", id="gpu-range"),
        pytest.param({"gpu": 0, "mig_uuid": "MIG-nope"}, "no MIG device MIG-nope", id="mig"),
        pytest.param({"gpu": 0, "used_memory_mib": -1}, "negative", id="memory"),
    ],
)
def test_add_process_errors(make_sim, control_for, kwargs, message):
    sim = make_sim("dgx-a100")
    with pytest.raises(SimError, match=message):
        control_for(sim).add_process(**kwargs)


def test_add_process_to_mig_gpu_needs_a_mig_device(make_sim, control_for):
    sim = make_sim("dgx-a100")
    enable_mig(sim)
    with pytest.raises(SimError, match="MIG enabled") as caught:
        control_for(sim).add_process(0)
    assert "--mig" in caught.value.hint


def test_telemetry_moves_and_energy_is_the_integral(make_sim, control_for, clock):
    sim = make_sim("dgx-a100")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    control_for(sim).add_process(0)
    powers, energies = [], []
    for _ in range(60):
        powers.append(sim.nvmlDeviceGetPowerUsage(handle))
        energies.append(sim.nvmlDeviceGetTotalEnergyConsumption(handle))
        clock.advance(5.0)
    assert len(set(powers)) > 10  # it moves
    assert all(b > a for a, b in pairwise(energies))  # monotonic
    # The energy over the run matches the trapezoid integral of the sampled power within 1%.
    integral_mj = sum((a + b) / 2 * 5.0 for a, b in pairwise(powers))
    assert abs((energies[-1] - energies[0]) - integral_mj) / integral_mj < 0.01
    limit = sim.nvmlDeviceGetEnforcedPowerLimit(handle)
    assert all(0 < p <= limit for p in powers)


def test_energy_stays_monotonic_across_load_changes(make_sim, control_for, clock):
    sim = make_sim("t4")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    control = control_for(sim)
    before = sim.nvmlDeviceGetTotalEnergyConsumption(handle)
    clock.advance(30)
    pid = control.add_process(0)
    mid = sim.nvmlDeviceGetTotalEnergyConsumption(handle)
    clock.advance(30)
    control.remove_process(pid)
    after = sim.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert before < mid < after


def _wait_one(sim, event_set, timeout_ms=500):
    return sim.nvmlEventSetWait_v2(event_set, timeout_ms)


@pytest.fixture
def watched(make_sim, control_for):
    """A dgx-a100 sim with an event set registered for XID and ECC events on every GPU."""
    sim = make_sim("dgx-a100")
    event_set = sim.nvmlEventSetCreate()
    mask = (pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError
            | pynvml.nvmlEventTypeDoubleBitEccError)  # fmt: skip
    for i in range(sim.nvmlDeviceGetCount()):
        sim.nvmlDeviceRegisterEvents(sim.nvmlDeviceGetHandleByIndex(i), mask, event_set)
    yield sim, event_set, control_for(sim)
    sim.nvmlEventSetFree(event_set)


def test_event_wait_times_out(watched):
    sim, event_set, _ = watched
    start = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait(event_set, 30)
    assert time.monotonic() - start < 0.5


def test_xid_event_with_mig_attribution(watched):
    sim, event_set, control = watched
    handle = enable_mig(sim, 2)
    gi = sim.nvmlDeviceCreateGpuInstance(handle, 9)
    sim.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    mig_uuid = sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0))
    control.inject("xid", 2, mig_uuid=mig_uuid, code=43)
    control.inject("xid", 5, code=13)
    first, second = _wait_one(sim, event_set), _wait_one(sim, event_set)
    assert isinstance(first, pynvml.c_nvmlEventData_t)
    assert (sim.nvmlDeviceGetIndex(first.device), first.eventType, first.eventData) == (
        2, pynvml.nvmlEventTypeXidCriticalError, 43)  # fmt: skip
    assert (first.gpuInstanceId, first.computeInstanceId) == (sim.nvmlGpuInstanceGetInfo(gi).id, 0)
    assert (sim.nvmlDeviceGetIndex(second.device), second.eventData) == (5, 13)
    assert second.gpuInstanceId == 0xFFFFFFFF
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait(event_set, 10)


def test_unregistered_gpus_and_types_are_filtered(make_sim, control_for):
    sim = make_sim("dgx-a100")
    event_set = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(
        sim.nvmlDeviceGetHandleByIndex(1), pynvml.nvmlEventTypeXidCriticalError, event_set
    )
    control = control_for(sim)
    control.inject("xid", 0, code=31)  # other GPU
    control.inject("ecc-sbe", 1)  # other type
    control.inject("xid", 1, code=94)
    assert sim.nvmlEventSetWait(event_set, 200).eventData == 94


@pytest.mark.parametrize(
    ("preset", "kind", "check"),
    [
        pytest.param("dgx-a100", "ecc-sbe", lambda s, h: s.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC) == 1,
            id="sbe"),
        pytest.param("dgx-a100", "ecc-dbe", lambda s, h: s.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC) == 1
            and s.nvmlDeviceGetRemappedRows(h) == (0, 1, 1, 0), id="dbe-remaps-a-row"),
        pytest.param("t4", "ecc-dbe", lambda s, h: len(s.nvmlDeviceGetRetiredPages(
            h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)) == 1
            and s.nvmlDeviceGetRetiredPagesPendingStatus(h) == 1, id="dbe-retires-a-page-on-t4"),
        pytest.param("dgx-h100", "remap-pending",
                     lambda s, h: s.nvmlDeviceGetRemappedRows(h)[2] == 1, id="remap-pending"),
        pytest.param("dgx-h100", "remap-failure",
                     lambda s, h: s.nvmlDeviceGetRemappedRows(h)[3] == 1, id="remap-failure"),
        pytest.param("dgx-a100", "thermal", lambda s, h: (
            s.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            > s.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))
            and s.nvmlDeviceGetCurrentClocksEventReasons(h)
            & pynvml.nvmlClocksEventReasonHwThermalSlowdown, id="thermal"),
        pytest.param("dgx-h100", "nvlink-down",
                     lambda s, h: s.nvmlDeviceGetNvLinkState(h, 0) == 0
                     and s.nvmlDeviceGetNvLinkState(h, 1) == 1, id="nvlink-down"),
    ],
)  # fmt: skip
def test_fault_kinds(make_sim, control_for, preset, kind, check):
    sim = make_sim(preset)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert not check(sim, handle)
    control_for(sim).inject(kind, 0)
    assert check(sim, handle)


def test_thermal_and_nvlink_recover_on_clear_but_counters_stay(make_sim, control_for):
    sim = make_sim("dgx-a100")
    control = control_for(sim)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    for kind in ("thermal", "nvlink-down", "ecc-dbe"):
        control.inject(kind, 0)
    control.clear(0)
    slowdown = sim.nvmlDeviceGetTemperatureThreshold(
        handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    )
    assert sim.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) < slowdown
    assert sim.nvmlDeviceGetNvLinkState(handle, 0) == 1
    unc = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert sim.nvmlDeviceGetTotalEccErrors(handle, unc, pynvml.NVML_AGGREGATE_ECC) == 1
    assert sim.nvmlDeviceGetRemappedRows(handle)[1] == 1


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        pytest.param("lost", None, id="lost"),
        pytest.param("xid", 79, id="xid-79-fallen-off-the-bus"),
    ],
)
def test_lost_gpu_fails_every_call_and_others_keep_working(make_sim, control_for, kind, code):
    sim = make_sim("dgx-a100")
    handle = sim.nvmlDeviceGetHandleByIndex(4)
    control_for(sim).inject(kind, 4, code=code)
    for call in (
        lambda: sim.nvmlDeviceGetHandleByIndex(4),
        lambda: sim.nvmlDeviceGetPowerUsage(handle),
        lambda: sim.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        lambda: sim.nvmlDeviceGetUUID(handle),
        lambda: sim.nvmlDeviceGetMigMode(handle),
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    assert sim.nvmlDeviceGetCount() == 8
    assert sim.nvmlDeviceGetPowerUsage(sim.nvmlDeviceGetHandleByIndex(5)) > 0
    control_for(sim).clear(4)
    assert sim.nvmlDeviceGetPowerUsage(handle) > 0


def test_xid_79_on_a_mig_device_loses_the_whole_gpu(watched):
    sim, event_set, control = watched
    handle = enable_mig(sim, 2)
    gi = sim.nvmlDeviceCreateGpuInstance(handle, 9)
    sim.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    control.inject("xid", 2, mig_uuid=sim.nvmlDeviceGetUUID(mig), code=79)
    assert _wait_one(sim, event_set).eventData == 79  # the event still reaches the agent
    for call in (lambda: sim.nvmlDeviceGetUUID(mig), lambda: sim.nvmlDeviceGetPowerUsage(handle)):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()


def test_other_xids_leave_the_gpu_answering(make_sim, control_for):
    sim = make_sim("dgx-a100")
    handle = sim.nvmlDeviceGetHandleByIndex(1)
    for code in (13, 31, 43, 48, 94):
        control_for(sim).inject("xid", 1, code=code)
    assert sim.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) > 0


def test_driver_version_fault(make_sim, control_for):
    sim = make_sim("t4")
    assert sim.nvmlSystemGetDriverVersion() == "570.124.06"
    control_for(sim).inject("driver", 0, version="575.51.03")
    assert sim.nvmlSystemGetDriverVersion() == "575.51.03"


@pytest.mark.parametrize(
    ("kind", "kwargs", "message"),
    [
        pytest.param("xid", {}, "needs an XID code", id="xid-without-code"),
        pytest.param("driver", {}, "needs a version", id="driver-without-version"),
        pytest.param("melt", {}, "unknown fault kind", id="unknown-kind"),
        pytest.param("nvlink-down", {"code": 40}, "NVLinks 0..11", id="bad-link"),
    ],
)
def test_inject_errors(make_sim, control_for, kind, kwargs, message):
    sim = make_sim("dgx-a100")
    with pytest.raises(SimError, match=message):
        control_for(sim).inject(kind, 0, **kwargs)


def test_a_process_cannot_use_more_than_the_free_memory(make_sim, control_for):
    sim = make_sim("dgx-a100")  # 40 GiB A100s
    control = control_for(sim)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    free_mib = sim.nvmlDeviceGetMemoryInfo(handle).free // 2**20
    control.add_process(0, used_memory_mib=free_mib - 100)
    with pytest.raises(SimError, match="more than its free memory") as caught:
        control.add_process(0, used_memory_mib=200)
    assert "--memory-mib" in caught.value.hint
    control.add_process(0, used_memory_mib=100)  # what is left still fits
    assert sim.nvmlDeviceGetMemoryInfo(handle).free == 0
