"""The quota area's metrics: Kueue flavors and the quota each tier's healthy capacity backs.

Registered on the registry the service owns; every name is listed in docs/tiering.md.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from nodeagent_tiering.quota.backing import Backing
from nodeagent_tiering.quota.flavors import FlavorReport


class QuotaMetrics:
    """Kueue flavors and the quota each tier's healthy capacity backs (on the same registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.kueue_served = Gauge(
            "nodeagent_tiering_kueue_served",
            "1 when the API server serves Kueue (kueue.x-k8s.io) and the service keeps flavors.",
            registry=r,
        )
        self.flavors = Gauge(
            "nodeagent_tiering_kueue_flavors",
            "nodeagent's ResourceFlavors by state: in-sync, drifted (edited by hand, left as it "
            "is), stale-referenced (no tier wants it, a ClusterQueue still names it), name-taken "
            "(someone else's flavor has the name).",
            ["state"],
            registry=r,
        )
        self.flavor_drift = Gauge(
            "nodeagent_tiering_kueue_flavor_drift",
            "1 while a nodeagent ResourceFlavor differs from the tier and quota policies because "
            "someone edited it (the service leaves it as it is).",
            ["flavor", "tier"],
            registry=r,
        )
        self.flavor_changes = Counter(
            "nodeagent_tiering_kueue_flavor_changes_total",
            "ResourceFlavor writes by action: created, updated, deleted.",
            ["action"],
            registry=r,
        )
        self.sync_errors = Counter(
            "nodeagent_tiering_kueue_sync_errors_total",
            "Flavor syncs or quota reads that failed (API errors).",
            registry=r,
        )
        self.guaranteed = Gauge(
            "nodeagent_tiering_quota_guaranteed",
            "Guaranteed quota (nominalQuota of every ClusterQueue) promised on a flavor.",
            ["tier", "flavor", "resource"],
            registry=r,
        )
        self.backed = Gauge(
            "nodeagent_tiering_quota_backed",
            "Guaranteed quota the flavor's healthy nodes can back: min(guaranteed, healthy).",
            ["tier", "flavor", "resource"],
            registry=r,
        )
        self.capacity = Gauge(
            "nodeagent_tiering_quota_capacity",
            "Devices of the flavor's nodes: installed (quarantined ones included) and healthy "
            "(in service, GPU by GPU: not on a drained, unstable, cordoned or NotReady node, "
            "nor on a GPU its agent publishes faulty).",
            ["tier", "flavor", "resource", "state"],
            registry=r,
        )
        self.reserved_nodes = Gauge(
            "nodeagent_tiering_reserved_nodes",
            "Nodes a tier keeps for large jobs (quota policy reserve): wanted by the policy, and "
            "kept (marked; fewer when not enough whole healthy nodes qualify).",
            ["tier", "state"],
            registry=r,
        )

    def observe_flavors(self, report: FlavorReport, tiers: dict[str, str]) -> None:
        """Refresh the flavor gauges from one sync pass (``tiers``: flavor -> tier)."""
        self.flavors.labels(state="in-sync").set(len(report.in_sync))
        self.flavors.labels(state="drifted").set(len(report.drifted))
        self.flavors.labels(state="stale-referenced").set(len(report.kept))
        self.flavors.labels(state="name-taken").set(len(report.foreign))
        self.flavor_drift.clear()
        for name in report.drifted:
            self.flavor_drift.labels(flavor=name, tier=tiers.get(name, "")).set(1)
        for action, names in (
            ("created", report.created),
            ("updated", report.updated),
            ("deleted", report.deleted),
        ):
            if names:
                self.flavor_changes.labels(action=action).inc(len(names))

    def observe_backing(self, rows: list[Backing]) -> None:
        """Refresh the quota gauges."""
        for gauge in (self.guaranteed, self.backed, self.capacity):
            gauge.clear()
        for row in rows:
            key = {"tier": row.tier, "flavor": row.flavor, "resource": row.resource}
            self.guaranteed.labels(**key).set(row.promised)
            self.backed.labels(**key).set(row.backed)
            self.capacity.labels(**key, state="installed").set(row.installed)
            self.capacity.labels(**key, state="healthy").set(row.healthy)
