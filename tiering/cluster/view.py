"""The cluster as the pending-workload diagnosis sees it, parsed once from API objects.

Nodes carry what their agents published (labels, the ``nodeagent.io/gpu-state`` annotation,
allocatable ``nvidia.com/*`` resources), pods their GPU requests and scheduling constraints,
Kueue Workloads their quota state. Everything is plain frozen data: the diagnosis
(:mod:`nodeagent_tiering.pending.diagnosis`) is a pure function of a :class:`ClusterView`,
fed by the service's caches, by ``why-pending`` from one list of each kind, or by
``simulate`` from a cluster file.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent import labels as lbl
from nodeagent.published import PublishedError, PublishedNode, decode
from nodeagent_tiering.cluster import units
from nodeagent_tiering.cluster.cluster_api import Kube
from nodeagent_tiering.cluster.nodes import DRAIN_ANNOTATION
from nodeagent_tiering.cluster.tier_policy import Operator, Requirement
from nodeagent_tiering.cluster.units import parse_time

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_SUFFIX = ".shared"
MIG_PREFIX = "nvidia.com/mig-"
KUEUE_GATE = "kueue.x-k8s.io/admission"  # the scheduling gate Kueue's pod integration sets
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
_MIG_NAME = re.compile(r"^(\d+g\.\d+gb)(?:\.(.+))?$")


class Kind(enum.StrEnum):
    """What a GPU resource name counts."""

    GPU = "gpu"  # whole GPUs (nvidia.com/gpu)
    MIG = "mig"  # MIG instances of one profile (nvidia.com/mig-<profile>)
    SHARED = "shared"  # replicas of a shared GPU or MIG device (<name>.shared)


def resource_kind(name: str) -> tuple[Kind, str | None] | None:
    """The kind of a GPU resource and its MIG profile; ``None`` for anything else.

    ``nvidia.com/mig-1g.10gb.me`` is profile ``1g.10gb+me`` (the device plugin writes ``+`` as
    ``.``, as NVIDIA's plugin does).
    """
    if name.endswith(SHARED_SUFFIX):
        base = name.removesuffix(SHARED_SUFFIX)
        return (Kind.SHARED, None) if resource_kind(base) is not None else None
    if name == GPU_RESOURCE:
        return Kind.GPU, None
    if name.startswith(MIG_PREFIX):
        match = _MIG_NAME.match(name.removeprefix(MIG_PREFIX))
        if match is None:
            return None
        profile = match.group(1) + (f"+{match.group(2)}" if match.group(2) else "")
        return Kind.MIG, profile
    return None


# --- nodes --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node: scheduling facts and what its agent published."""

    name: str
    labels: dict[str, str]
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    allocatable: Mapping[str, int] = field(default_factory=dict)  # GPU resources only
    published: PublishedNode | None = None
    published_error: str | None = None  # why the annotation could not be read
    draining: bool = False  # the tiering service's drain record is on it

    @property
    def tier(self) -> str:
        """The tier label the service wrote, ``none`` without one."""
        return self.labels.get(lbl.TIER) or "none"


def node_from_object(obj: Mapping[str, Any]) -> NodeInfo:
    """Parse a Node (a dict as the API server returns it)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    allocatable = {
        k: units.count(v)
        for k, v in (status.get("allocatable") or {}).items()
        if resource_kind(k) is not None
    }
    published = error = None
    text = annotations.get(lbl.GPU_STATE_ANNOTATION)
    if text is not None:
        try:
            published = decode(text)
        except PublishedError as exc:
            error = str(exc)
    return NodeInfo(
        name=str(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
            for t in spec.get("taints") or ()
        ),
        unschedulable=bool(spec.get("unschedulable")),
        allocatable=allocatable,
        published=published,
        published_error=error,
        draining=DRAIN_ANNOTATION in annotations,
    )


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

    def matches(self, node: NodeInfo) -> bool:
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


def pod_from_object(obj: Mapping[str, Any]) -> PodInfo:
    """Parse a Pod (a dict as the API server returns it)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    scheduled = None
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled":
            scheduled = Scheduled(
                str(cond.get("status", "")),
                str(cond.get("reason") or ""),
                str(cond.get("message") or ""),
            )
    return PodInfo(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid") or ""),
        node_name=spec.get("nodeName") or None,
        phase=str(status.get("phase") or "Pending"),
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

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


def workload_from_object(obj: Mapping[str, Any]) -> WorkloadInfo:
    """Parse a kueue.x-k8s.io Workload (v1beta1 or v1beta2: the fields read are in both)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    quota = reason = message = ""
    for cond in status.get("conditions") or ():
        if cond.get("type") == "QuotaReserved":
            quota = str(cond.get("status", ""))
            reason = str(cond.get("reason") or "")
            message = str(cond.get("message") or "")
    return WorkloadInfo(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name", "")),
        owners=tuple(str(o.get("uid", "")) for o in meta.get("ownerReferences") or ()),
        queue=str(spec.get("queueName") or ""),
        cluster_queue=str((status.get("admission") or {}).get("clusterQueue") or ""),
        quota_reserved=quota,
        reason=reason,
        message=message,
    )


# --- the whole view -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Nodes, pods and (when Kueue is installed) Workloads, as of one moment."""

    nodes: tuple[NodeInfo, ...]
    pods: tuple[PodInfo, ...]
    workloads: tuple[WorkloadInfo, ...] = ()
    kueue: bool = False  # the Kueue API is served (its Workloads were read)


def view_from_objects(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    workloads: Iterable[Mapping[str, Any]] | None = None,
) -> ClusterView:
    """A view from raw API objects (``workloads=None``: the Kueue API is absent)."""
    return ClusterView(
        nodes=tuple(node_from_object(n) for n in nodes),
        pods=tuple(pod_from_object(p) for p in pods),
        workloads=tuple(workload_from_object(w) for w in workloads or ()),
        kueue=workloads is not None,
    )


def read_view(kube: Kube) -> ClusterView:
    """Nodes, pods and (when Kueue is installed) Workloads, listed once.

    Raises:
        KubeError: a list failed.
    """
    workloads = kube.list_workloads()
    return view_from_objects(
        kube.list_nodes().get("items") or [],
        kube.list_pods().get("items") or [],
        None if workloads is None else workloads.get("items") or [],
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
