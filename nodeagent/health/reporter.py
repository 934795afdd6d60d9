"""The reporter: turns the model's state into the state file and the node's Kubernetes flags.

It runs on the health component's thread, woken at once by any change in the model and at
least every ``health.report_interval_s``. While the API server is unreachable it retries with
exponential backoff (``kubernetes.retry_initial_s`` doubling to ``retry_max_s``); the state
file and the history are written regardless. A write that fails (a full disk, a directory in the
file's place) is logged once per change of state (``HealthModel.write_faults``), never as a
traceback; the last good file stays and every report retries.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from nodeagent import labels as lbl
from nodeagent.atomicfile import StateFileError
from nodeagent.config.health import HealthSection
from nodeagent.health.model import HealthModel, NodeHealth
from nodeagent.health.score import StabilityLevel
from nodeagent.health.statefile import node_reasons, status_path, write_status
from nodeagent.kube.node_patcher import KubeUnavailableError, NodeFlags, NodePatcher
from nodeagent.runtime.backoff import Backoff
from nodeagent.runtime.health_source import HealthState

log = logging.getLogger(__name__)

_REASONS = {
    HealthState.HEALTHY: "GPUsHealthy",
    HealthState.DEGRADED: "GPUDegraded",
    HealthState.UNHEALTHY: "GPUUnhealthy",
    HealthState.LOST: "GPULost",
}


def desired_flags(
    health: NodeHealth,
    config: HealthSection,
    extra_labels: Mapping[str, str] | None = None,
    extra_annotations: Mapping[str, str] | None = None,
) -> NodeFlags:
    """The condition, labels, annotations and taint that describe ``health``.

    ``extra_labels`` / ``extra_annotations`` (capability labels, capacity annotations) are
    published alongside; the health facts win where a key is in both.
    """
    worst = health.worst
    reasons = node_reasons(health)
    actions = sorted({d.action for d in health.devices if d.reasons and d.action != "none"})
    if reasons:
        message = "; ".join(reasons)
        if actions:
            message += f" (action: {', '.join(actions)})"
    else:
        message = "all GPUs healthy"
    message += f"; stability {health.level.value}, score {health.score:.1f}"
    labels = dict(extra_labels or {})
    labels[lbl.GPU_HEALTH] = worst.value
    labels[lbl.STABILITY] = health.level.value
    if health.driver_version:
        labels[lbl.DRIVER_VERSION] = lbl.label_value(health.driver_version)
    annotations = dict(extra_annotations or {})
    annotations[lbl.STABILITY_SCORE_ANNOTATION] = f"{health.score:.1f}"
    annotations[lbl.HEALTH_REASONS_ANNOTATION] = json.dumps(reasons)
    return NodeFlags(
        healthy=worst.schedulable,
        reason=_REASONS[worst],
        message=message,
        labels=tuple(sorted(labels.items())),
        annotations=tuple(sorted(annotations.items())),
        taint=config.taint_unstable and health.level is StabilityLevel.UNSTABLE,
    )


@dataclass(eq=False)
class Reporter:
    """Writes the state file and history, and patches the node when it runs in Kubernetes."""

    model: HealthModel
    state_dir: Path
    node_name: str
    _: KW_ONLY
    patcher: NodePatcher | None = None
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0
    extra_labels: Callable[[], Mapping[str, str]] | None = None
    extra_annotations: Callable[[], Mapping[str, str]] | None = None
    wake: threading.Event = field(default_factory=threading.Event, init=False)
    _backoff: Backoff = field(init=False)
    _retry_at: float = field(default=0.0, init=False)
    _last_error: str | None = field(default=None, init=False)
    _last_status: tuple[object, ...] | None = field(default=None, init=False)
    _last_written: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._backoff = Backoff(self.retry_initial_s, self.retry_max_s)

    @property
    def failures(self) -> int:
        """Consecutive failed patches."""
        return self._backoff.failures

    def report_once(self) -> float:
        """Write what changed; returns how long to wait before the next attempt (seconds)."""
        health = self.model.node_health()
        interval = self.model.config.report_interval_s
        self.model.save()
        if not health.known:
            # Nothing restored and nothing sampled yet: publishing now would say "stable" and
            # "healthy" about a node nobody looked at. The first sample comes within a second.
            return min(interval, 1.0)
        # The state file carries the time of writing, so rewrite on change or on heartbeat.
        key = (
            health.level,
            round(health.score, 1),
            health.flapping,
            health.devices,
            health.driver_version,
        )
        now = time.monotonic()
        if key != self._last_status or now - self._last_written >= interval:
            try:
                write_status(self.state_dir, health, self.node_name)
            except StateFileError as exc:
                # Logged once per change; the old file stays, and the next report retries.
                self.model.write_faults.failed(exc)
            else:
                self.model.write_faults.succeeded(status_path(self.state_dir))
                self._last_status = key
                self._last_written = now
        if self.patcher is None:
            return interval
        if now < self._retry_at:
            return self._retry_at - now
        try:
            flags = desired_flags(
                health,
                self.model.config,
                self.extra_labels() if self.extra_labels else None,
                self.extra_annotations() if self.extra_annotations else None,
            )
            self.patcher.apply(flags)
        except KubeUnavailableError as exc:
            delay = self._backoff.fail()
            if str(exc) != self._last_error:  # log each distinct failure once
                log.warning(
                    "cannot flag node %s (retrying, every %.1fs at most %.0fs): %s",
                    self.node_name,
                    delay,
                    self.retry_max_s,
                    exc,
                )
                self._last_error = str(exc)
            self._retry_at = now + delay
            return delay
        if self.failures:
            log.info("API server reachable again; node %s flags caught up", self.node_name)
        self._backoff.succeed()
        self._last_error = None
        return interval

    def run(self, stop: threading.Event, *, tick: float = 1.0) -> None:
        """Report on every change and heartbeat until ``stop``; expire faults every ``tick``."""
        remove = self.model.add_listener(self.wake.set)
        try:
            while not stop.is_set():
                self.wake.clear()
                wait = self.report_once()
                self.wake.wait(min(wait, tick))
                self.model.tick()
        finally:
            remove()
            self.model.save(final=True)
