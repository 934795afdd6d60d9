"""A test kubelet: a real Registration server on kubelet.sock that dials plugins back.

It does what the kubelet's device manager does over the wire: records each Register call, dials
the plugin's endpoint, reads its options, keeps a ListAndWatch stream open and remembers every
device list with the time it arrived. Tests then call GetPreferredAllocation and Allocate on the
same connection. ``restart()`` behaves like a kubelet restart: every socket in the directory is
deleted, then kubelet.sock is created again.

``allocatable()`` and ``capacity()`` are what the real kubelet would put in its Node's status:
capacity counts the plugin's latest list, allocatable its Healthy devices, and once the plugin's
ListAndWatch stream ends allocatable is 0 while capacity keeps the last count (the real kubelet
marks a disconnected plugin's devices unhealthy and drops them only after a grace period). Like
the real one, it refuses a resource's registration while that resource's previous stream is still
open ("device plugin already connected"); such refusals are kept in ``refused``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

CHECKPOINT = "kubelet_internal_checkpoint"


@dataclass
class PluginView:
    """What the test kubelet knows about one registered resource."""

    request: api_pb2.RegisterRequest
    channel: grpc.Channel
    stub: api_pb2_grpc.DevicePluginStub
    options: api_pb2.DevicePluginOptions | None = None
    lists: list[tuple[float, dict[str, tuple[str, list[int]]]]] = field(default_factory=list)
    ended: bool = False  # its ListAndWatch stream ended (plugin gone or replaced)

    @property
    def devices(self) -> dict[str, tuple[str, list[int]]]:
        """The latest list: ID -> (health, NUMA nodes)."""
        return self.lists[-1][1] if self.lists else {}


class TestKubelet(api_pb2_grpc.RegistrationServicer):
    """Registration server plus the kubelet side of every plugin connection."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.registrations: list[api_pb2.RegisterRequest] = []
        # Registrations refused because the resource's previous stream was still open.
        self.refused: list[api_pb2.RegisterRequest] = []
        self.plugins: dict[str, PluginView] = {}
        self.cond = threading.Condition()
        self.reject: Callable[[api_pb2.RegisterRequest], str | None] = lambda _r: None
        self._server: grpc.Server | None = None
        self.generation = 0

    @property
    def socket(self) -> Path:
        return self.directory / "kubelet.sock"

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(2)
            self._server = None
        with self.cond:
            plugins = list(self.plugins.values())
            self.plugins.clear()
        for view in plugins:
            view.channel.close()

    def restart(self) -> None:
        """Stop, delete every socket (not the checkpoint), listen on kubelet.sock again."""
        self.stop()
        for path in self.directory.iterdir():
            if path.name != CHECKPOINT and path.is_socket():
                path.unlink()
        with self.cond:
            self.generation += 1
        self.start()

    # --- Registration service -----------------------------------------------------------------
    def Register(  # noqa: N802 - gRPC method names are the API's
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty:
        problem = self.reject(request)
        if problem is not None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, problem)
        if request.version != "v1beta1":
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}"
            )
        with self.cond:
            previous = self.plugins.get(request.resource_name)
            if previous is not None and not previous.ended:
                # Kubelet 1.37 refuses a registration while the resource's previous stream is
                # open (and then never forgets the stale one; tests/real_kubelet shows it).
                self.refused.append(request)
                context.abort(grpc.StatusCode.UNKNOWN, "device plugin already connected")
            self.registrations.append(request)
        # Like the kubelet, connect back asynchronously once Register has answered.
        threading.Thread(target=self._connect, args=(request,), daemon=True).start()
        return api_pb2.Empty()

    def _connect(self, request: api_pb2.RegisterRequest) -> None:
        channel = grpc.insecure_channel(f"unix://{self.directory / request.endpoint}")
        view = PluginView(request, channel, api_pb2_grpc.DevicePluginStub(channel))
        try:
            view.options = view.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
        except grpc.RpcError:
            channel.close()
            return
        with self.cond:
            old = self.plugins.get(request.resource_name)
            self.plugins[request.resource_name] = view
            self.cond.notify_all()
        if old is not None:
            old.channel.close()
        try:
            for message in view.stub.ListAndWatch(api_pb2.Empty()):
                devices = {
                    d.ID: (d.health, [n.ID for n in d.topology.nodes]) for d in message.devices
                }
                with self.cond:
                    view.lists.append((time.monotonic(), devices))
                    self.cond.notify_all()
        except grpc.RpcError:
            pass
        with self.cond:
            view.ended = True
            self.cond.notify_all()

    # --- what tests call ----------------------------------------------------------------------
    def wait(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout_s)

    def wait_devices(
        self,
        resource: str,
        predicate: Callable[[dict[str, tuple[str, list[int]]]], bool] = bool,
        timeout_s: float = 5.0,
    ) -> dict[str, tuple[str, list[int]]]:
        ok = self.wait(
            lambda: resource in self.plugins and predicate(self.plugins[resource].devices),
            timeout_s,
        )
        assert ok, f"{resource}: no matching device list; have {self.plugins.get(resource)}"
        return self.plugins[resource].devices

    def capacity(self, resource: str) -> int:
        """The Node's capacity of ``resource`` as the real kubelet reports it."""
        with self.cond:
            view = self.plugins.get(resource)
            return len(view.devices) if view is not None else 0

    def allocatable(self, resource: str) -> int:
        """The Node's allocatable ``resource``: Healthy devices of a plugin still streaming."""
        with self.cond:
            view = self.plugins.get(resource)
            if view is None or view.ended:
                return 0
            return sum(1 for health, _numa in view.devices.values() if health == "Healthy")

    def stub(self, resource: str) -> api_pb2_grpc.DevicePluginStub:
        self.wait_devices(resource, lambda _d: True)
        return self.plugins[resource].stub

    def allocate(self, resource: str, *containers: list[str]) -> api_pb2.AllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=c) for c in containers]
        )
        return self.stub(resource).Allocate(request, timeout=5)

    def preferred(
        self, resource: str, available: list[str], size: int, must: list[str] | None = None
    ) -> list[str]:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must or [],
                    allocation_size=size,
                )
            ]
        )
        response = self.stub(resource).GetPreferredAllocation(request, timeout=5)
        return list(response.container_responses[0].deviceIDs)
