"""The health-signal fault kinds: PCIe replays, NVLink error counters, power, NVML errors.

Each one is checked through what NVML shows (the functions the GPU layer reads), on the faulted
GPU and not on its neighbour, and ``clear`` ends the ones that are states, not counters.
"""

from __future__ import annotations

import json
import threading

import pynvml
import pytest
from typer.testing import CliRunner

from nodeagent.cli.sim import app
from nodeagent.sim.control import SimError

DL = (
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
)
BRAKE = pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown


def link_counters(sim, handle, link):
    return tuple(sim.nvmlDeviceGetNvLinkErrorCounter(handle, link, c) for c in DL)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({}, 100, id="default-burst"),
        pytest.param({"count": 7}, 7, id="count"),
    ],
)
def test_pcie_replay_counter_grows(make_sim, control_for, kwargs, expected):
    sim = make_sim("dgx-h100")
    control = control_for(sim)
    h0, h1 = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlDeviceGetPcieReplayCounter(h0) == 0
    control.inject("pcie-replay", 0, **kwargs)
    control.inject("pcie-replay", 0, **kwargs)
    assert sim.nvmlDeviceGetPcieReplayCounter(h0) == 2 * expected
    assert sim.nvmlDeviceGetPcieReplayCounter(h1) == 0
    control.clear(0)
    assert sim.nvmlDeviceGetPcieReplayCounter(h0) == 2 * expected  # a counter: it stays


def test_nvlink_errors_grow_one_links_counters(make_sim, control_for):
    sim = make_sim("dgx-h100")
    control = control_for(sim)
    handle = sim.nvmlDeviceGetHandleByIndex(2)
    control.inject("nvlink-errors", 2, code=5, count=40)
    assert link_counters(sim, handle, 5) == (40, 1, 40)  # replays, one recovery, CRC errors
    assert link_counters(sim, handle, 4) == (0, 0, 0)
    assert sim.nvmlDeviceGetNvLinkState(handle, 5) == pynvml.NVML_FEATURE_ENABLED  # still up
    control.inject("nvlink-errors", 2, code=5)
    assert link_counters(sim, handle, 5) == (140, 2, 140)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetNvLinkErrorCounter(handle, 5, pynvml.NVML_NVLINK_ERROR_COUNT)
    control.clear(2)
    assert link_counters(sim, handle, 5) == (140, 2, 140)


def test_nvlink_down_still_books_its_error_on_link_0(make_sim, control_for):
    sim = make_sim("dgx-a100")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    control_for(sim).inject("nvlink-down", 0, code=3)
    assert link_counters(sim, handle, 0) == (1, 0, 0)


@pytest.mark.parametrize(
    ("kind", "reasons", "power_fraction", "clock_fraction"),
    [
        pytest.param("power-cap", pynvml.nvmlClocksEventReasonSwPowerCap, 0.99, 0.8, id="cap"),
        pytest.param("power-brake", BRAKE, 0.35, 0.4, id="brake"),
    ],
)
def test_power_faults(make_sim, control_for, clock, kind, reasons, power_fraction, clock_fraction):
    sim = make_sim("dgx-h100")
    control = control_for(sim)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    control.add_process(0)  # a busy GPU, so idle is not among the reasons
    limit = sim.nvmlDeviceGetEnforcedPowerLimit(handle)
    max_sm = sim.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
    energy0 = sim.nvmlDeviceGetTotalEnergyConsumption(handle)
    control.inject(kind, 0)
    assert sim.nvmlDeviceGetCurrentClocksEventReasons(handle) == reasons
    assert sim.nvmlDeviceGetPowerUsage(handle) == pytest.approx(power_fraction * limit, rel=0.01)
    assert sim.nvmlDeviceGetPowerUsage(handle) <= limit
    sm = sim.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    assert sm == int(max_sm * clock_fraction)
    other = sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlDeviceGetCurrentClocksEventReasons(other) == pynvml.nvmlClocksEventReasonGpuIdle
    # Energy stays the integral of the power: 10 s at the held draw.
    clock.advance(10)
    energy1 = sim.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert energy1 - energy0 == pytest.approx(10 * power_fraction * limit, rel=0.001)
    control.clear(0)
    assert sim.nvmlDeviceGetCurrentClocksEventReasons(handle) == pynvml.nvmlClocksEventReasonNone
    assert sim.nvmlDeviceGetPowerUsage(handle) != pytest.approx(power_fraction * limit, rel=0.001)
    clock.advance(10)
    assert sim.nvmlDeviceGetTotalEnergyConsumption(handle) > energy1


def test_power_brake_and_thermal_combine(make_sim, control_for):
    sim = make_sim("dgx-h100")
    control = control_for(sim)
    control.inject("thermal", 0)
    control.inject("power-brake", 0)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetCurrentClocksEventReasons(handle) == (
        BRAKE | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    )


