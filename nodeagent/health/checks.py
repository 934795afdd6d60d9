"""Checks run on every snapshot: each returns the conditions it sees right now.

A check reports an :class:`Observation` for every condition present in this sample; the health
model keeps a condition active while it is observed and for the quiet period after it stops.
Counter-based checks (ECC, PCIe replay, NVLink errors) look at the increase over a trailing
window rather than a per-sample rate, so two samples taken milliseconds apart do not turn one
replay into an enormous rate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from nodeagent.config.health import HealthSection
from nodeagent.gpu.types import ClockEventReason, GpuState, NodeSnapshot, Telemetry
from nodeagent.health.xids import Action
from nodeagent.runtime.health_source import HealthState

# The clocks-event reasons that mean the hardware or driver slowed the GPU to protect itself
# (the reference notes' list; idle, application clocks, SW power cap and sync boost are normal).
CLOCK_EVENT_SLOWDOWNS: dict[ClockEventReason, str] = {
    ClockEventReason.HW_SLOWDOWN: "hardware slowdown",
    ClockEventReason.SW_THERMAL_SLOWDOWN: "software thermal slowdown",
    ClockEventReason.HW_THERMAL_SLOWDOWN: "hardware thermal slowdown",
    ClockEventReason.HW_POWER_BRAKE_SLOWDOWN: "hardware power brake slowdown",
}


# Conditions of the host rather than of one GPU: seen on every GPU (each device's state shows
# them), counted once per node in the stability score.
NODE_WIDE_KEYS = frozenset({"driver-version"})


@dataclass(frozen=True, slots=True)
class Observation:
    """A condition seen on one GPU (or one MIG GPU instance) at one moment."""

    gpu_index: int
    gpu_uuid: str
    key: str  # stable identity of the condition, e.g. "remap-pending", "xid:79"
    state: HealthState
    reason: str
    action: Action
    fatal: bool = False  # held for health.fatal_hold_s instead of recovery_quiet_s
    gpu_instance_id: int | None = None  # set when the condition belongs to one MIG instance


class WindowCounter:
    """The increase of a monotonic counter over a trailing time window."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now_s: float, value: int) -> int:
        """Record ``value`` at ``now_s`` and return the increase within the window.

        A counter that went backwards (driver reload, counter reset) restarts the window.
        """
        if self._samples and value < self._samples[-1][1]:
            self._samples.clear()
        self._samples.append((now_s, value))
        start = now_s - self.window_s
        # Keep one sample at or before the window start as the baseline.
        while len(self._samples) > 1 and self._samples[1][0] <= start:
            self._samples.popleft()
        return value - self._samples[0][1]


@dataclass
class _GpuHistory:
    sbe: WindowCounter
    replay: WindowCounter
    nvlink: WindowCounter
    dbe_last: int | None = None


