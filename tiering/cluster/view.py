"""The cluster as the pending-workload diagnosis sees it, parsed once from API objects.

Nodes are the floor's one parsed :class:`~nodeagent_tiering.cluster.nodes.Node` (labels, taints,
the ``nodeagent.io/gpu-state`` annotation, allocatable ``nvidia.com/*`` resources); pods carry
their GPU requests and scheduling constraints, Kueue Workloads their quota state. Everything is
plain frozen data: the diagnosis (:mod:`nodeagent_tiering.pending.diagnosis`) is a pure function
of a :class:`ClusterView`, fed by the service's caches, by ``why-pending`` from one list of each
kind, or by ``simulate`` from a cluster file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent_tiering.cluster import kueue, units
from nodeagent_tiering.cluster.cluster_api import Kube
from nodeagent_tiering.cluster.nodes import QUOTA_RESOURCE, Node, Taint, resource_kind
from nodeagent_tiering.cluster.tier_policy import Operator, Requirement
from nodeagent_tiering.cluster.units import parse_time

KUEUE_GATE = "kueue.x-k8s.io/admission"  # the scheduling gate Kueue's pod integration sets
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


# --- pods ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' rule: key (empty with Exists = every key), value, effect (empty = all)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class Term:
    """One required node-affinity term: every expression (labels) and field must match."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()  # matchFields; only metadata.name exists

    def matches(self, node: Node) -> bool:
        """Whether the node satisfies this term."""
        if not all(r.matches(node.labels) for r in self.expressions):
            return False
        return all(r.matches({"metadata.name": node.name}) for r in self.fields)


@dataclass(frozen=True, slots=True)
class Scheduled:
    """The pod's PodScheduled condition."""

    status: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class PodInfo:
    """One pod: its GPU requests and, for a pending one, its scheduling constraints."""

    namespace: str
    name: str
    uid: str = ""
    node_name: str | None = None
    phase: str = "Pending"
    requests: Mapping[str, int] = field(default_factory=dict)  # GPU resources only
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: tuple[Term, ...] = ()  # required node affinity: any term (empty: no constraint)
    tolerations: tuple[Toleration, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    gates: tuple[str, ...] = ()
    scheduled: Scheduled | None = None
    owners: tuple[str, ...] = ()  # owner reference UIDs
    created_s: float | None = None
    deleting: bool = False
    # The containers' requests (a limit without one) of the resources Kueue quota counts,
    # summed without the init containers: what the pool review's GPU pods are told by.
    quota_requests: Mapping[str, float] = field(default_factory=dict)
    started_s: float | None = None  # status.startTime
    ended_s: float | None = None  # a finished pod's end (see _end_time); None while it runs
    disruption: str | None = None  # the reason of a true DisruptionTarget condition
    reason: str = ""  # status.reason ("Evicted" after node pressure)

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def holds_resources(self) -> bool:
        """Bound and not finished: the scheduler counts its requests against the node."""
        return self.node_name is not None and self.phase not in ("Succeeded", "Failed")


def _requirement(expr: Mapping[str, Any], *, field: bool = False) -> Requirement | None:
    key = str(expr.get("key", ""))
    values = tuple(str(v) for v in expr.get("values") or ())
    try:
        operator = Operator(str(expr.get("operator", "")))
        if field:
            # matchFields compares metadata.name: node names (up to 253 characters), which
            # the label-value rule of a label expression would refuse.
            return Requirement.model_construct(key=key, operator=operator, values=values)
        return Requirement(key=key, operator=operator, values=values)
    except ValueError:
        return None  # an expression the API server would have rejected


def _affinity(spec: Mapping[str, Any]) -> tuple[Term, ...]:
    node = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = []
    for term in node.get("nodeSelectorTerms") or ():
        exprs = [_requirement(e) for e in term.get("matchExpressions") or ()]
        fields_ = [_requirement(e, field=True) for e in term.get("matchFields") or ()]
        terms.append(
            Term(
                tuple(r for r in exprs if r is not None),
                tuple(r for r in fields_ if r is not None),
            )
        )
    return tuple(terms)


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """The pod's effective GPU requests, as the scheduler computes them.

    Sum over containers, at least the largest init container's; a limit without a request
    counts as the request (extended resources cannot be overcommitted).
    """

    def of(container: Mapping[str, Any]) -> dict[str, int]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: units.count(v) for k, v in merged.items() if resource_kind(k) is not None}

    total: dict[str, int] = {}
    for c in spec.get("containers") or ():
        for k, v in of(c).items():
            total[k] = total.get(k, 0) + v
    for c in spec.get("initContainers") or ():
        for k, v in of(c).items():
            total[k] = max(total.get(k, 0), v)
    return {k: v for k, v in total.items() if v > 0}


