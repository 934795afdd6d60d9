"""The drain area's metrics: tiers, drains, evictions, the breaker, the lease.

Each area registers its own families on the one registry the service owns (see
:mod:`nodeagent_tiering.service`); every name is listed in docs/tiering.md ("Metrics"), and a
test compares the two.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nodeagent_tiering.drain.planner import Plan

NODE_STATES = ("stable", "degraded", "unstable", "draining", "drained", "failed")


class DrainMetrics:
    """Counters, gauges and the reconcile histogram; a private registry when none is given."""

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
