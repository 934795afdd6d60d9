"""The DRA kubelet plugin's gRPC servers over unix sockets.

* the **registration** server on ``<registry_dir>/<driver>-reg.sock``: the kubelet's plugin
  watcher dials it, reads ``GetInfo`` (type ``DRAPlugin``, the driver name, the service
  endpoint, the services offered) and reports the outcome in ``NotifyRegistrationStatus``;
* the **DRA service** on ``<plugin_dir>/<driver>/dra.sock``: ``v1.DRAPlugin`` (kubelet 1.34+)
  and ``v1beta1.DRAPlugin`` (1.32-1.33) with the same behaviour, and the KEP-4680
  ``v1alpha1.DRAResourceHealth`` stream when a health feed is given.

The DRA socket serves before the registration socket appears, so the kubelet never dials a
plugin that is not listening; both sockets go at stop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from nodeagent.kubelet.dra.v1 import api_pb2 as v1
from nodeagent.kubelet.dra.v1 import api_pb2_grpc as v1_grpc
from nodeagent.kubelet.dra.v1beta1 import api_pb2 as v1beta1
from nodeagent.kubelet.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from nodeagent.kubelet.drahealth.v1alpha1 import api_pb2 as health_pb
from nodeagent.kubelet.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from nodeagent.kubelet.pluginregistration.v1 import api_pb2 as reg
from nodeagent.kubelet.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from nodeagent_dra.driver import ClaimRef, Deadline, Driver, Outcome

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"
HEALTH = "v1alpha1.DRAResourceHealth"
MAX_WORKERS = 8


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in claims]


def _deadline(context: grpc.ServicerContext) -> Deadline:
    """The kubelet's deadline for this call (45 s from a real kubelet), and whether it waits."""
    return Deadline.within(context.time_remaining(), context.is_active)


def _failed_call(what: str, exc: Exception) -> str:
    """A claim's error when the driver failed the whole call (a defect: never a traceback)."""
    log.error("%s failed unexpectedly: %s: %s", what, type(exc).__name__, exc,
              exc_info=log.isEnabledFor(logging.DEBUG))  # fmt: skip
    return f"{what} failed unexpectedly ({type(exc).__name__}: {exc}); the agent's log has more"


class _Service:
    """One version of the DRAPlugin service; ``pb`` is that version's message module."""

    def __init__(self, driver: Driver, pb: Any, with_share_id: bool) -> None:
        self.driver = driver
        self.pb = pb
        self.with_share_id = with_share_id

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        refs = _refs(request.claims)
        try:
            outcomes = self.driver.prepare(refs, _deadline(context))
        except Exception as exc:  # noqa: BLE001 - every claim gets an answer, whatever happens
            error = _failed_call("NodePrepareResources", exc)
            outcomes = {ref.uid: Outcome(error=error) for ref in refs}
        response = self.pb.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for d in outcome.devices:
                device = entry.devices.add(
                    request_names=list(d.requests),
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_ids),
                )
                if self.with_share_id and d.share_id is not None:
                    device.share_id = d.share_id
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        refs = _refs(request.claims)
        try:
            errors = self.driver.unprepare(refs, _deadline(context))
        except Exception as exc:  # noqa: BLE001 - every claim gets an answer, whatever happens
            error = _failed_call("NodeUnprepareResources", exc)
            errors = {ref.uid: error for ref in refs}
        response = self.pb.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


class _V1(_Service, v1_grpc.DRAPluginServicer):
    pass


class _V1beta1(_Service, v1beta1_grpc.DRAPluginServicer):
    pass


# (pool, device) -> (HEALTHY/UNHEALTHY, message): the health feed of the KEP-4680 stream.
HealthFeed = Callable[[], dict[tuple[str, str], tuple[int, str]]]


class _Health(health_grpc.DRAResourceHealthServicer):
    """Streams the complete device list whenever health changes (and every ``resend_s``)."""

    def __init__(self, feed: HealthFeed, changed: threading.Condition, resend_s: float) -> None:
        self.feed = feed
        self.changed = changed
        self.resend_s = resend_s
        self.stopped = False

    def NodeWatchResources(  # noqa: N802
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[Any]:
        import time

        while context.is_active() and not self.stopped:
            response = health_pb.NodeWatchResourcesResponse()
            now = int(time.time())
            for (pool, device), (state, message) in sorted(self.feed().items()):
                response.devices.add(
                    device=health_pb.DeviceIdentifier(pool_name=pool, device_name=device),
                    health=state,
                    last_updated_time=now,
                    message=message[:1024],
                )
            yield response
            with self.changed:
                self.changed.wait(self.resend_s)


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, info: reg.PluginInfo, plugin: PluginServer) -> None:
        self.info = info
        self.plugin = plugin

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self.info

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.plugin.on_registration(request.plugin_registered, request.error)
        return reg.RegistrationStatusResponse()


class PluginServer:
    """Both servers of one driver; ``start``/``stop``."""

    def __init__(
        self,
        driver: Driver,
        *,
        driver_name: str,
        registry_dir: Path,
        plugin_dir: Path,
        health: HealthFeed | None = None,
        health_resend_s: float = 10.0,
    ) -> None:
        self.driver = driver
        self.driver_name = driver_name
        self.registration_socket = registry_dir / f"{driver_name}-reg.sock"
        self.service_socket = plugin_dir / driver_name / "dra.sock"
        self.health = health
        self.health_changed = threading.Condition()
        self._health_service: _Health | None = None
        self.health_resend_s = health_resend_s
        self.registered = threading.Event()
        self.registration_error = ""
        self._servers: list[grpc.Server] = []

    @property
    def versions(self) -> list[str]:
        """The services offered, newest first (what GetInfo lists)."""
        return [V1, V1BETA1] + ([HEALTH] if self.health is not None else [])

    def on_registration(self, registered: bool, error: str) -> None:
        """The kubelet's verdict on the registration."""
        self.registration_error = error
        if registered:
            log.info("DRA driver %s registered with the kubelet", self.driver_name)
            self.registered.set()
        else:
            log.error("the kubelet refused DRA driver %s: %s", self.driver_name, error)
            self.registered.clear()

    def health_changed_now(self) -> None:
        """Wake every health stream: the device list changed."""
        with self.health_changed:
            self.health_changed.notify_all()

    def start(self) -> None:
        """Serve the DRA service, then the registration socket."""
        for path in (self.service_socket, self.registration_socket):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
        service = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_WORKERS))
        v1_grpc.add_DRAPluginServicer_to_server(_V1(self.driver, v1, True), service)
        v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1(self.driver, v1beta1, False), service)
        if self.health is not None:
            self._health_service = _Health(self.health, self.health_changed, self.health_resend_s)
            health_grpc.add_DRAResourceHealthServicer_to_server(self._health_service, service)
        service.add_insecure_port(f"unix://{self.service_socket}")
        service.start()
        self._servers.append(service)
        info = reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=str(self.service_socket),
            supported_versions=self.versions,
        )
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        reg_grpc.add_RegistrationServicer_to_server(_Registration(info, self), registration)
        registration.add_insecure_port(f"unix://{self.registration_socket}")
        registration.start()
        self._servers.append(registration)
        log.info(
            "DRA driver %s serving %s (registration %s)",
            self.driver_name,
            self.service_socket,
            self.registration_socket,
        )

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop both servers and remove their sockets."""
        if self._health_service is not None:
            self._health_service.stopped = True
            self.health_changed_now()
        for server in reversed(self._servers):
            server.stop(grace_s).wait(grace_s + 1)
        self._servers.clear()
        for path in (self.registration_socket, self.service_socket):
            path.unlink(missing_ok=True)
