"""A test kubelet for DRA drivers: the plugin watcher and the DRA manager's side of the wire.

It does what the kubelet does over real unix sockets: finds ``*-reg.sock`` in the registration
directory, calls ``GetInfo``, picks the first of its own service versions the plugin offers
(``versions``: newest kubelets ``[v1, v1beta1]``, 1.32-1.33 ``[v1beta1]``), answers
``NotifyRegistrationStatus``, dials the plugin's endpoint and then calls NodePrepareResources /
NodeUnprepareResources there; it can keep a KEP-4680 health stream open.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
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

NEWEST = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
OLDER = ("v1beta1.DRAPlugin",)
_MODULES = {"v1.DRAPlugin": (v1, v1_grpc), "v1beta1.DRAPlugin": (v1beta1, v1beta1_grpc)}
TIMEOUT_S = 45.0  # the kubelet's per-call timeout


@dataclass
class Prepared:
    """One claim's answer, as plain data."""

    devices: list[dict[str, Any]]
    error: str


@dataclass
class DraConnection:
    """A registered plugin and the kubelet's channel to it."""

    info: reg.PluginInfo
    version: str
    channel: grpc.Channel
    health: list[dict[tuple[str, str], str]] = field(default_factory=list)

    def _stub(self) -> Any:
        pb, grpc_mod = _MODULES[self.version]
        return pb, grpc_mod.DRAPluginStub(self.channel)

    def prepare(
        self, claims: Sequence[tuple[str, str, str]], timeout_s: float = TIMEOUT_S
    ) -> dict[str, Prepared]:
        """NodePrepareResources for (namespace, uid, name) claims, with the kubelet's deadline
        (``timeout_s``; past it the call raises ``grpc.RpcError`` DEADLINE_EXCEEDED)."""
        pb, stub = self._stub()
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        )
        response = stub.NodePrepareResources(request, timeout=timeout_s)
        out = {}
        for uid, answer in response.claims.items():
            devices = []
            for d in answer.devices:
                item = {
                    "requests": list(d.request_names),
                    "pool": d.pool_name,
                    "device": d.device_name,
                    "cdi": list(d.cdi_device_ids),
                }
                if self.version == "v1.DRAPlugin" and d.HasField("share_id"):
                    item["share_id"] = d.share_id
                devices.append(item)
            out[uid] = Prepared(devices, answer.error)
        return out

    def unprepare(
        self, claims: Sequence[tuple[str, str, str]], timeout_s: float = TIMEOUT_S
    ) -> dict[str, str]:
        """NodeUnprepareResources: claim UID -> error ('' when done)."""
        pb, stub = self._stub()
        request = pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        )
        response = stub.NodeUnprepareResources(request, timeout=timeout_s)
        return {uid: answer.error for uid, answer in response.claims.items()}

    def watch_health(self) -> threading.Thread:
        """Keep a NodeWatchResources stream open; each message lands in ``health``."""
        stub = health_grpc.DRAResourceHealthStub(self.channel)

        def run() -> None:
            try:
                for message in stub.NodeWatchResources(health_pb.NodeWatchResourcesRequest()):
                    self.health.append(
                        {
                            (d.device.pool_name, d.device.device_name): health_pb.HealthStatus.Name(
                                d.health
                            )
                            for d in message.devices
                        }
                    )
            except grpc.RpcError:
                return

        thread = threading.Thread(target=run, daemon=True, name="test-kubelet-health")
        thread.start()
        return thread


class TestDraKubelet:
    """The kubelet's plugin watcher for DRA plugins in ``registry_dir``."""

    __test__ = False

    def __init__(self, registry_dir: Path, versions: Sequence[str] = NEWEST) -> None:
        self.registry_dir = registry_dir
        self.versions = tuple(versions)
        self.connections: dict[str, DraConnection] = {}

    def register(self, timeout_s: float = 10.0, reject: str = "") -> DraConnection:
        """Wait for a registration socket, register the plugin (or refuse it with ``reject``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            sockets = sorted(self.registry_dir.glob("*-reg.sock"))
            if sockets:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no registration socket in {self.registry_dir}")
            time.sleep(0.05)
        channel = grpc.insecure_channel(f"unix://{sockets[0]}")
        try:
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg.InfoRequest(), timeout=TIMEOUT_S)
            chosen = next((v for v in self.versions if v in info.supported_versions), None)
            error = reject or (
                ""
                if info.type == "DRAPlugin" and chosen is not None
                else f"no supported version among {list(info.supported_versions)}"
            )
            stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=not error, error=error),
                timeout=TIMEOUT_S,
            )
        finally:
            channel.close()
        if error:
            raise PermissionError(error)
        assert chosen is not None
        connection = DraConnection(info, chosen, grpc.insecure_channel(f"unix://{info.endpoint}"))
        self.connections[info.name] = connection
        return connection

    def close(self) -> None:
        """Close every channel."""
        for c in self.connections.values():
            c.channel.close()
        self.connections.clear()
