"""The quota section's data and how it is shown: rows per tier and team, the capacity behind
the guarantees, the findings, as tables, JSON and HTML (what the numbers mean and where they
come from: :mod:`.quota`)."""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from nodeagent_tiering.quota.backing import Backing
from nodeagent_tiering.review.sections import SectionTable

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


def number_text(value: float | None, digits: int = 1) -> str:
    """An amount: an integer when it is one, ``-`` for none."""
    if value is None:
        return "-"
    if value == int(value):
        return str(int(value))
    return f"{value:.{digits}f}"


_n = number_text  # short, for the f-strings that build the rows


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
