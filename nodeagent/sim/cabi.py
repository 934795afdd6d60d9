"""The simulated NVML's C entry points, for code that calls pynvml's function pointers itself.

pynvml wraps each C function of ``libnvidia-ml`` and reaches it through the private
``_nvmlGetFunctionPointer(name)``. Some tools call that directly, to probe what the driver has
and to pass their own structs: gpustat for ``nvmlDeviceGetMemoryInfo_v2`` and the v3 process
lists, nvitop for memory v2, ``nvmlDeviceGetTemperatureV``, the process lists and
``nvmlDeviceGetFieldValues``. The entry points here take the same ctypes arguments the C
functions take, write their results through the pointers and return an NVML return code, on
top of the simulator's pynvml-level functions. A name with no entry point here is a symbol the
simulated driver lacks: ``_nvmlGetFunctionPointer`` raises FUNCTION_NOT_FOUND for it, as pynvml
does against an older driver.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pynvml

if TYPE_CHECKING:
    from nodeagent.sim.nvml import SimNvml

Entry = Callable[..., None]  # raises pynvml.NVMLError(code) to return that code


class FunctionPointer:
    """What ``_nvmlGetFunctionPointer`` hands out: a callable that returns an NVML return code."""

    def __init__(self, name: str, entry: Entry) -> None:
        self.__name__ = name
        self._entry = entry

    def __call__(self, *args: Any) -> int:
        try:
            self._entry(*args)
        except pynvml.NVMLError as exc:
            return int(exc.value)
        return int(pynvml.NVML_SUCCESS)

    def __repr__(self) -> str:
        return f"<simulated NVML function {self.__name__}>"


def _target(ref: Any) -> Any:
    """The object behind ``byref(x)``, ``pointer(x)`` or ``x`` itself."""
    obj = getattr(ref, "_obj", None)
    if obj is not None:
        return obj
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    if ref is None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return ref


def _int(value: Any) -> int:
    """A ctypes scalar or a Python int, as int."""
    return int(getattr(value, "value", value))


def _store(ref: Any, value: int) -> None:
    _target(ref).value = value


def _copy_fields(source: Any, ref: Any, fields: tuple[str, ...]) -> None:
    target = _target(ref)
    for field in fields:
        setattr(target, field, getattr(source, field))


def _memory(sim: SimNvml) -> Entry:
    def entry(handle: Any, ref: Any) -> None:
        _copy_fields(sim.nvmlDeviceGetMemoryInfo(handle), ref, ("total", "free", "used"))

    return entry


def _memory_v2(sim: SimNvml) -> Entry:
    def entry(handle: Any, ref: Any) -> None:
        version = int(_target(ref).version)
        memory = sim.nvmlDeviceGetMemoryInfo(handle, version or -1)
        _copy_fields(memory, ref, ("total", "reserved", "free", "used"))

    return entry


def _temperature(sim: SimNvml) -> Entry:
    def entry(handle: Any, sensor: Any, ref: Any) -> None:
        _store(ref, sim.nvmlDeviceGetTemperature(handle, _int(sensor)))

    return entry


def _temperature_v(sim: SimNvml) -> Entry:
    def entry(handle: Any, ref: Any) -> None:
        target = _target(ref)
        value = sim.nvmlDeviceGetTemperatureV(handle, int(target.sensorType), int(target.version))
        target.temperature = value

    return entry


def _scalar(method: Callable[[Any], int]) -> Entry:
    def entry(handle: Any, ref: Any) -> None:
        _store(ref, method(handle))

    return entry


def _pair(method: Callable[[Any], list[int]]) -> Entry:
    def entry(handle: Any, first: Any, second: Any) -> None:
        a, b = method(handle)
        _store(first, a)
        _store(second, b)

    return entry


def _utilization(sim: SimNvml) -> Entry:
    def entry(handle: Any, ref: Any) -> None:
        _copy_fields(sim.nvmlDeviceGetUtilizationRates(handle), ref, ("gpu", "memory"))

    return entry


_PROCESS_FIELDS = ("pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId")


def _processes(method: Callable[[Any], list[Any]]) -> Entry:
    """A process-list entry point: ``(device, *count, infos or NULL)``, as in nvml.h.

    With too small a buffer (or NULL) it sets the count and returns INSUFFICIENT_SIZE, or
    SUCCESS with a count of 0 when there are no processes. Fields the caller's struct lacks
    (the v1 struct has no instance IDs) are left out.
    """

    def entry(handle: Any, count_ref: Any, infos: Any) -> None:
        found = method(handle)
        count = _target(count_ref)
        if infos is None or int(count.value) < len(found):
            count.value = len(found)
            if found:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            return
        array = _target(infos)
        for i, proc in enumerate(found):
            slot = array[i]
            for field in _PROCESS_FIELDS:
                if hasattr(slot, field):
                    setattr(slot, field, getattr(proc, field))
        count.value = len(found)

    return entry


def _field_values(sim: SimNvml) -> Entry:
    def entry(handle: Any, count: Any, ref: Any) -> None:
        array = _target(ref)
        n = _int(count)
        if n <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        sim.fill_field_values(handle, [array[i] for i in range(n)])

    return entry


def _count(sim: SimNvml) -> Entry:
    def entry(ref: Any) -> None:
        _store(ref, sim.nvmlDeviceGetCount())

    return entry


def _unsupported(*_args: Any) -> None:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


# Symbols a Linux driver has for features it does not offer there: present, NOT_SUPPORTED.
LINUX_ONLY_STUBS = ("nvmlDeviceGetDriverModel", "nvmlDeviceGetDriverModel_v2")


def entry_points(sim: SimNvml) -> dict[str, Entry]:
    """Every C entry point the simulated driver has, by symbol name."""
    return {
        **dict.fromkeys(LINUX_ONLY_STUBS, _unsupported),
        "nvmlDeviceGetCount": _count(sim),
        "nvmlDeviceGetCount_v2": _count(sim),
        "nvmlDeviceGetMemoryInfo": _memory(sim),
        "nvmlDeviceGetMemoryInfo_v2": _memory_v2(sim),
        "nvmlDeviceGetTemperature": _temperature(sim),
        "nvmlDeviceGetTemperatureV": _temperature_v(sim),
        "nvmlDeviceGetUtilizationRates": _utilization(sim),
        "nvmlDeviceGetPowerUsage": _scalar(sim.nvmlDeviceGetPowerUsage),
        "nvmlDeviceGetEnforcedPowerLimit": _scalar(sim.nvmlDeviceGetEnforcedPowerLimit),
        "nvmlDeviceGetPowerManagementLimit": _scalar(sim.nvmlDeviceGetPowerManagementLimit),
        "nvmlDeviceGetTotalEnergyConsumption": _scalar(sim.nvmlDeviceGetTotalEnergyConsumption),
        "nvmlDeviceGetEncoderUtilization": _pair(sim.nvmlDeviceGetEncoderUtilization),
        "nvmlDeviceGetDecoderUtilization": _pair(sim.nvmlDeviceGetDecoderUtilization),
        "nvmlDeviceGetJpgUtilization": _pair(sim.nvmlDeviceGetJpgUtilization),
        "nvmlDeviceGetOfaUtilization": _pair(sim.nvmlDeviceGetOfaUtilization),
        "nvmlDeviceGetFieldValues": _field_values(sim),
        **{
            f"nvmlDeviceGet{kind}RunningProcesses{suffix}": _processes(
                getattr(sim, f"nvmlDeviceGet{kind}RunningProcesses_v3")
            )
            for kind in ("Compute", "Graphics", "MPSCompute")
            for suffix in ("", "_v2", "_v3")
        },
    }
