"""The pending-workload diagnosis inside the running service.

It shares the controller's node cache and keeps its own watch-driven caches of pods and (when
Kueue is installed) Workloads, LocalQueues and ClusterQueues. A pass runs when something
changed, at most every :data:`MIN_INTERVAL_S`, and at least every :data:`RESYNC_S`. Every pass
refreshes the metrics; only the leader writes, and what it writes is advisory: Events on the
diagnosed pods (and on the jobs of Workloads waiting without pods)
(:mod:`nodeagent_tiering.pending.events`) and the rolling history
(:mod:`nodeagent_tiering.pending.history`). In a dry run it logs the Events it would
record. Nothing it does changes a workload.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import TypeVar

from nodeagent_tiering.cluster import JSON
from nodeagent_tiering.cluster.clock import Clock
from nodeagent_tiering.cluster.cluster_api import KUEUE_GROUP, KUEUE_VERSION, Kube, KubeError
from nodeagent_tiering.cluster.informer import Informer, NodeCache
from nodeagent_tiering.cluster.nodes import Node, node_identity
from nodeagent_tiering.cluster.view import (
    ClusterQueueInfo,
    ClusterView,
    PodInfo,
    WorkloadInfo,
    cluster_queue_from_object,
    local_queue_from_object,
    pod_from_object,
    workload_from_object,
)
from nodeagent_tiering.pending.diagnosis import Diagnoser
from nodeagent_tiering.pending.events import PodEvents
from nodeagent_tiering.pending.history import History, HistoryStore
from nodeagent_tiering.pending.metrics import PendingMetrics
from nodeagent_tiering.pending.mig import MigPlanner
from nodeagent_tiering.pending.results import EVENT_REASONS, PassResult, Settings

log = logging.getLogger(__name__)
_T = TypeVar("_T")

MIN_INTERVAL_S = 5.0  # a burst of pod changes gives one pass, not hundreds
RESYNC_S = 30.0  # a pass at least this often (pending ages, the history's clock)


@dataclass(eq=False)
class PendingLoop:
    """Diagnosis passes, their metrics, and (as leader) Events and history.

    ``namespace`` holds the history's ConfigMap; ``identity`` names this replica in the Events
    it records.
    """

    kube: Kube
    nodes: NodeCache
    settings: Settings
    metrics: PendingMetrics
    planner: MigPlanner
    _: KW_ONLY
    clock: Clock
    namespace: InitVar[str]
    identity: InitVar[str]
    may_act: Callable[[], bool]
    dry_run: bool = False
    pods: Informer[PodInfo] = field(init=False)
    workloads: Informer[WorkloadInfo] = field(init=False)
    local_queues: Informer[tuple[tuple[str, str], str]] = field(init=False)
    cluster_queues: Informer[ClusterQueueInfo] = field(init=False)
    events: PodEvents = field(init=False)
    store: HistoryStore = field(init=False)
    history: History = field(init=False, default_factory=History)
    last: PassResult | None = field(init=False, default=None)
    _leading: bool = field(init=False, default=False)
    _parsed: dict[str, tuple[str, Node]] = field(init=False, default_factory=dict)
    _dry_seen: set[tuple[str, str]] = field(init=False, default_factory=set)

    def __post_init__(self, namespace: str, identity: str) -> None:
        kube = self.kube
        self.pods = Informer(
            "pod",
            kube.list_pods,
            lambda rv, timeout: kube.watch_objects(
                kube.core.list_pod_for_all_namespaces, rv, timeout
            ),
            pod_from_object,
        )
        self.workloads = _kueue_informer(kube, "workloads", workload_from_object)
        # Where a Workload waiting for quota would be admitted, and how short that queue is.
        self.local_queues = _kueue_informer(kube, "localqueues", local_queue_from_object)
        self.cluster_queues = _kueue_informer(kube, "clusterqueues", cluster_queue_from_object)
        self.events = PodEvents(None if self.dry_run else kube, instance=identity)
        self.store = HistoryStore(kube, namespace)

    def view(self) -> ClusterView:
        """The cluster now, from the caches (nodes are parsed again only when they changed)."""
        infos = []
        seen = set()
        for obj in self.nodes.snapshot():
            name, rv = node_identity(obj)
            cached = self._parsed.get(name)
            if cached is None or cached[0] != rv or not rv:
                cached = (rv, Node.from_object(obj))
                self._parsed[name] = cached
            infos.append(cached[1])
            seen.add(name)
        for gone in set(self._parsed) - seen:
            del self._parsed[gone]
        kueue = self.workloads.available and self.workloads.synced.is_set()
        return ClusterView(
            nodes=tuple(infos),
            pods=tuple(self.pods.snapshot()),
            workloads=tuple(self.workloads.snapshot()) if kueue else (),
            kueue=kueue,
            local_queues=dict(self.local_queues.snapshot()) if kueue else {},
            cluster_queues=tuple(self.cluster_queues.snapshot()) if kueue else (),
        )

    def _lead(self) -> bool:
        """Whether this pass writes; reads the Events and the history back on gaining the lease."""
        acting = not self.dry_run and self.may_act()
        if acting and not self._leading:
            try:
                self.events.seed()
                self.history = self.store.load()
            except KubeError as exc:
                self.metrics.errors.inc()
                log.warning("cannot read back pending-workload Events or history: %s", exc)
                return False
            self._leading = True
        if not acting:
            self._leading = False
        return acting

    def pass_once(self) -> PassResult:
        """One pass: diagnose, export, and (leader) record."""
        acting = self._lead()
        view = self.view()
        started = time.perf_counter()
        result = Diagnoser(view, self.settings, self.planner).run()
        self.metrics.duration.observe(time.perf_counter() - started)
        now = self.clock()
        if acting:
            for _, d in self.events.observe(result.diagnoses, now):
                self.metrics.events.labels(reason=EVENT_REASONS[d.reason]).inc()
        elif self.dry_run:
            for what, d in self.events.observe(result.diagnoses, now):
                key = (d.pod, d.reason.value)
                if what == "created" and key not in self._dry_seen:
                    log.info("dry-run: would record %s on pod %s", EVENT_REASONS[d.reason], d.pod)
                self._dry_seen.add(key)
        longest: dict[tuple[str, str], float] = {}
        for d in result.diagnoses:
            since = self.events.since(d)
            if since is not None:
                key = (d.reason.value, d.tier)
                longest[key] = max(longest.get(key, 0.0), max(0.0, now - since))
        self.metrics.observe(result, longest)
        if acting:
            self.history.observe(view, result, now)
            if self.store.due(now):
                try:
                    self.store.save(self.history, now)
                except KubeError as exc:
                    self.metrics.errors.inc()
                    log.warning("cannot save the pending-workload history: %s", exc)
        self.last = result
        return result

    def run(self, stop: threading.Event) -> None:
        """Watch pods and Workloads and run passes until ``stop``."""
        for informer in (self.pods, self.workloads, self.local_queues, self.cluster_queues):
            threading.Thread(
                target=informer.run, args=(stop,), name=f"tiering-{informer.what}", daemon=True
            ).start()
        last_pass = float("-inf")
        last_nodes = -1.0
        while not stop.is_set():
            now = self.clock()
            kueue = (self.workloads, self.local_queues, self.cluster_queues)
            changed = self.pods.changed.is_set() or any(i.changed.is_set() for i in kueue)
            changed = changed or self.nodes.last_change_s != last_nodes
            ready = self.pods.synced.is_set() and self.nodes.synced.is_set()
            due = now - last_pass >= RESYNC_S or (changed and now - last_pass >= MIN_INTERVAL_S)
            if ready and due and (self.dry_run or self.may_act()):
                for informer in (self.pods, *kueue):
                    informer.changed.clear()
                last_nodes = self.nodes.last_change_s
                try:
                    self.pass_once()
                except Exception:  # a bad object must not end the service's diagnosis
                    self.metrics.errors.inc()
                    log.exception("pending-workload pass failed; next pass in %.0fs", RESYNC_S)
                last_pass = now
            self.clock.wait(self.pods.changed, MIN_INTERVAL_S)


def _kueue_informer(kube: Kube, plural: str, parse: Callable[[JSON], _T]) -> Informer[_T]:
    """An informer over one Kueue kind in every namespace (idle when Kueue is not installed)."""
    return Informer(
        f"Kueue {plural}",
        lambda: kube.list_kueue_plural(plural),
        lambda rv, timeout: kube.watch_objects(
            kube.custom.list_cluster_custom_object,
            rv,
            timeout,
            group=KUEUE_GROUP,
            version=KUEUE_VERSION,
            plural=plural,
        ),
        parse,
    )
