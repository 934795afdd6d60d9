"""The drop-in pynvml module: a complete namespace, and the C entry points tools reach for."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import types
from pathlib import Path

import pynvml
import pytest
from typer.testing import CliRunner

from nodeagent.cli.sim import app
from nodeagent.sim import models
from nodeagent.sim import pynvml_compat as compat
from nodeagent.sim.control import SimControl
from nodeagent.sim.nvml import SimNvml


def test_namespace_has_every_name_pynvml_has():
    real, ours = vars(pynvml), vars(compat)
    assert set(real) - set(ours) == set()
    assert set(dir(pynvml)) <= set(dir(compat))
    star: dict[str, object] = {}
    exec("from nodeagent.sim.pynvml_compat import *", star)
    public = {name for name in real if not name.startswith("_")}
    assert public == set(star) - {"__builtins__"}


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("constant", id="constants are pynvml's values"),
        pytest.param("class", id="structs and errors are pynvml's classes"),
        pytest.param("function", id="nvml functions are plain functions of the same name"),
    ],
)
def test_names_keep_their_kind(kind):
    for name, value in vars(pynvml).items():
        if name.startswith("__"):
            continue
        ours = getattr(compat, name)
        if kind == "constant" and name.startswith("NVML_"):
            assert ours == value, name
        elif kind == "class" and isinstance(value, type):
            assert ours is value, name
        elif kind == "function" and isinstance(value, types.FunctionType):
            if name.startswith("nvml"):
                assert isinstance(ours, types.FunctionType), name
            assert ours.__name__ == value.__name__  # aliases keep their target's name


def test_error_classes_are_shared_with_pynvml(make_sim):
    sim = make_sim("t4")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetMigMode(sim.nvmlDeviceGetHandleByIndex(0))
    assert compat.NVMLError_NotSupported is pynvml.NVMLError_NotSupported
    assert compat.nvmlExceptionClass(pynvml.NVML_ERROR_IN_USE) is pynvml.NVMLError_InUse


def test_unmodelled_function_is_not_supported_and_needs_init(make_sim):
    sim = make_sim("dgx-h100")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetFanSpeed(handle)
    cold = SimNvml(sim.store.state_dir)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        cold.nvmlDeviceGetFanSpeed(handle)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        cold._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")


def test_function_pointer_of_a_missing_symbol_is_function_not_found(make_sim):
    sim = make_sim("dgx-h100")
    # Tools probe for these to pick a struct layout (nvitop): a driver without them answers so.
    for symbol in ("nvmlDeviceGetRunningProcessDetailList", "nvmlDeviceGetConfComputeMemSizeInfo"):
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            sim._nvmlGetFunctionPointer(symbol)


def test_memory_v2_pointer_fills_the_callers_struct(make_sim, control_for):
    sim = make_sim("dgx-h100")
    control_for(sim).add_process(2, used_memory_mib=2048)
    handle = sim.nvmlDeviceGetHandleByIndex(2)
    memory = pynvml.c_nvmlMemory_v2_t()
    memory.version = pynvml.nvmlMemory_v2
    fn = sim._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")
    assert fn(handle, ctypes.byref(memory)) == pynvml.NVML_SUCCESS
    assert memory.reserved == models.model("h100-80").reserved_mib * models.MIB
    assert memory.used == (2048 + 1) * models.MIB
    assert memory.total == memory.reserved + memory.used + memory.free
    memory.version = 1  # a struct version the driver does not know
    assert fn(handle, ctypes.byref(memory)) == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_temperature_v_pointer(make_sim):
    sim = make_sim("dgx-h100")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    reading = pynvml.c_nvmlTemperature_v1_t()
    reading.version = pynvml.nvmlTemperature_v1
    reading.sensorType = pynvml.NVML_TEMPERATURE_GPU
    fn = sim._nvmlGetFunctionPointer("nvmlDeviceGetTemperatureV")
    assert fn(handle, ctypes.byref(reading)) == pynvml.NVML_SUCCESS
    assert reading.temperature == sim.nvmlDeviceGetTemperature(handle, 0)
    assert pynvml.nvmlTemperature_v1 == compat.nvmlTemperature_v1


def test_process_pointer_follows_the_count_protocol(make_sim, control_for):
    sim = make_sim("dgx-h100")
    pids = [control_for(sim).add_process(1, used_memory_mib=m) for m in (100, 200)]
    handle = sim.nvmlDeviceGetHandleByIndex(1)
    fn = sim._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    count = ctypes.c_uint(0)
    assert fn(handle, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2
    array = (pynvml.c_nvmlProcessInfo_v3_t * 5)()
    count.value = 5
    assert fn(handle, ctypes.byref(count), array) == pynvml.NVML_SUCCESS
    got = [(array[i].pid, array[i].usedGpuMemory // models.MIB) for i in range(count.value)]
    assert got == [(pids[0], 100), (pids[1], 200)]
    assert array[0].gpuInstanceId == 0xFFFFFFFF  # not on MIG
    idle = sim.nvmlDeviceGetHandleByIndex(0)
    count.value = 0
    assert fn(idle, ctypes.byref(count), None) == pynvml.NVML_SUCCESS
    assert count.value == 0
    graphics = sim._nvmlGetFunctionPointer("nvmlDeviceGetGraphicsRunningProcesses_v3")
    assert graphics(handle, ctypes.byref(count), None) == pynvml.NVML_SUCCESS


def test_field_values_pointer(make_sim):
    sim = make_sim("dgx-h100")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    wanted = [
        pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        pynvml.NVML_FI_DEV_ECC_CURRENT,  # not modelled
    ]
    values = (pynvml.c_nvmlFieldValue_t * len(wanted))()
    for slot, field in zip(values, wanted, strict=True):
        slot.fieldId = field
    fn = sim._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    assert fn(handle, ctypes.c_int32(len(wanted)), ctypes.byref(values)) == pynvml.NVML_SUCCESS
    assert [v.nvmlReturn for v in values] == [0, 0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert values[0].value.uiVal == 18
    assert values[1].value.ullVal == sim.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert values[2].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG


@pytest.mark.parametrize(
    ("mig", "utilization", "encoder"),
    [
        pytest.param(False, True, [0, 167000], id="without MIG: readings"),
        pytest.param(True, False, None, id="with MIG: NOT_SUPPORTED, as nvidia-smi shows N/A"),
    ],
)
def test_utilization_with_and_without_mig(make_sim, mig, utilization, encoder):
    sim = make_sim("dgx-h100")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    if mig:
        sim.nvmlDeviceSetMigMode(handle, 1)
    for call, supported in (
        (sim.nvmlDeviceGetUtilizationRates, utilization),
        (sim.nvmlDeviceGetEncoderUtilization, encoder is not None),
        (sim.nvmlDeviceGetDecoderUtilization, encoder is not None),
    ):
        if supported:
            call(handle)
        else:
            with pytest.raises(pynvml.NVMLError_NotSupported):
                call(handle)
    if encoder is not None:
        assert sim.nvmlDeviceGetEncoderUtilization(handle) == encoder
    assert sim.nvmlDeviceGetGraphicsRunningProcesses(handle) == []


def _exec(args: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess[str]:
    nodeagent = str(Path(sys.executable).parent / "nodeagent")
    return subprocess.run(
        [nodeagent, "sim", "exec", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **kwargs,
    )


def test_exec_runs_a_plain_python_on_the_shared_node(tmp_path: Path):
    state = tmp_path / "node"
    pid = SimControl(state, preset="dgx-h100").add_process(5, used_memory_mib=777)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env["NODEAGENT_SIM_STATE"] = str(state)
    script = (
        "import pynvml\n"
        "pynvml.nvmlInit()\n"
        "h = pynvml.nvmlDeviceGetHandleByIndex(5)\n"
        "p = pynvml.nvmlDeviceGetComputeRunningProcesses(h)[0]\n"
        "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(h), p.pid,\n"
        "      p.usedGpuMemory // 2**20, pynvml.__file__.endswith('pynvml_compat.py'))\n"
    )
    done = _exec(["--", "python", "-c", script], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "8", "NVIDIA", "H100", "80GB", "HBM3", str(pid), "777", "True"]  # fmt: skip


def test_exec_passes_the_exit_status_through(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env["NODEAGENT_SIM_STATE"] = str(tmp_path / "node")
    done = _exec(["--simulate", "t4", "--", "python", "-c", "raise SystemExit(7)"], env)
    assert done.returncode == 7


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--simulate", "dgx-z900", "--", "true"], "unknown preset", id="preset"),
        pytest.param(["--simulate", "t4"], "no command to run", id="no command"),
        pytest.param(["--simulate", "t4", "--", "no-such-tool-x"], "command not found", id="cmd"),
        pytest.param(["--", "true"], "no simulated node", id="no node and no preset"),
    ],
)
def test_exec_errors_are_one_line_and_exit_2(tmp_path: Path, monkeypatch, args, message):
    monkeypatch.setenv("NODEAGENT_SIM_STATE", str(tmp_path / "empty"))
    result = CliRunner().invoke(app, ["exec", *args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert message in lines[0]
    assert lines[0].startswith("error: ")
    assert len(lines) <= 2  # the cause and a hint, no traceback
