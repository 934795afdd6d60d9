"""The pool review's account of the capacity reserved for large jobs (quota policy ``reserve``).

Per tier with a reserve, over the period, from Kueue's Workloads (the quota is Kueue's; see
:mod:`nodeagent_tiering.quota.reserve`):

- reserved GPU-hours: the reserve's quota (``nodes`` x ``gpus``) over the period, or since its
  ClusterQueue was made when that is later;
- used by large jobs: quota held by Workloads of ``<tier>-reserved``;
- lent: quota of the reserved flavor held by the other teams' Workloads (borrowed while idle);
- idle: the rest;
- the large jobs' wait from queueing to quota, median and p99: what reclaiming took, the
  preemption of the borrowers included;
- the large jobs still waiting now, how long, and Kueue's own message (why).

Lent counts what borrowers hold now or held until they finished: Kueue clears the admission of
a Workload it preempts, and deletes a plain pod's with the pod, so quota a borrower held until
it was reclaimed leaves no record to count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nodeagent_tiering.cluster.units import parse_time
from nodeagent_tiering.cluster.view import (
    WorkloadInfo,
    local_queue_from_object,
    workload_from_object,
)
from nodeagent_tiering.quota.flavors import Flavor
from nodeagent_tiering.quota.policy import QuotaPolicy, reserved_queue_name
from nodeagent_tiering.review.inputs import ReviewInputs
from nodeagent_tiering.review.quota_usage import percentile
from nodeagent_tiering.review.sections import SectionTable, TableSection

GPU = "nvidia.com/gpu"
HOUR = 3600.0
WAITING_SHOWN = 10


def _held_gpu_s(w: WorkloadInfo, flavor: str, t0: float, now: float) -> float:
    """GPU-seconds of ``flavor`` the Workload held within [t0, now]."""
    if w.quota_reserved != "True" or w.reserved_s is None:
        return 0.0
    end = (w.finished_s or now) if w.finished == "True" else now
    span = max(0.0, min(end, now) - max(w.reserved_s, t0))
    gpus = sum(ps.usage.get(GPU, 0.0) for ps in w.pod_sets if (GPU, flavor) in ps.flavors)
    return gpus * span


def reserve_section(
    inputs: ReviewInputs, quota: QuotaPolicy | None, flavors: Sequence[Flavor]
) -> TableSection | None:
    """The section, or None when the quota policy keeps no reserve."""
    tiers = {t: s.reserve for t, s in (quota.tiers.items() if quota else ()) if s.reserve}
    if not tiers:
        return None
    now, t0 = inputs.now_s, inputs.now_s - inputs.period_s
    workloads = [workload_from_object(o) for o in inputs.workloads]
    local = dict(map(local_queue_from_object, inputs.local_queues))
    made = {
        str((o.get("metadata") or {}).get("name")): parse_time(
            (o.get("metadata") or {}).get("creationTimestamp")
        )
        for o in inputs.cluster_queues
    }
    data: dict[str, Any] = {}
    rows: list[list[str]] = []
    waiting_rows: list[list[str]] = []
    for tier, reserve in tiers.items():
        queue = reserved_queue_name(tier)
        flavor = next((f.name for f in flavors if f.tier == tier and f.reserved), "")
        since = max(t0, made.get(queue) or t0)
        reserved = reserve.nodes * reserve.gpus * max(0.0, now - since)
        large = lent = 0.0
        waits: list[float] = []
        waiting: list[tuple[float, WorkloadInfo]] = []
        for w in workloads:
            cq = w.cluster_queue or local.get((w.namespace, w.queue), "")
            if cq == queue:
                large += _held_gpu_s(w, flavor, t0, now)
                if w.reserved_s is not None and w.queued_s is not None and w.reserved_s >= t0:
                    waits.append(max(0.0, w.reserved_s - w.queued_s))
                elif w.quota_reserved != "True" and w.finished != "True" and w.queued_s:
                    waiting.append((now - w.queued_s, w))
            else:
                lent += _held_gpu_s(w, flavor, t0, now)
        entry: dict[str, Any] = {
            "reserved_gpu_hours": round(reserved / HOUR, 2),
            "large_gpu_hours": round(large / HOUR, 2),
            "lent_gpu_hours": round(lent / HOUR, 2),
            "idle_gpu_hours": round(max(0.0, reserved - large - lent) / HOUR, 2),
            "large_jobs_admitted": len(waits),
            "wait_p50_s": round(percentile(waits, 0.5), 1) if waits else None,
            "wait_p99_s": round(percentile(waits, 0.99), 1) if waits else None,
            "waiting": [
                {"workload": w.key, "waiting_s": round(s, 1), "message": w.message}
                for s, w in sorted(waiting, key=lambda sw: -sw[0])
            ],
        }
        data[tier] = entry
        wait = f"{entry['wait_p50_s']:g} / {entry['wait_p99_s']:g} s" if waits else "-"
        rows.append(
            [
                tier,
                f"{entry['reserved_gpu_hours']:g}",
                f"{entry['large_gpu_hours']:g}",
                f"{entry['lent_gpu_hours']:g}",
                f"{entry['idle_gpu_hours']:g}",
                str(len(waits)),
                wait,
                str(len(waiting)),
            ]
        )
        for item in entry["waiting"][:WAITING_SHOWN]:
            waiting_rows.append(
                [tier, item["workload"], f"{item['waiting_s']:g} s", item["message"] or "-"]
            )
    tables = [
        SectionTable(
            "Capacity reserved for large jobs (GPU-hours over the period)",
            [
                "TIER",
                "RESERVED",
                "LARGE JOBS",
                "LENT",
                "IDLE",
                "ADMITTED",
                "WAIT P50 / P99",
                "WAITING",
            ],
            rows,
        ),
        SectionTable(
            "Large jobs still waiting, and why (Kueue's message)",
            ["TIER", "WORKLOAD", "WAITING", "WHY"],
            waiting_rows,
        ),
    ]
    return TableSection("reserve", "Reserved capacity", data, tables)
