"""The tiering service's own Prometheus metrics (``nodeagent_tiering_*``), on a private registry.

Every name here is listed in docs/tiering.md ("Metrics"); a test compares the two.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nodeagent_tiering.backing import Backing
from nodeagent_tiering.flavors import FlavorReport
from nodeagent_tiering.pending import CONTIGUITY, PassResult, primary_request
from nodeagent_tiering.planner import Plan

NODE_STATES = ("stable", "degraded", "unstable", "draining", "drained", "failed")


class TieringMetrics:
    """Counters, gauges and the reconcile histogram."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.nodes = Gauge(
            "nodeagent_tiering_nodes",
            "Managed nodes by tier (the nodeagent.io/tier label the service wants) and state.",
            ["tier", "state"],
            registry=r,
        )
        self.drains_in_progress = Gauge(
            "nodeagent_tiering_drains_in_progress",
            "Nodes cordoned by the service and still evicting pods, by the tier they left.",
            ["tier"],
            registry=r,
        )
        self.drains = Counter(
            "nodeagent_tiering_drains_total",
            "Drains by outcome: started, succeeded, failed (timed out with pods left), released.",
            ["result"],
            registry=r,
        )
        self.evictions = Counter(
            "nodeagent_tiering_evictions_total",
            "Eviction requests by outcome: evicted, blocked (PDB 429), gone, error.",
            ["result"],
            registry=r,
        )
        self.gpu_remediations = Counter(
            "nodeagent_tiering_gpu_remediations_total",
            "Single-GPU remediations (only that GPU's pods evicted) by outcome: started, "
            "succeeded, deferred (budget or breaker), cleared (the GPU healthy again).",
            ["result"],
            registry=r,
        )
        self.evictions_blocked = Counter(
            "nodeagent_tiering_evictions_blocked_total",
            "Evictions refused by a PodDisruptionBudget (HTTP 429), retried with backoff.",
            registry=r,
        )
        self.deferred = Gauge(
            "nodeagent_tiering_drains_deferred",
            "Unstable nodes waiting for the disruption budget in the last pass.",
            registry=r,
        )
        self.breaker_open = Gauge(
            "nodeagent_tiering_circuit_breaker_open",
            "1 while the circuit breaker is open (all new drains stopped until a reset).",
            registry=r,
        )
        self.breaker_trips = Counter(
            "nodeagent_tiering_circuit_breaker_trips_total",
            "Times the circuit breaker opened.",
            registry=r,
        )
        self.leader = Gauge(
            "nodeagent_tiering_leader",
            "1 when this replica holds the lease and acts.",
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "nodeagent_tiering_reconcile_duration_seconds",
            "Time of one reconcile pass (plan and API writes).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.reconcile_errors = Counter(
            "nodeagent_tiering_reconcile_errors_total",
            "API writes that failed during reconcile passes.",
            registry=r,
        )
        self.pending = PendingMetrics(r)
        self.quota = QuotaMetrics(r)

    def observe_plan(self, plan: Plan) -> None:
        """Refresh the per-tier gauges from a pass's plan."""
        self.nodes.clear()
        self.drains_in_progress.clear()
        for tier, stats in plan.tiers.items():
            for state in NODE_STATES:
                self.nodes.labels(tier=tier, state=state).set(stats.states.get(state, 0))
        draining: dict[str, int] = {}
        for tier, stats in plan.tiers.items():
            draining[tier] = draining.get(tier, 0) + stats.draining
        for tier, count in draining.items():
            self.drains_in_progress.labels(tier=tier).set(count)
        self.breaker_open.set(1 if plan.breaker.open else 0)


