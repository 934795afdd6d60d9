"""``SimNvml``: an object that looks like the ``pynvml`` module, backed by a simulated node.

Every pynvml constant, ctypes struct class, helper and ``NVMLError`` subclass is reachable as an
attribute (taken from the real ``pynvml`` module), so code written against pynvml runs unchanged:
``except pynvml.NVMLError_InUse`` catches what this object raises, because it raises
``pynvml.NVMLError(code)`` itself. The functions the simulator models are methods below; any
other ``nvml*`` function pynvml has raises ``NVMLError(NOT_SUPPORTED)``.

Handles are real ctypes pointers of pynvml's handle types (``c_nvmlDevice_t``,
``c_nvmlGpuInstance_t``, ...) whose address encodes what they point at, so they fit in the
caller-allocated arrays that ``nvmlDeviceGetGpuInstances`` and friends fill. They are never
dereferenced.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from nodeagent.migcatalog import driver_branch
from nodeagent.sim import cabi, gpm, models, ops, presets, telemetry
from nodeagent.sim.state import SimStateError, State, StateStore, default_state_dir
from nodeagent.sim.watch import ChangeWaiter

# Handle address layout: magic (4 bits) | kind (4) | gpu (8) | gi (8) | ci (8) | serial (24).
_MAGIC = 0x5
_KIND_DEVICE, _KIND_MIG, _KIND_GI, _KIND_CI, _KIND_EVENTSET, _KIND_GPM_SAMPLE = 1, 2, 3, 4, 5, 6
_SERIAL_MASK = (1 << 24) - 1
# Handles as pynvml passes them: typed pointers (c_nvmlDevice_t, ...) or plain void pointers.
_POINTER_TYPES = (ctypes._Pointer, ctypes.c_void_p)
# The first driver branch with nvmlDeviceGetMemoryInfo_v2 (inferred: R470's NVML reference has
# only nvmlMemory_t, R525's has nvmlMemory_v2_t; R510 is the branch between them that added it).
_MEMORY_V2_BRANCH = 510


ENGINE_SAMPLING_PERIOD_US = 167000

FIELD_UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
FIELD_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
NVLINK_THROUGHPUT_FIELDS = frozenset(
    {
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX,
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX,
    }
)

SUPPORTED_EVENTS = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeClock
)

# Error strings the driver's nvmlErrorString gives for codes pynvml has no text for.
ERROR_STRINGS = {
    pynvml.NVML_ERROR_IN_USE: "In use by another client",
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
    pynvml.NVML_ERROR_NO_DATA: "No data",
}

# pynvml helpers that are not NVML calls: passed through unchanged.
_PASSTHROUGH = frozenset(
    {"nvmlExceptionClass", "nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct",
     "nvmlFriendlyObject"}
)  # fmt: skip


def _tracked(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an NVML method under its NVML name, so ``_called_name`` can tell which one runs.

    The wrapper does nothing else: the name is only asked for on a GPU with an injected
    nvml-error fault, so it is looked up then, not recorded on each of a pass's ~450 calls.
    """

    @functools.wraps(method)
    def call(self: SimNvml, *args: Any, **kwargs: Any) -> Any:
        nvml_name = name  # noqa: F841 (a local of this frame, for _called_name to read)
        return method(self, *args, **kwargs)

    return call


_CALL_CODE = _tracked("", lambda self: None).__code__


def _called_name() -> str | None:
    """The NVML function the current thread's caller called: the outermost wrapper on the stack.

    Aliases that call another method inside the simulator still count as the function the
    caller named, as the driver would fail that one.
    """
    found: str | None = None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _CALL_CODE:
            found = frame.f_locals["nvml_name"]
        frame = frame.f_back  # type: ignore[assignment]
    return found


def _address(handle: Any) -> int | None:
    """The address a handle holds (None for NULL); INVALID_ARGUMENT for what is not one."""
    if isinstance(handle, _POINTER_TYPES):
        # The pointer's own bytes read as an address: what ``cast`` returns for a pointer,
        # without its Python-level wrapper (a quarter of a cheap call's cost before).
        return ctypes.c_void_p.from_buffer(handle).value
    try:  # anything else a caller may pass: an int, or a wrong object
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None


def _fixed_gpu_reading(value: int, doc: str) -> Callable[[SimNvml, Any], int]:
    """An NVML reading of a physical GPU that is the same on every simulated one."""

    def reading(self: SimNvml, handle: Any) -> int:
        self._gpu(handle)  # errors as the driver's: lost GPU, MIG or stale handle
        return value

    reading.__doc__ = doc
    return reading


ENV_SIM_TIME = "NODEAGENT_SIM_TIME"


def clock_from_env() -> Callable[[], float]:
    """The real wall clock, or a fixed one at the Unix time in ``NODEAGENT_SIM_TIME``.

    A fixed time freezes the simulated telemetry, so that separate programs reading the same
    node (``nodeagent status`` and a third-party tool, say) see the same values.
    """
    fixed = os.environ.get(ENV_SIM_TIME)
    if not fixed:
        return time.time
    try:
        at = float(fixed)
    except ValueError:
        at = math.nan
    if not math.isfinite(at):
        raise ValueError(
            f"{ENV_SIM_TIME}={fixed!r} is not a Unix time in seconds (e.g. 1767225600); "
            "unset it for the real clock"
        )
    return lambda: at


def _encode(kind: int, gpu: int = 0, gi: int = 0, ci: int = 0, serial: int = 0) -> int:
    return (
        (_MAGIC << 60) | (kind << 56) | (gpu << 48) | (gi << 40) | (ci << 32)
        | (serial & _SERIAL_MASK)
    )  # fmt: skip


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _deref(ref: Any) -> Any:
    """The object behind ``byref(x)`` / ``pointer(x)`` / ``x``."""
    obj = getattr(ref, "_obj", None)  # ctypes byref() result
    if obj is not None:
        return obj
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    return ref


def _set_count(count_ref: Any, value: int) -> None:
    target = _deref(count_ref)
    if not hasattr(target, "value"):
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    target.value = value


def _capacity(array_ref: Any) -> int:
    target = _deref(array_ref)
    if isinstance(target, ctypes.Array):
        return len(target)
    if isinstance(target, ctypes.Structure):
        return 1
    raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)


def _store_items(array_ref: Any, items: list[Any]) -> None:
    target = _deref(array_ref)
    if isinstance(target, ctypes.Structure):
        if items:
            ctypes.memmove(
                ctypes.addressof(target), ctypes.addressof(items[0]), ctypes.sizeof(target)
            )
        return
    for i, item in enumerate(items):
        target[i] = item


def _fill_array(array_ref: Any, count_ref: Any, items: list[Any]) -> int:
    """NVML's caller-allocated array protocol, as every ``Get...s(ref, count)`` call keeps it.

    A NULL array asks for the count; an array too small for the items fails with
    INSUFFICIENT_SIZE and the count it would need; otherwise the items are stored and counted.
    """
    if array_ref is not None:
        if _capacity(array_ref) < len(items):
            _set_count(count_ref, len(items))
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        _store_items(array_ref, items)
    _set_count(count_ref, len(items))
    return int(pynvml.NVML_SUCCESS)


