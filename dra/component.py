"""The agent component that runs the DRA driver (built by :func:`build`).

It serves the kubelet plugin (:mod:`nodeagent_dra.plugin`) and keeps this node's
ResourceSlices current: after every snapshot, health transition and prepare/unprepare it
builds the slices (:mod:`nodeagent_dra.slices`) and publishes them only when they differ from
what it published last, with the pool generation bumped. Health reaches the slices as device
taints through the health source, whose quiet period decides when a taint goes. The MPS
daemons of prepared claims are restored at start and restarted when they stop answering; they
outlive the agent (the claims' containers use them), so stopping the agent leaves them running.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nodeagent.cdi import CdiWriter
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.protocols import MigDevices
from nodeagent.gpu.types import NodeSnapshot
from nodeagent.holds import HoldSources
from nodeagent.kube.node_patcher import KubeUnavailableError, make_api
from nodeagent.kubelet.drahealth.v1alpha1 import api_pb2 as health_pb
from nodeagent.runtime.backoff import Backoff
from nodeagent.runtime.component import Idle
from nodeagent.runtime.health_source import HealthSource
from nodeagent.runtime.lock import ProcessLock
from nodeagent.runtime.snapshots import SnapshotFeed
from nodeagent_dra.checkpoint import Checkpoint, checkpoint_path
from nodeagent_dra.driver import PROC_CAPABILITIES, Driver, PrepareError
from nodeagent_dra.plugin import PluginServer
from nodeagent_dra.resource_api import ApiClaims, SlicePublisher
from nodeagent_dra.slices import DraDevice, Publication, SliceSpec, build_slices, slice_spec

log = logging.getLogger(__name__)

NAME = "dra"
TICK_S = 1.0  # how often the loop looks again without a wake-up
# How often the stored slices are checked against what was published: the kubelet deletes a
# node's slices when it starts and 30 s after a driver has no plugin connected.
RESYNC_S = 30.0
LOCK_WHAT = "the node's MIG layout"


class _NoApi:
    """The claim source when kubernetes.enabled is off: every claim is an error that says so."""

    def get(self, namespace: str, name: str, timeout_s: float | None = None) -> Any:
        raise PrepareError(
            f"cannot read claim {namespace}/{name}: kubernetes.enabled is off in the agent config"
        )


class DraComponent:
    """The DRA kubelet plugin and the ResourceSlice publisher of this node."""

    name = NAME

    def __init__(
        self,
        config: AgentConfig,
        node: MigDevices,
        snapshots: SnapshotFeed,
        health: HealthSource | None,
        *,
        mig_lock_file: Path,
        api_client: Any | None = None,
        proc_capabilities: Path | None = None,
    ) -> None:
        self.config = config
        section = config.dra
        self.snapshots = snapshots
        self.health = health
        self.api_client = api_client
        self.publisher = (
            SlicePublisher(
                api_client,
                config.node_name,
                section.driver_name,
                config.kubernetes.request_timeout_s,
            )
            if api_client is not None and section.publish_slices
            else None
        )
        self.wake = threading.Event()
        self.published: Publication | None = None
        self.generation = 0
        self._node_uid: str | None = None
        self.driver = Driver(
            node,
            ApiClaims(api_client, config.kubernetes.request_timeout_s)
            if api_client is not None
            else _NoApi(),
            Checkpoint.load(checkpoint_path(config.state_dir)),
            CdiWriter(section.cdi_spec_dir.absolute(), f"k8s.{section.driver_name}"),
            ProcessLock(mig_lock_file, LOCK_WHAT),
            driver_name=section.driver_name,
            pool_name=config.node_name,
            dynamic_mig=config.pool.dra.dynamic_mig,
            state_dir=config.state_dir,
            published=self.published_devices,
            on_change=self.wake.set,
            proc_capabilities=proc_capabilities or PROC_CAPABILITIES,
            # Unprepare keeps an instance another claim or a pod holds (issue 32).
            holds=HoldSources.of_agent(
                config.state_dir,
                config.metrics.pod_resources_socket,
                config.device_plugin.kubelet_dir,
            ).read,
            mps_section=config.device_plugin.mps.model_copy(
                update={"root": section.mps_root.absolute()}
            ),
        )
        self.server = PluginServer(
            self.driver,
            driver_name=section.driver_name,
            registry_dir=section.registry_dir.absolute(),
            plugin_dir=section.plugin_dir.absolute(),
            health=self._health_feed if health is not None else None,
        )
        self._serving = False
        self.resync_s = RESYNC_S
        self._last_snapshot: NodeSnapshot | None = None

    @property
    def ready(self) -> bool:
        """Serving the kubelet plugin sockets."""
        return self._serving

    def prepare(self) -> None:
        """Make the directories of the plugin's sockets and CDI specs before anything runs: one
        the agent cannot create (a path under /proc, a file in the way) ends the start in one
        line instead of a restart loop. Raises OSError naming the directory."""
        section = self.config.dra
        for directory in (section.registry_dir, section.plugin_dir, section.cdi_spec_dir):
            directory.absolute().mkdir(parents=True, exist_ok=True)

    def unprepare(self) -> None:
        """Nothing to give back: the directories stay, as the kubelet's own do."""

    # --- slices -----------------------------------------------------------------------------

    def published_devices(self) -> Mapping[str, DraDevice] | None:
        """The devices this node publishes (what the driver prepares): those of the last
        publication, else of the latest snapshot (the API server was away); None before the
        first snapshot, when the node has published nothing."""
        published = self.published
        if published is not None:
            return published.devices
        snapshot = self._last_snapshot or self.snapshots.latest
        if snapshot is None:
            return None
        return build_slices(snapshot, self.spec(self.generation or 1)).devices

    def spec(self, generation: int) -> SliceSpec:
        """What beyond the snapshot decides the slices now."""
        return slice_spec(
            self.config,
            self.health,
            managed=self.driver.managed(),
            generation=generation,
            node_uid=self._node_uid,
        )

    def refresh(self, snapshot: NodeSnapshot) -> bool:
        """Publish the slices of ``snapshot`` when they changed; whether anything was sent.

        Raises:
            KubeUnavailableError: the API server refused or is away (the loop retries).
        """
        self._last_snapshot = snapshot
        wanted = build_slices(snapshot, self.spec(self.generation or 1))
        if self.published is not None and wanted.content_key() == self.published.content_key():
            return False
        if self.publisher is None:
            self.published = wanted
            self.server.health_changed_now()
            return False
        if self.generation == 0:
            self.generation = self.publisher.generation()
            self._node_uid = self.publisher.node_uid()
        self.generation += 1
        wanted = build_slices(snapshot, self.spec(self.generation))
        self.publisher.publish(wanted.slices)
        self.published = wanted
        self.server.health_changed_now()
        devices = sum(len(s["spec"].get("devices", [])) for s in wanted.slices)
        log.info(
            "published %d ResourceSlices (%d devices) for node %s, pool generation %d",
            len(wanted.slices),
            devices,
            self.config.node_name,
            self.generation,
        )
        return True

    def resync(self) -> bool:
        """Publish again when the stored slices are not the ones published last (someone, the
        kubelet at its start say, deleted or changed them); whether anything was sent.

        Raises:
            KubeUnavailableError: the API server refused or is away.
        """
        if self.publisher is None or self.published is None:
            return False
        stored = {
            s["metadata"]["name"]: s["spec"]["pool"]["generation"] for s in self.publisher.current()
        }
        wanted = {s["metadata"]["name"]: self.generation for s in self.published.slices}
        if stored == wanted:
            return False
        log.warning(
            "ResourceSlices of node %s changed behind the driver's back; publishing again",
            self.config.node_name,
        )
        self.published = None
        snapshot = self._last_snapshot or self.snapshots.latest
        return snapshot is not None and self.refresh(snapshot)

    def _health_feed(self) -> dict[tuple[str, str], tuple[int, str]]:
        """KEP-4680: every published device, unhealthy where it carries a NoSchedule taint."""
        published = self.published
        out: dict[tuple[str, str], tuple[int, str]] = {}
        if published is None:
            return out
        for s in published.slices:
            pool = s["spec"]["pool"]["name"]
            for d in s["spec"].get("devices", []):
                bad = [t for t in d.get("taints", []) if t["effect"] == "NoSchedule"]
                state = health_pb.UNHEALTHY if bad else health_pb.HEALTHY
                out[(pool, d["name"])] = (state, bad[0]["value"] if bad else "")
        return out

    # --- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Serve the plugin and keep the slices current until ``stop``."""
        unsubscribe = [self.snapshots.subscribe(lambda _s: self.wake.set())]
        if self.health is not None:
            unsubscribe.append(self.health.subscribe(lambda _t: self.wake.set()))
        kube = self.config.kubernetes
        backoff = Backoff(kube.retry_initial_s, kube.retry_max_s)
        # Daemons of claims prepared before a restart: their containers still talk to them.
        self.driver.restore_mps()
        self.server.start()
        self._serving = True
        checked = time.monotonic()
        try:
            while not stop.is_set():
                self.driver.check_mps()
                snapshot = self.snapshots.latest
                wait = TICK_S
                if snapshot is not None:
                    try:
                        self.refresh(snapshot)
                        if time.monotonic() - checked >= self.resync_s:
                            checked = time.monotonic()
                            self.resync()
                        backoff.succeed()
                    except KubeUnavailableError as exc:
                        wait = backoff.fail()
                        log.warning("ResourceSlices not published (retry in %.1fs): %s", wait, exc)
                self.wake.wait(wait)
                self.wake.clear()
        finally:
            for undo in unsubscribe:
                undo()
            self._serving = False
            self.server.stop()


def build(
    config: AgentConfig,
    node: MigDevices,
    snapshots: SnapshotFeed,
    health: HealthSource | None,
    *,
    mig_lock_file: Path,
) -> DraComponent | Idle:
    """The DRA component, or an idle one when ``dra.enabled`` is false (no socket, no slices;
    the agent leaves it unsupervised)."""
    if not config.dra.enabled:
        return Idle(NAME)
    api_client = None
    if config.kubernetes.enabled:
        try:
            api_client = make_api(config.kubernetes).api_client
        except KubeUnavailableError as exc:
            log.error("DRA driver without the API server: %s", exc)
    return DraComponent(
        config, node, snapshots, health, mig_lock_file=mig_lock_file, api_client=api_client
    )