def _end_time(status: Mapping[str, Any]) -> float | None:
    """When a finished pod ended: its last container's ``finishedAt``, else the time of its
    ``DisruptionTarget`` or ``Ready`` condition (a pod killed before its containers ran)."""
    ends = [
        parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for cs in status.get("containerStatuses") or ()
    ]
    found = [e for e in ends if e is not None]
    if found:
        return max(found)
    for cond in status.get("conditions") or ():
        if cond.get("type") in ("DisruptionTarget", "Ready"):
            when = parse_time(cond.get("lastTransitionTime"))
            if when is not None:
                return when
    return None


def pod_from_object(obj: Mapping[str, Any]) -> PodInfo:
    """Parse a Pod (a dict as the API server returns it)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    scheduled = None
    disruption = None
    for cond in status.get("conditions") or ():
        kind = cond.get("type")
        if kind == "PodScheduled":
            scheduled = Scheduled(
                str(cond.get("status", "")),
                str(cond.get("reason") or ""),
                str(cond.get("message") or ""),
            )
        elif kind == "DisruptionTarget" and cond.get("status") == "True" and disruption is None:
            disruption = str(cond.get("reason") or "")
    phase = str(status.get("phase") or "Pending")
    return PodInfo(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid") or ""),
        node_name=spec.get("nodeName") or None,
        phase=phase,
        requests=pod_requests(spec),
        node_selector=dict(spec.get("nodeSelector") or {}),
        affinity=_affinity(spec),
        tolerations=tuple(
            Toleration(
                str(t.get("key") or ""),
                str(t.get("operator") or "Equal"),
                str(t.get("value") or ""),
                str(t.get("effect") or ""),
            )
            for t in spec.get("tolerations") or ()
        ),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        gates=tuple(str(g.get("name", "")) for g in spec.get("schedulingGates") or ()),
        scheduled=scheduled,
        owners=tuple(str(o.get("uid", "")) for o in meta.get("ownerReferences") or ()),
        created_s=parse_time(meta.get("creationTimestamp")),
        deleting=bool(meta.get("deletionTimestamp")),
        quota_requests=request_amounts(obj, QUOTA_RESOURCE),
        started_s=parse_time(status.get("startTime")),
        # Only a finished pod has an end; a running one's Ready time is not read for nothing.
        ended_s=_end_time(status) if phase in ("Succeeded", "Failed") else None,
        disruption=disruption,
        reason=str(status.get("reason") or ""),
    )


# --- Kueue --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """A Kueue Workload: whose it is and whether it holds quota."""

    namespace: str
    name: str
    owners: tuple[str, ...]  # owner UIDs: the pod (pod integration) or the job
    queue: str = ""  # the LocalQueue
    cluster_queue: str = ""  # from the admission, when it has one
    quota_reserved: str = ""  # "True" / "False" / "" (no condition yet)
    reason: str = ""
    message: str = ""
    created_s: float | None = None
    # When it (last) entered the queue: the Requeued condition's time when it was requeued, as
    # Kueue itself measures waits, else its creation.
    queued_s: float | None = None
    reserved_s: float | None = None  # the QuotaReserved=True transition
    finished: str = ""  # the Finished condition's status, "" without one
    finished_s: float | None = None  # the Finished=True transition
    preempted: str | None = None  # the reason of a true Preempted condition
    pod_sets: tuple[PodSetAssignment, ...] = ()  # status.admission.podSetAssignments
    uid: str = ""
    owner: OwnerRef | None = None  # the job (or pod) Kueue made it for: its first owner
    active: bool = True  # spec.active: false when deactivated (Kueue never admits it)
    # spec.podSets: (name, pods, each pod's GPU requests), for the diagnosis of a Workload whose
    # pods do not exist yet (a suspended Job waiting for quota).
    wanted: tuple[tuple[str, int, Mapping[str, int]], ...] = ()

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def requests(self) -> dict[str, int]:
        """The GPU units the whole Workload asks for: every pod of every pod set."""
        total: dict[str, int] = {}
        for _, count, per_pod in self.wanted:
            for resource, units_ in per_pod.items():
                total[resource] = total.get(resource, 0) + count * units_
        return total


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """An owner reference: what ``kubectl describe`` names, and where Events go."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class PodSetAssignment:
    """One pod set of a Workload's admission: its pods, and per resource the flavor and the
    amount (quota resources only: the review reads 100,000 of them)."""

    count: int
    flavors: tuple[tuple[str, str], ...]  # (resource, flavor)
    usage: Mapping[str, float]  # resource -> resourceUsage of the whole pod set


def _pod_count(value: Any) -> int:
    """A pod set's ``count`` (an integer field, not a quantity), at least 1."""
    try:
        return max(1, int(value or 1))
    except (TypeError, ValueError):
        return 1