class PendingMetrics:
    """The pending-workload diagnosis: why GPU workloads wait, and what capacity is unusable.

    Gauges are replaced as a whole after every pass (cleared, then set), so a reason or tier
    that disappears stops being exported.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.workloads = Gauge(
            "nodeagent_tiering_pending_gpu_workloads",
            "Pending GPU pods by diagnosed reason and by the tier they ask for (any: several).",
            ["reason", "tier"],
            registry=r,
        )
        self.contiguity_units = Gauge(
            "nodeagent_tiering_contiguity_blocked_units",
            "Units (GPUs, MIG instances, replicas) requested by pods blocked by contiguity.",
            ["resource", "tier"],
            registry=r,
        )
        self.longest = Gauge(
            "nodeagent_tiering_pending_longest_seconds",
            "Longest time a pending GPU pod has had its current reason (from its Events).",
            ["reason", "tier"],
            registry=r,
        )
        self.unusable_gpus = Gauge(
            "nodeagent_tiering_unusable_free_gpus",
            "Free GPUs on in-service nodes that the smallest blocked whole-GPU request cannot use.",
            ["tier"],
            registry=r,
        )
        self.unusable_slices = Gauge(
            "nodeagent_tiering_unusable_free_mig_slices",
            "Free MIG memory slices that no free legal placement of the profile covers.",
            ["tier", "mig_profile"],
            registry=r,
        )
        self.largest_block = Gauge(
            "nodeagent_tiering_largest_free_nvlink_block_gpus",
            "Largest set of free NVLink-connected GPUs on one in-service node, per tier.",
            ["tier"],
            registry=r,
        )
        self.free_gpus = Gauge(
            "nodeagent_tiering_free_gpus",
            "Free whole GPUs on in-service nodes (allocatable minus requests), per tier.",
            ["tier"],
            registry=r,
        )
        self.events = Counter(
            "nodeagent_tiering_pending_events_total",
            "Events recorded on pending pods (created, or a series updated), by Event reason.",
            ["reason"],
            registry=r,
        )
        self.duration = Histogram(
            "nodeagent_tiering_pending_pass_duration_seconds",
            "Time of one pending-workload diagnosis pass (the pure pass, no API calls).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.errors = Counter(
            "nodeagent_tiering_pending_errors_total",
            "Diagnosis passes that could not read the cluster or write their Events or history.",
            registry=r,
        )

    def observe(self, result: PassResult, longest: Mapping[tuple[str, str], float]) -> None:
        """Replace the gauges with one pass's result; ``longest``: (reason, tier) -> seconds."""
        for gauge in (
            self.workloads,
            self.contiguity_units,
            self.longest,
            self.unusable_gpus,
            self.unusable_slices,
            self.largest_block,
            self.free_gpus,
        ):
            gauge.clear()
        counts: dict[tuple[str, str], int] = {}
        units: dict[tuple[str, str], int] = {}
        for d in result.diagnoses:
            key = (d.reason.value, d.tier)
            counts[key] = counts.get(key, 0) + 1
            if d.reason in CONTIGUITY:
                resource, n = primary_request(d.request)
                units[(resource, d.tier)] = units.get((resource, d.tier), 0) + n
        for (reason, tier), n in counts.items():
            self.workloads.labels(reason=reason, tier=tier).set(n)
        for (resource, tier), n in units.items():
            self.contiguity_units.labels(resource=resource, tier=tier).set(n)
        for (reason, tier), seconds in longest.items():
            self.longest.labels(reason=reason, tier=tier).set(seconds)
        stats = result.stats
        for tier, n in stats.unusable_gpus.items():
            self.unusable_gpus.labels(tier=tier).set(n)
        for (tier, profile), n in stats.unusable_mig_slices.items():
            self.unusable_slices.labels(tier=tier, mig_profile=profile).set(n)
        for tier, n in stats.largest_nvlink_block.items():
            self.largest_block.labels(tier=tier).set(n)
        for tier, n in stats.free_gpus.items():
            self.free_gpus.labels(tier=tier).set(n)


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
            "Allocatable devices of the flavor's nodes: installed (quarantined ones included) "
            "and healthy (in service: not drained, unstable, cordoned or NotReady).",
            ["tier", "flavor", "resource", "state"],
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
