"""Capacity that follows health: what each tier's healthy nodes can back of the quota promised
on it, and ``quota check``.

Kueue counts quota, not nodes: a ClusterQueue keeps admitting up to its ``nominalQuota`` even
when the nodes behind it are drained. This module is the link between the two. Per flavor (a
tier, or a GPU product in a tier) and resource it adds up

- **installed**: what the tier's nodes advertise (``status.allocatable``, which for MIG is the
  device plugin's ``nvidia.com/mig-<profile>`` resources in the mixed strategy), counting the
  nodes the service quarantined from this tier;
- **healthy**: the same over the nodes that can take work now: not quarantined or draining,
  not unstable (``GPUHealthy=False`` or ``nodeagent.io/stability=unstable``), not cordoned,
  and Ready;
- **promised**: the ``nominalQuota`` every ClusterQueue puts on the flavor (nodeagent's and
  anyone else's).

Guaranteed quota is *backed* up to the healthy capacity; what is promised beyond it is not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from nodeagent import labels as lbl
from nodeagent_tiering.cluster import JSON, kueue, units
from nodeagent_tiering.cluster.nodes import Node, Phase
from nodeagent_tiering.cluster.tier_policy import Stability
from nodeagent_tiering.cluster.view import cluster_queue_from_object
from nodeagent_tiering.quota.flavors import Flavor, drift
from nodeagent_tiering.quota.policy import (
    RESOURCE,
    QuotaPolicy,
    cluster_queue_name,
    guarantees,
    local_queues,
    team_of_namespace,
)

LOST_SHOWN = 3  # nodes named in a problem line before "and N more"


@dataclass
class Capacity:
    """One flavor's capacity of one resource."""

    flavor: str
    tier: str
    resource: str
    installed: float = 0.0
    healthy: float = 0.0
    lost: list[tuple[str, str, float]] = field(default_factory=list)  # node, why, amount


def _why_out(view: Node) -> str | None:
    """Why a node cannot take work now, or ``None`` when it can."""
    if view.drain is not None:
        state = "draining" if view.drain.phase is Phase.DRAINING else "drained"
        return f"{state} ({view.drain.cause})" if view.drain.cause else state
    if view.stability is Stability.UNSTABLE:
        return f"unstable ({view.unstable_cause})"
    if view.unschedulable:
        return "cordoned"
    if view.not_ready:
        return "not Ready"
    return None


def capacity(
    nodes: Iterable[Mapping[str, Any]], flavors: Sequence[Flavor]
) -> dict[tuple[str, str], Capacity]:
    """``(flavor, resource) -> Capacity`` over the cluster's nodes (raw Node objects)."""
    out: dict[tuple[str, str], Capacity] = {}
    by_tier: dict[str, list[Flavor]] = {}
    for f in flavors:
        by_tier.setdefault(f.tier, []).append(f)
    for obj in nodes:
        view = Node.from_object(dict(obj))
        # A quarantined node wears the quarantine tier; it still belongs to the tier it left.
        tier = view.drain.tier if view.drain is not None else view.labels.get(lbl.TIER)
        candidates = by_tier.get(tier or "")
        if not candidates:
            continue
        labels = {**view.labels, lbl.TIER: tier or ""}
        why = _why_out(view)
        for flavor in candidates:
            if not flavor.selects(labels):
                continue
            for resource, amount in view.amounts(RESOURCE).items():
                cap = out.setdefault(
                    (flavor.name, resource), Capacity(flavor.name, flavor.tier, resource)
                )
                cap.installed += amount
                if why is None:
                    cap.healthy += amount
                elif amount:
                    cap.lost.append((view.name, why, amount))
    return out


def promised(
    cluster_queues: Iterable[Mapping[str, Any]], flavors: Sequence[Flavor]
) -> dict[tuple[str, str], dict[str, float]]:
    """``(flavor, resource) -> {ClusterQueue: nominalQuota}`` on nodeagent's flavors."""
    names = {f.name for f in flavors}
    out: dict[tuple[str, str], dict[str, float]] = {}
    for cq in map(cluster_queue_from_object, cluster_queues):
        for (flavor, resource), amount in cq.nominal.items():
            # A quota the API server would refuse reads as 0: it promises nothing.
            if flavor in names and amount:
                out.setdefault((flavor, resource), {})[cq.name] = amount
    return out


