"""The pool review's quota and queue section: per tier and team, over the period.

Every number names its source (``sources`` in ``--json``, a footnote in the table and the
page):

- **guaranteed**: ``nominalQuota`` of the team's ClusterQueues on the tier's flavors;
- **used / borrowed now**: ClusterQueue ``status.flavorsUsage`` (what Kueue counts now);
- **used / borrowed / lent on average** over the period, and GPU-hours: from the Workloads'
  admissions -- each holds ``status.admission.podSetAssignments[].resourceUsage`` on a flavor
  from its ``QuotaReserved`` transition until its ``Finished`` one (or now). *Borrowed* is
  usage above the queue's ``nominalQuota``; what the borrowers of a cohort use beyond their
  own quota is *lent* by the queues with idle lendable quota, shared among them in proportion
  to how much each could lend at that moment (Kueue pools a cohort's idle quota and does not
  say whose it took). Kueue keeps a Workload only as long as its Job or pod exists, so this
  covers what the cluster still holds: the section says how far back its oldest one goes;
- **queue waits** (median, p90): from ``metadata.creationTimestamp`` -- or the ``Requeued``
  condition's time when the workload was requeued, as Kueue itself measures -- to the
  ``QuotaReserved`` transition (the same as ``Admitted`` without admission checks); where the
  cluster serves no Kueue, from a GPU pod's creation to its ``status.startTime``;
- **GPU utilisation and memory** (with ``--prometheus``): the agents'
  ``nodeagent_gpu_utilization_ratio`` and ``nodeagent_gpu_memory_used_bytes`` joined on the GPU
  (``uuid`` and the node's target label) with ``nodeagent_device_plugin_pod_devices``, which
  says which namespace's pod holds it, averaged over the period weighted by time held; a node
  counts in the tier it is in now (MIG devices have no utilisation metric of their own);
- **failures**: GPU pods that ended in the period, as the API server still holds them
  (``phase``, the ``DisruptionTarget`` condition, ``reason``), matched with the service's
  ``DrainStarted`` Events on their node: a pod evicted while its node drained failed on the
  drain; a pod that failed shortly before its node was drained failed on the GPU fault that
  made the node unstable; the rest failed on their own (application) or were preempted;
- **preemptions**: Workloads whose ``Preempted`` condition is true, by reason (reclaim within
  the cohort, priority, ...).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nodeagent import labels as lbl
from nodeagent_tiering.cluster import kueue
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.cluster.view import (
    cluster_queue_from_object,
    pod_from_object,
    workload_from_object,
)
from nodeagent_tiering.quota.backing import backing, capacity
from nodeagent_tiering.quota.flavors import Flavor, drift
from nodeagent_tiering.quota.policy import RESOURCE, QuotaPolicy
from nodeagent_tiering.review.inputs import ReviewInputs
from nodeagent_tiering.review.prometheus import PromUsage
from nodeagent_tiering.review.quota_failures import classify, drain_starts
from nodeagent_tiering.review.quota_findings import findings
from nodeagent_tiering.review.quota_section import (
    QuotaSection,
    ResourceUse,
    TeamTierReview,
    TierBacking,
    Waits,
)
from nodeagent_tiering.review.quota_usage import Resolver, admissions, percentile, sweep


def build_section(
    inputs: ReviewInputs,
    *,
    policy: QuotaPolicy | None = None,
    flavors: Sequence[Flavor] = (),
    prometheus: PromUsage | None = None,
    prometheus_source: str = "not queried (no --prometheus)",
) -> QuotaSection:
    """The section from what :func:`read_inputs` read (see the module doc).

    ``flavors``: the desired flavors (tier and quota policies), for drift and the capacity
    table; without them the capacity table uses nodeagent's flavors as the cluster has them.
    """
    now, t0 = inputs.now_s, inputs.now_s - inputs.period_s
    queues = [cluster_queue_from_object(o) for o in inputs.cluster_queues]
    res = Resolver(inputs.flavors, queues, inputs.local_queues, policy)
    rows: dict[tuple[str, str], TeamTierReview] = {}

    def row(tier: str, team: str) -> TeamTierReview:
        found = rows.get((tier, team))
        if found is None:
            found = rows[(tier, team)] = TeamTierReview(tier, team)
        return found

    # Quota as the ClusterQueues say, now.
    for cq in queues:
        q = res.queues[cq.name]
        r = row(q.tier, q.team)
        r.queues.append(q.name)
        for (_flavor, resource), amount in q.nominal.items():
            if RESOURCE.match(resource):  # the review is about GPUs; CPU quota is not
                u = r.resources.setdefault(resource, ResourceUse())
                u.guaranteed += amount
        for _flavor, resource, total, borrowed in cq.usage:
            if not RESOURCE.match(resource):
                continue
            u = r.resources.setdefault(resource, ResourceUse())
            u.used_now = (u.used_now or 0.0) + total
            u.borrowed_now = (u.borrowed_now or 0.0) + borrowed
    # Admissions, waits and preemptions from the Workloads.
    held = admissions((workload_from_object(w) for w in inputs.workloads), res, t0, now)
    intervals, waits, pending = held.intervals, held.waits, held.pending
    for key, counts in held.preemptions.items():
        row(*key).preemptions.update(counts)
    sums = sweep(intervals, res.queues, t0, now)
    for (queue_name, flavor, resource), (used, borrowed, lent) in sums.items():
        owner = res.queues.get(queue_name)
        tier = owner.tier if owner is not None else res.tier(flavor)
        team = owner.team if owner is not None else queue_name
        u = row(tier, team).resources.setdefault(resource, ResourceUse())
        u.used_avg = (u.used_avg or 0.0) + used / inputs.period_s
        u.borrowed_avg = (u.borrowed_avg or 0.0) + borrowed / inputs.period_s
        u.lent_avg = (u.lent_avg or 0.0) + lent / inputs.period_s
        u.gpu_hours = (u.gpu_hours or 0.0) + used / 3600
    # Waits without Kueue: pods, creation to start.
    views = [Node.from_object(dict(n)) for n in inputs.nodes]
    node_tier = {v.name: v.labels.get(lbl.TIER, "(none)") for v in views}
    gpu_pods = [p for p in (pod_from_object(o) for o in inputs.pods) if p.quota_requests]
    if inputs.kueue is None:
        for pod in gpu_pods:
            key = (node_tier.get(pod.node_name or "", "(none)"), res.team(pod.namespace))
            if pod.created_s is None:
                continue
            if pod.started_s is not None and t0 <= pod.started_s <= now:
                waits[key].append(max(0.0, pod.started_s - pod.created_s))
            elif pod.started_s is None and pod.phase == "Pending":
                pending[key].append(now - pod.created_s)
    source = "workloads" if inputs.kueue is not None else "pods"
    for key in set(waits) | set(pending):
        r = row(*key)
        values = waits.get(key, [])
        r.waits = Waits(
            source,
            admitted=len(values),
            median_s=statistics.median(values) if values else None,
            p90_s=percentile(values, 0.9) if values else None,
            pending=len(pending.get(key, [])),
            longest_pending_s=max(pending[key]) if pending.get(key) else None,
        )
    # Failures from the pods and the drain Events.
    drains, drain_evictions = drain_starts(inputs.events)
    for pod in gpu_pods:
        if pod.phase not in ("Succeeded", "Failed"):
            continue
        ended_at = pod.ended_s
        if ended_at is None or not t0 <= ended_at <= now:
            continue
        queue_label = pod.labels.get(lbl.KUEUE_QUEUE_NAME)
        ns = pod.namespace
        via = res.queues.get(res.local.get((ns, str(queue_label)), "")) if queue_label else None
        tier = node_tier.get(pod.node_name or "", "(none)") if via is None else via.tier
        f = row(tier, via.team if via is not None else res.team(ns)).failures
        f.ended += 1
        if pod.phase == "Succeeded":
            continue
        category, cause = classify(pod, ended_at, drains)
        if category == "infra":
            f.infra += 1
            f.causes[cause] = f.causes.get(cause, 0) + 1
        elif category == "application":
            f.application += 1
        elif category == "preempted":
            f.preempted += 1
        else:
            f.other += 1
    # Utilisation from Prometheus.
    if prometheus is not None:
        acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for (node, ns), samples in prometheus.samples.items():
            a = acc[(node_tier.get(node, "(none)"), res.team(ns))]
            a[0] += samples
            a[1] += prometheus.utilisation.get((node, ns), 0.0)
            a[2] += prometheus.memory.get((node, ns), 0.0)
        for key, (samples, util, mem) in acc.items():
            if samples:
                r = row(*key)
                r.utilisation = util / samples
                r.memory_used_bytes = mem / samples
                r.observed_gpu_hours = samples * prometheus.step_s / 3600
    # Capacity behind the guarantees.
    desired = list(flavors) or _cluster_flavors(inputs.flavors)
    caps = capacity(inputs.nodes, desired)
    tiers_backing = []
    for b in backing(inputs.nodes, inputs.cluster_queues, desired):
        cap = caps.get((b.flavor, b.resource))
        lost = [f"{node} {why}" for node, why, _ in cap.lost] if cap is not None else []
        tiers_backing.append(TierBacking(b, lost))
    drifted = drift(flavors, inputs.flavors) if flavors else {}
    ordered = sorted(rows.values(), key=lambda r: (r.tier, r.team))
    section = QuotaSection(
        now_s=now,
        period_s=inputs.period_s,
        kueue_version=inputs.kueue.version if inputs.kueue else None,
        rows=ordered,
        backing=tiers_backing,
        drifted_flavors=drifted,
        findings=[],
        oldest_workload_s=held.oldest_s,
        utilisation_source=prometheus_source,
        drains=drain_evictions,
    )
    section.findings = findings(section, intervals, res, views)
    return section


def _cluster_flavors(objects: Iterable[Mapping[str, Any]]) -> list[Flavor]:
    """nodeagent's flavors as the cluster holds them (when no policy says what they should be)."""
    out = []
    for obj in objects:
        if not kueue.managed(obj):
            continue
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        tier = labels.get(lbl.TIER)
        if tier:
            out.append(Flavor(str(meta["name"]), str(tier), labels.get(lbl.GPU_PRODUCT_FLAVOR)))
    return out
