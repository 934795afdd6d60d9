"""Allocate: check a container's device IDs and build what the container runtime needs.

Strategies follow NVIDIA's plugin so that the NVIDIA container runtime and CDI specs written
for it work unchanged: ``envvar`` (NVIDIA_VISIBLE_DEVICES), ``volume-mounts`` (/dev/null mounts
under /var/run/nvidia-container-devices, which an unprivileged pod cannot fake through env),
``cdi-annotations`` and ``cdi-cri``, and ``cdi``: CDI names in ``CDIDevices`` for the specs the
agent writes itself (:mod:`nodeagent_device_plugin.cdi`). When every selected strategy is CDI,
env and mounts are left out. MPS devices also get the pipe directory, shared memory and
CUDA_MPS_PIPE_DIRECTORY (with ``cdi``, the pipe and its env come from the agent's spec).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import grpc

from nodeagent.config.device_plugin import DeviceListStrategy, DevicePluginSection
from nodeagent.config.pool_policy import SharingMode
from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2
from nodeagent.runtime.mps import MpsPaths
from nodeagent_device_plugin.cdi import device_names
from nodeagent_device_plugin.resources import PluginDevice

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
# Control devices every CUDA container needs; nvidiactl is always passed, the others if present.
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# How many offending IDs an error names: a request with 100,000 unknown IDs must not become a
# megabyte of details (gRPC turns that into RESOURCE_EXHAUSTED) nor a megabyte log line.
MAX_IDS_SHOWN = 10


def id_list(ids: Sequence[str], limit: int = MAX_IDS_SHOWN) -> str:
    """``a, b, c`` or, past ``limit``, the first ``limit`` and ``(and N more)``."""
    shown = ", ".join(ids[:limit])
    return shown if len(ids) <= limit else f"{shown} (and {len(ids) - limit} more)"


class AllocationError(Exception):
    """A request the plugin refuses; ``code`` is the gRPC status the kubelet receives."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def validate(
    resource: str,
    devices: Mapping[str, PluginDevice],
    ids: Sequence[str],
    unhealthy: Callable[[PluginDevice], str | None],
) -> list[PluginDevice]:
    """The devices behind ``ids``, or AllocationError naming the offending IDs and why."""
    if not ids:
        raise AllocationError(grpc.StatusCode.INVALID_ARGUMENT, f"{resource}: no device IDs")
    # The set test is the per-call cost; the Counter is built only to name the duplicates.
    if len(set(ids)) != len(ids):
        duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise AllocationError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{resource}: duplicate device IDs in one container: {id_list(duplicates)}",
        )
    unknown = [i for i in ids if i not in devices]
    if unknown:
        raise AllocationError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{resource}: {len(unknown)} unknown device ID(s): {id_list(unknown)}",
        )
    chosen = [devices[i] for i in ids]
    sick = [(d.id, reason) for d in chosen if (reason := unhealthy(d)) is not None]
    if sick:
        detail = "; ".join(f"{i} ({reason})" for i, reason in sick[:MAX_IDS_SHOWN])
        if len(sick) > MAX_IDS_SHOWN:
            detail += f" (and {len(sick) - MAX_IDS_SHOWN} more)"
        raise AllocationError(
            grpc.StatusCode.FAILED_PRECONDITION, f"{resource}: unhealthy devices: {detail}"
        )
    strict = [d.id for d in chosen if d.shared and d.sharing.fail_requests_greater_than_one]
    if len(chosen) > 1 and strict:
        raise AllocationError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"request for '{resource}: {len(chosen)}' too large: maximum request size for "
            f"shared resources is 1 (shared devices: {id_list(strict)})",
        )
    mps_gpus = sorted({d.gpu_uuid for d in chosen if d.sharing.mode is SharingMode.MPS})
    if mps_gpus and (len(mps_gpus) > 1 or len({d.gpu_uuid for d in chosen}) > 1):
        raise AllocationError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{resource}: devices {id_list(ids)} span several GPUs including MPS GPU(s) "
            f"{id_list(mps_gpus)}; a container can reach only one MPS daemon",
        )
    return chosen


