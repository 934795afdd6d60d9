"""Capacity that follows health: what each tier's healthy nodes can back of the quota promised
on it, and ``quota check``.

Kueue counts quota, not nodes: a ClusterQueue keeps admitting up to its ``nominalQuota`` even
when the nodes behind it are drained. This module is the link between the two. Per flavor (a
tier, or a GPU product in a tier) and resource it adds up

- **installed**: the devices the tier's nodes have (``status.capacity``, which for MIG is the
  device plugin's ``nvidia.com/mig-<profile>`` resources in the mixed strategy; the kubelet
  lowers ``allocatable``, not capacity, for an unhealthy device), counting the nodes the
  service quarantined from this tier;
- **healthy**: GPU by GPU, what can take work now. A node out as a whole (quarantined or
  draining, labelled ``nodeagent.io/stability=unstable``, cordoned, NotReady, or
  ``GPUHealthy=False`` with no faulty GPU named in its published state) backs nothing; on any
  other node only the devices of the GPUs its agent publishes unhealthy or lost are out (one
  GPU with an XID 48 costs one GPU, not eight), and never more than ``allocatable`` says;
- **promised**: the ``nominalQuota`` every ClusterQueue puts on the flavor (nodeagent's and
  anyone else's).

Guaranteed quota is *backed* up to the healthy capacity; what is promised beyond it is not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from nodeagent import labels as lbl
from nodeagent.published import PublishedGpu
from nodeagent_tiering.cluster import JSON, kueue, units
from nodeagent_tiering.cluster.nodes import GPU_RESOURCE, MIG_PREFIX, SHARED_SUFFIX, Node, Phase
from nodeagent_tiering.cluster.tier_policy import Stability
from nodeagent_tiering.cluster.view import cluster_queue_from_object
from nodeagent_tiering.quota.flavors import Flavor, drift
from nodeagent_tiering.quota.policy import (
    RESOURCE,
    QuotaPolicy,
    cluster_queue,
    cluster_queue_name,
    guarantees,
    local_queues,
    reserve_namespaces,
    reserved_cluster_queue,
    reserved_local_queue,
    reserved_queue_name,
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
    """Why the whole node cannot take work now, or ``None`` when its healthy GPUs can."""
    if view.drain is not None:
        state = "draining" if view.drain.phase is Phase.DRAINING else "drained"
        return f"{state} ({view.drain.cause})" if view.drain.cause else state
    if view.labels.get(lbl.STABILITY) == Stability.UNSTABLE.value:
        return f"unstable ({view.unstable_cause})"
    if view.stability is Stability.UNSTABLE and not view.faulty_gpus:
        return f"unstable ({view.unstable_cause}; no faulty GPU published)"
    if view.unschedulable:
        return "cordoned"
    if view.not_ready:
        return "not Ready"
    return None


def _devices(gpus: Iterable[PublishedGpu]) -> Counter[str]:
    """Devices per exclusive resource name, as the device plugin advertises them."""
    out: Counter[str] = Counter()
    for g in gpus:
        if g.mig is None:
            out[GPU_RESOURCE] += 1
        for i in g.mig or ():
            out[MIG_PREFIX + lbl.mig_device_name(i.profile)] += 1
    return out


def _faulty_share(view: Node, installed: Mapping[str, float]) -> tuple[dict[str, float], str]:
    """Per resource, what the node's faulty GPUs account for (a shared resource's replicas in
    proportion), and which GPUs they are."""
    faulty = view.faulty_gpus
    if not faulty or view.published is None:
        return {}, ""
    bad = _devices(faulty)
    every = _devices(view.published.gpus)
    out: dict[str, float] = {}
    for resource, amount in installed.items():
        base = resource.removesuffix(SHARED_SUFFIX)
        if not bad.get(base):
            continue
        if resource == base:
            out[resource] = float(bad[base])
        elif every.get(base):  # replicas: the faulty GPUs' part of them
            out[resource] = amount * bad[base] / every[base]
    which = ", ".join(f"GPU {g.index} {g.health}" for g in faulty)
    return out, which


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
        allocatable = view.amounts(RESOURCE)
        installed = {**allocatable, **view.amounts(RESOURCE, field="capacity")}
        faulty, which = _faulty_share(view, installed) if why is None else ({}, "")
        for flavor in candidates:
            if not flavor.selects(labels):
                continue
            for resource, amount in installed.items():
                cap = out.setdefault(
                    (flavor.name, resource), Capacity(flavor.name, flavor.tier, resource)
                )
                cap.installed += amount
                if why is not None:
                    if amount:
                        cap.lost.append((view.name, why, amount))
                    continue
                healthy = min(allocatable.get(resource, 0.0), amount - faulty.get(resource, 0.0))
                cap.healthy += max(0.0, healthy)
                if amount - healthy > 0:
                    cap.lost.append((view.name, which or "not allocatable", amount - healthy))
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

    kind: str  # overcommitted | unbacked | no-queue | drift | flavor | taint
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
    api: kueue.KueueApi | None = None  # the served Kueue API; None: no drift of queues checked


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
    team_of = {cluster_queue_name(t.name, tier): t.name for t in policy.teams for tier in t.tiers}
    applied = {
        str(cq["metadata"]["name"])
        for cq in cluster.cluster_queues
        if str(cq["metadata"]["name"]) in team_of and kueue.managed(cq)
    }
    # What is promised is what Kueue admits against: the cluster's ClusterQueues (the service's
    # metrics read the same), and the policy's guarantees for queues not applied yet.
    promises: dict[tuple[str, str], dict[str, float]] = {}
    owners: dict[str, tuple[str | None, str]] = {}  # queue -> (team, label)
    for (team, tier, flavor, resource), guaranteed in guarantees(policy).items():
        queue = cluster_queue_name(team, tier)
        if guaranteed and queue not in applied:
            promises.setdefault((flavor, resource), {})[queue] = float(guaranteed)
            owners[queue] = (team, f"team {team}")
    unapplied = set(team_of) - applied  # the policy's numbers stand in for these
    reserves = {reserved_queue_name(t) for t, s in policy.tiers.items() if s.reserve is not None}
    on_cluster = [cq for cq in cluster.cluster_queues if cq["metadata"]["name"] not in unapplied]
    for key, queues in promised(on_cluster, flavors).items():
        for queue, amount in queues.items():
            promises.setdefault(key, {})[queue] = amount
            if queue in applied:
                owners[queue] = (team_of[queue], f"team {team_of[queue]}")
            elif queue in reserves:
                owners[queue] = (None, f"the reserve for large jobs ({queue})")
            else:
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
    if cluster.api is not None:
        problems.extend(_queue_drift(policy, flavors, cluster, cluster.api))
    problems.extend(_flavor_problems(flavors, cluster))
    return problems


_LIMITS = (
    ("nominalQuota", "guarantees"),
    ("borrowingLimit", "may borrow"),
    ("lendingLimit", "may lend"),
)


def _quota_entries(cq: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, float | None]]:
    """``(flavor, resource) -> {field: amount or None (unset)}`` of a ClusterQueue's spec."""
    return {
        (flavor, resource): {
            name: None if entry.get(name) is None else units.amount_or_zero(entry.get(name))
            for name, _ in _LIMITS
        }
        for flavor, resource, entry in kueue.flavor_quotas(cq)
    }


