"""The Python side of the simulated ``libnvidia-ml.so.1``: NVML's C calls, answered here.

The C library (``core.c`` and the entry points generated from ``nvml.h``) forwards each
simulated function here as ``call(name, *args)``, every argument widened to an unsigned 64-bit
integer: pointers as addresses, handles as the handle value, scalars as themselves. A handler
reads its inputs, asks the process-wide :class:`~nodeagent.sim.nvml.SimNvml` (the same one
``pynvml_compat`` serves, so every reader of the node sees one state) and writes its results
through the caller's pointers, in NVML's struct layouts (pynvml's ctypes structs, whose sizes a
test checks against NVIDIA's header). It returns the NVML return code.

Handlers run under the GIL the C side takes for them; ``nvmlEventSetWait_v2`` sleeps in the
simulator's change waiter, which releases it, so a blocked wait holds up no other call.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from typing import Any

import pynvml

from nodeagent.sim import cabi
from nodeagent.sim.nvml import SimNvml
from nodeagent.sim.pynvml_compat import default_instance

Handler = Callable[..., None]

_INVALID = pynvml.NVML_ERROR_INVALID_ARGUMENT
_VERSION_MISMATCH = 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH


class _ProcessInfoV1(ctypes.Structure):
    """``nvmlProcessInfo_v1_t``: what the unversioned process-list functions fill."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _GiProfileInfoV3(ctypes.Structure):
    """``nvmlGpuInstanceProfileInfo_v3_t`` (no ``isP2pSupported``; a ``capabilities`` word)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("id", ctypes.c_uint),
        ("sliceCount", ctypes.c_uint),
        ("instanceCount", ctypes.c_uint),
        ("multiprocessorCount", ctypes.c_uint),
        ("copyEngineCount", ctypes.c_uint),
        ("decoderCount", ctypes.c_uint),
        ("encoderCount", ctypes.c_uint),
        ("jpegCount", ctypes.c_uint),
        ("ofaCount", ctypes.c_uint),
        ("memorySizeMB", ctypes.c_ulonglong),
        ("name", ctypes.c_char * 96),
        ("capabilities", ctypes.c_uint),
    ]


class _CiProfileInfoV3(ctypes.Structure):
    """``nvmlComputeInstanceProfileInfo_v3_t``."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("id", ctypes.c_uint),
        ("sliceCount", ctypes.c_uint),
        ("instanceCount", ctypes.c_uint),
        ("multiprocessorCount", ctypes.c_uint),
        ("sharedCopyEngineCount", ctypes.c_uint),
        ("sharedDecoderCount", ctypes.c_uint),
        ("sharedEncoderCount", ctypes.c_uint),
        ("sharedJpegCount", ctypes.c_uint),
        ("sharedOfaCount", ctypes.c_uint),
        ("name", ctypes.c_char * 96),
        ("capabilities", ctypes.c_uint),
    ]


def _version(struct: type[ctypes.Structure], number: int) -> int:
    """NVML_STRUCT_VERSION: the struct's size with the version number in the top byte."""
    return ctypes.sizeof(struct) | (number << 24)


GI_PROFILE_V2 = _version(pynvml.c_nvmlGpuInstanceProfileInfo_v2_t, 2)
GI_PROFILE_V3 = _version(_GiProfileInfoV3, 3)
CI_PROFILE_V2 = _version(pynvml.c_nvmlComputeInstanceProfileInfo_v2_t, 2)
CI_PROFILE_V3 = _version(_CiProfileInfoV3, 3)

# The simulated device count never exceeds this, and a MIG GPU has at most 7 GPU instances of a
# profile and 8 compute instances in one: the array sizes NVML's callers allocate from
# ``instanceCount``. Arrays are never shorter than the profile's instanceCount (nvml.h).


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _at(address: int, ctype: Any) -> Any:
    if not address:
        raise _err(_INVALID)
    return ctype.from_address(address)


def _put(address: int, ctype: Any, value: Any) -> None:
    _at(address, ctype).value = value


def _uint(address: int, value: int) -> None:
    _put(address, ctypes.c_uint, value)


