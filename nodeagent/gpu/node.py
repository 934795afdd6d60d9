"""The typed GPU API: the only code in nodeagent that calls NVML.

Every call goes through :meth:`GpuNode._call`, the one choke point that names the NVML function,
turns NVML errors into :mod:`nodeagent.gpu.errors` and counts them. The same code runs against the
real ``pynvml`` module and the simulator (which provides the same functions, structs and errors).
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from nodeagent.gpu import errors
from nodeagent.gpu._topology import link_kind_for_level, normalize_bus_id
from nodeagent.gpu.errors import (
    DriverNotLoaded,
    GpuError,
    GpuLost,
    InUse,
    InvalidArgument,
    NotSupported,
)
from nodeagent.gpu.types import (
    ComputeInstance,
    EccCounts,
    EventKind,
    GpuEvent,
    GpuInfo,
    GpuInstance,
    GpuState,
    Link,
    LinkKind,
    MigGeometry,
    MigProfile,
    NodeSnapshot,
    NvLinkStatus,
    Placement,
    ProcessInfo,
    RemappedRows,
    Telemetry,
)

log = logging.getLogger(__name__)

ENV_SIMULATE = "NODEAGENT_SIMULATE"
ENV_SIM_STATE = "NODEAGENT_SIM_STATE"

_MIB = 1024 * 1024
# NVML reports "not attributed" instance ids (process or event outside MIG) as (unsigned) -1.
_NOT_AVAILABLE_UINT = 0xFFFFFFFF
# Profile-index enumeration stops at INVALID_ARGUMENT; this bound only guards against a driver
# that never says so (nvml.h defines 0x12 indices today).
_MAX_PROFILE_INDEX = 64
# Number of NVLink indices probed when the module does not define NVML_NVLINK_MAX_LINKS.
_DEFAULT_MAX_NVLINKS = 18
# Answers that mean "no such link/profile here" while enumerating by index.
_NO_SUCH_ITEM = errors.ABSENT_CODES | {errors.NVML_ERROR_INVALID_ARGUMENT}
# Answers that leave a reading unknown without being a failure of the device.
_UNANSWERED = errors.ABSENT_CODES | {errors.NVML_ERROR_NO_PERMISSION}

# NVML event type bits (nvml.h nvmlEventType*) and what the agent calls them.
_EVENT_SBE = 0x1
_EVENT_DBE = 0x2
_EVENT_XID = 0x8
_EVENT_KINDS: dict[int, EventKind] = {
    _EVENT_XID: EventKind.XID,
    _EVENT_SBE: EventKind.ECC_SINGLE_BIT,
    _EVENT_DBE: EventKind.ECC_DOUBLE_BIT,
}


@dataclass(frozen=True, slots=True)
class MigModeChange:
    """Result of a MIG mode change request."""

    gpu_index: int
    current: bool
    pending: bool
    reset_required: bool  # the mode takes effect only after a GPU reset
    reason: str | None  # why the change is not active yet (processes running, say)


@dataclass(frozen=True, slots=True)
class _Static:
    """Facts of one GPU that never change while NVML is initialised (read once, cached)."""

    uuid: str
    name: str
    serial: str | None
    pci_bus_id: str
    pci_device_id: int
    numa_node: int | None
    memory_total_bytes: int
    compute_capability: tuple[int, int]
    vbios_version: str | None
    minor_number: int | None
    temperature_slowdown_celsius: float | None
    nvlinks: tuple[int, ...]  # indices of the NVLinks this GPU has (up or down)


@dataclass(frozen=True, slots=True)
class _CiProfile:
    """A compute-instance profile available inside GPU instances of one GI profile."""

    profile_id: int
    slice_count: int
    max_count: int


def _text(value: object) -> str:
    """Decode an NVML string once (pynvml gives ``bytes`` from struct fields, ``str`` elsewhere)."""
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", "replace").strip()
    return str(value).strip()


def _instance_id(value: int) -> int | None:
    """An NVML GI/CI id, or ``None`` where NVML says "not attributed" (all ones)."""
    return None if value == _NOT_AVAILABLE_UINT else int(value)


def _address(handle: Any) -> int | None:
    """The address behind an NVML handle (a ctypes pointer), to compare handles by identity."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None