def _limit_text(value: float | None) -> str:
    return "unlimited" if value is None else _n(value)


def _wanted_queues(
    policy: QuotaPolicy, api: kueue.KueueApi, flavors: Sequence[Flavor]
) -> list[tuple[JSON, str | None, str]]:
    """(ClusterQueue as rendered, its team or None for a reserve, tier) for every queue the
    policy makes: the teams' and each tier's reserve."""
    wanted: list[tuple[JSON, str | None, str]] = [
        (cluster_queue(policy, team, tier, api, flavors), team.name, tier)
        for team in policy.teams
        for tier in team.tiers
    ]
    wanted += [
        (reserved_cluster_queue(policy, f.tier, api, f), None, f.tier)
        for f in flavors
        if f.reserved
    ]
    return wanted


def _queue_drift(
    policy: QuotaPolicy, flavors: Sequence[Flavor], cluster: Cluster, api: kueue.KueueApi
) -> list[Problem]:
    """Where nodeagent's ClusterQueues on the cluster (the teams' and the reserves') differ
    from the policy, both ways: a quota changed by hand, one the policy has and the cluster
    lacks, and one the cluster has that the policy does not (Kueue admits against the
    cluster's numbers)."""
    fix = "`nodeagent tiering quota render --apply` restores the policy's; or change the policy"
    have = {str(o["metadata"]["name"]): o for o in cluster.cluster_queues}
    problems: list[Problem] = []
    for want, team, tier in _wanted_queues(policy, api, flavors):
        name = str(want["metadata"]["name"])
        cq = have.get(name)
        if cq is None or not kueue.managed(cq):
            continue  # reported as a missing or foreign queue
        wanted, held = _quota_entries(want), _quota_entries(cq)
        for flavor, resource in sorted(set(wanted) | set(held)):
            w, h = wanted.get((flavor, resource)), held.get((flavor, resource))
            where = f"ClusterQueue {name}, flavor {flavor}"
            if h is None:
                assert w is not None
                what = (
                    f"{where}: the policy guarantees {_limit_text(w['nominalQuota'])}, the "
                    "cluster's queue has no quota for it"
                )
            elif w is None:
                what = (
                    f"{where}: the cluster's queue guarantees "
                    f"{_limit_text(h['nominalQuota'])}, the policy has no quota for it"
                )
            else:
                diffs = [
                    f"{verb} {_limit_text(h[field])} on the cluster, {_limit_text(w[field])} "
                    "in the policy"
                    for field, verb in _LIMITS
                    if h[field] != w[field]
                ]
                if not diffs:
                    continue
                what = f"{where}: " + "; ".join(diffs)
            problems.append(
                Problem("drift", f"{what} ({fix})", team=team, tier=tier, resource=resource)
            )
        cohort, wanted_cohort = kueue.cohort_of(cq), kueue.cohort_of(want)
        if cohort != wanted_cohort:
            what = (
                f"ClusterQueue {name} is in cohort {cohort or '(none)'} on the cluster, "
                f"{wanted_cohort} in the policy ({fix})"
            )
            problems.append(Problem("drift", what, team=team, tier=tier))
    return problems


