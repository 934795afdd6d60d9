"""The ``health`` section: the health model, the stability score and node flagging."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, model_validator

from nodeagent.config.errors import FieldError
from nodeagent.config.loader import Schema

DAY_S = 86400.0

# XIDs are small positive codes (NVIDIA documents fewer than 200); 65535 leaves room for new ones.
Xid = Annotated[int, Field(ge=1, le=65535)]
# Score thresholds: a fault weighs 1-10 (see docs/health.md), so a threshold above 10^6 could
# never be reached.
Threshold = Annotated[float, Field(gt=0, le=1e6)]


class HealthSection(Schema):
    """Health checks, the stability score and how long a device must be quiet to recover."""

    # A node leaves a level below the score that made it enter (hysteresis), and degrades
    # before it turns unstable.
    ordered = (
        ("degraded_exit", "degraded_enter"),
        ("unstable_exit", "unstable_enter"),
        ("degraded_enter", "unstable_enter"),
    )

    enabled: bool = Field(True, description="run the health checks, score and reporter")
    recovery_quiet_s: float = Field(
        300.0, ge=0, le=7 * DAY_S, description="a cleared condition must stay clear this long"
    )
    fatal_hold_s: float = Field(
        3600.0,
        ge=0,
        le=30 * DAY_S,
        description="an XID/DBE needing a reset or worse holds the state this long",
    )
    ignore_xids: tuple[Xid, ...] = Field((), description="XIDs counted but never changing health")
    fatal_xids: tuple[Xid, ...] = Field(
        (), description="XIDs that always make the device unhealthy"
    )
    ecc_sbe_threshold: int = Field(
        100, ge=1, le=10**9, description="corrected ECC errors within sbe_window_s -> degraded"
    )
    sbe_window_s: float = Field(
        60.0, ge=1, le=DAY_S, description="window for the corrected-error rate, seconds"
    )
    pcie_replay_per_min: float = Field(
        60.0, gt=0, le=1e9, description="PCIe replays per minute above which -> degraded"
    )
    nvlink_errors_per_min: float = Field(
        100.0, gt=0, le=1e9, description="NVLink replay+recovery+CRC errors/min -> degraded"
    )
    temperature_margin_celsius: float = Field(
        0.0, ge=0, le=50, description="degraded at slowdown threshold minus this"
    )
    half_life_s: float = Field(
        86400.0,
        ge=1,
        le=365 * DAY_S,
        description="stability score: a fault's weight halves every this long",
    )
    degraded_enter: Threshold = Field(4.0, description="score at which the node becomes degraded")
    degraded_exit: Threshold = Field(
        2.0, description="score below which a degraded node becomes stable again"
    )
    unstable_enter: Threshold = Field(12.0, description="score at which the node becomes unstable")
    unstable_exit: Threshold = Field(
        6.0, description="score below which an unstable node becomes degraded"
    )
    flap_window_s: float = Field(
        3600.0, ge=1, le=7 * DAY_S, description="window for counting device state changes, seconds"
    )
    flap_transitions: int = Field(
        6,
        ge=2,
        le=1_000_000,
        description="this many state changes in the window -> flapping (unstable)",
    )
    taint_unstable: bool = Field(
        False, description="add NoSchedule taint nodeagent.io/unstable when unstable"
    )
    # The floor keeps an idle agent idle: each round saves the history and may patch the node,
    # and changes wake the reporter at once anyway, so a shorter heartbeat buys nothing.
    report_interval_s: float = Field(
        60.0, ge=1, le=3600, description="state file / node patch heartbeat, seconds"
    )

    @model_validator(mode="after")
    def _xids_in_one_list(self) -> Self:
        both = set(self.ignore_xids) & set(self.fatal_xids)
        if both:
            listed = ", ".join(str(c) for c in sorted(both))
            found = FieldError()
            found.add(
                "fatal_xids", f"XIDs {listed} are in both ignore_xids and fatal_xids; keep one"
            )
            raise found
        return self
