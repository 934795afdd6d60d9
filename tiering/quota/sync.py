"""The tiering service's Kueue side: tiers kept as ResourceFlavors, and the quota metrics.

After each reconcile pass of the leader (or of a dry run) the service calls
:meth:`KueueSync.after_pass`. At most every ``interval_s`` (the tier policy's ``resync_s``) it
looks the Kueue API up through discovery, syncs the flavors (:class:`.flavors.FlavorSync`) and
reads the ClusterQueues, and keeps the nodes the quota policy reserves for large jobs marked
(:mod:`.reserve`: a reserved node that fails is replaced within that interval); on every pass
it recomputes what the tiers' healthy nodes back of the
quota promised on them, from the node cache the controller already holds, so the metrics follow
a drain within one pass. Without Kueue it does nothing but look again at the next interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from nodeagent_tiering.cluster import JSON, kueue
from nodeagent_tiering.cluster.clock import Clock
from nodeagent_tiering.cluster.cluster_api import Kube, KubeError
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.cluster.tier_policy import TierPolicy
from nodeagent_tiering.quota.backing import backing
from nodeagent_tiering.quota.flavors import Flavor, FlavorReport, FlavorSync, desired_flavors
from nodeagent_tiering.quota.metrics import QuotaMetrics
from nodeagent_tiering.quota.policy import QuotaPolicy
from nodeagent_tiering.quota.reserve import ReservedNodes, ReserveSpec

log = logging.getLogger(__name__)


def service_flavors(policy: TierPolicy, quota: QuotaPolicy | None) -> list[Flavor]:
    """The flavors the service keeps: one per tier of the tier policy (in its order), as the
    quota policy's tier settings say (products, taints) when one is given."""
    settings = quota.flavor_settings() if quota is not None else {}
    prefix = quota.flavor_prefix if quota is not None else ""
    return desired_flavors([t.name for t in policy.tiers], settings, prefix=prefix)


def service_reserve(quota: QuotaPolicy | None) -> list[ReserveSpec]:
    """The reserves of the quota policy's tiers (none without a policy)."""
    if quota is None:
        return []
    return [
        ReserveSpec(tier, s.reserve.nodes, s.reserve.gpus)
        for tier, s in quota.tiers.items()
        if s.reserve is not None
    ]


class KueueSync:
    """Flavor sync and quota metrics, throttled to ``interval_s`` (see the module doc)."""

    def __init__(
        self,
        kube: Kube,
        flavors: Sequence[Flavor],
        metrics: QuotaMetrics,
        *,
        clock: Clock,
        interval_s: float,
        dry_run: bool = False,
        may_act: Callable[[], bool] | None = None,
        dry_log: Callable[[str], None] | None = None,
        reserve: Sequence[ReserveSpec] = (),
    ) -> None:
        self.kube = kube
        self.flavors = list(flavors)
        self.metrics = metrics
        self.clock = clock
        self.interval_s = interval_s
        self.dry_run = dry_run
        self.may_act = may_act or (lambda: True)
        self.dry_log = dry_log
        self.api: kueue.KueueApi | None = None
        self._sync: FlavorSync | None = None
        self._next_s = float("-inf")
        self._cluster_queues: list[JSON] = []
        self.last_report: FlavorReport | None = None
        self.reserved = ReservedNodes(
            kube, reserve, dry_run=dry_run, may_act=self.may_act, dry_log=dry_log
        )

    def after_pass(self, nodes: Sequence[JSON], *, force: bool = False) -> FlavorReport | None:
        """Sync when due (or ``force``), then refresh the quota gauges from ``nodes``.

        Returns the sync's report when one ran.
        """
        now = self.clock()
        report = None
        if force or now >= self._next_s:
            self._next_s = now + self.interval_s
            report = self._sync_now()
            if self.api is not None and self.reserved.specs:
                self._keep_reserve(nodes)
        if self.api is not None:
            self.metrics.observe_backing(backing(nodes, self._cluster_queues, self.flavors))
        return report

    def _keep_reserve(self, nodes: Sequence[JSON]) -> None:
        try:
            choices = self.reserved.sync([Node.from_object(n) for n in nodes])
        except KubeError as exc:
            self.metrics.sync_errors.inc()
            log.warning("cannot keep the reserved nodes: %s", exc)
            return
        for tier, choice in choices.items():
            self.metrics.reserved_nodes.labels(tier, "wanted").set(choice.wanted)
            self.metrics.reserved_nodes.labels(tier, "kept").set(len(choice.kept))

    def _sync_now(self) -> FlavorReport | None:
        try:
            api = self.kube.kueue_api()
        except KubeError as exc:
            self.metrics.sync_errors.inc()
            log.warning("cannot look up the Kueue API: %s", exc)
            return None
        if api != self.api:
            if api is None:
                log.info("Kueue is not served (%s): no flavors kept", kueue.GROUP)
            else:
                log.info(
                    "Kueue served as %s: keeping %d flavors", api.api_version, len(self.flavors)
                )
            self.api = api
            self._sync = FlavorSync(self.kube, api, dry_run=self.dry_run) if api else None
        self.metrics.kueue_served.set(1 if api is not None else 0)
        if api is None or self._sync is None:
            return None
        try:
            flavors = self.kube.list_kueue(api, kueue.RESOURCE_FLAVOR)
            self._cluster_queues = self.kube.list_kueue(api, kueue.CLUSTER_QUEUE)
        except KubeError as exc:
            self.metrics.sync_errors.inc()
            log.warning("cannot read Kueue's flavors and queues: %s", exc)
            return None
        if not self.dry_run and not self.may_act():
            return None
        report = self._sync.sync(self.flavors, flavors=flavors, cluster_queues=self._cluster_queues)
        if report.errors:
            self.metrics.sync_errors.inc(len(report.errors))
        for name in report.foreign:
            log.warning(
                "ResourceFlavor %s exists and is not managed by nodeagent: left alone (set "
                "flavor_prefix in the quota policy to pick other names)",
                name,
            )
        for name, users in report.kept.items():
            log.info(
                "ResourceFlavor %s: no tier wants it; kept while ClusterQueues name it (%s)",
                name,
                ", ".join(users),
            )
        self.metrics.observe_flavors(report, {f.name: f.tier for f in self.flavors})
        if self.dry_log is not None:
            for line in report.would:
                self.dry_log(line)
        self.last_report = report
        return report

    def objects(self) -> list[JSON]:
        """The desired flavor objects (what a dry run prints)."""
        api = self.api or kueue.KueueApi(kueue.VERSIONS[0])
        return [f.to_object(api) for f in self.flavors]
