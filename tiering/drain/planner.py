"""Decide, without side effects, what one reconcile pass should do.

The planner sees the nodes, the policy, the time, the circuit breaker and when each node was
first seen unstable, and returns actions. The controller executes them; property tests call the
planner directly under random fault storms. Rules:

- a node's *home tier* is the first tier (in policy order) whose selector, expected driver and
  accepted stabilities match it; an unstable node keeps the tier it qualifies for by capability
  until it is quarantined, so the tier that loses it is the one whose budget is charged;
- a drain starts only if the breaker is closed, the cool-down since the last drain start has
  passed, fewer than ``max_draining`` drains run in the cluster and in the node's tier, and the
  tier keeps at least ``min_healthy`` nodes in service afterwards (medik8s minHealthy);
- a quarantined node returns once it has been non-unstable for ``recovery_period_s``
  (hysteresis); a node that flaps back restarts its recovery clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nodeagent import labels as lbl
from nodeagent_tiering.cluster.nodes import Node, Phase, node_state
from nodeagent_tiering.cluster.tier_policy import Stability, TierPolicy, resolve


@dataclass(frozen=True, slots=True)
class BreakerState:
    """The circuit breaker. Opening is automatic; closing needs an explicit reset."""

    open: bool = False
    reason: str = ""
    since_s: float | None = None
    reset_s: float = 0.0  # unstable transitions at or before this time no longer count


@dataclass(frozen=True, slots=True)
class SetTier:
    """Write (or with ``None`` remove) the ``nodeagent.io/tier`` label."""

    node: str
    tier: str | None


@dataclass(frozen=True, slots=True)
class StartDrain:
    """Cordon, taint, quarantine and begin evicting."""

    node: str
    tier: str
    cause: str


@dataclass(frozen=True, slots=True)
class StepDrain:
    """Try the evictions of a node that is draining."""

    node: str


@dataclass(frozen=True, slots=True)
class MarkStable:
    """Record when a quarantined node stopped being unstable (``None``: it is unstable again)."""

    node: str
    since_s: float | None


@dataclass(frozen=True, slots=True)
class Release:
    """Uncordon, untaint and return the node to its tier."""

    node: str
    tier: str | None


@dataclass(frozen=True, slots=True)
class Defer:
    """An unstable node that may not be drained now, and why."""

    node: str
    reason: str


Action = SetTier | StartDrain | StepDrain | MarkStable | Release | Defer


@dataclass(frozen=True, slots=True)
class TierStats:
    """Counts for one tier (metrics and logs)."""

    nodes: int = 0
    in_service: int = 0
    draining: int = 0  # drains running of nodes that left this tier
    states: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one pass decided."""

    actions: tuple[Action, ...]
    breaker: BreakerState
    tripped: bool  # the breaker opened in this pass
    tiers: dict[str, TierStats]

    def of(self, kind: type[Action]) -> list[Action]:
        """The actions of one kind."""
        return [a for a in self.actions if isinstance(a, kind)]


def home_tier(node: Node, policy: TierPolicy) -> str | None:
    """The first tier (in policy order) this node qualifies for; unstable ignores stability."""
    stability = node.stability
    for tier in policy.tiers:
        if not tier.selector.matches(node.labels):
            continue
        expected = tier.expected_driver_version
        if expected is not None and node.labels.get(lbl.DRIVER_VERSION) != expected:
            continue
        if stability is Stability.UNSTABLE or stability in tier.stability:
            return tier.name
    return None