# --- quota check ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding of ``quota check``."""

    kind: str  # overcommitted | unbacked | no-queue | flavor | taint
    message: str
    team: str | None = None
    tier: str | None = None
    resource: str | None = None

    def line(self) -> str:
        """``team T, tier X, R: message`` (the parts that apply)."""
        parts = []
        if self.team:
            parts.append(f"team {self.team}")
        if self.tier:
            parts.append(f"tier {self.tier}")
        if self.resource:
            parts.append(self.resource)
        return f"{', '.join(parts)}: {self.message}" if parts else self.message

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``: every field under its name."""
        return asdict(self)


@dataclass
class Cluster:
    """What ``quota check`` reads from the API server."""

    nodes: Sequence[JSON]
    flavors: Sequence[JSON]
    cluster_queues: Sequence[JSON]
    local_queues: Sequence[JSON]
    workloads: Sequence[JSON] = ()


def _n(value: float) -> str:
    return units.quantity_text(value)


def _lost_text(cap: Capacity) -> str:
    shown = [f"{node} {why}" for node, why, _ in cap.lost[:LOST_SHOWN]]
    more = len(cap.lost) - LOST_SHOWN
    if more > 0:
        shown.append(f"and {more} more")
    return "; ".join(shown)


def check(policy: QuotaPolicy, flavors: Sequence[Flavor], cluster: Cluster) -> list[Problem]:
    """Every problem of the policy against the cluster, most serious first."""
    problems: list[Problem] = []
    caps = capacity(cluster.nodes, flavors)
    ours = {cluster_queue_name(t.name, tier) for t in policy.teams for tier in t.tiers}
    # What is promised: the policy for nodeagent's queues, the cluster for everyone else's.
    foreign = [
        cq for cq in cluster.cluster_queues if (cq.get("metadata") or {}).get("name") not in ours
    ]
    promises: dict[tuple[str, str], dict[str, float]] = {}
    owners: dict[str, tuple[str | None, str]] = {}  # queue -> (team, label)
    for (team, tier, flavor, resource), guaranteed in guarantees(policy).items():
        if guaranteed:
            queue = cluster_queue_name(team, tier)
            promises.setdefault((flavor, resource), {})[queue] = float(guaranteed)
            owners[queue] = (team, f"team {team}")
    for key, queues in promised(foreign, flavors).items():
        for queue, amount in queues.items():
            promises.setdefault(key, {})[queue] = amount
            owners[queue] = (None, f"ClusterQueue {queue} (not nodeagent's)")
    tier_of = {f.name: f.tier for f in flavors}
    for (flavor, resource), queues in sorted(promises.items()):
        tier = tier_of[flavor]
        cap = caps.get((flavor, resource)) or Capacity(flavor, tier, resource)
        total = sum(queues.values())
        where = f" (flavor {flavor})" if flavor != tier else ""
        if total > cap.installed:
            kind = "overcommitted"
            has = (
                f"its nodes have {_n(cap.installed)} installed"
                if cap.installed
                else "its nodes advertise none"
            )
            what = f"the tier{where} promises {_n(total)} and {has}"
        elif total > cap.healthy:
            kind = "unbacked"
            what = (
                f"the tier{where} promises {_n(total)} and its healthy nodes hold "
                f"{_n(cap.healthy)} of {_n(cap.installed)} ({_lost_text(cap)}): "
                f"{_n(total - cap.healthy)} not backed"
            )
        else:
            continue
        for queue, amount in sorted(queues.items()):
            owner, label = owners[queue]
            prefix = "" if owner else f"{label}: "
            problems.append(
                Problem(
                    kind,
                    f"{prefix}guaranteed {_n(amount)} cannot be backed: {what}",
                    team=owner,
                    tier=tier,
                    resource=resource,
                )
            )
    problems.extend(_queue_problems(policy, cluster))
    problems.extend(_flavor_problems(flavors, cluster))
    return problems


def _queue_problems(policy: QuotaPolicy, cluster: Cluster) -> list[Problem]:
    problems: list[Problem] = []
    cqs = {str(o["metadata"]["name"]): o for o in cluster.cluster_queues}
    lqs = {
        (str(o["metadata"].get("namespace")), str(o["metadata"]["name"])): o
        for o in cluster.local_queues
    }
    for team in policy.teams:
        for tier in team.tiers:
            name = cluster_queue_name(team.name, tier)
            cq = cqs.get(name)
            if cq is None:
                problems.append(
                    Problem(
                        "no-queue",
                        f"ClusterQueue {name} does not exist (`nodeagent tiering quota render "
                        "--apply` creates it)",
                        team=team.name,
                        tier=tier,
                    )
                )
            elif not kueue.managed(cq):
                problems.append(
                    Problem(
                        "no-queue",
                        f"ClusterQueue {name} exists and is not managed by nodeagent",
                        team=team.name,
                        tier=tier,
                    )
                )
    for key, ns, queue in local_queues(policy):
        lq = lqs.get((ns, queue))
        want = cluster_queue_name(key.team, key.tier)
        if lq is None:
            message = (
                f"LocalQueue {ns}/{queue} does not exist: jobs in {ns} cannot reach tier {key.tier}"
            )
            problems.append(Problem("no-queue", message, team=key.team, tier=key.tier))
        elif (lq.get("spec") or {}).get("clusterQueue") != want:
            other = (lq.get("spec") or {}).get("clusterQueue")
            message = f"LocalQueue {ns}/{queue} sends work to ClusterQueue {other}, not {want}"
            problems.append(Problem("no-queue", message, team=key.team, tier=key.tier))
    # Work a team submits to a queue nobody made waits forever: Kueue never admits it.
    owner = team_of_namespace(policy)
    waiting: dict[tuple[str, str], int] = {}
    for wl in cluster.workloads:
        ns = str(wl["metadata"].get("namespace"))
        queue = str((wl.get("spec") or {}).get("queueName") or "")
        if ns in owner and queue and (ns, queue) not in lqs and not kueue.condition(wl, "Finished"):
            waiting[(ns, queue)] = waiting.get((ns, queue), 0) + 1
    for (ns, queue), count in sorted(waiting.items()):
        message = f"{count} workloads in {ns} wait on LocalQueue {queue}, which does not exist"
        problems.append(Problem("no-queue", message, team=owner[ns]))
    return problems


def _flavor_problems(flavors: Sequence[Flavor], cluster: Cluster) -> list[Problem]:
    problems: list[Problem] = []
    have = {str(o["metadata"]["name"]): o for o in cluster.flavors}
    for f in flavors:
        obj = have.get(f.name)
        if obj is None:
            message = (
                f"ResourceFlavor {f.name} does not exist (the tiering service creates it when "
                "it runs with Kueue; `nodeagent tiering quota flavors --sync` does it once)"
            )
            problems.append(Problem("flavor", message, tier=f.tier))
        elif not kueue.managed(obj):
            message = f"ResourceFlavor {f.name} exists and is not managed by nodeagent"
            problems.append(Problem("flavor", message, tier=f.tier))
    for name, note in sorted(drift(flavors, cluster.flavors).items()):
        tier = next(f.tier for f in flavors if f.name == name)
        problems.append(Problem("flavor", f"ResourceFlavor {name}: {note}", tier=tier))
    for obj in cluster.nodes:
        view = Node.from_object(dict(obj))
        for f in flavors:
            if not f.taints or not f.selects(view.labels):
                continue
            for taint in f.taints:
                if not taint.on(view.taints):
                    value = f"={taint.value}" if taint.value else ""
                    message = (
                        f"node {view.name} lacks the taint {taint.key}{value}:{taint.effect} "
                        f"that flavor {f.name} declares"
                    )
                    problems.append(Problem("taint", message, tier=f.tier))
    return problems


@dataclass(frozen=True, slots=True)
class Backing:
    """How much of a flavor's promised quota of one resource its healthy nodes back."""

    tier: str
    flavor: str
    resource: str
    promised: float
    healthy: float
    installed: float

    @property
    def backed(self) -> float:
        """The promised quota the healthy capacity covers."""
        return min(self.promised, self.healthy)


def backing(
    nodes: Iterable[Mapping[str, Any]],
    cluster_queues: Iterable[Mapping[str, Any]],
    flavors: Sequence[Flavor],
) -> list[Backing]:
    """Per flavor and resource with capacity or a promise: promised vs healthy vs installed."""
    caps = capacity(nodes, flavors)
    promises = promised(cluster_queues, flavors)
    tier_of = {f.name: f.tier for f in flavors}
    rows = []
    for flavor, resource in sorted(set(caps) | set(promises)):
        cap = caps.get((flavor, resource))
        rows.append(
            Backing(
                tier_of[flavor],
                flavor,
                resource,
                sum((promises.get((flavor, resource)) or {}).values()),
                cap.healthy if cap else 0.0,
                cap.installed if cap else 0.0,
            )
        )
    return rows
