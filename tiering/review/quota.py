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

import html
import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from nodeagent import labels as lbl
from nodeagent_tiering.cluster import kueue, units
from nodeagent_tiering.cluster.nodes import NodeView
from nodeagent_tiering.cluster.view import GPU_RESOURCE as WHOLE_GPU
from nodeagent_tiering.cluster.view import request_amounts
from nodeagent_tiering.quota.backing import Backing, backing, capacity
from nodeagent_tiering.quota.flavors import Flavor, drift
from nodeagent_tiering.quota.policy import RESOURCE, QuotaPolicy, policy_queues, team_of_namespace
from nodeagent_tiering.review.inputs import ReviewInputs
from nodeagent_tiering.review.prometheus import PromUsage
from nodeagent_tiering.review.sections import SectionTable
from nodeagent_tiering.review.tiers import TIER_IN_MESSAGE, cause_key

# How long before a node's drain a pod's failure still counts as the GPU fault's (the health
# model turns a node unstable within seconds of a fatal XID; the drain then waits for the
# disruption budget and the cool-down, 10 minutes by default).
GPU_FAULT_WINDOW_S = 3600.0
# "What to change" thresholds.
UNUSED_SHARE = 0.10  # a guarantee used less than this on average is mostly idle
BORROW_SHARE = 0.5  # borrowing more than this share of the guarantee on average
LONG_WAIT_S = 3600.0  # p90 queue wait worth acting on
FAILURE_SHARE = 0.05  # share of pods ended by GPU faults or drains worth acting on
WHOLE_GPUS = re.compile(re.escape(WHOLE_GPU) + "$")
STRANDING_SHARE = 0.2  # share of a tier's GPU-hours in request sizes that strand GPUs

SOURCES = {
    "guaranteed": "ClusterQueue spec.resourceGroups[].flavors[].resources[].nominalQuota",
    "used_now": "ClusterQueue status.flavorsUsage[].resources[].total",
    "borrowed_now": "ClusterQueue status.flavorsUsage[].resources[].borrowed",
    "used_avg": "Workload status.admission resourceUsage, QuotaReserved to Finished (or now)",
    "borrowed_avg": "the same, above the ClusterQueue's nominalQuota",
    "lent_avg": "the cohort's borrowing, shared among queues with idle lendable quota",
    "gpu_hours": "Workload admissions: resourceUsage x time held",
    "waits": "Workload creationTimestamp (or Requeued) to QuotaReserved; "
    "pod creationTimestamp to status.startTime without Kueue",
    "utilisation": "Prometheus: nodeagent_gpu_utilization_ratio x nodeagent_device_plugin_pod_"
    "devices, time-weighted",
    "memory_used_bytes": "Prometheus: nodeagent_gpu_memory_used_bytes x nodeagent_device_"
    "plugin_pod_devices, time-weighted",
    "failures": "Pods (phase, DisruptionTarget, reason) and the tiering service's DrainStarted "
    "Events",
    "preemptions": "Workload Preempted condition",
    "backing": "Node status.allocatable and health (GPUHealthy, stability, drain record, "
    "cordon, Ready) against the ClusterQueues' nominalQuota",
}


# --- the section's data -----------------------------------------------------------------------


@dataclass
class ResourceUse:
    """One team's quota and use of one resource in one tier."""

    guaranteed: float = 0.0
    used_now: float | None = None
    borrowed_now: float | None = None
    used_avg: float | None = None
    borrowed_avg: float | None = None
    lent_avg: float | None = None
    gpu_hours: float | None = None


@dataclass
class Waits:
    """Queue waits of the workloads admitted in the period."""

    source: str  # "workloads" | "pods" | "none"
    admitted: int = 0
    median_s: float | None = None
    p90_s: float | None = None
    pending: int = 0
    longest_pending_s: float | None = None


@dataclass
class Failures:
    """How the team's GPU pods ended in the period."""

    ended: int = 0
    infra: int = 0  # on GPU faults and drains
    application: int = 0
    preempted: int = 0
    other: int = 0
    causes: dict[str, int] = field(default_factory=dict)  # infra causes

    @property
    def rate(self) -> float | None:
        """Share of ended pods that ended on GPU faults or drains."""
        return self.infra / self.ended if self.ended else None