def test_nvml_error_fails_one_function_on_one_gpu(make_sim, control_for):
    sim = make_sim("dgx-h100")
    control = control_for(sim)
    h0, h1 = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    control.inject("nvml-error", 0)  # default: nvmlDeviceGetPowerUsage fails with TIMEOUT
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlDeviceGetPowerUsage(h0)
    assert sim.nvmlDeviceGetPowerUsage(h1) > 0  # the other GPU answers
    assert sim.nvmlDeviceGetUUID(h0).startswith("GPU-")  # other calls on the GPU answer
    assert sim.nvmlDeviceGetHandleByIndex(0) is not None
    control.inject("nvml-error", 0, function="nvmlDeviceGetTotalEccErrors", code=999)
    with pytest.raises(pynvml.NVMLError_Unknown):
        sim.nvmlDeviceGetTotalEccErrors(
            h0, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
        )
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlDeviceGetPowerUsage(h0)  # faults add up
    control.clear(0)
    assert sim.nvmlDeviceGetPowerUsage(h0) > 0


def test_nvml_error_names_the_function_the_caller_called(make_sim, control_for):
    # nvmlDeviceGetPowerManagementLimit is answered from the enforced limit inside the
    # simulator; a fault on the enforced limit must not leak into the other function.
    sim = make_sim("t4")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    control_for(sim).inject("nvml-error", 0, function="nvmlDeviceGetEnforcedPowerLimit")
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlDeviceGetEnforcedPowerLimit(handle)
    assert sim.nvmlDeviceGetPowerManagementLimit(handle) > 0


def test_nvml_error_fails_on_a_thread_that_never_called_before(make_sim, control_for):
    # The called function is found on the calling thread's own stack, so a thread that never
    # called before is failed too, and its next call to another function is not.
    sim = make_sim("t4")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    control_for(sim).inject("nvml-error", 0, function="nvmlDeviceGetTemperature")
    seen: list[BaseException | int] = []

    def read() -> None:
        try:
            seen.append(sim.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
        except pynvml.NVMLError as exc:
            seen.append(exc)
        seen.append(sim.nvmlDeviceGetPowerUsage(handle))  # the name was reset after the call

    worker = threading.Thread(target=read)
    worker.start()
    worker.join(10)
    assert isinstance(seen[0], pynvml.NVMLError_Timeout)
    assert isinstance(seen[1], int)
    assert seen[1] > 0


@pytest.mark.parametrize(
    ("preset", "kind", "kwargs", "message"),
    [
        pytest.param("dgx-h100", "pcie-replay", {"count": 0}, "must be 1 or more", id="count-0"),
        pytest.param("dgx-h100", "thermal", {"count": 3}, "takes no count", id="count-on-thermal"),
        pytest.param("dgx-h100", "nvlink-errors", {"code": 18}, "NVLinks 0..17", id="bad-link"),
        pytest.param("t4", "nvlink-errors", {}, "does not support it", id="no-nvlink"),
        pytest.param("dgx-h100", "nvml-error", {"function": "nvmlDeviceMelt"},
                     "not an NVML function", id="unknown-function"),
        pytest.param("dgx-h100", "nvml-error", {"function": "nvmlSystemGetDriverVersion"},
                     "not an NVML function", id="not-a-gpu-function"),
        pytest.param("dgx-h100", "nvml-error", {"code": 0}, "is not an error", id="success-code"),
        pytest.param("dgx-h100", "lost", {"function": "nvmlDeviceGetUUID"}, "takes no function",
                     id="function-on-lost"),
        pytest.param("dgx-h100", "xid", {"code": 0}, "XID 0 is not an XID", id="xid-0"),
        pytest.param("dgx-h100", "xid", {"code": -1}, "XID -1 is not an XID", id="xid-negative"),
        pytest.param("dgx-h100", "ecc-dbe", {"code": 5}, "takes no code", id="code-on-ecc"),
    ],
)  # fmt: skip
def test_inject_errors(make_sim, control_for, preset, kind, kwargs, message):
    sim = make_sim(preset)
    with pytest.raises(SimError, match=message):
        control_for(sim).inject(kind, 0, **kwargs)


def test_cli_injects_the_new_kinds(tmp_path):
    runner = CliRunner()
    base = ["--simulate", "dgx-h100", "--state-dir", str(tmp_path)]
    for argv in (
        ["inject", "pcie-replay", "--gpu", "1", "--count", "5"],
        ["inject", "nvlink-errors", "--gpu", "1", "--code", "2", "--count", "9"],
        ["inject", "power-brake", "--gpu", "1"],
        ["inject", "nvml-error", "--gpu", "1", "--function", "nvmlDeviceGetTemperature",
         "--code", "11"],
    ):  # fmt: skip
        result = runner.invoke(app, [*argv, *base])
        assert result.exit_code == 0, result.output
    gpu = json.loads((tmp_path / "state.json").read_text())["gpus"][1]
    assert gpu["pcie_replay"] == 5
    assert gpu["nvlink_counters"]["2"] == {"replay": 9, "recovery": 1, "crc_flit": 9}
    assert gpu["faults"]["power"] == "brake"
    assert gpu["faults"]["nvml_errors"] == {"nvmlDeviceGetTemperature": 11}
    bad = runner.invoke(app, ["inject", "pcie-replay", "--gpu", "1", "--count", "-1", *base])
    assert bad.exit_code == 2
    assert "count -1 must be 1 or more" in bad.output
    assert runner.invoke(app, ["clear", "--gpu", "1", *base]).exit_code == 0
    gpu = json.loads((tmp_path / "state.json").read_text())["gpus"][1]
    assert gpu["faults"]["power"] is None
    assert gpu["faults"]["nvml_errors"] == {}