def validate_request(
    resource: str,
    devices: Mapping[str, PluginDevice],
    containers: Sequence[Sequence[str]],
    unhealthy: Callable[[PluginDevice], str | None],
) -> list[list[PluginDevice]]:
    """Every container's devices (:func:`validate`), and no device in two containers.

    The kubelet never hands one device to two containers of a pod; a request that does would
    give two containers the same exclusive GPU (or MIG device, or replica).

    Raises:
        AllocationError: a container's IDs are invalid, or an ID is in several containers.
    """
    chosen = [validate(resource, devices, list(ids), unhealthy) for ids in containers]
    owners: dict[str, int] = {}
    shared: list[str] = []
    for n, container in enumerate(chosen):
        for d in container:
            # An exclusive GPU is one device whatever ID names it; replicas are distinct.
            key = d.id if d.shared else d.uuid
            if owners.setdefault(key, n) != n and d.id not in shared:
                shared.append(d.id)
    if shared:
        raise AllocationError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{resource}: device(s) requested by more than one container of the pod: "
            f"{id_list(shared)}",
        )
    return chosen


def container_response(
    chosen: Sequence[PluginDevice],
    section: DevicePluginSection,
    mps: Callable[[str], MpsPaths | None],
    resource: str,
) -> api_pb2.ContainerAllocateResponse:
    """The runtime instructions for one container's devices of ``resource``."""
    response = api_pb2.ContainerAllocateResponse()
    uuids = list(dict.fromkeys(d.uuid for d in chosen))  # replicas of one GPU name it once
    strategies = section.strategies
    if not all(s.is_cdi for s in strategies):
        if DeviceListStrategy.ENVVAR in strategies:
            response.envs[VISIBLE_DEVICES] = ",".join(uuids)
        if DeviceListStrategy.VOLUME_MOUNTS in strategies:
            response.envs[VISIBLE_DEVICES] = VOLUME_MOUNT_ROOT
            for uuid in uuids:
                response.mounts.append(
                    api_pb2.Mount(
                        container_path=f"{VOLUME_MOUNT_ROOT}/{uuid}",
                        host_path="/dev/null",
                        read_only=True,
                    )
                )
    names = [f"{section.cdi_kind}={uuid}" for uuid in uuids]
    if DeviceListStrategy.CDI_ANNOTATIONS in strategies:
        # Deterministic key: the same request gets the same annotation (kubelet retries).
        digest = hashlib.sha256(",".join(uuids).encode()).hexdigest()[:16]
        key = f"{section.cdi_annotation_prefix}nodeagent-device-plugin_{digest}"
        response.annotations[key] = ",".join(names)
    if DeviceListStrategy.CDI_CRI in strategies:
        response.cdi_devices.extend(api_pb2.CDIDevice(name=n) for n in names)
    own_specs = DeviceListStrategy.CDI in strategies
    if own_specs:
        response.cdi_devices.extend(
            api_pb2.CDIDevice(name=n) for n in device_names(section, resource, uuids)
        )
    if section.pass_device_specs:
        _add_device_specs(response, chosen, section.dev_root)
    for gpu_uuid in dict.fromkeys(d.gpu_uuid for d in chosen):
        paths = mps(gpu_uuid)
        if paths is None:
            continue
        if not own_specs:  # the agent's CDI device mounts the pipe and sets the env itself
            response.envs[MPS_PIPE_ENV] = str(paths.container_pipe_dir)
            response.mounts.append(
                api_pb2.Mount(
                    container_path=str(paths.container_pipe_dir),
                    host_path=str(paths.host_pipe_dir),
                )
            )
        response.mounts.append(
            api_pb2.Mount(container_path="/dev/shm", host_path=str(paths.host_shm_dir))
        )
    return response


def _add_device_specs(
    response: api_pb2.ContainerAllocateResponse, chosen: Sequence[PluginDevice], dev_root: Path
) -> None:
    paths = [f"nvidia{minor}" for minor in dict.fromkeys(d.minor_number for d in chosen)]
    paths.append(CONTROL_DEVICES[0])
    paths.extend(name for name in CONTROL_DEVICES[1:] if (dev_root / name).exists())
    for name in paths:
        response.devices.append(
            api_pb2.DeviceSpec(
                container_path=f"/dev/{name}", host_path=str(dev_root / name), permissions="rw"
            )
        )
