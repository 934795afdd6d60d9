"""Device health as the plugin advertises it, fed only by a :class:`HealthSource`.

The plugin has no NVML code: it subscribes to the health model's transitions. A device that
becomes unschedulable is Unhealthy at once; one that recovers stays Unhealthy until it has been
clear for a quiet period, so a flapping GPU does not bounce in and out of node capacity (and,
unlike NVIDIA's plugin, it does come back without a plugin restart).

The devices it withholds, and since when each has been clear, are kept in a small state file:
a restart never shortens a quiet period. A device withheld at shutdown that the health source
reports schedulable at start waits out the rest of its quiet period, or a whole one when it was
still faulty at shutdown (on doubt, hold).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.atomicfile import write_json_atomic
from nodeagent.runtime.health_source import HealthSource, HealthState, HealthTransition

log = logging.getLogger(__name__)

Clock = Callable[[], float]
STATE_VERSION = 1


@dataclass(eq=False)
class HealthTracker:
    """Which UUIDs (GPU or MIG) are unhealthy, with recovery after a quiet period.

    ``on_change`` is called (from the health thread or :meth:`poll`) whenever the answer of
    :meth:`reason` may have changed for some UUID. ``state_file`` keeps the withheld devices
    across restarts (``clock`` paces the quiet period, ``wall`` dates it in the file).
    """

    quiet_s: float
    on_change: Callable[[], None]
    clock: Clock = time.monotonic
    _: KW_ONLY
    state_file: Path | None = None
    wall: Clock = time.time
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # uuid -> reason, while unschedulable or quiet
    _bad: dict[str, str] = field(default_factory=dict, init=False)
    _clear_since: dict[str, float] = field(default_factory=dict, init=False)  # uuid -> cleared at
    _where: dict[str, str] = field(default_factory=dict, init=False)  # uuid -> "GPU n" for the log
    _unsubscribe: Callable[[], None] | None = field(default=None, init=False)

    def attach(self, source: HealthSource | None) -> None:
        """Take the source's current health and the saved quiet periods, then follow it."""
        self.detach()
        if source is None:
            return
        self._unsubscribe = source.subscribe(self._on_transition)
        saved = self._load()
        for uuid, health in source.device_health().items():
            self._where[uuid] = f"GPU {health.gpu_index}"
            if not health.state.schedulable:
                self.set_state(uuid, health.state, health.reasons, initial=True)
            elif uuid in saved:
                self._resume_quiet(uuid, saved[uuid])
        self._save()
        self.on_change()

    def _resume_quiet(self, uuid: str, cleared_at: float | None) -> None:
        """A device withheld before the restart, schedulable now: the rest of its quiet period."""
        now, wall = self.clock(), self.wall()
        # Withheld while still faulty at shutdown: its fault cleared at some point since, so
        # the whole quiet period starts now.
        clear_since = now if cleared_at is None else now - max(0.0, wall - cleared_at)
        if now - clear_since >= self.quiet_s:
            return
        with self._lock:
            self._clear_since[uuid] = clear_since
            self._bad[uuid] = f"recovering: clear for less than {self.quiet_s:g}s"
        left = self.quiet_s - (now - clear_since)
        log.info(
            "device plugin: %s (%s) was withheld before the restart; advertised again in %.0fs",
            self._where.get(uuid, "GPU ?"),
            uuid,
            left,
        )

    def detach(self) -> None:
        """Stop following the source."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _on_transition(self, transition: HealthTransition) -> None:
        current = transition.current
        self._where[current.uuid] = f"GPU {current.gpu_index}"
        if self.set_state(current.uuid, current.state, current.reasons):
            self.on_change()

    def set_state(
        self,
        uuid: str,
        state: HealthState,
        reasons: tuple[str, ...] = (),
        *,
        initial: bool = False,
    ) -> bool:
        """Record a device's state; returns whether the advertised answer changed.

        A device that is schedulable when first seen (``initial``) needs no quiet period.
        """
        now = self.clock()
        where = f"{self._where.get(uuid, 'GPU ?')} ({uuid})"
        with self._lock:
            was_bad = uuid in self._bad
            if not state.schedulable:
                reason = f"{state.value}: {'; '.join(reasons)}" if reasons else state.value
                withdrawn = not was_bad
                self._bad[uuid] = reason
                self._clear_since.pop(uuid, None)
            elif not was_bad or uuid in self._clear_since:
                return False
            elif initial or self.quiet_s == 0:
                del self._bad[uuid]
                withdrawn = False
            else:
                self._clear_since[uuid] = now
                self._bad[uuid] = f"recovering: clear for less than {self.quiet_s:g}s"
                withdrawn = False
        if not state.schedulable:
            if withdrawn:
                log.warning("device plugin: %s withdrawn from the kubelet: %s", where, reason)
        elif uuid in self._clear_since:
            log.info(
                "device plugin: %s fault cleared; advertised again after %gs without a fault",
                where,
                self.quiet_s,
            )
        else:
            log.info("device plugin: %s advertised Healthy again", where)
        self._save()
        return True

    def poll(self) -> bool:
        """Let devices whose quiet period has passed recover; returns whether any did."""
        now = self.clock()
        recovered = []
        with self._lock:
            for uuid, since in list(self._clear_since.items()):
                if now - since >= self.quiet_s:
                    del self._clear_since[uuid]
                    self._bad.pop(uuid, None)
                    recovered.append(uuid)
        for uuid in recovered:
            log.info(
                "device plugin: %s (%s) advertised Healthy again after %gs quiet",
                self._where.get(uuid, "GPU ?"),
                uuid,
                self.quiet_s,
            )
        if recovered:
            self._save()
            self.on_change()
        return bool(recovered)

    def reason(self, *uuids: str) -> str | None:
        """Why the first unhealthy of ``uuids`` is unhealthy, or None when all are healthy."""
        with self._lock:
            for uuid in uuids:
                reason = self._bad.get(uuid)
                if reason is not None:
                    return reason
        return None

    # --- the state file -----------------------------------------------------------------------
    def _save(self) -> None:
        if self.state_file is None:
            return
        now, wall = self.clock(), self.wall()
        with self._lock:
            cleared = {u: wall - (now - since) for u, since in self._clear_since.items()}
            withheld = {u: {"cleared_at_s": cleared.get(u)} for u in sorted(self._bad)}
        try:
            write_json_atomic(self.state_file, {"version": STATE_VERSION, "withheld": withheld})
        except OSError as exc:
            log.error("cannot write %s: %s", self.state_file, exc)

    def _load(self) -> dict[str, float | None]:
        """uuid -> when its fault cleared (None: still faulty) for the devices withheld before."""
        if self.state_file is None:
            return {}
        try:
            data: Any = json.loads(self.state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            # On doubt, hold: an unreadable file cannot say which devices may come back, so
            # every device that recovers meets a quiet period anyway (a fault comes first).
            log.error("ignoring %s: %s", self.state_file, exc)
            return {}
        withheld = data.get("withheld") if isinstance(data, dict) else None
        if not isinstance(withheld, dict):
            log.error("ignoring %s: not a device-plugin state file", self.state_file)
            return {}
        out: dict[str, float | None] = {}
        for uuid, entry in withheld.items():
            cleared = entry.get("cleared_at_s") if isinstance(entry, dict) else None
            out[str(uuid)] = float(cleared) if isinstance(cleared, int | float) else None
        return out