def _queue_problems(policy: QuotaPolicy, cluster: Cluster) -> list[Problem]:
    problems: list[Problem] = []
    cqs = {str(o["metadata"]["name"]): o for o in cluster.cluster_queues}
    lqs = {
        (str(o["metadata"].get("namespace")), str(o["metadata"]["name"])): o
        for o in cluster.local_queues
    }
    names: list[tuple[str, str | None, str]] = [
        (cluster_queue_name(team.name, tier), team.name, tier)
        for team in policy.teams
        for tier in team.tiers
    ]
    names += [
        (reserved_queue_name(tier), None, tier)
        for tier, settings in policy.tiers.items()
        if settings.reserve is not None
    ]
    for name, team, tier in names:
        cq = cqs.get(name)
        if cq is None:
            what = (
                f"ClusterQueue {name} does not exist (`nodeagent tiering quota render --apply` "
                "creates it)"
            )
            problems.append(Problem("no-queue", what, team=team, tier=tier))
        elif not kueue.managed(cq):
            what = f"ClusterQueue {name} exists and is not managed by nodeagent"
            problems.append(Problem("no-queue", what, team=team, tier=tier))
    # (namespace, LocalQueue, the ClusterQueue it must feed, team, tier, what it reaches)
    wanted_lqs: list[tuple[str, str, str, str | None, str, str]] = [
        (ns, queue, cluster_queue_name(key.team, key.tier), key.team, key.tier, f"tier {key.tier}")
        for key, ns, queue in local_queues(policy)
    ]
    wanted_lqs += [
        (
            ns,
            reserved_local_queue(policy, tier),
            reserved_queue_name(tier),
            None,
            tier,
            f"the reserve of tier {tier}",
        )
        for tier, settings in policy.tiers.items()
        if settings.reserve is not None
        for ns in reserve_namespaces(policy, tier)
    ]
    for ns, queue, want, team, tier, reaches in wanted_lqs:
        lq = lqs.get((ns, queue))
        if lq is None:
            message = f"LocalQueue {ns}/{queue} does not exist: jobs in {ns} cannot reach {reaches}"
            problems.append(Problem("no-queue", message, team=team, tier=tier))
        elif (lq.get("spec") or {}).get("clusterQueue") != want:
            other = (lq.get("spec") or {}).get("clusterQueue")
            message = f"LocalQueue {ns}/{queue} sends work to ClusterQueue {other}, not {want}"
            problems.append(Problem("no-queue", message, team=team, tier=tier))
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
