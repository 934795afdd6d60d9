"""The quota section's usage over the period: which team and tier each ClusterQueue belongs to,
the admissions of the Workloads as intervals, and the sweep that integrates, per cohort, flavor
and resource, what each queue used, borrowed and lent."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent import labels as lbl
from nodeagent_tiering.cluster.view import ClusterQueueInfo, WorkloadInfo
from nodeagent_tiering.quota.policy import QuotaPolicy, policy_queues, team_of_namespace


@dataclass
class Queue:
    """A ClusterQueue as the section counts it: whose, which tier, its cohort and quota."""

    name: str
    team: str
    tier: str
    cohort: str | None
    nominal: dict[tuple[str, str], float]  # (flavor, resource) -> nominalQuota
    lending: dict[tuple[str, str], float]  # lendingLimit where set


class Resolver:
    """Which team and tier a queue, a flavor, a namespace belong to."""

    def __init__(
        self,
        flavors: Iterable[Mapping[str, Any]],
        cluster_queues: Iterable[ClusterQueueInfo],
        local_queues: Iterable[Mapping[str, Any]],
        policy: QuotaPolicy | None,
    ) -> None:
        self.flavor_tier: dict[str, str] = {}
        for rf in flavors:
            meta = rf.get("metadata") or {}
            tier = (meta.get("labels") or {}).get(lbl.TIER) or (
                (rf.get("spec") or {}).get("nodeLabels") or {}
            ).get(lbl.TIER)
            self.flavor_tier[str(meta.get("name"))] = str(tier or f"flavor {meta.get('name')}")
        self.ns_team = team_of_namespace(policy) if policy is not None else {}
        by_policy = policy_queues(policy) if policy is not None else {}
        self.queues: dict[str, Queue] = {}
        for cq in cluster_queues:
            key = by_policy.get(cq.name)
            team = cq.labels.get(lbl.TEAM) or (key.team if key else cq.name)
            first = next(iter(cq.nominal), ("", ""))[0]
            tier = cq.labels.get(lbl.TIER) or (key.tier if key else self.tier(first))
            self.queues[cq.name] = Queue(
                cq.name, team, tier, cq.cohort, dict(cq.nominal), dict(cq.lending)
            )
        self.local: dict[tuple[str, str], str] = {
            (str(lq["metadata"].get("namespace")), str(lq["metadata"]["name"])): str(
                (lq.get("spec") or {}).get("clusterQueue")
            )
            for lq in local_queues
        }

    def tier(self, flavor: str) -> str:
        return self.flavor_tier.get(flavor, f"flavor {flavor}")

    def team(self, namespace: str) -> str:
        return self.ns_team.get(namespace, namespace)


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@dataclass
class Interval:
    start: float
    end: float
    queue: str
    flavor: str
    resource: str
    amount: float
    per_pod: float


class Pool:
    """One cohort's quota of one flavor and resource while the admissions come and go.

    The share of the pool's lendable idle quota that is lent, r(t), is integrated once
    (``acc_r``); a queue's lent integral is its lendable amount times the growth of that
    integral while the amount held, so each admission costs O(1), not O(queues).
    """

    def __init__(self, nominal: Mapping[str, float], limit: Mapping[str, float], t0: float) -> None:
        self.nominal = dict(nominal)
        self.limit = dict(limit)
        self.used = dict.fromkeys(nominal, 0.0)
        self.total_borrowed = 0.0
        self.total_lendable = sum(self.lendable(n) for n in nominal)
        self.acc_r = 0.0
        self.last_t = t0
        self.mark = dict.fromkeys(nominal, t0)
        self.mark_r = dict.fromkeys(nominal, 0.0)
        self.sums = {n: [0.0, 0.0, 0.0] for n in nominal}  # used, borrowed, lent integrals

    def lendable(self, n: str) -> float:
        return min(max(0.0, self.nominal[n] - self.used[n]), self.limit[n])

    def borrowed(self, n: str) -> float:
        return max(0.0, self.used[n] - self.nominal[n])

    def _advance(self, t: float) -> None:
        if self.total_lendable > 0:
            share = min(self.total_borrowed, self.total_lendable) / self.total_lendable
            self.acc_r += share * (t - self.last_t)
        self.last_t = t

    def _flush(self, n: str, t: float) -> None:
        s = self.sums[n]
        s[0] += self.used[n] * (t - self.mark[n])
        s[1] += self.borrowed(n) * (t - self.mark[n])
        s[2] += self.lendable(n) * (self.acc_r - self.mark_r[n])
        self.mark[n], self.mark_r[n] = t, self.acc_r

    def change(self, t: float, n: str, delta: float) -> None:
        """Queue ``n``'s usage changes by ``delta`` at ``t`` (times never go back)."""
        self._advance(t)
        self._flush(n, t)
        self.total_borrowed -= self.borrowed(n)
        self.total_lendable -= self.lendable(n)
        self.used[n] += delta
        self.total_borrowed += self.borrowed(n)
        self.total_lendable += self.lendable(n)

    def close(self, t1: float) -> dict[str, list[float]]:
        """The integrals up to ``t1``."""
        self._advance(t1)
        for n in self.sums:
            self._flush(n, t1)
        return self.sums


