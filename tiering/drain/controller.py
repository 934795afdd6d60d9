"""The reconcile loop: plan from the node cache, then act (only as leader, never in dry-run).

Every write re-checks leadership right before it is sent, and node writes that depend on what
the service last read carry ``metadata.resourceVersion`` so a stale view fails with 409 instead
of overwriting someone else's change. Drains advance in steps (one round of evictions per step),
so one slow PodDisruptionBudget never blocks the loop, and a fake clock drives every test.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from nodeagent import labels as lbl
from nodeagent.runtime.backoff import Backoff
from nodeagent_tiering.cluster.clock import Clock
from nodeagent_tiering.cluster.cluster_api import Kube, KubeError, ObjectRef
from nodeagent_tiering.cluster.informer import NodeCache
from nodeagent_tiering.cluster.nodes import DRAIN_ANNOTATION, DrainRecord, Node, Phase
from nodeagent_tiering.cluster.tier_policy import Stability, TierPolicy, resolve
from nodeagent_tiering.drain import remediation as single_gpu
from nodeagent_tiering.drain.leader import LeaderElector
from nodeagent_tiering.drain.metrics import DrainMetrics
from nodeagent_tiering.drain.planner import (
    BreakerState,
    Defer,
    MarkStable,
    Plan,
    Release,
    SetTier,
    StartDrain,
    StepDrain,
    plan,
)

log = logging.getLogger(__name__)

COMPONENT = "nodeagent-tiering"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
STEP_INTERVAL_S = 2.0  # at most one eviction round per draining node this often


@dataclass
class _PodRetry:
    """When an eviction refused by a PodDisruptionBudget is tried again."""

    backoff: Backoff
    next_s: float = 0.0


@dataclass
class DryRunLog:
    """What a dry run would have done, in order."""

    lines: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        self.lines.append(line)
        log.info("dry-run: would %s", line)


@dataclass(eq=False)
class Controller:
    """Tiers and drains, one pass at a time."""

    kube: Kube
    cache: NodeCache
    policy: TierPolicy
    _: KW_ONLY
    clock: Clock
    elector: LeaderElector | None = None
    dry_run: bool = False
    metrics: DrainMetrics = field(default_factory=DrainMetrics)
    dry_log: DryRunLog = field(init=False, default_factory=DryRunLog)
    breaker: BreakerState = field(init=False, default_factory=BreakerState)
    last_plan: Plan | None = field(init=False, default=None)
    _unstable_since: dict[str, float] = field(init=False, default_factory=dict)
    _seeded: bool = field(init=False, default=False)
    _last_drain_start: float | None = field(init=False, default=None)
    _backoff: dict[tuple[str, str], _PodRetry] = field(init=False, default_factory=dict)
    _next_step: dict[str, float] = field(init=False, default_factory=dict)
    _deferred: dict[str, str] = field(init=False, default_factory=dict)

    # leadership

    def may_act(self) -> bool:
        """Whether a write may be sent now: not dry-run, and leader (when electing)."""
        if self.dry_run:
            return False
        return self.elector is None or self.elector.is_leader()

    # one pass

    def reconcile_once(self) -> Plan:
        """Plan from the cache and execute the plan."""
        started = time.perf_counter()
        now = self.clock()
        if self.elector is not None:
            self.breaker = self.elector.breaker
        nodes = [Node.from_object(o) for o in self.cache.snapshot()]
        remediation = self.policy.gpu_remediation
        if remediation.enabled:
            nodes = [n.as_planned(remediation) for n in nodes]
        self._track_instability(nodes, now)
        last = self._last_drain_start
        for n in nodes:
            if n.drain is not None and (last is None or n.drain.started_s > last):
                last = n.drain.started_s
        result = plan(nodes, self.policy, now, self.breaker, self._unstable_since, last)
        if result.tripped:
            self._trip(result.breaker, now)
        self.breaker = result.breaker
        by_name = {n.name: n for n in nodes}
        deferred = 0
        for action in result.actions:
            node = by_name.get(action.node)
            if node is None:
                continue
            try:
                if isinstance(action, SetTier):
                    self._set_tier(node, action.tier)
                elif isinstance(action, StartDrain):
                    self._start_drain(node, action, now)
                elif isinstance(action, StepDrain):
                    self._step_drain(node, now)
                elif isinstance(action, MarkStable):
                    self._mark_stable(node, action.since_s, now)
                elif isinstance(action, Release):
                    self._release(node, action.tier, now)
                elif isinstance(action, Defer):
                    deferred += 1
                    self._defer(node, action.reason, now)
            except KubeError as exc:
                self.metrics.reconcile_errors.inc()
                log.warning("%s on %s failed: %s", type(action).__name__, action.node, exc)
        if remediation.enabled:
            try:
                self._remediate_gpus(nodes, now)
            except KubeError as exc:
                self.metrics.reconcile_errors.inc()
                log.warning("GPU remediation failed: %s", exc)
        self.metrics.observe_plan(result)
        self.metrics.deferred.set(deferred)
        self.metrics.reconcile_duration.observe(time.perf_counter() - started)
        self.last_plan = result
        return result

    def _track_instability(self, nodes: list[Node], now: float) -> None:
        # Nodes already unstable when this replica starts count as old news: a failover or a
        # restart must not look like a storm and trip the breaker.
        seen = now if self._seeded else float("-inf")
        current = {n.name for n in nodes if n.stability is Stability.UNSTABLE}
        for name in current:
            self._unstable_since.setdefault(name, seen)
        for name in list(self._unstable_since):
            if name not in current:
                del self._unstable_since[name]
        self._seeded = True

    def _trip(self, state: BreakerState, now: float) -> None:
        log.error("circuit breaker open: %s", state.reason)
        if self.dry_run:
            self.dry_log.add(f"open the circuit breaker: {state.reason}")
            return
        if not self.may_act():
            return
        self.metrics.breaker_trips.inc()
        if self.elector is None:
            log.warning("circuit breaker kept in memory only: no lease without leader election")
            return
        self.elector.set_breaker(state)
        self.elector.try_acquire_or_renew()  # persist now, so a failover keeps it open
        # The breaker lives on the Lease, so the Event is about the Lease.
        self.kube.record_event(
            self.elector.lease_ref(),
            "CircuitBreakerOpen",
            f"all new drains stopped: {state.reason}; reset with `nodeagent tiering reset-breaker`",
            warning=True,
            now_s=now,
            component=COMPONENT,
        )

    # writes

    def _write(self, node: Node, patch: dict[str, Any], what: str, *, guard: bool) -> bool:
        if self.dry_run:
            self.dry_log.add(f"{what} on node {node.name}")
            return False
        if not self.may_act():
            return False
        if guard:
            patch = {**patch, "metadata": {**patch.get("metadata", {})}}
            patch["metadata"]["resourceVersion"] = node.resource_version
        try:
            updated = self.kube.patch_node(node.name, patch)
        except KubeError as exc:
            if exc.status == 409:
                log.info("node %s changed under us (%s); next pass retries", node.name, what)
                return False
            raise
        self.cache.update(updated)
        return True

    def _event(self, node: str, reason: str, message: str, now: float, warning: bool) -> None:
        if self.dry_run or not self.may_act():
            return
        about = ObjectRef.node(self.cache.get(node), node)
        self.kube.record_event(
            about, reason, message, warning=warning, now_s=now, component=COMPONENT
        )

    def _latest(self, node: Node) -> Node:
        """The node as last seen: a write earlier in this pass (a drain start, a release, a
        step) may have changed it since the plan's view, and an unguarded write built on the
        plan's view would undo that write or repeat it."""
        obj = self.cache.get(node.name)
        return node if obj is None else Node.from_object(obj)

    def _set_tier(self, node: Node, tier: str | None) -> None:
        if self._latest(node).labels.get(lbl.TIER) == tier:
            return  # a drain start or a release in this pass wrote it already
        self._write(
            node, {"metadata": {"labels": {lbl.TIER: tier}}}, f"set tier {tier}", guard=False
        )

    def _taints_with(self, node: Node) -> list[dict[str, Any]]:
        key = self.policy.drain.taint_key
        taints = [t.to_object() for t in node.taints if t.key != key]
        taints.append({"key": key, "value": "unstable", "effect": self.policy.drain.taint_effect})
        return taints

    def _start_drain(self, node: Node, action: StartDrain, now: float) -> None:
        record = DrainRecord(
            phase=Phase.DRAINING,
            tier=action.tier,
            cause=action.cause,
            started_s=now,
            updated_s=now,
        )
        patch = {
            "metadata": {
                "labels": {lbl.TIER: self.policy.quarantine_tier},
                "annotations": {DRAIN_ANNOTATION: record.to_json()},
            },
            "spec": {"unschedulable": True, "taints": self._taints_with(node)},
        }
        what = f"cordon, taint and start draining (tier {action.tier}: {action.cause})"
        if self._write(node, patch, what, guard=True):
            self._last_drain_start = now
            self._deferred.pop(node.name, None)
            self.metrics.drains.labels(result="started").inc()
            self._event(
                node.name,
                "DrainStarted",
                f"cordoned and draining (tier {action.tier}): {action.cause}",
                now,
                True,
            )
            log.info("drain started on %s (tier %s): %s", node.name, action.tier, action.cause)

    def _evictable(self, pod: dict[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
            return False  # static pods: the kubelet owns them, the API cannot evict them
        if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
            return False  # the DaemonSet controller would put it straight back
        phase = (pod.get("status") or {}).get("phase")
        return phase not in ("Succeeded", "Failed")

    def _step_drain(self, node: Node, now: float) -> None:
        record = self._latest(node).drain  # with a recovery clock started in this pass
        if record is None or now < self._next_step.get(node.name, float("-inf")):
            return
        if self.dry_run or not self.may_act():
            return
        pods = [p for p in self.kube.pods_on_node(node.name) if self._evictable(p)]
        evicted = blocked = 0
        remaining = 0
        next_try = now + STEP_INTERVAL_S
        for pod in pods:
            meta = pod["metadata"]
            key = (meta.get("namespace", ""), meta["name"])
            if meta.get("deletionTimestamp"):
                remaining += 1  # already terminating; wait for it to go
                continue
            backoff = self._backoff.get(key)
            if backoff is not None and now < backoff.next_s:
                remaining += 1
                next_try = min(next_try, backoff.next_s)
                continue
            if not self.may_act():
                return
            grace = self._grace(pod)
            result = self.kube.evict(key[0], key[1], grace)
            self.metrics.evictions.labels(result=result.outcome).inc()
            if result.outcome in ("evicted", "gone"):
                evicted += 1
                self._backoff.pop(key, None)
                if result.outcome == "evicted":
                    # An evicted pod terminates for up to its grace period, and only its
                    # kubelet ends that: the drain is done when the pod is gone, not now.
                    remaining += 1
            elif result.outcome == "blocked":
                blocked += 1
                remaining += 1
                self.metrics.evictions_blocked.inc()
                if backoff is None:
                    drain = self.policy.drain
                    backoff = _PodRetry(
                        Backoff(drain.pdb_backoff_initial_s, drain.pdb_backoff_max_s)
                    )
                    self._backoff[key] = backoff
                backoff.next_s = now + backoff.backoff.fail()
                next_try = min(next_try, backoff.next_s)
            else:
                remaining += 1
                log.warning("eviction of %s/%s failed: %s", key[0], key[1], result.message)
        self._next_step[node.name] = max(next_try, now + 0.001)
        updated = record.with_(
            evicted=record.evicted + evicted,
            blocked=record.blocked + blocked,
            remaining=remaining,
            updated_s=now,
        )
        if remaining == 0:
            updated = updated.with_(phase=Phase.DRAINED)
            self.metrics.drains.labels(result="succeeded").inc()
            self._event(
                node.name,
                "DrainSucceeded",
                f"drained: {updated.evicted} pods evicted, {updated.blocked} PDB refusals",
                now,
                False,
            )
            self._forget_node(node.name)
        elif now - record.started_s > self.policy.drain.timeout_s:
            updated = updated.with_(phase=Phase.FAILED)
            self.metrics.drains.labels(result="failed").inc()
            self._event(
                node.name,
                "DrainFailed",
                f"{remaining} pods still on the node after {self.policy.drain.timeout_s:.0f}s;"
                " it stays quarantined (evict or delete them by hand)",
                now,
                True,
            )
            self._forget_node(node.name)
        if evicted or blocked or updated.phase != record.phase or remaining != record.remaining:
            patch = {"metadata": {"annotations": {DRAIN_ANNOTATION: updated.to_json()}}}
            self._write(node, patch, "record drain progress", guard=False)

    # single-GPU remediation

    def _remediate_gpus(self, nodes: list[Node], now: float) -> None:
        """Evict the pods of faulty GPUs on otherwise fine nodes (see drain.remediation)."""
        max_gpus = self.policy.gpu_remediation.max_gpus
        busy = single_gpu.in_progress(nodes) + sum(
            1 for n in nodes if n.drain is not None and n.drain.phase is Phase.DRAINING
        )
        allowed = self.policy.budget.max_draining
        limit = resolve(allowed, len(nodes), round_up=False)
        if isinstance(allowed, str) and float(allowed[:-1]) > 0:
            limit = max(1, limit)  # as for drains: a percentage allows at least one
        for node in nodes:
            records = single_gpu.read_records(node)
            faulty = {g.index: g for g in node.faulty_gpus} if node.remediable(max_gpus) else {}
            updated = dict(records)
            for index in [i for i in records if i not in faulty]:
                # Healthy again (or the node is drained as a whole now): forget it.
                del updated[index]
                self.metrics.gpu_remediations.labels(result="cleared").inc()
                log.info("GPU %d of %s: remediation record cleared", index, node.name)
            for index, gpu in sorted(faulty.items()):
                record = updated.get(index)
                if record is not None and record.done:
                    continue
                if record is None:
                    if self.breaker.open or busy >= limit:
                        why = (
                            f"circuit breaker open: {self.breaker.reason}"
                            if self.breaker.open
                            else f"{busy} of {limit} disruptions already running"
                        )
                        self._defer(node, f"gpu-remediation: GPU {index}: {why}", now)
                        self.metrics.gpu_remediations.labels(result="deferred").inc()
                        continue
                    if self.dry_run:
                        self.dry_log.add(
                            f"evict the pods of GPU {index} on node {node.name}: "
                            + (", ".join(gpu.pods) or "none")
                        )
                        continue
                    if not self.may_act():
                        return
                    busy += 1
                    record = single_gpu.GpuRecord(started_s=now)
                    pods = ", ".join(gpu.pods) or "none"
                    self._gpu_step(
                        node.name,
                        "started",
                        "GPURemediationStarted",
                        f"GPU {index} is {gpu.health}: evicting only its pods ({pods}); the "
                        "node stays in service",
                        now,
                    )
                if self.dry_run or not self.may_act():
                    continue
                updated[index] = self._evict_gpu_pods(node, index, gpu.pods, record, now)
            if updated != records:
                value = single_gpu.encode_records(updated)
                patch = {"metadata": {"annotations": {lbl.GPU_REMEDIATION_ANNOTATION: value}}}
                self._write(node, patch, "record GPU remediation", guard=False)

    def _gpu_step(
        self, node: str, result: str, reason: str, message: str, now: float, *, warning: bool = True
    ) -> None:
        """One remediation step: logged, counted and recorded as an Event on the node."""
        self.metrics.gpu_remediations.labels(result=result).inc()
        log.info("node %s: %s", node, message)
        self._event(node, reason, message, now, warning)

    def _evict_gpu_pods(
        self,
        node: Node,
        index: int,
        held: tuple[str, ...],
        record: single_gpu.GpuRecord,
        now: float,
    ) -> single_gpu.GpuRecord:
        on_node = {
            f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}": p
            for p in self.kube.pods_on_node(node.name)
            if self._evictable(p)
        }
        evicted = blocked = remaining = 0
        for key in held:
            pod = on_node.get(key)
            if pod is None:
                continue  # gone already (or never on this node)
            if pod["metadata"].get("deletionTimestamp"):
                remaining += 1
                continue
            namespace, name = key.split("/", 1)
            result = self.kube.evict(namespace, name, self._grace(pod))
            self.metrics.evictions.labels(result=result.outcome).inc()
            if result.outcome in ("evicted", "gone"):
                evicted += 1
            elif result.outcome == "blocked":
                blocked += 1
                remaining += 1
                self.metrics.evictions_blocked.inc()
                log.info("eviction of %s (GPU %d of %s) refused by its PodDisruptionBudget; "
                         "retried next pass", key, index, node.name)  # fmt: skip
            else:
                remaining += 1
                log.warning("eviction of %s failed: %s", key, result.message)
        updated = record.with_(
            evicted=record.evicted + evicted, blocked=record.blocked + blocked, remaining=remaining
        )
        if remaining == 0:
            updated = updated.with_(done=True)
            self._gpu_step(
                node.name,
                "succeeded",
                "GPURemediationSucceeded",
                f"GPU {index}: {updated.evicted} pods evicted, {updated.blocked} PDB refusals; "
                "the agent returns the GPU once it is healthy",
                now,
                warning=False,
            )
        return updated

    def _grace(self, pod: dict[str, Any]) -> int:
        own = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        limit = self.policy.drain.max_grace_period_s
        return limit if own is None else min(int(own), limit)

    def _forget_node(self, name: str) -> None:
        self._next_step.pop(name, None)
        for key in [k for k in self._backoff if k[0] == name]:
            self._backoff.pop(key, None)

    def _mark_stable(self, node: Node, since: float | None, now: float) -> None:
        current = self._latest(node).drain
        if current is None:
            return
        record = current.with_(stable_since_s=since, updated_s=now)
        patch = {"metadata": {"annotations": {DRAIN_ANNOTATION: record.to_json()}}}
        what = "start the recovery clock" if since is not None else "restart the recovery clock"
        self._write(node, patch, what, guard=False)

    def _release(self, node: Node, tier: str | None, now: float) -> None:
        key = self.policy.drain.taint_key
        patch = {
            "metadata": {"labels": {lbl.TIER: tier}, "annotations": {DRAIN_ANNOTATION: None}},
            "spec": {
                "unschedulable": None,
                "taints": [t.to_object() for t in node.taints if t.key != key] or None,
            },
        }
        if self._write(node, patch, f"uncordon and return to tier {tier}", guard=True):
            self.metrics.drains.labels(result="released").inc()
            self._forget_node(node.name)
            self._event(
                node.name,
                "NodeReturned",
                f"stable for {self.policy.recovery_period_s:.0f}s: uncordoned, tier {tier}",
                now,
                False,
            )

    def _defer(self, node: Node, reason: str, now: float) -> None:
        # Log and record an Event when the reason changes, not on every pass.
        kind = reason.split(":", 1)[0]
        if self._deferred.get(node.name) == kind:
            return
        self._deferred[node.name] = kind
        log.info("drain of %s deferred: %s", node.name, reason)
        if self.dry_run:
            self.dry_log.add(f"defer draining node {node.name}: {reason}")
            return
        self._event(node.name, "DrainDeferred", reason, now, True)

    # the loop

    def next_wakeup_s(self) -> float:
        """Seconds until the earliest scheduled step (drain step, recovery, cool-down), capped."""
        now = self.clock()
        soon = self.policy.resync_s
        for when in self._next_step.values():
            soon = min(soon, max(0.0, when - now))
        if self.last_plan is not None:
            for n in self.cache.snapshot():
                view = Node.from_object(n)
                if view.drain is not None and view.drain.stable_since_s is not None:
                    due = view.drain.stable_since_s + self.policy.recovery_period_s - now
                    soon = min(soon, max(0.0, due))
            if any(isinstance(a, Defer) for a in self.last_plan.actions):
                soon = min(soon, 1.0)
        return soon

    def run(self, stop: threading.Event, *, on_pass: Callable[[Plan], None] | None = None) -> None:
        """Watch nodes and reconcile until ``stop`` is set."""
        informer = threading.Thread(
            target=self.cache.run, args=(stop,), name="tiering-informer", daemon=True
        )
        informer.start()
        next_election = 0.0
        while not stop.is_set():
            now = self.clock()
            if self.elector is not None and not self.dry_run and now >= next_election:
                self.elector.try_acquire_or_renew()
                next_election = now + self.elector.timing.retry_period_s
                self.metrics.leader.set(1 if self.elector.is_leader() else 0)
            acting = self.dry_run or self.may_act()
            if acting and self.cache.synced.is_set():
                self.cache.changed.clear()
                result = self.reconcile_once()
                if on_pass is not None:
                    on_pass(result)
            timeout = self.next_wakeup_s()
            if self.elector is not None and not self.dry_run:
                timeout = min(timeout, max(0.0, next_election - self.clock()))
            self.clock.wait(self.cache.changed, timeout)
        if self.elector is not None and not self.dry_run:
            self.elector.release()
