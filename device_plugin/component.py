"""The agent component that runs the device plugin (built by :func:`build`)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.types import NodeSnapshot
from nodeagent.runtime.component import Idle
from nodeagent.runtime.health_source import HealthSource
from nodeagent.runtime.snapshots import SnapshotFeed
from nodeagent_device_plugin.manager import POLL_S, PluginManager
from nodeagent_device_plugin.resources import ResourceError

log = logging.getLogger(__name__)

NAME = "device-plugin"
# In the agent's state directory: the devices withheld from the kubelet and since when they are
# clear, so a restart does not shorten their quiet period.
STATE_FILE = Path("device-plugin") / "withheld.json"


def device_layout(snapshot: NodeSnapshot) -> tuple[object, ...]:
    """What of a snapshot decides the advertised devices (not telemetry, which moves always)."""
    return tuple(
        (
            g.info.uuid,
            g.info.mig_enabled,
            tuple((i.profile, tuple(c.uuid for c in i.compute_instances)) for i in g.mig_instances),
        )
        for g in snapshot.gpus
    )


@dataclass(eq=False)
class DevicePluginComponent:
    """Serves the kubelet device plugin API; re-serves on config or MIG layout change."""

    name = NAME

    config: AgentConfig
    directory: Path
    snapshots: SnapshotFeed
    health: HealthSource | None
    manager: PluginManager | None = field(default=None, init=False)
    _pending_config: AgentConfig | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    @property
    def ready(self) -> bool:
        """Serving, and registered with the kubelet when there is one.

        Without a ``kubelet.sock`` (a bare host, or the kubelet not started yet) there is nothing
        to wait for: holding READY back would only make systemd time out and restart the agent.
        Once a kubelet listens, readiness waits for registration, so a rolling update of the
        DaemonSet moves on only after the new agent advertises its devices. After that it holds:
        a resource re-served for a MIG change (GPU by GPU) or a new kubelet registers again
        within a second, and a readiness probe that caught those moments would mark the agent's
        pod NotReady again and again while it serves; the log says when a registration fails.
        """
        manager = self.manager
        if manager is None:
            return False
        registered_once = manager.registration_count > 0  # this manager, any kubelet
        return registered_once or manager.registered or not manager.kubelet_present

    def advertised(self) -> dict[str, dict[str, bool]]:
        """What the plugin serves to the kubelet: resource -> {device ID: healthy}.

        Empty until the plugin serves (no snapshot yet) and after it stops; the exporter reads it
        as a :class:`~nodeagent.runtime.devices.PublishedDevices`.
        """
        manager = self.manager
        return manager.advertised() if manager is not None else {}

    def reload(self, config: AgentConfig) -> None:
        """Take a new config (SIGHUP); applied by the run loop within one tick."""
        with self._lock:
            self._pending_config = config

    def _first_snapshot(self, stop: threading.Event) -> NodeSnapshot | None:
        generation = self.snapshots.generation
        while not stop.is_set():
            latest = self.snapshots.latest
            if latest is not None:
                return latest
            self.snapshots.wait_newer(generation, 0.2)
        return None

    def _refuse_until_changed(
        self, reason: ResourceError, snapshot: NodeSnapshot, stop: threading.Event
    ) -> NodeSnapshot | None:
        """Say once why the plugin cannot serve this node, then wait for something to change.

        A MIG layout the strategy cannot express (``single`` on GPUs in different MIG modes or
        profiles) stays wrong until an operator changes the layout or the strategy, so retrying
        it with backoff only repeats the same error. The next snapshot with another device
        layout, or a reloaded config, is worth another try; ``None`` once ``stop`` is set.
        """
        fix = "it starts once the MIG layout or device_plugin.mig_strategy changes"
        if self.config.device_plugin.fail_on_init_error:
            log.error("device plugin refuses to start: %s; %s", reason, fix)
        else:
            log.warning("device plugin idle (fail_on_init_error: false): %s; %s", reason, fix)
        layout = device_layout(snapshot)
        generation = self.snapshots.generation
        while not stop.is_set():
            with self._lock:
                pending, self._pending_config = self._pending_config, None
            if pending is not None:
                self.config = pending
                return self.snapshots.latest or snapshot
            latest = self.snapshots.wait_newer(generation, POLL_S)
            if latest is None:
                continue
            generation = self.snapshots.generation
            if device_layout(latest) != layout:
                return latest
        return None

    def _start(
        self, snapshot: NodeSnapshot, stop: threading.Event
    ) -> tuple[PluginManager, NodeSnapshot] | None:
        """A serving manager and the snapshot it serves, once the node's layout suits the
        strategy; ``None`` on ``stop``."""
        current: NodeSnapshot | None = snapshot
        while current is not None:
            config = self.config
            manager = PluginManager(
                self.directory,
                config.device_plugin,
                config.pool,
                self.health,
                state_file=config.state_dir / STATE_FILE,
            )
            try:
                manager.start(current)
            except ResourceError as exc:
                manager.shutdown()
                current = self._refuse_until_changed(exc, current, stop)
                continue
            return manager, current
        return None

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop``; a layout the MIG strategy cannot serve waits for a change."""
        first = self._first_snapshot(stop)
        if first is None:
            return
        started = self._start(first, stop)
        if started is None:
            return
        manager, snapshot = started
        config = self.config
        self.manager = manager
        layout = device_layout(snapshot)
        generation = -1  # compare once at the first tick: a snapshot may have come meanwhile
        try:
            while not stop.wait(POLL_S):
                with self._lock:
                    pending, self._pending_config = self._pending_config, None
                # The layout changes only with a new snapshot (once a second), while this loop
                # ticks every 50 ms for kubelet restarts: compare layouts only when one arrived.
                new_generation = self.snapshots.generation
                if pending is None and new_generation == generation:
                    manager.tick()
                    continue
                generation = new_generation
                latest = self.snapshots.latest or snapshot
                new_layout = device_layout(latest)
                if pending is not None or new_layout != layout:
                    config = pending or config
                    self.config = config
                    try:
                        manager.apply(latest, config.pool, config.device_plugin)
                        layout = new_layout
                    except ResourceError as exc:
                        log.error("keeping the advertised devices: %s", exc)
                        layout = new_layout
                manager.tick()
        finally:
            manager.shutdown()
            self.manager = None


@dataclass(slots=True)
class NoDevicePlugin(Idle):
    """The device plugin turned off: no socket, and other features asking it get "no plugin"."""

    def advertised(self) -> None:
        """None, not empty: the agent runs no plugin, so the exporter exports no plugin series."""
        return None

    def reload(self, config: AgentConfig) -> None:
        """Nothing to reload: a sharing action decided with no plugin changes no advertisement."""


def build(
    config: AgentConfig, snapshots: SnapshotFeed, health: HealthSource | None
) -> DevicePluginComponent | NoDevicePlugin:
    """The device plugin component, or an idle one when ``device_plugin.enabled`` is false (no
    socket, nothing advertised; the agent leaves it unsupervised)."""
    section = config.device_plugin
    if not section.enabled:
        return NoDevicePlugin(NAME)
    # gRPC reads ``unix://relative/path`` as a host name: sockets need an absolute path.
    return DevicePluginComponent(config, section.kubelet_dir.absolute(), snapshots, health)
