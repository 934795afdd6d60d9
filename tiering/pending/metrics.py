"""The pending area's metrics: why GPU workloads wait, and what capacity is unusable.

Registered on the registry the service owns; every name is listed in docs/tiering.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nodeagent_tiering.pending.fits import primary_request
from nodeagent_tiering.pending.results import CONTIGUITY, PassResult


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
