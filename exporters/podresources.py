"""Which container holds which GPU: the kubelet pod-resources v1 API, polled in the background.

dcgm-exporter asked the kubelet on every scrape and reached 10 cores on MIG nodes (the reference
notes, dcgm-exporter#599); here a thread polls at a bounded rate and publishes an immutable
:class:`Allocations`, which the renderer reads by reference. A scrape never reaches the kubelet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from nodeagent.kubelet.podresources.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

# The kubelet rate-limits this API (qps 100, burst 10); the agent needs nowhere near that, and a
# floor keeps a misconfigured interval from hammering it.
MIN_INTERVAL_S = 1.0
CALL_TIMEOUT_S = 5.0
RESOURCE_PREFIX = "nvidia.com/"


def strip_replica(device_id: str) -> str:
    """The physical device ID behind a shared one: ``GPU-abc::3`` -> ``GPU-abc``."""
    base, sep, replica = device_id.rpartition("::")
    return base if sep and replica.isdigit() else device_id


@dataclass(frozen=True, slots=True)
class PodDevice:
    """A container's share of one device: how many replicas of it the container holds."""

    resource: str
    uuid: str  # device ID without the ::N suffix (GPU-... or MIG-...)
    pod: str
    namespace: str
    container: str
    count: int


@dataclass(frozen=True, slots=True)
class Allocations:
    """One poll of the pod-resources API, restricted to ``nvidia.com/`` resources."""

    timestamp_s: float
    ok: bool  # the last poll succeeded (on failure the previous attribution is kept)
    advertised: Mapping[str, int] = field(default_factory=dict)  # resource -> devices
    allocated: Mapping[str, int] = field(default_factory=dict)
    pod_devices: tuple[PodDevice, ...] = ()
    # Some poll has succeeded, so the counts are facts (possibly stale while ``ok`` is false).
    # False only before the first success: then "nothing allocated" is unknown, not zero.
    known: bool = True


def parse(
    listed: api_pb2.ListPodResourcesResponse,
    allocatable: api_pb2.AllocatableResourcesResponse | None,
    now: float,
) -> Allocations:
    """Fold the two responses into counts per resource and per (device, container)."""
    advertised: dict[str, int] = {}
    if allocatable is not None:
        for dev in allocatable.devices:
            if dev.resource_name.startswith(RESOURCE_PREFIX):
                advertised[dev.resource_name] = advertised.get(dev.resource_name, 0) + len(
                    dev.device_ids
                )
    allocated: dict[str, int] = {}
    held: dict[tuple[str, str, str, str, str], int] = {}
    for pod in listed.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if not dev.resource_name.startswith(RESOURCE_PREFIX):
                    continue
                allocated[dev.resource_name] = allocated.get(dev.resource_name, 0) + len(
                    dev.device_ids
                )
                for device_id in dev.device_ids:
                    key = (
                        dev.resource_name,
                        strip_replica(device_id),
                        pod.name,
                        pod.namespace,
                        container.name,
                    )
                    # Two replicas of one GPU in one container are one series with value 2,
                    # not two series with the same labels.
                    held[key] = held.get(key, 0) + 1
    pod_devices = tuple(PodDevice(*key, count) for key, count in sorted(held.items()))
    return Allocations(now, True, advertised, allocated, pod_devices)


class PodResourcesPoller:
    """Polls List and GetAllocatableResources every ``interval_s`` (at least MIN_INTERVAL_S).

    ``latest`` is None until the first successful poll. A failed poll keeps the last attribution
    with ``ok=False`` (metrics show it through ``nodeagent_pod_resources_up``) and is logged once
    until a poll succeeds again. The channel is re-created after a failure, so a kubelet restart
    (new socket inode) is picked up.
    """

    def __init__(
        self,
        socket_path: Path,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.socket_path = socket_path
        self.interval_s = max(interval_s, MIN_INTERVAL_S)
        self._clock = clock
        self._channel: grpc.Channel | None = None
        self._failing = False
        self.latest: Allocations | None = None
        self.polls = 0

    def _stub(self) -> api_pb2_grpc.PodResourcesListerStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
        return api_pb2_grpc.PodResourcesListerStub(self._channel)

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def poll(self) -> Allocations | None:
        """Poll once; returns (and publishes) the new attribution."""
        self.polls += 1
        now = self._clock()
        if not self.socket_path.exists():
            return self._fail(now, f"socket {self.socket_path} does not exist")
        stub = self._stub()
        try:
            listed = stub.List(api_pb2.ListPodResourcesRequest(), timeout=CALL_TIMEOUT_S)
            try:
                allocatable = stub.GetAllocatableResources(
                    api_pb2.AllocatableResourcesRequest(), timeout=CALL_TIMEOUT_S
                )
            except grpc.RpcError as exc:
                # Kubelets before 1.21 lack GetAllocatableResources; attribution still works.
                if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                    raise
                allocatable = None
        except grpc.RpcError as exc:
            self._drop_channel()
            return self._fail(now, f"{exc.code().name}: {exc.details()}")
        allocations = parse(listed, allocatable, now)
        if self._failing:
            log.info("pod-resources API at %s answers again", self.socket_path)
        self._failing = False
        self.latest = allocations
        return allocations

    def _fail(self, now: float, why: str) -> Allocations | None:
        if not self._failing:
            log.warning(
                "pod attribution unavailable (%s); retrying every %.0fs", why, self.interval_s
            )
        self._failing = True
        prev = self.latest
        if prev is not None:
            self.latest = Allocations(
                prev.timestamp_s, False, prev.advertised, prev.allocated, prev.pod_devices
            )
        else:
            self.latest = Allocations(now, False, known=False)
        return self.latest

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        try:
            while not stop.is_set():
                self.poll()
                stop.wait(self.interval_s)
        finally:
            self._drop_channel()