def _cuda_version(raw: int) -> str:
    """NVML's CUDA driver version integer as ``major.minor`` (12080 -> "12.8")."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def _profile(
    nvml_index: int, info: Any, placements: tuple[Placement, ...], smallest_mib: int
) -> MigProfile:
    """A GPU-instance profile from NVML's profile info (v2) and its possible placements.

    NVML's ``sliceCount`` counts SM (compute) slices: 3 for a 3g profile, which occupies 4 memory
    slices. The memory-slice count is the placement size. Where NVML withheld the placements
    (no privilege) it is estimated from the profile's memory in units of the smallest profile's,
    which gives 1/2/4/8 on every table in the reference notes.
    """
    memory_mib = int(info.memorySizeMB)
    slices = placements[0].size if placements else max(1, round(memory_mib / smallest_mib))
    return MigProfile(
        name=_text(info.name).removeprefix("MIG ").strip(),
        profile_id=int(info.id),
        nvml_index=nvml_index,
        slices=slices,
        compute_slices=int(info.sliceCount),
        multiprocessors=int(info.multiprocessorCount),
        memory_bytes=memory_mib * _MIB,
        max_count=int(info.instanceCount),
        copy_engines=int(info.copyEngineCount),
        decoders=int(info.decoderCount),
        jpeg_decoders=int(info.jpegCount),
        ofa=int(info.ofaCount),
        placements=placements,
    )


def unknown_gpu_id(index: int) -> str:
    """The identifier of a GPU whose UUID could not be read (it was lost before)."""
    return f"GPU-unknown-index-{index}"


class EventWatcher:
    """An NVML event set registered for XID and ECC events on every GPU that supports them."""

    def __init__(self, node: GpuNode) -> None:
        self._node = node
        self._set: Any = node._call("nvmlEventSetCreate")
        self.registered: tuple[int, ...] = ()  # GPU indices with at least one event registered
        registered: list[int] = []
        self._uuids: dict[int, str] = {}
        wanted = _EVENT_XID | _EVENT_SBE | _EVENT_DBE
        for index in range(node.count()):
            try:
                handle = node._handle(index)
                supported = node._optional("nvmlDeviceGetSupportedEventTypes", handle, gpu=index)
                mask = wanted & int(supported or 0)
                if not mask:
                    continue
                if node._try("nvmlDeviceRegisterEvents", handle, mask, self._set, gpu=index):
                    registered.append(index)
                    # Read now: a GPU that falls off the bus can no longer say who it was.
                    self._uuids[index] = _text(node._call("nvmlDeviceGetUUID", handle, gpu=index))
            except GpuLost as exc:
                # A lost GPU sends no events; the sampler reports it as lost.
                log.warning("not watching events on GPU %d: %s", index, exc)
        self.registered = tuple(registered)
        # Events name their GPU by handle. Matching the handle's address against the handles we
        # hold needs no NVML call, so an event from a GPU that just fell off the bus (XID 79)
        # is still attributed; NVML hands out one fixed handle per device.
        self._by_address: dict[int | None, int] = {
            _address(node._handles[i]): i for i in node._handles
        }

    def wait(self, timeout_s: float) -> GpuEvent | None:
        """Block until an event arrives or the timeout passes (then ``None``)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            remaining_ms = max(int((deadline - time.monotonic()) * 1000), 0)
            # TIMEOUT is NVML's "nothing happened", an answer rather than an error.
            data, code = self._node._attempt(
                "nvmlEventSetWait",
                self._set,
                remaining_ms,
                gpu=None,
                expected=frozenset({errors.NVML_ERROR_TIMEOUT}),
            )
            if code == errors.NVML_ERROR_TIMEOUT:
                return None
            kind = _EVENT_KINDS.get(int(data.eventType))
            if kind is not None:
                return self._event(kind, data)
            # Not one of ours (a driver may deliver more than the mask asked for): keep waiting.
            if time.monotonic() >= deadline:
                return None

    def _event(self, kind: EventKind, data: Any) -> GpuEvent:
        node = self._node
        index = self._by_address.get(_address(data.device))
        if index is None:
            index = int(node._call("nvmlDeviceGetIndex", data.device))
        uuid = self._uuids.get(index)
        if uuid is None:
            uuid = _text(node._call("nvmlDeviceGetUUID", data.device, gpu=index))
        return GpuEvent(
            kind=kind,
            gpu_index=index,
            gpu_uuid=uuid,
            data=int(data.eventData),
            gpu_instance_id=_instance_id(int(data.gpuInstanceId)),
            compute_instance_id=_instance_id(int(data.computeInstanceId)),
            timestamp_s=time.time(),
        )

    def close(self) -> None:
        """Free the event set."""
        if self._set is not None:
            self._node._call("nvmlEventSetFree", self._set)
            self._set = None

    def __enter__(self) -> EventWatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class GpuNode:
    """All GPUs of this node, through one NVML module (real ``pynvml`` or the simulator)."""

    nvml: Any  # the pynvml-compatible module in use
    simulated: bool

    def __init__(self, nvml: ModuleType | Any, *, simulated: bool) -> None:
        self.nvml = nvml
        self.simulated = simulated
        self._errors_total: Counter[str] = Counter()
        self._pass = threading.local()  # per-thread error counter of the running snapshot()
        self._handles: dict[int, Any] = {}
        self._static_cache: dict[int, _Static] = {}
        self._last_info: dict[int, GpuInfo] = {}
        self._last_instances: dict[int, tuple[GpuInstance, ...]] = {}
        self._last_geometry: dict[int, MigGeometry | None] = {}
        self._geometry_cache: dict[int, MigGeometry] = {}
        self._ci_profiles: dict[tuple[int, int], tuple[_CiProfile, ...]] = {}
        self._topology: dict[tuple[int, int], Link] | None = None
        self._clock_reasons_fn = "nvmlDeviceGetCurrentClocksEventReasons"
        self._processes_fn = "nvmlDeviceGetComputeRunningProcesses_v3"
        # NVLink error counters are 3 NVML calls per link (54 per H100 each sample); they are
        # read at most this often and carried forward in between. Link state is read every
        # sample, so a link going down is seen at once. 0 reads them on every sample.
        self.nvlink_counters_interval_s = 0.0
        self._nvlink_counters: dict[int, tuple[float, dict[int, tuple[int | None, ...]]]] = {}
        self._closed = False
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            error = self._translate(exc, "nvmlInit", None)
            if isinstance(error, DriverNotLoaded):
                raise DriverNotLoaded(
                    _no_driver_message(str(exc)), function="nvmlInit", nvml_code=error.nvml_code
                ) from exc
            raise error from exc
        self._count = int(self._call("nvmlDeviceGetCount"))

    def __enter__(self) -> GpuNode:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the NVML choke point -----------------------------------------------------------------
    def _translate(self, exc: Exception, function: str, gpu: int | None) -> GpuError:
        code = int(getattr(exc, "value", errors.NVML_ERROR_UNKNOWN))
        return errors.from_nvml(code, str(exc), function=function, gpu_index=gpu)

    def _count_error(self, function: str) -> None:
        self._errors_total[function] += 1
        current: Counter[str] | None = getattr(self._pass, "errors", None)
        if current is not None:
            current[function] += 1

    def _call(self, function: str, *args: Any, gpu: int | None = None) -> Any:
        """Call ``nvml.<function>(*args)``; NVML errors become the taxonomy (and are counted)."""
        try:
            return getattr(self.nvml, function)(*args)
        except self.nvml.NVMLError as exc:
            self._count_error(function)
            raise self._translate(exc, function, gpu) from exc

    def _attempt(
        self, function: str, *args: Any, gpu: int | None, expected: frozenset[int]
    ) -> tuple[Any, int]:
        """Call, returning ``(result, 0)``, or ``(None, code)`` for an ``expected`` NVML code.

        Expected codes are answers, not failures (a reading the device lacks, the end of an
        enumeration), so they are neither raised nor counted; any other code still raises.
        """
        try:
            return getattr(self.nvml, function)(*args), errors.NVML_SUCCESS
        except self.nvml.NVMLError as exc:
            code = int(getattr(exc, "value", errors.NVML_ERROR_UNKNOWN))
            if code in expected:
                return None, code
            self._count_error(function)
            raise self._translate(exc, function, gpu) from exc

    def _optional(self, function: str, *args: Any, gpu: int | None = None) -> Any:
        """Like :meth:`_call`, but a reading the device does not offer is ``None``.

        While a telemetry sample is taken (``_soft_errors`` active), a reading that fails for
        another reason is also ``None`` and its error is noted: one broken sensor must not
        blank every other reading of the GPU. A lost GPU still raises.
        """
        try:
            return self._attempt(function, *args, gpu=gpu, expected=errors.ABSENT_CODES)[0]
        except GpuLost:
            raise
        except GpuError as exc:
            soft: list[str] | None = getattr(self._pass, "soft_errors", None)
            if soft is None:
                raise
            soft.append(str(exc))
            return None

    def _try(self, function: str, *args: Any, gpu: int | None = None) -> bool:
        """Run a call whose NOT_SUPPORTED just means "skip": True when it succeeded."""
        _, code = self._attempt(function, *args, gpu=gpu, expected=errors.ABSENT_CODES)
        return code == errors.NVML_SUCCESS

    def _const(self, name: str, default: int) -> int:
        return int(getattr(self.nvml, name, default))

    def _handle(self, index: int) -> Any:
        if not 0 <= index < self._count:
            raise InvalidArgument(
                f"GPU index {index} does not exist; this node has GPUs 0..{self._count - 1}",
                gpu_index=index,
                nvml_code=errors.NVML_ERROR_INVALID_ARGUMENT,
            )
        handle = self._handles.get(index)
        if handle is None:
            handle = self._call("nvmlDeviceGetHandleByIndex", index, gpu=index)
            self._handles[index] = handle
        return handle

    def nvml_error_counts(self) -> dict[str, int]:
        """NVML errors by function since this node was opened (absent readings not counted)."""
        return dict(self._errors_total)

    # --- inventory and topology -------------------------------------------------------------
    def count(self) -> int:
        """Number of physical GPUs."""
        return self._count

    def _static(self, index: int) -> _Static:
        cached = self._static_cache.get(index)
        if cached is not None:
            return cached
        h = self._handle(index)
        pci = self._call("nvmlDeviceGetPciInfo", h, gpu=index)
        numa = self._optional("nvmlDeviceGetNumaNodeId", h, gpu=index)
        minor = self._optional("nvmlDeviceGetMinorNumber", h, gpu=index)
        serial = self._optional("nvmlDeviceGetSerial", h, gpu=index)
        vbios = self._optional("nvmlDeviceGetVbiosVersion", h, gpu=index)
        slowdown = self._optional(
            "nvmlDeviceGetTemperatureThreshold",
            h,
            self._const("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1),
            gpu=index,
        )
        major, minor_cc = self._call("nvmlDeviceGetCudaComputeCapability", h, gpu=index)
        static = _Static(
            uuid=_text(self._call("nvmlDeviceGetUUID", h, gpu=index)),
            name=_text(self._call("nvmlDeviceGetName", h, gpu=index)),
            serial=_text(serial) if serial is not None else None,
            pci_bus_id=normalize_bus_id(_text(pci.busId)),
            pci_device_id=int(pci.pciDeviceId),
            # NVML reports -1 where the platform has no NUMA affinity for the GPU.
            numa_node=int(numa) if numa is not None and int(numa) >= 0 else None,
            memory_total_bytes=int(self._call("nvmlDeviceGetMemoryInfo", h, gpu=index).total),
            compute_capability=(int(major), int(minor_cc)),
            vbios_version=_text(vbios) if vbios is not None else None,
            minor_number=int(minor) if minor is not None else None,
            temperature_slowdown_celsius=float(slowdown) if slowdown is not None else None,
            nvlinks=self._discover_nvlinks(index, h),
        )
        self._static_cache[index] = static
        return static

    def _discover_nvlinks(self, index: int, handle: Any) -> tuple[int, ...]:
        """The NVLink indices that exist on this GPU (a link that is down still exists)."""
        links: list[int] = []
        for link in range(self._const("NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_NVLINKS)):
            # INVALID_ARGUMENT: beyond this GPU's link count; NOT_SUPPORTED: no NVLink at all.
            _, code = self._attempt(
                "nvmlDeviceGetNvLinkState", handle, link, gpu=index, expected=_NO_SUCH_ITEM
            )
            if code == errors.NVML_SUCCESS:
                links.append(link)
        return tuple(links)

    def _mig_mode(self, index: int) -> tuple[bool, bool, bool]:
        """(capable, current, pending) MIG mode; NOT_SUPPORTED means the GPU is not MIG-capable."""
        mode = self._optional("nvmlDeviceGetMigMode", self._handle(index), gpu=index)
        if mode is None:
            return False, False, False
        current, pending = mode
        return True, bool(current), bool(pending)

    def _info(self, index: int, driver: str, cuda: str) -> GpuInfo:
        static = self._static(index)
        capable, current, pending = self._mig_mode(index)
        info = GpuInfo(
            index=index,
            uuid=static.uuid,
            name=static.name,
            serial=static.serial,
            pci_bus_id=static.pci_bus_id,
            pci_device_id=static.pci_device_id,
            numa_node=static.numa_node,
            memory_total_bytes=static.memory_total_bytes,
            compute_capability=static.compute_capability,
            driver_version=driver,
            cuda_driver_version=cuda,
            vbios_version=static.vbios_version,
            mig_capable=capable,
            mig_enabled=current,
            mig_pending=pending,
            minor_number=static.minor_number,
        )
        self._last_info[index] = info
        return info

    def info(self, index: int) -> GpuInfo:
        """Static facts of one GPU. Raises GpuLost when it stopped answering."""
        return self._info(index, self.driver_version(), self.cuda_driver_version())

    def inventory(self) -> list[GpuInfo]:
        """Static facts of every GPU that answers (lost GPUs are left out; see snapshot())."""
        driver, cuda = self.driver_version(), self.cuda_driver_version()
        found: list[GpuInfo] = []
        for index in range(self._count):
            try:
                found.append(self._info(index, driver, cuda))
            except GpuLost as exc:
                log.warning("GPU %d left out of the inventory: %s", index, exc)
        return found

    def driver_version(self) -> str:
        """The kernel driver version, e.g. "570.124.06"."""
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> str:
        """The CUDA version the driver supports, e.g. "12.8"."""
        return _cuda_version(int(self._call("nvmlSystemGetCudaDriverVersion")))

    def topology(self) -> dict[tuple[int, int], Link]:
        """The link between every ordered pair of GPUs (i, j), i != j, as ``nvidia-smi topo -m``.

        Computed once (it does not change while the driver is loaded) and reused by snapshot().
        A GPU that is lost while it is computed is left out, and the result is not cached.
        """
        if self._topology is not None:
            return dict(self._topology)
        topology, complete = self._compute_topology()
        if complete:
            self._topology = topology
        return dict(topology)

    def _compute_topology(self) -> tuple[dict[tuple[int, int], Link], bool]:
        complete = True
        answering: list[int] = []
        for index in range(self._count):
            try:
                self._static(index)
                answering.append(index)
            except GpuLost:
                complete = False
        by_bus = {self._static_cache[i].pci_bus_id: i for i in answering}
        direct: Counter[tuple[int, int]] = Counter()  # NVLinks from i that land on GPU j
        to_switch: Counter[int] = Counter()  # active NVLinks from i that land on an NVSwitch
        switch_type = self._const("NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        for i in list(answering):
            try:
                self._count_nvlinks(i, by_bus, switch_type, direct, to_switch)
            except GpuLost:
                answering.remove(i)
                complete = False
        p2p_nvlink = self._const("NVML_P2P_CAPS_INDEX_NVLINK", 2)
        p2p_ok = self._const("NVML_P2P_STATUS_OK", 0)
        topology: dict[tuple[int, int], Link] = {}
        for i in answering:
            for j in answering:
                if i >= j:
                    continue
                try:
                    link = self._pair_link(i, j, direct, to_switch, p2p_nvlink, p2p_ok)
                except GpuLost:
                    complete = False
                    continue
                topology[(i, j)] = topology[(j, i)] = link
        return topology, complete

    def _count_nvlinks(
        self,
        i: int,
        by_bus: dict[str, int],
        switch_type: int,
        direct: Counter[tuple[int, int]],
        to_switch: Counter[int],
    ) -> None:
        h = self._handle(i)
        for link in self._static_cache[i].nvlinks:
            if not self._optional("nvmlDeviceGetNvLinkState", h, link, gpu=i):
                continue
            remote = self._optional("nvmlDeviceGetNvLinkRemotePciInfo", h, link, gpu=i)
            remote_bus = normalize_bus_id(_text(remote.busId)) if remote is not None else None
            j = by_bus.get(remote_bus) if remote_bus is not None else None
            if j is not None and j != i:
                direct[(i, j)] += 1
                continue
            kind = self._optional("nvmlDeviceGetNvLinkRemoteDeviceType", h, link, gpu=i)
            # Older drivers cannot name the remote type; a link that reaches no GPU of this node
            # then goes to an NVSwitch (the only other NVLink peer in a GPU server).
            if kind == switch_type or (kind is None and j is None):
                to_switch[i] += 1

    def _pair_link(
        self,
        i: int,
        j: int,
        direct: Counter[tuple[int, int]],
        to_switch: Counter[int],
        p2p_nvlink: int,
        p2p_ok: int,
    ) -> Link:
        count = max(direct[(i, j)], direct[(j, i)])
        if count:
            return Link(LinkKind.NVLINK, count)
        hi, hj = self._handle(i), self._handle(j)
        if to_switch[i] and to_switch[j]:
            # Behind NVSwitches every GPU reaches every other through all its links; NVML's P2P
            # status says whether the pair can actually talk over NVLink.
            status = self._optional("nvmlDeviceGetP2PStatus", hi, hj, p2p_nvlink, gpu=i)
            if status == p2p_ok:
                return Link(LinkKind.NVLINK, min(to_switch[i], to_switch[j]))
        level = self._call("nvmlDeviceGetTopologyCommonAncestor", hi, hj, gpu=i)
        return Link(link_kind_for_level(int(level)))

    # --- MIG ----------------------------------------------------------------------------------
    def mig_geometry(self, index: int) -> MigGeometry | None:
        """The GPU's MIG profiles and legal placements, or ``None`` when it is not MIG-capable."""
        cached = self._geometry_cache.get(index)
        if cached is not None:
            return cached
        capable, _, _ = self._mig_mode(index)
        if not capable:
            return None
        h = self._handle(index)
        found: list[tuple[int, Any, tuple[Placement, ...]]] = []
        for nvml_index in range(_MAX_PROFILE_INDEX):
            info, code = self._attempt(
                "nvmlDeviceGetGpuInstanceProfileInfo",
                h,
                nvml_index,
                2,
                gpu=index,
                expected=_NO_SUCH_ITEM,
            )
            if code == errors.NVML_ERROR_INVALID_ARGUMENT:
                break  # the documented end of the enumeration
            if code == errors.NVML_SUCCESS:
                found.append((nvml_index, info, self._placements(index, h, int(info.id))))
        smallest_mib = min((max(int(info.memorySizeMB), 1) for _, info, _ in found), default=1)
        profiles = [
            _profile(nvml_index, info, placements, smallest_mib)
            for nvml_index, info, placements in found
        ]
        profiles.sort(key=lambda p: (-p.slices, -p.compute_slices, p.name))
        memory_slices = max(
            (q.end for p in profiles for q in p.placements),
            default=max((p.slices for p in profiles), default=0),
        )
        geometry = MigGeometry(
            model=self._static(index).name, memory_slices=memory_slices, profiles=tuple(profiles)
        )
        # Profile info is immutable for the life of a MIG mode; an empty table (some drivers
        # answer only once MIG is enabled) is not cached so it is asked again later.
        if profiles:
            self._geometry_cache[index] = geometry
        return geometry

    def _placements(self, index: int, handle: Any, profile_id: int) -> tuple[Placement, ...]:
        fn = "nvmlDeviceGetGpuInstancePossiblePlacements"
        count = ctypes.c_uint(0)
        # A NULL buffer asks for the number of placements (nvml.h), then a buffer of that size.
        # The query needs privilege on some drivers: without it the placements are unknown
        # (an empty tuple), which is not a reason to fail the whole profile table.
        _, code = self._attempt(
            fn, handle, profile_id, None, ctypes.byref(count), gpu=index, expected=_UNANSWERED
        )
        if code != errors.NVML_SUCCESS or not count.value:
            return ()
        buffer = (self.nvml.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(fn, handle, profile_id, buffer, ctypes.byref(count), gpu=index)
        found = {Placement(int(p.start), int(p.size)) for p in buffer[: count.value]}
        return tuple(sorted(found, key=lambda p: (p.start, p.size)))

    def _ci_profile_table(self, index: int, gi: Any, gi_profile_id: int) -> tuple[_CiProfile, ...]:
        """Compute-instance profiles offered inside GIs of one profile (immutable, cached)."""
        key = (index, gi_profile_id)
        cached = self._ci_profiles.get(key)
        if cached is not None:
            return cached
        engine = self._const("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
        table: list[_CiProfile] = []
        for ci_index in range(self._const("NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9)):
            info, code = self._attempt(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                gi,
                ci_index,
                engine,
                2,
                gpu=index,
                expected=_NO_SUCH_ITEM,
            )
            if code == errors.NVML_SUCCESS:
                table.append(
                    _CiProfile(int(info.id), int(info.sliceCount), int(info.instanceCount))
                )
        result = tuple(table)
        self._ci_profiles[key] = result
        return result

    def _gpu_instance_handles(self, index: int, geometry: MigGeometry) -> list[Any]:
        h = self._handle(index)
        handles: list[Any] = []
        for profile in geometry.profiles:
            if profile.max_count <= 0:
                continue
            buffer = (self.nvml.c_nvmlGpuInstance_t * profile.max_count)()
            count = ctypes.c_uint(profile.max_count)
            self._call(
                "nvmlDeviceGetGpuInstances",
                h,
                profile.profile_id,
                buffer,
                ctypes.byref(count),
                gpu=index,
            )
            handles.extend(buffer[: count.value])
        return handles

    def _mig_device_uuids(self, index: int) -> dict[tuple[int, int], str]:
        """UUIDs of the MIG devices (one per compute instance), by (GI id, CI id)."""
        h = self._handle(index)
        uuids: dict[tuple[int, int], str] = {}
        for mig_index in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", h, gpu=index))):
            mig, code = self._attempt(
                "nvmlDeviceGetMigDeviceHandleByIndex",
                h,
                mig_index,
                gpu=index,
                expected=frozenset({errors.NVML_ERROR_NOT_FOUND}),
            )
            if code != errors.NVML_SUCCESS:
                continue  # indices are sparse: no MIG device at this slot
            gi_id = int(self._call("nvmlDeviceGetGpuInstanceId", mig, gpu=index))
            ci_id = int(self._call("nvmlDeviceGetComputeInstanceId", mig, gpu=index))
            uuids[(gi_id, ci_id)] = _text(self._call("nvmlDeviceGetUUID", mig, gpu=index))
        return uuids

    def _processes(self, index: int) -> tuple[ProcessInfo, ...]:
        handle = self._handle(index)
        # The versioned name, because pynvml's unversioned wrapper turns a missing entry point
        # into a non-NVML exception; drivers before the v3 struct (R510) get the v2 call.
        raw, code = self._attempt(
            self._processes_fn,
            handle,
            gpu=index,
            expected=frozenset({errors.NVML_ERROR_FUNCTION_NOT_FOUND}),
        )
        if code == errors.NVML_ERROR_FUNCTION_NOT_FOUND:
            self._processes_fn = "nvmlDeviceGetComputeRunningProcesses_v2"
            raw = self._call(self._processes_fn, handle, gpu=index)
        processes = [
            ProcessInfo(
                pid=int(p.pid),
                used_memory_bytes=int(p.usedGpuMemory) if p.usedGpuMemory is not None else None,
                gpu_instance_id=_instance_id(int(getattr(p, "gpuInstanceId", _NOT_AVAILABLE_UINT))),
                compute_instance_id=_instance_id(
                    int(getattr(p, "computeInstanceId", _NOT_AVAILABLE_UINT))
                ),
            )
            for p in raw
        ]
        return tuple(sorted(processes, key=lambda p: p.pid))

    def _read_instances(
        self, index: int, processes: tuple[ProcessInfo, ...], enabled: bool | None = None
    ) -> tuple[GpuInstance, ...]:
        if enabled is None:
            _, enabled, _ = self._mig_mode(index)
        geometry = self.mig_geometry(index) if enabled else None
        if geometry is None:
            return ()
        names = {p.profile_id: p.name for p in geometry.profiles}
        uuids = self._mig_device_uuids(index)
        instances: list[GpuInstance] = []
        for gi in self._gpu_instance_handles(index, geometry):
            info = self._call("nvmlGpuInstanceGetInfo", gi, gpu=index)
            gi_id, profile_id = int(info.id), int(info.profileId)
            cis = self._read_compute_instances(index, gi, gi_id, profile_id, uuids)
            instances.append(
                GpuInstance(
                    gpu_index=index,
                    instance_id=gi_id,
                    profile=names.get(profile_id, f"profile-{profile_id}"),
                    profile_id=profile_id,
                    placement=Placement(int(info.placement.start), int(info.placement.size)),
                    compute_instances=cis,
                    pids=tuple(p.pid for p in processes if p.gpu_instance_id == gi_id),
                )
            )
        instances.sort(key=lambda g: (g.placement.start, g.placement.size, g.instance_id))
        return tuple(instances)

    def _ci_handles(self, index: int, gi: Any, gi_profile_id: int) -> list[tuple[Any, _CiProfile]]:
        handles: list[tuple[Any, _CiProfile]] = []
        for ci_profile in self._ci_profile_table(index, gi, gi_profile_id):
            if ci_profile.max_count <= 0:
                continue
            buffer = (self.nvml.c_nvmlComputeInstance_t * ci_profile.max_count)()
            count = ctypes.c_uint(ci_profile.max_count)
            self._call(
                "nvmlGpuInstanceGetComputeInstances",
                gi,
                ci_profile.profile_id,
                buffer,
                ctypes.byref(count),
                gpu=index,
            )
            handles.extend((ci, ci_profile) for ci in buffer[: count.value])
        return handles

    def _read_compute_instances(
        self,
        index: int,
        gi: Any,
        gi_id: int,
        gi_profile_id: int,
        uuids: dict[tuple[int, int], str],
    ) -> tuple[ComputeInstance, ...]:
        found: list[ComputeInstance] = []
        for ci, ci_profile in self._ci_handles(index, gi, gi_profile_id):
            info = self._call("nvmlComputeInstanceGetInfo", ci, gpu=index)
            ci_id = int(info.id)
            found.append(
                ComputeInstance(
                    gpu_instance_id=gi_id,
                    instance_id=ci_id,
                    profile_id=int(info.profileId),
                    slice_count=ci_profile.slice_count,
                    placement=Placement(int(info.placement.start), int(info.placement.size)),
                    # Every CI forms a MIG device; "" only if NVML listed none for it.
                    uuid=uuids.get((gi_id, ci_id), ""),
                )
            )
        found.sort(key=lambda c: (c.placement.start, c.instance_id))
        return tuple(found)

    def mig_instances(self, index: int) -> tuple[GpuInstance, ...]:
        """Current GPU instances with compute instances and processes, sorted by placement."""
        return self._read_instances(index, self._processes(index))

    def set_mig_mode(self, index: int, enabled: bool) -> MigModeChange:
        """Request MIG on or off. A change that needs a reset is reported, not an error."""
        h = self._handle(index)
        mode = self._const("NVML_DEVICE_MIG_ENABLE" if enabled else "NVML_DEVICE_MIG_DISABLE", 1)
        activation = int(self._call("nvmlDeviceSetMigMode", h, mode, gpu=index))
        _, current, pending = self._mig_mode(index)
        self._geometry_cache.pop(index, None)
        self._ci_profiles = {k: v for k, v in self._ci_profiles.items() if k[0] != index}
        reset_required = current != pending
        reason: str | None = None
        if activation == errors.NVML_ERROR_IN_USE:
            reason = "the GPU is in use (processes or clients attached); stop them, then reset it"
        elif activation == errors.NVML_ERROR_RESET_REQUIRED:
            reason = "the GPU cannot be reset here (passthrough); reboot the machine or VM"
        elif activation != errors.NVML_SUCCESS:
            reason = f"activation failed with NVML error {activation}"
        elif reset_required:
            reason = "the new mode takes effect after a GPU reset"
        return MigModeChange(
            gpu_index=index,
            current=current,
            pending=pending,
            reset_required=reset_required,
            reason=reason,
        )

    def reset_gpu(self, index: int) -> None:
        """Reset the GPU so a pending MIG mode takes effect. Raises InUse while processes run."""
        static = self._static(index)
        if self.simulated:
            self._reset_simulated(index)
        else:
            self._reset_hardware(index, static.pci_bus_id)
        # The reset drops every GPU and compute instance; cached handles stay valid for the GPU.
        self._geometry_cache.pop(index, None)
        self._ci_profiles = {k: v for k, v in self._ci_profiles.items() if k[0] != index}

    def _reset_simulated(self, index: int) -> None:
        from nodeagent.sim import control  # the simulator is optional at runtime

        try:
            control.reset_gpu(self.nvml, index)
        except self.nvml.NVMLError as exc:
            self._count_error("reset")
            raise self._translate(exc, "reset", index) from exc

    def _reset_hardware(self, index: int, bus_id: str) -> None:
        processes = self._processes(index)
        if processes:
            pids = ", ".join(str(p.pid) for p in processes)
            raise InUse(
                f"GPU {index} cannot be reset while processes run on it (pids {pids}); stop them",
                function="nvidia-smi -r",
                gpu_index=index,
                nvml_code=errors.NVML_ERROR_IN_USE,
            )
        result = subprocess.run(
            ["nvidia-smi", "-r", "-i", bus_id], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            output = " ".join((result.stdout + " " + result.stderr).split())
            cls = InUse if "in use" in output.lower() else GpuError
            raise cls(
                f"nvidia-smi -r -i {bus_id} failed (exit {result.returncode}): {output}",
                function="nvidia-smi -r",
                gpu_index=index,
            )

    def _mig_profile(self, index: int, profile: str) -> MigProfile:
        geometry = self.mig_geometry(index)
        if geometry is None:
            raise NotSupported(
                f"GPU {index} ({self._static(index).name}) does not support MIG",
                function="nvmlDeviceGetMigMode",
                gpu_index=index,
                nvml_code=errors.NVML_ERROR_NOT_SUPPORTED,
            )
        found = geometry.profile(profile)
        if found is not None:
            return found
        _, enabled, _ = self._mig_mode(index)
        if not enabled and not geometry.profiles:
            raise NotSupported(
                f"MIG is disabled on GPU {index}; enable it and reset the GPU first",
                function="nvmlDeviceGetGpuInstanceProfileInfo",
                gpu_index=index,
                nvml_code=errors.NVML_ERROR_NOT_SUPPORTED,
            )
        names = ", ".join(p.name for p in geometry.profiles)
        raise InvalidArgument(
            f"GPU {index} ({geometry.model}) has no MIG profile {profile!r}; "
            f"choose one of: {names}",
            gpu_index=index,
            nvml_code=errors.NVML_ERROR_INVALID_ARGUMENT,
        )

    def create_gpu_instance(self, index: int, profile: str, placement: Placement) -> GpuInstance:
        """Create a GPU instance at an explicit placement plus one compute instance spanning it.

        Raises InsufficientResources on overlap or exhausted capacity, NotSupported when MIG is
        off, InvalidArgument for a placement the profile does not allow.
        """
        mig_profile = self._mig_profile(index, profile)
        h = self._handle(index)
        c_placement = self.nvml.c_nvmlGpuInstancePlacement_t()
        c_placement.start = placement.start
        c_placement.size = placement.size
        gi = self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            h,
            mig_profile.profile_id,
            ctypes.byref(c_placement),
            gpu=index,
        )
        gi_id = int(self._call("nvmlGpuInstanceGetInfo", gi, gpu=index).id)
        try:
            table = self._ci_profile_table(index, gi, mig_profile.profile_id)
            if not table:
                raise NotSupported(
                    f"GPU {index}: no compute-instance profile fits a {profile} instance",
                    function="nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    gpu_index=index,
                    nvml_code=errors.NVML_ERROR_NOT_SUPPORTED,
                )
            # The full-size CI: the most slices, and of equals the plain profile (lowest id)
            # rather than a variant such as the NVL-optimised 7-slice one.
            full = min(table, key=lambda c: (-c.slice_count, c.profile_id))
            self._call("nvmlGpuInstanceCreateComputeInstance", gi, full.profile_id, gpu=index)
        except GpuError:
            # Leave no half-made instance behind: without a CI the GI is unusable.
            self._call("nvmlGpuInstanceDestroy", gi, gpu=index)
            raise
        for instance in self.mig_instances(index):
            if instance.instance_id == gi_id:
                return instance
        raise GpuError(
            f"GPU {index}: instance {gi_id} vanished right after it was created",
            function="nvmlDeviceGetGpuInstances",
            gpu_index=index,
        )

    def destroy_gpu_instance(self, index: int, instance_id: int) -> None:
        """Destroy a GPU instance's compute instances, then the instance. Raises InUse when busy."""
        # Check for processes first, so that a busy instance is left whole rather than stripped
        # of some of its compute instances before NVML refuses.
        busy = [p.pid for p in self._processes(index) if p.gpu_instance_id == instance_id]
        if busy:
            raise InUse(
                f"GPU {index} instance {instance_id} runs processes "
                f"{', '.join(map(str, busy))}; stop them before destroying it",
                function="nvmlGpuInstanceDestroy",
                gpu_index=index,
                nvml_code=errors.NVML_ERROR_IN_USE,
            )
        h = self._handle(index)
        gi = self._call("nvmlDeviceGetGpuInstanceById", h, instance_id, gpu=index)
        profile_id = int(self._call("nvmlGpuInstanceGetInfo", gi, gpu=index).profileId)
        for ci, _ in self._ci_handles(index, gi, profile_id):
            self._call("nvmlComputeInstanceDestroy", ci, gpu=index)
        self._call("nvmlGpuInstanceDestroy", gi, gpu=index)

    def destroy_compute_instance(self, index: int, gpu_instance_id: int, ci_id: int) -> None:
        """Destroy one compute instance. Raises InUse while processes run on it."""
        h = self._handle(index)
        gi = self._call("nvmlDeviceGetGpuInstanceById", h, gpu_instance_id, gpu=index)
        ci = self._call("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id, gpu=index)
        self._call("nvmlComputeInstanceDestroy", ci, gpu=index)

    # --- telemetry, health and events --------------------------------------------------------
    def _clock_event_reasons(self, index: int, handle: Any) -> int | None:
        value = self._optional(self._clock_reasons_fn, handle, gpu=index)
        if value is None and self._clock_reasons_fn == "nvmlDeviceGetCurrentClocksEventReasons":
            # Drivers before R535 only have the older name for the same bitmask; probe it once.
            self._clock_reasons_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
            value = self._optional(self._clock_reasons_fn, handle, gpu=index)
        return int(value) if value is not None else None

    def _ecc(self, index: int, handle: Any) -> EccCounts | None:
        corrected = self._const("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        uncorrected = self._const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        volatile = self._const("NVML_VOLATILE_ECC", 0)
        aggregate = self._const("NVML_AGGREGATE_ECC", 1)
        counts: list[int] = []
        for error_type, counter in (
            (corrected, volatile),
            (uncorrected, volatile),
            (corrected, aggregate),
            (uncorrected, aggregate),
        ):
            value = self._optional(
                "nvmlDeviceGetTotalEccErrors", handle, error_type, counter, gpu=index
            )
            if value is None:
                return None  # ECC off or not offered: no counter is meaningful
            counts.append(int(value))
        return EccCounts(*counts)

    def _retired_pages(self, index: int, handle: Any) -> tuple[int | None, int | None, bool | None]:
        sbe = self._optional(
            "nvmlDeviceGetRetiredPages",
            handle,
            self._const("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
            gpu=index,
        )
        dbe = self._optional(
            "nvmlDeviceGetRetiredPages",
            handle,
            self._const("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1),
            gpu=index,
        )
        pending = self._optional("nvmlDeviceGetRetiredPagesPendingStatus", handle, gpu=index)
        return (
            len(sbe) if sbe is not None else None,
            len(dbe) if dbe is not None else None,
            bool(pending) if pending is not None else None,
        )

    def _nvlinks(self, index: int, handle: Any, links: tuple[int, ...]) -> tuple[NvLinkStatus, ...]:
        replay = self._const("NVML_NVLINK_ERROR_DL_REPLAY", 0)
        recovery = self._const("NVML_NVLINK_ERROR_DL_RECOVERY", 1)
        crc_flit = self._const("NVML_NVLINK_ERROR_DL_CRC_FLIT", 2)
        statuses: list[NvLinkStatus] = []
        now = time.monotonic()
        read_at, cached = self._nvlink_counters.get(index, (-1.0, {}))
        fresh = read_at < 0 or now - read_at >= self.nvlink_counters_interval_s
        if fresh:
            cached = {}
            for link in links:
                cached[link] = tuple(
                    self._optional("nvmlDeviceGetNvLinkErrorCounter", handle, link, c, gpu=index)
                    for c in (replay, recovery, crc_flit)
                )
            self._nvlink_counters[index] = (now, cached)
        for link in links:
            counters = cached.get(link, (None, None, None))
            active = self._optional("nvmlDeviceGetNvLinkState", handle, link, gpu=index)
            statuses.append(
                NvLinkStatus(
                    link=link,
                    active=bool(active),
                    replay_errors=int(counters[0]) if counters[0] is not None else None,
                    recovery_errors=int(counters[1]) if counters[1] is not None else None,
                    crc_flit_errors=int(counters[2]) if counters[2] is not None else None,
                )
            )
        return tuple(statuses)

    def _telemetry(self, index: int, processes: tuple[ProcessInfo, ...] | None = None) -> Telemetry:
        h = self._handle(index)
        static = self._static(index)
        utilization = self._optional("nvmlDeviceGetUtilizationRates", h, gpu=index)
        memory = self._call("nvmlDeviceGetMemoryInfo", h, gpu=index)
        temperature = self._optional(
            "nvmlDeviceGetTemperature", h, self._const("NVML_TEMPERATURE_GPU", 0), gpu=index
        )
        power_mw = self._optional("nvmlDeviceGetPowerUsage", h, gpu=index)
        limit_mw = self._optional("nvmlDeviceGetEnforcedPowerLimit", h, gpu=index)
        energy_mj = self._optional("nvmlDeviceGetTotalEnergyConsumption", h, gpu=index)
        sm_mhz = self._optional(
            "nvmlDeviceGetClockInfo", h, self._const("NVML_CLOCK_SM", 1), gpu=index
        )
        mem_mhz = self._optional(
            "nvmlDeviceGetClockInfo", h, self._const("NVML_CLOCK_MEM", 2), gpu=index
        )
        remap = self._optional("nvmlDeviceGetRemappedRows", h, gpu=index)
        sbe_pages, dbe_pages, pages_pending = self._retired_pages(index, h)
        replay = self._optional("nvmlDeviceGetPcieReplayCounter", h, gpu=index)
        return Telemetry(
            gpu_index=index,
            timestamp_s=time.time(),
            utilization_gpu_ratio=utilization.gpu / 100 if utilization is not None else None,
            utilization_memory_ratio=utilization.memory / 100 if utilization is not None else None,
            memory_used_bytes=int(memory.used),
            memory_free_bytes=int(memory.free),
            temperature_celsius=float(temperature) if temperature is not None else None,
            temperature_slowdown_celsius=static.temperature_slowdown_celsius,
            power_watts=power_mw / 1000 if power_mw is not None else None,
            power_limit_watts=limit_mw / 1000 if limit_mw is not None else None,
            energy_joules=energy_mj / 1000 if energy_mj is not None else None,
            sm_clock_hz=sm_mhz * 1e6 if sm_mhz is not None else None,
            memory_clock_hz=mem_mhz * 1e6 if mem_mhz is not None else None,
            clock_event_reasons=self._clock_event_reasons(index, h),
            ecc=self._ecc(index, h),
            remapped_rows=(
                RemappedRows(int(remap[0]), int(remap[1]), bool(remap[2]), bool(remap[3]))
                if remap is not None
                else None
            ),
            retired_pages_sbe=sbe_pages,
            retired_pages_dbe=dbe_pages,
            retired_pages_pending=pages_pending,
            pcie_replay_count=int(replay) if replay is not None else None,
            nvlinks=self._nvlinks(index, h, static.nvlinks),
            processes=processes if processes is not None else self._processes(index),
        )

    def telemetry(self, index: int) -> Telemetry:
        """One sample of moving values and health counters."""
        return self._telemetry(index)

    @contextmanager
    def _error_pass(self) -> Iterator[Counter[str]]:
        counter: Counter[str] = Counter()
        self._pass.errors = counter
        try:
            yield counter
        finally:
            self._pass.errors = None

    def _unreadable_info(self, index: int, driver: str, cuda: str) -> GpuInfo:
        """The last known facts of a GPU that no longer answers, or a minimal stand-in."""
        last = self._last_info.get(index)
        if last is not None:
            return last
        static = self._static_cache.get(index)
        return GpuInfo(
            index=index,
            # A GPU lost before this process ever read it cannot say who it is; a stable
            # stand-in keyed by index keeps it visible (health, metrics) instead of dropped.
            uuid=static.uuid if static else unknown_gpu_id(index),
            name=static.name if static else "unknown",
            serial=static.serial if static else None,
            pci_bus_id=static.pci_bus_id if static else "",
            pci_device_id=static.pci_device_id if static else 0,
            numa_node=static.numa_node if static else None,
            memory_total_bytes=static.memory_total_bytes if static else 0,
            compute_capability=static.compute_capability if static else (0, 0),
            driver_version=driver,
            cuda_driver_version=cuda,
            vbios_version=static.vbios_version if static else None,
            mig_capable=False,
            mig_enabled=False,
            mig_pending=False,
        )

    def _gpu_state(self, index: int, driver: str, cuda: str) -> GpuState:
        try:
            info = self._info(index, driver, cuda)
            processes = self._processes(index)
            self._pass.soft_errors = []
            try:
                telemetry = self._telemetry(index, processes)
                failed_readings: list[str] = self._pass.soft_errors
            finally:
                self._pass.soft_errors = None
            instances = self._read_instances(index, processes, info.mig_enabled)
            # Read by _read_instances already when MIG is on (and cached), so this is free.
            geometry = self.mig_geometry(index) if info.mig_enabled else None
            self._last_instances[index] = instances
            self._last_geometry[index] = geometry
            return GpuState(
                info=info,
                telemetry=telemetry,
                mig_instances=instances,
                # The readings that failed are None in the telemetry; the error says which.
                error="; ".join(failed_readings) if failed_readings else None,
                mig_geometry=geometry,
            )
        except GpuLost as exc:
            info = self._unreadable_info(index, driver, cuda)
            # Its last known MIG layout stays, so the devices on it are reported lost (health,
            # device plugin, metrics) rather than silently vanishing.
            return GpuState(
                info=info,
                telemetry=None,
                mig_instances=self._last_instances.get(index, ()),
                lost=True,
                error=str(exc),
                mig_geometry=self._last_geometry.get(index),
            )
        except GpuError as exc:
            # Any other failure spoils this GPU's sample only; the pass goes on for the others.
            log.warning("GPU %d could not be sampled: %s", index, exc)
            info = self._unreadable_info(index, driver, cuda)
            return GpuState(info=info, telemetry=None, mig_instances=(), error=str(exc))

    def snapshot(self) -> NodeSnapshot:
        """Sample every GPU; a lost GPU is marked lost while the others are read normally."""
        started = time.perf_counter()
        timestamp = time.time()
        with self._error_pass() as pass_errors:
            driver = self.driver_version()
            cuda = self.cuda_driver_version()
            gpus = tuple(self._gpu_state(i, driver, cuda) for i in range(self._count))
            topology = self.topology()
        return NodeSnapshot(
            timestamp_s=timestamp,
            sample_duration_s=time.perf_counter() - started,
            driver_version=driver,
            cuda_driver_version=cuda,
            gpus=gpus,
            topology=topology,
            nvml_errors=dict(pass_errors),
        )

    def watch_events(self) -> EventWatcher:
        """Open an event set for XID and ECC events on all GPUs."""
        return EventWatcher(self)

    def close(self) -> None:
        """Shut NVML down."""
        if self._closed:
            return
        self._closed = True
        self._call("nvmlShutdown")


def preset_names() -> Sequence[str]:
    """The simulator presets, for error hints and ``nodeagent sim presets``."""
    from nodeagent.sim.presets import preset_names as sim_preset_names

    return tuple(sim_preset_names())


def _no_driver_message(cause: str) -> str:
    try:
        presets = ", ".join(preset_names())
    except Exception:  # noqa: BLE001 - the hint must not hide the real error
        presets = "see `nodeagent sim presets`"
    return (
        f"no NVIDIA driver found ({cause}); to use a simulated node pass --simulate PRESET "
        f"or set {ENV_SIMULATE}=PRESET (presets: {presets})"
    )


def open_node(simulate: str | None = None, state_dir: Path | None = None) -> GpuNode:
    """Open the node's GPUs: the simulator when ``simulate`` names a preset, else real NVML.

    ``simulate`` falls back to env ``NODEAGENT_SIMULATE``. The simulator's state lives in
    ``state_dir`` (falls back to env ``NODEAGENT_SIM_STATE``, then the user's state directory);
    it is created from the preset when empty. Raises DriverNotLoaded without a driver.
    """
    preset = simulate or os.environ.get(ENV_SIMULATE) or None
    if preset:
        names = preset_names()
        if preset not in names:
            raise InvalidArgument(
                f"unknown simulator preset {preset!r}; choose one of: {', '.join(names)}"
            )
        from nodeagent.sim import SimNvml  # imported only when a preset is asked for

        return GpuNode(SimNvml(state_dir, preset), simulated=True)
    try:
        import pynvml
    except ImportError as exc:
        raise DriverNotLoaded(_no_driver_message(f"pynvml not importable: {exc}")) from exc
    return GpuNode(pynvml, simulated=False)
