"""Shared setup for the exporter benchmarks: dgx-h100 with 56 MIG instances and 300 pods.

Every GPU is split into seven 1g.10gb instances (8 x 7 = 56). Each MIG device is shared by
time-slicing with 6 replicas (336 device IDs ``MIG-...::N``), and 300 simulated pods each hold
one replica, served by a test pod-resources gRPC server on a unix socket.
"""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc

from nodeagent.agent.backend import open_node
from nodeagent.gpu.node import GpuNode
from nodeagent.kubelet.podresources.v1 import api_pb2_grpc
from nodeagent.sim.control import SimControl
from nodeagent.testing.nodes import split_into
from nodeagent.testing.podresources import FakeKubelet

PRESET = "dgx-h100"
PODS = 300
REPLICAS = 6


def mig_node(state_dir: Path) -> GpuNode:
    """dgx-h100 with 56 1g.10gb instances."""
    node = open_node(simulate=PRESET, state_dir=state_dir)
    split_into(node, SimControl(state_dir), range(node.count()), "1g.10gb")
    return node


def start_kubelet(node: GpuNode, socket_path: Path) -> grpc.Server:
    """A pod-resources server: 56 MIG devices x 6 replicas, 300 pods holding one each."""
    uuids = [gi.uuid for g in range(node.count()) for gi in node.mig_instances(g) if gi.uuid]
    replicas = [f"{u}::{r}" for u in uuids for r in range(REPLICAS)]
    kubelet = FakeKubelet()
    kubelet.allocatable = {"nvidia.com/mig-1g.10gb": replicas}
    kubelet.pods = [
        (f"job-{n}", f"team-{n % 12}", "worker", "nvidia.com/mig-1g.10gb", [replicas[n]])
        for n in range(PODS)
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    return server
