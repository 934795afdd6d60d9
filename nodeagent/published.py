"""What an agent publishes about its GPUs for the cluster: the ``nodeagent.io/gpu-state`` codec.

CONTRACT FILE: the agent encodes this annotation from its snapshot (:func:`publish`,
:func:`encode`) and the tiering service decodes it (:func:`decode`) to explain why GPU workloads
are pending; both sides use this module, so the format cannot drift. The name of the annotation
is :data:`nodeagent.labels.GPU_STATE_ANNOTATION`.

The service must be able to run the MIG planner exactly without NVML, so the annotation carries
each GPU's MIG instances with their placements and the GPU model's placement rules. Version 1,
compact JSON (about 1.9 kB for an 8x H100 node split into 56 ``1g.10gb`` instances)::

    {"v": 1,
     "pr": true,                       # allocations come from the kubelet's pod-resources API
     "models": {"NVIDIA H100 80GB HBM3": {"s": 8, "p": [["3g.40gb", 4, 3, 2, [0, 4]], ...]}},
     "gpus": [{"i": 0, "m": "NVIDIA H100 80GB HBM3", "h": "healthy", "nv": 0, "numa": 0,
               "mig": [["1g.10gb", 0, 1, "b"], ...],   # profile, start, size, flags
               "b": true, "a": "team-a/train-0",       # whole GPU: busy, holder
               "ps": ["team-a/train-0"],               # every pod holding it or its MIG devices
               "if": 0.42, "sw": 3,                    # shared: interference, workloads
               "sm": 0.9, "dr": 0.4}]}                 # shared, GPM: SM and DRAM activity

- ``models``: per GPU model with MIG enabled on some GPU, its memory slices (``s``) and its
  profiles as ``[name, memory slices, compute slices, max count, [legal starts]]``;
- ``gpus``: per GPU its index, model, health state (``healthy``, ``degraded``, ``unhealthy``,
  ``lost``), NVLink island (``nv``: the lowest GPU index of the NVLink-connected group it belongs
  to) and NUMA node; ``mig`` is present while MIG is enabled: one entry per GPU instance, with
  flags ``b`` (processes run on it) and ``a`` (the kubelet allocated it to a pod);
- a whole GPU (MIG off) carries ``b`` when processes run on it and ``a`` with the pod that holds
  it, known only with pod-resources (``pr``). Without ``pr`` the service counts allocations from
  the pods' requests instead (see docs/tiering.md).

An unknown version is an error for the reader (:class:`PublishedError`), never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from nodeagent.capacity import memory_slices_of, nvlink_islands
from nodeagent.gpu.types import GpuState, MigGeometry, MigProfile, NodeSnapshot, Placement

VERSION = 1
SCHEDULABLE = frozenset({"healthy", "degraded"})  # the device plugin advertises these Healthy


class PublishedError(ValueError):
    """The annotation cannot be read (not JSON, unknown version, wrong shape)."""


@dataclass(frozen=True, slots=True)
class PublishedInstance:
    """One MIG GPU instance as published."""

    profile: str
    start: int
    size: int
    busy: bool = False  # processes run on it
    allocated: bool = False  # the kubelet gave it to a pod (known only with pod-resources)

    @property
    def placement(self) -> Placement:
        """Its placement in memory slices."""
        return Placement(self.start, self.size)


@dataclass(frozen=True, slots=True)
class PublishedGpu:
    """One GPU as published."""

    index: int
    model: str
    health: str = "healthy"
    island: int = 0  # lowest GPU index of its NVLink-connected group
    numa: int | None = None
    mig: tuple[PublishedInstance, ...] | None = None  # None while MIG is disabled
    busy: bool = False  # whole GPU: processes run on it
    holder: str | None = None  # whole GPU: "namespace/pod" holding it (pod-resources)
    # Every "namespace/pod" holding the GPU or one of its MIG devices (replicas of a shared
    # GPU included): the pods a remediation of this one GPU evicts (pod-resources).
    pods: tuple[str, ...] = ()
    # Shared GPU (two or more workloads on it or one of its MIG devices): the worst device's
    # interference ratio and its workload count (see docs/sharing.md); None when not shared.
    interference: float | None = None
    shared_workloads: int = 0
    # Shared GPU on a GPU with profiling (GPM): the SM and DRAM activity ratios (0..1) of the
    # last interval, at one decimal (finer changes would re-patch the node for noise). None
    # where not shared or not measured: coarse utilisation alone cannot tell contention from
    # time-slice overhead.
    sm_active: float | None = None
    dram_active: float | None = None

    @property
    def schedulable(self) -> bool:
        """Whether the device plugin advertises it (or its MIG devices) as Healthy."""
        return self.health in SCHEDULABLE


@dataclass(frozen=True, slots=True)
class PublishedNode:
    """Every GPU of a node, the MIG rules of its models, and whether allocations are known."""

    gpus: tuple[PublishedGpu, ...]
    geometries: Mapping[str, MigGeometry] = field(default_factory=dict)
    allocations_known: bool = False

    def geometry(self, model: str) -> MigGeometry | None:
        """The MIG rules of ``model``, or ``None`` when no GPU of it has MIG enabled."""
        return self.geometries.get(model)


def publish(
    snapshot: NodeSnapshot,
    health: Mapping[str, str] | None = None,
    allocations: Mapping[str, str] | None = None,
    pods: Mapping[str, Sequence[str]] | None = None,
    shared: Mapping[str, tuple[float, int]] | None = None,
) -> PublishedNode:
    """The published view of ``snapshot``.

    ``health`` maps a GPU UUID to its health state (absent GPUs count as healthy unless lost);
    ``allocations`` maps device UUIDs (``GPU-...`` and ``MIG-...``) to the ``namespace/pod``
    holding them, or is ``None`` when the kubelet's pod-resources API is not read; ``pods``
    maps a device UUID to every pod holding it (several on a shared GPU); ``shared`` maps a GPU
    UUID to (interference ratio, workloads) of its worst shared device.
    """
    health = health or {}
    indices = [g.info.index for g in snapshot.gpus]
    island_of = {i: group[0] for group in nvlink_islands(indices, snapshot.topology) for i in group}
    geometries: dict[str, MigGeometry] = {}
    gpus: list[PublishedGpu] = []
    for gpu in sorted(snapshot.gpus, key=lambda g: g.info.index):
        info = gpu.info
        state = health.get(info.uuid) or ("lost" if gpu.lost else "healthy")
        mig: tuple[PublishedInstance, ...] | None = None
        if info.mig_enabled:
            if gpu.mig_geometry is not None:
                geometries.setdefault(info.name, gpu.mig_geometry)
            mig = tuple(
                PublishedInstance(
                    gi.profile,
                    gi.placement.start,
                    gi.placement.size,
                    busy=gi.busy,
                    allocated=allocations is not None
                    and any(ci.uuid in allocations for ci in gi.compute_instances),
                )
                for gi in sorted(gpu.mig_instances, key=lambda g: g.placement.start)
            )
        processes = gpu.telemetry.processes if gpu.telemetry is not None else ()
        gpus.append(
            PublishedGpu(
                index=info.index,
                model=info.name,
                health=state,
                island=island_of.get(info.index, info.index),
                numa=info.numa_node,
                mig=mig,
                busy=mig is None and bool(processes),
                holder=(allocations or {}).get(info.uuid) if mig is None else None,
                pods=_pods_of(gpu, pods or {}),
                interference=(shared or {}).get(info.uuid, (None, 0))[0],
                shared_workloads=(shared or {}).get(info.uuid, (None, 0))[1],
                sm_active=_activity(gpu, shared, "sm_active_ratio"),
                dram_active=_activity(gpu, shared, "dram_active_ratio"),
            )
        )
    return PublishedNode(tuple(gpus), geometries, allocations is not None)


def _activity(
    gpu: GpuState, shared: Mapping[str, tuple[float, int]] | None, field_name: str
) -> float | None:
    """A profiling ratio of a shared GPU, at one decimal; None when unshared or unmeasured."""
    if gpu.profiling is None or gpu.info.uuid not in (shared or {}):
        return None
    value = getattr(gpu.profiling, field_name)
    return None if value is None else round(float(value), 1)


def _pods_of(gpu: GpuState, pods: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    uuids = [gpu.info.uuid]
    uuids += [ci.uuid for gi in gpu.mig_instances for ci in gi.compute_instances]
    return tuple(sorted({p for uuid in uuids for p in pods.get(uuid, ())}))


# --- the wire format ----------------------------------------------------------------------------


def _profile_row(p: MigProfile) -> list[Any]:
    starts = sorted(q.start for q in p.placements)
    return [p.name, memory_slices_of(p), p.compute_slices, p.max_count, starts]


def _encode_gpu(g: PublishedGpu) -> dict[str, Any]:
    out: dict[str, Any] = {"i": g.index, "m": g.model, "h": g.health, "nv": g.island}
    if g.numa is not None:
        out["numa"] = g.numa
    if g.mig is not None:
        out["mig"] = [
            [i.profile, i.start, i.size, ("b" if i.busy else "") + ("a" if i.allocated else "")]
            for i in g.mig
        ]
    if g.busy:
        out["b"] = True
    if g.holder is not None:
        out["a"] = g.holder
    if g.pods:
        out["ps"] = list(g.pods)
    if g.interference is not None:
        out["if"] = round(g.interference, 2)  # finer changes are noise: no patch for them
        out["sw"] = g.shared_workloads
    if g.sm_active is not None:
        out["sm"] = g.sm_active
    if g.dram_active is not None:
        out["dr"] = g.dram_active
    return out


def encode(node: PublishedNode) -> str:
    """The annotation value (compact JSON, keys in a fixed order so equal states are equal)."""
    data = {
        "v": VERSION,
        "pr": node.allocations_known,
        "models": {
            name: {"s": geo.memory_slices, "p": [_profile_row(p) for p in geo.profiles]}
            for name, geo in sorted(node.geometries.items())
        },
        "gpus": [_encode_gpu(g) for g in node.gpus],
    }
    return json.dumps(data, separators=(",", ":"))


@lru_cache(maxsize=256)
def _geometry(model: str, memory_slices: int, rows: tuple[Any, ...]) -> MigGeometry:
    """One shared object per distinct geometry, so the planner's caches hit across nodes."""
    profiles = tuple(
        MigProfile(
            name=name,
            profile_id=0,  # NVML's IDs are not published: the planner never needs them
            nvml_index=0,
            slices=size,
            compute_slices=compute,
            multiprocessors=0,
            memory_bytes=0,
            max_count=max_count,
            copy_engines=0,
            decoders=0,
            jpeg_decoders=0,
            ofa=0,
            placements=tuple(Placement(s, size) for s in starts),
        )
        for name, size, compute, max_count, starts in rows
    )
    return MigGeometry(model=model, memory_slices=memory_slices, profiles=profiles)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PublishedError(f"{what}: expected an integer, got {value!r}")
    return value


