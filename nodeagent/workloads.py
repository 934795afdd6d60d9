"""Which pod and container each GPU process belongs to, and what each workload uses.

Two facts are joined. The kubelet's pod-resources API says which containers hold a device
(``holders``); on a time-sliced or MPS GPU several do. A process's cgroup
(``/proc/<pid>/cgroup``) says which pod (UID) and container (runtime ID) it runs in, whatever
the device. The rules, per compute process on a device (a MIG device, else the GPU):

1. The cgroup names a pod the pod index knows (UID -> namespace/name, container ID -> name):
   that pod and container (``source="cgroup"``).
2. The cgroup names a pod the index does not know: the device's only holder pod if there is
   one, else the bare UID and container ID (no name).
3. The cgroup is readable and names no pod (a host process, such as the MPS server): no
   workload. Only where the cgroup cannot be read (no access to the host's ``/proc``) does the
   device's only holder container stand in (``source="pod-resources"``).

Nothing here calls NVML or the kubelet: the snapshot, the holders and the index are given, and
the cgroup files are read under a configurable proc root (a test writes them under a temporary
directory).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from nodeagent.gpu.types import ClockEventReason, GpuInstance, GpuState, NodeSnapshot, ProcessInfo

# A pod's cgroup directory: cgroupfs ``pod<uid>``, systemd ``kubepods-<qos>-pod<uid_>.slice``
# (``kubelet-kubepods-...`` where the kubelet runs in a slice of its own, as kind does).
_POD = re.compile(r"^(?:[a-z]+(?:-[a-z]+)*-)?pod([0-9a-fA-F]{8}[-_](?:[0-9a-fA-F]{4}[-_]){3}"
                  r"[0-9a-fA-F]{12})(?:\.slice)?$")  # fmt: skip
# A container's cgroup directory under its pod: the runtime's prefix (systemd: ``.scope``).
_CONTAINER = re.compile(
    r"^(?:(cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})(?:\.scope)?$"
)
_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}


@dataclass(frozen=True, slots=True)
class CgroupRef:
    """What a process's cgroup says: its pod UID and container ID (``None``: not in a pod)."""

    pod_uid: str | None
    container_id: str | None = None
    runtime: str | None = None  # containerd, cri-o, docker; None where the path does not say


NOT_IN_A_POD = CgroupRef(None)


def _from_path(path: str) -> CgroupRef | None:
    parts = [p for p in path.strip().split("/") if p]
    for i, part in enumerate(parts):
        pod = _POD.match(part)
        if pod is None:
            continue
        uid = pod.group(1).replace("_", "-").lower()
        for rest in parts[i + 1 :]:
            container = _CONTAINER.match(rest)
            if container is not None:
                prefix = container.group(1)
                return CgroupRef(uid, container.group(2), _RUNTIMES.get(prefix or "", prefix))
        return CgroupRef(uid)
    return None


def parse_cgroup(text: str) -> CgroupRef:
    """The pod and container in a ``/proc/<pid>/cgroup`` file (cgroup v1, v2 or hybrid).

    Each line is ``hierarchy:controllers:path``; v2 has the one line ``0::path``. Both kubelet
    cgroup drivers are understood: cgroupfs (``/kubepods/burstable/pod<uid>/<id>``) and systemd
    (``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
    cri-containerd-<id>.scope``), with the containerd, CRI-O and Docker container prefixes, also
    nested below another prefix (kind, a node in a container). A line that names a container
    wins over one that names the pod only (a v1 controller may stop at the pod).
    """
    best: CgroupRef | None = None
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        ref = _from_path(fields[2])
        if ref is None:
            continue
        if ref.container_id is not None:
            return ref
        best = best or ref
    return best or NOT_IN_A_POD


