"""Leader election through a coordination.k8s.io/v1 Lease, with optimistic concurrency.

Like client-go's leader election, a candidate judges a lease expired by when *it* last saw the
lease change (its own clock), not by the holder's ``renewTime``, so clock skew between replicas
does not matter. The leader considers itself leader only until ``renew_deadline_s`` after its
last successful renewal, which is shorter than ``lease_duration_s``: the old leader stops
acting before anyone else may take over, so two replicas never act at once.

The lease also carries the circuit breaker (annotation ``nodeagent.io/circuit-breaker``), so a
new leader inherits an open breaker and an operator resets it in one place.
"""

from __future__ import annotations

import json
import logging
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from nodeagent import labels as lbl
from nodeagent_tiering.cluster.clock import Clock
from nodeagent_tiering.cluster.cluster_api import Kube, KubeError, ObjectRef
from nodeagent_tiering.cluster.units import micro_time
from nodeagent_tiering.drain.planner import BreakerState

log = logging.getLogger(__name__)

BREAKER_ANNOTATION = lbl.BREAKER_ANNOTATION


def breaker_from_lease(lease: dict[str, Any] | None) -> BreakerState:
    """The breaker stored on a lease (closed when absent or unreadable)."""
    annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
    text = annotations.get(BREAKER_ANNOTATION)
    if not text:
        return BreakerState()
    try:
        data = json.loads(text)
        return BreakerState(
            open=data.get("state") == "open",
            reason=str(data.get("reason", "")),
            since_s=float(data["since"]) if data.get("since") is not None else None,
            reset_s=float(data.get("reset", 0.0)),
        )
    except (ValueError, TypeError, KeyError):
        return BreakerState()


def breaker_annotation(state: BreakerState) -> str:
    """The annotation value for a breaker state."""
    return json.dumps(
        {
            "state": "open" if state.open else "closed",
            "reason": state.reason,
            "since": state.since_s,
            "reset": state.reset_s,
        },
        separators=(",", ":"),
        sort_keys=True,
    )


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """Lease timing in seconds (client-go defaults: 15 / 10 / 2)."""

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("lease timing needs retry_period < renew_deadline < lease_duration")


@dataclass(eq=False)
class LeaderElector:
    """One candidate's view of the lease."""

    kube: Kube
    _: KW_ONLY
    namespace: str
    name: str
    identity: str
    clock: Clock
    timing: LeaseTiming = field(default_factory=LeaseTiming)
    breaker: BreakerState = field(init=False, default_factory=BreakerState)
    _observed: tuple[str, str] | None = field(init=False, default=None)  # (holder, renewTime)
    _observed_at: float = field(init=False, default=0.0)  # own clock when _observed changed
    _renewed_at: float | None = field(init=False, default=None)
    _lease: dict[str, Any] | None = field(init=False, default=None)
    _pending_breaker: BreakerState | None = field(init=False, default=None)

    def is_leader(self) -> bool:
        """Whether this candidate may act now."""
        if self._renewed_at is None:
            return False
        return self.clock() < self._renewed_at + self.timing.renew_deadline_s

    def set_breaker(self, state: BreakerState) -> None:
        """Store a new breaker state with the next renewal."""
        self.breaker = state
        self._pending_breaker = state

    def try_acquire_or_renew(self) -> bool:
        """One election round; returns whether this candidate holds the lease afterwards."""
        now = self.clock()
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
            if lease is None:
                return self._create(now)
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            observed = (holder, str(spec.get("renewTime") or ""))
            if observed != self._observed:
                self._observed = observed
                self._observed_at = now
            duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_duration_s)
            expired = now >= self._observed_at + duration
            if holder and holder != self.identity and not expired:
                self._lost()
                return False
            return self._update(lease, now, takeover=holder != self.identity)
        except KubeError as exc:
            if exc.status != 409:
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            self._lost()
            return False

    def _spec(self, now: float, acquire: float, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.timing.lease_duration_s),
            "acquireTime": micro_time(acquire),
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        }

    def _create(self, now: float) -> bool:
        body = {
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "annotations": {BREAKER_ANNOTATION: breaker_annotation(self.breaker)},
            },
            "spec": self._spec(now, now, 0),
        }
        self._lease = self.kube.create_lease(self.namespace, body)
        self._won(now)
        return True

    def _update(self, lease: dict[str, Any], now: float, *, takeover: bool) -> bool:
        spec = lease.get("spec") or {}
        meta = dict(lease.get("metadata") or {})
        annotations = dict(meta.get("annotations") or {})
        stored = breaker_from_lease(lease)
        if self._pending_breaker is not None and stored.reset_s <= self._pending_breaker.reset_s:
            annotations[BREAKER_ANNOTATION] = breaker_annotation(self._pending_breaker)
        else:
            # The lease is the source of truth: a reset written by an operator wins.
            self.breaker = stored
        transitions = int(spec.get("leaseTransitions") or 0) + (1 if takeover else 0)
        acquire = now if takeover else _acquire_time(spec, now)
        meta["annotations"] = annotations
        body = {"metadata": meta, "spec": self._spec(now, acquire, transitions)}
        self._lease = self.kube.replace_lease(self.namespace, self.name, body)
        self._pending_breaker = None
        self.breaker = breaker_from_lease(self._lease)
        if takeover:
            log.info("%s took over lease %s/%s", self.identity, self.namespace, self.name)
        self._won(now)
        return True

    def _won(self, now: float) -> None:
        self._renewed_at = now
        spec = (self._lease or {}).get("spec") or {}
        self._observed = (self.identity, str(spec.get("renewTime") or ""))
        self._observed_at = now

    def lease_ref(self) -> ObjectRef:
        """The Lease, for Events about it (the circuit breaker)."""
        uid = str(((self._lease or {}).get("metadata") or {}).get("uid") or "")
        return ObjectRef(
            "Lease", self.name, self.namespace, uid, api_version="coordination.k8s.io/v1"
        )

    def _lost(self) -> None:
        self._renewed_at = None

    def release(self) -> None:
        """Give the lease up on shutdown so a standby takes over without waiting."""
        if not self.is_leader() or self._lease is None:
            return
        body = dict(self._lease)
        body["spec"] = {**(body.get("spec") or {}), "holderIdentity": "", "leaseDurationSeconds": 1}
        try:
            self.kube.replace_lease(self.namespace, self.name, body)
        except KubeError as exc:
            log.info("lease release skipped: %s", exc)
        self._lost()


def _acquire_time(spec: dict[str, Any], now: float) -> float:
    from nodeagent_tiering.cluster.units import parse_time

    return parse_time(spec.get("acquireTime")) or now


def reset_breaker_on_lease(kube: Kube, namespace: str, name: str, *, now_s: float) -> bool:
    """Close the breaker stored on the lease (the operator's explicit reset).

    Returns False when there is no lease (no leader ever ran). The leader adopts the reset at
    its next renewal; unstable transitions before ``now_s`` no longer count toward a new trip.
    """
    lease = kube.get_lease(namespace, name)
    if lease is None:
        return False
    meta = dict(lease.get("metadata") or {})
    annotations = dict(meta.get("annotations") or {})
    annotations[BREAKER_ANNOTATION] = breaker_annotation(BreakerState(reset_s=now_s))
    meta["annotations"] = annotations
    kube.replace_lease(namespace, name, {**lease, "metadata": meta})
    return True
