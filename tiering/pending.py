"""Why each pending GPU workload is pending, and the smallest change that would unblock it.

A pure pass over a :class:`~nodeagent_tiering.view.ClusterView`: one :class:`Diagnosis` per
pod that the scheduler found unschedulable (or that a scheduling gate holds) and that requests
``nvidia.com/gpu``, ``nvidia.com/mig-<profile>`` or a ``.shared`` variant. Each pod gets one
primary reason, tried in this order:

1. ``quota``: Kueue holds it (its scheduling gate, or its Workload has no ``QuotaReserved=True``);
   fragmentation is then not the cause and nothing else is said.
2. ``other``: by the GPU facts it fits on a node it may use, so the scheduler blocks it for
   something else (CPU, memory, pod affinity...): its own message is the evidence.
3. ``tier``: it fits as things are, but only on nodes its node selector, affinity or tolerations
   exclude, or on cordoned / quarantined / NotReady nodes. Unblock: that node.
4. ``contiguity-gpus``: the nodes it may use have enough free units in total, and one of them has
   enough GPUs, but none has them free at once (or, when the workload asks for it through the
   policy's ``pending.topology_key``, not in one NVLink-connected set / NUMA node). Unblock:
   the node where the fewest running pods would have to move, and their names.
5. ``contiguity-mig``: some GPU it may use has enough memory slices that no running workload
   holds, but no free instance of the profile: the layout lacks it, or the free slices sit where
   the profile cannot be placed. Unblock: the GPU (and layout) where the MIG planner
   (``nodeagent_mig.planner.plan_gpu``, the one ``mig apply`` runs, handed to the pass as a
   :class:`MigPlanner` by the composition layer: features do not import each other) admits it
   by destroying the fewest idle instances, never one that is busy or allocated.
6. ``capacity``: none of the above: the nodes it may use lack the units at all.

Fits are judged the way kube-scheduler judges extended resources (node allocatable minus the
requests of the pods bound to it), so a pod called blocked here is one the scheduler reports
``Unschedulable``. Placement facts (which GPU, which slices, which NVLink island) come from each
node's ``nodeagent.io/gpu-state`` annotation. Nothing here changes anything: an unblock is a
suggestion for an operator.
"""

from __future__ import annotations

import enum
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from nodeagent import labels as lbl
from nodeagent.capacity import creatable, stranded_slices
from nodeagent.gpu.types import MigGeometry, MigSlot, Placement
from nodeagent_tiering.policy import Operator, TierPolicy
from nodeagent_tiering.view import (
    GPU_RESOURCE,
    KUEUE_GATE,
    UNSCHEDULABLE_TAINT,
    ClusterView,
    Kind,
    NodeInfo,
    PodInfo,
    Taint,
    WorkloadInfo,
    resource_kind,
)

# Taints that take a node out of service rather than out of a tier: the tiering service's
# quarantine, the agent's unstable taint, and what the node lifecycle controller sets.
SERVICE_TAINTS = frozenset(
    {
        lbl.QUARANTINE_TAINT,
        lbl.UNSTABLE_TAINT,
        UNSCHEDULABLE_TAINT,
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/out-of-service",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/network-unavailable",
    }
)
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_T = TypeVar("_T")


class Reason(enum.StrEnum):
    """The primary reason a GPU workload is pending."""

    CAPACITY = "capacity"
    CONTIGUITY_GPUS = "contiguity-gpus"
    CONTIGUITY_MIG = "contiguity-mig"
    TIER = "tier"
    QUOTA = "quota"
    OTHER = "other"


# The Event reason recorded on a diagnosed pod, per diagnosis reason.
EVENT_REASONS: Mapping[Reason, str] = {
    Reason.CAPACITY: "GPUCapacity",
    Reason.CONTIGUITY_GPUS: "GPUFragmentation",
    Reason.CONTIGUITY_MIG: "GPUFragmentation",
    Reason.TIER: "GPUTier",
    Reason.QUOTA: "GPUQuota",
    Reason.OTHER: "GPUPendingOther",
}
CONTIGUITY = frozenset({Reason.CONTIGUITY_GPUS, Reason.CONTIGUITY_MIG})


class Topology(enum.StrEnum):
    """What a workload asks of the GPUs it gets besides their number."""

    ANY = "any"
    NVLINK = "nvlink"  # one NVLink-connected set
    NUMA = "numa"  # one NUMA node


@dataclass(frozen=True, slots=True)
class Settings:
    """How the pass reads the cluster (from the tier policy, see :func:`settings_for`)."""

    topology_key: str = lbl.GPU_TOPOLOGY  # pod label or annotation: nvlink | numa
    service_taints: frozenset[str] = SERVICE_TAINTS
    # Count pending pods the scheduler has not judged yet (``simulate``: there is none).
    assume_unschedulable: bool = False


def settings_for(policy: TierPolicy | None, *, assume_unschedulable: bool = False) -> Settings:
    """The settings a tier policy implies (its drain taint and ``pending.topology_key``)."""
    if policy is None:
        return Settings(assume_unschedulable=assume_unschedulable)
    return Settings(
        topology_key=policy.pending.topology_key,
        service_taints=SERVICE_TAINTS | {policy.drain.taint_key},
        assume_unschedulable=assume_unschedulable,
    )


# --- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuChange:
    """One GPU's MIG layout change: idle instances destroyed, instances created."""

    gpu: int
    destroy: tuple[MigSlot, ...]
    create: tuple[MigSlot, ...]
    layout: tuple[MigSlot, ...]  # the GPU's instances afterwards

    def to_json(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "gpu": self.gpu,
            "destroy": [s.to_json() for s in self.destroy],
            "create": [s.to_json() for s in self.create],
            "layout": [s.to_json() for s in self.layout],
        }


