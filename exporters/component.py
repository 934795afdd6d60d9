"""The ``metrics`` agent component: observe each snapshot, render what scrapes get, serve it."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TypedDict, Unpack

from nodeagent import labels
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.types import NodeSnapshot
from nodeagent.kube.node_patcher import KubeUnavailableError, make_api
from nodeagent.kube.pods import PodIndexPoller
from nodeagent.runtime.component import Idle
from nodeagent.runtime.devices import PublishedDevices
from nodeagent.runtime.health_source import HealthSource
from nodeagent.runtime.mig import MigLayoutStatus
from nodeagent.runtime.snapshots import SnapshotFeed
from nodeagent.workloads import AttributedProcess, CgroupReader
from nodeagent_exporters.podresources import Allocations, PodResourcesPoller
from nodeagent_exporters.probe import ProbeRunner
from nodeagent_exporters.render import (
    AppXids,
    NodeCapacity,
    Rendered,
    Renderer,
    Sources,
    StepCounts,
)
from nodeagent_exporters.server import MetricsServer, TlsFiles

log = logging.getLogger(__name__)

# Scrape times kept to learn the cadence: Prometheus scrapes a target on a fixed interval (an
# HA pair, two interleaved ones), so the smallest recent gap predicts the next scrape.
SCRAPES_KEPT = 4


class MetricsExporter:
    """Observes every new snapshot on its own thread and renders the ones a scrape will serve.

    The sampler's subscriber callback only wakes this thread, so attribution never delays
    sampling. Samples come every second and scrapes every 15 to 60 s, and rendering is most of
    the exporter's cost, so this thread renders a snapshot ahead only when it may be the newest
    at the next scrape (from the scrape cadence; every snapshot until two scrapes were seen, or
    once a scrape is overdue). A scrape then finds its bytes made; one that comes earlier than
    the cadence said renders the newest snapshot itself (a few milliseconds from memory, no
    NVML). Each snapshot is rendered at most once. ``/readyz`` reports ``ready_check`` (the
    agent passes "every component is ready") when given, else this component's own readiness;
    ``/healthz`` reports ``live_check``.
    """

    name = "metrics"

    def __init__(
        self,
        config: AgentConfig,
        snapshots: SnapshotFeed,
        *,
        health: HealthSource | None = None,
        devices: PublishedDevices | None = None,
        restarts: Mapping[str, int] | None = None,
        ready_check: Callable[[], bool] | None = None,
        live_check: Callable[[], bool] | None = None,
        poller: PodResourcesPoller | None = None,
        mig_status: Callable[[], MigLayoutStatus | None] | None = None,
        started_at_s: float | None = None,
        pod_index: PodIndexPoller | None = None,
        app_xids: AppXids | None = None,
        remediation_steps: StepCounts | None = None,
        validations: Callable[[], Mapping[str, bool]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.pod_index = pod_index
        self.snapshots = snapshots
        self.devices = devices
        self.poller = poller
        self._ready_check = ready_check
        self._live_check = live_check
        cfg = config.metrics
        self.address = cfg.address
        self.tls = None
        if cfg.tls_cert_file is not None and cfg.tls_key_file is not None:
            self.tls = TlsFiles(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file)
        self.renderer = Renderer(
            Sources(
                policy=lambda: self.config.pool,
                health=lambda: health,
                allocations=lambda: self.poller.latest if self.poller else None,
                advertised=self._advertised,
                restarts=restarts if restarts is not None else {},
                pool=lambda: self.config.node.pool,
                mig=mig_status or (lambda: None),
                started_at_s=started_at_s,
                cgroups=CgroupReader(cfg.proc_root) if cfg.process_attribution else None,
                pod_index=lambda: self.pod_index.latest if self.pod_index else None,
                max_workload_series=cfg.max_workload_series,
                probe=lambda: self.probe,
                app_xids=app_xids or dict,
                remediation_steps=remediation_steps or dict,
                validations=validations or dict,
                dcgm_compat=lambda: (
                    self.config.node_name if self.config.metrics.dcgm_compat else None
                ),
            )
        )
        self.probe: ProbeRunner | None = None
        if cfg.probe.enabled:
            self.probe = ProbeRunner(cfg.probe, lambda: [d.device for d in self.renderer.shared])
        self.latest: Rendered | None = None  # the last render, served until a newer snapshot
        self.capacity: NodeCapacity | None = None  # of the newest observed snapshot
        self._observed_generation: int | None = None
        self._clock = clock
        self._scrapes: deque[float] = deque(maxlen=SCRAPES_KEPT)  # clock() of recent scrapes
        # Serialises the renderer between this thread (observe) and the scrapes (render).
        self._lock = threading.Lock()
        self.server: MetricsServer | None = None
        self._prepared: MetricsServer | None = None
        self._wake = threading.Event()

    def reload(self, config: AgentConfig) -> None:
        """Render with the new pool policy from the next snapshot on (SIGHUP)."""
        self.config = config

    def _advertised(self) -> Mapping[str, Mapping[str, bool]] | None:
        """The device plugin's advertised devices, or None when the agent runs no plugin."""
        return self.devices.advertised() if self.devices is not None else None

    @property
    def ready(self) -> bool:
        """Serving, with a first snapshot observed."""
        return self.server is not None and self._observed_generation is not None

    def ready_check(self) -> bool:
        """What ``/readyz`` reports: the whole agent's readiness where known."""
        return self._ready_check() if self._ready_check is not None else self.ready

    def capacity_annotations(self) -> dict[str, str]:
        """The node's capacity as annotations, for the pool review without Prometheus."""
        capacity = self.capacity
        if capacity is None:
            return {}
        out = {
            labels.STRANDED_SLICES_ANNOTATION: str(capacity.stranded_mig_slices),
            labels.STRANDED_GPUS_ANNOTATION: str(capacity.stranded_gpus),
        }
        if capacity.mig_fragmentation_mean is not None:
            # Two decimals: finer changes are noise and would patch the node on every render.
            out[labels.FRAGMENTATION_ANNOTATION] = f"{capacity.mig_fragmentation_mean:.2f}"
        return out

    def processes(self) -> Sequence[AttributedProcess]:
        """The GPU processes of the last render, attributed to pods (the XID attributor's)."""
        return self.renderer.processes

    def allocations(self) -> Allocations | None:
        """The kubelet's last device allocations; None without pod attribution or a poll."""
        return self.poller.latest if self.poller is not None else None

    @property
    def measured(self) -> Renderer:
        """What measures the interference of shared GPUs (the sharing actions read it)."""
        return self.renderer

    def shared_gpus(self) -> dict[str, tuple[float, int]]:
        """GPU UUID -> (interference, workloads) of its worst shared device, last render."""
        out: dict[str, tuple[float, int]] = {}
        for d in self.renderer.shared:
            ratio, count = out.get(d.device.gpu_uuid, (-1.0, 0))
            if d.interference_ratio > ratio:
                out[d.device.gpu_uuid] = (d.interference_ratio, max(count, len(d.workloads)))
            else:
                out[d.device.gpu_uuid] = (ratio, max(count, len(d.workloads)))
        return out

    def live_check(self) -> bool:
        """What ``/healthz`` reports: the agent's liveness (threads up, sampling not wedged)."""
        return self._live_check() if self._live_check is not None else True

    def observe_latest(self) -> None:
        """Take in the newest snapshot (attribution, capacity, counters) if not done yet, and
        render it when the next scrape may serve it."""
        with self._lock:
            newest = self._observe()
            if newest is not None and self._scrape_due_soon():
                self._render(*newest)

    def _scrape_due_soon(self) -> bool:
        """Whether a snapshot published now may still be the newest at the next scrape."""
        if len(self._scrapes) < 2:
            return True  # the cadence is not known yet
        gap = min(later - earlier for earlier, later in itertools.pairwise(self._scrapes))
        # Two sample intervals of margin: the snapshot before the scrape and the one before it
        # (in case the last one is late) are made in advance.
        return self._clock() >= self._scrapes[-1] + gap - 2 * self.config.sampler.interval_s

    def _observe(self) -> tuple[NodeSnapshot, int] | None:
        generation = self.snapshots.generation
        snapshot = self.snapshots.latest
        if snapshot is None:
            return None
        if self._observed_generation != generation:
            self.capacity = self.renderer.observe(snapshot)
            self._observed_generation = generation
        return snapshot, generation

    def render_latest(self) -> Rendered | None:
        """The newest snapshot's exposition: rendered now if it was not yet."""
        with self._lock:
            newest = self._observe()
            if newest is not None:
                self._render(*newest)
            return self.latest

    def serve_latest(self) -> Rendered | None:
        """What a scrape gets (:meth:`render_latest`); the scrape's time teaches the cadence."""
        with self._lock:
            self._scrapes.append(self._clock())
        return self.render_latest()

    def _render(self, snapshot: NodeSnapshot, generation: int) -> None:
        if self.latest is None or self.latest.generation != generation:
            self.latest = self.renderer.render(snapshot, generation)

    def _server(self) -> MetricsServer:
        return MetricsServer(
            self.address,
            self.serve_latest,
            self.ready_check,
            live_check=self.live_check,
            tls=self.tls,
        )

    def prepare(self) -> None:
        """Bind the metrics port before the agent starts anything (OSError when it is taken)."""
        if self._prepared is None:
            server = self._server()
            server.start()
            self._prepared = server

    def unprepare(self) -> None:
        """Close the port :meth:`prepare` bound, when the start is abandoned."""
        if self._prepared is not None:
            self._prepared.stop()
            self._prepared = None

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop``; the HTTP server and the poller stop with it."""
        unsubscribe = self.snapshots.subscribe(lambda _snapshot: self._wake.set())
        poller_stop = threading.Event()
        threads = []
        loops = (
            (self.poller, "podresources"),
            (self.pod_index, "pod-index"),
            (self.probe, "probe"),
        )
        for poller, name in loops:
            if poller is None:
                continue
            thread = threading.Thread(
                target=self._run_poller,
                args=(poller, poller_stop),
                name=f"nodeagent-{name}",
                daemon=True,
            )
            thread.start()
            threads.append(thread)
        # The port bound by prepare() at start; after a crash and restart, bound again here.
        server, self._prepared = self._prepared, None
        if server is None:
            server = self._server()
            server.start()
        self.server = server
        try:
            self.observe_latest()
            while not stop.is_set():
                # The timeout re-checks ``stop`` and catches a snapshot published between
                # subscribe and the first wait.
                if self._wake.wait(1.0):
                    self._wake.clear()
                    self.observe_latest()
        finally:
            unsubscribe()
            self.server = None
            server.stop()
            poller_stop.set()
            for thread in threads:
                thread.join(timeout=5)

    def _run_poller(
        self, poller: PodResourcesPoller | PodIndexPoller | ProbeRunner, stop: threading.Event
    ) -> None:
        while not stop.is_set():
            try:
                poller.run(stop)
            except Exception:
                # The poller is not a supervised component of its own; keep attribution alive
                # without taking the metrics server down with it.
                log.exception("%s poller crashed; restarting in 5s", type(poller).__name__)
                stop.wait(5.0)


class ExporterInputs(TypedDict, total=False):
    """What :func:`build` passes on to :class:`MetricsExporter` from the rest of the agent."""

    health: HealthSource | None
    devices: PublishedDevices | None
    restarts: Mapping[str, int] | None
    ready_check: Callable[[], bool] | None
    live_check: Callable[[], bool] | None
    mig_status: Callable[[], MigLayoutStatus | None] | None
    started_at_s: float | None
    app_xids: AppXids | None
    remediation_steps: StepCounts | None
    validations: Callable[[], Mapping[str, bool]] | None


class NoExporter(Idle):
    """Metrics turned off: no port, nothing rendered, so no processes attributed, no capacity
    annotations and no interference measured (None: not "none shared", nothing measures it).
    Idle, so the agent supervises no thread; not Preparable, so no port is claimed."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(MetricsExporter.name)

    def processes(self) -> Sequence[AttributedProcess]:
        """None attributed: nothing renders."""
        return ()

    def allocations(self) -> Allocations | None:
        """None: the kubelet is not polled."""
        return None

    @property
    def measured(self) -> None:
        """Nothing measures interference."""
        return None

    def shared_gpus(self) -> None:
        """None: unmeasured, which the GPU-state annotation tells apart from "none shared"."""
        return None

    def capacity_annotations(self) -> dict[str, str]:
        """None: capacity is computed by the exporter."""
        return {}


def build(
    config: AgentConfig, snapshots: SnapshotFeed, **inputs: Unpack[ExporterInputs]
) -> MetricsExporter | NoExporter:
    """The metrics component, or one that serves and measures nothing when ``metrics.enabled``
    is false."""
    cfg = config.metrics
    if not cfg.enabled:
        return NoExporter()
    poller = None
    if cfg.pod_attribution:
        poller = PodResourcesPoller(cfg.pod_resources_socket, cfg.pod_resources_interval_s)
    pod_index = None
    kube = config.kubernetes
    if cfg.process_attribution and kube.enabled:
        try:
            api = make_api(kube)
        except KubeUnavailableError as exc:
            log.warning("process attribution without pod names from the API server: %s", exc)
        else:
            pod_index = PodIndexPoller(
                api,
                config.node_name,
                cfg.pod_resources_interval_s,
                request_timeout_s=kube.request_timeout_s,
            )
    return MetricsExporter(config, snapshots, poller=poller, pod_index=pod_index, **inputs)


__all__ = ["ExporterInputs", "MetricsExporter", "NoExporter", "build"]