class SimNvml:
    """A pynvml-compatible NVML backed by the simulated node in ``state_dir``.

    Args:
        state_dir: the node's state directory (shared with other processes); ``None`` means
            ``default_state_dir()`` (env ``NODEAGENT_SIM_STATE``, else the user's state dir).
        preset: seeds an empty state directory at ``nvmlInit``; an existing node is used as it is.
        clock: wall clock for telemetry and event timestamps (tests pass a fake one); ``None``
            is the real clock, or the fixed time in ``NODEAGENT_SIM_TIME`` when that is set.
    """

    def __init__(
        self,
        state_dir: Path | str | None = None,
        preset: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        clock = clock or clock_from_env()
        self.store = StateStore(Path(state_dir or default_state_dir()), clock=clock)
        self.preset = preset
        self.clock = clock
        self._init_count = 0
        self._lock = threading.Lock()
        self._event_sets: dict[int, dict[str, Any]] = {}
        self._entry_points: dict[str, cabi.Entry] | None = None
        self._next_event_set = 1
        self._processes_by_gpu: tuple[State, dict[int, list[dict[str, Any]]]] | None = None
        # GPM sample buffers by address: None until a sample is taken into it. Samples live in
        # this process, as the driver keeps them in the caller's address space.
        self._gpm_samples: dict[int, gpm.Sample | None] = {}
        self._next_gpm_sample = 1
        for code, text in ERROR_STRINGS.items():
            pynvml.NVMLError._errcode_to_string.setdefault(code, text)

    # --- the pynvml namespace ---------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        """pynvml's constants, structs and errors; unmodelled NVML calls raise NOT_SUPPORTED."""
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(pynvml, name)  # AttributeError for names pynvml does not have either
        if callable(value) and name.startswith("nvml") and name not in _PASSTHROUGH:
            if isinstance(value, type):
                return value
            return self._not_supported(name)
        return value

    def __dir__(self) -> list[str]:
        """pynvml's names and the simulator's own, as ``dir(pynvml)`` would list them."""
        return sorted(set(vars(pynvml)) | set(super().__dir__()))

    def _not_supported(self, name: str) -> Callable[..., Any]:
        """An NVML function the simulated driver has but does not support on its GPUs."""

        def not_supported(*_args: Any, **_kwargs: Any) -> Any:
            if self._init_count <= 0:
                raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

        not_supported.__name__ = name
        return not_supported

    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        """The C entry point ``name`` (see :mod:`nodeagent.sim.cabi`), as pynvml's function.

        UNINITIALIZED before ``nvmlInit`` and FUNCTION_NOT_FOUND for a symbol the simulated
        driver lacks, as pynvml raises them.
        """
        if self._init_count <= 0:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        with self._lock:
            if self._entry_points is None:
                self._entry_points = cabi.entry_points(self)
        entry = self._entry_points.get(name)
        if entry is None:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return cabi.FunctionPointer(name, entry)

    # --- plumbing ---------------------------------------------------------------------------
    def _state(self, *, fresh: bool = False) -> State:
        if self._init_count <= 0:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        try:
            return self.store.read(fresh=fresh)
        except SimStateError:
            raise _err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED) from None

    def _decode(self, handle: Any, *kinds: int) -> tuple[int, int, int, int, int]:
        address = _address(handle)
        if address is None or address >> 60 != _MAGIC:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        kind = (address >> 56) & 0xF
        if kind not in kinds:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return (
            kind,
            (address >> 48) & 0xFF,
            (address >> 40) & 0xFF,
            (address >> 32) & 0xFF,
            address & _SERIAL_MASK,
        )

    def _live_gpu(self, state: State, index: int) -> dict[str, Any]:
        gpus: list[dict[str, Any]] = state["gpus"]
        if index >= len(gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = gpus[index]
        faults = gpu["faults"]
        if faults["lost"]:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        broken: dict[str, int] | None = faults.get("nvml_errors")
        if broken:
            code = broken.get(_called_name() or "")
            if code is not None:
                raise _err(code)  # injected: this function fails on this GPU's handles
        return gpu

    def _gpu(self, handle: Any) -> tuple[State, dict[str, Any]]:
        """A physical GPU handle's state and GPU; MIG handles are NOT_SUPPORTED here."""
        state = self._state()
        kind, index, _, _, _ = self._decode(handle, _KIND_DEVICE, _KIND_MIG)
        gpu = self._live_gpu(state, index)
        if kind == _KIND_MIG:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return state, gpu

    def _any_device(
        self, handle: Any
    ) -> tuple[State, dict[str, Any], tuple[dict[str, Any], dict[str, Any]] | None]:
        """A GPU or MIG device handle: (state, GPU, (GI, CI) or None)."""
        state = self._state()
        kind, index, gi_id, ci_id, serial = self._decode(handle, _KIND_DEVICE, _KIND_MIG)
        gpu = self._live_gpu(state, index)
        if kind == _KIND_DEVICE:
            return state, gpu, None
        return state, gpu, self._find_ci(gpu, gi_id, ci_id, serial)

    @staticmethod
    def _find_ci(
        gpu: dict[str, Any], gi_id: int, ci_id: int, serial: int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        gi = ops.find_gi(gpu, gi_id)
        if gi is not None:
            for ci in gi["cis"]:
                if ci["id"] == ci_id and ci["serial"] & _SERIAL_MASK == serial:
                    return gi, ci
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # the instance is gone: a stale handle

    def _gi(self, handle: Any) -> tuple[State, dict[str, Any], dict[str, Any]]:
        state = self._state()
        _, index, gi_id, _, serial = self._decode(handle, _KIND_GI)
        gpu = self._live_gpu(state, index)
        gi = ops.find_gi(gpu, gi_id)
        if gi is None or gi["serial"] & _SERIAL_MASK != serial:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return state, gpu, gi

    def _ci(self, handle: Any) -> tuple[State, dict[str, Any], dict[str, Any], dict[str, Any]]:
        state = self._state()
        _, index, gi_id, ci_id, serial = self._decode(handle, _KIND_CI)
        gpu = self._live_gpu(state, index)
        gi, ci = self._find_ci(gpu, gi_id, ci_id, serial)
        return state, gpu, gi, ci

    def _mutate(self, change: Callable[[State], Any]) -> Any:
        self._state()  # UNINITIALIZED / DRIVER_NOT_LOADED checks
        return self.store.mutate(change)

    def _check_live(self, state: State, index: int) -> dict[str, Any]:
        """Inside a mutation: the GPU, GPU_IS_LOST when it fell off the bus."""
        gpu = ops.get_gpu(state, index)
        if gpu["faults"]["lost"]:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    @staticmethod
    def _device_handle(index: int) -> Any:
        return ctypes.cast(ctypes.c_void_p(_encode(_KIND_DEVICE, index)), pynvml.c_nvmlDevice_t)

    @staticmethod
    def _mig_handle(index: int, gi: dict[str, Any], ci: dict[str, Any]) -> Any:
        address = _encode(_KIND_MIG, index, gi["id"], ci["id"], ci["serial"])
        return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlDevice_t)

    @staticmethod
    def _gi_handle(index: int, gi: dict[str, Any]) -> Any:
        address = _encode(_KIND_GI, index, gi["id"], 0, gi["serial"])
        return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlGpuInstance_t)

    @staticmethod
    def _ci_handle(index: int, gi: dict[str, Any], ci: dict[str, Any]) -> Any:
        address = _encode(_KIND_CI, index, gi["id"], ci["id"], ci["serial"])
        return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlComputeInstance_t)

    # --- simulator extensions (not in pynvml) -----------------------------------------------
    def sim_reset_gpu(self, index: int) -> None:
        """Reset GPU ``index`` as ``nvidia-smi -r`` does (NVML itself has no reset call).

        Applies the pending MIG mode and wipes instances; IN_USE while processes run.
        """
        now = self.clock()
        self._mutate(lambda s: ops.reset_gpu(s, index, now))

    # --- init and system --------------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: int) -> None:
        """Initialise: seed the state directory from the preset when it is empty."""
        try:
            self.store.ensure(self.preset)
        except (SimStateError, KeyError):
            raise _err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED) from None
        with self._lock:
            self._init_count += 1

    def nvmlInit(self) -> None:
        """Initialise NVML (``nvmlInitWithFlags(0)``)."""
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        """Shut down; every init needs a matching shutdown, as with the real library."""
        with self._lock:
            if self._init_count <= 0:
                raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
            self._init_count -= 1

    def nvmlErrorString(self, result: int) -> str:
        """The message for an NVML return code."""
        return str(pynvml.NVMLError(result))

    def nvmlSystemGetDriverVersion(self) -> str:
        """The kernel driver version, e.g. ``"570.124.06"``."""
        return str(self._state()["driver_version"])

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        """CUDA version supported by the driver, as 1000*major + 10*minor (12080)."""
        return int(self._state()["cuda_driver_version"])

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        """Same as ``nvmlSystemGetCudaDriverVersion``."""
        return self.nvmlSystemGetCudaDriverVersion()

    def nvmlSystemGetNVMLVersion(self) -> str:
        """NVML library version: "12." plus the driver version."""
        return f"12.{self._state()['driver_version']}"

    # --- device handles ---------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        """Number of GPUs (lost ones included, as the driver still enumerates them)."""
        return len(self._state()["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        """Handle of GPU ``index``. INVALID_ARGUMENT out of range; GPU_IS_LOST when lost."""
        state = self._state()
        if not isinstance(index, int) or index < 0:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._live_gpu(state, index)
        return self._device_handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        """Handle of a GPU or MIG device by UUID. NOT_FOUND when no device has it."""
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        state = self._state()
        for gpu in state["gpus"]:
            if gpu["uuid"] == text:
                self._live_gpu(state, gpu["index"])
                return self._device_handle(gpu["index"])
            for gi, ci in ops.mig_devices(gpu):
                if ci["uuid"] == text:
                    self._live_gpu(state, gpu["index"])
                    return self._mig_handle(gpu["index"], gi, ci)
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> Any:
        """Handle of the GPU at a PCI bus id ("00000000:18:00.0" or "0000:18:00.0")."""
        text = (pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId).upper()
        bus_part = text.split(":")[-2] if text.count(":") >= 1 else ""
        state = self._state()
        for gpu in state["gpus"]:
            if presets.bus_id(gpu["bus"]) == text or (
                bus_part and int(bus_part, 16) == gpu["bus"] and text.endswith("00.0")
            ):
                self._live_gpu(state, gpu["index"])
                return self._device_handle(gpu["index"])
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        """NVML index of a GPU."""
        _, gpu = self._gpu(handle)
        return int(gpu["index"])

    # --- static facts -----------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: Any) -> str:
        """Product name; a MIG device reports "<GPU name> MIG <profile>"."""
        state, gpu, mig = self._any_device(handle)
        model = ops.gpu_model(gpu)
        if mig is None:
            return model.name
        gi, ci = mig
        gip = ops.gi_profile_of(gpu, gi)
        cip = models.ci_profile(gip, ci["profile_id"])
        assert cip is not None
        gi_name, _ = model.reported(gip, str(state["driver_version"]))
        return f"{model.name} MIG {models.ci_name(gip, cip, gi_name)}"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        """``GPU-...`` UUID, or ``MIG-...`` for a MIG device."""
        _, gpu, mig = self._any_device(handle)
        return str(gpu["uuid"] if mig is None else mig[1]["uuid"])

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        """Board serial number."""
        _, gpu = self._gpu(handle)
        return str(gpu["serial"])

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        """The /dev/nvidiaN minor number."""
        _, gpu = self._gpu(handle)
        return int(gpu["minor"])

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        """VBIOS version string."""
        _, gpu = self._gpu(handle)
        return ops.gpu_model(gpu).vbios

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        """PCI identity as ``nvmlPciInfo_t`` (bus ids are bytes, as ctypes gives them)."""
        _, gpu = self._gpu(handle)
        return self._pci_info(gpu)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        """Same as ``nvmlDeviceGetPciInfo_v3``."""
        return self.nvmlDeviceGetPciInfo_v3(handle)

    @staticmethod
    def _pci_info(gpu: dict[str, Any]) -> Any:
        model = ops.gpu_model(gpu)
        bus_text = presets.bus_id(gpu["bus"]).encode()
        info = pynvml.nvmlPciInfo_t()
        info.busIdLegacy = bus_text[-12:]  # the legacy field holds "0000:18:00.0"
        info.domain = 0
        info.bus = gpu["bus"]
        info.device = 0
        info.pciDeviceId = model.pci_device_id
        info.pciSubSystemId = model.pci_subsystem_id
        info.busId = bus_text
        return info

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        """NUMA node the GPU is attached to."""
        _, gpu = self._gpu(handle)
        return int(gpu["numa"])

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        """(major, minor) compute capability."""
        _, gpu, _ = self._any_device(handle)
        return ops.gpu_model(gpu).compute_capability

    def _memory_mib(self, handle: Any) -> tuple[int, int, int]:
        """(total, reserved, used) MiB of a GPU or MIG device; used excludes reserved."""
        state, gpu, mig = self._any_device(handle)
        return ops.device_memory_mib(state, gpu["index"], None if mig is None else mig[0])

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        """Framebuffer memory in bytes; a MIG device reports its GPU instance's share.

        v1 (no ``version``) counts the memory the driver and firmware reserve as used, as the
        old API does; v2 (``version=nvmlMemory_v2``) reports it apart in ``reserved``, and
        ``used`` is what processes allocated. ``free`` is the same in both. Drivers before R510
        have no v2 (FUNCTION_NOT_FOUND).
        """
        if version and version != pynvml.nvmlMemory_v2:
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if version and driver_branch(str(self._state()["driver_version"])) < _MEMORY_V2_BRANCH:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # no _v2 entry point in the library
        total_mib, reserved_mib, used_mib = self._memory_mib(handle)
        total = total_mib * models.MIB
        reserved = min(total, reserved_mib * models.MIB)
        used = min(total - reserved, used_mib * models.MIB)
        if version:
            memory_v2 = pynvml.c_nvmlMemory_v2_t()
            memory_v2.version = version
            memory_v2.total, memory_v2.reserved = total, reserved
            memory_v2.used, memory_v2.free = used, total - reserved - used
            return memory_v2
        memory = pynvml.c_nvmlMemory_t()
        memory.total, memory.used = total, reserved + used
        memory.free = total - reserved - used
        return memory

    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any) -> Any:
        """``nvmlDeviceGetMemoryInfo`` with the v2 struct (reserved memory apart)."""
        return self.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)

    def nvmlDeviceGetBAR1MemoryInfo(self, handle: Any) -> Any:
        """BAR1 aperture total/free/used in bytes (``c_nvmlBAR1Memory_t``).

        A MIG device gets half the GPU's aperture less 1 MiB (inferred from one A100 output:
        its 2g.10gb devices showed 32767 MiB); 1 MiB of it is in use, as idle outputs show.
        """
        _, gpu, mig = self._any_device(handle)
        total_mib = ops.gpu_model(gpu).bar1_mib
        if not total_mib:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if mig is not None:
            total_mib = total_mib // 2 - 1
        info = pynvml.c_nvmlBAR1Memory_t()
        info.bar1Total = total_mib * models.MIB
        info.bar1Used = models.MIB
        info.bar1Free = info.bar1Total - info.bar1Used
        return info

    # --- modes ------------------------------------------------------------------------------
    nvmlDeviceGetPersistenceMode = _fixed_gpu_reading(
        int(pynvml.NVML_FEATURE_ENABLED),
        "Enabled: datacenter nodes run nvidia-persistenced (inferred, as on DGX systems).",
    )
    nvmlDeviceGetComputeMode = _fixed_gpu_reading(
        int(pynvml.NVML_COMPUTEMODE_DEFAULT),
        "NVML_COMPUTEMODE_DEFAULT (the simulator has no compute-mode setting).",
    )
    nvmlDeviceGetPerformanceState = _fixed_gpu_reading(
        0, "P0, as busy and idle datacenter GPUs with persistence mode report (nvidia-smi -q)."
    )
    nvmlDeviceGetDisplayMode = _fixed_gpu_reading(
        int(pynvml.NVML_FEATURE_DISABLED), "Disabled: no display is attached to a datacenter GPU."
    )
    nvmlDeviceGetDisplayActive = _fixed_gpu_reading(
        int(pynvml.NVML_FEATURE_DISABLED), "Disabled: no display is attached to a datacenter GPU."
    )

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        """[current, pending] ECC mode: enabled, as datacenter parts ship."""
        self._gpu(handle)
        return [int(pynvml.NVML_FEATURE_ENABLED), int(pynvml.NVML_FEATURE_ENABLED)]

    # --- telemetry --------------------------------------------------------------------------
    def _procs(self, state: State, gpu: dict[str, Any]) -> list[dict[str, Any]]:
        """The processes on ``gpu`` (read-only), indexed once per state the store read.

        A sampling pass asks for them about ten times per GPU; a state read is never changed in
        place (writes make a new one), so its identity keys the index.
        """
        cached = self._processes_by_gpu
        if cached is None or cached[0] is not state:
            by_gpu: dict[int, list[dict[str, Any]]] = {}
            for proc in state["processes"]:
                by_gpu.setdefault(proc["gpu"], []).append(proc)
            cached = self._processes_by_gpu = (state, by_gpu)
        return cached[1].get(gpu["index"], [])

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        """GPU and memory utilization in percent; NOT_SUPPORTED while MIG is enabled."""
        state, gpu = self._gpu(handle)
        if gpu["mig"]["current"]:
            # With MIG on, the GPU-wide counters are not kept (nvidia-smi shows N/A).
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = telemetry.utilization(gpu, self._procs(state, gpu), self.clock())
        return util

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        """GPU temperature in Celsius (sensor NVML_TEMPERATURE_GPU)."""
        state, gpu = self._gpu(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return telemetry.temperature_c(gpu, self._procs(state, gpu), self.clock())

    def nvmlDeviceGetTemperatureV(
        self, handle: Any, sensor: int, version: int = pynvml.nvmlTemperature_v1
    ) -> int:
        """``nvmlDeviceGetTemperature`` through the versioned struct (R550 and newer)."""
        if version != pynvml.nvmlTemperature_v1:
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return self.nvmlDeviceGetTemperature(handle, sensor)

    def nvmlDeviceGetTemperatureV1(self, handle: Any, sensor: int) -> int:
        """Same as ``nvmlDeviceGetTemperatureV`` with version 1."""
        return self.nvmlDeviceGetTemperatureV(handle, sensor)

    def _engine_utilization(self, handle: Any) -> list[int]:
        _, gpu = self._gpu(handle)
        if gpu["mig"]["current"]:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        # No simulated process uses the media engines: 0 %, over the sampling period NVML
        # reports for them (inferred: 167 ms, a value seen on datacenter parts).
        return [0, ENGINE_SAMPLING_PERIOD_US]

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        """[utilization %, sampling period us]; 0 (supported on H100 and the other parts)."""
        return self._engine_utilization(handle)

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        """[utilization %, sampling period us]; 0 %."""
        return self._engine_utilization(handle)

    def nvmlDeviceGetJpgUtilization(self, handle: Any) -> list[int]:
        """[utilization %, sampling period us]; 0 %."""
        return self._engine_utilization(handle)

    def nvmlDeviceGetOfaUtilization(self, handle: Any) -> list[int]:
        """[utilization %, sampling period us]; 0 %."""
        return self._engine_utilization(handle)

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        """Slowdown / shutdown / GPU max thresholds in Celsius."""
        _, gpu = self._gpu(handle)
        model = ops.gpu_model(gpu)
        values = {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: model.shutdown_c,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: model.slowdown_c,
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: model.gpu_max_c,
        }
        if threshold not in values:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return values[threshold]

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """Power draw in milliwatts."""
        state, gpu = self._gpu(handle)
        return int(telemetry.power_w(gpu, self._procs(state, gpu), self.clock()) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        """Enforced power limit in milliwatts."""
        _, gpu = self._gpu(handle)
        return ops.gpu_model(gpu).power_limit_w * 1000

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        """Power management limit in milliwatts."""
        return self.nvmlDeviceGetEnforcedPowerLimit(handle)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        """Energy since driver load in millijoules (monotonic)."""
        state, gpu = self._gpu(handle)
        return telemetry.energy_mj(gpu, self._procs(state, gpu), self.clock())

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        """Current clock in MHz (graphics/SM, memory, video)."""
        state, gpu = self._gpu(handle)
        sm, mem = telemetry.clocks_mhz(gpu, self._procs(state, gpu), self.clock())
        return self._pick_clock(type, sm, mem)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        """Maximum clock in MHz."""
        _, gpu = self._gpu(handle)
        model = ops.gpu_model(gpu)
        return self._pick_clock(type, model.max_sm_clock_mhz, model.max_mem_clock_mhz)

    @staticmethod
    def _pick_clock(clock_type: int, sm: int, mem: int) -> int:
        if clock_type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            return sm
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return mem
        if clock_type == pynvml.NVML_CLOCK_VIDEO:
            return sm * 3 // 4
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        """Clock-event reason bitmask (idle, HW thermal slowdown, ...)."""
        state, gpu = self._gpu(handle)
        return telemetry.clock_event_reasons(gpu, self._procs(state, gpu))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        """The older name of ``nvmlDeviceGetCurrentClocksEventReasons``."""
        return self.nvmlDeviceGetCurrentClocksEventReasons(handle)

    # --- health counters --------------------------------------------------------------------
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        """ECC error count: corrected (single-bit) or uncorrected, volatile or aggregate."""
        _, gpu = self._gpu(handle)
        key = {
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): "sbe_vol",
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): "sbe_agg",
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): "dbe_vol",
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): "dbe_agg",
        }.get((errorType, counterType))
        if key is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(gpu["ecc"][key])

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        """(correctable, uncorrectable, pending, failure); NOT_SUPPORTED before Ampere."""
        _, gpu = self._gpu(device)
        if not ops.gpu_model(gpu).row_remapping:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        remap = gpu["remap"]
        return (int(remap["corr"]), int(remap["unc"]), int(remap["pending"]),
                int(remap["failure"]))  # fmt: skip

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        """Retired page addresses; NOT_SUPPORTED on GPUs that remap rows instead."""
        _, gpu = self._gpu(device)
        if ops.gpu_model(gpu).row_remapping:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if sourceFilter == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
            return [int(p) for p in gpu["retired"]["sbe"]]
        if sourceFilter == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
            return [int(p) for p in gpu["retired"]["dbe"]]
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetRetiredPages_v2(self, device: Any, sourceFilter: int) -> list[tuple[int, int]]:
        """Retired pages as (address, timestamp) pairs."""
        return [(page, 0) for page in self.nvmlDeviceGetRetiredPages(device, sourceFilter)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        """1 when a retired page waits for a reboot/reset."""
        _, gpu = self._gpu(device)
        if ops.gpu_model(gpu).row_remapping:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(gpu["retired"]["pending"])

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        """PCIe replay count."""
        _, gpu = self._gpu(handle)
        return int(gpu["pcie_replay"])

    # --- NVLink and topology ----------------------------------------------------------------
    def _link(self, device: Any, link: int) -> tuple[State, dict[str, Any], dict[str, Any]]:
        state, gpu = self._gpu(device)
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if link >= len(gpu["nvlinks"]):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return state, gpu, gpu["nvlinks"][link]

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        """1 when the link is active (NVML_FEATURE_ENABLED), else 0."""
        _, gpu, _ = self._link(device, link)
        down = link in gpu["faults"]["nvlink_down"]
        return int(pynvml.NVML_FEATURE_DISABLED if down else pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:
        """Data-link error counters (replay, recovery, CRC flit; CRC data and ECC stay 0).

        ``nvlink-errors`` grows a link's counters; ``nvlink-down`` books its one error on link
        0's replay counter.
        """
        _, gpu, _ = self._link(device, link)
        if not 0 <= counter < pynvml.NVML_NVLINK_ERROR_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        counters = ops.nvlink_counters(gpu, link)
        value = {
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY: counters["replay"],
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: counters["recovery"],
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: counters["crc_flit"],
        }.get(counter, 0)
        if counter == pynvml.NVML_NVLINK_ERROR_DL_REPLAY and link == 0:
            value += int(gpu["nvlink_errors"])
        return int(value)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        """PCI info of the link's far end: the peer GPU, or an NVSwitch."""
        state, _, remote = self._link(device, link)
        if "gpu" in remote:
            return self._pci_info(state["gpus"][remote["gpu"]])
        info = pynvml.nvmlPciInfo_t()
        bus = 0xC0 + int(remote["switch"])  # NVSwitch chips on their own buses
        text = f"00000000:{bus:02X}:00.0".encode()
        info.busIdLegacy, info.busId, info.bus = text[-12:], text, bus
        info.pciDeviceId = 0x1AF110DE  # NVSwitch
        return info

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        """NVML_NVLINK_DEVICE_TYPE_GPU or _SWITCH."""
        _, _, remote = self._link(handle, link)
        if "gpu" in remote:
            return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        """PCIe topology level between two GPUs (NVML_TOPOLOGY_*); NVLink is not part of it."""
        state, gpu1 = self._gpu(device1)
        _, gpu2 = self._gpu(device2)
        preset = presets.PRESETS.get(state["preset"])
        if preset is None:
            return int(pynvml.NVML_TOPOLOGY_SYSTEM)
        return presets.pair_level(preset, gpu1["index"], gpu2["index"])

    def _nvlink_count(self, gpu1: dict[str, Any], gpu2: dict[str, Any]) -> int:
        if gpu1["index"] == gpu2["index"]:
            return 0
        down = set(gpu1["faults"]["nvlink_down"])
        active = [link for i, link in enumerate(gpu1["nvlinks"]) if i not in down]
        to_peer = sum(1 for link in active if link.get("gpu") == gpu2["index"])
        if to_peer:
            return to_peer
        via_switch = sum(1 for link in active if "switch" in link)
        peer_switch = sum(
            1
            for i, link in enumerate(gpu2["nvlinks"])
            if "switch" in link and i not in set(gpu2["faults"]["nvlink_down"])
        )
        return min(via_switch, peer_switch)

    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, p2pIndex: int) -> int:
        """P2P capability; NVLink P2P is OK when the GPUs share an active NVLink path."""
        _, gpu1 = self._gpu(device1)
        _, gpu2 = self._gpu(device2)
        if p2pIndex == pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
            ok = self._nvlink_count(gpu1, gpu2) > 0
            return int(pynvml.NVML_P2P_STATUS_OK if ok else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)
        return int(pynvml.NVML_P2P_STATUS_OK)

    # --- processes --------------------------------------------------------------------------
    def _process_infos(self, handle: Any, *, mps_only: bool) -> list[Any]:
        state, gpu, mig = self._any_device(handle)
        procs = self._procs(state, gpu)
        if mig is not None:
            gi, ci = mig
            procs = [p for p in procs if p["gi"] == gi["id"] and p["ci"] == ci["id"]]
        if mps_only:
            procs = [p for p in procs if p.get("mps")]
        # The friendly objects pynvml makes of the driver's nvmlProcessInfo_v3_t array (its
        # fields, in its order), built directly rather than through a ctypes struct.
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": proc["pid"],
                    "usedGpuMemory": proc["mem_mib"] * models.MIB,
                    "gpuInstanceId": ops.NO_ID if proc["gi"] is None else proc["gi"],
                    "computeInstanceId": ops.NO_ID if proc["ci"] is None else proc["ci"],
                }
            )
            for proc in procs
        ]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        """Compute processes as pynvml friendly objects (pid, usedGpuMemory, GI/CI IDs).

        MPS clients are listed here too, as the driver lists them (nvidia-smi's type "M+C").
        """
        return self._process_infos(handle, mps_only=False)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """Same as ``nvmlDeviceGetComputeRunningProcesses_v3``."""
        return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        """Same as ``nvmlDeviceGetComputeRunningProcesses_v3`` (the v2 struct has its fields)."""
        return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any) -> list[Any]:
        """Graphics processes: none. The call is supported (H100 answers an empty list)."""
        self._any_device(handle)
        return []

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        """Same as ``nvmlDeviceGetGraphicsRunningProcesses_v3``."""
        return self.nvmlDeviceGetGraphicsRunningProcesses_v3(handle)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any) -> list[Any]:
        """Same as ``nvmlDeviceGetGraphicsRunningProcesses_v3``."""
        return self.nvmlDeviceGetGraphicsRunningProcesses_v3(handle)

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        """The MPS clients among the compute processes (``sim process add --mps``)."""
        return self._process_infos(handle, mps_only=True)

    # --- per-process utilization --------------------------------------------------------------
    def _process_samples(self, handle: Any, last_seen_us: int) -> tuple[int, dict[int, Any]]:
        """(sample timestamp in us, {pid: (SM %, memory %)}) newer than ``last_seen_us``.

        The driver keeps per-process samples only for a whole GPU: a MIG device handle, or a GPU
        with MIG on, answers NOT_SUPPORTED (nvidia-smi pmon: "not supported"). NOT_FOUND when no
        process ran since ``last_seen_us``, as the driver says it.
        """
        state, gpu, mig = self._any_device(handle)
        if mig is not None or gpu["mig"]["current"]:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now = self.clock()
        # The driver samples on its own period; a sample's timestamp is when it was taken.
        stamp = int(now * 1e6) // ENGINE_SAMPLING_PERIOD_US * ENGINE_SAMPLING_PERIOD_US
        busy = telemetry.process_utilization(gpu, self._procs(state, gpu), now)
        if stamp <= int(last_seen_us) or not busy:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return stamp, busy

    def _process_sample_structs(self, handle: Any, since_us: int, struct: Any) -> list[Any]:
        """The samples newer than ``since_us`` as ``struct`` instances, by PID."""
        stamp, busy = self._process_samples(handle, since_us)
        out = []
        for pid, (sm, mem) in sorted(busy.items()):
            sample = struct()
            sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil = pid, stamp, sm, mem
            out.append(sample)
        return out

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        """Per-process SM and memory utilization samples newer than ``timeStamp`` (us)."""
        return self._process_sample_structs(
            handle, timeStamp, pynvml.c_nvmlProcessUtilizationSample_t
        )

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, timeStamp: int) -> list[Any]:
        """The same samples through the versioned struct of R550 and newer."""
        return self._process_sample_structs(
            handle, timeStamp, pynvml.c_nvmlProcessUtilizationInfo_v1_t
        )

    def nvmlSystemGetProcessName(self, pid: int) -> bytes:
        """The command name of a process on a GPU (bytes, as pynvml returns it)."""
        return ops.process_name(self._state(), int(pid)).encode()

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """Same as ``nvmlDeviceGetMPSComputeRunningProcesses_v3``."""
        return self.nvmlDeviceGetMPSComputeRunningProcesses_v3(handle)

    def nvmlDeviceGetMPSComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        """Same as ``nvmlDeviceGetMPSComputeRunningProcesses_v3``."""
        return self.nvmlDeviceGetMPSComputeRunningProcesses_v3(handle)

    # --- field values -----------------------------------------------------------------------
    def _field(self, handle: Any, field_id: int) -> tuple[int, int | float]:
        """(NVML value type, value) of one field; NVMLError(code) when it is not available."""
        if field_id == pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
            return FIELD_ULL, self.nvmlDeviceGetTotalEnergyConsumption(handle)
        if field_id == pynvml.NVML_FI_DEV_POWER_INSTANT:
            return FIELD_UINT, self.nvmlDeviceGetPowerUsage(handle)
        if field_id == pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
            return FIELD_ULL, self.nvmlDeviceGetPcieReplayCounter(handle)
        _, gpu = self._gpu(handle)
        links = len(gpu["nvlinks"])
        if field_id == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
            return FIELD_UINT, links
        if field_id in NVLINK_THROUGHPUT_FIELDS and links:
            return FIELD_ULL, 0  # no simulated traffic crosses NVLink
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def fill_field_values(self, handle: Any, values: list[Any]) -> None:
        """Answer each ``c_nvmlFieldValue_t`` in place: value and type, or its own error code.

        As in NVML the call itself succeeds when the handle is good; a field the simulator does
        not model gets NOT_SUPPORTED in its ``nvmlReturn``.
        """
        self._any_device(handle)
        stamp = int(self.clock() * 1_000_000)
        for slot in values:
            slot.timestamp, slot.latencyUsec = stamp, 0
            try:
                kind, value = self._field(handle, int(slot.fieldId))
            except pynvml.NVMLError as exc:
                slot.nvmlReturn = int(exc.value)
                continue
            slot.nvmlReturn = int(pynvml.NVML_SUCCESS)
            slot.valueType = kind
            if kind == FIELD_ULL:
                slot.value.ullVal = int(value)
            else:
                slot.value.uiVal = int(value)

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:
        """A ``c_nvmlFieldValue_t`` array for ``fieldIds`` (ids, or (id, scope) pairs)."""
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for slot, field in zip(values, fieldIds, strict=True):
            if isinstance(field, tuple):
                slot.fieldId, slot.scopeId = field
            else:
                slot.fieldId = field
        self.fill_field_values(handle, list(values))
        return values

    # --- GPM (GPU Performance Monitoring) -------------------------------------------------------
    def _require_gpm_driver(self) -> None:
        """FUNCTION_NOT_FOUND before R520, as pynvml raises it for a symbol the driver lacks."""
        if driver_branch(str(self._state()["driver_version"])) < gpm.GPM_MIN_DRIVER_BRANCH:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        """``c_nvmlGpmSupport_t``: ``isSupportedDevice`` 1 on Hopper and later, else 0."""
        self._require_gpm_driver()
        _, gpu = self._gpu(device)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpm.supported(gpu))
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        """A new, empty sample buffer (a ``c_nvmlGpmSample_t`` the caller must free)."""
        self._require_gpm_driver()
        with self._lock:
            serial = self._next_gpm_sample
            self._next_gpm_sample = serial % _SERIAL_MASK + 1
            address = _encode(_KIND_GPM_SAMPLE, serial=serial)
            self._gpm_samples[address] = None
        return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlGpmSample_t)

    def _gpm_address(self, sample: Any) -> int:
        """The address of an allocated sample buffer; INVALID_ARGUMENT for anything else."""
        address = _address(sample)
        if address is None or address not in self._gpm_samples:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return address

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        """Release a sample buffer."""
        with self._lock:
            del self._gpm_samples[self._gpm_address(gpmSample)]

    def _store_gpm_sample(self, gpmSample: Any, sample: gpm.Sample) -> Any:
        with self._lock:
            self._gpm_samples[self._gpm_address(gpmSample)] = sample
        return gpmSample

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        """Take a sample of the whole GPU; NOT_SUPPORTED before Hopper."""
        self._require_gpm_driver()
        state, gpu = self._gpu(device)
        if not gpm.supported(gpu):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now = self.clock()
        activity = gpm.gpu_activity(gpu, self._procs(state, gpu), now)
        return self._store_gpm_sample(gpmSample, gpm.Sample(gpu["index"], None, now, activity))

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        """Take a sample of GPU instance ``gpuInstanceId`` of the GPU ``device``."""
        self._require_gpm_driver()
        state, gpu = self._gpu(device)
        if not gpm.supported(gpu):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        ops.require_mig_enabled(gpu)
        gi = ops.find_gi(gpu, int(gpuInstanceId))
        if gi is None:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        now = self.clock()
        activity = gpm.instance_activity(gpu, gi, self._procs(state, gpu), now)
        sample = gpm.Sample(gpu["index"], gi["id"], now, activity)
        return self._store_gpm_sample(gpmSample, sample)

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        """Fill ``metrics[:numMetrics]`` of a ``c_nvmlGpmMetricsGet_t`` from its two samples.

        As in NVML, each metric carries its own ``nvmlReturn``: NOT_SUPPORTED for one the
        device does not count (PCIe and NVLink of a MIG instance) or the simulator does not
        model. The call itself fails for a wrong struct version, an untaken sample, or two
        samples of different devices. ``metricInfo`` (names, unit) is left empty.
        """
        self._require_gpm_driver()
        if int(metricsGet.version) != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        count = int(metricsGet.numMetrics)
        if not 0 <= count <= len(metricsGet.metrics):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            first = self._gpm_samples[self._gpm_address(metricsGet.sample1)]
            second = self._gpm_samples[self._gpm_address(metricsGet.sample2)]
        if first is None or second is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if (first.gpu, first.gpu_instance) != (second.gpu, second.gpu_instance):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for slot in metricsGet.metrics[:count]:
            metric_id = int(slot.metricId)
            value = (
                gpm.metric(metric_id, first.activity, second.activity)
                if metric_id in gpm.MODELLED_METRICS
                else None
            )
            if value is None:
                slot.nvmlReturn, slot.value = int(pynvml.NVML_ERROR_NOT_SUPPORTED), 0.0
            else:
                slot.nvmlReturn, slot.value = int(pynvml.NVML_SUCCESS), value
        return metricsGet

    # --- events -----------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        """A new event set; it sees events queued after this call."""
        state = self._state()
        with self._lock:
            set_id = self._next_event_set
            self._next_event_set += 1
            self._event_sets[set_id] = {
                "devices": {},
                "last_seq": int(state["event_seq"]),
                # Armed now, so no event written after this call can slip past a wait.
                "waiter": ChangeWaiter(self.store.state_dir),
            }
        address = _encode(_KIND_EVENTSET, serial=set_id)
        return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlEventSet_t)

    def _event_set(self, event_set: Any) -> dict[str, Any]:
        _, _, _, _, set_id = self._decode(event_set, _KIND_EVENTSET)
        found = self._event_sets.get(set_id)
        if found is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        """Bitmask of event types the GPU can report."""
        self._gpu(handle)
        return int(SUPPORTED_EVENTS)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        """Add a GPU's events of ``eventTypes`` to an event set."""
        _, gpu = self._gpu(handle)
        if eventTypes & ~SUPPORTED_EVENTS:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        registered = self._event_set(eventSet)
        devices: dict[int, int] = registered["devices"]
        devices[gpu["index"]] = devices.get(gpu["index"], 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        """Wait for the next registered event; NVMLError(TIMEOUT) when none arrives in time."""
        registered = self._event_set(eventSet)
        waiter: ChangeWaiter = registered["waiter"]
        deadline = time.monotonic() + max(0, timeoutms) / 1000.0
        while True:
            waiter.drain()  # before the check: a write after it wakes the wait below
            state = self._state(fresh=True)  # a wake-up means the file changed: look now
            found = self._next_event(state, registered)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _err(pynvml.NVML_ERROR_TIMEOUT)
            # Sleeps until the state file changes, as the real call sleeps in the driver.
            waiter.wait(remaining)

    def _next_event(self, state: State, registered: dict[str, Any]) -> Any:
        devices: dict[int, int] = registered["devices"]
        with self._lock:
            for event in state["events"]:
                if event["seq"] <= registered["last_seq"]:
                    continue
                registered["last_seq"] = event["seq"]
                mask = devices.get(event["gpu"], 0)
                if not mask & event["type"]:
                    continue
                data = pynvml.c_nvmlEventData_t()
                data.device = self._device_handle(event["gpu"])
                data.eventType = event["type"]
                data.eventData = event["data"]
                data.gpuInstanceId = event["gi"]
                data.computeInstanceId = event["ci"]
                return data
            # Events dropped from the bounded queue are skipped, never replayed.
            registered["last_seq"] = max(registered["last_seq"], int(state["event_seq"]))
        return None

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        """Same as ``nvmlEventSetWait_v2``."""
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        """Release an event set."""
        _, _, _, _, set_id = self._decode(eventSet, _KIND_EVENTSET)
        with self._lock:
            registered = self._event_sets.pop(set_id, None)
            if registered is None:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            registered["waiter"].close()

    # --- MIG mode ---------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        """[current, pending]; NOT_SUPPORTED on GPUs without MIG."""
        _, gpu = self._gpu(device)
        ops.require_mig_capable(gpu)
        return [int(gpu["mig"]["current"]), int(gpu["mig"]["pending"])]

    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        """Set the pending mode; returns the activation status (IN_USE while processes run).

        The mode becomes current at the next GPU reset (``sim_reset_gpu`` / ``nodeagent sim``).
        """
        _, gpu = self._gpu(device)
        index = gpu["index"]
        now = self.clock()
        return int(self._mutate(lambda s: ops.set_mig_mode(s, index, mode, now)))

    # --- GPU-instance profiles --------------------------------------------------------------
    @staticmethod
    def _fill_gi_info(info: Any, profile: models.GiProfile, name: str, memory_mib: int) -> Any:
        info.id = profile.profile_id
        info.isP2pSupported = 0
        info.sliceCount = profile.compute_slices
        info.instanceCount = profile.max_count
        info.multiprocessorCount = profile.multiprocessors
        info.copyEngineCount = profile.copy_engines
        info.decoderCount = profile.decoders
        info.encoderCount = profile.encoders
        info.jpegCount = profile.jpeg
        info.ofaCount = profile.ofa
        info.memorySizeMB = memory_mib
        if hasattr(info, "name"):
            info.name = f"MIG {name}".encode()
        return info

    def _gi_info(
        self, state: State, gpu: dict[str, Any], profile: models.GiProfile, v2: bool
    ) -> Any:
        if ops.semantics(state)["profile_info_needs_mig"] and not gpu["mig"]["current"]:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        name, memory = ops.gpu_model(gpu).reported(profile, str(state["driver_version"]))
        struct = (
            pynvml.c_nvmlGpuInstanceProfileInfo_v2_t
            if v2
            else pynvml.c_nvmlGpuInstanceProfileInfo_t
        )
        info = struct()
        if v2:
            info.version = pynvml.nvmlGpuInstanceProfileInfo_v2
        return self._fill_gi_info(info, profile, name, memory)

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        """Profile info by ``NVML_GPU_INSTANCE_PROFILE_*`` index constant.

        INVALID_ARGUMENT past the last constant, NOT_SUPPORTED for a profile the GPU lacks (and
        on GPUs without MIG). Works whatever the current MIG mode unless the node has the
        ``profile_info_needs_mig`` semantics, which answers NOT_SUPPORTED while MIG is off.
        """
        state, gpu = self._gpu(device)
        model = ops.require_mig_capable(gpu)
        if version not in (1, 2):
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = model.profile_by_index(profile)
        if found is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._gi_info(state, gpu, found, version == 2)

    def nvmlDeviceGetGpuInstanceProfileInfoV(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        """Alias of ``nvmlDeviceGetGpuInstanceProfileInfo`` (as in pynvml)."""
        return self.nvmlDeviceGetGpuInstanceProfileInfo(device, profile, version)

    def _profile_by_id(self, gpu: dict[str, Any], profile_id: int) -> models.GiProfile:
        found = ops.require_mig_capable(gpu).profile_by_id(profile_id)
        if found is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, device: Any, profileId: int) -> Any:
        """Profile info (v2 struct) by profile ID."""
        state, gpu = self._gpu(device)
        found = self._profile_by_id(gpu, profileId)
        return self._gi_info(state, gpu, found, True)

    def nvmlDeviceGetGpuInstanceProfileInfoByIdV(self, device: Any, profileId: int) -> Any:
        """Alias of ``nvmlDeviceGetGpuInstanceProfileInfoById``."""
        return self.nvmlDeviceGetGpuInstanceProfileInfoById(device, profileId)

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        """How many more instances of the profile can be created now."""
        _, gpu = self._gpu(device)
        ops.require_mig_enabled(gpu)
        return ops.remaining_capacity(gpu, self._profile_by_id(gpu, profileId))

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        """Every legal placement of the profile, free or not.

        ``placementsRef`` is a caller-allocated ``c_nvmlGpuInstancePlacement_t`` array, or None
        to ask only for the count; INSUFFICIENT_SIZE (count set) when the array is too small.
        """
        _, gpu = self._gpu(device)
        found = self._profile_by_id(gpu, profileId)
        return self._fill_placements(
            found.placements, pynvml.c_nvmlGpuInstancePlacement_t, placementsRef, countRef
        )

    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        """Alias of ``nvmlDeviceGetGpuInstancePossiblePlacements``."""
        return self.nvmlDeviceGetGpuInstancePossiblePlacements(
            device, profileId, placementsRef, countRef
        )

    @staticmethod
    def _fill_placements(
        placements: tuple[tuple[int, int], ...], struct: Any, array_ref: Any, count_ref: Any
    ) -> int:
        items = [struct(start, size) for start, size in placements]
        return _fill_array(array_ref, count_ref, items)

    # --- GPU instances ----------------------------------------------------------------------
    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:
        """Create a GI where the placement heuristic puts it (see :mod:`nodeagent.sim.ops`)."""
        _, gpu = self._gpu(device)
        index = gpu["index"]

        def change(state: State) -> Any:
            self._check_live(state, index)
            return ops.create_gpu_instance(state, index, profileId, None)

        return self._gi_handle(index, self._mutate(change))

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any
    ) -> Any:
        """Create a GI at an explicit ``c_nvmlGpuInstancePlacement_t`` (or a byref of one)."""
        _, gpu = self._gpu(device)
        index = gpu["index"]
        target = _deref(placement)
        if not hasattr(target, "start") or not hasattr(target, "size"):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        start, size = int(target.start), int(target.size)

        def change(state: State) -> Any:
            self._check_live(state, index)
            return ops.create_gpu_instance(state, index, profileId, start, size)

        return self._gi_handle(index, self._mutate(change))

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        """Destroy a GI; IN_USE while it has compute instances or processes."""
        _, gpu, gi = self._gi(gpuInstance)
        index, gi_id = gpu["index"], gi["id"]
        self._mutate(lambda s: ops.destroy_gpu_instance(s, index, gi_id))
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        """Fill a caller-allocated ``c_nvmlGpuInstance_t`` array with the profile's GIs."""
        _, gpu = self._gpu(device)
        ops.require_mig_enabled(gpu)
        self._profile_by_id(gpu, profileId)
        found = [
            self._gi_handle(gpu["index"], gi)
            for gi in gpu["instances"]
            if gi["profile_id"] == profileId
        ]
        return _fill_array(gpuInstancesRef, countRef, found)

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        """Handle of GI ``gpuInstanceId``; NOT_FOUND when there is none."""
        _, gpu = self._gpu(device)
        ops.require_mig_enabled(gpu)
        gi = ops.find_gi(gpu, gpuInstanceId)
        if gi is None:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return self._gi_handle(gpu["index"], gi)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        """``c_nvmlGpuInstanceInfo_t``: device, id, profileId, placement."""
        _, gpu, gi = self._gi(gpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = self._device_handle(gpu["index"])
        info.id = gi["id"]
        info.profileId = gi["profile_id"]
        info.placement = pynvml.c_nvmlGpuInstancePlacement_t(gi["start"], gi["size"])
        return info

    # --- compute instances ------------------------------------------------------------------
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        """CI profile info inside a GI, by ``NVML_COMPUTE_INSTANCE_PROFILE_*`` constant."""
        state, gpu, gi = self._gi(device)
        if version not in (1, 2):
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if not 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT or engProfile != 0:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gip = ops.gi_profile_of(gpu, gi)
        cip = models.ci_profile(gip, profile)
        if cip is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if version == 2:
            info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            info.version = pynvml.nvmlComputeInstanceProfileInfo_v2
            gi_name, _ = ops.gpu_model(gpu).reported(gip, str(state["driver_version"]))
            info.name = models.ci_name(gip, cip, gi_name).encode()
        else:
            info = pynvml.c_nvmlComputeInstanceProfileInfo_t()
        info.id = cip.profile_id
        info.sliceCount = cip.slices
        info.instanceCount = cip.max_count
        info.multiprocessorCount = models.ci_multiprocessors(gip, cip)
        info.sharedCopyEngineCount = gip.copy_engines
        info.sharedDecoderCount = gip.decoders
        info.sharedEncoderCount = gip.encoders
        info.sharedJpegCount = gip.jpeg
        info.sharedOfaCount = gip.ofa
        return info

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        """Alias of ``nvmlGpuInstanceGetComputeInstanceProfileInfo``."""
        return self.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            device, profile, engProfile, version
        )

    def _ci_profile(
        self, gpu: dict[str, Any], gi: dict[str, Any], profile_id: int
    ) -> tuple[models.GiProfile, models.CiProfile]:
        gip = ops.gi_profile_of(gpu, gi)
        cip = models.ci_profile(gip, profile_id)
        if cip is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gip, cip

    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        self, gpuInstance: Any, profileId: int
    ) -> int:
        """How many more CIs of the profile fit in the GI."""
        _, gpu, gi = self._gi(gpuInstance)
        gip, cip = self._ci_profile(gpu, gi, profileId)
        return ops.ci_remaining_capacity(gi, gip, cip)

    def nvmlGpuInstanceGetComputeInstancePossiblePlacements(
        self, gpuInstance: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        """Legal CI placements inside the GI (SM-slice units), free or not."""
        _, gpu, gi = self._gi(gpuInstance)
        _, cip = self._ci_profile(gpu, gi, profileId)
        placements = tuple((s, cip.slices) for s in cip.starts)
        return self._fill_placements(
            placements, pynvml.c_nvmlComputeInstancePlacement_t, placementsRef, countRef
        )

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        """Create a CI at the lowest free slot of its profile."""
        return self._create_ci(gpuInstance, profileId, None)

    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        self, gpuInstance: Any, profileId: int, placement: Any
    ) -> Any:
        """Create a CI at an explicit ``c_nvmlComputeInstancePlacement_t``."""
        target = _deref(placement)
        if not hasattr(target, "start") or not hasattr(target, "size"):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._create_ci(gpuInstance, profileId, (int(target.start), int(target.size)))

    def _create_ci(
        self, gpuInstance: Any, profileId: int, placement: tuple[int, int] | None
    ) -> Any:
        _, gpu, gi = self._gi(gpuInstance)
        index, gi_id = gpu["index"], gi["id"]
        if placement is not None:
            _, cip = self._ci_profile(gpu, gi, profileId)
            if placement[1] != cip.slices:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

        def change(state: State) -> tuple[dict[str, Any], dict[str, Any]]:
            self._check_live(state, index)
            start = None if placement is None else placement[0]
            ci = ops.create_compute_instance(state, index, gi_id, profileId, start)
            fresh_gi = ops.find_gi(ops.get_gpu(state, index), gi_id)
            assert fresh_gi is not None
            return fresh_gi, ci

        fresh_gi, ci = self._mutate(change)
        return self._ci_handle(index, fresh_gi, ci)

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        """Destroy a CI; IN_USE while processes run on it."""
        _, gpu, gi, ci = self._ci(computeInstance)
        index, gi_id, ci_id = gpu["index"], gi["id"], ci["id"]
        self._mutate(lambda s: ops.destroy_compute_instance(s, index, gi_id, ci_id))
        return int(pynvml.NVML_SUCCESS)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        """Fill a caller-allocated ``c_nvmlComputeInstance_t`` array with the profile's CIs."""
        _, gpu, gi = self._gi(gpuInstance)
        self._ci_profile(gpu, gi, profileId)
        found = [
            self._ci_handle(gpu["index"], gi, ci)
            for ci in gi["cis"]
            if ci["profile_id"] == profileId
        ]
        return _fill_array(computeInstancesRef, countRef, found)

    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpuInstance: Any, computeInstanceId: int
    ) -> Any:
        """Handle of CI ``computeInstanceId`` in the GI; NOT_FOUND when there is none."""
        _, gpu, gi = self._gi(gpuInstance)
        for ci in gi["cis"]:
            if ci["id"] == computeInstanceId:
                return self._ci_handle(gpu["index"], gi, ci)
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlComputeInstanceGetInfo_v2(self, computeInstance: Any) -> Any:
        """``c_nvmlComputeInstanceInfo_t``: device, GI, id, profileId, placement."""
        _, gpu, gi, ci = self._ci(computeInstance)
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.device = self._device_handle(gpu["index"])
        info.gpuInstance = self._gi_handle(gpu["index"], gi)
        info.id = ci["id"]
        info.profileId = ci["profile_id"]
        info.placement = pynvml.c_nvmlComputeInstancePlacement_t(ci["start"], ci["size"])
        return info

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        """Same as ``nvmlComputeInstanceGetInfo_v2``."""
        return self.nvmlComputeInstanceGetInfo_v2(computeInstance)

    # --- MIG devices ------------------------------------------------------------------------
    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        """A ``c_uint`` (not an int: pynvml returns the ctypes object) that is 1 for MIG handles."""
        _, _, mig = self._any_device(device)
        return ctypes.c_uint(0 if mig is None else 1)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        """GI ID of a MIG device handle; NOT_SUPPORTED for a physical GPU."""
        _, _, mig = self._any_device(device)
        if mig is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(mig[0]["id"])

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        """CI ID of a MIG device handle; NOT_SUPPORTED for a physical GPU."""
        _, _, mig = self._any_device(device)
        if mig is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(mig[1]["id"])

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        """Most MIG devices the GPU can hold (7, or 4 on A30); 0 while MIG is off.

        0 also on a GPU without MIG (nvml.h: "0 if MIG is not supported or enabled").
        """
        _, gpu = self._gpu(device)
        model = ops.gpu_model(gpu)
        return model.max_mig_devices if gpu["mig"]["current"] else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        """MIG device ``index`` (ordered by GI ID, then CI ID); NOT_FOUND past the last one."""
        _, gpu = self._gpu(device)
        ops.require_mig_enabled(gpu)
        pairs = ops.mig_devices(gpu)
        if not 0 <= index < len(pairs):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        gi, ci = pairs[index]
        return self._mig_handle(gpu["index"], gi, ci)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        """The parent GPU's handle of a MIG device handle."""
        _, gpu, mig = self._any_device(migDevice)
        if mig is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._device_handle(gpu["index"])


# Every modelled NVML call records its name (see ``_tracked``); helpers stay unwrapped.
for _name, _method in list(vars(SimNvml).items()):
    if _name.startswith("nvml") and callable(_method):
        setattr(SimNvml, _name, _tracked(_name, _method))

# NVML functions that act on one GPU (a GPU, MIG device, GPU-instance or compute-instance
# handle): the ones an ``nvml-error`` fault can make fail.
HANDLE_FUNCTIONS = frozenset(
    name
    for name in vars(SimNvml)
    if (
        name.startswith(("nvmlDevice", "nvmlGpuInstance", "nvmlComputeInstance"))
        or name in ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet")
    )
    and name != "nvmlDeviceGetCount"
)
