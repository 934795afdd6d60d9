"""From a node snapshot and the config to the resources the plugin advertises.

Pure functions over :class:`NodeSnapshot`: which resource names exist (NVIDIA's MIG strategies
and names), which devices each has (GPU UUID, MIG UUID, or ``<uuid>::<n>`` replicas), and how
each physical GPU is shared. Sharing is decided per GPU, so one node can mix exclusive,
time-sliced and MPS GPUs with different replica counts.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

from nodeagent.config.device_plugin import (
    RESOURCE_PREFIX,
    SHARED_SUFFIX,
    DevicePluginSection,
    MigStrategy,
)
from nodeagent.config.pool_policy import PoolPolicy, Sharing, SharingMode
from nodeagent.gpu.types import GpuInstance, GpuState, NodeSnapshot

log = logging.getLogger(__name__)

GPU_RESOURCE = RESOURCE_PREFIX + "gpu"
REPLICA_SEPARATOR = "::"
MAX_DEVICE_ID_LENGTH = 63  # the kubelet's limit on Device.ID
_EXCLUSIVE = Sharing()


class ResourceError(ValueError):
    """The node cannot be advertised under the configured strategy (one-line reason)."""


@dataclass(frozen=True, slots=True)
class PluginDevice:
    """One device as the kubelet sees it, with what Allocate needs to hand it to a container."""

    id: str  # advertised ID: the UUID, or `<uuid>::<n>` for a replica
    uuid: str  # GPU-... or MIG-...: what the container runtime is told
    gpu_index: int  # index of the physical GPU
    gpu_uuid: str  # UUID of the physical GPU
    minor_number: int  # /dev/nvidia<minor> of the physical GPU
    numa_node: int | None
    mig_profile: str | None  # set for MIG devices
    replica: int | None  # replica number for shared devices
    sharing: Sharing  # how the physical GPU is shared
    mig_ids: tuple[int, int] | None = None  # (GPU instance, compute instance) of a MIG device

    @property
    def shared(self) -> bool:
        """Whether this is a replica of a time-sliced or MPS device."""
        return self.replica is not None


@dataclass(frozen=True, slots=True)
class Resource:
    """One resource name and its devices, in advertisement order."""

    name: str
    devices: tuple[PluginDevice, ...]

    @property
    def socket_name(self) -> str:
        """The socket file for this resource: `nodeagent-<name without prefix>.sock`."""
        short = self.name.removeprefix(RESOURCE_PREFIX)
        return f"nodeagent-{re.sub(r'[^A-Za-z0-9.-]', '-', short)}.sock"

    def by_id(self) -> dict[str, PluginDevice]:
        """The devices keyed by advertised ID."""
        return {d.id: d for d in self.devices}


def mig_resource_name(profile: str) -> str:
    """NVIDIA's mixed-strategy name of a MIG profile: `nvidia.com/mig-1g.10gb` (`+` -> `.`)."""
    return f"{RESOURCE_PREFIX}mig-{profile.replace('+', '.')}"


def _full_instance_uuid(instance: GpuInstance) -> str | None:
    """The MIG UUID of an instance whose single compute instance spans it (NVIDIA's C == G).

    Instances sub-sliced into several compute instances are not advertised, as NVIDIA's plugin.
    """
    match = re.match(r"(\d+)g\.", instance.profile)
    if match is None or len(instance.compute_instances) != 1:
        return None
    ci = instance.compute_instances[0]
    return ci.uuid if ci.slice_count == int(match.group(1)) else None


class SharingResolver:
    """Per-GPU sharing: explicit pool `gpu_sharing`, then NVIDIA-shaped config, then the default."""

    def __init__(self, pool: PoolPolicy, section: DevicePluginSection) -> None:
        self.pool = pool
        self.section = section

    def sharing_for(self, gpu: GpuState, position: int, resource: str) -> Sharing:
        """How the devices of ``gpu`` under ``resource`` are shared."""
        info = gpu.info
        explicit = self.pool.gpu_sharing.get(info.uuid) or self.pool.gpu_sharing.get(
            str(info.index)
        )
        if explicit is not None:
            return explicit
        if self.section.sharing is not None:
            nvidia = self.section.sharing.sharing_for(resource, info.index, info.uuid, position)
            return nvidia if nvidia is not None else _EXCLUSIVE
        return self.pool.sharing


