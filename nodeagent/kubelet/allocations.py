"""Which containers hold which device-plugin devices, as the kubelet knows it.

Two sources, asked in order:

1. the pod-resources v1 API (``List``), which names each pod and namespace;
2. where that socket does not answer, the device manager's checkpoint
   ``<device-plugins dir>/kubelet_internal_checkpoint``, which the kubelet rewrites at every
   allocation and keeps across its restarts. It names pods by UID only.

The checkpoint is JSON: ``{"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName",
"ResourceName", "DeviceIDs": {"<NUMA node>": ["id", ...]}, "AllocResp"}, ...],
"RegisteredDevices": {...}}, "Checksum": N}``; kubelets before 1.20 wrote ``DeviceIDs`` as a
plain list, which is read too. The checksum is the kubelet's hash of its Go structure and is not
checked here: a checkpoint is read only to learn what is held, never trusted to release it.

Nothing here decides anything; :mod:`nodeagent.holds` matches these IDs against GPUs and MIG
instances.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KUBELET_CHECKPOINT = "kubelet_internal_checkpoint"
CALL_TIMEOUT_S = 5.0
REPLICA_SEPARATOR = "::"  # a shared device's ID: ``<uuid>::<n>`` (the device plugin's rule)


def physical_id(device_id: str) -> str:
    """The device behind a replica's ID: ``MIG-abc::3`` -> ``MIG-abc``."""
    base, sep, replica = device_id.rpartition(REPLICA_SEPARATOR)
    return base if sep and replica.isdigit() else device_id


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """One container's hold on one device ID."""

    resource: str
    device_id: str  # without the ``::N`` replica suffix
    container: str
    pod: str = ""  # "" where only the UID is known (the checkpoint)
    namespace: str = ""
    pod_uid: str = ""

    @property
    def pod_label(self) -> str:
        """``team-a/train-0``, or ``uid 1f0e...`` from the checkpoint."""
        return f"{self.namespace}/{self.pod}" if self.pod else f"uid {self.pod_uid}"


class AllocationsUnavailableError(Exception):
    """The kubelet's allocations cannot be read; the message says from where and why."""


def list_pod_resources(
    socket: Path, timeout_s: float = CALL_TIMEOUT_S
) -> tuple[DeviceAllocation, ...]:
    """Every device the pod-resources API at ``socket`` lists as held.

    Raises:
        AllocationsUnavailableError: the socket is missing or the call fails.
    """
    if not socket.exists():
        raise AllocationsUnavailableError(f"pod-resources socket {socket} does not exist")
    # Imported only where a kubelet is: `mig apply` on a node without one never loads grpc.
    import grpc

    from nodeagent.kubelet.podresources.v1 import api_pb2, api_pb2_grpc

    channel = grpc.insecure_channel(f"unix://{socket}")
    try:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        listed = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        raise AllocationsUnavailableError(
            f"pod-resources API at {socket}: {exc.code().name}: {exc.details()}"
        ) from None
    finally:
        channel.close()
    return tuple(
        DeviceAllocation(dev.resource_name, physical_id(i), c.name, p.name, p.namespace)
        for p in listed.pod_resources
        for c in p.containers
        for dev in c.devices
        for i in dev.device_ids
    )


def _ids(raw: Any) -> Iterable[str]:
    if isinstance(raw, dict):  # NUMA node -> IDs (1.20 and later)
        return [str(i) for ids in raw.values() if isinstance(ids, list) for i in ids]
    if isinstance(raw, list):  # before 1.20
        return [str(i) for i in raw]
    raise ValueError(f"DeviceIDs is {type(raw).__name__}, not a map or a list")


def read_kubelet_checkpoint(path: Path) -> tuple[DeviceAllocation, ...]:
    """Every device the kubelet's device-manager checkpoint at ``path`` records as allocated.

    Raises:
        FileNotFoundError: there is no checkpoint (no device manager has run here).
        AllocationsUnavailableError: it cannot be read or is damaged (the message says how).
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        entries = raw["Data"]["PodDeviceEntries"] if isinstance(raw, dict) else None
        if entries is None:
            entries = []  # the kubelet writes null for no allocation
        if not isinstance(entries, list):
            raise ValueError("Data.PodDeviceEntries is not a list")
        out = []
        for n, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ValueError(f"PodDeviceEntries[{n}] is not an object")
            for device_id in _ids(entry.get("DeviceIDs")):
                out.append(
                    DeviceAllocation(
                        str(entry.get("ResourceName", "")),
                        physical_id(device_id),
                        str(entry.get("ContainerName", "")),
                        pod_uid=str(entry.get("PodUID", "")),
                    )
                )
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise AllocationsUnavailableError(f"kubelet checkpoint {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise AllocationsUnavailableError(f"kubelet checkpoint {path} is damaged: {exc}") from None
    return tuple(out)


def device_allocations(
    socket: Path | None, kubelet_dir: Path | None
) -> tuple[tuple[DeviceAllocation, ...], str]:
    """What the kubelet says containers hold, and where that came from.

    The pod-resources API first; where it does not answer, the checkpoint in ``kubelet_dir``.
    Neither socket nor checkpoint existing means no kubelet device manager on this node: nothing
    is held (``source`` is ``"none"``).

    Raises:
        AllocationsUnavailableError: a kubelet is there but neither source can be read (both reasons
            in the message): what pods hold is unknown.
    """
    problems = []
    if socket is not None:
        try:
            return list_pod_resources(socket), "pod-resources"
        except AllocationsUnavailableError as exc:
            problems.append(str(exc))
    if kubelet_dir is not None:
        path = kubelet_dir / KUBELET_CHECKPOINT
        try:
            return read_kubelet_checkpoint(path), "kubelet-checkpoint"
        except FileNotFoundError:
            problems.append(f"no kubelet checkpoint {path}")
        except AllocationsUnavailableError as exc:
            problems.append(str(exc))
            raise AllocationsUnavailableError("; ".join(problems)) from None
    socket_there = socket is not None and socket.exists()
    if socket_there:
        raise AllocationsUnavailableError("; ".join(problems))
    return (), "none"