def _pod_sets(admission: Mapping[str, Any]) -> tuple[PodSetAssignment, ...]:
    out = []
    for ps in admission.get("podSetAssignments") or ():
        assigned = ps.get("flavors") or {}
        flavors = tuple((str(r), str(f)) for r, f in assigned.items() if QUOTA_RESOURCE.match(r))
        usage = ps.get("resourceUsage") or {}
        out.append(
            PodSetAssignment(
                count=_pod_count(ps.get("count")),
                flavors=flavors,
                usage={r: units.amount_or_zero(usage.get(r)) for r, _ in flavors},
            )
        )
    return tuple(out)


def workload_from_object(obj: Mapping[str, Any]) -> WorkloadInfo:
    """Parse a kueue.x-k8s.io Workload (v1beta1 or v1beta2: the fields read are in both)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    quota = reason = message = finished = ""
    reserved_at = requeued = finished_s = preempted = None
    has_requeued = False
    for cond in status.get("conditions") or ():
        kind = cond.get("type")
        if kind == "QuotaReserved":
            quota = str(cond.get("status", ""))
            reason = str(cond.get("reason") or "")
            message = str(cond.get("message") or "")
            reserved_at = cond.get("lastTransitionTime")
        elif kind == "Requeued":
            has_requeued = True
            requeued = parse_time(cond.get("lastTransitionTime"))
        elif kind == "Finished":
            finished = str(cond.get("status", ""))
            if finished == "True":
                finished_s = parse_time(cond.get("lastTransitionTime"))
        elif kind == "Preempted" and cond.get("status") == "True":
            preempted = str(cond.get("reason") or "Preempted")
    created = parse_time(meta.get("creationTimestamp"))
    admission = status.get("admission") or {}
    owners = meta.get("ownerReferences") or ()
    first = owners[0] if owners else None
    return WorkloadInfo(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name", "")),
        owners=tuple(str(o.get("uid", "")) for o in meta.get("ownerReferences") or ()),
        queue=str(spec.get("queueName") or ""),
        cluster_queue=str(admission.get("clusterQueue") or ""),
        quota_reserved=quota,
        reason=reason,
        message=message,
        created_s=created,
        queued_s=requeued if has_requeued else created,
        reserved_s=parse_time(reserved_at) if quota == "True" else None,
        finished=finished,
        finished_s=finished_s,
        preempted=preempted,
        pod_sets=_pod_sets(admission) if quota == "True" else (),
        uid=str(meta.get("uid") or ""),
        owner=(
            OwnerRef(
                str(first.get("apiVersion") or ""),
                str(first.get("kind") or ""),
                str(first.get("name") or ""),
                str(first.get("uid") or ""),
            )
            if isinstance(first, Mapping)
            else None
        ),
        active=spec.get("active") is not False,
        # Only a Workload still waiting is diagnosed from its spec: the review reads 100,000
        # admitted and finished ones and needs none of it.
        wanted=_wanted(spec) if quota != "True" and finished != "True" else (),
    )


def _wanted(spec: Mapping[str, Any]) -> tuple[tuple[str, int, Mapping[str, int]], ...]:
    out = []
    for ps in spec.get("podSets") or ():
        template = (ps.get("template") or {}).get("spec") or {}
        try:
            per_pod = pod_requests(template)
        except ValueError:  # a quantity the API server would refuse: asks for nothing here
            per_pod = {}
        if per_pod:
            out.append((str(ps.get("name") or "main"), _pod_count(ps.get("count")), per_pod))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ClusterQueueInfo:
    """A Kueue ClusterQueue: its quota per flavor and resource, and what Kueue counts now."""

    name: str
    labels: Mapping[str, str]
    cohort: str | None
    nominal: Mapping[tuple[str, str], float]  # (flavor, resource) -> nominalQuota
    lending: Mapping[tuple[str, str], float]  # lendingLimit, where set
    # status.flavorsUsage: (flavor, resource, total, borrowed)
    usage: tuple[tuple[str, str, float, float], ...]
    borrowing: Mapping[tuple[str, str], float] = field(default_factory=dict)  # where set


def cluster_queue_from_object(obj: Mapping[str, Any]) -> ClusterQueueInfo:
    """Parse a kueue.x-k8s.io ClusterQueue (v1beta1 or v1beta2)."""
    meta = obj.get("metadata") or {}
    nominal: dict[tuple[str, str], float] = {}
    lending: dict[tuple[str, str], float] = {}
    borrowing: dict[tuple[str, str], float] = {}
    for flavor, resource, entry in kueue.flavor_quotas(obj):
        nominal[(flavor, resource)] = units.amount_or_zero(entry.get("nominalQuota"))
        if entry.get("lendingLimit") is not None:
            lending[(flavor, resource)] = units.amount_or_zero(entry.get("lendingLimit"))
        if entry.get("borrowingLimit") is not None:
            borrowing[(flavor, resource)] = units.amount_or_zero(entry.get("borrowingLimit"))
    usage = tuple(
        (
            str(fu.get("name")),
            str(r.get("name")),
            units.amount_or_zero(r.get("total")),
            units.amount_or_zero(r.get("borrowed")),
        )
        for fu in (obj.get("status") or {}).get("flavorsUsage") or ()
        for r in fu.get("resources") or ()
    )
    return ClusterQueueInfo(
        name=str(meta.get("name")),
        labels=dict(meta.get("labels") or {}),
        cohort=kueue.cohort_of(obj),
        nominal=nominal,
        lending=lending,
        usage=usage,
        borrowing=borrowing,
    )


def local_queue_from_object(obj: Mapping[str, Any]) -> tuple[tuple[str, str], str]:
    """A kueue.x-k8s.io LocalQueue as ``((namespace, name), its ClusterQueue)``."""
    meta = obj.get("metadata") or {}
    key = (str(meta.get("namespace") or "default"), str(meta.get("name", "")))
    return key, str((obj.get("spec") or {}).get("clusterQueue") or "")


# --- the whole view -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Nodes, pods and (when Kueue is installed) Workloads, as of one moment."""

    nodes: tuple[Node, ...]
    pods: tuple[PodInfo, ...]
    workloads: tuple[WorkloadInfo, ...] = ()
    kueue: bool = False  # the Kueue API is served (its Workloads were read)
    local_queues: Mapping[tuple[str, str], str] = field(default_factory=dict)  # -> ClusterQueue
    cluster_queues: tuple[ClusterQueueInfo, ...] = ()


