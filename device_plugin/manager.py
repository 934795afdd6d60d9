"""The plugin manager: every resource server, registration, kubelet restarts, health, reload.

One loop (``tick`` every ``POLL_S``) watches the device-plugin directory with plain ``stat``
calls: a new ``kubelet.sock`` (a restarted kubelet) makes every plugin register again, and a
server whose socket was deleted is served again at once. Registration is retried with
exponential backoff. Health changes from the health source are pushed to ListAndWatch streams
from the health thread itself, so they do not wait for the loop.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from nodeagent.config.device_plugin import DeviceListStrategy, DevicePluginSection
from nodeagent.config.pool_policy import PoolPolicy, SharingMode
from nodeagent.gpu.types import NodeSnapshot
from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from nodeagent.runtime.backoff import Backoff
from nodeagent.runtime.health_source import HealthSource
from nodeagent.runtime.mps import MpsPaths, MpsSupervisor, MpsTarget
from nodeagent_device_plugin.cdi import CdiSpecs
from nodeagent_device_plugin.front import Front, FrontError
from nodeagent_device_plugin.preferred import ScoreTable
from nodeagent_device_plugin.resources import PluginDevice, Resource, build_resources, summarize
from nodeagent_device_plugin.server import FrontLink, ResourceServer, ServingContext, options
from nodeagent_device_plugin.withheld import HealthTracker

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
POLL_S = 0.2  # directory checks: a kubelet restart is noticed within this (re-register < 1 s)
REGISTER_TIMEOUT_S = 2.0
VANISH_DELIVERY_S = 1.0  # how long a vanished resource waits for its zero-device list to go out
# A resource re-served on its socket registers again only after this. Kubelet 1.37 refuses a
# registration on a socket path whose previous stream it has not yet seen end ("device plugin
# already connected"), and that refusal also drops its handle on the old stream, so the stale
# endpoint is never removed and every later registration of that path fails until the kubelet
# restarts (seen on a real kubelet in tests/real_kubelet). The kubelet sees a stopped server's
# stream end within milliseconds; this leaves it ample time.
REREGISTER_AFTER_STOP_S = 0.5


@dataclass
class _Registration:
    """Registration state of one resource server."""

    backoff: Backoff  # the delay before the next attempt; back to the start after a success
    registered: bool = False
    next_attempt: float = 0.0
    failures: int = 0  # failed attempts with this kubelet (for status and the log)
    last_error: str | None = None


class PluginManager:
    """Serves every resource of the node and keeps them registered with the kubelet."""

    def __init__(
        self,
        directory: Path,
        section: DevicePluginSection,
        pool: PoolPolicy,
        health: HealthSource | None,
        *,
        state_file: Path | None = None,
    ) -> None:
        self.directory = directory
        self.section = section
        self.pool = pool
        self._lock = threading.RLock()
        self.servers: dict[str, ResourceServer] = {}
        self.registrations: dict[str, _Registration] = {}
        self.registration_count = 0  # successful Register calls (for status and tests)
        self._kubelet_identity: tuple[int, int, int] | None = None
        self.health = HealthTracker(
            section.health_recovery_quiet_s, self.refresh, state_file=state_file
        )
        self.mps = MpsSupervisor(section.mps, self.refresh)
        self.cdi = CdiSpecs()
        self._table = ScoreTable({})
        self._health_source = health
        self._ctx = self._serving_context()
        self.front: FrontLink | None = None  # set by start() when allocate_front is configured

    # --- serving context ----------------------------------------------------------------------
    def _serving_context(self) -> ServingContext:
        return ServingContext(self.section, self._table, self.unhealthy, self.mps_paths)

    def unhealthy(self, device: PluginDevice) -> str | None:
        """Why a device is advertised Unhealthy (its GPU or MIG device, or its MPS daemon)."""
        reason = self.health.reason(device.gpu_uuid, device.uuid)
        if reason is None and device.sharing.mode is SharingMode.MPS and device.shared:
            reason = self.mps.reason(device.gpu_uuid)
        return reason

    def mps_paths(self, gpu_uuid: str) -> MpsPaths | None:
        """MPS mounts for containers on ``gpu_uuid`` (None unless it is shared through MPS)."""
        return self.mps.paths(gpu_uuid)

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self, snapshot: NodeSnapshot) -> None:
        """Serve the snapshot's resources and register them (retrying in :meth:`tick`)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.section.allocate_front is not None:
            self.front = self._start_front(self.section.allocate_front)
        self._kubelet_identity = self._kubelet_stat()
        self.health.attach(self._health_source)
        self.apply(snapshot, self.pool, self.section)

    def apply(self, snapshot: NodeSnapshot, pool: PoolPolicy, section: DevicePluginSection) -> None:
        """Adopt a new snapshot or config; re-serve only resources whose devices changed.

        A resource that vanished is first advertised with zero devices, so the node's capacity
        drops to zero before its server stops (the kubelet would otherwise keep the stale count).
        Raises ResourceError when the node breaks the MIG strategy's rules.
        """
        resources = build_resources(snapshot, pool, section)
        numa = {g.info.index: g.info.numa_node for g in snapshot.gpus}
        with self._lock:
            if section.kubelet_dir != self.section.kubelet_dir:
                log.warning("kubelet_dir changes take effect at the next agent start")
            if section.allocate_front != self.section.allocate_front:
                log.warning("allocate_front changes take effect at the next agent start")
            self.pool, self.section = pool, section
            self.health.quiet_s = section.health_recovery_quiet_s
            self._table = ScoreTable.from_topology(snapshot.topology, numa)
            self._ctx = self._serving_context()
            self.mps.section = section.mps
            self.mps.sync(self._mps_targets(snapshot, resources))
            cdi = DeviceListStrategy.CDI in section.strategies
            self.cdi.sync(section, resources if cdi else {}, self.mps_paths)
            for name in list(self.servers):
                if name not in resources:
                    self._retire(name)
            for name, resource in resources.items():
                server = self.servers.get(name)
                if server is not None:
                    server.service.ctx = self._ctx
                    if server.service.resource == resource:
                        server.service.refresh()
                        continue
                    server.stop()
                    self._serve(resource, register_after_s=REREGISTER_AFTER_STOP_S)
                else:
                    self._serve(resource)
        log.info("device plugin resources: %s", summarize(resources))

    def _mps_targets(
        self, snapshot: NodeSnapshot, resources: Mapping[str, Resource]
    ) -> dict[str, MpsTarget]:
        memory = {g.info.uuid: g.info.memory_total_bytes // (1 << 20) for g in snapshot.gpus}
        targets: dict[str, MpsTarget] = {}
        for resource in resources.values():
            for device in resource.devices:
                if device.sharing.mode is SharingMode.MPS and device.shared:
                    targets[device.gpu_uuid] = MpsTarget.for_gpu(
                        device.gpu_uuid, device.gpu_index, device.sharing, memory[device.gpu_uuid]
                    )
        return targets

    # --- the Allocate front ------------------------------------------------------------------
    @staticmethod
    def _start_front(program: Path) -> FrontLink | None:
        front = Front(program)
        try:
            front.start()
        except FrontError as exc:
            log.error("Allocate front: %s; the agent answers Allocate itself", exc)
            return None
        upstream = Path(tempfile.mkdtemp(prefix="nodeagent-device-plugin-"))
        return FrontLink(front, upstream)

    def _drop_front(self, reason: str) -> None:
        """Serve every socket without the front (it failed): Allocate is answered in Python."""
        link, self.front = self.front, None
        if link is None:
            return
        log.error(
            "Allocate front out of service (%s); the agent serves every resource itself now",
            reason,
        )
        link.front.stop()
        for name, server in self.servers.items():
            server.front = None
            server.start()
            self.registrations[name] = self._registration()
            # The kubelet must first see the old stream end (see REREGISTER_AFTER_STOP_S).
            self.registrations[name].next_attempt = time.monotonic() + REREGISTER_AFTER_STOP_S
        shutil.rmtree(link.upstream_dir, ignore_errors=True)

    def _serve(self, resource: Resource, register_after_s: float = 0.0) -> None:
        server = ResourceServer(self.directory, resource, self._ctx, self.front)
        try:
            server.start()
        except FrontError as exc:
            self._drop_front(f"{resource.name}: {exc}")
            server.front = None
            server.start()
        self.servers[resource.name] = server
        self.registrations[resource.name] = self._registration()
        if self.kubelet_present and register_after_s > 0:
            # tick() registers it when due (see REREGISTER_AFTER_STOP_S).
            self.registrations[resource.name].next_attempt = time.monotonic() + register_after_s
        elif self.kubelet_present:
            self._register(resource.name)
        else:
            # Registered by the loop as soon as kubelet.sock appears; nothing to retry before.
            log.info(
                "%s: serving; no kubelet.sock in %s yet, registering when it appears",
                resource.name,
                self.directory,
            )

    def _retire(self, name: str) -> None:
        server = self.servers.pop(name)
        self.registrations.pop(name, None)
        server.service.set_resource(Resource(name, ()))
        if not server.service.wait_delivered(VANISH_DELIVERY_S):
            log.warning("%s: the kubelet did not take the empty device list in time", name)
        server.stop()
        log.info("%s: no devices left; stopped serving it", name)

    def advertised(self) -> dict[str, dict[str, bool]]:
        """What every resource server advertises now: resource -> {device ID: healthy}.

        Reads without the manager's lock: ``apply`` can hold it for up to a second while a
        vanished resource drains, and the exporter's render thread must not wait on that. Copying
        the dict is atomic under the GIL, and each server's list is read under its own lock.
        """
        servers = dict(self.servers)
        return {name: server.service.advertised() for name, server in sorted(servers.items())}

    def refresh(self) -> None:
        """Re-evaluate health on every server; streams get the list if it changed."""
        for server in list(self.servers.values()):
            server.service.refresh()

    def shutdown(self) -> None:
        """Stop every server (sockets removed), the MPS daemons and the health subscription."""
        with self._lock:
            self.health.detach()
            for server in self.servers.values():
                server.stop()
            self.servers.clear()
            if self.front is not None:
                self.front.front.stop()
                shutil.rmtree(self.front.upstream_dir, ignore_errors=True)
                self.front = None
            self.mps.stop_all()

    # --- registration and the kubelet watch ---------------------------------------------------
    def _registration(self) -> _Registration:
        """A fresh registration state: the next attempt is due at once."""
        backoff = Backoff(self.section.register_retry_initial_s, self.section.register_retry_max_s)
        return _Registration(backoff)

    def _kubelet_stat(self) -> tuple[int, int, int] | None:
        try:
            st = (self.directory / KUBELET_SOCKET).stat()
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino, st.st_ctime_ns)

    def _register(self, name: str) -> None:
        state = self.registrations[name]
        server = self.servers[name]
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=server.socket_path.name,
            resource_name=name,
            options=options(),
        )
        target = f"unix://{self.directory / KUBELET_SOCKET}"
        try:
            with grpc.insecure_channel(target) as channel:
                api_pb2_grpc.RegistrationStub(channel).Register(
                    request, timeout=REGISTER_TIMEOUT_S, wait_for_ready=False
                )
        except grpc.RpcError as exc:
            state.registered = False
            state.failures += 1
            delay = state.backoff.fail()
            state.next_attempt = time.monotonic() + delay
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            state.last_error = f"{exc.code().name if isinstance(exc, grpc.Call) else ''} {detail}"
            log.warning(
                "%s: registration with the kubelet failed (%s); retry %d in %.1fs",
                name,
                state.last_error.strip(),
                state.failures,
                delay,
            )
            return
        state.registered = True
        state.backoff.succeed()
        state.last_error = None
        self.registration_count += 1
        log.info("%s: registered with the kubelet (endpoint %s)", name, request.endpoint)

    def tick(self) -> None:
        """One pass of the watch loop: kubelet restarts, lost sockets, retries, recovery, MPS."""
        with self._lock:
            if self.front is not None and (reason := self.front.front.broken) is not None:
                self._drop_front(reason)
            identity = self._kubelet_stat()
            kubelet_new = identity is not None and identity != self._kubelet_identity
            self._kubelet_identity = identity
            for name, server in self.servers.items():
                if not server.socket_present():
                    log.info("%s: socket removed (kubelet restart?); serving again", name)
                    server.start()
                    self.registrations[name] = self._registration()
                elif kubelet_new:
                    self.registrations[name] = self._registration()
            if identity is not None:
                now = time.monotonic()
                for name, state in self.registrations.items():
                    if not state.registered and now >= state.next_attempt:
                        self._register(name)
        self.health.poll()
        self.mps.check()

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set."""
        while not stop.wait(POLL_S):
            self.tick()

    @property
    def kubelet_present(self) -> bool:
        """Whether a kubelet registration socket exists in the device-plugin directory."""
        return (self.directory / KUBELET_SOCKET).is_socket()

    @property
    def registered(self) -> bool:
        """Whether every resource is registered with the current kubelet."""
        with self._lock:
            return all(r.registered for r in self.registrations.values())
