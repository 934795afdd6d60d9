"""A kubelet pod-resources API stand-in: answers from plain data, counts the calls."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc

from nodeagent.kubelet.podresources.v1 import api_pb2, api_pb2_grpc


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    """Answers List and GetAllocatableResources from plain data and counts the calls."""

    def __init__(self) -> None:
        self.pods: list[tuple[str, str, str, str, list[str]]] = []  # pod, ns, ctr, res, ids
        self.allocatable: dict[str, list[str]] = {}
        self.list_calls = 0
        self.fail = False
        self.allocatable_unimplemented = False

    def List(  # noqa: N802 - gRPC method names are the API's
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        """The pods set in ``pods``; UNAVAILABLE while ``fail`` is set."""
        self.list_calls += 1
        if self.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
        out = api_pb2.ListPodResourcesResponse()
        for pod, ns, ctr, res, ids in self.pods:
            pr = out.pod_resources.add(name=pod, namespace=ns)
            cr = pr.containers.add(name=ctr)
            cr.devices.add(resource_name=res, device_ids=ids)
        return out

    def Get(  # noqa: N802 - gRPC method names are the API's
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        """Not served: the agent lists, it never asks for one pod."""
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Get is not served")

    def GetAllocatableResources(  # noqa: N802 - gRPC method names are the API's
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        """The devices set in ``allocatable``; UNIMPLEMENTED like an old kubelet on request."""
        if self.allocatable_unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "old kubelet")
        out = api_pb2.AllocatableResourcesResponse()
        for res, ids in self.allocatable.items():
            out.devices.add(resource_name=res, device_ids=ids)
        return out


@contextmanager
def serving(socket: Path) -> Iterator[FakeKubelet]:
    """A :class:`FakeKubelet` answering on the unix socket ``socket`` until the block ends."""
    servicer = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield servicer
    finally:
        server.stop(None)