NO_QUEUE = "(no queue)"


def pod_queues(view: ClusterView) -> dict[str, str]:
    """The ClusterQueue each pod's quota comes from, by pod key (``namespace/name``).

    A pod of an admitted Workload (its own, or its job's) is the Workload's ClusterQueue; else
    the ClusterQueue behind its ``kueue.x-k8s.io/queue-name`` LocalQueue; else
    :data:`NO_QUEUE` (a pod Kueue does not manage, or a queue this view does not know).
    """
    by_owner: dict[str, str] = {}
    for w in view.workloads:
        queue = w.cluster_queue or view.local_queues.get((w.namespace, w.queue), "")
        if queue:
            for uid in w.owners:
                by_owner[uid] = queue
    out: dict[str, str] = {}
    for pod in view.pods:
        queue = next((by_owner[u] for u in (pod.uid, *pod.owners) if u in by_owner), "")
        if not queue:
            local = pod.labels.get(KUEUE_QUEUE_LABEL, "")
            queue = view.local_queues.get((pod.namespace, local), "") if local else ""
        out[pod.key] = queue or NO_QUEUE
    return out


def view_from_objects(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    workloads: Iterable[Mapping[str, Any]] | None = None,
    *,
    local_queues: Iterable[Mapping[str, Any]] = (),
    cluster_queues: Iterable[Mapping[str, Any]] = (),
) -> ClusterView:
    """A view from raw API objects (``workloads=None``: the Kueue API is absent)."""
    return ClusterView(
        nodes=tuple(Node.from_object(n) for n in nodes),
        pods=tuple(pod_from_object(p) for p in pods),
        workloads=tuple(workload_from_object(w) for w in workloads or ()),
        kueue=workloads is not None,
        local_queues=dict(map(local_queue_from_object, local_queues)),
        cluster_queues=tuple(map(cluster_queue_from_object, cluster_queues)),
    )


def read_view(kube: Kube) -> ClusterView:
    """Nodes, pods and (when Kueue is installed) Workloads, LocalQueues and ClusterQueues,
    listed once.

    Raises:
        KubeError: a list failed.
    """
    workloads = kube.list_workloads()
    queues: dict[str, list[Any]] = {"localqueues": [], "clusterqueues": []}
    if workloads is not None:
        for plural in queues:
            listed = kube.list_kueue_plural(plural)
            queues[plural] = (listed or {}).get("items") or []
    return view_from_objects(
        kube.list_nodes().get("items") or [],
        kube.list_pods().get("items") or [],
        None if workloads is None else workloads.get("items") or [],
        local_queues=queues["localqueues"],
        cluster_queues=queues["clusterqueues"],
    )


def request_amounts(pod: Mapping[str, Any], names: re.Pattern[str]) -> dict[str, float]:
    """What a raw Pod object's containers ask for of the resources whose names match, summed
    (a container's request, else its limit), as numbers; zero amounts are left out."""
    out: dict[str, float] = {}
    for c in (pod.get("spec") or {}).get("containers") or ():
        res = c.get("resources") or {}
        for name, value in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            if names.match(name) and (n := units.amount_or_zero(value)) > 0:
                out[name] = out.get(name, 0.0) + n
    return out
