"""The ``health`` section: the health model, the stability score and node flagging."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HealthSection:
    """Health checks, the stability score and how long a device must be quiet to recover."""

    enabled: bool = True
    recovery_quiet_s: float = 300.0  # a cleared condition must stay clear this long
    fatal_hold_s: float = 3600.0  # an XID/DBE needing a reset or worse holds the state this long
    ignore_xids: tuple[int, ...] = ()  # XIDs counted but never changing health
    fatal_xids: tuple[int, ...] = ()  # XIDs that always make the device unhealthy
    ecc_sbe_threshold: int = 100  # corrected ECC errors within sbe_window_s -> degraded
    sbe_window_s: float = 60.0  # window for the corrected-error rate, seconds
    pcie_replay_per_min: float = 60.0  # PCIe replays per minute above which -> degraded
    nvlink_errors_per_min: float = 100.0  # NVLink replay+recovery+CRC errors/min -> degraded
    temperature_margin_celsius: float = 0.0  # degraded at slowdown threshold minus this
    half_life_s: float = 86400.0  # stability score: a fault's weight halves every this long
    degraded_enter: float = 4.0  # score at which the node becomes degraded
    degraded_exit: float = 2.0  # score below which a degraded node becomes stable again
    unstable_enter: float = 12.0  # score at which the node becomes unstable
    unstable_exit: float = 6.0  # score below which an unstable node becomes degraded
    flap_window_s: float = 3600.0  # window for counting device state changes, seconds
    flap_transitions: int = 6  # this many state changes in the window -> flapping (unstable)
    taint_unstable: bool = False  # add NoSchedule taint nodeagent.io/unstable when unstable
    report_interval_s: float = 60.0  # state file / node patch heartbeat, seconds

    def __post_init__(self) -> None:
        for name in ("recovery_quiet_s", "fatal_hold_s", "sbe_window_s", "report_interval_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.half_life_s <= 0:
            raise ValueError(f"half_life_s must be positive, got {self.half_life_s}")
        if not 0 < self.degraded_exit <= self.degraded_enter:
            raise ValueError("need 0 < degraded_exit <= degraded_enter (exit below enter)")
        if not 0 < self.unstable_exit <= self.unstable_enter:
            raise ValueError("need 0 < unstable_exit <= unstable_enter (exit below enter)")
        if self.degraded_enter > self.unstable_enter:
            raise ValueError("degraded_enter must not exceed unstable_enter")
        if self.flap_transitions < 2 or self.flap_window_s <= 0:
            raise ValueError("flap_transitions must be >= 2 and flap_window_s positive")
        both = set(self.ignore_xids) & set(self.fatal_xids)
        if both:
            listed = ", ".join(str(c) for c in sorted(both))
            raise ValueError(f"XIDs {listed} are in both ignore_xids and fatal_xids; keep one")
