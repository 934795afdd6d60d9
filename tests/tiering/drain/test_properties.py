"""Property tests under random fault storms.

The planner is pure, so most storms run against an in-memory cluster that applies the plan's
actions the way the controller does (drains finish after a random number of steps). One storm
property runs end to end through the controller and the real API server.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent import labels as lbl
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.kube.nodes import OWNER_LABEL, NodeSet
from nodeagent_tiering.cluster.informer import NodeCache
from nodeagent_tiering.cluster.nodes import DrainRecord, Node, Phase
from nodeagent_tiering.cluster.tier_policy import TierPolicy, parse_policy
from nodeagent_tiering.drain.controller import Controller
from nodeagent_tiering.drain.planner import (
    BreakerState,
    MarkStable,
    Release,
    SetTier,
    StartDrain,
    StepDrain,
    home_tier,
    plan,
)
from tests.tiering.conftest import POLICY, gpu_labels

KINDS = {
    "h100": gpu_labels(),
    "l40s": gpu_labels("NVIDIA-L40S", nvlink=1),
    "t4": gpu_labels("Tesla-T4", count=1, nvlink=1),
}


def make_policy(
    cluster_max: int,
    tier_max: int,
    min_healthy: int,
    cooldown: float,
    pct: float,
    nodes: dict[str, Any] | None = None,
) -> TierPolicy:
    data = {
        **POLICY,
        "tiers": [
            {**t, "max_draining": tier_max, "min_healthy": min_healthy} for t in POLICY["tiers"]
        ],
        "budget": {"max_draining": cluster_max, "cooldown_s": cooldown},
        "breaker": {"percentage": pct, "window_s": 300, "min_unstable": 2},
    }
    if nodes is not None:
        data["nodes"] = nodes
    return parse_policy(data)


def view(
    name: str,
    labels: dict[str, str],
    *,
    unschedulable: bool = False,
    drain: DrainRecord | None = None,
) -> Node:
    return Node(name, dict(labels), {}, unschedulable, (), None, "", "", "1", drain)


class Cluster:
    """An in-memory cluster that applies plans like the controller does."""

    def __init__(self, kinds: list[str]) -> None:
        self.nodes = {f"n{i}": view(f"n{i}", KINDS[k]) for i, k in enumerate(kinds)}
        self.unstable_since: dict[str, float] = {}
        self.breaker = BreakerState()
        self.last_start: float | None = None
        self.starts: list[float] = []

    def set_stability(self, name: str, stability: str, now: float) -> None:
        node = self.nodes[name]
        self.nodes[name] = replace(node, labels={**node.labels, lbl.STABILITY: stability})
        if stability == "unstable":
            self.unstable_since.setdefault(name, now)
        else:
            self.unstable_since.pop(name, None)

    def step(self, policy: TierPolicy, now: float, finish: set[str]):
        result = plan(
            list(self.nodes.values()),
            policy,
            now,
            self.breaker,
            self.unstable_since,
            self.last_start,
        )
        self.breaker = result.breaker
        for action in result.actions:
            node = self.nodes[action.node]
            if isinstance(action, StartDrain):
                record = DrainRecord(Phase.DRAINING, action.tier, action.cause, now, now)
                node = replace(node, unschedulable=True, drain=record)
                self.last_start = now
                self.starts.append(now)
            elif isinstance(action, StepDrain) and action.node in finish and node.drain:
                node = replace(node, drain=node.drain.with_(phase=Phase.DRAINED))
            elif isinstance(action, MarkStable) and node.drain:
                node = replace(node, drain=node.drain.with_(stable_since_s=action.since_s))
            elif isinstance(action, Release):
                node = replace(node, unschedulable=False, drain=None)
            elif isinstance(action, SetTier):
                labels = {k: v for k, v in node.labels.items() if k != lbl.TIER}
                if action.tier is not None:
                    labels[lbl.TIER] = action.tier
                node = replace(node, labels=labels)
            self.nodes[action.node] = node
        return result

    def in_service(self, policy: TierPolicy) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes.values():
            tier = n.drain.tier if n.drain else home_tier(n, policy)
            if tier and n.drain is None and not n.unschedulable:
                counts[tier] = counts.get(tier, 0) + 1
        return counts


storm_step = st.tuples(
    st.lists(
        st.tuples(st.integers(0, 29), st.sampled_from(["stable", "degraded", "unstable"])),
        max_size=6,
    ),
    st.floats(0, 400),
    st.sets(st.integers(0, 29), max_size=5),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(sorted(KINDS)), min_size=4, max_size=30),
    cluster_max=st.integers(1, 3),
    tier_max=st.integers(1, 2),
    min_healthy=st.integers(0, 3),
    cooldown=st.sampled_from([0.0, 60.0, 600.0]),
    storm=st.lists(storm_step, min_size=5, max_size=25),
)
def test_budget_minimum_and_cooldown_hold_under_storms(
    kinds, cluster_max, tier_max, min_healthy, cooldown, storm
):
    policy = make_policy(cluster_max, tier_max, min_healthy, cooldown, pct=100)
    cluster = Cluster(kinds)
    now = 1_000_000.0
    for flips, advance, finishing in storm:
        for index, stability in flips:
            if index < len(kinds):
                cluster.set_stability(f"n{index}", stability, now)
        before = cluster.in_service(policy)
        result = cluster.step(policy, now, {f"n{i}" for i in finishing})
        after = cluster.in_service(policy)
        draining = [
            n
            for n in cluster.nodes.values()
            if n.drain is not None and n.drain.phase is Phase.DRAINING
        ]
        assert len(draining) <= cluster_max, "cluster budget exceeded"
        per_tier: dict[str, int] = {}
        for n in draining:
            per_tier[n.drain.tier] = per_tier.get(n.drain.tier, 0) + 1
        assert all(count <= tier_max for count in per_tier.values()), "tier budget exceeded"
        for a in result.of(StartDrain):
            # Our drains never take a tier below its minimum (it may already be below: then
            # no drain starts there at all).
            assert after.get(a.tier, 0) >= min_healthy, f"tier {a.tier} below its minimum"
            assert before.get(a.tier, 0) > min_healthy
        now += advance
    gaps = [b - a for a, b in itertools.pairwise(cluster.starts)]
    assert all(gap >= cooldown for gap in gaps), "drains started inside the cool-down"


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(4, 30),
    pct=st.sampled_from([20.0, 30.0, 50.0]),
    extra=st.integers(0, 5),
    later=st.lists(st.integers(0, 29), max_size=8),
)
def test_breaker_trips_on_a_storm_and_holds_until_reset(size, pct, extra, later):
    policy = make_policy(cluster_max=30, tier_max=30, min_healthy=0, cooldown=0, pct=pct)
    cluster = Cluster(["t4"] * size)
    now = 2_000_000.0
    cluster.step(policy, now, set())
    storm_size = min(size, int(size * pct / 100) + 1 + extra)
    storm_size = max(storm_size, 2)
    for i in range(storm_size):
        cluster.set_stability(f"n{i}", "unstable", now)
    result = cluster.step(policy, now, set())
    assert result.tripped
    assert cluster.breaker.open
    assert result.of(StartDrain) == [], "no drain may start in the pass that trips"
    # Held: more failures and time passing never start a drain, and it never closes by itself.
    for index in later:
        now += 400
        cluster.set_stability(f"n{index % size}", "unstable", now)
        result = cluster.step(policy, now, set())
        assert result.of(StartDrain) == []
        assert cluster.breaker.open
    # An explicit reset reopens the gate; old transitions no longer count.
    now += 1
    cluster.breaker = BreakerState(reset_s=now)
    result = cluster.step(policy, now + 1, set())
    assert not cluster.breaker.open
    assert result.of(StartDrain), "drains resume after the reset"


EXAMPLES = itertools.count()


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    storm=st.lists(
        st.tuples(st.integers(0, 7), st.booleans(), st.floats(0, 120)), min_size=4, max_size=10
    ),
)
def test_storm_through_the_api_stays_within_budget(cluster, storm):
    examples = next(EXAMPLES)
    # Each example gets nodes of its own, so nothing of the previous one is in the way.
    nodes = NodeSet(cluster.api, f"{cluster.namespace}-e{examples}")
    clock = FakeClock()
    kinds = ["h100", "h100", "h100", "l40s", "l40s", "t4", "t4", "t4"]
    try:
        for i, kind in enumerate(kinds):
            nodes.create(f"n{i}", KINDS[kind], gpus=int(KINDS[kind][lbl.GPU_COUNT]))
            cluster.add_pod(f"job-e{examples}-{i}", f"e{examples}-n{i}")
        policy = make_policy(2, 1, min_healthy=1, cooldown=30, pct=100, nodes=nodes.selector())
        kube = cluster.kube()
        cache = NodeCache(kube)
        ctl = Controller(kube, cache, policy, clock=clock)
        starts: list[float] = []
        for index, bad, advance in storm:
            stability = "unstable" if bad else "stable"
            nodes.patch(f"n{index}", {"metadata": {"labels": {lbl.STABILITY: stability}}})
            cache.relist()
            result = ctl.reconcile_once()
            starts += [clock()] * len(result.of(StartDrain))
            listed = cluster.core.list_node(
                label_selector=f"{OWNER_LABEL}={nodes.prefix}", _preload_content=False
            )
            views = [Node.from_object(n) for n in json.loads(listed.data)["items"]]
            draining = [v for v in views if v.drain and v.drain.phase is Phase.DRAINING]
            assert len(draining) <= 2, "cluster budget exceeded"
            assert len({v.drain.tier for v in draining if v.drain}) == len(draining), (
                "more than one drain in a tier"
            )
            for kind in ("NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S", "Tesla-T4"):
                serving = [
                    v for v in views if v.labels[lbl.GPU_PRODUCT] == kind and not v.unschedulable
                ]
                assert serving, f"every {kind} node taken out: tier below its minimum"
            clock.advance(advance)
        assert all(b - a >= 30 for a, b in itertools.pairwise(starts))
    finally:
        nodes.delete_all()
