"""One resource's gRPC DevicePlugin server on its unix socket."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from nodeagent.config.device_plugin import DevicePluginSection
from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from nodeagent.runtime.mps import MpsPaths
from nodeagent_device_plugin.allocate import (
    AllocationError,
    container_response,
    id_list,
    validate_request,
)
from nodeagent_device_plugin.front import AllocateTable, Front, FrontError, allocate_table
from nodeagent_device_plugin.preferred import ScoreTable, preferred_gpus, preferred_replicas
from nodeagent_device_plugin.resources import PluginDevice, Resource

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
MAX_WORKERS = 8  # one per open ListAndWatch stream plus concurrent Allocate calls


@dataclass
class ServingContext:
    """What every resource server reads from the plugin manager (swapped on reload)."""

    section: DevicePluginSection
    table: ScoreTable
    unhealthy: Callable[[PluginDevice], str | None]
    mps_paths: Callable[[str], MpsPaths | None]


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin service of one resource."""

    def __init__(self, resource: Resource, ctx: ServingContext) -> None:
        self.ctx = ctx
        self._cond = threading.Condition()
        self._resource = resource
        self._devices = resource.by_id()
        self._version = 0
        self._delivered = -1  # newest version some stream has handed to gRPC
        self._message = api_pb2.ListAndWatchResponse()
        self._stopped = False
        self.streams_opened = 0  # ListAndWatch streams ever opened (tests check re-dials)
        self.streams_open = 0
        # Where Allocate's inputs go when the front answers it (None: Python answers).
        self._publish_lock = threading.Lock()
        self._publish: Callable[[AllocateTable], None] | None = None
        self._published: AllocateTable | None = None
        self.refresh()

    @property
    def resource(self) -> Resource:
        """The resource served now."""
        return self._resource

    def set_resource(self, resource: Resource) -> None:
        """Serve a new device list (same name), e.g. zero devices before stopping."""
        with self._cond:
            self._resource = resource
            self._devices = resource.by_id()
        self.refresh()

    def refresh(self) -> bool:
        """Recompute health; notify ListAndWatch streams when the list changed.

        The Allocate table, when the front answers Allocate, is recomputed too and sent if it
        changed (a device's health reason can change while the list stays the same).
        """
        self._publish_table()
        message = api_pb2.ListAndWatchResponse()
        for device in self._resource.devices:
            entry = message.devices.add(
                ID=device.id, health=UNHEALTHY if self.ctx.unhealthy(device) else HEALTHY
            )
            if device.numa_node is not None:
                entry.topology.nodes.add(ID=device.numa_node)
        with self._cond:
            if message == self._message and self._version > 0:
                return False
            self._message = message
            self._version += 1
            self._cond.notify_all()
        return True

    def publish_to(self, publish: Callable[[AllocateTable], None] | None) -> None:
        """Send Allocate's table to ``publish`` now and after every change (None: stop)."""
        with self._publish_lock:
            self._publish, self._published = publish, None
        self._publish_table()

    def _publish_table(self) -> None:
        # Under the lock, so that a table computed earlier is never sent after a newer one.
        with self._publish_lock:
            if self._publish is None:
                return
            ctx = self.ctx
            table = allocate_table(self._resource, ctx.section, ctx.unhealthy, ctx.mps_paths)
            if table != self._published:
                self._publish(table)
                self._published = table

    def advertised(self) -> dict[str, bool]:
        """The device list as ListAndWatch sends it now: ID -> healthy."""
        with self._cond:
            message = self._message
        return {d.ID: d.health == HEALTHY for d in message.devices}

    def wait_delivered(self, timeout_s: float) -> bool:
        """Wait until a stream has sent the newest list (or no stream is open)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._delivered < self._version and self.streams_open > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def resume(self) -> None:
        """Accept streams again after :meth:`stop` (the server is re-served)."""
        with self._cond:
            self._stopped = False

    def stop(self) -> None:
        """End every ListAndWatch stream."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    # --- RPCs ---------------------------------------------------------------------------------
    def GetDevicePluginOptions(  # noqa: N802 - gRPC method names are the API's
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        """The options sent at registration."""
        return options()

    def ListAndWatch(  # noqa: N802 - gRPC method names are the API's
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        """The full device list now and after every change, until the server stops."""
        seen = 0
        with self._cond:
            self.streams_opened += 1
            self.streams_open += 1
        try:
            while True:
                with self._cond:
                    if self._version == seen and not self._stopped:
                        self._cond.wait(0.5)
                    if self._stopped:
                        return
                    if self._version == seen:
                        if not context.is_active():
                            return
                        continue
                    seen, message = self._version, self._message
                yield message
                with self._cond:
                    self._delivered = max(self._delivered, seen)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self.streams_open -= 1
                self._cond.notify_all()

    def GetPreferredAllocation(  # noqa: N802 - gRPC method names are the API's
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        """Topology-aware choice for whole GPUs, spread/pack placement for replicas and MIG."""
        response = api_pb2.PreferredAllocationResponse()
        devices = self._devices
        for req in request.container_requests:
            available = list(req.available_deviceIDs)
            must = list(req.must_include_deviceIDs)
            unknown = [i for i in (*available, *must) if i not in devices]
            if unknown:
                message = (
                    f"{self._resource.name}: {len(unknown)} unknown device ID(s): "
                    f"{id_list(unknown)}"
                )
                log.warning("GetPreferredAllocation refused: %s", message)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
            try:
                chosen = self._prefer(devices, available, must, req.allocation_size)
            except ValueError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self._resource.name}: {exc}")
            response.container_responses.add(deviceIDs=chosen)
        return response

    def _prefer(
        self, devices: dict[str, PluginDevice], available: list[str], must: list[str], size: int
    ) -> list[str]:
        picked = [devices[i] for i in available]
        if any(d.shared or d.mig_profile is not None for d in picked):
            # Placement is a per-GPU policy; the first available device's GPU decides.
            placement = picked[0].sharing.replica_placement
            return preferred_replicas(devices, available, must, size, placement)
        by_index = {devices[i].gpu_index: i for i in available}
        indices = preferred_gpus(
            self.ctx.table, list(by_index), [devices[i].gpu_index for i in must], size
        )
        return [by_index[g] for g in indices]

    def Allocate(  # noqa: N802 - gRPC method names are the API's
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        """Check every container's IDs and return its runtime instructions."""
        response = api_pb2.AllocateResponse()
        try:
            chosen = validate_request(
                self._resource.name,
                self._devices,
                [list(req.devices_ids) for req in request.container_requests],
                self.ctx.unhealthy,
            )
        except AllocationError as exc:
            log.warning("Allocate refused: %s", exc.message)
            context.abort(exc.code, exc.message)
        for devices in chosen:
            response.container_responses.append(
                container_response(
                    devices, self.ctx.section, self.ctx.mps_paths, self._resource.name
                )
            )
        return response

    def PreStartContainer(  # noqa: N802 - gRPC method names are the API's
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        """Not required (pre_start_required is false); answers for completeness."""
        return api_pb2.PreStartContainerResponse()


def options() -> api_pb2.DevicePluginOptions:
    """What every resource server offers the kubelet."""
    return api_pb2.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=True
    )


@dataclass(frozen=True)
class FrontLink:
    """The Allocate front and the private directory of the agent's own sockets behind it."""

    front: Front
    upstream_dir: Path


class ResourceServer:
    """A gRPC server for one resource on ``<dir>/<socket>``, owner-only, removed on stop.

    With a front, the front serves ``<dir>/<socket>`` and this server listens on the same
    name in the front's private directory, for the calls the front passes on.
    """

    def __init__(
        self,
        directory: Path,
        resource: Resource,
        ctx: ServingContext,
        front: FrontLink | None = None,
    ) -> None:
        self.directory = directory
        self.service = DevicePluginService(resource, ctx)
        self.socket_path = directory / resource.socket_name
        self.front = front
        self._server: grpc.Server | None = None
        self._bound: Path | None = None
        self.socket_identity: tuple[int, int] | None = None

    @property
    def name(self) -> str:
        """The resource name."""
        return self.service.resource.name

    def start(self) -> None:
        """(Re)bind the socket and serve; FrontError (nothing left served) if the front fails."""
        self.stop(grace_s=0)
        self.service.resume()
        self.socket_path.unlink(missing_ok=True)
        front = self.front
        bound = self.socket_path if front is None else front.upstream_dir / self.socket_path.name
        bound.unlink(missing_ok=True)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="dp-grpc")
        )
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        server.add_insecure_port(f"unix://{bound}")
        server.start()
        # gRPC creates the socket with the process umask; only the kubelet (root) may talk to it.
        os.chmod(bound, 0o600)
        self._server, self._bound = server, bound
        if front is not None:
            try:
                front.front.serve(self.socket_path, bound)
                self.service.publish_to(self._send_table)
            except FrontError:
                self.stop(grace_s=0)
                raise
        st = self.socket_path.stat()
        self.socket_identity = (st.st_dev, st.st_ino)

    def _send_table(self, table: AllocateTable) -> None:
        front = self.front
        if front is None:
            return
        try:
            front.front.table(self.socket_path, table)
        except FrontError as exc:
            # A front that kept an older table would hand out what is no longer allocatable:
            # it is stopped, and the manager serves this socket itself at its next tick.
            front.front.fail(f"{self.name}: the Allocate table was not taken: {exc}")

    def socket_present(self) -> bool:
        """Whether our socket file is still the one we bound (the kubelet deletes it)."""
        try:
            st = self.socket_path.stat()
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self.socket_identity

    def stop(self, grace_s: float = 0.5) -> None:
        """Stop serving and remove the socket if it is still ours."""
        if self._server is None:
            return
        self.service.stop()
        if self.front is not None:
            self.service.publish_to(None)
            # A front that does not answer is taken out of service by the manager.
            with contextlib.suppress(FrontError):
                self.front.front.close(self.socket_path)
        self._server.stop(grace_s).wait(grace_s + 1.0)
        if self._bound is not None and self._bound != self.socket_path:
            self._bound.unlink(missing_ok=True)
        if self.socket_present():
            self.socket_path.unlink(missing_ok=True)
        self._server = self._bound = None