def _text(address: int, length: int, value: str | bytes) -> None:
    """A C string into a caller's buffer; INSUFFICIENT_SIZE when it does not fit, as NVML."""
    data = value.encode() if isinstance(value, str) else bytes(value)
    if not address:
        raise _err(_INVALID)
    if len(data) + 1 > length:
        raise _err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(address, data + b"\0", len(data) + 1)


def _copy(address: int, struct: Any, size: int | None = None) -> None:
    if not address:
        raise _err(_INVALID)
    ctypes.memmove(address, ctypes.addressof(struct), size or ctypes.sizeof(struct))


def _cstr(address: int) -> bytes:
    if not address:
        raise _err(_INVALID)
    return ctypes.string_at(address)


def _handle(value: int, kind: Any = pynvml.c_nvmlDevice_t) -> Any:
    return ctypes.cast(ctypes.c_void_p(value), kind)


def _put_handle(address: int, handle: Any) -> None:
    _put(address, ctypes.c_void_p, ctypes.cast(handle, ctypes.c_void_p).value)


def _signed(value: int) -> int:
    """A C ``int`` that travelled as an unsigned 64-bit integer."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _fields(struct: type[ctypes.Structure]) -> list[str]:
    return [str(field[0]) for field in struct._fields_]


def _number(value: Any) -> int:
    """An int from what a pynvml-style call returns: an int or a ctypes scalar."""
    return int(getattr(value, "value", value))


def _array(address: int, ctype: Any, length: int) -> Any:
    return (ctype * length).from_address(address) if address else None


def _instance_count(sim: SimNvml, device: Any, profile_id: int) -> int:
    return int(sim.nvmlDeviceGetGpuInstanceProfileInfoById(device, profile_id).instanceCount)


def _copy_profile(out: int, info: Any, v2: int, v3: int, v3_struct: type[ctypes.Structure]) -> None:
    """Write a v2 profile info in the struct version the caller set in ``out``'s first field.

    The simulator answers v2; a v3 caller gets the same fields in the v3 layout (its name and
    capabilities extra), any other version NVML's ARGUMENT_VERSION_MISMATCH.
    """
    version = int(_at(out, ctypes.c_uint).value)
    if version == v2:
        _copy(out, info)
    elif version == v3:
        converted = v3_struct(version=version)
        for field in _fields(v3_struct):
            if field not in ("version", "capabilities"):
                setattr(converted, field, getattr(info, field))
        _copy(out, converted)
    else:
        raise _err(_VERSION_MISMATCH)


def handlers(sim: SimNvml) -> dict[str, Handler]:
    """Every simulated C entry point, by symbol name."""
    entries = cabi.entry_points(sim)

    def init() -> None:
        sim.nvmlInit()

    def string(method: Callable[[], Any]) -> Handler:
        return lambda buf, length: _text(buf, length, method())

    def device_string(method: Callable[[Any], Any]) -> Handler:
        return lambda dev, buf, length: _text(buf, length, method(_handle(dev)))

    def device_uint(method: Callable[[Any], Any]) -> Handler:
        return lambda dev, out: _uint(out, _number(method(_handle(dev))))

    def device_ull(method: Callable[[Any], int]) -> Handler:
        return lambda dev, out: _put(out, ctypes.c_ulonglong, int(method(_handle(dev))))

    def device_struct(method: Callable[[Any], Any]) -> Handler:
        return lambda dev, out: _copy(out, method(_handle(dev)))

    def cuda_version(out: int) -> None:
        _put(out, ctypes.c_int, sim.nvmlSystemGetCudaDriverVersion())

    def count(out: int) -> None:
        _uint(out, sim.nvmlDeviceGetCount())

    def by_index(index: int, out: int) -> None:
        _put_handle(out, sim.nvmlDeviceGetHandleByIndex(index & 0xFFFFFFFF))

    def by_uuid(uuid: int, out: int) -> None:
        _put_handle(out, sim.nvmlDeviceGetHandleByUUID(_cstr(uuid)))

    def by_pci(bus_id: int, out: int) -> None:
        _put_handle(out, sim.nvmlDeviceGetHandleByPciBusId(_cstr(bus_id)))

    def compute_capability(dev: int, major: int, minor: int) -> None:
        a, b = sim.nvmlDeviceGetCudaComputeCapability(_handle(dev))
        _put(major, ctypes.c_int, a)
        _put(minor, ctypes.c_int, b)

    def memory(dev: int, out: int) -> None:
        entries["nvmlDeviceGetMemoryInfo"](_handle(dev), _at(out, pynvml.c_nvmlMemory_t))

    def memory_v2(dev: int, out: int) -> None:
        target = _at(out, pynvml.c_nvmlMemory_v2_t)
        if target.version != pynvml.nvmlMemory_v2:
            raise _err(_VERSION_MISMATCH)
        entries["nvmlDeviceGetMemoryInfo_v2"](_handle(dev), target)

    def utilization(dev: int, out: int) -> None:
        entries["nvmlDeviceGetUtilizationRates"](_handle(dev), _at(out, pynvml.c_nvmlUtilization_t))

    def temperature(dev: int, sensor: int, out: int) -> None:
        _uint(out, sim.nvmlDeviceGetTemperature(_handle(dev), sensor))

    def threshold(dev: int, kind: int, out: int) -> None:
        _uint(out, sim.nvmlDeviceGetTemperatureThreshold(_handle(dev), kind))

    def clock(method: Callable[[Any, int], int]) -> Handler:
        return lambda dev, kind, out: _uint(out, method(_handle(dev), kind))

    def pair(method: Callable[[Any], Any]) -> Handler:
        def entry(dev: int, first: int, second: int) -> None:
            a, b = method(_handle(dev))
            _uint(first, a)
            _uint(second, b)

        return entry

    def ecc_total(dev: int, error_type: int, counter_type: int, out: int) -> None:
        value = sim.nvmlDeviceGetTotalEccErrors(_handle(dev), error_type, counter_type)
        _put(out, ctypes.c_ulonglong, value)

    def remapped_rows(dev: int, corr: int, unc: int, pending: int, failure: int) -> None:
        values = sim.nvmlDeviceGetRemappedRows(_handle(dev))
        for address, value in zip((corr, unc, pending, failure), values, strict=True):
            _uint(address, value)

    def nvlink_state(dev: int, link: int, out: int) -> None:
        _uint(out, sim.nvmlDeviceGetNvLinkState(_handle(dev), link))

    def nvlink_remote_pci(dev: int, link: int, out: int) -> None:
        _copy(out, sim.nvmlDeviceGetNvLinkRemotePciInfo(_handle(dev), link))

    def nvlink_remote_type(dev: int, link: int, out: int) -> None:
        _uint(out, sim.nvmlDeviceGetNvLinkRemoteDeviceType(_handle(dev), link))

    def nvlink_errors(dev: int, link: int, counter: int, out: int) -> None:
        value = sim.nvmlDeviceGetNvLinkErrorCounter(_handle(dev), link, counter)
        _put(out, ctypes.c_ulonglong, value)

    def common_ancestor(dev1: int, dev2: int, out: int) -> None:
        _uint(out, sim.nvmlDeviceGetTopologyCommonAncestor(_handle(dev1), _handle(dev2)))

    def p2p(dev1: int, dev2: int, index: int, out: int) -> None:
        _uint(out, sim.nvmlDeviceGetP2PStatus(_handle(dev1), _handle(dev2), index))

    def processes(name: str, struct: Any) -> Handler:
        entry = entries[name]

        def call(dev: int, count_address: int, infos: int) -> None:
            count_ref = _at(count_address, ctypes.c_uint)
            entry(_handle(dev), count_ref, _array(infos, struct, int(count_ref.value)))

        return call

    def field_values(dev: int, n: int, values: int) -> None:
        length = _signed(n)
        if length <= 0 or not values:
            raise _err(_INVALID)
        array = (pynvml.c_nvmlFieldValue_t * length).from_address(values)
        entries["nvmlDeviceGetFieldValues"](_handle(dev), length, array)

    # --- events ---------------------------------------------------------------------------
    def event_set_create(out: int) -> None:
        _put_handle(out, sim.nvmlEventSetCreate())

    def register_events(dev: int, types: int, event_set: int) -> None:
        sim.nvmlDeviceRegisterEvents(
            _handle(dev), types, _handle(event_set, pynvml.c_nvmlEventSet_t)
        )

    def supported_events(dev: int, out: int) -> None:
        _put(out, ctypes.c_ulonglong, sim.nvmlDeviceGetSupportedEventTypes(_handle(dev)))

    def event_wait(event_set: int, data: int, timeout_ms: int) -> None:
        if not data:
            raise _err(_INVALID)
        found = sim.nvmlEventSetWait_v2(
            _handle(event_set, pynvml.c_nvmlEventSet_t), timeout_ms & 0xFFFFFFFF
        )
        _copy(data, found)

    def event_free(event_set: int) -> None:
        sim.nvmlEventSetFree(_handle(event_set, pynvml.c_nvmlEventSet_t))

    # --- MIG ------------------------------------------------------------------------------
    def mig_mode(dev: int, current: int, pending: int) -> None:
        now, then = sim.nvmlDeviceGetMigMode(_handle(dev))
        _uint(current, now)
        _uint(pending, then)

    def set_mig_mode(dev: int, mode: int, status: int) -> None:
        _uint(status, int(sim.nvmlDeviceSetMigMode(_handle(dev), mode) or 0))

    def gi_profile_v1(dev: int, profile: int, out: int) -> None:
        info = sim.nvmlDeviceGetGpuInstanceProfileInfo(_handle(dev), profile, 1)
        _copy(out, info)

    def gi_profile_v(dev: int, profile: int, out: int) -> None:
        info = sim.nvmlDeviceGetGpuInstanceProfileInfo(_handle(dev), profile, 2)
        _copy_profile(out, info, GI_PROFILE_V2, GI_PROFILE_V3, _GiProfileInfoV3)

    def gi_placements(dev: int, profile_id: int, placements: int, count_address: int) -> None:
        count_ref = _at(count_address, ctypes.c_uint)
        if placements:
            # nvml.h: the array holds at least the profile's possible placements; the count is
            # only an output.
            count_ref.value = 32
        array = _array(placements, pynvml.c_nvmlGpuInstancePlacement_t, int(count_ref.value))
        sim.nvmlDeviceGetGpuInstancePossiblePlacements(_handle(dev), profile_id, array, count_ref)

    def gi_remaining(dev: int, profile_id: int, out: int) -> None:
        _uint(out, sim.nvmlDeviceGetGpuInstanceRemainingCapacity(_handle(dev), profile_id))

    def create_gi(dev: int, profile_id: int, out: int) -> None:
        _put_handle(out, sim.nvmlDeviceCreateGpuInstance(_handle(dev), profile_id))

    def create_gi_at(dev: int, profile_id: int, placement: int, out: int) -> None:
        where = _at(placement, pynvml.c_nvmlGpuInstancePlacement_t)
        _put_handle(
            out, sim.nvmlDeviceCreateGpuInstanceWithPlacement(_handle(dev), profile_id, where)
        )

    def gi_destroy(gi: int) -> None:
        sim.nvmlGpuInstanceDestroy(_handle(gi, pynvml.c_nvmlGpuInstance_t))

    def gpu_instances(dev: int, profile_id: int, out: int, count_address: int) -> None:
        handle = _handle(dev)
        count_ref = _at(count_address, ctypes.c_uint)
        length = _instance_count(sim, handle, profile_id) if out else 0
        array = _array(out, pynvml.c_nvmlGpuInstance_t, length)
        sim.nvmlDeviceGetGpuInstances(handle, profile_id, array, count_ref)

    def gi_by_id(dev: int, gi_id: int, out: int) -> None:
        _put_handle(out, sim.nvmlDeviceGetGpuInstanceById(_handle(dev), gi_id))

    def gi_info(gi: int, out: int) -> None:
        _copy(out, sim.nvmlGpuInstanceGetInfo(_handle(gi, pynvml.c_nvmlGpuInstance_t)))

    def gi(value: int) -> Any:
        return _handle(value, pynvml.c_nvmlGpuInstance_t)

    def ci_profile_v1(gi_value: int, profile: int, engine: int, out: int) -> None:
        info = sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi(gi_value), profile, engine, 1)
        _copy(out, info)

    def ci_profile_v(gi_value: int, profile: int, engine: int, out: int) -> None:
        info = sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi(gi_value), profile, engine, 2)
        _copy_profile(out, info, CI_PROFILE_V2, CI_PROFILE_V3, _CiProfileInfoV3)

    def ci_remaining(gi_value: int, profile_id: int, out: int) -> None:
        value = sim.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi(gi_value), profile_id)
        _uint(out, value)

    def ci_placements(gi_value: int, profile_id: int, placements: int, count_address: int) -> None:
        count_ref = _at(count_address, ctypes.c_uint)
        if placements:
            count_ref.value = 8
        array = _array(placements, pynvml.c_nvmlComputeInstancePlacement_t, int(count_ref.value))
        sim.nvmlGpuInstanceGetComputeInstancePossiblePlacements(
            gi(gi_value), profile_id, array, count_ref
        )

    def create_ci(gi_value: int, profile_id: int, out: int) -> None:
        _put_handle(out, sim.nvmlGpuInstanceCreateComputeInstance(gi(gi_value), profile_id))

    def create_ci_at(gi_value: int, profile_id: int, placement: int, out: int) -> None:
        where = _at(placement, pynvml.c_nvmlComputeInstancePlacement_t)
        created = sim.nvmlGpuInstanceCreateComputeInstanceWithPlacement(
            gi(gi_value), profile_id, where
        )
        _put_handle(out, created)

    def ci_destroy(ci: int) -> None:
        sim.nvmlComputeInstanceDestroy(_handle(ci, pynvml.c_nvmlComputeInstance_t))

    def compute_instances(gi_value: int, profile_id: int, out: int, count_address: int) -> None:
        count_ref = _at(count_address, ctypes.c_uint)
        array = _array(out, pynvml.c_nvmlComputeInstance_t, 8 if out else 0)
        sim.nvmlGpuInstanceGetComputeInstances(gi(gi_value), profile_id, array, count_ref)

    def ci_by_id(gi_value: int, ci_id: int, out: int) -> None:
        _put_handle(out, sim.nvmlGpuInstanceGetComputeInstanceById(gi(gi_value), ci_id))

    def ci_info(ci: int, out: int) -> None:
        info = sim.nvmlComputeInstanceGetInfo_v2(_handle(ci, pynvml.c_nvmlComputeInstance_t))
        _copy(out, info)

    def mig_handle(dev: int, index: int, out: int) -> None:
        _put_handle(out, sim.nvmlDeviceGetMigDeviceHandleByIndex(_handle(dev), index))

    def parent(mig: int, out: int) -> None:
        _put_handle(out, sim.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(_handle(mig)))

    # --- GPM ------------------------------------------------------------------------------
    def gpm_sample(value: int) -> Any:
        return _handle(value, pynvml.c_nvmlGpmSample_t)

    def gpm_support(dev: int, out: int) -> None:
        found = sim.nvmlGpmQueryDeviceSupport(_handle(dev))
        target = _at(out, pynvml.c_nvmlGpmSupport_t)
        if target.version != pynvml.NVML_GPM_SUPPORT_VERSION:
            raise _err(_VERSION_MISMATCH)
        target.isSupportedDevice = found.isSupportedDevice

    def gpm_metrics(out: int) -> None:
        # Filled in place; metricInfo stays empty (no pointers into Python memory escape).
        sim.nvmlGpmMetricsGet(_at(out, pynvml.c_nvmlGpmMetricsGet_t))

    def attributes(dev: int, out: int) -> None:
        _copy(out, device_attributes(sim, _handle(dev)))

    return {
        "nvmlInit": init,
        "nvmlInit_v2": init,
        "nvmlInitWithFlags": lambda flags: sim.nvmlInitWithFlags(flags & 0xFFFFFFFF),
        "nvmlShutdown": lambda: sim.nvmlShutdown(),
        "nvmlSystemGetDriverVersion": string(sim.nvmlSystemGetDriverVersion),
        "nvmlSystemGetNVMLVersion": string(sim.nvmlSystemGetNVMLVersion),
        "nvmlSystemGetCudaDriverVersion": cuda_version,
        "nvmlSystemGetCudaDriverVersion_v2": cuda_version,
        "nvmlSystemGetProcessName": lambda pid, buf, length: _text(
            buf, length, sim.nvmlSystemGetProcessName(pid)
        ),
        "nvmlDeviceGetCount": count,
        "nvmlDeviceGetCount_v2": count,
        "nvmlDeviceGetHandleByIndex": by_index,
        "nvmlDeviceGetHandleByIndex_v2": by_index,
        "nvmlDeviceGetHandleByUUID": by_uuid,
        "nvmlDeviceGetHandleByPciBusId": by_pci,
        "nvmlDeviceGetHandleByPciBusId_v2": by_pci,
        "nvmlDeviceGetIndex": device_uint(sim.nvmlDeviceGetIndex),
        "nvmlDeviceGetMinorNumber": device_uint(sim.nvmlDeviceGetMinorNumber),
        "nvmlDeviceGetNumaNodeId": device_uint(sim.nvmlDeviceGetNumaNodeId),
        "nvmlDeviceGetName": device_string(sim.nvmlDeviceGetName),
        "nvmlDeviceGetUUID": device_string(sim.nvmlDeviceGetUUID),
        "nvmlDeviceGetSerial": device_string(sim.nvmlDeviceGetSerial),
        "nvmlDeviceGetVbiosVersion": device_string(sim.nvmlDeviceGetVbiosVersion),
        "nvmlDeviceGetPciInfo": device_struct(sim.nvmlDeviceGetPciInfo),
        "nvmlDeviceGetPciInfo_v2": device_struct(sim.nvmlDeviceGetPciInfo),
        "nvmlDeviceGetPciInfo_v3": device_struct(sim.nvmlDeviceGetPciInfo_v3),
        "nvmlDeviceGetCudaComputeCapability": compute_capability,
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetMemoryInfo_v2": memory_v2,
        "nvmlDeviceGetBAR1MemoryInfo": device_struct(sim.nvmlDeviceGetBAR1MemoryInfo),
        "nvmlDeviceGetUtilizationRates": utilization,
        "nvmlDeviceGetTemperature": temperature,
        "nvmlDeviceGetTemperatureThreshold": threshold,
        "nvmlDeviceGetPowerUsage": device_uint(sim.nvmlDeviceGetPowerUsage),
        "nvmlDeviceGetEnforcedPowerLimit": device_uint(sim.nvmlDeviceGetEnforcedPowerLimit),
        "nvmlDeviceGetPowerManagementLimit": device_uint(sim.nvmlDeviceGetPowerManagementLimit),
        "nvmlDeviceGetTotalEnergyConsumption": device_ull(sim.nvmlDeviceGetTotalEnergyConsumption),
        "nvmlDeviceGetClockInfo": clock(sim.nvmlDeviceGetClockInfo),
        "nvmlDeviceGetMaxClockInfo": clock(sim.nvmlDeviceGetMaxClockInfo),
        "nvmlDeviceGetCurrentClocksEventReasons": device_ull(
            sim.nvmlDeviceGetCurrentClocksEventReasons
        ),
        "nvmlDeviceGetCurrentClocksThrottleReasons": device_ull(
            sim.nvmlDeviceGetCurrentClocksThrottleReasons
        ),
        "nvmlDeviceGetEncoderUtilization": pair(sim.nvmlDeviceGetEncoderUtilization),
        "nvmlDeviceGetDecoderUtilization": pair(sim.nvmlDeviceGetDecoderUtilization),
        "nvmlDeviceGetEccMode": pair(sim.nvmlDeviceGetEccMode),
        "nvmlDeviceGetTotalEccErrors": ecc_total,
        "nvmlDeviceGetRemappedRows": remapped_rows,
        "nvmlDeviceGetRetiredPagesPendingStatus": device_uint(
            sim.nvmlDeviceGetRetiredPagesPendingStatus
        ),
        "nvmlDeviceGetPcieReplayCounter": device_uint(sim.nvmlDeviceGetPcieReplayCounter),
        "nvmlDeviceGetNvLinkState": nvlink_state,
        "nvmlDeviceGetNvLinkRemotePciInfo": nvlink_remote_pci,
        "nvmlDeviceGetNvLinkRemotePciInfo_v2": nvlink_remote_pci,
        "nvmlDeviceGetNvLinkRemoteDeviceType": nvlink_remote_type,
        "nvmlDeviceGetNvLinkErrorCounter": nvlink_errors,
        "nvmlDeviceGetTopologyCommonAncestor": common_ancestor,
        "nvmlDeviceGetP2PStatus": p2p,
        **{
            f"nvmlDeviceGet{kind}RunningProcesses{suffix}": processes(
                f"nvmlDeviceGet{kind}RunningProcesses{suffix}", struct
            )
            for kind in ("Compute", "Graphics", "MPSCompute")
            for suffix, struct in (
                ("", _ProcessInfoV1),
                ("_v2", pynvml.c_nvmlProcessInfo_v2_t),
                ("_v3", pynvml.c_nvmlProcessInfo_t),
            )
        },
        "nvmlDeviceGetFieldValues": field_values,
        "nvmlEventSetCreate": event_set_create,
        "nvmlDeviceRegisterEvents": register_events,
        "nvmlDeviceGetSupportedEventTypes": supported_events,
        "nvmlEventSetWait": event_wait,
        "nvmlEventSetWait_v2": event_wait,
        "nvmlEventSetFree": event_free,
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceSetMigMode": set_mig_mode,
        "nvmlDeviceGetGpuInstanceProfileInfo": gi_profile_v1,
        "nvmlDeviceGetGpuInstanceProfileInfoV": gi_profile_v,
        "nvmlDeviceGetGpuInstancePossiblePlacements": gi_placements,
        "nvmlDeviceGetGpuInstancePossiblePlacements_v2": gi_placements,
        "nvmlDeviceGetGpuInstanceRemainingCapacity": gi_remaining,
        "nvmlDeviceCreateGpuInstance": create_gi,
        "nvmlDeviceCreateGpuInstanceWithPlacement": create_gi_at,
        "nvmlGpuInstanceDestroy": gi_destroy,
        "nvmlDeviceGetGpuInstances": gpu_instances,
        "nvmlDeviceGetGpuInstanceById": gi_by_id,
        "nvmlGpuInstanceGetInfo": gi_info,
        "nvmlGpuInstanceGetComputeInstanceProfileInfo": ci_profile_v1,
        "nvmlGpuInstanceGetComputeInstanceProfileInfoV": ci_profile_v,
        "nvmlGpuInstanceGetComputeInstanceRemainingCapacity": ci_remaining,
        "nvmlGpuInstanceGetComputeInstancePossiblePlacements": ci_placements,
        "nvmlGpuInstanceCreateComputeInstance": create_ci,
        "nvmlGpuInstanceCreateComputeInstanceWithPlacement": create_ci_at,
        "nvmlComputeInstanceDestroy": ci_destroy,
        "nvmlGpuInstanceGetComputeInstances": compute_instances,
        "nvmlGpuInstanceGetComputeInstanceById": ci_by_id,
        "nvmlComputeInstanceGetInfo": ci_info,
        "nvmlComputeInstanceGetInfo_v2": ci_info,
        "nvmlDeviceIsMigDeviceHandle": device_uint(sim.nvmlDeviceIsMigDeviceHandle),
        "nvmlDeviceGetGpuInstanceId": device_uint(sim.nvmlDeviceGetGpuInstanceId),
        "nvmlDeviceGetComputeInstanceId": device_uint(sim.nvmlDeviceGetComputeInstanceId),
        "nvmlDeviceGetMaxMigDeviceCount": device_uint(sim.nvmlDeviceGetMaxMigDeviceCount),
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": parent,
        "nvmlGpmQueryDeviceSupport": gpm_support,
        "nvmlGpmSampleAlloc": lambda out: _put_handle(out, sim.nvmlGpmSampleAlloc()),
        "nvmlGpmSampleFree": lambda sample: sim.nvmlGpmSampleFree(gpm_sample(sample)),
        "nvmlGpmSampleGet": lambda dev, sample: sim.nvmlGpmSampleGet(
            _handle(dev), gpm_sample(sample)
        ),
        "nvmlGpmMigSampleGet": lambda dev, gi_id, sample: sim.nvmlGpmMigSampleGet(
            _handle(dev), gi_id, gpm_sample(sample)
        ),
        "nvmlGpmMetricsGet": gpm_metrics,
        "nvmlDeviceGetAttributes": attributes,
        "nvmlDeviceGetAttributes_v2": attributes,
    }


def device_attributes(sim: SimNvml, device: Any) -> Any:
    """``nvmlDeviceAttributes_t`` of a MIG device, from its GPU and compute instance profiles.

    NOT_SUPPORTED for a whole GPU, as the simulator keeps attributes only per MIG profile.
    """
    if not _number(sim.nvmlDeviceIsMigDeviceHandle(device)):
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
    parent = sim.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(device)
    gi = sim.nvmlDeviceGetGpuInstanceById(parent, sim.nvmlDeviceGetGpuInstanceId(device))
    gi_info = sim.nvmlGpuInstanceGetInfo(gi)
    gi_profile = sim.nvmlDeviceGetGpuInstanceProfileInfoById(parent, gi_info.profileId)
    ci = sim.nvmlGpuInstanceGetComputeInstanceById(gi, sim.nvmlDeviceGetComputeInstanceId(device))
    ci_profile_id = int(sim.nvmlComputeInstanceGetInfo_v2(ci).profileId)
    attrs = pynvml.c_nvmlDeviceAttributes()
    attrs.gpuInstanceSliceCount = gi_profile.sliceCount
    attrs.memorySizeMB = gi_profile.memorySizeMB
    for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, 0, 2)
        except pynvml.NVMLError:
            continue
        if int(info.id) == ci_profile_id:
            attrs.multiprocessorCount = info.multiprocessorCount
            attrs.computeInstanceSliceCount = info.sliceCount
            attrs.sharedCopyEngineCount = info.sharedCopyEngineCount
            attrs.sharedDecoderCount = info.sharedDecoderCount
            attrs.sharedEncoderCount = info.sharedEncoderCount
            attrs.sharedJpegCount = info.sharedJpegCount
            attrs.sharedOfaCount = info.sharedOfaCount
            return attrs
    raise _err(pynvml.NVML_ERROR_UNKNOWN)


_handlers: dict[str, Handler] | None = None
# The node the library serves when it differs from the process's own simulator setting: a
# program that must reach NVML only through the C library (nodeagent's hardware suite, which
# would otherwise take NODEAGENT_SIM_STATE as a cue to simulate in Python) names it here.
ENV_STATE = "NODEAGENT_LIBNVML_STATE"


def _instance() -> SimNvml:
    named = os.environ.get(ENV_STATE)
    if named:
        return SimNvml(named, os.environ.get("NODEAGENT_SIMULATE") or None)
    return default_instance()


def simulated() -> frozenset[str]:
    """The names the C library forwards here (the rest answer NOT_SUPPORTED in C)."""
    return frozenset(handlers(SimNvml.__new__(SimNvml)))


def call(name: str, *args: int) -> int:
    """Run the entry point ``name`` with the C arguments; the NVML return code."""
    global _handlers
    if _handlers is None:
        _handlers = handlers(_instance())
    handler = _handlers.get(name)
    if handler is None:
        return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
    try:
        handler(*args)
    except pynvml.NVMLError as exc:
        return int(exc.value)
    except Exception as exc:  # noqa: BLE001 - a simulator bug must not unwind into a C caller
        print(f"simulated libnvidia-ml: {name} failed: {exc!r}", file=sys.stderr)
        return int(pynvml.NVML_ERROR_UNKNOWN)
    return int(pynvml.NVML_SUCCESS)
