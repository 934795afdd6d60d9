"""Telemetry: the moving values and health counters of a GPU, and the processes on it."""

from __future__ import annotations

import time
from typing import Any

from nodeagent.gpu import errors
from nodeagent.gpu.inventory import Inventory
from nodeagent.gpu.nvml import NOT_AVAILABLE_UINT, Nvml, instance_id, text
from nodeagent.gpu.types import (
    ClockEventReason,
    EccCounts,
    NvLinkStatus,
    ProcessInfo,
    RemappedRows,
    Telemetry,
)


class Processes:
    """The compute processes of a GPU (with their MIG instance where MIG is on)."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._function = "nvmlDeviceGetComputeRunningProcesses_v3"

    def __call__(self, index: int) -> tuple[ProcessInfo, ...]:
        """Every compute process on GPU ``index``, by PID."""
        nvml = self._nvml
        handle = nvml.handle(index)
        # The versioned name, because pynvml's unversioned wrapper turns a missing entry point
        # into a non-NVML exception; drivers before the v3 struct (R510) get the v2 call.
        raw, code = nvml.attempt(
            self._function,
            handle,
            gpu=index,
            expected=frozenset({errors.NVML_ERROR_FUNCTION_NOT_FOUND}),
        )
        if code == errors.NVML_ERROR_FUNCTION_NOT_FOUND:
            self._function = "nvmlDeviceGetComputeRunningProcesses_v2"
            raw = nvml.call(self._function, handle, gpu=index)
        processes = [
            ProcessInfo(
                pid=int(p.pid),
                used_memory_bytes=int(p.usedGpuMemory) if p.usedGpuMemory is not None else None,
                gpu_instance_id=instance_id(int(getattr(p, "gpuInstanceId", NOT_AVAILABLE_UINT))),
                compute_instance_id=instance_id(
                    int(getattr(p, "computeInstanceId", NOT_AVAILABLE_UINT))
                ),
            )
            for p in raw
        ]
        return tuple(sorted(processes, key=lambda p: p.pid))


class ProcessUsage:
    """Names, per-process utilization and MPS membership of the processes of one sample.

    Per-process utilization comes from the driver's sample buffer: each call asks only for the
    samples newer than the last one seen on that GPU, averaged per PID. Names are cached by PID
    (a name does not change while the process lives) and forgotten when the PID leaves.
    """

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._last_seen_us: dict[int, int] = {}
        self._names: dict[int, str | None] = {}

    def _name(self, pid: int) -> str | None:
        if pid in self._names:
            return self._names[pid]
        raw, _ = self._nvml.attempt(
            "nvmlSystemGetProcessName",
            pid,
            gpu=None,
            expected=errors.ABSENT_CODES
            | {errors.NVML_ERROR_NOT_FOUND, errors.NVML_ERROR_NO_PERMISSION},
        )
        name = text(raw) or None if raw is not None else None
        self._names[pid] = name
        return name

    def _utilization(self, index: int, handle: Any) -> dict[int, tuple[float, float]] | None:
        """{pid: (SM, memory)} ratios since the last call; None where NVML keeps no samples."""
        raw, code = self._nvml.attempt(
            "nvmlDeviceGetProcessUtilization",
            handle,
            self._last_seen_us.get(index, 0),
            gpu=index,
            expected=errors.ABSENT_CODES | {errors.NVML_ERROR_NOT_FOUND},
        )
        if code == errors.NVML_ERROR_NOT_FOUND:
            return {}  # no process ran since the last sample
        if raw is None:
            return None
        sums: dict[int, list[float]] = {}
        latest = self._last_seen_us.get(index, 0)
        for sample in raw:
            acc = sums.setdefault(int(sample.pid), [0.0, 0.0, 0.0])
            acc[0] += int(sample.smUtil)
            acc[1] += int(sample.memUtil)
            acc[2] += 1
            latest = max(latest, int(sample.timeStamp))
        self._last_seen_us[index] = latest
        return {pid: (sm / n / 100, mem / n / 100) for pid, (sm, mem, n) in sums.items()}

    def _mps_clients(self, index: int, handle: Any) -> frozenset[int]:
        raw, _ = self._nvml.attempt(
            "nvmlDeviceGetMPSComputeRunningProcesses_v3",
            handle,
            gpu=index,
            expected=errors.ABSENT_CODES,
        )
        return frozenset(int(p.pid) for p in raw or ())

    def __call__(
        self, index: int, handle: Any, processes: tuple[ProcessInfo, ...]
    ) -> tuple[ProcessInfo, ...]:
        """``processes`` with their name, utilization and MPS membership filled in."""
        if not processes:
            return processes
        # Processes on MIG instances mean MIG is on, where the driver keeps no per-process
        # samples (NOT_SUPPORTED): it is not asked.
        on_mig = any(p.gpu_instance_id is not None for p in processes)
        utilization = None if on_mig else self._utilization(index, handle)
        mps = self._mps_clients(index, handle)
        out = []
        for proc in processes:
            sm = mem = None
            if utilization is not None:
                sm, mem = utilization.get(proc.pid, (0.0, 0.0))
            out.append(
                ProcessInfo(
                    proc.pid,
                    proc.used_memory_bytes,
                    proc.gpu_instance_id,
                    proc.compute_instance_id,
                    self._name(proc.pid),
                    sm,
                    mem,
                    proc.pid in mps,
                )
            )
        return tuple(out)

    def forget_gone(self, alive: set[int]) -> None:
        """Drop the cached names of PIDs no longer on any GPU."""
        for pid in [p for p in self._names if p not in alive]:
            del self._names[pid]


class TelemetryReader:
    """One telemetry sample per call; NVLink error counters are read at a slower pace."""

    def __init__(self, nvml: Nvml, inventory: Inventory, processes: Processes) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._processes = processes
        self.usage = ProcessUsage(nvml)
        self._clock_reasons_fn = "nvmlDeviceGetCurrentClocksEventReasons"
        # GPUs whose driver lacks memory info v2 (before R510, or a binding without the struct):
        # found on the first sample, then asked the v1 question only.
        self._memory_v1_only: set[int] = set()
        # NVLink error counters are 3 NVML calls per link (54 per H100 each sample); they are
        # read at most this often and carried forward in between. Link state is read every
        # sample, so a link going down is seen at once. 0 reads them on every sample.
        self.nvlink_counters_interval_s = 0.0
        self._nvlink_counters: dict[int, tuple[float, dict[int, tuple[int | None, ...]]]] = {}

    def _clock_event_reasons(self, index: int, handle: Any) -> ClockEventReason | None:
        nvml = self._nvml
        value = nvml.optional(self._clock_reasons_fn, handle, gpu=index)
        if value is None and self._clock_reasons_fn == "nvmlDeviceGetCurrentClocksEventReasons":
            # Drivers before R535 only have the older name for the same bitmask; probe it once.
            self._clock_reasons_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
            value = nvml.optional(self._clock_reasons_fn, handle, gpu=index)
        return ClockEventReason(int(value)) if value is not None else None

    def _memory(self, index: int, handle: Any) -> tuple[int, int, int | None]:
        """(used, free, reserved) bytes, as nvidia-smi, gpustat and nvitop show them.

        Memory info v2 reports what the driver and firmware set aside apart, and its "used" is
        what processes allocated; v1 counts the reserved memory as used. Where v2 is missing
        the v1 reading stands, with ``reserved`` unknown.
        """
        nvml = self._nvml
        version = nvml.const("nvmlMemory_v2", 0)
        if version and index not in self._memory_v1_only:
            memory, code = nvml.attempt(
                "nvmlDeviceGetMemoryInfo", handle, version, gpu=index, expected=errors.ABSENT_CODES
            )
            if code == errors.NVML_SUCCESS:
                return int(memory.used), int(memory.free), int(memory.reserved)
            self._memory_v1_only.add(index)
        memory = nvml.call("nvmlDeviceGetMemoryInfo", handle, gpu=index)
        return int(memory.used), int(memory.free), None

    def _ecc(self, index: int, handle: Any) -> EccCounts | None:
        nvml = self._nvml
        corrected = nvml.const("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        uncorrected = nvml.const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        volatile = nvml.const("NVML_VOLATILE_ECC", 0)
        aggregate = nvml.const("NVML_AGGREGATE_ECC", 1)
        counts: list[int] = []
        for error_type, counter in (
            (corrected, volatile),
            (uncorrected, volatile),
            (corrected, aggregate),
            (uncorrected, aggregate),
        ):
            value = nvml.optional(
                "nvmlDeviceGetTotalEccErrors", handle, error_type, counter, gpu=index
            )
            if value is None:
                return None  # ECC off or not offered: no counter is meaningful
            counts.append(int(value))
        return EccCounts(*counts)

    def _retired_pages(self, index: int, handle: Any) -> tuple[int | None, int | None, bool | None]:
        nvml = self._nvml
        sbe = nvml.optional(
            "nvmlDeviceGetRetiredPages",
            handle,
            nvml.const("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
            gpu=index,
        )
        dbe = nvml.optional(
            "nvmlDeviceGetRetiredPages",
            handle,
            nvml.const("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1),
            gpu=index,
        )
        pending = nvml.optional("nvmlDeviceGetRetiredPagesPendingStatus", handle, gpu=index)
        return (
            len(sbe) if sbe is not None else None,
            len(dbe) if dbe is not None else None,
            bool(pending) if pending is not None else None,
        )

    def _nvlinks(self, index: int, handle: Any, links: tuple[int, ...]) -> tuple[NvLinkStatus, ...]:
        nvml = self._nvml
        replay = nvml.const("NVML_NVLINK_ERROR_DL_REPLAY", 0)
        recovery = nvml.const("NVML_NVLINK_ERROR_DL_RECOVERY", 1)
        crc_flit = nvml.const("NVML_NVLINK_ERROR_DL_CRC_FLIT", 2)
        statuses: list[NvLinkStatus] = []
        now = time.monotonic()
        read_at, cached = self._nvlink_counters.get(index, (-1.0, {}))
        fresh = read_at < 0 or now - read_at >= self.nvlink_counters_interval_s
        if fresh:
            cached = {}
            for link in links:
                cached[link] = tuple(
                    nvml.optional("nvmlDeviceGetNvLinkErrorCounter", handle, link, c, gpu=index)
                    for c in (replay, recovery, crc_flit)
                )
            self._nvlink_counters[index] = (now, cached)
        for link in links:
            counters = cached.get(link, (None, None, None))
            active = nvml.optional("nvmlDeviceGetNvLinkState", handle, link, gpu=index)
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

    def __call__(self, index: int, processes: tuple[ProcessInfo, ...] | None = None) -> Telemetry:
        """One sample of GPU ``index`` (``processes`` when the caller read them already)."""
        nvml = self._nvml
        h = nvml.handle(index)
        static = self._inventory.static(index)
        utilization = nvml.optional("nvmlDeviceGetUtilizationRates", h, gpu=index)
        memory_used, memory_free, memory_reserved = self._memory(index, h)
        temperature = nvml.optional(
            "nvmlDeviceGetTemperature", h, nvml.const("NVML_TEMPERATURE_GPU", 0), gpu=index
        )
        power_mw = nvml.optional("nvmlDeviceGetPowerUsage", h, gpu=index)
        limit_mw = nvml.optional("nvmlDeviceGetEnforcedPowerLimit", h, gpu=index)
        energy_mj = nvml.optional("nvmlDeviceGetTotalEnergyConsumption", h, gpu=index)
        sm_mhz = nvml.optional(
            "nvmlDeviceGetClockInfo", h, nvml.const("NVML_CLOCK_SM", 1), gpu=index
        )
        mem_mhz = nvml.optional(
            "nvmlDeviceGetClockInfo", h, nvml.const("NVML_CLOCK_MEM", 2), gpu=index
        )
        remap = nvml.optional("nvmlDeviceGetRemappedRows", h, gpu=index)
        sbe_pages, dbe_pages, pages_pending = self._retired_pages(index, h)
        replay = nvml.optional("nvmlDeviceGetPcieReplayCounter", h, gpu=index)
        return Telemetry(
            gpu_index=index,
            timestamp_s=time.time(),
            utilization_gpu_ratio=utilization.gpu / 100 if utilization is not None else None,
            utilization_memory_ratio=utilization.memory / 100 if utilization is not None else None,
            memory_used_bytes=memory_used,
            memory_free_bytes=memory_free,
            memory_reserved_bytes=memory_reserved,
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
            processes=self.usage(
                index, h, processes if processes is not None else self._processes(index)
            ),
        )
