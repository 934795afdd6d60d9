"""The tiering service put together: the API client, the node cache, the controller, the lease.

``nodeagent tiering run`` is a thin command over :func:`build`, :func:`run_once` and
:func:`serve`; tests and the benchmark build the same service.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from nodeagent_tiering.cluster.clock import Clock, SystemClock
from nodeagent_tiering.cluster.cluster_api import Kube
from nodeagent_tiering.cluster.informer import NodeCache
from nodeagent_tiering.cluster.tier_policy import TierPolicy
from nodeagent_tiering.drain.controller import Controller
from nodeagent_tiering.drain.leader import LeaderElector
from nodeagent_tiering.drain.metrics import DrainMetrics
from nodeagent_tiering.drain.planner import Plan
from nodeagent_tiering.pending.loop import PendingLoop
from nodeagent_tiering.pending.metrics import PendingMetrics
from nodeagent_tiering.pending.mig import MigPlanner
from nodeagent_tiering.pending.results import settings_for
from nodeagent_tiering.quota.metrics import QuotaMetrics
from nodeagent_tiering.quota.policy import QuotaPolicy
from nodeagent_tiering.quota.sync import KueueSync, service_flavors, service_reserve


class LeaseHeldError(Exception):
    """Another replica holds the lease, so a one-shot pass that would write must not run."""


@dataclass
class ServiceMetrics:
    """The one registry the service serves, with each area's families registered on it.

    The areas do not know each other: each defines its own metrics class, and only this
    composition puts them on one registry.
    """

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.drain = DrainMetrics(self.registry)
        self.pending = PendingMetrics(self.registry)
        self.quota = QuotaMetrics(self.registry)


@dataclass
class Service:
    """The running parts of one replica."""

    kube: Kube
    cache: NodeCache
    controller: Controller
    elector: LeaderElector | None  # None in a dry run: it writes nothing, the lease included
    pending: PendingLoop  # why GPU workloads are pending (advisory: Events, metrics, history)
    kueue: KueueSync | None = None  # tiers as Kueue flavors and the quota metrics; None: off
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)


def build(
    api: Any,
    policy: TierPolicy,
    *,
    namespace: str,
    lease_name: str,
    identity: str,
    dry_run: bool,
    clock: Clock | None = None,
    planner: MigPlanner,
    kueue: bool = True,
    quota: QuotaPolicy | None = None,
) -> Service:
    """One replica of the service over ``api`` (a configured ``kubernetes`` ApiClient).

    ``planner`` is the MIG planner the pending-workload diagnosis asks what a layout change
    would take (the composition layer passes ``mig apply``'s). ``kueue``: keep the tiers as
    Kueue ResourceFlavors (when the cluster serves Kueue), shaped by ``quota``'s tier settings
    when a quota policy is given.
    """
    clock = clock or SystemClock()
    kube = Kube(api)
    cache = NodeCache(kube)
    elector = None
    if not dry_run:
        elector = LeaderElector(
            kube, namespace=namespace, name=lease_name, identity=identity, clock=clock
        )
    metrics = ServiceMetrics()
    controller = Controller(
        kube,
        cache,
        policy,
        clock=clock,
        elector=elector,
        dry_run=dry_run,
        metrics=metrics.drain,
    )
    pending = PendingLoop(
        kube,
        cache,
        settings_for(policy),
        metrics.pending,
        planner,
        clock=clock,
        namespace=namespace,
        identity=identity,
        may_act=controller.may_act,
        dry_run=dry_run,
    )
    link = None
    if kueue:
        link = KueueSync(
            kube,
            service_flavors(policy, quota),
            metrics.quota,
            clock=clock,
            interval_s=policy.resync_s,
            dry_run=dry_run,
            may_act=controller.may_act,
            dry_log=controller.dry_log.add,
            reserve=service_reserve(quota),
        )
    return Service(kube, cache, controller, elector, pending, link, metrics)


def run_once(service: Service) -> Plan:
    """List the nodes, take the lease (unless dry-run), reconcile once, release the lease.

    Raises:
        KubeError: the API server is unreachable or refused.
        LeaseHeldError: another replica is the leader.
    """
    service.cache.relist()
    elector = service.elector
    if elector is not None and not elector.try_acquire_or_renew():
        raise LeaseHeldError("another replica holds the lease")
    result = service.controller.reconcile_once()
    if service.kueue is not None:
        service.kueue.after_pass(service.cache.snapshot(), force=True)
    if elector is not None:
        elector.release()
    return result


def serve(service: Service, metrics_host: str | None, metrics_port: int | None) -> None:
    """Reconcile until SIGTERM or SIGINT, serving the metrics on the port when one is given."""
    if metrics_port is not None:
        registry = service.metrics.registry
        start_http_server(metrics_port, addr=metrics_host or "0.0.0.0", registry=registry)  # noqa: S104
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    diagnosis = threading.Thread(
        target=service.pending.run, args=(stop,), name="tiering-pending", daemon=True
    )
    diagnosis.start()
    link = service.kueue

    def after_pass(_plan: Plan) -> None:
        if link is not None:
            link.after_pass(service.cache.snapshot())

    service.controller.run(stop, on_pass=after_pass)
    diagnosis.join(timeout=5)
