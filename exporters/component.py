"""The ``metrics`` agent component: render each snapshot once, serve it over HTTP(S)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from nodeagent import labels
from nodeagent.agent.component import AgentContext, Component
from nodeagent.gpu.errors import GpuError
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import MigGeometry
from nodeagent_exporters.podresources import PodResourcesPoller
from nodeagent_exporters.render import Rendered, Renderer, Sources
from nodeagent_exporters.server import MetricsServer, TlsFiles

log = logging.getLogger(__name__)


class GeometryCache:
    """MIG geometry per GPU, read from NVML once per GPU UUID (it is fixed by the model).

    The read happens on the render thread the first time a MIG-enabled GPU is rendered; a
    failure is logged once and that GPU's capacity metrics are left out until it succeeds.
    """

    def __init__(self, node: GpuNode) -> None:
        self._node = node
        self._by_uuid: dict[str, MigGeometry | None] = {}
        self._uuid_by_index: dict[int, str] = {}
        self._warned: set[int] = set()

    def note(self, index: int, uuid: str) -> None:
        """Remember which GPU sits at ``index`` (a replaced GPU gets a new UUID)."""
        self._uuid_by_index[index] = uuid

    def __call__(self, index: int) -> MigGeometry | None:
        uuid = self._uuid_by_index.get(index, str(index))
        if uuid not in self._by_uuid:
            try:
                self._by_uuid[uuid] = self._node.mig_geometry(index)
            except GpuError as exc:  # skip this GPU's capacity metrics, retry next render
                if index not in self._warned:
                    log.warning("cannot read the MIG geometry of GPU %d: %s", index, exc)
                    self._warned.add(index)
                return None
        return self._by_uuid[uuid]


class MetricsExporter:
    """Renders every new snapshot on its own thread and serves the result.

    The sampler's subscriber callback only wakes this thread, so a slow render never delays
    sampling. ``/readyz`` reports ``ctx.all_ready`` (every component of the agent is ready)
    when the agent provides it, else this component's own readiness.
    """

    name = "metrics"

    def __init__(
        self,
        ctx: AgentContext,
        *,
        address: str,
        tls: TlsFiles | None,
        poller: PodResourcesPoller | None,
    ) -> None:
        self.ctx = ctx
        self.address = address
        self.tls = tls
        self.poller = poller
        self.geometry = GeometryCache(ctx.node)
        self.renderer = Renderer(
            Sources(
                geometry=self.geometry,
                policy=lambda: self.ctx.config.pool,
                health=lambda: self.ctx.health,
                allocations=lambda: self.poller.latest if self.poller else None,
                advertised=self._advertised,
                restarts=ctx.restarts,
                pool=lambda: self.ctx.config.node.pool,
            )
        )
        self.latest: Rendered | None = None
        self.server: MetricsServer | None = None
        self._wake = threading.Event()

    def _advertised(self) -> Mapping[str, Mapping[str, bool]] | None:
        """The device plugin's advertised devices (read at render time: it may start later)."""
        advertised = self.ctx.advertised
        return advertised() if advertised is not None else None

    @property
    def ready(self) -> bool:
        """Serving, with a first snapshot rendered."""
        return self.server is not None and self.latest is not None

    def ready_check(self) -> bool:
        """What ``/readyz`` reports: the whole agent's readiness where known."""
        all_ready = self.ctx.all_ready
        return all_ready() if all_ready is not None else self.ready

    def capacity_annotations(self) -> dict[str, str]:
        """The node's capacity as annotations, for the pool review without Prometheus."""
        capacity = self.latest.capacity if self.latest is not None else None
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

    def live_check(self) -> bool:
        """What ``/healthz`` reports: the agent's liveness (threads up, sampling not wedged)."""
        alive = self.ctx.alive
        return alive() if alive is not None else True

    def render_latest(self) -> Rendered | None:
        """Render the newest snapshot if it is newer than the one served."""
        store = self.ctx.snapshots
        generation = store.generation
        snapshot = store.latest
        if snapshot is None or (self.latest is not None and self.latest.generation == generation):
            return self.latest
        for gpu in snapshot.gpus:
            self.geometry.note(gpu.info.index, gpu.info.uuid)
        self.latest = self.renderer.render(snapshot, generation)
        return self.latest

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop``; the HTTP server and the poller stop with it."""
        unsubscribe = self.ctx.snapshots.subscribe(lambda _snapshot: self._wake.set())
        poller_stop = threading.Event()
        poller_thread = None
        if self.poller is not None:
            poller_thread = threading.Thread(
                target=self._run_poller,
                args=(poller_stop,),
                name="nodeagent-podresources",
                daemon=True,
            )
            poller_thread.start()
        server = MetricsServer(
            self.address,
            lambda: self.latest,
            self.ready_check,
            live_check=self.live_check,
            tls=self.tls,
        )
        server.start()
        self.server = server
        try:
            self.render_latest()
            while not stop.is_set():
                # The timeout re-checks ``stop`` and catches a snapshot published between
                # subscribe and the first wait.
                if self._wake.wait(1.0):
                    self._wake.clear()
                    self.render_latest()
        finally:
            unsubscribe()
            self.server = None
            server.stop()
            poller_stop.set()
            if poller_thread is not None:
                poller_thread.join(timeout=5)

    def _run_poller(self, stop: threading.Event) -> None:
        assert self.poller is not None
        while not stop.is_set():
            try:
                self.poller.run(stop)
            except Exception:
                # The poller is not a supervised component of its own; keep attribution alive
                # without taking the metrics server down with it.
                log.exception("pod-resources poller crashed; restarting in 5s")
                stop.wait(5.0)


def build_component(ctx: AgentContext) -> Component | None:
    """The metrics component, or None when ``metrics.enabled`` is false."""
    cfg = ctx.config.metrics
    if not cfg.enabled:
        return None
    tls = None
    if cfg.tls_cert_file is not None and cfg.tls_key_file is not None:
        tls = TlsFiles(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file)
    poller = None
    if cfg.pod_attribution:
        poller = PodResourcesPoller(cfg.pod_resources_socket, cfg.pod_resources_interval_s)
    exporter = MetricsExporter(ctx, address=cfg.address, tls=tls, poller=poller)
    ctx.node_annotations = exporter.capacity_annotations
    return exporter


__all__ = ["GeometryCache", "MetricsExporter", "build_component"]
