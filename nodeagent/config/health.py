"""The ``health`` section: the health model, the stability score and node flagging."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HealthSection:
    """Health checks and how long a device must be quiet before it counts as recovered."""

    enabled: bool = True
    recovery_quiet_s: float = 300.0  # a cleared condition must stay clear this long