@dataclass
class TeamTierReview:
    """One row: a team in a tier."""

    tier: str
    team: str
    queues: list[str] = field(default_factory=list)
    resources: dict[str, ResourceUse] = field(default_factory=dict)
    waits: Waits = field(default_factory=lambda: Waits("none"))
    utilisation: float | None = None
    memory_used_bytes: float | None = None
    observed_gpu_hours: float | None = None
    failures: Failures = field(default_factory=Failures)
    preemptions: dict[str, int] = field(default_factory=dict)


@dataclass
class TierBacking:
    """A tier's capacity behind the guarantees on one flavor and resource."""

    row: Backing
    lost: list[str]


@dataclass
class QuotaSection:
    """The section (a :class:`~.report.ReviewSection`)."""

    now_s: float
    period_s: float
    kueue_version: str | None
    rows: list[TeamTierReview]
    backing: list[TierBacking]
    drifted_flavors: dict[str, str]
    findings: list[str]
    oldest_workload_s: float | None
    utilisation_source: str
    drains: dict[str, int]  # per tier: pods the service's drains evicted (DrainSucceeded)
    key: str = "quota"

    def to_json(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "period_seconds": self.period_s,
            "kueue_version": self.kueue_version,
            "workloads_since": self.oldest_workload_s,
            "utilisation_source": self.utilisation_source,
            "sources": SOURCES,
            "teams": [
                {
                    **{k: v for k, v in asdict(r).items() if k not in ("failures", "waits")},
                    "waits": asdict(r.waits),
                    "failures": {**asdict(r.failures), "rate": r.failures.rate},
                }
                for r in self.rows
            ],
            "backing": [
                {**asdict(b.row), "backed": b.row.backed, "lost": b.lost} for b in self.backing
            ],
            "drifted_flavors": self.drifted_flavors,
            "drain_evictions": self.drains,
            "what_to_change": self.findings,
        }

    def tables(self) -> list[SectionTable]:
        """The quota table, the capacity table, the list, and the sources."""
        sources = [f"{k}: {v}" for k, v in SOURCES.items()]
        sources.append(f"utilisation: {self.utilisation_source}")
        since = (
            f"workloads since {_date(self.oldest_workload_s)}"
            if self.oldest_workload_s is not None
            else "no workloads"
        )
        drifted = [f"flavor {k}: {v}" for k, v in sorted(self.drifted_flavors.items())]
        drains = [f"tier {t}: {n} pods evicted by drains" for t, n in sorted(self.drains.items())]
        return [
            SectionTable(
                f"QUOTA AND QUEUES (last {duration_text(self.period_s)}; {since})",
                QUOTA_HEADERS,
                quota_rows(self),
            ),
            SectionTable(
                "CAPACITY BEHIND THE GUARANTEES",
                BACKING_HEADERS,
                backing_rows(self),
                notes=drifted + drains,
            ),
            SectionTable(
                "WHAT TO CHANGE",
                ["FINDING"],
                [[f] for f in self.findings] or [["nothing stands out"]],
                notes=["Sources:", *(f"  {line}" for line in sources)],
            ),
        ]

    def html(self) -> str:
        """Tables with inline bars (CSS, no scripts), the list and the sources."""
        head = "".join(f"<th>{html.escape(h)}</th>" for h in QUOTA_HEADERS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in quota_rows(self)
        )
        bars = []
        for b in self.backing:
            top = max(b.row.promised, b.row.installed) or 1.0
            label = f"{b.row.tier} / {b.row.flavor} / {b.row.resource}"
            bars.append(
                f"<div class=qrow><span class=qlabel>{html.escape(label)}</span>"
                f'<span class=qbar style="width:{300 * b.row.healthy / top:.0f}px;'
                f'background:#2e7d32" title="healthy {_n(b.row.healthy)}"></span>'
                f'<span class=qbar style="width:{300 * (b.row.installed - b.row.healthy) / top:.0f}'
                f'px;background:#c62828" title="lost {_n(b.row.installed - b.row.healthy)}"></span>'
                f" guaranteed {_n(b.row.promised)}, backed {_n(b.row.backed)}</div>"
            )
        findings = "".join(f"<li>{html.escape(f)}</li>" for f in self.findings)
        sources = "".join(
            f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in SOURCES.items()
        )
        return (
            "<style>.qrow{font-size:13px;margin:2px 0}.qlabel{display:inline-block;width:320px}"
            ".qbar{display:inline-block;height:12px}</style>"
            f"<h2>Quota and queues</h2><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>"
            "<h2>Capacity behind the guarantees (green: healthy, red: drained or unstable)</h2>"
            + "".join(bars)
            + f"<h2>What to change</h2><ul>{findings or '<li>nothing stands out</li>'}</ul>"
            f"<h3>Sources</h3><ul>{sources}<li><b>utilisation</b>: "
            f"{html.escape(self.utilisation_source)}</li></ul>"
        )


