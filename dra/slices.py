"""The ResourceSlices of one node: pure functions of a snapshot, the pool's policy and health.

CONTRACT FILE: ``nodeagent dra slices`` prints what :func:`build_slices` returns, and the
publisher sends exactly those objects, so what an operator sees is what the API server gets.

One pool per node, named after the node. Devices:

* ``gpu-<index>``: a whole GPU (type ``gpu``), published unless MIG is on and the GPU carries
  instances the driver did not create (it is not whole then);
* ``gpu-<index>-mig-<profile>-<profile id>-<start>``: a MIG device (type ``mig``), NVIDIA's
  canonical name with the profile's dots removed and ``+`` as ``-``. A pre-existing instance is
  published with its UUID. With **dynamic MIG** every legal placement of every profile is a
  device too, created at NodePrepareResources.

Dynamic MIG uses partitionable devices (KEP-4815, the 1.35+ shape): one slice holds only the
``sharedCounters``, one counter set per GPU (``gpu-<index>-counter-set``) with a
``memory-slice-<i>`` counter per memory slice plus ``multiprocessors``, ``copy-engines``,
``decoders``, ``jpeg-engines`` and ``ofa-engines``; each GPU's devices are in a slice of their
own and consume from its set: a placement its profile's engines and the slices it covers, the
whole GPU every counter. The scheduler therefore never allocates two overlapping placements,
nor more media engines than the GPU has. Placements of each profile are listed in the order
the MIG planner prefers (least future capacity lost first, :mod:`nodeagent.capacity`): the
scheduler takes the first device that matches.

Health: a device the health source calls unhealthy or lost gets a ``NoSchedule`` taint
(DRADeviceTaints), a degraded one an informational ``None`` taint; the health model's quiet
period decides when a device is healthy again, so the taint goes with it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from nodeagent.capacity import memory_slices_of, nvlink_islands, preferred_placements, rank_order
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.types import (
    GpuInstance,
    GpuState,
    MigGeometry,
    MigProfile,
    NodeSnapshot,
    Placement,
)
from nodeagent.labels import gpu_family
from nodeagent.runtime.health_source import (
    DeviceHealth,
    HealthSource,
    HealthState,
    NodeHealthSource,
)

API_VERSION = "resource.k8s.io/v1"
DRIVER = "gpu.nodeagent.io"
STANDARD = "resource.kubernetes.io"  # the standard attribute domain (pciBusID, numaNode)
MAX_DEVICES = 128  # per slice
MAX_DEVICES_PARTITIONABLE = 64  # per slice, when a device has taints or consumes counters
MAX_COUNTER_SETS = 8  # per slice
ENGINE_COUNTERS = ("multiprocessors", "copy-engines", "decoders", "jpeg-engines", "ofa-engines")
UNHEALTHY_TAINT = "unhealthy"  # key suffix under the driver's domain
DEGRADED_TAINT = "degraded"

# GFD's family name -> the architecture NVML names (what NVIDIA's driver publishes).
_ARCHITECTURES = {
    "volta": "Volta",
    "turing": "Turing",
    "ampere": "Ampere",
    "ada-lovelace": "Ada Lovelace",
    "hopper": "Hopper",
    "blackwell": "Blackwell",
}


@dataclass(frozen=True, slots=True)
class DraDevice:
    """What a published device name stands for (what the plugin prepares)."""

    name: str
    kind: Literal["gpu", "mig"]
    gpu_index: int
    gpu_uuid: str
    profile: str | None = None
    placement: Placement | None = None
    uuid: str | None = None  # the MIG device's UUID when it exists now
    dynamic: bool = False  # a placement created at prepare (dynamic MIG)


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """Everything beyond the snapshot that decides the slices."""

    node_name: str
    driver: str = DRIVER
    pool: str = "default"  # the nodeagent pool (an attribute; the DRA pool is the node)
    dynamic_mig: bool = False
    # Publish only the placements the planner would pick (per profile, those losing the least
    # future capacity), so the scheduler cannot strand slices; allocated ones stay listed.
    withdraw_stranding: bool = False
    # (GPU index, profile, placement start) of the instances the driver created at prepare.
    managed: frozenset[tuple[int, str, int]] = frozenset()
    health: Mapping[str, DeviceHealth] = field(default_factory=dict)
    stability: str | None = None  # the node's stability level
    generation: int = 1
    node_uid: str | None = None  # the Node's UID: slices are owned by it when known


@dataclass(frozen=True, slots=True)
class Publication:
    """The slices to send and the device table behind them."""

    slices: tuple[dict[str, Any], ...]
    # Every device name the driver can prepare now, published or withdrawn.
    devices: Mapping[str, DraDevice]

    def content_key(self) -> str:
        """The slices without the pool generation: equal keys mean nothing to publish."""
        bare = []
        for s in self.slices:
            spec = {k: v for k, v in s["spec"].items() if k != "pool"}
            bare.append({"name": s["metadata"]["name"], "spec": spec})
        return json.dumps(bare, sort_keys=True)


def slice_spec(
    config: AgentConfig,
    health: HealthSource | None,
    *,
    managed: frozenset[tuple[int, str, int]],
    generation: int = 1,
    node_uid: str | None = None,
    node_name: str | None = None,
    dynamic_mig: bool | None = None,
) -> SliceSpec:
    """What beyond the snapshot decides the slices, from the agent config and the health source.

    The one place both the live driver and ``nodeagent dra slices`` take it from, so the command
    shows the taints the driver publishes. ``health`` None: the agent runs no health model, and
    no device is tainted. ``node_name`` and ``dynamic_mig`` override the config's (the command's
    options).
    """
    stability = None
    if isinstance(health, NodeHealthSource):
        level = health.node_health().level
        stability = level if level != "unknown" else None
    return SliceSpec(
        node_name=node_name or config.node_name,
        driver=config.dra.driver_name,
        pool=config.node.pool,
        dynamic_mig=config.pool.dra.dynamic_mig if dynamic_mig is None else dynamic_mig,
        withdraw_stranding=config.pool.dra.withdraw_stranding,
        managed=managed,
        health=dict(health.device_health()) if health is not None else {},
        stability=stability,
        generation=generation,
        node_uid=node_uid,
    )


def semver(version: str) -> str:
    """A driver or CUDA version as semver: "570.124.06" -> "570.124.6", "12.8" -> "12.8.0"."""
    parts = [str(int(p)) if p.isdigit() else "0" for p in version.split(".")[:3]]
    while len(parts) < 3:
        parts.append("0")
    return ".".join(parts)


def profile_token(profile: str) -> str:
    """A profile name as part of a device name: "1g.10gb+me" -> "1g10gb-me"."""
    return profile.lower().replace(".", "").replace("+", "-")


def mig_device_name(gpu_index: int, profile: MigProfile, placement: Placement) -> str:
    """``gpu-0-mig-3g40gb-9-4``: parent, profile, GI profile ID, placement start."""
    return (
        f"gpu-{gpu_index}-mig-{profile_token(profile.name)}-{profile.profile_id}-{placement.start}"
    )


def counter_set_name(gpu_index: int) -> str:
    """NVIDIA's name of a GPU's counter set."""
    return f"gpu-{gpu_index}-counter-set"


def slice_name(node_name: str, driver: str, suffix: str) -> str:
    """``<node>-<driver>-<suffix>``, shortened with a hash when it would exceed 253 characters."""
    name = f"{node_name}-{driver}-{suffix}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{node_name[: 253 - len(suffix) - 12]}-{digest}-{suffix}"


def _rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _string(v: str) -> dict[str, Any]:
    return {"string": v[:64]}


class _Builder:
    def __init__(self, snapshot: NodeSnapshot, spec: SliceSpec) -> None:
        self.snapshot = snapshot
        self.spec = spec
        indices = [g.info.index for g in snapshot.gpus]
        self.island: dict[int, tuple[int, ...]] = {}
        for group in nvlink_islands(indices, snapshot.topology):
            for i in group:
                self.island[i] = group
        self.devices: dict[str, DraDevice] = {}

    # attributes ----------------------------------------------------------------------------

    def _common(self, gpu: GpuState) -> dict[str, dict[str, Any]]:
        info = gpu.info
        major, minor = info.compute_capability
        attrs: dict[str, dict[str, Any]] = {
            "productName": _string(info.name),
            "cudaComputeCapability": {"version": f"{major}.{minor}.0"},
            "driverVersion": {
                "version": semver(info.driver_version or self.snapshot.driver_version)
            },
            "cudaDriverVersion": {
                "version": semver(info.cuda_driver_version or self.snapshot.cuda_driver_version)
            },
            "pool": _string(self.spec.pool),
            f"{STANDARD}/pciBusID": _string(_pci(info.pci_bus_id)),
        }
        family = gpu_family(info.compute_capability)
        if family:
            attrs["architecture"] = _string(_ARCHITECTURES.get(family, family))
        if info.numa_node is not None:
            attrs[f"{STANDARD}/numaNode"] = {"int": info.numa_node}
        group = self.island.get(info.index, (info.index,))
        attrs["nvlinkIsland"] = {"int": group[0]}
        attrs["nvlinkIslandSize"] = {"int": len(group)}
        if self.spec.stability:
            attrs["stability"] = _string(self.spec.stability)
        return attrs

    def _taints(self, uuids: Sequence[str | None]) -> list[dict[str, Any]]:
        worst: DeviceHealth | None = None
        for uuid in uuids:
            h = self.spec.health.get(uuid) if uuid else None
            if h is not None and (worst is None or _rank(h.state) > _rank(worst.state)):
                worst = h
        if worst is None or worst.state is HealthState.HEALTHY:
            return []
        bad = not worst.state.schedulable
        key = f"{self.spec.driver}/{UNHEALTHY_TAINT if bad else DEGRADED_TAINT}"
        return [
            {
                "key": key,
                "value": worst.state.value,
                "effect": "NoSchedule" if bad else "None",
                "timeAdded": _rfc3339(worst.since_s),
            }
        ]

    # devices -------------------------------------------------------------------------------

    def gpu_device(self, gpu: GpuState, counters: Sequence[str] | None) -> dict[str, Any]:
        info = gpu.info
        name = f"gpu-{info.index}"
        attrs = {
            "type": _string("gpu"),
            "uuid": _string(info.uuid),
            "index": {"int": info.index},
            "migCapable": {"bool": info.mig_capable},
            "migEnabled": {"bool": info.mig_enabled},
            **self._common(gpu),
        }
        if info.minor_number is not None:
            attrs["minor"] = {"int": info.minor_number}
        device: dict[str, Any] = {
            "name": name,
            "attributes": attrs,
            "capacity": {"memory": {"value": str(info.memory_total_bytes)}},
        }
        if counters is not None:
            device["consumesCounters"] = [
                {
                    "counterSet": counter_set_name(info.index),
                    "counters": {c: {"value": v} for c, v in self.full_counters(gpu).items()},
                }
            ]
        taints = self._taints([info.uuid])
        if taints:
            device["taints"] = taints
        self.devices[name] = DraDevice(name, "gpu", info.index, info.uuid, uuid=info.uuid)
        return device

    def mig_device(
        self,
        gpu: GpuState,
        profile: MigProfile,
        placement: Placement,
        *,
        uuid: str | None,
        dynamic: bool,
    ) -> dict[str, Any]:
        info = gpu.info
        name = mig_device_name(info.index, profile, placement)
        attrs = {
            "type": _string("mig"),
            "profile": _string(profile.name),
            "parentUUID": _string(info.uuid),
            "parentIndex": {"int": info.index},
            "placementStart": {"int": placement.start},
            "placementSize": {"int": placement.size},
            "dynamic": {"bool": dynamic},
            **self._common(gpu),
        }
        if uuid is not None:
            attrs["uuid"] = _string(uuid)
        device: dict[str, Any] = {
            "name": name,
            "attributes": attrs,
            "capacity": {
                "memory": {"value": str(profile.memory_bytes)},
                "multiprocessors": {"value": str(profile.multiprocessors)},
                "copyEngines": {"value": str(profile.copy_engines)},
                "decoders": {"value": str(profile.decoders)},
                "jpegEngines": {"value": str(profile.jpeg_decoders)},
                "ofaEngines": {"value": str(profile.ofa)},
            },
        }
        if dynamic:
            device["consumesCounters"] = [
                {
                    "counterSet": counter_set_name(info.index),
                    "counters": {
                        c: {"value": v}
                        for c, v in self.profile_counters(profile, placement).items()
                    },
                }
            ]
        taints = self._taints([info.uuid, uuid])
        if taints:
            device["taints"] = taints
        self.devices[name] = DraDevice(
            name, "mig", info.index, info.uuid, profile.name, placement, uuid, dynamic
        )
        return device

    # counters ------------------------------------------------------------------------------

    @staticmethod
    def _largest(geometry: MigGeometry) -> MigProfile:
        return max(geometry.profiles, key=lambda p: (memory_slices_of(p), p.multiprocessors))

    def full_counters(self, gpu: GpuState) -> dict[str, str]:
        geometry = gpu.mig_geometry
        assert geometry is not None
        whole = self._largest(geometry)
        out = {f"memory-slice-{i}": "1" for i in range(geometry.memory_slices)}
        out.update(_engines(whole))
        return out

    @staticmethod
    def profile_counters(profile: MigProfile, placement: Placement) -> dict[str, str]:
        out = {f"memory-slice-{i}": "1" for i in range(placement.start, placement.end)}
        out.update(_engines(profile))
        return {k: v for k, v in out.items() if v != "0"}

    def counter_set(self, gpu: GpuState) -> dict[str, Any]:
        return {
            "name": counter_set_name(gpu.info.index),
            "counters": {c: {"value": v} for c, v in self.full_counters(gpu).items()},
        }

    # per GPU -------------------------------------------------------------------------------

    def gpu_devices(self, gpu: GpuState) -> tuple[list[dict[str, Any]], bool]:
        """(devices, whether they consume the GPU's counter set)."""
        info = gpu.info
        geometry = gpu.mig_geometry
        instances = gpu.mig_instances
        if not info.mig_enabled or geometry is None:
            return [self.gpu_device(gpu, None)], False
        static = [
            gi
            for gi in instances
            if (info.index, gi.profile, gi.placement.start) not in self.spec.managed
        ]
        out: list[dict[str, Any]] = []
        if not self.spec.dynamic_mig:
            for gi in static:
                out += self._static(gpu, geometry, gi)
            return out, False
        if not static:
            out.append(self.gpu_device(gpu, "all"))
        for gi in static:
            out += self._static(gpu, geometry, gi)
        by_start = {(gi.profile, gi.placement.start): gi for gi in instances}
        for name in rank_order(geometry):
            profile = geometry.profile(name)
            assert profile is not None
            preferred = preferred_placements(geometry, instances, name)
            if self.spec.withdraw_stranding and preferred:
                preferred = preferred[:1]
            rest = [
                p for p in sorted(profile.placements, key=lambda q: q.start) if p not in preferred
            ]
            for placement in preferred + rest:
                if any(placement.overlaps(gi.placement) for gi in static):
                    continue
                held = by_start.get((name, placement.start))
                published = placement in preferred or held is not None
                if self.spec.withdraw_stranding and not published:
                    # Withdrawn, but still preparable if an allocation already names it.
                    self.devices.setdefault(
                        mig_device_name(info.index, profile, placement),
                        DraDevice(
                            mig_device_name(info.index, profile, placement),
                            "mig",
                            info.index,
                            info.uuid,
                            name,
                            placement,
                            None,
                            True,
                        ),
                    )
                    continue
                out.append(
                    self.mig_device(
                        gpu,
                        profile,
                        placement,
                        uuid=held.uuid if held is not None else None,
                        dynamic=True,
                    )
                )
        return out, True

    def _static(
        self, gpu: GpuState, geometry: MigGeometry, gi: GpuInstance
    ) -> list[dict[str, Any]]:
        profile = geometry.profile(gi.profile)
        if profile is None or gi.uuid is None:
            return []  # a half-made instance (no compute instance) serves nothing
        return [self.mig_device(gpu, profile, gi.placement, uuid=gi.uuid, dynamic=False)]

    # slices --------------------------------------------------------------------------------

    def build(self) -> Publication:
        spec = self.spec
        bodies: list[tuple[str, dict[str, Any]]] = []
        counter_sets: list[dict[str, Any]] = []
        for gpu in self.snapshot.gpus:
            if gpu.lost:
                continue  # a lost GPU serves nothing; its devices are withdrawn
            devices, partitioned = self.gpu_devices(gpu)
            limit = MAX_DEVICES_PARTITIONABLE if partitioned or _tainted(devices) else MAX_DEVICES
            if partitioned:
                counter_sets.append(self.counter_set(gpu))
            for n, start in enumerate(range(0, max(len(devices), 1), limit)):
                suffix = f"gpu-{gpu.info.index}" + (f"-{n}" if n else "")
                bodies.append((suffix, {"devices": devices[start : start + limit]}))
        for n, start in enumerate(range(0, len(counter_sets), MAX_COUNTER_SETS)):
            suffix = "counters" + (f"-{n}" if n else "")
            bodies.insert(
                n, (suffix, {"sharedCounters": counter_sets[start : start + MAX_COUNTER_SETS]})
            )
        if not bodies:
            bodies.append(("gpus", {"devices": []}))
        slices = []
        for suffix, body in bodies:
            meta: dict[str, Any] = {
                "name": slice_name(spec.node_name, spec.driver, suffix),
                "labels": {"app.kubernetes.io/managed-by": "nodeagent"},
            }
            if spec.node_uid:
                meta["ownerReferences"] = [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": spec.node_name,
                        "uid": spec.node_uid,
                        "controller": True,
                    }
                ]
            slices.append(
                {
                    "apiVersion": API_VERSION,
                    "kind": "ResourceSlice",
                    "metadata": meta,
                    "spec": {
                        "driver": spec.driver,
                        "pool": {
                            "name": spec.node_name,
                            "generation": spec.generation,
                            "resourceSliceCount": len(bodies),
                        },
                        "nodeName": spec.node_name,
                        **body,
                    },
                }
            )
        return Publication(tuple(slices), dict(self.devices))


def _engines(profile: MigProfile) -> dict[str, str]:
    values = (
        profile.multiprocessors,
        profile.copy_engines,
        profile.decoders,
        profile.jpeg_decoders,
        profile.ofa,
    )
    return {name: str(v) for name, v in zip(ENGINE_COUNTERS, values, strict=True)}


def _rank(state: HealthState) -> int:
    return list(HealthState).index(state)


def _tainted(devices: Sequence[Mapping[str, Any]]) -> bool:
    return any("taints" in d for d in devices)


def _pci(bus_id: str) -> str:
    """NVML's "00000000:18:00.0" as the standard attribute's "0000:18:00.0"."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{domain[-4:]}:{rest}" if rest else bus_id.lower()


def build_slices(snapshot: NodeSnapshot, spec: SliceSpec) -> Publication:
    """The ResourceSlices this node publishes, and what each device name stands for."""
    return _Builder(snapshot, spec).build()