def _expand(
    base: str, uuid: str, gpu: GpuState, sharing: Sharing, instance: GpuInstance | None
) -> tuple[str, list[PluginDevice]]:
    """The resource name and devices for one GPU or MIG device under its sharing."""
    info = gpu.info

    def device(device_id: str, replica: int | None) -> PluginDevice:
        return PluginDevice(
            id=device_id,
            uuid=uuid,
            gpu_index=info.index,
            gpu_uuid=info.uuid,
            minor_number=info.minor_number if info.minor_number is not None else info.index,
            numa_node=info.numa_node,
            mig_profile=instance.profile if instance is not None else None,
            replica=replica,
            sharing=sharing,
            mig_ids=(
                (instance.instance_id, instance.compute_instances[0].instance_id)
                if instance is not None and instance.compute_instances
                else None
            ),
        )

    if sharing.mode is SharingMode.EXCLUSIVE:
        return base, [device(uuid, None)]
    name = base + SHARED_SUFFIX if sharing.rename_shared else base
    devices = [device(f"{uuid}{REPLICA_SEPARATOR}{n}", n) for n in range(sharing.replicas)]
    return name, devices


def build_resources(
    snapshot: NodeSnapshot, pool: PoolPolicy, section: DevicePluginSection
) -> dict[str, Resource]:
    """Every resource the node advertises, keyed by name. Raises ResourceError on a rule break.

    Lost GPUs keep their devices (they are advertised Unhealthy by the health layer) so that
    capacity does not silently shrink while a GPU is being investigated.
    """
    resolver = SharingResolver(pool, section)
    strategy = section.mig_strategy
    gpus = sorted(snapshot.gpus, key=lambda g: g.info.index)
    if strategy is MigStrategy.SINGLE:
        _check_single(gpus)
    out: dict[str, list[PluginDevice]] = {}
    for position, gpu in enumerate(gpus):
        if strategy is MigStrategy.NONE or not gpu.info.mig_enabled:
            sharing = resolver.sharing_for(gpu, position, GPU_RESOURCE)
            name, devices = _expand(GPU_RESOURCE, gpu.info.uuid, gpu, sharing, None)
            out.setdefault(name, []).extend(devices)
            continue
        for instance in gpu.mig_instances:
            uuid = _full_instance_uuid(instance)
            if uuid is None:
                log.warning(
                    "GPU %d: MIG instance %d (%s) is split into several compute instances; "
                    "not advertised",
                    gpu.info.index,
                    instance.instance_id,
                    instance.profile,
                )
                continue
            base = (
                GPU_RESOURCE
                if strategy is MigStrategy.SINGLE
                else mig_resource_name(instance.profile)
            )
            sharing = resolver.sharing_for(gpu, position, base)
            if sharing.mode is SharingMode.MPS:
                # MPS does not support MIG devices (NVIDIA's rule too); keep them exclusive.
                log.warning("GPU %d: MPS is not supported on MIG devices; exclusive", position)
                sharing = _EXCLUSIVE
            name, devices = _expand(base, uuid, gpu, sharing, instance)
            out.setdefault(name, []).extend(devices)
    for name, devices in out.items():
        too_long = [d.id for d in devices if len(d.id) > MAX_DEVICE_ID_LENGTH]
        if too_long:
            raise ResourceError(
                f"{name}: device IDs longer than {MAX_DEVICE_ID_LENGTH} characters: {too_long[0]}"
            )
    return {name: Resource(name, tuple(devices)) for name, devices in sorted(out.items())}


def _check_single(gpus: list[GpuState]) -> None:
    """NVIDIA's rules for the single strategy: one MIG mode and one MIG profile on the node."""
    modes = {g.info.mig_enabled for g in gpus}
    if len(modes) > 1:
        enabled = [g.info.index for g in gpus if g.info.mig_enabled]
        raise ResourceError(
            f"mig_strategy single needs every GPU in the same MIG mode; MIG is on for GPUs "
            f"{enabled} only (use mig_strategy mixed, or make the GPUs agree)"
        )
    profiles = {i.profile for g in gpus for i in g.mig_instances if g.info.mig_enabled}
    if len(profiles) > 1:
        raise ResourceError(
            f"mig_strategy single needs one MIG profile on the node, found "
            f"{', '.join(sorted(profiles))} (use mig_strategy mixed)"
        )


def summarize(resources: Mapping[str, Resource]) -> str:
    """`name=count` pairs for logs."""
    return ", ".join(f"{name}={len(r.devices)}" for name, r in resources.items()) or "none"
