"""Per-node capacity and scheduling constraints, prepared once per pass from the cluster view.

Free units per node and per NVLink set or NUMA node (the scheduler's view: allocatable minus
the requests of bound pods), each MIG GPU's free slices, and which nodes a pod may use.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from nodeagent import labels as lbl
from nodeagent.capacity import creatable, room_beside, stranded_slices
from nodeagent.gpu.types import MigGeometry, MigSlot, Placement
from nodeagent_tiering.cluster.nodes import GPU_RESOURCE, Kind, Node, Taint, resource_kind
from nodeagent_tiering.cluster.tier_policy import Operator
from nodeagent_tiering.cluster.view import UNSCHEDULABLE_TAINT, ClusterView, PodInfo
from nodeagent_tiering.pending.results import BLOCKING_EFFECTS, Settings, Topology

_T = TypeVar("_T")


class Slot(NamedTuple):  # a tuple: cheap to hash, it keys the planner cache
    profile: str
    start: int
    size: int
    held: bool  # busy or allocated: the planner must keep it


@dataclass(slots=True)
class MigGpu:
    index: int
    geometry: MigGeometry
    slots: tuple[Slot, ...]
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


def _mig_summary(gpus: Sequence[MigGpu]) -> _MigSummary:
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


class ByGeometry(Generic[_T]):
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
class NodeState:
    info: Node
    free: dict[str, int]  # allocatable minus the requests of bound pods (the scheduler's view)
    users: dict[str, list[tuple[str, int]]]  # resource -> (pod, units) of the bound pods
    mig: list[MigGpu]
    groups: dict[Topology, list[int]]  # free whole GPUs per NVLink island / NUMA node
    holders: dict[int, str]  # whole GPU index -> pod, when the agent knows (pod-resources)
    group_of: dict[Topology, dict[int, int]]  # GPU index -> group id
    summary: _MigSummary


def _whole_gpus(node: Node, used: int) -> tuple[dict[Topology, list[int]], dict[int, str]]:
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


def _mig_gpus(node: Node, used: Mapping[str, int]) -> list[MigGpu]:
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
            slots.append(Slot(i.profile, i.start, i.size, held))
        out.append(MigGpu(g.index, geometry, tuple(slots)))
    return out


def prepare(view: ClusterView) -> dict[str, NodeState]:
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
        out[info.name] = NodeState(
            info, free, users.get(info.name, {}), mig, groups, holders, group_of, summary
        )
    return out


_Placement = tuple[
    list[MigGpu],
    dict[Topology, list[int]],
    dict[int, str],
    dict[Topology, dict[int, int]],
    _MigSummary,
]
# Node -> its placement facts, while neither the node object nor its pods' requests change: the
# service keeps one parsed object per node version, so most nodes hit from pass to pass. The
# entry holds the node object, so its id cannot be reused while the entry lives.
_PLACEMENTS: dict[tuple[int, tuple[tuple[str, int], ...]], tuple[Node, _Placement]] = {}
_PLACEMENTS_LIMIT = 50_000


def _placement(info: Node, used: Mapping[str, int]) -> _Placement:
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


def node_class(pod: PodInfo, node: Node, settings: Settings) -> tuple[int, str]:
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


def node_causes(pod: PodInfo, node: Node, settings: Settings) -> tuple[list[str], list[str]]:
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


def pinned_tier(pod: PodInfo) -> str | None:
    if lbl.TIER in pod.node_selector:
        return pod.node_selector[lbl.TIER]
    tiers = set()
    for term in pod.affinity:
        for req in term.expressions:
            if req.key == lbl.TIER and req.operator is Operator.IN and len(req.values) == 1:
                tiers.add(req.values[0])
    return tiers.pop() if len(tiers) == 1 else None


_MEASURES: ByGeometry[tuple[dict[str, int], dict[str, int]]] = ByGeometry()

_STRANDED: ByGeometry[int] = ByGeometry()
_ROOM: ByGeometry[int] = ByGeometry()


def _slots(shape: tuple[tuple[str, int, int], ...]) -> tuple[MigSlot, ...]:
    return tuple(MigSlot(p, Placement(start, size)) for p, start, size in shape)


def stranded_for(
    geometry: MigGeometry, shape: tuple[tuple[str, int, int], ...], wanted: tuple[str, ...]
) -> int:
    """Free slices no free placement of the wanted profiles covers (cached per layout)."""
    found = _STRANDED.get(geometry, (shape, wanted))
    if found is None:
        found = _STRANDED.put(
            geometry, (shape, wanted), stranded_slices(geometry, _slots(shape), wanted)
        )
    return found


def room_beside_held(gpu: MigGpu, profile: str) -> int:
    """How many ``profile`` instances the GPU could offer beside the instances workloads hold,
    were its layout remade around them (idle instances do not count: a new layout may destroy
    them)."""
    held = tuple(sorted(s.profile for s in gpu.slots if s.held))
    # Cached per geometry without hashing it: room_beside's own cache hashes the deep frozen
    # geometry on every call, which was most of a pass's MIG diagnosis at 5,000 nodes.
    found = _ROOM.get(gpu.geometry, (held, profile))
    if found is None:
        found = _ROOM.put(gpu.geometry, (held, profile), room_beside(gpu.geometry, held, profile))
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