QUOTA_HEADERS = [
    "TIER", "TEAM", "RESOURCE", "GUARANTEED", "USED NOW", "BORROWED NOW", "USED AVG",
    "BORROWED AVG", "LENT AVG", "GPU-H", "WAIT P50", "WAIT P90", "PENDING", "UTIL", "MEM",
    "FAILED", "CAUSES", "PREEMPTED",
]  # fmt: skip
BACKING_HEADERS = [
    "TIER",
    "FLAVOR",
    "RESOURCE",
    "GUARANTEED",
    "BACKED",
    "HEALTHY",
    "INSTALLED",
    "LOST",
]


def _n(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if value == int(value):
        return str(int(value))
    return f"{value:.{digits}f}"


def _date(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M UTC")


def duration_text(seconds: float | None) -> str:
    """``45s``, ``12m``, ``3.5h``, ``2.1d``."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def quota_rows(section: QuotaSection) -> list[list[str]]:
    """One line per tier, team and resource (a team with no quota resource gets one line)."""
    out = []
    for r in section.rows:
        shared = [
            duration_text(r.waits.median_s),
            duration_text(r.waits.p90_s),
            str(r.waits.pending),
            f"{r.utilisation:.0%}" if r.utilisation is not None else "-",
            f"{r.memory_used_bytes / 2**30:.1f}GiB" if r.memory_used_bytes is not None else "-",
            (
                f"{r.failures.infra}/{r.failures.ended} ({r.failures.rate:.0%})"
                if r.failures.rate is not None
                else "-"
            ),
            ", ".join(f"{k} x{v}" for k, v in sorted(r.failures.causes.items())) or "-",
            str(sum(r.preemptions.values())),
        ]
        resources = r.resources or {"-": ResourceUse()}
        for name, u in sorted(resources.items()):
            out.append(
                [
                    r.tier,
                    r.team,
                    name,
                    _n(u.guaranteed),
                    _n(u.used_now),
                    _n(u.borrowed_now),
                    _n(u.used_avg),
                    _n(u.borrowed_avg),
                    _n(u.lent_avg),
                    _n(u.gpu_hours, 0),
                    *shared,
                ]
            )
    return out


def backing_rows(section: QuotaSection) -> list[list[str]]:
    """One line per flavor and resource."""
    return [
        [
            b.row.tier,
            b.row.flavor,
            b.row.resource,
            _n(b.row.promised),
            _n(b.row.backed),
            _n(b.row.healthy),
            _n(b.row.installed),
            "; ".join(b.lost) or "-",
        ]
        for b in section.backing
    ]


# --- building ---------------------------------------------------------------------------------


@dataclass
class _Queue:
    name: str
    team: str
    tier: str
    cohort: str | None
    nominal: dict[tuple[str, str], float]  # (flavor, resource) -> nominalQuota
    lending: dict[tuple[str, str], float]  # lendingLimit where set


class _Resolver:
    """Which team and tier a queue, a flavor, a namespace belong to."""

    def __init__(self, inputs: ReviewInputs, policy: QuotaPolicy | None) -> None:
        self.flavor_tier: dict[str, str] = {}
        for rf in inputs.flavors:
            meta = rf.get("metadata") or {}
            tier = (meta.get("labels") or {}).get(lbl.TIER) or (
                (rf.get("spec") or {}).get("nodeLabels") or {}
            ).get(lbl.TIER)
            self.flavor_tier[str(meta.get("name"))] = str(tier or f"flavor {meta.get('name')}")
        self.ns_team = team_of_namespace(policy) if policy is not None else {}
        by_policy = policy_queues(policy) if policy is not None else {}
        self.queues: dict[str, _Queue] = {}
        for cq in inputs.cluster_queues:
            meta = cq.get("metadata") or {}
            name = str(meta.get("name"))
            labels = meta.get("labels") or {}
            nominal: dict[tuple[str, str], float] = {}
            lending: dict[tuple[str, str], float] = {}
            for flavor, resource, entry in kueue.flavor_quotas(cq):
                nominal[(flavor, resource)] = units.amount_or_zero(entry.get("nominalQuota"))
                if entry.get("lendingLimit") is not None:
                    lending[(flavor, resource)] = units.amount_or_zero(entry.get("lendingLimit"))
            key = by_policy.get(name)
            team = labels.get(lbl.TEAM) or (key.team if key else name)
            first = next(iter(nominal), ("", ""))[0]
            tier = labels.get(lbl.TIER) or (key.tier if key else self.tier(first))
            self.queues[name] = _Queue(name, team, tier, kueue.cohort_of(cq), nominal, lending)
        self.local: dict[tuple[str, str], str] = {
            (str(lq["metadata"].get("namespace")), str(lq["metadata"]["name"])): str(
                (lq.get("spec") or {}).get("clusterQueue")
            )
            for lq in inputs.local_queues
        }

    def tier(self, flavor: str) -> str:
        return self.flavor_tier.get(flavor, f"flavor {flavor}")

    def team(self, namespace: str) -> str:
        return self.ns_team.get(namespace, namespace)


def _percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@dataclass
class _Interval:
    start: float
    end: float
    queue: str
    flavor: str
    resource: str
    amount: float
    per_pod: float


class _Pool:
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


def _sweep(
    intervals: list[_Interval], queues: Mapping[str, _Queue], t0: float, t1: float
) -> dict[tuple[str, str, str], tuple[float, float, float]]:
    """``(queue, flavor, resource) -> (used, borrowed, lent)`` integrals over [t0, t1], one
    :class:`_Pool` per cohort, flavor and resource."""
    groups: dict[tuple[str, str, str], list[_Interval]] = defaultdict(list)
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
        pool = _Pool(nominal, limit, t0)
        for t, _, name, delta in points:
            pool.change(t, name, delta)
        for name, (used, borrowed, lent) in pool.close(t1).items():
            prev = out.get((name, flavor, resource), (0.0, 0.0, 0.0))
            out[(name, flavor, resource)] = (prev[0] + used, prev[1] + borrowed, prev[2] + lent)
    return out


def _end_time(pod: Mapping[str, Any]) -> float | None:
    status = pod.get("status") or {}
    ends = [
        units.parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for cs in status.get("containerStatuses") or ()
    ]
    found = [e for e in ends if e is not None]
    if found:
        return max(found)
    for cond in status.get("conditions") or ():
        if cond.get("type") in ("DisruptionTarget", "Ready"):
            when = units.parse_time(cond.get("lastTransitionTime"))
            if when is not None:
                return when
    return None


def _drains(
    events: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, list[tuple[float, str]]], dict[str, int]]:
    """Per node, the service's drain starts ``(time, cause)``; per tier (the one the node
    left, from the drain's start), pods the drains evicted (from ``DrainSucceeded``)."""
    starts: dict[str, list[tuple[float, str, str]]] = defaultdict(list)
    done: list[tuple[str, float, int]] = []
    for ev in events:
        reason = ev.get("reason")
        obj = ev.get("involvedObject") or {}
        if obj.get("kind") != "Node" or reason not in ("DrainStarted", "DrainSucceeded"):
            continue
        node = str(obj.get("name"))
        when = units.parse_time(
            ev.get("lastTimestamp") or ev.get("firstTimestamp") or ev.get("eventTime")
        )
        if when is None:
            continue
        message = str(ev.get("message") or "")
        if reason == "DrainStarted":
            match = TIER_IN_MESSAGE.search(message)
            starts[node].append((when, cause_key(message), match.group(1) if match else "(none)"))
        else:
            evictions = message.split("drained: ", 1)[-1].split(" ", 1)[0]
            if evictions.isdigit():
                done.append((node, when, int(evictions)))
    for items in starts.values():
        items.sort()
    evicted: dict[str, int] = defaultdict(int)
    for node, when, count in done:
        before = [tier for t, _, tier in starts.get(node, []) if t <= when]
        evicted[before[-1] if before else "(none)"] += count
    return {n: [(t, c) for t, c, _ in items] for n, items in starts.items()}, dict(evicted)


def _classify(
    pod: Mapping[str, Any], end: float, drains: Mapping[str, list[tuple[float, str]]]
) -> tuple[str, str]:
    """``(category, cause)`` of a Failed pod: infra | preempted | application | other."""
    status = pod.get("status") or {}
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    disruption = next(
        (
            c
            for c in status.get("conditions") or ()
            if c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        ),
        None,
    )
    node_drains = drains.get(node, [])
    if disruption is not None:
        reason = str(disruption.get("reason") or "")
        if reason == "EvictionByEvictionAPI":
            started = [cause for t, cause in node_drains if t <= end]
            if started:
                return "infra", f"{started[-1]} (drain)"
            return "other", "evicted"
        if reason == "DeletionByTaintManager":
            return "infra", "NoExecute taint"
        if reason in ("PreemptionByScheduler", "PreemptionByKubeScheduler"):
            return "preempted", "scheduler"
        return "other", reason or "disrupted"
    if status.get("reason") == "Evicted":
        return "other", "node pressure"
    after = [cause for t, cause in node_drains if end <= t <= end + GPU_FAULT_WINDOW_S]
    if after:
        return "infra", f"{after[0]} (GPU fault)"
    return "application", "exit"


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
    res = _Resolver(inputs, policy)
    rows: dict[tuple[str, str], TeamTierReview] = {}

    def row(tier: str, team: str) -> TeamTierReview:
        found = rows.get((tier, team))
        if found is None:
            found = rows[(tier, team)] = TeamTierReview(tier, team)
        return found

    # Quota as the ClusterQueues say, now.
    for cq in inputs.cluster_queues:
        q = res.queues[str(cq["metadata"]["name"])]
        r = row(q.tier, q.team)
        r.queues.append(q.name)
        for (_flavor, resource), amount in q.nominal.items():
            if RESOURCE.match(resource):  # the review is about GPUs; CPU quota is not
                u = r.resources.setdefault(resource, ResourceUse())
                u.guaranteed += amount
        for fu in (cq.get("status") or {}).get("flavorsUsage") or ():
            for rr in fu.get("resources") or ():
                if not RESOURCE.match(str(rr.get("name"))):
                    continue
                u = r.resources.setdefault(str(rr.get("name")), ResourceUse())
                u.used_now = (u.used_now or 0.0) + units.amount_or_zero(rr.get("total"))
                u.borrowed_now = (u.borrowed_now or 0.0) + units.amount_or_zero(rr.get("borrowed"))
    # Admissions, waits and preemptions from the Workloads.
    intervals: list[_Interval] = []
    waits: dict[tuple[str, str], list[float]] = defaultdict(list)
    pending: dict[tuple[str, str], list[float]] = defaultdict(list)
    oldest: float | None = None
    for wl in inputs.workloads:
        meta = wl.get("metadata") or {}
        ns = str(meta.get("namespace"))
        created = units.parse_time(meta.get("creationTimestamp"))
        if created is not None and (oldest is None or created < oldest):
            oldest = created
        conds = {c.get("type"): c for c in (wl.get("status") or {}).get("conditions") or ()}
        admission = (wl.get("status") or {}).get("admission") or {}
        queue = res.queues.get(str(admission.get("clusterQueue") or ""))
        if queue is None:
            lq = res.local.get((ns, str((wl.get("spec") or {}).get("queueName") or "")))
            queue = res.queues.get(lq or "")
        team = queue.team if queue is not None else res.team(ns)
        tier = queue.tier if queue is not None else "(no queue)"
        requeued = conds.get("Requeued")
        queued = units.parse_time(requeued.get("lastTransitionTime")) if requeued else created
        reserved = conds.get("QuotaReserved")
        finished = conds.get("Finished")
        preempted = conds.get("Preempted")
        if preempted is not None and preempted.get("status") == "True":
            reason = str(preempted.get("reason") or "Preempted")
            counts = row(tier, team).preemptions
            counts[reason] = counts.get(reason, 0) + 1
        if reserved is not None and reserved.get("status") == "True":
            start = units.parse_time(reserved.get("lastTransitionTime"))
            if start is None:
                continue
            if queued is not None and t0 <= start <= now:
                waits[(tier, team)].append(max(0.0, start - queued))
            end = now
            if finished is not None and finished.get("status") == "True":
                end = units.parse_time(finished.get("lastTransitionTime")) or now
            for ps in admission.get("podSetAssignments") or ():
                count = max(1, int(ps.get("count") or 1))
                for resource, flavor in (ps.get("flavors") or {}).items():
                    if not RESOURCE.match(resource):
                        continue
                    amount = units.amount_or_zero((ps.get("resourceUsage") or {}).get(resource))
                    intervals.append(
                        _Interval(
                            start,
                            end,
                            str(admission.get("clusterQueue")),
                            str(flavor),
                            resource,
                            amount,
                            amount / count,
                        )
                    )
        elif finished is None and queued is not None:
            pending[(tier, team)].append(now - queued)
    sums = _sweep(intervals, res.queues, t0, now)
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
    views = [NodeView.from_object(dict(n)) for n in inputs.nodes]
    node_tier = {v.name: v.labels.get(lbl.TIER, "(none)") for v in views}
    gpu_pods = [(p, request_amounts(p, RESOURCE)) for p in inputs.pods]
    gpu_pods = [(p, req) for p, req in gpu_pods if req]
    if inputs.kueue is None:
        for pod, _req in gpu_pods:
            meta = pod.get("metadata") or {}
            created = units.parse_time(meta.get("creationTimestamp"))
            started = units.parse_time((pod.get("status") or {}).get("startTime"))
            key = (
                node_tier.get(str((pod.get("spec") or {}).get("nodeName") or ""), "(none)"),
                res.team(str(meta.get("namespace"))),
            )
            if created is None:
                continue
            if started is not None and t0 <= started <= now:
                waits[key].append(max(0.0, started - created))
            elif started is None and (pod.get("status") or {}).get("phase") == "Pending":
                pending[key].append(now - created)
    source = "workloads" if inputs.kueue is not None else "pods"
    for key in set(waits) | set(pending):
        r = row(*key)
        values = waits.get(key, [])
        r.waits = Waits(
            source,
            admitted=len(values),
            median_s=statistics.median(values) if values else None,
            p90_s=_percentile(values, 0.9) if values else None,
            pending=len(pending.get(key, [])),
            longest_pending_s=max(pending[key]) if pending.get(key) else None,
        )
    # Failures from the pods and the drain Events.
    drains, drain_evictions = _drains(inputs.events)
    for pod, _req in gpu_pods:
        status = pod.get("status") or {}
        phase = status.get("phase")
        if phase not in ("Succeeded", "Failed"):
            continue
        ended_at = _end_time(pod)
        if ended_at is None or not t0 <= ended_at <= now:
            continue
        meta = pod.get("metadata") or {}
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        queue_label = (meta.get("labels") or {}).get(lbl.KUEUE_QUEUE_NAME)
        ns = str(meta.get("namespace"))
        via = res.queues.get(res.local.get((ns, str(queue_label)), "")) if queue_label else None
        tier = node_tier.get(node, "(none)") if via is None else via.tier
        f = row(tier, via.team if via is not None else res.team(ns)).failures
        f.ended += 1
        if phase == "Succeeded":
            continue
        category, cause = _classify(pod, ended_at, drains)
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
        oldest_workload_s=oldest,
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


def findings(
    section: QuotaSection,
    intervals: Sequence[_Interval],
    res: _Resolver,
    nodes: Sequence[NodeView],
) -> list[str]:
    """The short "what to change" list (thresholds at the top of this module)."""
    out: list[str] = []
    for b in section.backing:
        promise = (
            f"tier {b.row.tier}: {_n(b.row.promised)} {b.row.resource} guaranteed on {b.row.flavor}"
        )
        if b.row.promised > b.row.installed:
            out.append(
                f"{promise}, more than the {_n(b.row.installed)} its nodes have: add nodes or "
                "lower the guarantees"
            )
        elif b.row.promised > b.row.healthy:
            lost = f" ({'; '.join(b.lost[:3])})" if b.lost else ""
            out.append(
                f"{promise}, the healthy nodes hold {_n(b.row.healthy)} of "
                f"{_n(b.row.installed)}{lost}: return or replace the nodes, or lower the "
                "guarantees"
            )
    for r in section.rows:
        for name, u in sorted(r.resources.items()):
            if (
                u.guaranteed >= 1
                and u.used_avg is not None
                and u.used_avg < UNUSED_SHARE * u.guaranteed
            ):
                out.append(
                    f"team {r.team}, tier {r.tier}: uses {_n(u.used_avg)} of {_n(u.guaranteed)} "
                    f"guaranteed {name} on average ({u.used_avg / u.guaranteed:.0%}): lower the "
                    "guarantee, or make it soft so others can borrow it"
                )
            if (
                u.borrowed_avg is not None
                and u.borrowed_avg >= 1
                and (u.borrowed_avg > BORROW_SHARE * u.guaranteed)
            ):
                out.append(
                    f"team {r.team}, tier {r.tier}: borrows {_n(u.borrowed_avg)} {name} on "
                    f"average on top of {_n(u.guaranteed)} guaranteed: raise the guarantee, or "
                    "expect its work to be preempted when the owners reclaim"
                )
        if r.waits.p90_s is not None and r.waits.p90_s > LONG_WAIT_S:
            out.append(
                f"team {r.team}, tier {r.tier}: p90 queue wait {duration_text(r.waits.p90_s)} "
                f"({r.waits.admitted} admitted, {r.waits.pending} pending): raise its guarantee "
                "or borrow limit, or move work to a tier with idle quota"
            )
    per_tier: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    causes: dict[str, Counter[str]] = defaultdict(Counter)
    for r in section.rows:
        per_tier[r.tier][0] += r.failures.infra
        per_tier[r.tier][1] += r.failures.ended
        causes[r.tier].update(r.failures.causes)
    for tier, (infra, ended) in sorted(per_tier.items()):
        if ended and infra / ended > FAILURE_SHARE:
            top = ", ".join(f"{k} x{v}" for k, v in causes[tier].most_common(3))
            out.append(
                f"tier {tier}: {infra} of {ended} GPU pods ({infra / ended:.0%}) ended on GPU "
                f"faults or drains ({top}): look at the nodes behind the causes, and have jobs "
                "checkpoint"
            )
    t0 = section.now_s - section.period_s
    out.extend(_stranding(intervals, res, nodes, t0, section.now_s))
    return out


def _stranding(
    intervals: Sequence[_Interval],
    res: _Resolver,
    nodes: Sequence[NodeView],
    t0: float,
    t1: float,
) -> list[str]:
    """Request sizes that leave GPUs idle on every node they fill (3 GPUs per pod on 8-GPU
    nodes: two fit, two GPUs stay stranded)."""
    node_size: dict[str, Counter[int]] = defaultdict(Counter)
    for n in nodes:
        tier = n.labels.get(lbl.TIER)
        gpus = n.amounts(WHOLE_GPUS).get(WHOLE_GPU, 0.0)
        if tier and gpus >= 1:
            node_size[str(tier)][int(gpus)] += 1
    held: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for iv in intervals:
        if iv.resource != "nvidia.com/gpu" or iv.per_pod < 1:
            continue
        span = min(iv.end, t1) - max(iv.start, t0)
        if span > 0:
            held[res.tier(iv.flavor)][int(iv.per_pod)] += iv.amount * span
    out = []
    for tier, by_size in sorted(held.items()):
        total = sum(by_size.values())
        sizes = node_size.get(tier)
        if not total or not sizes:
            continue
        node = sizes.most_common(1)[0][0]
        for size, gpu_s in sorted(by_size.items()):
            stranded = node % size if size < node else 0
            share = gpu_s / total
            if stranded and share >= STRANDING_SHARE:
                fits = node // size
                ok = ", ".join(str(d) for d in range(1, node + 1) if node % d == 0)
                out.append(
                    f"tier {tier}: {share:.0%} of admitted GPU time is {size}-GPU pods on "
                    f"{node}-GPU nodes: {fits} fit per node and {stranded} GPUs stay stranded; "
                    f"ask for {ok} GPUs per pod"
                )
    return out