def plan(
    nodes: Sequence[Node],
    policy: TierPolicy,
    now_s: float,
    breaker: BreakerState,
    unstable_since: Mapping[str, float],
    last_drain_start_s: float | None,
) -> Plan:
    """Decide one pass. Pure: the same inputs always give the same plan."""
    managed = [n for n in nodes if n.drain is not None or policy.nodes.matches(n.labels)]
    managed_names = {n.name for n in managed}
    actions: list[Action] = []

    home = {n.name: home_tier(n, policy) for n in managed}
    budget_tier = {n.name: (n.drain.tier if n.drain else home[n.name]) for n in managed}

    # Breaker: count nodes that turned unstable inside the window (and after the last reset).
    tripped = False
    if not breaker.open:
        horizon = max(now_s - policy.breaker.window_s, breaker.reset_s)
        recent = sorted(n for n, t in unstable_since.items() if t > horizon and n in managed_names)
        share = 100.0 * len(recent) / max(len(managed), 1)
        if len(recent) >= policy.breaker.min_unstable and share > policy.breaker.percentage:
            breaker = BreakerState(
                open=True,
                reason=(
                    f"{len(recent)} of {len(managed)} nodes ({share:.0f}%) turned unstable within"
                    f" {policy.breaker.window_s:.0f}s (limit {policy.breaker.percentage:g}%)"
                ),
                since_s=now_s,
                reset_s=breaker.reset_s,
            )
            tripped = True

    # Counters the admission checks use, updated as drains are admitted in this pass.
    total_draining = 0
    draining: dict[str, int] = {}
    tier_size: dict[str, int] = {}
    in_service: dict[str, int] = {}
    for n in managed:
        tier = budget_tier[n.name]
        if tier is None:
            continue
        tier_size[tier] = tier_size.get(tier, 0) + 1
        if n.drain is not None and n.drain.phase is Phase.DRAINING:
            draining[tier] = draining.get(tier, 0) + 1
            total_draining += 1
        if n.drain is None and not n.unschedulable:
            in_service[tier] = in_service.get(tier, 0) + 1

    desired: dict[str, str | None] = {}
    for n in managed:
        desired[n.name] = policy.quarantine_tier if n.drain is not None else home[n.name]
        record = n.drain
        if record is None:
            continue
        if n.stability is Stability.UNSTABLE:
            if record.stable_since_s is not None:
                actions.append(MarkStable(n.name, None))
        elif record.stable_since_s is None:
            actions.append(MarkStable(n.name, now_s))
        elif now_s - record.stable_since_s >= policy.recovery_period_s:
            actions.append(Release(n.name, home[n.name]))
            desired[n.name] = home[n.name]
            continue
        if record.phase is Phase.DRAINING and not breaker.open:
            actions.append(StepDrain(n.name))

    # Admission of new drains, oldest instability first.
    cluster_cap = _cap(policy.budget.max_draining, len(managed))
    last_start = last_drain_start_s
    candidates = [n for n in managed if n.drain is None and n.stability is Stability.UNSTABLE]
    candidates.sort(key=lambda n: (unstable_since.get(n.name, now_s), n.name))
    for n in candidates:
        tier_name = budget_tier[n.name]
        reason = None
        spec = policy.tier(tier_name) if tier_name is not None else None
        if breaker.open:
            reason = f"circuit breaker open: {breaker.reason}"
        elif last_start is not None and now_s - last_start < policy.budget.cooldown_s:
            wait = policy.budget.cooldown_s - (now_s - last_start)
            reason = f"cool-down: next drain in {wait:.0f}s"
        elif total_draining >= cluster_cap:
            reason = f"cluster budget: {total_draining} of {cluster_cap} drains running"
        elif spec is not None and tier_name is not None:
            size = tier_size.get(tier_name, 0)
            tier_cap = _cap(spec.max_draining, size)
            minimum = resolve(spec.min_healthy, size, round_up=True)
            running = draining.get(tier_name, 0)
            serving = in_service.get(tier_name, 0)
            serving_after = serving - (0 if n.unschedulable else 1)
            if running >= tier_cap:
                reason = f"tier {tier_name} budget: {running} of {tier_cap} drains running"
            elif serving_after < minimum:
                reason = f"tier {tier_name} minimum: {serving} in service, min_healthy {minimum}"
        if reason is not None:
            actions.append(Defer(n.name, reason))
            continue
        label = tier_name or "(none)"
        actions.append(StartDrain(n.name, label, n.unstable_cause))
        desired[n.name] = policy.quarantine_tier
        total_draining += 1
        if tier_name is not None:
            draining[tier_name] = draining.get(tier_name, 0) + 1
            if not n.unschedulable:
                in_service[tier_name] = in_service.get(tier_name, 0) - 1
        last_start = now_s

    for n in nodes:
        want = desired.get(n.name)
        if n.labels.get(lbl.TIER) != want and (n.name in managed_names or lbl.TIER in n.labels):
            actions.append(SetTier(n.name, want))

    return Plan(tuple(actions), breaker, tripped, _stats(managed, desired, policy))


def _cap(value: int | str, total: int) -> int:
    """A drain limit: a percentage rounds down but allows at least one drain unless it is 0."""
    cap = resolve(value, total, round_up=False)
    if isinstance(value, str) and float(value[:-1]) > 0:
        cap = max(cap, 1)
    return cap


def _stats(
    managed: Sequence[Node], desired: Mapping[str, str | None], policy: TierPolicy
) -> dict[str, TierStats]:
    counts: dict[str, dict[str, int]] = {t.name: {} for t in policy.tiers}
    counts[policy.quarantine_tier] = {}
    serving: dict[str, int] = {}
    draining: dict[str, int] = {}  # by the tier a draining node left
    for n in managed:
        if n.drain is not None and n.drain.phase is Phase.DRAINING:
            draining[n.drain.tier] = draining.get(n.drain.tier, 0) + 1
        tier = desired.get(n.name) or "none"
        state = node_state(n, policy)  # the review counts with the same function
        bucket = counts.setdefault(tier, {})
        bucket[state] = bucket.get(state, 0) + 1
        if n.drain is None and not n.unschedulable:
            serving[tier] = serving.get(tier, 0) + 1
    return {
        name: TierStats(
            nodes=sum(states.values()),
            in_service=serving.get(name, 0),
            draining=draining.get(name, 0),
            states=states,
        )
        for name, states in counts.items()
    }