def _decode_models(raw: Any) -> dict[str, MigGeometry]:
    if not isinstance(raw, dict):
        raise PublishedError("models: expected an object")
    out = {}
    for model, body in raw.items():
        if not isinstance(body, dict) or not isinstance(body.get("p"), list):
            raise PublishedError(f"models.{model}: expected {{s, p}}")
        rows = []
        for row in body["p"]:
            if not (isinstance(row, list) and len(row) == 5 and isinstance(row[0], str)):
                raise PublishedError(f"models.{model}: bad profile row {row!r}")
            if not isinstance(row[4], list):
                raise PublishedError(f"models.{model}.{row[0]}: starts must be a list")
            starts = tuple(_int(s, f"models.{model}.{row[0]} start") for s in row[4])
            rows.append(
                (
                    row[0],
                    _int(row[1], "size"),
                    _int(row[2], "compute"),
                    _int(row[3], "max"),
                    starts,
                )
            )
        out[str(model)] = _geometry(str(model), _int(body.get("s"), "s"), tuple(rows))
    return out


def _decode_gpu(raw: Any) -> PublishedGpu:
    if not isinstance(raw, dict):
        raise PublishedError("gpus: expected objects")
    mig: tuple[PublishedInstance, ...] | None = None
    if "mig" in raw:
        items = []
        for row in raw["mig"]:
            if not (isinstance(row, list) and len(row) == 4):
                raise PublishedError(f"gpus.{raw.get('i')}.mig: bad instance {row!r}")
            flags = str(row[3])
            items.append(
                PublishedInstance(
                    str(row[0]),
                    _int(row[1], "start"),
                    _int(row[2], "size"),
                    busy="b" in flags,
                    allocated="a" in flags,
                )
            )
        mig = tuple(items)
    numa = raw.get("numa")
    holder = raw.get("a")
    pods = raw.get("ps", [])
    if not isinstance(pods, list):
        raise PublishedError(f"gpus.{raw.get('i')}.ps: expected a list of namespace/pod")
    return PublishedGpu(
        index=_int(raw.get("i"), "gpus.i"),
        model=str(raw.get("m", "")),
        health=str(raw.get("h", "healthy")),
        island=_int(raw.get("nv", raw.get("i")), "gpus.nv"),
        numa=_int(numa, "gpus.numa") if numa is not None else None,
        mig=mig,
        busy=bool(raw.get("b", False)),
        holder=str(holder) if holder is not None else None,
        pods=tuple(str(p) for p in pods),
        interference=float(raw["if"]) if raw.get("if") is not None else None,
        shared_workloads=_int(raw.get("sw", 0), "gpus.sw"),
        sm_active=_ratio(raw.get("sm"), "gpus.sm"),
        dram_active=_ratio(raw.get("dr"), "gpus.dr"),
    )


def _ratio(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise PublishedError(f"{what}: expected a ratio from 0 to 1, not {value!r}")
    return float(value)


@lru_cache(maxsize=8192)
def decode(text: str) -> PublishedNode:
    """Read an annotation value (cached by text: most nodes do not change between passes).

    Raises:
        PublishedError: not JSON, another version, or not the documented shape.
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PublishedError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PublishedError("expected a JSON object")
    if data.get("v") != VERSION:
        raise PublishedError(f"version {data.get('v')!r} is not {VERSION}")
    gpus = data.get("gpus")
    if not isinstance(gpus, list):
        raise PublishedError("gpus: expected a list")
    return PublishedNode(
        tuple(_decode_gpu(g) for g in gpus),
        _decode_models(data.get("models", {})),
        bool(data.get("pr", False)),
    )
