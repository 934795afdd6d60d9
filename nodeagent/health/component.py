"""The agent's health component: event thread, snapshot checks and the reporter.

The model is built first (:func:`build_model`), on its own, so that the wiring can hand it to
the device plugin and the exporter as their health source before any component runs; the
component (:func:`build`) then runs the event thread and the reporter around it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.errors import GpuLost
from nodeagent.gpu.protocols import EventSource
from nodeagent.gpu.types import GpuEvent
from nodeagent.health.attribution import XidAttributor, XidHit
from nodeagent.health.model import HealthModel
from nodeagent.health.reporter import Reporter
from nodeagent.health.statefile import HEALTH_DIR, history_path, status_path
from nodeagent.health.validation import RESETS_FILE, GpuValidator, StepResult
from nodeagent.kube.events import EventRecorder
from nodeagent.kube.node_patcher import KubeUnavailableError, NodePatcher, make_api
from nodeagent.runtime.component import Idle
from nodeagent.runtime.snapshots import SnapshotFeed
from nodeagent.workloads import AttributedProcess, Device, Workload

log = logging.getLogger(__name__)

EVENT_WAIT_S = 0.5  # how often the event thread looks at the stop flag

Provider = Callable[[], Mapping[str, str]]


class NoXidAttributor:
    """Application XIDs not attributed (health or process attribution off): no pod is named,
    nothing is counted or recorded."""

    recorder: EventRecorder | None = None

    def on_event(self, event: GpuEvent) -> list[XidHit]:
        """Nothing: no attribution."""
        return []

    def counts(self) -> Mapping[tuple[Device, Workload, int], int]:
        """Empty: nothing attributed."""
        return {}

    def run(self, stop: threading.Event) -> None:
        """Nothing to record (``recorder`` is None, so the health component starts no thread)."""


class NoValidator:
    """Remediation off (or health off): no GPU is reset or validated, nothing is counted."""

    def counts(self) -> Mapping[tuple[int, str, str, str], int]:
        """Empty: no step ran."""
        return {}

    def passed(self) -> Mapping[str, bool]:
        """Empty: no GPU was validated."""
        return {}

    def run_once(self) -> list[StepResult]:
        """Nothing to run."""
        return []


class Resettable(Protocol):
    """What the remediation steps need of the GPU layer: a reset."""

    def reset_gpu(self, index: int) -> None:
        """Reset GPU ``index``; raises InUse while processes run."""
        ...


@dataclass(eq=False)
class HealthComponent:
    """Runs the event thread and the reporter; snapshot checks run on the sampler's thread.

    Snapshot checks are cheap (no NVML calls: they read the snapshot), so they run inside the
    sampler's publish callback and a fault seen in a sample is in the model before the next one.
    """

    name = "health"

    model: HealthModel
    events: EventSource
    snapshots: SnapshotFeed
    reporter: Reporter
    xids: XidAttributor | NoXidAttributor = field(default_factory=NoXidAttributor)
    validator: GpuValidator | NoValidator = field(default_factory=NoValidator)
    _ready: threading.Event = field(default_factory=threading.Event, init=False)
    _event_error: BaseException | None = field(default=None, init=False)

    @property
    def ready(self) -> bool:
        """True once the event set is open and one snapshot was checked (or none can come)."""
        return self._ready.is_set()

    def _watch_events(self, stop: threading.Event, opened: threading.Event) -> None:
        try:
            watcher = self.events.watch_events()
        except Exception as exc:  # noqa: BLE001 - re-raised from run() for the supervisor
            self._event_error = exc
            opened.set()
            stop.set()
            return
        opened.set()
        try:
            while not stop.is_set():
                try:
                    event = watcher.wait(EVENT_WAIT_S)
                except GpuLost as exc:
                    # An event from a GPU that just fell off the bus cannot be attributed; the
                    # next snapshot reports the GPU lost, so keep listening for the others.
                    log.warning("event from a lost GPU dropped: %s", exc)
                    continue
                if event is not None:
                    self.model.on_event(event)
                    self.xids.on_event(event)
        except Exception as exc:  # noqa: BLE001 - re-raised from run() for the supervisor
            # Crash the whole component so the supervisor restarts it and counts it.
            self._event_error = exc
            stop.set()
        finally:
            watcher.close()

    def run(self, stop: threading.Event) -> None:
        """Watch events, check snapshots and report until ``stop`` is set."""
        local_stop = threading.Event()
        opened = threading.Event()
        events = threading.Thread(
            target=self._watch_events, args=(local_stop, opened), name="health-events", daemon=True
        )
        events.start()
        unsubscribe = self.snapshots.subscribe(self.model.on_snapshot)
        latest = self.snapshots.latest
        if latest is not None:
            self.model.on_snapshot(latest)
        relay = threading.Thread(
            target=_relay, args=(stop, local_stop, self.reporter.wake), daemon=True
        )
        relay.start()
        helpers = []
        if self.xids.recorder is not None:
            helpers.append(("health-xid-events", self.xids.run))
        if isinstance(self.validator, GpuValidator):  # the null one has no thread to run
            helpers.append(("health-remediation", self.validator.run))
        threads = [
            threading.Thread(target=target, args=(local_stop,), name=name, daemon=True)
            for name, target in helpers
        ]
        for thread in threads:
            thread.start()
        try:
            opened.wait()
            if self._event_error is None:
                self._ready.set()
            self.reporter.run(local_stop)
        finally:
            local_stop.set()
            unsubscribe()
            events.join(timeout=EVENT_WAIT_S * 4)
            for thread in threads:
                thread.join(timeout=EVENT_WAIT_S * 4)
            self._ready.clear()
        if self._event_error is not None and not stop.is_set():
            error, self._event_error = self._event_error, None
            raise RuntimeError(f"health event thread failed: {error}") from error


def _relay(outer: threading.Event, inner: threading.Event, wake: threading.Event) -> None:
    """Set ``inner`` (and ``wake`` the reporter) when ``outer`` is set; end when ``inner`` is."""
    while not inner.is_set():
        if outer.wait(EVENT_WAIT_S):
            inner.set()
            wake.set()


def make_patcher(section: KubernetesSection, node_name: str) -> NodePatcher | None:
    """The node patcher when Kubernetes is enabled, else None (state file only)."""
    if not section.enabled:
        return None
    return NodePatcher(node_name, make_api(section), request_timeout_s=section.request_timeout_s)


def build_model(config: AgentConfig, *, read_only: bool = False) -> HealthModel | None:
    """The health model, with its history in the state directory; None when health is off.

    ``read_only``: a one-shot look (a command) that reads the agent's history and never writes
    or moves its files. None stays the health *source* the features take: to them it means "no
    health output" (no health service, no health series, nothing withheld), not "healthy".
    """
    if not config.health.enabled:
        return None
    model = HealthModel(
        config.health,
        expected_driver=config.pool.expected_driver_version,
        history_path=history_path(config.state_dir),
        status_path=status_path(config.state_dir),
        read_only=read_only,
    )
    model.validation_hold = config.pool.remediation.enabled
    return model


def build_validator(
    config: AgentConfig, model: HealthModel | None, node: Resettable, snapshots: SnapshotFeed
) -> GpuValidator | NoValidator:
    """The remediation-step runner when the pool enables remediation and health runs (``model``
    is not None), else one that runs nothing."""
    policy = config.pool.remediation
    if not policy.enabled or model is None:
        return NoValidator()

    def processes(index: int) -> int:
        latest = snapshots.latest
        for gpu in latest.gpus if latest is not None else ():
            if gpu.info.index == index and gpu.telemetry is not None:
                return len(gpu.telemetry.processes)
        return 0

    return GpuValidator(
        model,
        lambda: policy,
        reset=node.reset_gpu,
        processes=processes,
        recorder=_recorder(config, "remediation steps"),
        resets_file=config.state_dir / HEALTH_DIR / RESETS_FILE,
    )


def _recorder(config: AgentConfig, what: str) -> EventRecorder | None:
    """An Event recorder when Kubernetes is enabled (None otherwise, or when unreachable)."""
    kube = config.kubernetes
    if not kube.enabled:
        return None
    try:
        return EventRecorder(
            make_api(kube), config.node_name, request_timeout_s=kube.request_timeout_s
        )
    except KubeUnavailableError as exc:
        log.warning("%s are logged and counted but not recorded as Events: %s", what, exc)
        return None


def build_attributor(
    config: AgentConfig, processes: Callable[[], Sequence[AttributedProcess]]
) -> XidAttributor | NoXidAttributor:
    """The application-XID attributor, with Events on pods when Kubernetes is enabled; one that
    attributes nothing when health or process attribution is off."""
    if not config.health.enabled or not config.metrics.process_attribution:
        return NoXidAttributor()
    return XidAttributor(processes, _recorder(config, "application XIDs"))


def build(
    config: AgentConfig,
    model: HealthModel | None,
    events: EventSource,
    snapshots: SnapshotFeed,
    *,
    labels: Provider | None = None,
    annotations: Provider | None = None,
    xids: XidAttributor | NoXidAttributor | None = None,
    validator: GpuValidator | NoValidator | None = None,
) -> HealthComponent | Idle:
    """The health component around ``model``; an idle one when health is off (``model`` is
    None): no event thread and no reporter, so no health state file and no node condition.

    ``labels`` and ``annotations`` are what the node carries besides the health flags (the
    capability labels, the exporter's capacity annotations); the reporter publishes them too.
    """
    if model is None:
        return Idle(HealthComponent.name)
    kube = config.kubernetes
    reporter = Reporter(
        model,
        config.state_dir,
        config.node_name,
        patcher=make_patcher(kube, config.node_name),
        retry_initial_s=kube.retry_initial_s,
        retry_max_s=kube.retry_max_s,
        extra_labels=labels,
        extra_annotations=annotations,
    )
    return HealthComponent(
        model,
        events,
        snapshots,
        reporter,
        xids if xids is not None else NoXidAttributor(),
        validator if validator is not None else NoValidator(),
    )