@dataclass(frozen=True, slots=True)
class Unblock:
    """The smallest change that would let the pod be scheduled (a suggestion, never applied).

    ``kind``: ``move-pods`` (the pods named would have to move off ``node``), ``mig-layout``
    (``changes`` on ``node``'s GPUs), ``heal-node`` (``node`` is out of service) or
    ``admit-tier`` (``node`` would hold it, but the pod's constraints exclude it).
    """

    kind: str
    node: str
    text: str
    pods: tuple[str, ...] = ()
    changes: tuple[GpuChange, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Plain data."""
        out: dict[str, Any] = {"kind": self.kind, "node": self.node, "text": self.text}
        if self.kind == "move-pods":
            out["pods"] = list(self.pods)
        if self.kind == "mig-layout":
            out["changes"] = [c.to_json() for c in self.changes]
        return out


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why one pod is pending."""

    namespace: str
    name: str
    uid: str
    request: Mapping[str, int]
    reason: Reason
    evidence: str
    unblock: Unblock | None = None
    tier: str = "any"  # the tier the pod asks for (metrics), "any" when not one
    message: str = ""  # the scheduler's own message (PodScheduled condition)

    @property
    def pod(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        """One entry of the ``pending`` list (``unblock`` is ``{}`` when there is none)."""
        return {
            "pod": self.pod,
            "request": dict(self.request),
            "reason": self.reason.value,
            "evidence": self.evidence,
            "unblock": self.unblock.to_json() if self.unblock is not None else {},
            "tier": self.tier,
            "scheduler": self.message,
        }


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Free-but-unusable capacity of the last pass, per tier (in-service nodes only)."""

    free_gpus: Mapping[str, int] = field(default_factory=dict)
    largest_nvlink_block: Mapping[str, int] = field(default_factory=dict)
    # Free whole GPUs the smallest blocked request that may use the tier cannot use.
    unusable_gpus: Mapping[str, int] = field(default_factory=dict)
    # (tier, profile) -> free memory slices no free legal placement of the profile covers.
    unusable_mig_slices: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # tier -> {k: free GPUs on nodes with exactly k free}: the shape of the free capacity.
    free_blocks: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    # (tier, profile) -> free memory slices that new instances of the profile could take.
    mig_fit_slices: Mapping[tuple[str, str], int] = field(default_factory=dict)
    mig_free_slices: Mapping[str, int] = field(default_factory=dict)  # tier -> slices no one has
    # node -> (free GPUs, free MIG slices) that no blocked request can use (for attribution).
    stranded_by_node: Mapping[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PassResult:
    """One pass: a diagnosis per pending GPU pod, and the pool's unusable capacity."""

    diagnoses: tuple[Diagnosis, ...]
    stats: PoolStats

    def to_json(self) -> dict[str, Any]:
        """``{"pending": [...]}``, sorted by pod."""
        return {"pending": [d.to_json() for d in self.diagnoses]}


# --- per-node state -----------------------------------------------------------------------------


class _Slot(NamedTuple):  # a tuple: cheap to hash, it keys the planner cache
    profile: str
    start: int
    size: int
    held: bool  # busy or allocated: the planner must keep it


@dataclass(slots=True)
class _MigGpu:
    index: int
    geometry: MigGeometry
    slots: tuple[_Slot, ...]
    free_slices: int = 0  # memory slices no held instance occupies
    shape: tuple[tuple[str, int, int], ...] = ()  # the layout, held or not

    def __post_init__(self) -> None:
        self.free_slices = self.geometry.memory_slices - sum(s.size for s in self.slots if s.held)
        self.shape = tuple((s.profile, s.start, s.size) for s in self.slots)


@dataclass(frozen=True, slots=True)
class _MigSummary:
    """A node's MIG capacity for the pool statistics (independent of the pending pods)."""

    free: int = 0  # memory slices without an instance
    unusable: Mapping[str, int] = field(default_factory=dict)  # profile -> slices it cannot use
    fit: Mapping[str, int] = field(default_factory=dict)  # profile -> slices new ones could take


def _mig_summary(gpus: Sequence[_MigGpu]) -> _MigSummary:
    free = 0
    unusable: dict[str, int] = {}
    fit: dict[str, int] = {}
    for g in gpus:
        measured = _MEASURES.get(g.geometry, g.shape)
        if measured is None:
            measured = _MEASURES.put(g.geometry, g.shape, _slice_measures(g.geometry, g.shape))
        per, fits_ = measured
        free += g.geometry.memory_slices - sum(s.size for s in g.slots)
        for profile, n in per.items():
            unusable[profile] = unusable.get(profile, 0) + n
            fit[profile] = fit.get(profile, 0) + fits_[profile]
    return _MigSummary(free, unusable, fit)


class _ByGeometry(Generic[_T]):
    """A cache whose keys include a MIG geometry, without hashing it on every lookup.

    A geometry is a deep frozen value, so hashing it costs far more than the lookup; the key
    uses its model name instead, and a hit is confirmed by identity (decoded annotations share
    one object per geometry) or, failing that, equality.
    """

    def __init__(self, limit: int = 65536) -> None:
        self._items: dict[tuple[Any, ...], list[tuple[MigGeometry, _T]]] = {}
        self._limit = limit

    def get(self, geometry: MigGeometry, key: tuple[Any, ...]) -> _T | None:
        for geo, value in self._items.get((geometry.model, *key), ()):
            if geo is geometry or geo == geometry:
                return value
        return None

    def put(self, geometry: MigGeometry, key: tuple[Any, ...], value: _T) -> _T:
        if len(self._items) >= self._limit:
            self._items.clear()  # a pool has few distinct layouts; this bounds a pathological one
        self._items.setdefault((geometry.model, *key), []).append((geometry, value))
        return value


@dataclass(slots=True)
class _Node:
    info: NodeInfo
    free: dict[str, int]  # allocatable minus the requests of bound pods (the scheduler's view)
    users: dict[str, list[tuple[str, int]]]  # resource -> (pod, units) of the bound pods
    mig: list[_MigGpu]
    groups: dict[Topology, list[int]]  # free whole GPUs per NVLink island / NUMA node
    holders: dict[int, str]  # whole GPU index -> pod, when the agent knows (pod-resources)
    group_of: dict[Topology, dict[int, int]]  # GPU index -> group id
    summary: _MigSummary


def _whole_gpus(node: NodeInfo, used: int) -> tuple[dict[Topology, list[int]], dict[int, str]]:
    """Free whole GPUs per NVLink island and per NUMA node, and who holds the others.

    With pod-resources the agent says which GPUs are held. Without, ``used`` GPUs (the pods'
    requests) are taken out as the device plugin's topology-aware allocation would place them:
    packed into the smallest islands first, so the largest free set may be overstated when
    allocations are spread (docs/tiering.md).
    """
    pub = node.published
    if pub is None:
        return {}, {}
    whole = [g for g in pub.gpus if g.mig is None and g.schedulable]
    holders = {g.index: g.holder for g in whole if g.holder is not None}
    if pub.allocations_known:
        free = [g for g in whole if g.holder is None and not g.busy]
    else:
        idle = [g for g in whole if not g.busy]
        size = Counter(g.island for g in idle)
        idle.sort(key=lambda g: (size[g.island], g.island, g.index))
        free = idle[max(0, used - (len(whole) - len(idle))) :]
    groups: dict[Topology, list[int]] = {}
    for topo, key in ((Topology.NVLINK, "island"), (Topology.NUMA, "numa")):
        counts = Counter(getattr(g, key) for g in free)
        groups[topo] = sorted(counts.values(), reverse=True)
    return groups, holders


def _mig_gpus(node: NodeInfo, used: Mapping[str, int]) -> list[_MigGpu]:
    """The node's MIG GPUs with held instances marked.

    Held = busy, or allocated by the kubelet (pod-resources). Without pod-resources the pods'
    requests say how many instances of each profile are held but not which: the idle ones are
    taken in GPU and slice order until the count is reached.
    """
    pub = node.published
    if pub is None:
        return []
    extra: dict[str, int] = {}
    if not pub.allocations_known:
        busy = Counter(i.profile for g in pub.gpus for i in g.mig or () if i.busy)
        for resource, units in used.items():
            kind = resource_kind(resource)
            if kind is not None and kind[0] is Kind.MIG and kind[1] is not None:
                extra[kind[1]] = max(0, units - busy.get(kind[1], 0))
    out = []
    for g in pub.gpus:
        geometry = pub.geometry(g.model)
        if g.mig is None or geometry is None or not g.schedulable:
            continue
        slots = []
        for i in g.mig:
            held = i.busy or i.allocated
            if not held and extra.get(i.profile, 0) > 0:
                extra[i.profile] -= 1
                held = True
            slots.append(_Slot(i.profile, i.start, i.size, held))
        out.append(_MigGpu(g.index, geometry, tuple(slots)))
    return out


def _prepare(view: ClusterView) -> dict[str, _Node]:
    used: dict[str, dict[str, int]] = {}
    users: dict[str, dict[str, list[tuple[str, int]]]] = {}
    for pod in view.pods:
        if not pod.requests or not pod.holds_resources:  # most pods request no GPU
            continue
        assert pod.node_name is not None
        node_used = used.setdefault(pod.node_name, {})
        node_users = users.setdefault(pod.node_name, {})
        for resource, units in pod.requests.items():
            node_used[resource] = node_used.get(resource, 0) + units
            node_users.setdefault(resource, []).append((pod.key, units))
    out = {}
    for info in view.nodes:
        u = used.get(info.name, {})
        free = {r: n - u.get(r, 0) for r, n in info.allocatable.items()}
        mig, groups, holders, group_of, summary = _placement(info, u)
        out[info.name] = _Node(
            info, free, users.get(info.name, {}), mig, groups, holders, group_of, summary
        )
    return out


_Placement = tuple[
    list[_MigGpu],
    dict[Topology, list[int]],
    dict[int, str],
    dict[Topology, dict[int, int]],
    _MigSummary,
]
# Node -> its placement facts, while neither the node object nor its pods' requests change: the
# service keeps one parsed object per node version, so most nodes hit from pass to pass. The
# entry holds the node object, so its id cannot be reused while the entry lives.
_PLACEMENTS: dict[tuple[int, tuple[tuple[str, int], ...]], tuple[NodeInfo, _Placement]] = {}
_PLACEMENTS_LIMIT = 50_000


def _placement(info: NodeInfo, used: Mapping[str, int]) -> _Placement:
    key = (id(info), tuple(sorted(used.items())))
    hit = _PLACEMENTS.get(key)
    if hit is not None and hit[0] is info:
        return hit[1]
    groups, holders = _whole_gpus(info, used.get(GPU_RESOURCE, 0))
    group_of: dict[Topology, dict[int, int]] = {}
    if info.published is not None:
        group_of[Topology.NVLINK] = {g.index: g.island for g in info.published.gpus}
        group_of[Topology.NUMA] = {
            g.index: g.numa if g.numa is not None else 0 for g in info.published.gpus
        }
    mig = _mig_gpus(info, used)
    found = (mig, groups, holders, group_of, _mig_summary(mig))
    if len(_PLACEMENTS) >= _PLACEMENTS_LIMIT:
        _PLACEMENTS.clear()
    _PLACEMENTS[key] = (info, found)
    return found


# --- scheduling constraints ---------------------------------------------------------------------

OK, SERVICE, EXCLUDED = 0, 1, 2  # how a node stands for a pod


def node_class(pod: PodInfo, node: NodeInfo, settings: Settings) -> tuple[int, str]:
    """Whether ``pod`` may use ``node`` (``OK``), could once the node is back in service
    (``SERVICE``, with why), or is excluded by its own constraints (``EXCLUDED``, with why)."""
    for key, value in pod.node_selector.items():
        if node.labels.get(key) != value:
            return EXCLUDED, f"node selector {key}={value}"
    if pod.affinity and not any(t.matches(node) for t in pod.affinity):
        return EXCLUDED, "required node affinity"
    service = ""
    for taint in node.taints:
        if taint.effect not in BLOCKING_EFFECTS:
            continue
        if any(t.tolerates(taint) for t in pod.tolerations):
            continue
        text = f"taint {taint.key}{'=' + taint.value if taint.value else ''}:{taint.effect}"
        if taint.key in settings.service_taints:
            service = service or text
            continue
        return EXCLUDED, f"untolerated {text}"
    # A cordon is what kube-scheduler's NodeUnschedulable plugin checks, as the taint it implies.
    if node.unschedulable and not any(t.tolerates(_CORDON) for t in pod.tolerations):
        return SERVICE, "cordoned" + (" (draining)" if node.draining else "")
    if service:
        return SERVICE, service
    return OK, ""


_CORDON = Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")


def node_causes(pod: PodInfo, node: NodeInfo, settings: Settings) -> tuple[list[str], list[str]]:
    """Every reason the pod may not use the node: (its own constraints, out of service)."""
    excluded = [f"node selector {k}={v}" for k, v in pod.node_selector.items()
                if node.labels.get(k) != v]  # fmt: skip
    if pod.affinity and not any(t.matches(node) for t in pod.affinity):
        excluded.append("required node affinity")
    service = []
    for taint in node.taints:
        if taint.effect not in BLOCKING_EFFECTS or any(t.tolerates(taint) for t in pod.tolerations):
            continue
        text = f"taint {taint.key}{'=' + taint.value if taint.value else ''}:{taint.effect}"
        if taint.key in settings.service_taints:
            service.append(text)
        else:
            excluded.append(f"untolerated {text}")
    if node.unschedulable and not any(t.tolerates(_CORDON) for t in pod.tolerations):
        service.insert(0, "cordoned" + (" (draining)" if node.draining else ""))
    return excluded, service


def topology_of(pod: PodInfo, settings: Settings) -> Topology:
    """What the pod asks of its GPUs' topology (label first, then annotation)."""
    raw = pod.labels.get(settings.topology_key) or pod.annotations.get(settings.topology_key)
    try:
        return Topology((raw or "any").strip().lower())
    except ValueError:
        return Topology.ANY


def _pinned_tier(pod: PodInfo) -> str | None:
    if lbl.TIER in pod.node_selector:
        return pod.node_selector[lbl.TIER]
    tiers = set()
    for term in pod.affinity:
        for req in term.expressions:
            if req.key == lbl.TIER and req.operator is Operator.IN and len(req.values) == 1:
                tiers.add(req.values[0])
    return tiers.pop() if len(tiers) == 1 else None


# --- fits ---------------------------------------------------------------------------------------


def fits(node: _Node, request: Mapping[str, int], topology: Topology) -> bool:
    """Whether the request fits the node now (the scheduler's arithmetic, plus topology)."""
    for resource, units in request.items():
        if node.free.get(resource, 0) < units:
            return False
        if resource == GPU_RESOURCE and topology is not Topology.ANY:
            groups = node.groups.get(topology)
            if groups is None or (groups[0] if groups else 0) < units:
                return False
    return True


def _size(n: int, resource: str) -> str:
    return f"{n} {resource}"


def _request_text(request: Mapping[str, int]) -> str:
    return ", ".join(_size(n, r) for r, n in sorted(request.items()))


def primary_request(request: Mapping[str, int]) -> tuple[str, int]:
    """The resource the diagnosis is about: MIG before whole GPUs before shared replicas."""
    order = {Kind.MIG: 0, Kind.GPU: 1, Kind.SHARED: 2}

    def rank(item: tuple[str, int]) -> tuple[int, str]:
        kind = resource_kind(item[0])
        return (order[kind[0]] if kind else 3, item[0])

    return min(request.items(), key=rank)


# --- the MIG planner, asked what one more instance would cost -------------------------------------


@dataclass(frozen=True, slots=True)
class MigPlan:
    """One GPU's plan as the diagnosis needs it (from the MIG planner's ``GpuPlan``)."""

    destroy: tuple[MigSlot, ...]
    create: tuple[MigSlot, ...]
    layout: tuple[MigSlot, ...]  # every instance afterwards, by start slice
    capacity: tuple[int, ...]  # creatable counts afterwards, largest profile first


class MigPlanner(Protocol):
    """The MIG planner: ``current`` (slot, busy) to exactly ``desired`` profile counts.

    ``None`` when no plan exists or every plan destroys a busy instance. The service, the CLI
    and the tests pass :func:`nodeagent.agent.mig_planning.plan_for_diagnosis`, which runs the
    planner ``mig apply`` runs.
    """

    def __call__(
        self,
        geometry: MigGeometry,
        current: Sequence[tuple[MigSlot, bool]],
        desired: Mapping[str, int],
    ) -> MigPlan | None:
        """Plan one GPU."""
        ...


_GAINS: _ByGeometry[tuple[MigPlan | None, ...]] = _ByGeometry()
_MEASURES: _ByGeometry[tuple[dict[str, int], dict[str, int]]] = _ByGeometry()


def gains(
    planner: MigPlanner,
    geometry: MigGeometry,
    slots: tuple[_Slot, ...],
    profile: str,
    most: int,
) -> tuple[MigPlan | None, ...]:
    """Per ``j`` in 1..``most``: the plan with the fewest destroyed instances that leaves ``j``
    more free ``profile`` instances on the GPU, keeping every held one (``None``: no such plan).

    Candidates are the current profile counts, minus some idle instances of other profiles,
    plus ``j`` of ``profile``; the planner (minimal disruption, held instances passed as busy)
    plans each, and the one destroying the fewest wins, then the one that leaves the most
    future capacity. An optimal plan never needs to recreate another profile, so the candidates
    cover every optimum; the search stops once removing more cannot destroy fewer. Cached: a
    pool has few distinct layouts, and the answer depends on nothing else.
    """
    key = (id(planner), slots, profile, most)
    found = _GAINS.get(geometry, key)
    if found is None:
        found = _GAINS.put(geometry, key, _search_gains(planner, geometry, key[1:]))
    return found


def _search_gains(
    planner: MigPlanner, geometry: MigGeometry, query: tuple[tuple[_Slot, ...], str, int]
) -> tuple[MigPlan | None, ...]:
    slots, profile, most = query
    if geometry.profile(profile) is None:
        return (None,) * most
    current = [(MigSlot(s.profile, Placement(s.start, s.size)), s.held) for s in slots]
    counts = Counter(s.profile for s in slots)
    idle = Counter(s.profile for s in slots if not s.held and s.profile != profile)
    names = sorted(idle)
    removals = sorted(itertools.product(*(range(idle[n] + 1) for n in names)), key=sum)
    out: list[MigPlan | None] = []
    for j in range(1, most + 1):
        best: MigPlan | None = None
        best_key: tuple[int, tuple[int, ...]] | None = None
        for removal in removals:
            if best is not None and sum(removal) > len(best.destroy):
                break
            desired = dict(counts)
            for name, k in zip(names, removal, strict=True):
                desired[name] -= k
            desired[profile] = counts.get(profile, 0) + j
            plan = planner(geometry, current, desired)
            if plan is None:
                continue
            key = (len(plan.destroy), tuple(-v for v in plan.capacity))
            if best_key is None or key < best_key:
                best, best_key = plan, key
        out.append(best)
    return tuple(out)


# --- the pass -----------------------------------------------------------------------------------


@dataclass(eq=False, repr=False)  # the default repr would print the whole cluster view
class Diagnoser:
    """One pass over a view. ``reuse=False`` is the naive scan (every pod against every node,
    nothing shared between pods but the planner's per-layout answers), kept for the
    benchmark's comparison."""

    view: ClusterView
    settings: Settings
    planner: MigPlanner
    _: KW_ONLY
    reuse: bool = True
    nodes: dict[str, _Node] = field(init=False)
    order: list[str] = field(init=False)
    _workloads: dict[str, WorkloadInfo] = field(init=False, default_factory=dict)  # owner UID
    _classes: dict[tuple[Any, ...], tuple[list[tuple[int, str]], str]] = field(
        init=False, default_factory=dict
    )
    _memo: dict[tuple[Any, ...], tuple[Reason, str, Unblock | None]] = field(
        init=False, default_factory=dict
    )
    _all_tiers: set[str] | None = field(init=False, default=None)
    _sigs: list[tuple[Any, ...]] | None = field(init=False, default=None)
    _pending: list[PodInfo] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.nodes = _prepare(self.view)
        self.order = sorted(self.nodes)
        for wl in self.view.workloads:
            for owner in wl.owners:
                self._workloads[owner] = wl

    # pods

    def pending(self) -> list[PodInfo]:
        """The pods this pass diagnoses, sorted by namespace and name."""
        if self._pending is None:
            out = [p for p in self.view.pods if self._is_pending(p)]
            self._pending = sorted(out, key=lambda p: (p.namespace, p.name))
        return list(self._pending)

    def _is_pending(self, pod: PodInfo) -> bool:
        if pod.node_name or pod.deleting or pod.phase != "Pending" or not pod.requests:
            return False
        if pod.gates:
            return True
        s = pod.scheduled
        if s is not None and s.status == "False" and s.reason == "Unschedulable":
            return True
        return self.settings.assume_unschedulable and (s is None or s.status != "True")

    def _workload(self, pod: PodInfo) -> WorkloadInfo | None:
        for uid in (pod.uid, *pod.owners):
            if uid and uid in self._workloads:
                return self._workloads[uid]
        return None

    def _quota(self, pod: PodInfo) -> tuple[Reason, str] | None:
        wl = self._workload(pod)
        state = ""
        if wl is not None:
            state = f"Workload {wl.key} QuotaReserved={wl.quota_reserved or 'not yet'}"
            if wl.reason or wl.message:
                state += f" ({wl.reason}: {wl.message})" if wl.message else f" ({wl.reason})"
        if KUEUE_GATE in pod.gates:
            if wl is not None and wl.quota_reserved == "True":
                return Reason.OTHER, f"Kueue reserved quota but still gates it: {state}"
            return Reason.QUOTA, "Kueue has not admitted it" + (f": {state}" if state else "")
        if wl is not None and wl.quota_reserved != "True":
            return Reason.QUOTA, f"waits in Kueue for quota: {state}"
        if pod.gates:
            return Reason.OTHER, f"waits for its scheduling gates: {', '.join(pod.gates)}"
        return None

    def _signatures(self) -> list[tuple[Any, ...]]:
        """Per node (in order), all a node's class depends on for the pending pods: the labels
        their selectors and affinities name, taints, cordon, drain, and the name if a pod
        selects by it. Nodes alike answer alike, so each pod class is computed once per kind."""
        if self._sigs is None:
            keys: set[str] = set()
            by_name = False
            for pod in self.pending():
                keys.update(pod.node_selector)
                for term in pod.affinity:
                    keys.update(r.key for r in term.expressions)
                    by_name = by_name or bool(term.fields)
            ordered = sorted(keys)
            self._sigs = [
                (
                    tuple(info.labels.get(k) for k in ordered),
                    info.taints,
                    info.unschedulable,
                    info.draining,
                    info.name if by_name else "",
                )
                for info in (self.nodes[name].info for name in self.order)
            ]
        return self._sigs

    def _node_classes(self, pod: PodInfo) -> tuple[list[tuple[int, str]], str]:
        """How every node stands for the pod, and the pod's tier (shared by equal pods)."""
        key = (tuple(sorted(pod.node_selector.items())), pod.affinity, pod.tolerations)
        if self.reuse and key in self._classes:
            return self._classes[key]
        nodes = self.nodes
        if self.reuse:
            seen: dict[tuple[Any, ...], tuple[int, str]] = {}
            classes = []
            for name, sig in zip(self.order, self._signatures(), strict=True):
                cls = seen.get(sig)
                if cls is None:
                    cls = seen[sig] = node_class(pod, nodes[name].info, self.settings)
                classes.append(cls)
        else:
            classes = [node_class(pod, nodes[name].info, self.settings) for name in self.order]
        result = (classes, self._pod_tier(pod, classes))
        if self.reuse:
            self._classes[key] = result
        return result

    def _pod_tier(self, pod: PodInfo, classes: Sequence[tuple[int, str]]) -> str:
        pinned = _pinned_tier(pod)
        if pinned is not None:
            return pinned
        tiers = {
            self.nodes[name].info.tier
            for name, (cls, _) in zip(self.order, classes, strict=True)
            if cls != EXCLUDED
        }
        if not tiers:
            return "none"
        return tiers.pop() if len(tiers) == 1 else "any"

    def diagnose(self, pod: PodInfo) -> Diagnosis:
        """The diagnosis of one pending pod."""
        message = pod.scheduled.message if pod.scheduled is not None else ""
        classes, tier = self._node_classes(pod)
        quota = self._quota(pod)
        if quota is not None:
            return Diagnosis(
                pod.namespace,
                pod.name,
                pod.uid,
                pod.requests,
                quota[0],
                quota[1],
                tier=tier,
                message=message,
            )
        topology = topology_of(pod, self.settings)
        key = (
            tuple(sorted(pod.node_selector.items())),
            pod.affinity,
            pod.tolerations,
            tuple(sorted(pod.requests.items())),
            topology,
        )
        found = self._memo.get(key) if self.reuse else None
        if found is None:
            found = self._classify(pod, topology, classes, message)
            if self.reuse:
                self._memo[key] = found
        reason, evidence, unblock = found
        return Diagnosis(
            pod.namespace,
            pod.name,
            pod.uid,
            pod.requests,
            reason,
            evidence,
            unblock,
            tier=tier,
            message=message,
        )

    def _classify(
        self, pod: PodInfo, topology: Topology, classes: Sequence[tuple[int, str]], message: str
    ) -> tuple[Reason, str, Unblock | None]:
        request = pod.requests
        nodes = self.nodes
        eligible = [nodes[n] for n, (c, _) in zip(self.order, classes, strict=True) if c == OK]
        for node in eligible:
            if fits(node, request, topology):
                said = f"; the scheduler says: {message}" if message else ""
                return (
                    Reason.OTHER,
                    f"its GPUs fit on node {node.info.name} by what the agents publish{said}",
                    None,
                )
        tier = self._tier(pod, topology, classes)
        if tier is not None:
            return tier
        resource, units = primary_request(request)
        kind = resource_kind(resource)
        assert kind is not None
        if kind[0] is Kind.MIG and kind[1] is not None:
            return self._mig(resource, kind[1], units, eligible)
        return self._whole(resource, units, topology, eligible)

    def _tier(
        self, pod: PodInfo, topology: Topology, classes: Sequence[tuple[int, str]]
    ) -> tuple[Reason, str, Unblock | None] | None:
        """A node the pod may not use now would hold it: the one needing the fewest changes
        (back in service before admitted, then the tightest fit)."""
        request = pod.requests
        best: tuple[tuple[int, int, int, str], _Node, list[str], list[str]] | None = None
        resource = primary_request(request)[0]
        for name, (cls, _) in zip(self.order, classes, strict=True):
            if cls == OK:
                continue
            node = self.nodes[name]
            if not fits(node, request, topology):
                continue
            excluded, service = node_causes(pod, node.info, self.settings)
            rank = (len(excluded) + len(service), len(excluded), node.free.get(resource, 0), name)
            if best is None or rank < best[0]:
                best = (rank, node, excluded, service)
        if best is None:
            return None
        _, node, excluded, service = best
        name, tier = node.info.name, node.info.tier
        req = _request_text(request)
        down = f"bring node {name} (tier {tier}) back into service: it is {', '.join(service)}"
        if not excluded:
            evidence = (
                f"no node it may use holds {req} now; node {name} (tier {tier}) would, but it "
                f"is {', '.join(service)}"
            )
            return Reason.TIER, evidence, Unblock("heal-node", name, down)
        why = ", ".join(excluded)
        text = f"admit node {name} (tier {tier}): the pod's {why} excludes it"
        if service:
            text += f"; and {down}"
        evidence = (
            f"no node in the tiers it admits holds {req}; node {name} in tier {tier} would, "
            f"but its {why} excludes it"
        )
        return Reason.TIER, evidence, Unblock("admit-tier", name, text)

    # whole GPUs and shared replicas

    def _whole(
        self, resource: str, units: int, topology: Topology, eligible: Sequence[_Node]
    ) -> tuple[Reason, str, Unblock | None]:
        need = _size(units, resource)
        total = sum(max(0, n.free.get(resource, 0)) for n in eligible)
        sizes = {n.info.name: self._largest_set(n, resource, topology) for n in eligible}
        big_enough = [n for n in eligible if sizes[n.info.name] >= units]
        blocks = self._largest_blocks(resource, topology, eligible)
        if not big_enough:
            largest = max(sizes.values(), default=0)
            groups = {
                Topology.NVLINK: " in one NVLink-connected set",
                Topology.NUMA: " on one NUMA node",
            }
            where = groups.get(topology, "") if resource == GPU_RESOURCE else ""
            return (
                Reason.CAPACITY,
                f"no node it may use has {need}{where} at all (the largest has {largest}); "
                f"{total} free in total",
                None,
            )
        counted = [n for n in big_enough if n.free.get(resource, 0) >= units]
        if total < units and not counted:
            return (
                Reason.CAPACITY,
                f"needs {need}; only {total} free on the nodes it may use; "
                f"largest free block per tier: {blocks}",
                None,
            )
        if counted and topology is not Topology.ANY:
            what = "NVLink-connected set" if topology is Topology.NVLINK else "NUMA node"
            evidence = (
                f"needs {need} in one {what}; node {counted[0].info.name} has {units} free, but "
                f"not in one {what}; largest free block per tier: {blocks}"
            )
        else:
            evidence = (
                f"needs {need} on one node; {total} free on the nodes it may use, but at most "
                f"{self._max_free(resource, eligible)} on any one; largest free block per tier: "
                f"{blocks}"
            )
        return Reason.CONTIGUITY_GPUS, evidence, self._moves(resource, units, topology, big_enough)

    @staticmethod
    def _largest_set(node: _Node, resource: str, topology: Topology) -> int:
        """The most units of ``resource`` the node could ever give one pod (in one group when
        the pod asks for a topology and the agent publishes it)."""
        units = node.info.allocatable.get(resource, 0)
        pub = node.info.published
        if topology is Topology.ANY or resource != GPU_RESOURCE or pub is None:
            return units
        group_of = node.group_of.get(topology, {})
        sizes = Counter(
            group_of.get(g.index, 0) for g in pub.gpus if g.mig is None and g.schedulable
        )
        return min(units, max(sizes.values(), default=0))

    def _max_free(self, resource: str, nodes: Iterable[_Node]) -> int:
        return max((max(0, n.free.get(resource, 0)) for n in nodes), default=0)

    def _largest_blocks(self, resource: str, topology: Topology, nodes: Sequence[_Node]) -> str:
        best: dict[str, tuple[int, str]] = {}
        for n in nodes:
            if not n.info.allocatable.get(resource):
                continue
            free = max(0, n.free.get(resource, 0))
            if topology is not Topology.ANY and resource == GPU_RESOURCE:
                groups = n.groups.get(topology) or [0]
                free = min(free, groups[0])
            tier = n.info.tier
            if tier not in best or free > best[tier][0]:
                best[tier] = (free, n.info.name)
        return ", ".join(f"{t} {f} ({name})" for t, (f, name) in sorted(best.items())) or "none"

    def _moves(
        self, resource: str, units: int, topology: Topology, nodes: Sequence[_Node]
    ) -> Unblock | None:
        best: tuple[tuple[int, int, str], tuple[tuple[str, int], ...]] | None = None
        for node in nodes:
            chosen = self._pods_to_move(node, resource, units, topology)
            if chosen is None:
                continue
            rank = (len(chosen), sum(u for _, u in chosen), node.info.name)
            if best is None or rank < best[0]:
                best = (rank, chosen)
        if best is None:
            return None
        (_, _, name), chosen = best
        listed = ", ".join(f"{pod} ({u})" for pod, u in chosen)
        text = f"move {listed} off node {name}; then {_size(units, resource)} are free there"
        return Unblock("move-pods", name, text, pods=tuple(p for p, _ in chosen))

    def _pods_to_move(
        self, node: _Node, resource: str, units: int, topology: Topology
    ) -> tuple[tuple[str, int], ...] | None:
        """The fewest bound pods whose leaving frees ``units`` (in one group if asked)."""
        running = sorted(node.users.get(resource, []), key=lambda pu: (-pu[1], pu[0]))
        pub = node.info.published
        grouped = topology is not Topology.ANY and resource == GPU_RESOURCE
        if grouped and pub is not None and pub.allocations_known:
            return self._group_moves(node, units, topology)
        # Without who-holds-what (no pod-resources) a grouped request is counted as the
        # scheduler counts: approximate, see docs/tiering.md.
        need = units - node.free.get(resource, 0)
        chosen: list[tuple[str, int]] = []
        for pod, u in running:
            if need <= 0:
                break
            chosen.append((pod, u))
            need -= u
        return tuple(chosen) if need <= 0 and chosen else None

    def _group_moves(
        self, node: _Node, units: int, topology: Topology
    ) -> tuple[tuple[str, int], ...] | None:
        """With holders known: the group (island, NUMA node) freed by the fewest pods."""
        group_of = node.group_of.get(topology, {})
        pub = node.info.published
        assert pub is not None
        members: dict[int, list[int]] = {}
        for g in pub.gpus:
            if g.mig is None and g.schedulable:
                members.setdefault(group_of.get(g.index, 0), []).append(g.index)
        held_by: dict[str, int] = Counter(node.holders.values())
        best: tuple[int, tuple[tuple[str, int], ...]] | None = None
        for gpus in members.values():
            if len(gpus) < units:
                continue
            free = sum(1 for i in gpus if i not in node.holders)
            in_group = Counter(node.holders[i] for i in gpus if i in node.holders)
            chosen = []
            for pod, k in sorted(in_group.items(), key=lambda pk: (-pk[1], pk[0])):
                if free >= units:
                    break
                chosen.append((pod, held_by[pod]))
                free += k
            if free >= units and chosen and (best is None or len(chosen) < best[0]):
                best = (len(chosen), tuple(chosen))
        return best[1] if best is not None else None

    # MIG

    def _mig(
        self, resource: str, profile: str, units: int, eligible: Sequence[_Node]
    ) -> tuple[Reason, str, Unblock | None]:
        need = _size(units, resource)
        known = [n for n in eligible if n.info.published is not None]
        if eligible and not known:
            return (
                Reason.OTHER,
                f"needs {need}; no node it may use publishes its GPU state "
                f"({lbl.GPU_STATE_ANNOTATION}): is the agent running there?",
                None,
            )
        size = 0  # memory slices of one instance (the model's placements, not the "3" in 3g)
        most_free = 0
        roomy: list[_Node] = []
        for node in known:
            room = 0
            for g in node.mig:
                p = g.geometry.profile(profile)
                if p is None or not p.placements:
                    continue
                size = p.placements[0].size
                most_free = max(most_free, g.free_slices)
                room += g.free_slices // size
            if room >= units:
                roomy.append(node)
        if not roomy:
            if not size:
                return Reason.CAPACITY, f"needs {need}; no GPU it may use offers {profile}", None
            return (
                Reason.CAPACITY,
                f"needs {need}; a {profile} takes {size} memory slices, and no GPU it may use "
                f"has that many that no workload holds (at most {most_free} on one GPU)",
                None,
            )
        best: tuple[tuple[int, int, str], _Node, list[tuple[_MigGpu, MigPlan]]] | None = None
        for node in roomy:
            found = self._mig_node_plan(node, profile, units - max(0, node.free.get(resource, 0)))
            if found is None:
                continue
            cost, plans = found
            rank = (cost, len(plans), node.info.name)
            if best is None or rank < best[0]:
                best = (rank, node, plans)
            if cost == 0 and len(plans) <= 1:
                break  # nothing to destroy, on one GPU: nodes come by name, none ranks higher
        if best is None:
            where = ", ".join(n.info.name for n in roomy[:3]) + (" ..." if len(roomy) > 3 else "")
            evidence = (
                f"needs {need}; GPUs on {where} have {size} memory slices that no workload holds, "
                f"but every legal placement of {profile} overlaps a busy or allocated instance"
            )
            return Reason.CONTIGUITY_MIG, evidence, None
        _, node, plans = best
        changes = tuple(
            GpuChange(
                g.index,
                plan.destroy,
                plan.create,
                plan.layout,
            )
            for g, plan in plans
        )
        parts = []
        for c in changes:
            gone = ", ".join(s.label for s in c.destroy)
            made = ", ".join(s.label for s in c.create)
            parts.append(
                f"GPU {c.gpu}: " + (f"destroy idle {gone}, " if gone else "") + f"create {made}"
            )
        name = node.info.name
        text = f"change the MIG layout on node {name}: " + "; ".join(parts) + " (no busy instance)"
        first = changes[0]
        gpu = next(g for g in node.mig if g.index == first.gpu)
        p = gpu.geometry.profile(profile)
        starts = ", ".join(str(q.start) for q in p.placements) if p is not None else ""
        here = (
            f"GPU {gpu.index} of node {name} has {gpu.free_slices} memory slices that no "
            "workload holds"
        )
        if first.destroy:
            idle = ", ".join(sorted({s.profile for s in first.destroy}))
            why = (
                f"{here}, but idle {idle} instances sit where a {profile} ({size} slices, "
                f"starting at slice {starts}) would go"
            )
        else:
            why = f"{here} and room for a {profile}, but its layout has no free {profile} instance"
        evidence = f"needs {need}; {why}"
        return Reason.CONTIGUITY_MIG, evidence, Unblock("mig-layout", name, text, changes=changes)

    def _mig_node_plan(
        self, node: _Node, profile: str, missing: int
    ) -> tuple[int, list[tuple[_MigGpu, MigPlan]]] | None:
        """The fewest destroyed instances over the node's GPUs that gain ``missing`` free
        ``profile`` instances (a small knapsack over each GPU's options)."""
        if missing <= 0:
            return 0, []
        best: dict[int, tuple[int, list[tuple[_MigGpu, MigPlan]]]] = {0: (0, [])}
        for g in node.mig:
            options = self._gpu_gains(g, profile, missing)
            step = dict(best)
            for have, (cost, plans) in best.items():
                for j, plan in enumerate(options, start=1):
                    if plan is None:
                        continue
                    total = min(missing, have + j)
                    entry = (cost + len(plan.destroy), [*plans, (g, plan)])
                    old = step.get(total)
                    if old is None or (entry[0], len(entry[1])) < (old[0], len(old[1])):
                        step[total] = entry
            best = step
        return best.get(missing)

    def _gpu_gains(self, g: _MigGpu, profile: str, most: int) -> tuple[MigPlan | None, ...]:
        return gains(self.planner, g.geometry, g.slots, profile, most)

    # the pool

    def stats(self, diagnoses: Sequence[Diagnosis]) -> PoolStats:
        """Free-but-unusable capacity per tier, against what the blocked pods ask for.

        Demand is the blocked pods (not quota, not other): a free GPU is unusable when its node's
        free count is not a multiple of the smallest blocked whole-GPU request that may use the
        tier (the exporter's stranded-GPU rule, with the pending sizes as request sizes); a free
        slice is unusable for a profile when no free legal placement of it covers the slice.
        """
        smallest: dict[str, int] = {}
        profiles: dict[str, set[str]] = {}
        for d in diagnoses:
            if d.reason in (Reason.QUOTA, Reason.OTHER):
                continue
            resource, units = primary_request(d.request)
            kind = resource_kind(resource)
            for tier in self._tiers_of(d):
                if resource == GPU_RESOURCE:
                    smallest[tier] = min(smallest.get(tier, units), units)
                elif kind is not None and kind[0] is Kind.MIG and kind[1] is not None:
                    profiles.setdefault(tier, set()).add(kind[1])
        free: dict[str, int] = {}
        block: dict[str, int] = {}
        unusable: dict[str, int] = {}
        slices: dict[tuple[str, str], int] = {}
        blocks: dict[str, dict[int, int]] = {}
        fit: dict[tuple[str, str], int] = {}
        mig_free: dict[str, int] = {}
        by_node: dict[str, tuple[int, int]] = {}
        for name in self.order:
            node = self.nodes[name]
            info = node.info
            if info.unschedulable or any(
                t.key in self.settings.service_taints and t.effect in BLOCKING_EFFECTS
                for t in info.taints
            ):
                continue
            tier = info.tier
            f = max(0, node.free.get(GPU_RESOURCE, 0))
            free[tier] = free.get(tier, 0) + f
            if f:
                sizes = blocks.setdefault(tier, {})
                sizes[f] = sizes.get(f, 0) + f
            groups = node.groups.get(Topology.NVLINK)
            largest = min(f, groups[0] if groups else 0) if groups is not None else 0
            block[tier] = max(block.get(tier, 0), largest)
            stranded_gpus = 0
            if tier in smallest:
                stranded_gpus = f - (f // smallest[tier]) * smallest[tier]
                unusable[tier] = unusable.get(tier, 0) + stranded_gpus
            stranded = 0
            summary = node.summary
            if node.mig:
                mig_free[tier] = mig_free.get(tier, 0) + summary.free
                for profile, n in summary.unusable.items():
                    slices[(tier, profile)] = slices.get((tier, profile), 0) + n
                    fit[(tier, profile)] = fit.get((tier, profile), 0) + summary.fit[profile]
            wanted = profiles.get(tier)
            if wanted:
                ordered = tuple(sorted(wanted))
                for g in node.mig:
                    stranded += _stranded_for(g.geometry, g.shape, ordered)
            if stranded_gpus or stranded:
                by_node[name] = (stranded_gpus, stranded)
        for tier in free:
            unusable.setdefault(tier, 0)
        return PoolStats(free, block, unusable, slices, blocks, fit, mig_free, by_node)

    def _tiers_of(self, d: Diagnosis) -> set[str]:
        if d.tier not in ("any", "none"):
            return {d.tier}
        if self._all_tiers is None:
            self._all_tiers = {n.info.tier for n in self.nodes.values()}
        return self._all_tiers

    def run(self) -> PassResult:
        """Diagnose every pending GPU pod."""
        diagnoses = tuple(self.diagnose(p) for p in self.pending())
        return PassResult(diagnoses, self.stats(diagnoses))


_STRANDED: _ByGeometry[int] = _ByGeometry()


def _slots(shape: tuple[tuple[str, int, int], ...]) -> tuple[MigSlot, ...]:
    return tuple(MigSlot(p, Placement(start, size)) for p, start, size in shape)


def _stranded_for(
    geometry: MigGeometry, shape: tuple[tuple[str, int, int], ...], wanted: tuple[str, ...]
) -> int:
    """Free slices no free placement of the wanted profiles covers (cached per layout)."""
    found = _STRANDED.get(geometry, (shape, wanted))
    if found is None:
        found = _STRANDED.put(
            geometry, (shape, wanted), stranded_slices(geometry, _slots(shape), wanted)
        )
    return found


def _slice_measures(
    geometry: MigGeometry, shape: tuple[tuple[str, int, int], ...]
) -> tuple[dict[str, int], dict[str, int]]:
    """Per profile: free slices it cannot use, and free slices its new instances could take."""
    layout = _slots(shape)
    room = creatable(geometry, layout)
    unusable = {p.name: stranded_slices(geometry, layout, [p.name]) for p in geometry.profiles}
    usable = {
        p.name: room.get(p.name, 0) * (p.placements[0].size if p.placements else 0)
        for p in geometry.profiles
    }
    return unusable, usable


def diagnose(
    view: ClusterView, planner: MigPlanner, settings: Settings | None = None
) -> PassResult:
    """One diagnosis pass over ``view`` (see the module docstring)."""
    return Diagnoser(view, settings or Settings(), planner).run()