class SnapshotChecks:
    """All per-sample checks, with the little history the counter checks need."""

    def __init__(self, config: HealthSection, expected_driver: str | None) -> None:
        self.config = config
        self.expected_driver = expected_driver
        self._history: dict[str, _GpuHistory] = {}
        self.sbe_events: dict[str, deque[float]] = {}  # corrected-error events by GPU UUID

    def note_sbe_event(self, gpu_uuid: str, now_s: float) -> int:
        """Count a corrected-error event; returns the events within the SBE window."""
        events = self.sbe_events.setdefault(gpu_uuid, deque(maxlen=100_000))
        events.append(now_s)
        start = now_s - self.config.sbe_window_s
        while events and events[0] <= start:
            events.popleft()
        return len(events)

    def run(self, snapshot: NodeSnapshot, now_s: float) -> list[Observation]:
        """Every condition present in ``snapshot``."""
        found: list[Observation] = []
        for gpu in snapshot.gpus:
            if not gpu.info.uuid:
                continue  # never read successfully: nothing to key health on
            found.extend(self._gpu(gpu, snapshot, now_s))
        return found

    def _gpu(self, gpu: GpuState, snapshot: NodeSnapshot, now_s: float) -> list[Observation]:
        info = gpu.info

        def obs(
            key: str, state: HealthState, reason: str, action: Action, fatal: bool = False
        ) -> Observation:
            return Observation(info.index, info.uuid, key, state, reason, action, fatal)

        if gpu.lost:
            return [
                obs(
                    "lost",
                    HealthState.LOST,
                    f"GPU lost: {gpu.error or 'stopped answering'}",
                    Action.REBOOT_NODE,
                )
            ]
        out: list[Observation] = []
        if gpu.error is not None or gpu.telemetry is None:
            out.append(
                obs(
                    "nvml-error",
                    HealthState.DEGRADED,
                    f"NVML error: {gpu.error or 'no telemetry'}",
                    Action.DRAIN_INVESTIGATE,
                )
            )
        # NVML reports one driver version per host (nvmlSystemGetDriverVersion), so GPUs of one
        # node cannot disagree through it: the node's version is compared with the pool's. A
        # kernel module that differs from the user-space library fails nvmlInit instead
        # (LIB_RM_VERSION_MISMATCH), which the GPU layer reports as NVML being unusable.
        expected = self.expected_driver
        if expected and snapshot.driver_version != expected:
            out.append(
                obs(
                    "driver-version",
                    HealthState.DEGRADED,
                    f"driver {snapshot.driver_version} differs from the pool's expected {expected}",
                    Action.DRAIN_INVESTIGATE,
                )
            )
        if gpu.telemetry is not None:
            out.extend(self._telemetry(obs, info.uuid, gpu.telemetry, now_s))
        return out

    def _telemetry(self, obs: _Obs, uuid: str, t: Telemetry, now_s: float) -> list[Observation]:
        cfg = self.config
        hist = self._history.get(uuid)
        if hist is None:
            hist = _GpuHistory(
                WindowCounter(cfg.sbe_window_s), WindowCounter(60.0), WindowCounter(60.0)
            )
            self._history[uuid] = hist
        out: list[Observation] = []
        remap = t.remapped_rows
        if remap is not None and remap.failure:
            # An RMA criterion: the GPU ran out of spare rows or remapped a row twice.
            out.append(
                obs(
                    "remap-failure",
                    HealthState.UNHEALTHY,
                    "row remapping failed",
                    Action.DRAIN_INVESTIGATE,
                )
            )
        if remap is not None and remap.pending:
            out.append(
                obs(
                    "remap-pending",
                    HealthState.UNHEALTHY,
                    "row remap pending (takes effect at the next GPU reset)",
                    Action.RESET_GPU,
                )
            )
        if t.retired_pages_pending:
            out.append(
                obs(
                    "retired-pages-pending",
                    HealthState.UNHEALTHY,
                    "retired pages pending (takes effect at the next GPU reset)",
                    Action.RESET_GPU,
                )
            )
        if t.ecc is not None:
            dbe = t.ecc.volatile_uncorrected
            if hist.dbe_last is not None and dbe > hist.dbe_last:
                # Same key as the DBE event, so event and counter count as one fault.
                out.append(
                    obs(
                        "ecc-dbe",
                        HealthState.UNHEALTHY,
                        f"uncorrectable ECC errors: +{dbe - hist.dbe_last}",
                        Action.RESET_GPU,
                        fatal=True,
                    )
                )
            hist.dbe_last = dbe
            counted = hist.sbe.add(now_s, t.ecc.volatile_corrected)
            events = self.sbe_events.get(uuid)
            start = now_s - cfg.sbe_window_s
            from_events = sum(1 for e in events if e > start) if events else 0
            sbe = max(counted, from_events)  # events and counters see the same errors
            if sbe >= cfg.ecc_sbe_threshold:
                out.append(
                    obs(
                        "ecc-sbe-rate",
                        HealthState.DEGRADED,
                        f"{sbe} corrected ECC errors in {cfg.sbe_window_s:g}s",
                        Action.NONE,
                    )
                )
        if t.clock_event_reasons:
            slow = [
                name
                for reason, name in CLOCK_EVENT_SLOWDOWNS.items()
                if t.clock_event_reasons & reason
            ]
            if slow:
                out.append(
                    obs("clock-slowdown", HealthState.DEGRADED, ", ".join(slow), Action.NONE)
                )
        if t.temperature_celsius is not None and t.temperature_slowdown_celsius is not None:
            limit = t.temperature_slowdown_celsius - cfg.temperature_margin_celsius
            if t.temperature_celsius >= limit:
                out.append(
                    obs(
                        "temperature",
                        HealthState.DEGRADED,
                        f"temperature {t.temperature_celsius:g}C at or above the "
                        f"slowdown threshold {t.temperature_slowdown_celsius:g}C",
                        Action.NONE,
                    )
                )
        if t.pcie_replay_count is not None:
            replays = hist.replay.add(now_s, t.pcie_replay_count)
            if replays >= cfg.pcie_replay_per_min:
                out.append(
                    obs(
                        "pcie-replay",
                        HealthState.DEGRADED,
                        f"{replays} PCIe replays in the last minute",
                        Action.DRAIN_INVESTIGATE,
                    )
                )
        down = [link.link for link in t.nvlinks if not link.active]
        if down:
            out.append(
                obs(
                    "nvlink-down",
                    HealthState.UNHEALTHY,
                    f"NVLink down: link {', '.join(str(n) for n in down)}",
                    Action.REBOOT_NODE,
                )
            )
        total = sum(
            (link.replay_errors or 0) + (link.recovery_errors or 0) + (link.crc_flit_errors or 0)
            for link in t.nvlinks
        )
        if t.nvlinks:
            growth = hist.nvlink.add(now_s, total)
            if growth >= cfg.nvlink_errors_per_min:
                out.append(
                    obs(
                        "nvlink-errors",
                        HealthState.DEGRADED,
                        f"{growth} NVLink errors in the last minute",
                        Action.DRAIN_INVESTIGATE,
                    )
                )
        return out


class _Obs(Protocol):
    """Type of the local observation builder (for mypy)."""

    def __call__(
        self, key: str, state: HealthState, reason: str, action: Action, fatal: bool = False
    ) -> Observation: ...
