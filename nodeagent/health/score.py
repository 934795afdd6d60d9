"""The node stability score: a decayed, severity-weighted memory of faults.

Formula (documented in docs/health.md)::

    score(t) = sum_i  w_i * 2 ** (-(t - t_i) / H)

where ``t_i`` is when fault ``i`` began, ``w_i`` its severity weight and ``H`` the half-life
(``health.half_life_s``, default 24 h). The level (stable / degraded / unstable) moves up when the
score reaches an ``*_enter`` threshold and back down only when it falls below the lower
``*_exit`` threshold, so a score hovering around one value does not make the level flip.
Independently, a node whose GPUs change state ``flap_transitions`` times within ``flap_window_s``
is *flapping* and counts as unstable until the count in the window falls below half of that.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # the config's models are not needed to read a history file
    from nodeagent.config.health import HealthSection

# Records whose decayed weight fell below this are dropped: they no longer move the score.
_NEGLIGIBLE = 1e-3
# A hard cap on remembered faults, so a pathological storm cannot grow the file without bound.
_MAX_RECORDS = 5000
_MAX_TRANSITIONS = 10000
HISTORY_VERSION: Final = 1


class StabilityLevel(enum.StrEnum):
    """How stable the node has been lately, best first; ``unknown`` before anything is known.

    ``unknown`` is never the score's own level: the model reports it while it has neither a
    usable history nor a first sample, so a restart never publishes "stable" by default.
    """

    STABLE = "stable"
    DEGRADED = "degraded"
    UNSTABLE = "unstable"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """One fault onset remembered by the score (in the history file under the short names)."""

    time_s: Annotated[float, Field(alias="t", allow_inf_nan=False)]  # wall clock of the onset
    weight: Annotated[float, Field(alias="w", allow_inf_nan=False)]  # see docs/health.md
    gpu_index: Annotated[int, Field(alias="gpu")]
    reason: str


def _known(level: StabilityLevel) -> StabilityLevel:
    if level is StabilityLevel.UNKNOWN:
        raise ValueError("'unknown' is never a saved or published level")
    return level


# The types the history and status files share: a finite number, a level other than unknown.
Finite = Annotated[float, Field(allow_inf_nan=False)]
KnownLevel = Annotated[StabilityLevel, AfterValidator(_known)]


class SavedScore(BaseModel):
    """The score's state as the history file keeps it.

    Strict, as the whole history is: a damaged or hand-edited file fails with the field named
    instead of being half-read. Keys this version does not know are ignored.
    """

    model_config = ConfigDict(strict=True, frozen=True, defer_build=True)

    score_level: KnownLevel = StabilityLevel.STABLE
    flapping: bool = False
    records: tuple[FaultRecord, ...] = ()
    transitions: tuple[Finite, ...] = ()


class StabilityScore:
    """The decayed score, its level with hysteresis, and flapping detection.

    Not thread-safe on its own: the health model calls it under its lock.
    """

    def __init__(self, config: HealthSection) -> None:
        self.config = config
        self.records: list[FaultRecord] = []
        self.transitions: deque[float] = deque(maxlen=_MAX_TRANSITIONS)
        self.score_level = StabilityLevel.STABLE  # the hysteretic level from the score alone
        self.flapping = False

    # --- inputs ------------------------------------------------------------------------------
    def record(self, record: FaultRecord) -> None:
        """Remember a fault onset and re-evaluate the level."""
        if record.weight <= 0:
            return
        self.records.append(record)
        if len(self.records) > _MAX_RECORDS:
            # Keep the heaviest contribution: drop the oldest (least weight after decay).
            del self.records[: len(self.records) - _MAX_RECORDS]
        self.update(record.time_s)

    def transition(self, now_s: float) -> None:
        """Count one device state change (for flapping) and re-evaluate."""
        self.transitions.append(now_s)
        self.update(now_s)

    # --- outputs -----------------------------------------------------------------------------
    def score(self, now_s: float) -> float:
        """The decayed sum of fault weights at ``now_s``."""
        half_life = self.config.half_life_s
        total = 0.0
        for rec in self.records:
            age = max(now_s - rec.time_s, 0.0)
            total += rec.weight * math.pow(2.0, -age / half_life)
        return total

    def transitions_in_window(self, now_s: float) -> int:
        """Device state changes within the flapping window ending at ``now_s``."""
        start = now_s - self.config.flap_window_s
        return sum(1 for t in self.transitions if t > start)

    def level(self, now_s: float) -> StabilityLevel:
        """The node's level: the score's hysteretic level, or unstable while flapping."""
        self.update(now_s)
        return StabilityLevel.UNSTABLE if self.flapping else self.score_level

    def update(self, now_s: float) -> None:
        """Apply the hysteresis rules at ``now_s`` and prune what no longer counts."""
        cfg = self.config
        s = self.score(now_s)
        level = self.score_level
        if level is StabilityLevel.STABLE:
            if s >= cfg.unstable_enter:
                level = StabilityLevel.UNSTABLE
            elif s >= cfg.degraded_enter:
                level = StabilityLevel.DEGRADED
        elif level is StabilityLevel.DEGRADED:
            if s >= cfg.unstable_enter:
                level = StabilityLevel.UNSTABLE
            elif s < cfg.degraded_exit:
                level = StabilityLevel.STABLE
        elif s < cfg.unstable_exit:
            level = StabilityLevel.DEGRADED if s >= cfg.degraded_exit else StabilityLevel.STABLE
        self.score_level = level

        count = self.transitions_in_window(now_s)
        if count >= cfg.flap_transitions:
            self.flapping = True
        elif self.flapping and count < cfg.flap_transitions / 2:
            self.flapping = False
        self._prune(now_s)

    def _prune(self, now_s: float) -> None:
        half_life = self.config.half_life_s
        self.records = [
            r
            for r in self.records
            if r.weight * math.pow(2.0, -max(now_s - r.time_s, 0.0) / half_life) >= _NEGLIGIBLE
        ]
        start = now_s - self.config.flap_window_s
        while self.transitions and self.transitions[0] <= start:
            self.transitions.popleft()

    # --- persistence -------------------------------------------------------------------------
    def saved(self) -> SavedScore:
        """The score's state for the history file."""
        return SavedScore(
            score_level=self.score_level,
            flapping=self.flapping,
            records=tuple(self.records),
            transitions=tuple(self.transitions),
        )

    def restore(self, saved: SavedScore) -> None:
        """Take the state :meth:`saved` wrote."""
        self.score_level = saved.score_level
        self.flapping = saved.flapping
        self.records = list(saved.records)
        self.transitions = deque(saved.transitions, maxlen=_MAX_TRANSITIONS)