def sweep(
    intervals: list[Interval], queues: Mapping[str, Queue], t0: float, t1: float
) -> dict[tuple[str, str, str], tuple[float, float, float]]:
    """``(queue, flavor, resource) -> (used, borrowed, lent)`` integrals over [t0, t1], one
    :class:`Pool` per cohort, flavor and resource."""
    groups: dict[tuple[str, str, str], list[Interval]] = defaultdict(list)
    members: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for member in queues.values():
        for flavor, resource in member.nominal:
            members[(member.cohort or f"queue {member.name}", flavor, resource)].add(member.name)
    for iv in intervals:
        owner = queues.get(iv.queue)
        cohort = owner.cohort if owner is not None and owner.cohort else f"queue {iv.queue}"
        groups[(cohort, iv.flavor, iv.resource)].append(iv)
        members[(cohort, iv.flavor, iv.resource)].add(iv.queue)
    out: dict[tuple[str, str, str], tuple[float, float, float]] = {}
    for key, names in members.items():
        _, flavor, resource = key
        nominal = {
            n: queues[n].nominal.get((flavor, resource), 0.0) if n in queues else 0.0 for n in names
        }
        limit = {
            n: queues[n].lending.get((flavor, resource), math.inf) if n in queues else math.inf
            for n in names
        }
        points: list[tuple[float, int, str, float]] = []
        for iv in groups.get(key, []):
            start, end = max(iv.start, t0), min(iv.end, t1)
            if end > start:
                points.append((start, 1, iv.queue, iv.amount))
                points.append((end, 0, iv.queue, -iv.amount))  # ends sort before starts
        points.sort()
        pool = Pool(nominal, limit, t0)
        for t, _, name, delta in points:
            pool.change(t, name, delta)
        for name, (used, borrowed, lent) in pool.close(t1).items():
            prev = out.get((name, flavor, resource), (0.0, 0.0, 0.0))
            out[(name, flavor, resource)] = (prev[0] + used, prev[1] + borrowed, prev[2] + lent)
    return out


@dataclass
class Admissions:
    """What the Workloads say about the period, per ``(tier, team)`` where it is per team."""

    intervals: list[Interval] = field(default_factory=list)  # quota held, per pod set
    waits: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    pending: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    preemptions: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    oldest_s: float | None = None  # the oldest Workload the cluster still holds


def admissions(
    workloads: Iterable[WorkloadInfo], res: Resolver, t0: float, now: float
) -> Admissions:
    """The admissions as intervals of quota held (``QuotaReserved`` to ``Finished``, or now),
    the queue waits of those admitted in [t0, now], the pending ones and the preemptions."""
    out = Admissions()
    for wl in workloads:
        created = wl.created_s
        if created is not None and (out.oldest_s is None or created < out.oldest_s):
            out.oldest_s = created
        queue = res.queues.get(wl.cluster_queue)
        if queue is None:
            lq = res.local.get((wl.namespace, wl.queue))
            queue = res.queues.get(lq or "")
        team = queue.team if queue is not None else res.team(wl.namespace)
        tier = queue.tier if queue is not None else "(no queue)"
        queued = wl.queued_s
        if wl.preempted is not None:
            counts = out.preemptions.setdefault((tier, team), {})
            counts[wl.preempted] = counts.get(wl.preempted, 0) + 1
        if wl.quota_reserved == "True":
            start = wl.reserved_s
            if start is None:
                continue
            if queued is not None and t0 <= start <= now:
                out.waits[(tier, team)].append(max(0.0, start - queued))
            end = now
            if wl.finished == "True":
                end = wl.finished_s or now
            for ps in wl.pod_sets:
                for resource, flavor in ps.flavors:
                    amount = ps.usage[resource]
                    out.intervals.append(
                        Interval(
                            start,
                            end,
                            wl.cluster_queue,
                            flavor,
                            resource,
                            amount,
                            amount / ps.count,
                        )
                    )
        elif not wl.finished and queued is not None:
            out.pending[(tier, team)].append(now - queued)
    return out