class CgroupReader:
    """Reads ``<proc_root>/<pid>/cgroup``, cached per PID while the PID stays on a GPU.

    Returns ``None`` where the file cannot be read (the process is gone, or the agent lacks the
    host's PID namespace), which the rules above treat as "unknown", not "not in a pod".
    """

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root
        self._cache: dict[int, CgroupRef | None] = {}
        self.reads = 0

    def __call__(self, pid: int) -> CgroupRef | None:
        if pid in self._cache:
            return self._cache[pid]
        self.reads += 1
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text(errors="replace")
        except OSError:
            ref = None
        else:
            ref = parse_cgroup(text)
        if ref is not None:
            self._cache[pid] = ref  # an unreadable file is tried again next time
        return ref

    def retain(self, pids: Iterable[int]) -> None:
        """Forget the PIDs not in ``pids`` (a PID that comes back may be another process)."""
        keep = set(pids)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]


class Holder(Protocol):
    """A container holding a device, as the pod-resources API reports it."""

    @property
    def uuid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def pod(self) -> str: ...
    @property
    def container(self) -> str: ...


@dataclass(frozen=True, slots=True)
class PodIndex:
    """The pods on this node, from the API server: UID -> (namespace, name), container ID ->
    (pod UID, container name)."""

    pods: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    containers: Mapping[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Workload:
    """A container a GPU process runs in. ``pod`` is empty where only the UID is known."""

    namespace: str
    pod: str
    container: str
    pod_uid: str | None = None
    container_id: str | None = None

    @property
    def named(self) -> bool:
        """The pod's name is known (it can be a metric label and an Event's object)."""
        return bool(self.pod)


@dataclass(frozen=True, slots=True)
class Device:
    """Where a process runs: a GPU, or a MIG device on it."""

    gpu_index: int
    gpu_uuid: str
    mig_uuid: str | None = None
    mig_profile: str | None = None
    mig_instance: int | None = None

    @property
    def uuid(self) -> str:
        """The device ID the kubelet knows: the MIG device's UUID, else the GPU's."""
        return self.mig_uuid or self.gpu_uuid


@dataclass(frozen=True, slots=True)
class AttributedProcess:
    """One compute process with its device and workload (``None``: none found)."""

    device: Device
    process: ProcessInfo
    workload: Workload | None
    source: str | None  # "cgroup", "pod-resources", or None


def _device(
    gpu_index: int, gpu_uuid: str, instances: Sequence[GpuInstance], p: ProcessInfo
) -> Device:
    if p.gpu_instance_id is None:
        return Device(gpu_index, gpu_uuid)
    for gi in instances:
        if gi.instance_id != p.gpu_instance_id:
            continue
        for ci in gi.compute_instances:
            if p.compute_instance_id is None or ci.instance_id == p.compute_instance_id:
                return Device(gpu_index, gpu_uuid, ci.uuid, gi.profile, gi.instance_id)
        return Device(gpu_index, gpu_uuid, None, gi.profile, gi.instance_id)
    return Device(gpu_index, gpu_uuid)


def _workload(
    ref: CgroupRef | None,
    holders: Sequence[tuple[str, str, str]],
    index: PodIndex | None,
) -> tuple[Workload | None, str | None]:
    pods = {(ns, pod) for ns, pod, _ in holders}
    if ref is None:  # the cgroup could not be read
        if len(holders) == 1:
            ns, pod, container = holders[0]
            return Workload(ns, pod, container), "pod-resources"
        return None, None
    if ref.pod_uid is None:
        return None, None
    known = index.pods.get(ref.pod_uid) if index is not None else None
    if known is not None:
        ns, pod = known
        container = ""
        by_id = index.containers.get(ref.container_id or "") if index is not None else None
        if by_id is not None and by_id[0] == ref.pod_uid:
            container = by_id[1]
        else:
            names = [c for h_ns, h_pod, c in holders if (h_ns, h_pod) == known]
            container = names[0] if len(names) == 1 else ""
        return Workload(ns, pod, container, ref.pod_uid, ref.container_id), "cgroup"
    if len(pods) == 1:
        ns, pod = next(iter(pods))
        names = [c for _, _, c in holders]
        container = names[0] if len(names) == 1 else ""
        return Workload(ns, pod, container, ref.pod_uid, ref.container_id), "pod-resources"
    return Workload("", "", "", ref.pod_uid, ref.container_id), "cgroup"


def attribute(
    snapshot: NodeSnapshot,
    holders: Iterable[Holder],
    cgroups: Callable[[int], CgroupRef | None],
    index: PodIndex | None = None,
) -> tuple[AttributedProcess, ...]:
    """Every compute process of ``snapshot`` with its device and workload (rules above)."""
    by_device: dict[str, list[tuple[str, str, str]]] = {}
    for h in holders:
        entry = (h.namespace, h.pod, h.container)
        listed = by_device.setdefault(h.uuid, [])
        if entry not in listed:
            listed.append(entry)
    out: list[AttributedProcess] = []
    for gpu in snapshot.gpus:
        if gpu.telemetry is None:
            continue
        for proc in gpu.telemetry.processes:
            device = _device(gpu.info.index, gpu.info.uuid, gpu.mig_instances, proc)
            workload, source = _workload(cgroups(proc.pid), by_device.get(device.uuid, []), index)
            out.append(AttributedProcess(device, proc, workload, source))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class WorkloadUsage:
    """What one container uses of one device: memory, its share of the time, its processes."""

    device: Device
    workload: Workload
    memory_used_bytes: int
    sm_share_ratio: float | None  # sum of its processes' SM utilization; None where unknown
    processes: int


def usage_by_workload(processes: Iterable[AttributedProcess]) -> tuple[WorkloadUsage, ...]:
    """Per (device, named container): the sums over its processes, sorted by device and pod."""
    sums: dict[tuple[Device, Workload], list[float | int | None]] = {}
    for p in processes:
        if p.workload is None or not p.workload.named:
            continue
        key = (p.device, Workload(p.workload.namespace, p.workload.pod, p.workload.container))
        acc = sums.setdefault(key, [0, None, 0])
        acc[0] = int(acc[0] or 0) + (p.process.used_memory_bytes or 0)
        if p.process.sm_utilization_ratio is not None:
            acc[1] = float(acc[1] or 0.0) + p.process.sm_utilization_ratio
        acc[2] = int(acc[2] or 0) + 1
    rows = [
        WorkloadUsage(device, workload, int(m or 0), None if s is None else float(s), int(n or 0))
        for (device, workload), (m, s, n) in sums.items()
    ]
    rows.sort(
        key=lambda r: (r.device.gpu_index, r.device.uuid, r.workload.namespace, r.workload.pod,
                       r.workload.container)
    )  # fmt: skip
    return tuple(rows)


# --- interference on shared devices -------------------------------------------------------------

# Clock-event reasons that slow every workload of a GPU down (the idle, sync-boost, display and
# application-clock bits are settings or states, not a slowdown).
THROTTLE_REASONS = (
    ClockEventReason.SW_POWER_CAP
    | ClockEventReason.HW_SLOWDOWN
    | ClockEventReason.SW_THERMAL_SLOWDOWN
    | ClockEventReason.HW_THERMAL_SLOWDOWN
    | ClockEventReason.HW_POWER_BRAKE_SLOWDOWN
)
# Memory pressure counts towards interference from here up (a full device is 1.0): past it a
# workload that grows can make a neighbour's allocation fail.
MEMORY_PRESSURE_FLOOR = 0.8
# A device this busy is saturated: a workload below its fair share then waits for the others.
SATURATED_RATIO = 0.9


@dataclass(frozen=True, slots=True)
class SharedDevice:
    """The noisy-neighbour signal of one device that several workloads use.

    ``time_shares`` is each workload's share of the device's time (SM utilization of its
    processes; empty where NVML keeps none, under MIG); ``fair_share_ratio`` is 1/workloads.
    ``starvation_ratio`` is how far the worst-served workload falls below its fair share
    (0: none below, 1: it gets nothing), counted only while the device is saturated, because
    on a device with room to spare a small share is the workload's own choice. ``throttled``
    is whether the GPU's clocks are held down (power or thermal) while it is shared.
    ``interference_ratio`` is the largest of starvation, memory pressure above
    :data:`MEMORY_PRESSURE_FLOOR` (scaled to 0..1) and throttling (1 while throttled).
    """

    device: Device
    workloads: tuple[Workload, ...]
    time_shares: Mapping[Workload, float]
    fair_share_ratio: float
    utilization_ratio: float | None
    starvation_ratio: float | None
    memory_used_bytes: int
    memory_total_bytes: int | None
    memory_pressure_ratio: float | None
    throttled: bool | None
    interference_ratio: float


def _memory_total(gpu: GpuState, device: Device) -> int | None:
    if device.mig_profile is None:
        return gpu.info.memory_total_bytes
    geometry = gpu.mig_geometry
    profile = geometry.profile(device.mig_profile) if geometry is not None else None
    return profile.memory_bytes if profile is not None else None


def shared_devices(
    snapshot: NodeSnapshot, processes: Iterable[AttributedProcess]
) -> tuple[SharedDevice, ...]:
    """Every device with processes of two or more workloads, with its interference signal.

    A workload is a container (named, or known by UID only); processes no pod is found for
    (the MPS server, host jobs) use memory but are not a workload of their own.
    """
    by_device: dict[Device, list[AttributedProcess]] = {}
    for p in processes:
        by_device.setdefault(p.device, []).append(p)
    gpus = {g.info.index: g for g in snapshot.gpus}
    out: list[SharedDevice] = []
    for device, procs in by_device.items():
        shares: dict[Workload, float | None] = {}
        for p in procs:
            if p.workload is None:
                continue
            w = Workload(p.workload.namespace, p.workload.pod, p.workload.container,
                         p.workload.pod_uid if not p.workload.named else None)  # fmt: skip
            sm = p.process.sm_utilization_ratio
            prev = shares.get(w, 0.0)
            shares[w] = None if sm is None or prev is None else prev + sm
        if len(shares) < 2:
            continue
        gpu = gpus[device.gpu_index]
        telemetry = gpu.telemetry
        fair = 1.0 / len(shares)
        known = {w: s for w, s in shares.items() if s is not None}
        utilization = None
        if device.mig_profile is None and telemetry is not None:
            utilization = telemetry.utilization_gpu_ratio
        starvation = None
        if len(known) == len(shares) and utilization is not None:
            starvation = 0.0
            if utilization >= SATURATED_RATIO:
                starvation = max(max(0.0, fair - s) / fair for s in known.values())
        used = sum(p.process.used_memory_bytes or 0 for p in procs)
        if device.mig_profile is None and telemetry is not None:
            used = max(used, telemetry.memory_used_bytes)
        total = _memory_total(gpu, device)
        pressure = min(1.0, used / total) if total else None
        reasons = telemetry.clock_event_reasons if telemetry is not None else None
        throttled = None if reasons is None else bool(reasons & THROTTLE_REASONS)
        score = max(
            starvation or 0.0,
            max(0.0, ((pressure or 0.0) - MEMORY_PRESSURE_FLOOR) / (1 - MEMORY_PRESSURE_FLOOR)),
            1.0 if throttled else 0.0,
        )
        out.append(
            SharedDevice(
                device=device,
                workloads=tuple(sorted(shares, key=lambda w: (w.namespace, w.pod, w.container))),
                time_shares=known,
                fair_share_ratio=fair,
                utilization_ratio=utilization,
                starvation_ratio=starvation,
                memory_used_bytes=used,
                memory_total_bytes=total,
                memory_pressure_ratio=pressure,
                throttled=throttled,
                interference_ratio=min(1.0, score),
            )
        )
    out.sort(key=lambda d: (d.device.gpu_index, d.device.uuid))
    return tuple(out)
